"""Audit the installed transformers' universal assisted generation (different tokenizers) with
``hsd_torch.auditing.first_tokens.audit_generate``: a control without assistant, greedy, do_sample=True unpatched,
the translator-cache crash, and do_sample=True with ``bench/transformers_uag_patch.py``.

    python bench/audit_transformers.py [N] [--positions P] [--runs RUNS] [--report-dir DIR]
        [--real TARGET,DRAFTER] [--top-k K] [--prompt TEXT]

``--real smollm2-135m-instruct,gemma-3-270m``: the real pair (``hsd_torch.models.real``) in place of
the tiny one (a fresh copy of the loaded assistant per run); ``--top-k K``: every sampled run (and
its reference) processed with top-k K (a small support gives power at a small N on a large
vocabulary); ``--prompt``: another prompt.

RUNS is a comma-separated subset of ``control,greedy,sample,sample-top3,crash,patched,patched-top3,
patched-crash`` (default: all, in that order; the patch is installed before the first ``patched*``
run and stays for the rest of the process, so list unpatched runs first). Greedy uses
``min(N, 200)`` draws. Target: tiny Llama over byte-level BPE (384 ids); assistant: tiny GPT-2 over
Unigram + byte fallback (520 ids), built fresh per run (UAG with do_sample=True replaces its
lm_head). Sampling is over the full vocabulary (``top_k=0``: transformers' default top-k is 50)
unless the run says top3; the reference is the target's plain law (transformers removes no id).

transformers caches its vocabulary translator by the two tokenizer objects (root cause 2 in
docs/auditing-transformers.md), and hsd_torch.models.tiny returns the same tokenizer objects each time:
each unpatched sampled run other than ``crash`` therefore starts with that cache cleared, as a
fresh process would have it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers.generation import candidate_generator as cg

from hsd_torch.models import tiny
from hsd_torch.auditing.first_tokens import audit_generate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_uag_patch  # noqa: E402

PROMPT = "def foo(x):\n"
RUNS = ("control", "greedy", "sample", "sample-top3", "crash", "patched", "patched-top3", "patched-crash")


REAL: dict[str, Any] = {}
"""With ``--real TARGET,DRAFTER``: the two real models (``hsd_torch.models.real``), loaded once."""


def uag_sampler(do_sample: bool, top_k: int | None = None, assistant: bool = True
                ) -> tuple[Callable[[str, int], list[int]], Any, Any]:
    """``(sample_fn, target, target_tokenizer)``: ``target.generate`` with a fresh assistant
    (``assistant=False``: plain ``target.generate``, the control)."""
    if REAL:
        import copy

        target, tt, dt = REAL["target"], REAL["tt"], REAL["dt"]
        drafter = copy.deepcopy(REAL["drafter"])  # fresh assistant for this run (sampling prunes its head)
    else:
        target, tt, _, dt = tiny.tiny_pair()
        drafter = tiny.tiny_gpt2(dt, seed=1)  # fresh assistant for this run
    extra = dict(assistant_model=drafter, tokenizer=tt, assistant_tokenizer=dt) if assistant else {}

    def sample(prompt: str, seed: int) -> list[int]:
        torch.manual_seed(seed)
        x = tt(prompt, return_tensors="pt")
        kw: dict[str, Any] = (dict(do_sample=True, temperature=1.0, top_k=top_k or 0, top_p=1.0) if do_sample
                              else dict(do_sample=False))
        with torch.inference_mode():
            out = target.generate(**x, **extra, max_new_tokens=2, **kw)
        return [int(t) for t in out[0, x["input_ids"].shape[1]:]]

    return sample, target, tt


def crash_check(draws: int = 20) -> str:
    """A sampled run with a first assistant, then ``draws`` sampled calls with a second, fresh one
    (same tokenizer objects): what they raise."""
    first, _, _ = uag_sampler(True)
    first(PROMPT, 0)
    second, _, _ = uag_sampler(True)
    errors: dict[str, int] = {}
    for s in range(draws):
        try:
            second(PROMPT, s)
        except Exception as e:  # noqa: BLE001 - we report what transformers raises
            key = f"{type(e).__name__} in {e.__traceback__ and _last_frame(e)}"
            errors[key] = errors.get(key, 0) + 1
    ran = draws - sum(errors.values())
    return f"second fresh assistant: {ran} of {draws} sampled calls ran" + (f"; raised: {errors}" if errors else "")


def _last_frame(e: BaseException) -> str:
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "?" if tb is None else f"{tb.tb_frame.f_code.co_name} ({os.path.basename(tb.tb_frame.f_code.co_filename)})"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else 20000
    positions = int(sys.argv[sys.argv.index("--positions") + 1]) if "--positions" in sys.argv else 2
    rdir = sys.argv[sys.argv.index("--report-dir") + 1] if "--report-dir" in sys.argv else None
    runs = sys.argv[sys.argv.index("--runs") + 1].split(",") if "--runs" in sys.argv else list(RUNS)
    if unknown := [r for r in runs if r not in RUNS]:
        raise SystemExit(f"unknown runs {unknown}; choose from {','.join(RUNS)}")
    global PROMPT
    k_all = int(sys.argv[sys.argv.index("--top-k") + 1]) if "--top-k" in sys.argv else None
    if "--prompt" in sys.argv:
        PROMPT = sys.argv[sys.argv.index("--prompt") + 1]
    torch.set_num_threads(1)
    if "--real" in sys.argv:
        from hsd_torch.models import real as real_models

        tname, dname = sys.argv[sys.argv.index("--real") + 1].split(",")
        (REAL["target"], REAL["tt"]), (REAL["drafter"], REAL["dt"]) = real_models.load(tname), real_models.load(dname)
        print(f"real pair: target {tname}, assistant {dname}")
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; prompt {PROMPT!r}; "
          f"first {positions} new tokens; alpha 1e-3" + (f"; top-k {k_all} for every sampled run" if k_all else ""))
    for run in runs:
        if run.startswith("patched"):
            transformers_uag_patch.apply_patch()
        t0 = time.perf_counter()
        if run.endswith("crash"):
            if run == "crash":
                cg.AssistantVocabTranslatorCache._cache.clear()
            print(f"{run}: {crash_check()}; {time.perf_counter() - t0:.0f} s")
            continue
        if run in ("sample", "sample-top3"):
            cg.AssistantVocabTranslatorCache._cache.clear()  # as a fresh process (module docstring)
        do_sample = run != "greedy"
        top_k = 3 if run.endswith("top3") else k_all
        sample, target, tt = uag_sampler(do_sample, top_k, assistant=run != "control")
        label = {"control": "plain target.generate (no assistant)", "greedy": "UAG greedy"}.get(
            run, f"UAG do_sample {'patched' if run.startswith('patched') else 'unpatched'} top_k={top_k or 0}")
        rep = audit_generate(sample, target, tt, PROMPT, n=n if do_sample else min(n, 200), positions=positions,
                             do_sample=do_sample, top_k=top_k, alpha=1e-3, seed=0, name=label,
                             max_detectable_tv=None)  # the verdict as recorded, the detectable TV printed beside it
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.3f}"
        print(f"{run}: {label}: {rep.verdict}; n={rep.n}; detectable TV (power 0.99) {det}; estimated TV "
              f"{rep.tv_estimate:.3f} (95% interval {rep.tv_ci[0]:.3f} to {rep.tv_ci[1]:.3f}; a lossless sampler "
              f"shows up to {rep.tv_null_q95:.3f}); {time.perf_counter() - t0:.0f} s")
        print("  " + rep.reason)
        if rep.verdict == "lossy" and rep.over:
            print("  most over-represented: " + "; ".join(f"{d.text!r} {d.observed} vs {d.expected:.1f}"
                                                          for d in rep.over[:3]))
        if rdir:
            os.makedirs(rdir, exist_ok=True)
            with open(os.path.join(rdir, f"{run}_pos{positions}.md"), "w") as f:
                f.write(rep.to_markdown())


if __name__ == "__main__":
    main()
