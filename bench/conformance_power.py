"""Power and cost of the conformance matrix (issue 47, item 5) on hsd_torch's engine: per processing
case of ``hsd_torch.conformance.matrix.CASES``, the draws N that make a per-token TV of 0.01 (at any
position; the mean per-token TV is at most the largest) and a first-token TV of 0.005 detectable
with power 0.99 at family-wise alpha 1e-3 (Holm over the case's tests: each at 1e-3 / m;
:func:`hsd_core.stats.min_num_samples_for_tv` with k the position's support), then one cell of
that case run as ``hsd conformance run`` runs it (:func:`hsd_torch.conformance.matrix.audit_case`:
the draws appended to a samples file in a temporary folder, then audited) and its cost in parts:
the exact law, the draws (the samples file included), the audit, the acceptance reference.

    python bench/conformance_power.py --json bench/conformance_power.json [--n 20000] [--goal-case plain]
        [--goal] [--mode sd --mode none] [--workers 2] [--case plain ...]

    python bench/conformance_power.py --cpu --n 20000 --case plain --mode sd --mode none [--workers 2]
        [--repeat 3] [--json FILE]

``--cpu`` times the draws alone (``HsdTorchEngine.sample`` without a file, no audit) and reports
the CPU seconds a draw costs: the parent process's and the workers' (psutil), whatever else runs
on the machine beside them, which wall time is not; each mode ``--repeat`` times, on fresh seeds,
after one warm-up batch per worker. On an idle machine of 2 cores with 2 workers the wall time of
N draws is about N x that / 2 (an estimate). With ``--workers 1`` (the process then set up as a worker
sets itself up: one torch thread, its garbage collector and allocator) each run also reports the CPU spent inside the
models' forward passes (forward hooks), the part of a draw no change to ``generate``'s bookkeeping
can save.

``--goal`` runs every case at the N the goal needs (about 4 x 10^5 draws: minutes a case),
``--goal-case NAME`` that case only; the others run ``--n`` draws, and the time for the goal's N is
scaled from them (the draws' time is linear in N beyond one batch of the engine; the audit's is
too; the law's and the exact expectation's do not grow with N). A point-mass case (greedy) runs
2000 draws: its exact check needs no more. Each row records the N, the seconds of each part, the
draws per second, the CPU seconds of the process and its workers (psutil; what the cell costs the
machine whatever else runs beside it: on an idle machine of 2 cores with 2 workers the wall time is
about half of it), and the TVs the cell detects. ``--workers``:
hsd_torch's worker processes (:class:`HsdTorchEngine`'s ``workers``).

Not a timed test. The machine is shared (2 cores, other developers' jobs): times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median_high
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import save  # noqa: E402
from hsd_core import conformance as kc  # noqa: E402
from hsd_core.processing import AmbiguousLawError  # noqa: E402
from hsd_core.stats import InvalidTest, min_num_samples_for_tv  # noqa: E402
from hsd_torch.conformance.engines import Case  # noqa: E402
from hsd_torch.conformance.hsd_engine import DEFAULT_DRAFTER, HsdTorchEngine, set_up_as_worker  # noqa: E402
from hsd_torch.conformance.kit import build_kit  # noqa: E402
from hsd_torch.conformance.matrix import CASES, MODE_SPECS, audit_case  # noqa: E402

ALPHA, POWER, TOKEN_TV, FIRST_TV, BUDGET_S = 1e-3, 0.99, 0.01, 0.005, 120.0


def needed(law: dict[tuple[int, ...], tuple[float, str]]) -> dict[str, int]:
    """N for a per-token TV 0.01 at every position and 0.005 at the first, at alpha 1e-3 / m."""
    pos = kc.position_laws(law)
    m = 2 + len(pos)
    a = ALPHA / m

    def n_for(pl: dict[int, float], eps: float) -> int:
        k = sum(1 for p in pl.values() if p > 0)
        return 0 if k < 2 else min_num_samples_for_tv(max(2, k), eps, a, POWER, "g")

    per_token = max(n_for(pl, TOKEN_TV) for pl in pos)
    first = n_for(pos[0], FIRST_TV)
    return {"per_token_tv_0.01": per_token, "first_token_tv_0.005": first, "n": max(per_token, first), "tests": m}


def cpu_seconds(eng: HsdTorchEngine) -> float:
    """CPU seconds (user + system) of this process and of the engine's worker processes so far."""
    total = time.process_time()
    pool = getattr(eng, "_pool", None)
    if pool is not None:
        import psutil

        for pid in list(getattr(pool, "_processes", {}) or {}):
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def run_case(eng: HsdTorchEngine, pc: Any, mode: str, n: int, tmp: Path) -> dict[str, Any]:
    """One cell of ``pc`` in ``mode`` at ``n`` draws (0: the goal's N), timed in parts."""
    s = pc.for_engine(eng.order)
    row: dict[str, Any] = {"case": pc.name, "mode": mode, "sampling": s.describe(), "prompt": list(pc.prompts[0])}
    try:
        law = kc.sequence_law(kc.kit_model(pc.target), pc.prompts[0], s)
    except AmbiguousLawError as e:
        return {**row, "outcome": "not determinable", "reason": str(e)}
    except ValueError as e:
        return {**row, "outcome": "refused", "reason": str(e)}
    try:
        row.update(needed(law))
    except InvalidTest as e:
        row["sizing"] = str(e)
    goal_n = int(row.get("n", 0) or 0)
    run_n = (n or goal_n) if goal_n else 2000  # a point-mass case needs no N: its exact check runs on a few draws
    drafter, settings, _ = MODE_SPECS[mode]
    case = Case(eng.kit, pc.prompts[0], s, mode, drafter, settings, pc.target)
    out = tmp / f"{pc.name}-{mode}.jsonl"
    cpu0 = cpu_seconds(eng)
    r = audit_case(eng, "hsd_torch", case, pc.name, run_n, ALPHA, out)
    cpu = cpu_seconds(eng) - cpu0
    if out.exists():
        out.unlink()
    row.update(outcome=r.outcome, measured_n=r.n, seconds={k: round(v, 3) for k, v in r.times.items()})
    if r.outcome in ("refused", "crashed"):
        return {**row, "reason": r.reason}
    total = sum(r.times.values())
    row.update(total_seconds=round(total, 2), cpu_seconds=round(cpu, 2),
               draws_per_second=round(r.n / r.times["draws"], 1),
               detectable_tv={t["name"]: t["detectable_tv"] for t in r.tests})
    if goal_n:
        scale = goal_n / r.n  # the draws and the audit grow with N; the law and the exact expectation do not
        fixed = r.times.get("law", 0.0) + r.times.get("expected_acceptance", 0.0)
        at_goal = fixed + scale * (total - fixed)
        row["seconds_for_goal_n"] = round(at_goal, 1) if scale != 1 else round(total, 1)
        row["goal_met"] = bool(at_goal <= BUDGET_S) if scale != 1 else bool(total <= BUDGET_S)
        row["goal_seconds_measured"] = scale == 1
        row["cpu_seconds_for_goal_n"] = round(cpu * scale, 1)
    if r.acceptance:
        row["acceptance"] = {k: r.acceptance[k] for k in ("expected", "measured", "low", "high")}
    return row


