"""Bounded multi-token SLRS's round with its children parsed only where they matter, against every child parsed.

    HF_HUB_OFFLINE=1 python bench/slrs_multi_parse.py [--repeats 3] [--lookahead 4] [--tau 0.05] [--json F]

The first round (``hsd_torch.slrs.first_round_multi``, sampling, ``max_tokens=None``, budget 8) on
Gemma-3-270M <- SmolLM2-135M-Instruct (``hsd_torch.models.real``, float32) for a code and a prose
prompt, timed interleaved in one process: as ``generate`` runs it (past the root level, only the
children whose proposal can share the row's first id, or that may grow, are parsed:
``MultiTokenRound.needs_parse``) and with every child parsed (the code before). Asserts the same
proposals, conditionals (bit for bit) and evaluations; prints the medians, their ratio, and the
(node, drafter id) pairs parsed each way. One thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_record import provenance, save  # noqa: E402

from hsd_torch.models import real as real_models  # noqa: E402
from hsd_torch import slrs as tslrs  # noqa: E402
from hsd_torch.methods.slrs import psi_multi  # noqa: E402

PROMPTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "The history of the city begins in the twelfth century, when"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, tt = real_models.load("gemma-3-270m")
    drafter, dt = real_models.load("smollm2-135m-instruct")
    vt = target.get_output_embeddings().weight.shape[0]
    us = [list(np.random.default_rng(i).random(args.lookahead)) for i in range(len(PROMPTS))]
    parsed: list[int] = []
    real_parse = psi_multi.parse_pairs

    def counting(*a: Any) -> Any:
        parsed.append(int(a[3].shape[0]))
        return real_parse(*a)

    psi_multi.parse_pairs = counting  # type: ignore[assignment]
    pruned_needs = psi_multi.MultiTokenRound.needs_parse

    def run(prune: bool) -> tuple[Any, float, int]:
        psi_multi.MultiTokenRound.needs_parse = (pruned_needs if prune  # type: ignore[method-assign]
                                                 else lambda self, *a: None)
        parsed.clear()
        t0 = time.perf_counter()
        with torch.inference_mode():
            res = tslrs.first_round_multi(tt, vt, drafter, dt, PROMPTS, lookahead=args.lookahead,
                                          min_path_prob=args.tau, max_tokens=None, budget=8, uniforms=us)
        return res, time.perf_counter() - t0, sum(parsed)

    times: dict[str, list[float]] = {"pruned": [], "every child": []}
    counts: dict[str, int] = {}
    try:
        run(True)  # warm-up: the trie, the byte tables, the root parse
        for rep in range(args.repeats):
            outs = {}
            for name in (("pruned", "every child") if rep % 2 == 0 else ("every child", "pruned")):
                res, t, n = run(name == "pruned")
                times[name].append(t)
                counts[name] = n
                outs[name] = res
            a, b = outs["pruned"], outs["every child"]
            assert a.proposals == b.proposals and a.evaluations == b.evaluations
            assert torch.equal(a.conditionals, b.conditionals), "the pruning changed psi"
    finally:
        psi_multi.parse_pairs = real_parse
        psi_multi.MultiTokenRound.needs_parse = pruned_needs  # type: ignore[method-assign]
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = statistics.median([f / p for f, p in zip(times["every child"], times["pruned"])])
    res = {"pair": "gemma-3-270m <- smollm2-135m-instruct", "prompts": len(PROMPTS), "lookahead": args.lookahead,
           "tau": args.tau, "max_tokens": None, "budget": 8, "repeats": args.repeats,
           "pruned_s_median": round(med["pruned"], 3), "every_child_s_median": round(med["every child"], 3),
           "every_child_over_pruned_median": round(ratio, 3), "pairs_parsed_pruned": counts["pruned"],
           "pairs_parsed_every_child": counts["every child"],
           "proposal_lengths": [len(x) for x in a.proposals], "evaluations": a.evaluations,
           **provenance(), "torch": torch.__version__, "threads": 1}
    print(json.dumps(res, indent=1))
    print(f"first round, {len(PROMPTS)} prompts: pruned {med['pruned']:.2f} s, every child {med['every child']:.2f} s "
          f"(median of {args.repeats}); every child / pruned {ratio:.2f}x; pairs parsed {counts['pruned']} vs "
          f"{counts['every child']}; the same psi bit for bit")
    save(res, args.json)


if __name__ == "__main__":
    main()
