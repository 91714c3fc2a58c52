"""What ``generate`` pays per call to key its per-tokenizer caches: the cheap fingerprint read on
every call against the full state read when the fingerprint moves (``hsd_torch.vocab``).

    HF_HUB_OFFLINE=1 python bench/tokenizer_fingerprint.py [--repeats 9] [--out bench/tokenizer_fingerprint.json]

For each real tokenizer that is available (Gemma-3-270M and SmolLM2-135M-Instruct from
``hsd_torch.models.real``; Qwen2.5, GPT-2, cl100k, o200k and LLaMA from ``.cache/real-tokenizers``,
which ``tests/torch/fetch_real_tokenizers.sh`` fetches), times in one process, ``--repeats`` calls
of each back to back: :func:`~hsd_torch.vocab.tokenizer_fingerprint` (read on every call),
:func:`~hsd_torch.vocab.tokenizer_state` (read in full only when the fingerprint moves; before,
on every call), :func:`~hsd_torch.vocab.model_digest` alone, and
:func:`~hsd_torch.vocab.tokenizer_state_cached` on an unchanged tokenizer (what a call pays now).
Prints min and median milliseconds as a Markdown table and writes them as JSON (with the commit and
machine: ``bench_record``). Goal (issue 50): at most 5 ms per call on Gemma's tokenizer. One thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import bench_record  # noqa: E402


def tokenizers() -> dict[str, Any]:
    """Every real tokenizer this machine has, by name."""
    from transformers import AutoTokenizer

    from hsd_torch.models import real, real_tokenizers

    out: dict[str, Any] = {}
    for name in real.available():
        folder = real.cache_dir() / name
        out[name] = AutoTokenizer.from_pretrained(str(folder)) if folder.is_dir() else real.load(name)[1]
    for name, why_not in real_tokenizers.available().items():
        if why_not is None:
            out[name] = real_tokenizers.load(name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=None, help="JSON file for the record")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from hsd_torch.vocab import (forget_tokenizer, model_digest, tokenizer_fingerprint, tokenizer_state,
                                 tokenizer_state_cached)
    from hsd_torch.vocab.byte_strings import _backend

    toks = tokenizers()
    rows: list[dict[str, Any]] = []
    print("tokenizer | ids | added | fingerprint ms (min / median) | full state ms | digest alone ms | "
          "cached state, unchanged ms | full / cached")
    print("---|---|---|---|---|---|---|---")
    for name, tok in toks.items():
        b = _backend(tok)
        forget_tokenizer(tok)
        tokenizer_state_cached(tok)  # the first read: full
        fns: dict[str, Callable[[], Any]] = {
            "fingerprint": lambda: tokenizer_fingerprint(tok), "cached": lambda: tokenizer_state_cached(tok),
            "state": lambda: tokenizer_state(tok), "digest": lambda: model_digest(b.model)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for k, f in fns.items():  # each function's calls back to back (after a multi-megabyte full
            for _ in range(args.repeats):  # state, the next call of anything runs on cold caches)
                t0 = time.perf_counter()
                f()
                times[k].append((time.perf_counter() - t0) * 1e3)
        row = {"tokenizer": name, "ids": b.get_vocab_size(with_added_tokens=True),
               "added": len(b.get_added_tokens_decoder())}
        for k, ts in times.items():
            row[k] = {"min_ms": min(ts), "median_ms": statistics.median(ts)}
        rows.append(row)
        med = {k: row[k]["median_ms"] for k in fns}
        print(f"{name} | {row['ids']:,} | {row['added']:,} | {row['fingerprint']['min_ms']:.2f} / {med['fingerprint']:.2f} | "
              f"{row['state']['min_ms']:.1f} / {med['state']:.1f} | {row['digest']['min_ms']:.1f} / {med['digest']:.1f} | "
              f"{row['cached']['min_ms']:.2f} / {med['cached']:.2f} | {med['state'] / med['cached']:.0f}x")
    bench_record.save({"repeats": args.repeats, "threads": 1, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
