"""Audit the installed transformers' universal assisted generation (different tokenizers) with
``hsd_torch.audit.audit_generate``: greedy and do_sample=True, on tiny local pairs.

    python bench/audit_transformers.py [N] [--report-dir DIR]

Target: tiny Llama over byte-level BPE (384 ids); assistant: tiny GPT-2 over Unigram + byte
fallback (520 ids), built fresh per run (UAG with do_sample=True replaces its lm_head). The
reference is the target's plain law (transformers removes no id), top-k disabled (top_k=0 passed
to transformers, whose default is 50).
"""

from __future__ import annotations

import os
import sys
import time

import torch

from hsd_torch import tiny
from hsd_torch.audit import audit_generate

PROMPT = "def foo(x):\n"


def uag_sampler(do_sample: bool, top_k: int | None = None):  # type: ignore[no-untyped-def]
    target, tt, _, dt = tiny.tiny_pair()
    drafter = tiny.tiny_gpt2(dt, seed=1)  # fresh assistant for this run

    def sample(prompt: str, seed: int) -> list[int]:
        torch.manual_seed(seed)
        x = tt(prompt, return_tensors="pt")
        kw = dict(do_sample=True, temperature=1.0, top_k=top_k or 0, top_p=1.0) if do_sample else dict(do_sample=False)
        with torch.inference_mode():
            out = target.generate(**x, assistant_model=drafter, tokenizer=tt, assistant_tokenizer=dt,
                                  max_new_tokens=2, **kw)
        return out[0, x["input_ids"].shape[1]:].tolist()

    return sample, target, tt


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else 20000
    rdir = sys.argv[sys.argv.index("--report-dir") + 1] if "--report-dir" in sys.argv else None
    torch.set_num_threads(1)
    for do_sample, top_k in ((False, None), (True, None), (True, 3)):
        sample, target, tt = uag_sampler(do_sample, top_k)
        t0 = time.perf_counter()
        rep = audit_generate(sample, target, tt, PROMPT, n=n if do_sample else min(n, 200), do_sample=do_sample,
                             top_k=top_k, alpha=1e-3, seed=0, name=f"transformers UAG do_sample={do_sample} top_k={top_k}")
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4g}"
        print(f"{rep.name}: {rep.verdict}; n={rep.n}; detectable TV {det}; estimated TV {rep.tv_estimate:.4g} "
              f"[{rep.tv_ci[0]:.4g}, {rep.tv_ci[1]:.4g}], lossless up to {rep.tv_null_q95:.4g}; "
              f"{time.perf_counter() - t0:.0f} s")
        print("  " + rep.reason)
        if rdir:
            os.makedirs(rdir, exist_ok=True)
            with open(os.path.join(rdir, f"uag_sample{int(do_sample)}_topk{top_k}.md"), "w") as f:
                f.write(rep.to_markdown())


if __name__ == "__main__":
    main()
