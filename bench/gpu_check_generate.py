"""One-command device check of hsd_torch.generate (issue 9): ``python bench/gpu_check_generate.py``.

On the first CUDA device (or the CPU when there is none, to check the script itself), for every
method and two tokenizer pairs of tiny float64 models: greedy output equals the target's own
``model.generate(do_sample=False)``, and sampled output on the device equals the CPU run with the
same seed for most rows (float64; CUDA's scans add in another order, so a draw within rounding of
a boundary may differ: the count is printed, not asserted). Exits non-zero on a greedy mismatch.
About a minute.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hsd_torch import generate, tiny  # noqa: E402
from hsd_torch.mirror import target_greedy  # noqa: E402

PROMPTS = ["def foo(x):\n", "Hello", "import os\n", "naïve café", "x", "for i in range(3):\n    "]


def main() -> int:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {dev} ({torch.cuda.get_device_name(0) if dev.type == 'cuda' else 'no CUDA device'})")
    f64 = torch.float64
    tb, tu = tiny.tiny_tokenizer("byte_bpe"), tiny.tiny_tokenizer("unigram")

    def build() -> dict[str, torch.nn.Module]:
        return {"t": tiny.tiny_llama(tb, seed=0, dtype=f64),
                "d": tiny.tiny_gpt2(tu, seed=1, vocab_size=len(tu) + 32, dtype=f64),
                "s": tiny.tiny_gpt2(tb, seed=3, dtype=f64)}

    cpu = build()
    on = {k: m.to(dev) for k, m in build().items()}
    bad = 0
    bounded = {"min_path_prob": 0.05, "proposal_map": "longest_prefix"}
    for method, d, dt, extra in (("ar", None, None, {}), ("sd", "s", tb, {}), ("tli", "d", tu, {}),
                                 ("slem", "d", tu, {}), ("tli", "s", tb, {}), ("slrs", "d", tu, {"lookahead": 1}),
                                 ("slrs", "d", tu, bounded)):
        t0 = time.perf_counter()
        kw = dict(target_tokenizer=tb, drafter_tokenizer=dt, method=method, lookahead=3, max_new_tokens=16)
        kw.update(extra)
        g = generate(on["t"], on[d] if d else None, PROMPTS, do_sample=False, **kw)
        for i, p in enumerate(PROMPTS):
            want = target_greedy(on["t"], tb, p, 16)
            if g.sequences[i] != want:
                bad += 1
                print(f"  GREEDY MISMATCH {method} {p!r}: {g.sequences[i]} vs {want}")
        s_dev = generate(on["t"], on[d] if d else None, PROMPTS, seed=7, **kw).sequences
        s_cpu = generate(cpu["t"], cpu[d] if d else None, PROMPTS, seed=7, **kw).sequences
        same = sum(a == b for a, b in zip(s_dev, s_cpu))
        print(f"{method:5s} drafter={d}: greedy ok={bad == 0}, sampled rows equal to the CPU run: {same}/{len(PROMPTS)}"
              f" ({time.perf_counter() - t0:.1f}s)")
    print("FAIL" if bad else "OK")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
