"""No bench script shadows a module that code run from bench/ may import.

``python bench/x.py`` puts bench/ first on ``sys.path``, so a script named like an installed package
(or one a dependency imports) replaces it for everything the script imports: a ``bench/kernels.py``
made transformers 5.25 fail with "cannot import name 'CUDAProperties' from 'kernels'". The names
checked: the standard library's modules, the top-level modules of every installed distribution, and
every distribution name that an installed distribution requires, extras included (so a dependency
that a newer release of transformers pulls in is caught before it is installed).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _module_name(distribution: str) -> str:
    """The import name a distribution name usually maps to (PEP 503 normalized, dashes as underscores)."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def _taken() -> dict[str, str]:
    """Module names a bench script must not have, each with where it comes from."""
    taken = {name: "the standard library" for name in sys.stdlib_module_names}
    for module, dists in importlib.metadata.packages_distributions().items():
        taken[module.lower()] = f"installed by {', '.join(dists)}"
    for dist in importlib.metadata.distributions():
        for req in dist.requires or []:
            name = re.split(r"[\s;<>=!~\[(@]", req, maxsplit=1)[0]
            if name:
                taken.setdefault(_module_name(name), f"required by {dist.metadata['Name']}: {req}")
    return taken


def test_no_bench_script_shadows_a_module() -> None:
    taken = _taken()
    # the check has teeth: transformers declares ``kernels`` (an extra of 5.24, required by 5.25)
    assert "transformers" in taken and "numpy" in taken and "json" in taken
    if any(re.match(r"kernels\b", r) for r in importlib.metadata.requires("transformers") or []):
        assert "kernels" in taken
    clashes = {p.name: taken[p.stem.lower()] for p in sorted(BENCH.glob("*.py")) if p.stem.lower() in taken}
    assert not clashes, f"rename these bench scripts, they shadow a module when run from bench/: {clashes}"
