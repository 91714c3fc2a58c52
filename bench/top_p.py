"""Top-p on a 262,144-id head: a partial sort of the head against the full sort.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/top_p.py [--repeats 30] [--top-p 0.9] [--temperature 0.7]

Gemma-3-270M's own logits (``hsd_torch.models.real``, float32) at every position of a few
teacher-forced texts are processed as a verification round of lookahead 4 processes them: five
positions at once, ``hsd_torch.engine.laws.process_with_drop`` with the temperature and top-p given. Timed
twice in one process, interleaved: as ``generate`` runs it (``laws.top_p_keep`` sorting the
largest ``TOP_P_FIRST_K`` values first, growing while needed) and with the first head as wide as the
vocabulary (the full sort the code used before). The two must give equal laws bit for bit on every
batch (asserted); the script prints min and median milliseconds per batch of five over the
repeats, their ratio, the sizes of the kept heads, and the cost of processing without top-p.
One thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hsd_torch.engine import laws  # noqa: E402
from hsd_torch.models import real as real_models  # noqa: E402

TEXTS = [
    "def day_of_week(date):\n    year, month, day = map(int, date.split('-'))\n    return",
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks",
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate:",
    "import numpy as np\n\nx = np.linspace(0, 1, 100)\ny = np.sin(2 * np.pi * x)\nprint(",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--temperature", type=float, default=0.7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = real_models.load("gemma-3-270m")
    with torch.inference_mode():
        logits = torch.cat([model(**tok(t, return_tensors="pt")).logits[0] for t in TEXTS])
    v = logits.shape[-1]
    drop = torch.zeros(v, dtype=torch.bool)
    batches = [logits[i:i + 5] for i in range(0, logits.shape[0] - 4, 5)]
    default_k = laws.TOP_P_FIRST_K

    def run(first_k: int, top_p: float | None) -> tuple[float, list[torch.Tensor]]:
        laws.TOP_P_FIRST_K = first_k
        t0 = time.perf_counter()
        out = [laws.process_with_drop(b, drop, args.temperature, None, top_p) for b in batches]
        return (time.perf_counter() - t0) / len(batches), out

    times: dict[str, list[float]] = {"partial": [], "full": [], "no top-p": []}
    try:
        for r in range(args.repeats):
            order = ["partial", "full", "no top-p"] if r % 2 == 0 else ["no top-p", "full", "partial"]
            outs = {}
            for name in order:
                k = v if name == "full" else default_k
                t, outs[name] = run(k, None if name == "no top-p" else args.top_p)
                times[name].append(t)
            assert all(torch.equal(a, b) for a, b in zip(outs["partial"], outs["full"])), "partial != full sort"
    finally:
        laws.TOP_P_FIRST_K = default_k
    kept = torch.cat([(o > 0).sum(-1) for o in outs["partial"]])
    print(f"Gemma-3-270M logits: {logits.shape[0]} positions of {len(TEXTS)} texts, {v} ids; {len(batches)} batches "
          f"of 5; temperature {args.temperature}, top_p {args.top_p}; TOP_P_FIRST_K {default_k}; "
          f"{args.repeats} repeats, 1 thread, torch {torch.__version__}")
    print(f"kept ids per position: min {int(kept.min())}, median {int(kept.median())}, max {int(kept.max())}")
    for name, ts in times.items():
        print(f"{name:9s} ms per batch of 5: min {min(ts) * 1e3:7.2f}  median {statistics.median(ts) * 1e3:7.2f}")
    ratios = [f / p for f, p in zip(times["full"], times["partial"])]
    print(f"full / partial, per repeat: min {min(ratios):.1f}x, median {statistics.median(ratios):.1f}x; "
          "laws equal bit for bit on every batch")


if __name__ == "__main__":
    main()
