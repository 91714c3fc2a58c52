"""The drafter's re-sync per round: the whole text re-encoded against the incremental rule.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/resync.py [--bytes 6000] [--step 20] [--repeats 5]

The text (the first ``--bytes`` of README.md) grows ``--step`` bytes a round, as the emitted text of a
generation grows; each round computes the drafter's context with
``hsd_core.methods.resync.drafter_context_ids`` over bytes, as ``hsd_torch`` does
(``TokenText.encode(free=True)``), once with ``Resync(None)`` (the whole text every round) and once
with the default ``Resync()`` (a memo carried across rounds), for each real tokenizer
(``hsd_torch.models.real``). Prints the mean time per round (min and median over the repeats) and
whether the two rules gave the same ids at every round. One thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hsd_core.methods.resync import Resync, ResyncMemo, drafter_context_ids  # noqa: E402
from hsd_torch.models import real as real_models  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=6000)
    ap.add_argument("--step", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_bytes()[:args.bytes]
    cuts = list(range(args.step, len(text) + 1, args.step))
    print(f"README.md's first {len(text)} bytes, grown {args.step} bytes a round ({len(cuts)} rounds), "
          f"{args.repeats} repeats, 1 thread")
    for name in real_models.available():
        tok = real_models.load_tokenizer(name)
        tt = TokenText.get(tok, len(tok))

        def encode(b: bytes, tt: TokenText = tt) -> list[int]:
            return tt.encode(b, free=True)

        per: dict[str, list[float]] = {}
        got: dict[str, list[list[int]]] = {}
        for r in range(args.repeats):
            for rule in (Resync(None), Resync()):
                key = "whole text" if rule.stride is None else f"incremental {rule}"
                memo: ResyncMemo[bytes] = ResyncMemo(b"")
                out = []
                t0 = time.perf_counter()
                for c in cuts:
                    out.append(drafter_context_ids(text[:c], encode, tt.decode, rule, memo))
                per.setdefault(key, []).append((time.perf_counter() - t0) / len(cuts))
                got[key] = out
        same = got["whole text"] == got[f"incremental {Resync()}"]
        for key, ts in per.items():
            print(f"{name:22s} {key:45s} ms per round: min {min(ts) * 1e3:.3f}, median {statistics.median(ts) * 1e3:.3f}")
        print(f"{name:22s} same ids at every round: {same}")


if __name__ == "__main__":
    main()
