"""One-command device check of hsd_torch.generate: ``python bench/gpu_check_generate.py``.

On the first CUDA device (or the CPU when there is none, to check the script itself):

1. Greedy, float64 tiny models, every method and two tokenizer pairs: output equals the target's
   own ``model.generate(do_sample=False)``; sampled output on the device equals the CPU run with
   the same seed for most rows (CUDA's scans add in another order, so a draw within rounding of a
   boundary may differ: the count is printed, not asserted). Then transformers' calling
   conventions (a left-padded ``input_ids`` batch, a logits processor, stop strings, a minimum
   length): output equal to the target's own ``generate`` with the same arguments.
2. Sampled, float32 (the dtype users run; ``--dtype bfloat16`` for the other one), on the device, batched (``--samples`` rows of one
   prompt per method, 20,000 by default, in chunks of ``--chunk`` rows: rows are independent
   samples, row i seeded by ``(seed, i)``, each chunk its own seed), processed with top-k 8
   (``--top-k``; 0: the full vocabulary, with far less power per sample): the first two new tokens
   against the target's own law of them (:func:`hsd_torch.auditing.first_tokens.audit_generate`, alpha 1e-3 per
   method; each line prints the TV detectable with power 0.99: 0.036 at 20,000 samples and top-k
   8). This runs the device's sampling paths (draws, residuals, pushforwards, batched caches with
   masks and dropped rows). A lossy control (TLI drafting and verifying at temperature 1.5,
   audited as temperature 1: TV about 0.15) must be rejected. In bfloat16 the audit's reference law is
   the same bfloat16 model's one-row, uncached forward pass, while generate's rows run batched with a
   KV cache: the two differ by bfloat16 rounding, so a bfloat16 rejection says
   "lossy or rounding", and the float32 run is the one that judges the method.

Exits non-zero on a greedy mismatch, a rejected method or an accepted lossy control. About a
minute on this project's CPU (where it checks the script itself).
"""

from __future__ import annotations

import functools

import argparse
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.first_tokens import audit_generate  # noqa: E402
from hsd_torch.models.mirror import target_greedy  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

PROMPTS = ["def foo(x):\n", "Hello", "import os\n", "naïve café", "x", "for i in range(3):\n    "]
BOUNDED = {"min_path_prob": 0.05, "proposal_map": "longest_prefix"}  # bounded SLRS's options


def build(tb: Any, tu: Any, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    """The models of both parts, on the CPU: target "t" (Llama, byte-level BPE), drafter "d" (GPT-2,
    Unigram, a padded embedding), SD drafter "s" (GPT-2 on the target's tokenizer)."""
    return {"t": tiny.tiny_llama(tb, seed=0, dtype=dtype),
            "d": tiny.tiny_gpt2(tu, seed=1, vocab_size=len(tu) + 32, dtype=dtype),
            "s": tiny.tiny_gpt2(tb, seed=3, dtype=dtype)}


def sampled(dev: torch.device, tb: Any, tu: Any, n: int, chunk: int, top_k: int | None,
            dtype: torch.dtype = torch.float32) -> int:
    """Part 2 (module docstring): returns the number of failures."""
    t, d, s = (m.to(dev) for m in build(tb, tu, dtype).values())
    prompt = PROMPTS[0]
    configs: list[tuple[str, Any, Any, dict[str, Any], bool]] = [
        ("ar", None, None, {}, True), ("sd", s, tb, {}, True), ("tli", d, tu, {}, True), ("slem", d, tu, {}, True),
        ("slrs", d, tu, {"lookahead": 1}, True), ("slrs", d, tu, BOUNDED, True),
        ("tli", d, tu, {"temperature": 1.5}, False)]  # the lossy control: audited at temperature 1
    fails = 0
    for k, (method, drafter, dt, extra, lossless) in enumerate(configs):
        t0 = time.perf_counter()
        kw: dict[str, Any] = dict(target_tokenizer=tb, drafter_tokenizer=dt, method=method, lookahead=3,
                                  max_new_tokens=2, top_k=top_k)
        kw.update(extra)
        rows: list[list[int]] = []
        for c, start in enumerate(range(0, n, chunk)):
            rows.extend(generate(t, drafter, [prompt] * min(chunk, n - start), seed=1000 * k + c, **kw).sequences)
        it: Iterator[list[int]] = iter(rows)
        rep = audit_generate(lambda _p, _s: next(it), t, tb, prompt, n=n, top_k=top_k, alpha=1e-3, seed=k,
                             mask_textless=True, max_detectable_tv=None)  # sizes stated above; verdict as recorded
        ok = (rep.verdict == "lossless-consistent") if lossless else (rep.verdict == "lossy")
        fails += not ok
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.3f}"
        name = method + (" bounded" if "min_path_prob" in extra else "") + ("" if lossless else " LOSSY CONTROL")
        print(f"  {name:22s} n={n}: {rep.verdict:20s} TV estimate {rep.tv_estimate:.3f}, detectable TV {det}"
              f" ({time.perf_counter() - t0:.1f}s){'' if ok else '  <-- FAIL'}")
    return fails


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--samples", type=int, default=20000, help="sampled rows per method")
    ap.add_argument("--chunk", type=int, default=2000, help="rows per generate call")
    ap.add_argument("--top-k", type=int, default=8,
                    help="top-k of the sampled part (0: the full vocabulary, less power per sample)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the sampled part's dtype")
    ap.add_argument("--skip-greedy", action="store_true")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {dev} ({torch.cuda.get_device_name(0) if dev.type == 'cuda' else 'no CUDA device'})")
    tb, tu = tiny.tiny_tokenizer("byte_bpe"), tiny.tiny_tokenizer("unigram")
    bad = 0
    if args.skip_greedy:
        print("greedy part skipped")
    else:
        bad = greedy(dev, tb, tu) + conventions(dev, tb, tu)
    n = args.samples
    top_k = args.top_k or None
    print(f"sampled, {args.dtype} on {dev}, top-k {top_k}: first two new tokens against the target's law "
          "(alpha 1e-3 each)")
    fails = sampled(dev, tb, tu, n, args.chunk, top_k, getattr(torch, args.dtype))
    print("FAIL" if bad or fails else "OK")
    return 1 if bad or fails else 0


