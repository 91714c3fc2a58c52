"""``hsd audit`` runs with no arguments and reports every method and variant."""

import subprocess
import sys

from hsd_core import variants
from hsd_core.cli import main


def test_audit_runs_and_lists_everything(capsys: object) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    for name in ("AR", "SD", "SLEM", "TLI", "SLRS", "SLRS-multi", "TLI/greedy"):
        assert f"\n{name} " in out
    assert out.count("lossless") >= 9
    for name in [*variants.VARIANTS, *variants.TREE_VARIANTS]:
        assert f"{name}" in out
    assert "NOT caught" not in out
    assert "psi drafter evals" in out


def test_console_script_entry_point() -> None:
    r = subprocess.run([sys.executable, "-m", "hsd_core.cli", "audit"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "exact law" in r.stdout
