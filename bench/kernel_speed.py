"""Speed of hsd_torch.engine.kernels: against hsd_core run row by row, and against one pass over the data.

For every B in {1, 8, 64}, K in {4, 8}, V in {4k, 50k, 150k} (float32 laws, the usual model
dtype) it times, in one run and on one thread:

* ``rejection_verify`` and ``exact_match_verify`` on the whole batch;
* ``clone``: ``p.clone()`` plus ``q.clone()`` (the time to read and write the laws once, a proxy for
  memory bandwidth); the goal is a kernel within 3x of it on the CPU. On the CPU a large clone
  mostly pays for the first touch of freshly allocated pages, so ``read`` (``p.sum()`` plus
  ``q.sum()``: one read pass, no allocation) is reported too, as the stricter yardstick;
* ``hsd_core``: ``RejectionVerifier.verify`` on the same laws (float64 tuples, validated by the
  model as hsd_core always does), row by row. It is timed on ``min(B, --ref-rows)`` rows and scaled
  to B rows (stated in the output).

Each figure is the min and median of ``--repeat`` runs. Ratios come from one run of this script.

    python bench/kernel_speed.py                       # full table (about 10 minutes on 2 CPU cores)
    python bench/kernel_speed.py --quick               # B in {1, 8}, V in {4k, 50k}
    python bench/kernel_speed.py --device cuda --json out.json
    python bench/kernel_speed.py --agreement           # float32 vs float64 decision agreement rate
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import save  # noqa: E402
from hsd_core.laws import Law, as_law  # noqa: E402
from hsd_core.methods.base import RejectionVerifier  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_torch.engine.kernels import exact_match_verify, rejection_verify  # noqa: E402


def timed(fn: Callable[[], object], repeat: int, sync: Callable[[], None]) -> tuple[float, float]:
    """(min, median) seconds of ``fn`` over ``repeat`` runs, after one warm-up."""
    fn()
    sync()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def make_batch(b: int, k: int, v: int, device: str, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    logits_p = torch.randn(b, k + 1, v, generator=g) * 3
    logits_q = logits_p[:, :k] + torch.randn(b, k, v, generator=g)
    p = torch.softmax(logits_p, -1)
    q = torch.softmax(logits_q, -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    return dict(p=p.to(device, dtype), q=q.to(device, dtype), drafts=drafts.to(device),
                n=torch.full((b,), k, device=device), ua=torch.rand(b, k, generator=g, dtype=torch.float64).to(device),
                uf=torch.rand(b, generator=g, dtype=torch.float64).to(device),
                u=torch.rand(b, k + 1, generator=g, dtype=torch.float64).to(device))


class _Ids:
    """The part of an hsd_core Vocabulary that verification reads (building a real 150k-string
    Vocabulary costs far more than verifying, so the benchmark does not time it)."""

    def __init__(self, v: int) -> None:
        self.eos_id = v - 1
        self._n = v

    def __len__(self) -> int:
        return self._n


class _RowModel:
    """An hsd_core Model-protocol object whose law after j tokens is row j, validated by
    ``hsd_core.laws.as_law`` at every call as hsd_core's models do."""

    def __init__(self, rows: list[tuple[float, ...]]) -> None:
        self.rows = rows
        self.vocab = _Ids(len(rows[0]))
        self.tokenizer = None

    def next_probs(self, ctx: Sequence[int]) -> Law:
        return as_law(self.rows[len(ctx)], len(self.vocab))


def reference_seconds(c: dict[str, torch.Tensor], rows: int) -> float:
    """hsd_core's RejectionVerifier.verify on ``rows`` rows (laws as float64 tuples, validated at
    each use), seconds per row."""
    p = c["p"].double().cpu().numpy()
    q = c["q"].double().cpu().numpy()
    p = p / p.sum(-1, keepdims=True)  # hsd_core validates sums to 1e-9
    q = q / q.sum(-1, keepdims=True)
    total = 0.0
    for b in range(rows):
        prow = [tuple(x.tolist()) for x in p[b]]
        qs = [tuple(x.tolist()) for x in q[b]]
        drafts = [int(x) for x in c["drafts"][b].tolist()]
        uni = c["ua"][b].tolist() + [float(c["uf"][b])]
        t0 = time.perf_counter()
        RejectionVerifier().verify(_RowModel(prow), (), drafts, qs, UniformRand(uni), 10**9)  # type: ignore[arg-type]
        total += time.perf_counter() - t0
    return total / rows