def conventions(dev: torch.device, tb: Any, tu: Any) -> int:
    """Part 1b: transformers' calling conventions on the device, greedy, float64: a left-padded
    ``input_ids`` batch with ``logits_processor`` (repetition penalty), ``stop_strings`` and
    ``min_new_tokens`` for AR, TLI, SLEM and bounded SLRS; output equal to the target's own
    ``generate`` with the same arguments, row by row (the target's whole law, ``mask_textless=False``,
    as transformers keeps it). Returns the number of mismatches."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    on = {k: m.to(dev) for k, m in build(tb, tu, torch.float64).items()}
    old = tb.padding_side
    tb.padding_side = "left"
    try:
        enc = tb(PROMPTS, return_tensors="pt", padding=True).to(dev)
    finally:
        tb.padding_side = old
    rows = [[int(v) for v, m in zip(r, mk) if m] for r, mk in zip(enc.input_ids.tolist(), enc.attention_mask.tolist())]
    extra: dict[str, Any] = dict(stop_strings=["\n"], min_new_tokens=3)
    want = []
    for r in rows:
        x = torch.tensor([r], device=dev)
        with torch.inference_mode():
            out = on["t"].generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=16,
                                   pad_token_id=tb.eos_token_id, tokenizer=tb,
                                   logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)]),
                                   **extra)
        want.append(out[0, len(r):].tolist())
    bad = 0
    for method, extra_m in (("ar", {}), ("tli", {}), ("slem", {}), ("slrs", BOUNDED)):
        t0 = time.perf_counter()
        g = generate(on["t"], on["d"], target_tokenizer=tb, drafter_tokenizer=tu, method=method, lookahead=3,
                     max_new_tokens=16, do_sample=False, input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                     logits_processor=[RepetitionPenaltyLogitsProcessor(1.5)], mask_textless=False, **extra, **extra_m)
        miss = sum(a != b for a, b in zip(g.sequences, want))
        bad += miss
        print(f"{method:5s} input_ids + processor + stop/min: rows equal to target.generate: {len(rows) - miss}/"
              f"{len(rows)} ({time.perf_counter() - t0:.1f}s){'  <-- FAIL' if miss else ''}")
    return bad


def greedy(dev: torch.device, tb: Any, tu: Any) -> int:
    """Part 1 (module docstring): returns the number of greedy mismatches."""
    cpu = build(tb, tu, torch.float64)
    on = {k: m.to(dev) for k, m in build(tb, tu, torch.float64).items()}
    bad = 0
    for method, d, dt, extra in (("ar", None, None, {}), ("sd", "s", tb, {}), ("tli", "d", tu, {}),
                                 ("slem", "d", tu, {}), ("tli", "s", tb, {}), ("slrs", "d", tu, {"lookahead": 1}),
                                 ("slrs", "d", tu, BOUNDED)):
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
    return bad


if __name__ == "__main__":
    sys.exit(main())
