"""bench/README.md indexes every script, JSON result and plot folder of bench/, and every JSON result
records where it came from (commit, date, machine), written through bench/bench_record.py.

A new script, result or plot folder that the index does not name fails here, and so does a script
that writes a JSON file without the record."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
INDEX = BENCH / "README.md"
SCRIPTS = sorted(p for d in (BENCH, BENCH / "engines") for p in (*d.glob("*.py"), *d.glob("*.sh")))
RESULTS = sorted((*BENCH.glob("*.json"), *(BENCH / "engines").glob("*.json")))
PLOT_DIRS = sorted({p.parent for p in BENCH.rglob("*.png")})
WRITES_JSON = re.compile(r"json\.dump\(|write_text\(json\.dumps")


def _rel(p: Path) -> str:
    return p.relative_to(BENCH).as_posix()


def test_the_lists_are_not_empty() -> None:
    """The globs see what they should (an emptied glob would make every check below pass)."""
    names = {_rel(p) for p in SCRIPTS}
    assert {"generate.py", "bench_record.py", "gpu.sh", "engines/audit_vllm.py"} <= names
    assert {"generate_cpu.json", "engines/audit_vllm.json"} <= {_rel(p) for p in RESULTS}
    assert "generate_plots" in {_rel(p) for p in PLOT_DIRS}


@pytest.mark.parametrize("script", SCRIPTS, ids=_rel)
def test_every_script_is_indexed(script: Path) -> None:
    """Each script has its row, linked by its path from bench/."""
    assert f"]({_rel(script)})" in INDEX.read_text(encoding="utf-8"), \
        f"bench/README.md does not index {_rel(script)}: add its row (what, how to run, what it writes, status)"


@pytest.mark.parametrize("result", RESULTS, ids=_rel)
def test_every_json_result_is_indexed_and_records_its_origin(result: Path) -> None:
    assert f"`{_rel(result)}`" in INDEX.read_text(encoding="utf-8"), f"bench/README.md does not list {_rel(result)}"
    record = json.loads(result.read_text(encoding="utf-8"))
    assert isinstance(record, dict), f"{_rel(result)}: a record is a JSON object"
    for field in ("commit", "date", "machine"):
        assert isinstance(record.get(field), str) and record[field].strip(), f"{_rel(result)} lacks {field!r}"
    assert re.fullmatch(r"[0-9a-f]{7,40}\+?", record["commit"]), f"{_rel(result)}: commit {record['commit']!r}"
    assert re.match(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}", record["date"]), f"{_rel(result)}: date {record['date']!r}"


@pytest.mark.parametrize("folder", PLOT_DIRS, ids=_rel)
def test_every_plot_folder_is_indexed(folder: Path) -> None:
    assert f"`{_rel(folder)}/`" in INDEX.read_text(encoding="utf-8"), f"bench/README.md does not list {_rel(folder)}/"


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.suffix == ".py" and p.name != "bench_record.py"], ids=_rel)
def test_a_script_that_writes_json_records_its_origin(script: Path) -> None:
    """A script that writes a JSON file (``json.dump``, ``write_text(json.dumps(...))``) puts
    ``provenance()`` in it itself, and one with a ``--json`` option writes through bench_record."""
    src = script.read_text(encoding="utf-8")
    uses_record = "from bench_record import" in src
    if WRITES_JSON.search(src):
        assert uses_record and "provenance()" in src, f"{_rel(script)} writes JSON without bench_record.provenance()"
    if '"--json"' in src:
        assert uses_record, f"{_rel(script)} has --json but does not write through bench_record"


def test_save_stamps_the_record(tmp_path: Path) -> None:
    """``save`` adds the full commit of this checkout, a dirty flag, a UTC date and the machine to a
    record without them, and keeps a record's own."""
    spec = importlib.util.spec_from_file_location("bench_record_under_test", BENCH / "bench_record.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r.json"
    mod.save({"x": 1}, out)
    rec = json.loads(out.read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head:
        assert rec["commit"] == head
    assert rec["x"] == 1 and isinstance(rec["dirty"], bool) and rec["date"].endswith("+00:00")
    assert f"{__import__('os').cpu_count()} cores" in rec["machine"]
    mod.save({"x": 2, "commit": "abc1234", "date": "2026-01-01T00:00:00+00:00", "machine": "m"}, out)
    assert json.loads(out.read_text())["commit"] == "abc1234"
    mod.save({"x": 3}, None)  # no path: nothing written
    assert json.loads(out.read_text())["x"] == 2


def test_provenance_does_not_import_torch() -> None:
    """A script without torch (``exact_vs_bruteforce.py``, ``slrs_cost.py``) stays without it."""
    code = ("import sys; sys.path.insert(0, 'bench'); import bench_record; bench_record.provenance(); "
            "assert 'torch' not in sys.modules, 'provenance imported torch'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_every_table_row_has_its_header_cells() -> None:
    """Each row of the index's tables has as many cells as its table's header (a merge that glues two
    rows together, or splits one, shows here)."""
    bad, width = [], None
    for no, line in enumerate(INDEX.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("|"):
            width = None
            continue
        cells = line.strip().strip("|").split(" | ")
        if width is None:
            width = len(cells)
        elif len(cells) != width and not set(line) <= set("|-: "):
            bad.append(f"line {no}: {len(cells)} cells, the header has {width}")
    assert not bad, "\n".join(bad)
