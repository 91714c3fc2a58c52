"""``bench/gpu_check_generate.py`` (the one-command device check) runs on the CPU, so that it
does not rot before a GPU is available: greedy identity for every method, and the sampled part at
3,000 rows per method (top-k 8, alpha 1e-3 per method, detectable TV about 0.10 with power 0.99),
where the lossy control (TLI at temperature 1.5 audited as temperature 1, TV about 0.15) is
rejected and every method passes. The run is seeded, so its verdicts are reproducible."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


# slow tier (13 s): the GPU machine's check script, run on CPU; run before a device session (pytest -m slow)
@pytest.mark.slow
def test_gpu_check_script_passes_on_cpu(capsys: pytest.CaptureFixture[str],
                                       bench_module: Callable[[str], ModuleType]) -> None:
    rc = bench_module("gpu_check_generate").main(["--samples", "3000", "--chunk", "1500"])
    out = capsys.readouterr().out
    sys.stdout.write(out)
    assert rc == 0, out
    lines = [ln for ln in out.splitlines() if "n=3000:" in ln]
    assert len(lines) == 7, out
    assert sum("lossless-consistent" in ln for ln in lines) == 6
    control = [ln for ln in lines if "LOSSY CONTROL" in ln]
    assert len(control) == 1 and ": lossy " in control[0]
    assert "GREEDY MISMATCH" not in out and out.rstrip().endswith("OK")
