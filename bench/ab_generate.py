"""A/B of ``hsd_torch.generate``'s wall time: this working tree against a git revision, in one process.

    HF_HUB_OFFLINE=1 python bench/ab_generate.py --base 210161a [--repeats 7] [--new 48] [--batch 1]

The revision's ``hsd_torch`` is imported beside the working tree's as ``hsd_torch_base``
(:func:`overhead_ab.load_base`), both run the tiny models and prompt of ``bench/overhead.py`` with
one torch thread, interleaved (the order flips every repeat, so both see the same stretch of a shared
machine's load). Per method (AR, SD, TLI, SLEM, one-token SLRS, bounded SLRS at lookahead 3): the
min and the median wall time of one ``generate`` call over the repeats, and new / base for each.
Each call's tokens are compared too: the two trees must give the same ids for the same seed.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

METHODS: dict[str, dict[str, Any]] = {
    "ar": {"method": "ar"},
    "sd": {"method": "sd", "lookahead": 4},
    "tli": {"method": "tli", "lookahead": 4},
    "slem": {"method": "slem", "lookahead": 4},
    "slrs": {"method": "slrs", "lookahead": 1},
    "bslrs": {"method": "slrs", "lookahead": 3, "proposal_map": "longest_prefix", "min_path_prob": 0.05},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import overhead  # the same tiny models as bench/overhead.py
    import overhead_ab

    new_g = importlib.import_module("hsd_torch.generate").generate
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        base_g = overhead_ab.load_base(args.base, Path(tmp))
        tt, dt, target, drafter, same = overhead.setup()
        prompts = [overhead.PROMPT] * args.batch
        print(f"base {args.base} vs working tree; tiny pair, batch {args.batch}, {args.new} new tokens, "
              f"{args.repeats} repeats, 1 thread")
        for name in args.methods.split(","):
            opts = METHODS[name]
            d = None if name == "ar" else (same if name == "sd" else drafter)
            kw: dict[str, Any] = dict(target_tokenizer=tt, max_new_tokens=args.new,
                                      drafter_tokenizer=None if d is None else (tt if name == "sd" else dt), **opts)
            runs = {"base": base_g, "new": new_g}
            for g in runs.values():
                g(target, d, prompts, seed=0, **kw)  # warm-up
            wall: dict[str, list[float]] = {"base": [], "new": []}
            for r in range(args.repeats):
                outs = {}
                for which in (("base", "new") if r % 2 == 0 else ("new", "base")):
                    start = time.perf_counter()
                    outs[which] = runs[which](target, d, prompts, seed=r + 1, **kw)
                    wall[which].append(time.perf_counter() - start)
                assert outs["base"].sequences == outs["new"].sequences, f"{name}: tokens differ at seed {r + 1}"
            bmin, nmin = min(wall["base"]), min(wall["new"])
            bmed, nmed = statistics.median(wall["base"]), statistics.median(wall["new"])
            ratios.append(nmed / bmed)
            print(f"{name:5s} min base {bmin * 1e3:8.2f} ms new {nmin * 1e3:8.2f} ms new/base {nmin / bmin:.3f}; "
                  f"median base {bmed * 1e3:8.2f} ms new {nmed * 1e3:8.2f} ms new/base {nmed / bmed:.3f}; "
                  "same tokens", flush=True)
    print(f"geometric mean of the median ratios: {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    main()
