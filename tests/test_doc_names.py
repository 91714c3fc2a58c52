"""Every dotted name ``hsd_core.x.y`` / ``hsd_torch.x.y`` that the documentation or a docstring cites
resolves: it is imported (the longest prefix that is a module) and the rest looked up as attributes.
A module that moves without a re-export, or a class renamed, leaves a stale name here
(``hsd_torch.generate.FirstTargetMap`` was one).

Checked: README.md, bench/RESULTS.md, bench/README.md, docs/ and proofs/ (Markdown), and the Python
files of hsd_core/, hsd_torch/, bench/ and tests/ (their docstrings and comments; code names resolve
anyway). Names are resolved by import, not by path, so the check follows re-exports when modules move.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b(hsd_(?:core|torch)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
AREAS: dict[str, list[Path]] = {
    "docs": [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", ROOT / "bench" / "README.md",
             *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "proofs").glob("*.md"))],
    "hsd_core": sorted((ROOT / "hsd_core").rglob("*.py")),
    "hsd_torch": sorted((ROOT / "hsd_torch").rglob("*.py")),
    "bench": sorted((ROOT / "bench").rglob("*.py")),
    "tests": sorted(p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve()),  # not these examples
}


def _import_longest(parts: list[str]) -> tuple[ModuleType, int] | None:
    """The module named by the longest prefix of ``parts`` and that prefix's length (None: not even
    the package imports)."""
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            return importlib.import_module(name), i
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            raise
    return None


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module or an attribute reachable from one."""
    parts = dotted.split(".")
    found = _import_longest(parts)
    if found is None:
        return False
    obj: object = found[0]
    for attr in parts[found[1]:]:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def stale_names(files: list[Path]) -> list[str]:
    """``file:line: name`` for each cited name that does not resolve."""
    bad = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in NAME.findall(line):
                if name.startswith("hsd_torch") and importlib.util.find_spec("torch") is None:
                    continue  # hsd_torch is not importable without torch
                if not resolves(name):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {name}")
    return bad


def test_the_resolver_tells_stale_from_live() -> None:
    assert resolves("hsd_core.rand.Enumerator") and resolves("hsd_core.methods.SLRS") and resolves("hsd_core.exact")
    assert not resolves("hsd_core.rand.NoSuchThing") and not resolves("hsd_core.no_such_module.X")
    assert all(AREAS.values())


@pytest.mark.parametrize("area", [
    "docs", "hsd_core", "bench", "tests",
    "hsd_torch",
])
def test_cited_names_resolve(area: str) -> None:
    bad = stale_names(AREAS[area])
    assert not bad, "stale dotted names (moved or renamed without a re-export?):\n" + "\n".join(bad)
