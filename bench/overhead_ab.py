"""A/B of ``hsd_torch.generate``'s round overhead: this working tree against a git revision, in one process.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/overhead_ab.py --base 0b67028 [--repeats 5] [--batch 1]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/overhead_ab.py --base 2e6d287 --pair real --temperature 0.7 --top-p 0.9

The revision's ``hsd_torch`` (``git archive``) is imported beside the working tree's as
``hsd_torch_base`` (its imports are package-relative; ``hsd_core`` is the working tree's), and both
run the same models and prompt as ``bench/overhead.py``, interleaved (the order flips every repeat),
so that both see the same stretch of a shared machine's load. Per method: the median over the
repeats of the overhead per round (wall time minus the time inside both models' forward calls,
over rounds) and the ratio new / base.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def load_base(rev: str, into: Path) -> Any:
    """``hsd_torch`` as of ``rev``, importable as ``hsd_torch_base``; returns its generate function."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "hsd_torch"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "hsd_torch").rename(into / "hsd_torch_base")
    sys.path.insert(0, str(into))
    return importlib.import_module("hsd_torch_base").generate  # the package's function, in either layout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--methods", default=None, help="default: ar,sd,tli,slem,slrs (real pair: ar,tli,slem,slrs)")
    ap.add_argument("--pair", choices=("tiny", "real"), default="tiny", help="as bench/overhead.py's")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=None)
    args = ap.parse_args()
    methods = args.methods or ("ar,tli,slem,slrs" if args.pair == "real" else "ar,sd,tli,slem,slrs")
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import overhead  # the same models and forward timer as bench/overhead.py

    new_g = importlib.import_module("hsd_torch.engine.entry").generate
    with tempfile.TemporaryDirectory() as tmp:
        base_g = load_base(args.base, Path(tmp))
        tt, dt, target, drafter, same = overhead.setup_real() if args.pair == "real" else overhead.setup()
        timers = [overhead.Timer(m) for m in (target, drafter, same) if m is not None]
        prompts = [overhead.REAL_PROMPT if args.pair == "real" else overhead.PROMPT] * args.batch
        print(f"base {args.base} vs working tree; {args.pair} pair, batch {args.batch}, {args.repeats} repeats, "
              f"temperature {args.temperature}, top-p {args.top_p}, 1 thread")
        for method in methods.split(","):
            d = None if method == "ar" else (same if method == "sd" else drafter)
            kw: dict[str, Any] = dict(target_tokenizer=tt, method=method, max_new_tokens=args.new,
                                      drafter_tokenizer=None if d is None else (tt if method == "sd" else dt),
                                      lookahead=1 if method == "slrs" else 4, temperature=args.temperature,
                                      top_p=args.top_p)
            runs = {"base": base_g, "new": new_g}
            for g in runs.values():
                g(target, d, prompts, seed=0, **kw)  # warm-up
            over: dict[str, list[float]] = {"base": [], "new": []}
            for r in range(args.repeats):
                for name in (("base", "new") if r % 2 == 0 else ("new", "base")):
                    for t in timers:
                        t.total = 0.0
                    start = time.perf_counter()
                    out = runs[name](target, d, prompts, seed=r + 1, **kw)
                    wall = time.perf_counter() - start
                    inside = sum(t.total for t in timers)
                    over[name].append((wall - inside) / out.stats[0].target_calls)
            b, n = statistics.median(over["base"]), statistics.median(over["new"])
            print(f"{method:5s} overhead per round: base {b * 1e3:.3f} ms, new {n * 1e3:.3f} ms, new/base {n / b:.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