def agreement(rows: int, k: int, v: int, device: str) -> dict[str, float]:
    """Fraction of rows whose decisions differ between float32 (and bfloat16) and float64 inputs."""
    c = make_batch(rows, k, v, device, torch.float64, seed=1)
    base = rejection_verify(c["p"], c["q"], c["drafts"], c["n"], c["ua"], c["uf"]).tokens
    base_em = exact_match_verify(c["p"], c["drafts"], c["n"], c["u"]).tokens
    out: dict[str, float] = {"rows": rows, "K": k, "V": v}
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        r = rejection_verify(c["p"].to(dt), c["q"].to(dt), c["drafts"], c["n"], c["ua"], c["uf"]).tokens
        e = exact_match_verify(c["p"].to(dt), c["drafts"], c["n"], c["u"]).tokens
        out[f"rejection_{name}_differs"] = float((r != base).any(1).double().mean())
        out[f"exact_match_{name}_differs"] = float((e != base_em).any(1).double().mean())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    ap.add_argument("--quick", action="store_true", help="B in {1, 8}, V in {4k, 50k}")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--ref-rows", type=int, default=2, help="rows timed in hsd_core (scaled to B)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the table as JSON here")
    ap.add_argument("--agreement", action="store_true", help="measure float32/bfloat16 vs float64 agreement only")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev = args.device
    sync = (lambda: torch.cuda.synchronize()) if dev.startswith("cuda") else (lambda: None)
    if args.agreement:
        res = [agreement(5_000, 4, 4096, dev), agreement(1_000, 4, 50_000, dev)]
        for r in res:
            print(json.dumps(r))
        if args.json:
            save({"device": dev, "agreement": res}, args.json)
        return 0
    dtype = getattr(torch, args.dtype)
    bs = [1, 8] if args.quick else [1, 8, 64]
    vs = [4096, 50_000] if args.quick else [4096, 50_000, 150_000]
    rows = []
    print(f"device={dev} dtype={args.dtype} threads={torch.get_num_threads()} repeat={args.repeat} "
          f"(seconds: min/median; hsd_core timed on min(B, {args.ref_rows}) rows, scaled to B)")
    hdr = ("B", "K", "V", "read ms", "clone ms", "reject ms", "reject/clone", "reject/read", "match ms", "match/clone",
           "hsd_core ms", "core/reject")
    print(" | ".join(hdr))
    for b in bs:
        for k in (4, 8):
            for v in vs:
                c = make_batch(b, k, v, dev, dtype)
                rep = max(3, args.repeat if b * v <= 64 * 50_000 else args.repeat // 2)
                clone = timed(lambda: (c["p"].clone(), c["q"].clone()), rep, sync)
                read = timed(lambda: (c["p"].sum(), c["q"].sum()), rep, sync)
                rej = timed(lambda: rejection_verify(c["p"], c["q"], c["drafts"], c["n"], c["ua"], c["uf"]), rep, sync)
                em = timed(lambda: exact_match_verify(c["p"], c["drafts"], c["n"], c["u"]), rep, sync)
                ref = reference_seconds(c, min(b, args.ref_rows)) * b
                row = dict(B=b, K=k, V=v, read_ms=read[0] * 1e3, clone_ms=clone[0] * 1e3, clone_median_ms=clone[1] * 1e3,
                           reject_ms=rej[0] * 1e3, reject_median_ms=rej[1] * 1e3,
                           match_ms=em[0] * 1e3, match_median_ms=em[1] * 1e3, hsd_core_ms=ref * 1e3,
                           reject_over_clone=rej[0] / clone[0], match_over_clone=em[0] / clone[0],
                           reject_over_read=rej[0] / read[0],
                           core_over_reject=ref / rej[0])
                rows.append(row)
                print(f"{b} | {k} | {v} | {read[0]*1e3:.2f} | {clone[0]*1e3:.2f}/{clone[1]*1e3:.2f} | "
                      f"{rej[0]*1e3:.2f}/{rej[1]*1e3:.2f} | {rej[0]/clone[0]:.2f} | {rej[0]/read[0]:.1f} | "
                      f"{em[0]*1e3:.2f}/{em[1]*1e3:.2f} | {em[0]/clone[0]:.2f} | "
                      f"{ref*1e3:.0f} | {ref/rej[0]:.0f}x", flush=True)
                del c
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        save({"device": dev, "dtype": args.dtype, "threads": torch.get_num_threads(), "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