class ForwardMeter:
    """CPU seconds spent inside the forward passes of some models of this process (a forward
    pre-hook and hook on each: the time from a model's call to its return, its head included)."""

    def __init__(self, models: list[Any]) -> None:
        self.seconds, self._t0 = 0.0, 0.0
        self._hooks = [h for m in models for h in (m.register_forward_pre_hook(self._start),
                                                   m.register_forward_hook(self._stop))]

    def _start(self, *_: Any) -> None:
        self._t0 = time.process_time()

    def _stop(self, *_: Any) -> None:
        self.seconds += time.process_time() - self._t0

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def cpu_case(eng: HsdTorchEngine, pc: Any, mode: str, n: int, repeat: int) -> dict[str, Any]:
    """CPU milliseconds a draw of ``pc`` in ``mode`` costs (the parent process and the workers,
    each of ``repeat`` runs of ``n`` draws on fresh seeds, after a warm-up of one batch a worker).
    With one process (``workers=1``: this process then set up as a worker sets itself up,
    :func:`~hsd_torch.conformance.hsd_engine.set_up_as_worker`), also the part of it inside the
    models' forward passes."""
    s = pc.for_engine(eng.order)
    drafter, settings, _ = MODE_SPECS[mode]
    case = Case(eng.kit, pc.prompts[0], s, mode, drafter, settings, pc.target)
    eng.sample(case, list(range(10**9, 10**9 + eng.batch * eng.workers)))  # warm-up
    meter = None
    if eng.workers == 1:  # this process draws: set it up as a worker sets itself up (its models loaded by the warm-up)
        set_up_as_worker(lambda: None)
        roles = [pc.target] + ([] if mode == "none" else [drafter or DEFAULT_DRAFTER[mode]])
        meter = ForwardMeter([eng._load(r)[0] for r in roles])
    runs = []
    for r in range(repeat):
        seeds = list(range((r + 1) * 10**8, (r + 1) * 10**8 + n))
        f0 = 0.0 if meter is None else meter.seconds
        p0, c0, w0 = time.process_time(), cpu_seconds(eng), time.perf_counter()
        eng.sample(case, seeds)
        p1, c1, w1 = time.process_time(), cpu_seconds(eng), time.perf_counter()
        runs.append({"cpu_ms_per_draw": round(1000 * (c1 - c0) / n, 4),
                     "parent_cpu_ms_per_draw": round(1000 * (p1 - p0) / n, 4), "wall_s": round(w1 - w0, 2)})
        if meter is not None:
            runs[-1]["forward_cpu_ms_per_draw"] = round(1000 * (meter.seconds - f0) / n, 4)
    if meter is not None:
        meter.close()
    row = {"case": pc.name, "mode": mode, "n": n, "workers": eng.workers, "batch": eng.batch, "runs": runs,
           "median_cpu_ms_per_draw": median_high(x["cpu_ms_per_draw"] for x in runs)}
    if meter is not None:
        row["median_forward_cpu_ms_per_draw"] = median_high(x["forward_cpu_ms_per_draw"] for x in runs)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the record here")
    ap.add_argument("--n", type=int, default=20000, help="draws per cell measured (default 20000)")
    ap.add_argument("--goal", action="store_true", help="run each case at the N the goal needs (overrides --n)")
    ap.add_argument("--goal-case", action="append", default=[], help="run this case at the N the goal needs; repeat")
    ap.add_argument("--mode", action="append", help="hsd_torch mode timed; repeat (default sd)")
    ap.add_argument("--case", action="append", help="a case of the matrix; repeat (default all)")
    ap.add_argument("--workers", type=int, default=2, help="hsd_torch's worker processes (default 2)")
    ap.add_argument("--cpu", action="store_true", help="time the draws alone: CPU ms a draw, per case and mode")
    ap.add_argument("--repeat", type=int, default=3, help="with --cpu: runs per mode (default 3)")
    args = ap.parse_args()
    modes = args.mode or ["sd"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        kit = Path(tmp) / "kit"
        build_kit(kit, gguf=False)
        eng = HsdTorchEngine(kit, workers=args.workers)
        t0 = time.perf_counter()
        eng.up()
        up = time.perf_counter() - t0
        try:
            for pc in CASES:
                if args.case and pc.name not in args.case:
                    continue
                for mode in modes:
                    if args.cpu:
                        row = cpu_case(eng, pc, mode, args.n, args.repeat)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                        continue
                    at_goal = args.goal or pc.name in args.goal_case
                    row = run_case(eng, pc, mode, 0 if at_goal else args.n, Path(tmp))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            eng.close()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    save({"benchmark": "conformance_cpu" if args.cpu else "conformance_power", "modes": modes,
          "goal": args.goal or args.goal_case,
          "measured_n": None if args.goal else args.n,
          "workers": args.workers, "alpha": ALPHA, "power": POWER, "budget_seconds": BUDGET_S,
          "engine_up_seconds": round(up, 2), "load_average_at_end": load,
          "machine_note": "2 cores shared with other developers' jobs: times are upper bounds", "rows": rows}, args.json)


if __name__ == "__main__":
    main()
