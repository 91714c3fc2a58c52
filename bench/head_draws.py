"""SLEM's verification draws from top-p's kept heads against the dense laws, inside ``generate`` (issue 50, item 5).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/head_draws.py [--repeats 6] [--calls 2] [--json out.json]

Under top-p, where only a draw reads a target law (SLEM's exact-match verification), ``generate`` keeps
the law as its kept head (``hsd_torch.engine.kernels.HeadLaw``: the kept columns in increasing order and
their values) and draws from it alone (``LazyLaw.draw``), the same bits as the dense draw
(tests/torch/engine/test_head_draws.py). This script runs SLEM on the real pair (Gemma-3-270M <-
SmolLM2-135M-Instruct, float32, temperature 0.7, top-p 0.9, lookahead 4, 48 new tokens, one thread)
in two arms, alternating within one process (the order flips every repeat): ``heads`` (as shipped) and
``dense`` (the target's law built by ``laws.space_law``: written out over every column and drawn
by a cumulative sum over all of them, the path before the change). Per arm it reports the time per
call of ``kernels._exact_match_host`` (the verification's laws, processed lazily, and its draws) and
per position drawn, the ratio heads / dense, and checks that both arms generate the same ids for the
same seeds.
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
from hsd_torch.engine import kernels, laws, verification  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=6, help="rounds of both arms (the order flips each repeat)")
    ap.add_argument("--calls", type=int, default=2, help="generate calls (seeds) per arm and repeat")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import overhead

    torch.set_num_threads(1)
    tt, dt, target, drafter, _ = overhead.setup_real(torch.float32, "real")
    heads_law = verification.space_head_law
    host = kernels._exact_match_host
    draw = kernels.LazyLaw.draw
    spent = {"s": 0.0, "calls": 0, "positions": 0}

    def timed_host(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return host(*a, **kw)
        finally:
            spent["s"] += time.perf_counter() - t0
            spent["calls"] += 1

    def counted_draw(self: kernels.LazyLaw, pairs: Any, u: list[float]) -> Any:
        spent["positions"] += len(pairs)
        return draw(self, pairs, u)

    kernels._exact_match_host = timed_host  # type: ignore[assignment]
    kernels.LazyLaw.draw = counted_draw  # type: ignore[method-assign]
    kw = dict(target_tokenizer=tt, drafter_tokenizer=dt, method="slem", lookahead=4, max_new_tokens=48,
              temperature=0.7, top_p=0.9)
    generate(target, drafter, overhead.REAL_PROMPT, seed=0, **kw)  # warm-up
    per_call: dict[str, list[float]] = {"heads": [], "dense": []}
    per_pos: dict[str, list[float]] = {"heads": [], "dense": []}
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    load = [os.getloadavg()[0]]
    try:
        for r in range(args.repeats):
            for arm in (("heads", "dense") if r % 2 == 0 else ("dense", "heads")):
                verification.space_head_law = heads_law if arm == "heads" else laws.space_law  # type: ignore[assignment]
                spent.update(s=0.0, calls=0, positions=0)
                for s in range(args.calls):
                    got = generate(target, drafter, overhead.REAL_PROMPT, seed=s + 1, **kw).sequences
                    if outputs.setdefault((arm, s), got) != got:
                        raise SystemExit(f"arm {arm}, seed {s + 1}: another output than its first run")
                per_call[arm].append(spent["s"] / spent["calls"] * 1e3)
                per_pos[arm].append(spent["s"] / spent["positions"] * 1e3)
            load.append(os.getloadavg()[0])
    finally:
        verification.space_head_law = heads_law  # type: ignore[assignment]
        kernels._exact_match_host = host  # type: ignore[assignment]
        kernels.LazyLaw.draw = draw  # type: ignore[method-assign]
    same = all(outputs["heads", s] == outputs["dense", s] for s in range(args.calls))
    med_call = {a: statistics.median(v) for a, v in per_call.items()}
    med_pos = {a: statistics.median(v) for a, v in per_pos.items()}
    ratios = [h / d for h, d in zip(per_pos["heads"], per_pos["dense"])]
    print(f"_exact_match_host ms per call (median of {args.repeats} repeats): heads {med_call['heads']:.3f}, "
          f"dense {med_call['dense']:.3f}; per position drawn: heads {med_pos['heads']:.3f}, dense "
          f"{med_pos['dense']:.3f}, saved {med_pos['dense'] - med_pos['heads']:.3f} ms; heads / dense per position: "
          f"median {statistics.median(ratios):.3f} (repeats {min(ratios):.3f} to {max(ratios):.3f}); "
          f"load average {min(load):.2f} to {max(load):.2f}; same ids: {same}")
    if not same:
        raise SystemExit("the two arms generated different ids: the head draws are not the dense draws' bits")
    save({"per_call_ms": per_call, "per_position_ms": per_pos, "median_per_call_ms": med_call,
          "median_per_position_ms": med_pos, "ratio_heads_over_dense_per_position": ratios, "load_average": load,
          "same_ids": same, "repeats": args.repeats, "calls": args.calls}, args.json)


if __name__ == "__main__":
    main()
