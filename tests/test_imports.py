"""Import boundaries: the core never pulls in torch or hsd_torch; the backend exposes its contract names.

``hsd_core`` imports nothing from ``hsd_torch``: what the backend adds to the ``hsd``
command and to the ``hsd_lossless`` fixture it registers under entry points
(:mod:`hsd_core.extensions`). Checked twice: statically, on the syntax tree of every module of
``hsd_core`` (imports at any depth, function bodies included, relative ones resolved, and module
names handed to ``importlib.import_module`` / ``__import__`` as strings), and at run time, in a fresh
interpreter that imports every module of ``hsd_core``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hsd_core

CORE = Path(hsd_core.__file__).resolve().parent
FORBIDDEN = ("hsd_torch", "torch")


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def forbidden_imports(source: str, package: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every import of a forbidden module in ``source``, a module of ``package``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolved against the module's package
                parts = package.split(".")
                if node.level > len(parts):
                    found.append((node.lineno, "." * node.level + module + " (above the top package)"))
                    continue
                module = ".".join(parts[:len(parts) - node.level + 1] + ([module] if module else []))
            names = [module, *(f"{module}.{a.name}" for a in node.names)]
            found += [(node.lineno, n) for n in names if _forbidden(n)][:1]
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            arg = node.args[0]
            if (name in ("import_module", "__import__", "find_spec") and isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str) and _forbidden(arg.value)):
                found.append((node.lineno, f"{name}({arg.value!r})"))
    return sorted(found)


def test_the_static_check_sees_every_kind_of_import() -> None:
    source = ("import os, torch.nn\n"
              "def f():\n"
              "    from hsd_torch.cli import main\n"
              "    import importlib\n"
              "    importlib.import_module('hsd_torch.audit')\n"
              "    __import__('torch')\n"
              "from ... import hsd_torch\n"
              "from .. import torch\n"
              "from hsd_torchlike import x\n"
              "from . import cli\n")
    assert [line for line, _ in forbidden_imports(source, "hsd_core.methods")] == [1, 3, 5, 6, 7]
    assert [line for line, _ in forbidden_imports(source, "hsd_core")] == [1, 3, 5, 6, 7, 8]


def test_no_module_of_hsd_core_imports_hsd_torch_statically() -> None:
    bad = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE.parent).with_suffix("")
        package = ".".join(rel.parts[:-1])  # a module's package; for __init__.py, the package itself
        bad += [f"{rel}.py:{line} imports {what}" for line, what in
                forbidden_imports(path.read_text(encoding="utf-8"), package)]
    assert len(list(CORE.rglob("*.py"))) > 15, "the check walks hsd_core"
    assert not bad, "hsd_core must import nothing from hsd_torch (or torch): register through entry points\n" + \
        "\n".join(bad)


def test_importing_hsd_core_imports_neither_torch_nor_hsd_torch() -> None:
    # every module of hsd_core (cli and pytest_plugin included), in a fresh interpreter
    code = """if True:
        import pkgutil, sys
        import hsd_core, hsd_core.cli, hsd_core.pytest_plugin
        for m in pkgutil.walk_packages(hsd_core.__path__, "hsd_core."):
            __import__(m.name)
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "hsd_torch", "transformers"))
        assert not bad, f"importing hsd_core imported {bad[:5]}"
        print(len([m for m in sys.modules if m.startswith("hsd_core")]))
    """
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) > 15


def test_hsd_torch_exposes_its_contract_names() -> None:
    pytest.importorskip("torch")
    import hsd_torch
    from hsd_torch.engine.kernels import Verified, exact_match_verify, rejection_verify, sample
    from hsd_torch.vocab import VocabBridge

    assert hsd_torch.sample is sample and hsd_torch.rejection_verify is rejection_verify
    assert hsd_torch.exact_match_verify is exact_match_verify and hsd_torch.VocabBridge is VocabBridge
    assert hsd_torch.Verified is Verified
