"""Power and cost of the conformance matrix (issue 47, item 5): per processing case of
``hsd_torch.conformance.matrix.CASES``, the number of draws N that makes a per-token TV of 0.01
(at any position; the mean per-token TV is at most the largest) and a first-token TV of 0.005
detectable with power 0.99 at family-wise alpha 1e-3 (Holm over the case's tests: each at
1e-3 / m; :func:`hsd_core.stats.min_num_samples_for_tv` with k the law's support), and the wall
time hsd_torch's engine takes for that N, measured at ``--n`` draws and scaled linearly (the
engine draws in batches of 500: its time is linear in N beyond one batch), plus the TVs a cell
of ``--n`` draws detects.

    python bench/conformance_power.py --json bench/conformance_power.json [--n 2000] [--mode sd]

Not a timed test. The machine is shared (2 cores, other developers' jobs): times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import save  # noqa: E402
from hsd_core import conformance as kc  # noqa: E402
from hsd_core.processing import AmbiguousLawError  # noqa: E402
from hsd_core.stats import InvalidTest, min_num_samples_for_tv  # noqa: E402
from hsd_torch.conformance.engines import Case, EngineRefused  # noqa: E402
from hsd_torch.conformance.hsd_engine import HsdTorchEngine  # noqa: E402
from hsd_torch.conformance.kit import build_kit  # noqa: E402
from hsd_torch.conformance.matrix import CASES, MODE_SPECS, audit_case  # noqa: E402

ALPHA, POWER, TOKEN_TV, FIRST_TV = 1e-3, 0.99, 0.01, 0.005


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the record here")
    ap.add_argument("--n", type=int, default=2000, help="draws per cell measured (default 2000)")
    ap.add_argument("--mode", default="sd", help="hsd_torch mode timed (default sd)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        kit = Path(tmp) / "kit"
        build_kit(kit, gguf=False)
        eng = HsdTorchEngine(kit)
        t0 = time.perf_counter()
        eng._load("target"), eng._load("target_pos"), eng._load("drafter"), eng._load("drafter_sp")
        up = time.perf_counter() - t0
        for pc in CASES:
            s = pc.for_engine(eng.order)
            row: dict[str, object] = {"case": pc.name, "sampling": s.describe(), "prompt": list(pc.prompts[0])}
            try:
                law = kc.sequence_law(kc.kit_model(pc.target), pc.prompts[0], s)
            except AmbiguousLawError as e:
                rows.append({**row, "outcome": "not determinable", "reason": str(e)})
                continue
            except ValueError as e:
                rows.append({**row, "outcome": "refused", "reason": str(e)})
                continue
            try:
                row.update(needed(law))
            except InvalidTest as e:
                row["sizing"] = str(e)
            drafter, settings, _ = MODE_SPECS[args.mode]
            case = Case(kit, pc.prompts[0], s, args.mode, drafter, settings, pc.target)
            r = audit_case(eng, "hsd_torch", case, pc.name, args.n, ALPHA, None)
            row.update(outcome=r.outcome, measured_n=r.n, seconds=round(r.seconds, 2))
            if r.outcome not in ("refused", "crashed") and r.seconds > 0 and isinstance(row.get("n"), int):
                row["seconds_for_n"] = round(r.seconds * int(row["n"]) / args.n, 1)  # type: ignore[call-overload]
                row["detectable_tv_at_measured_n"] = {t["name"]: t["detectable_tv"] for t in r.tests}
            else:
                row["reason"] = r.reason
            print(json.dumps(row), flush=True)
            rows.append(row)
    save({"benchmark": "conformance_power", "mode": args.mode, "measured_n": args.n, "alpha": ALPHA, "power": POWER,
          "engine_up_seconds": round(up, 2), "machine_note": "2 cores shared with other developers' jobs",
          "rows": rows}, args.json)


if __name__ == "__main__":
    main()
