"""A rejection's residual on the support of p against over every column, inside ``generate`` (issue 50, item 5).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/residual_support.py [--repeats 4] [--calls 2] [--json out.json]

With top-p (or top-k) the target's law at a rejected position is zero outside the few ids top-p kept,
and so is the residual ``max(p - q, 0)``: ``hsd_torch.engine.kernels._residual_on_support`` draws the
correction from those columns alone, the same bits as the whole row (tests/torch/engine/test_kernels.py).
This script runs TLI on the real pair (Gemma-3-270M <- SmolLM2-135M-Instruct, float32, temperature 0.7,
top-p 0.9, lookahead 4, 48 new tokens, one thread) with the support path on and off (off: the function
declines, so the kernel takes the whole row, as before it existed), the arms alternating within one
process, and reports the time per call of ``_final_tokens`` (the correction or bonus of a round) in each
arm, and checks that both arms generate the same ids for the same seeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_record import save  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.engine import kernels  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=4, help="rounds of both arms (the order flips each repeat)")
    ap.add_argument("--calls", type=int, default=2, help="generate calls (seeds) per arm and repeat")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import overhead

    torch.set_num_threads(1)
    tt, dt, target, drafter, _ = overhead.setup_real(torch.float32, "real")
    support = kernels._residual_on_support
    final = kernels._final_tokens
    spent = {"s": 0.0, "n": 0}

    def timed_final(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return final(*a, **kw)
        finally:
            spent["s"] += time.perf_counter() - t0
            spent["n"] += 1

    def declined(*a: Any, **kw: Any) -> None:
        return None

    kernels._final_tokens = timed_final  # type: ignore[assignment]
    kw = dict(target_tokenizer=tt, drafter_tokenizer=dt, method="tli", lookahead=4, max_new_tokens=48,
              temperature=0.7, top_p=0.9)
    generate(target, drafter, overhead.REAL_PROMPT, seed=0, **kw)  # warm-up
    per_call: dict[str, list[float]] = {"support": [], "whole row": []}
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    for r in range(args.repeats):
        for arm in (("support", "whole row") if r % 2 == 0 else ("whole row", "support")):
            kernels._residual_on_support = support if arm == "support" else declined  # type: ignore[assignment]
            spent["s"], spent["n"] = 0.0, 0
            for s in range(args.calls):
                outputs.setdefault((arm, s), generate(target, drafter, overhead.REAL_PROMPT, seed=s + 1, **kw).sequences)
            per_call[arm].append(spent["s"] / spent["n"] * 1e3)
    kernels._residual_on_support = support  # type: ignore[assignment]
    kernels._final_tokens = final  # type: ignore[assignment]
    same = all(outputs["support", s] == outputs["whole row", s] for s in range(args.calls))
    med = {a: statistics.median(v) for a, v in per_call.items()}
    print(f"_final_tokens ms per call (median of {args.repeats} repeats): support {med['support']:.3f}, whole row "
          f"{med['whole row']:.3f}, saved {med['whole row'] - med['support']:.3f} ms a round; same ids: {same}")
    if not same:
        raise SystemExit("the two arms generated different ids: the support path is not the whole row's bits")
    save({"per_call_ms": per_call, "median_ms": med, "same_ids": same, "repeats": args.repeats,
          "calls": args.calls}, args.json)


if __name__ == "__main__":
    main()
