"""bench/conformance_power.py ``--cpu --workers 1``: the CPU a draw costs and the part of it inside
the models' forward passes, measured in one process (run as a subprocess: the script sets its own
process up as a worker, one torch thread, its garbage collector frozen).

The forward part is a sum of sub-intervals of the measured run, so it lies in (0, total]; a meter
whose hooks were not attached reads 0. No timing is asserted beyond that order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("psutil")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "conformance_power.py"


def test_forward_share_in_one_process(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--workers", "1", "--n", "500", "--repeat", "1",
                    "--case", "plain", "--mode", "sd", "--mode", "none", "--json", str(out)],
                   check=True, env=env, capture_output=True, text=True, timeout=600)
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert [(r["case"], r["mode"]) for r in rows] == [("plain", "sd"), ("plain", "none")]
    for r in rows:
        (run,) = r["runs"]
        assert 0 < run["forward_cpu_ms_per_draw"] <= run["cpu_ms_per_draw"], r
        assert r["median_forward_cpu_ms_per_draw"] == run["forward_cpu_ms_per_draw"]
