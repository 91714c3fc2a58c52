"""The backend's layout, checked on the source so that it cannot drift:

- no import cycle inside ``hsd_torch`` (imports at any depth of a module count, lazy ones inside
  functions too), and none even counting the imports under ``if TYPE_CHECKING:`` (two modules that
  need each other, if only for their types, cannot be read apart);
- a method's file imports no other method's file, and the machinery (round loop, runner, laws,
  drafting, verification) neither imports a method nor names one;
- the size anchors for every module of the library (``hsd_torch`` and ``hsd_core``): no module over
  500 lines, no class over 200, no function over 80 (known offenders listed by name, each its own
  expected failure);
- README's layout names every module of ``hsd_torch``, one line each, and no module that is gone.

Reads files only (no torch needed).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "hsd_torch"
MACHINERY = ["engine.rounds", "engine.round_state", "engine.runner", "engine.laws", "engine.drafting",
             "engine.verification", "engine.validation"]
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


def imports(path: Path, pkg: Path = PKG, type_checking: bool = False) -> set[str]:
    """The modules of package ``pkg`` that ``path`` imports, at any depth (absolute names; ``from .x
    import y`` counts as ``x`` and, when ``x.y`` is a module, as ``x.y`` too); the imports under
    ``if TYPE_CHECKING:`` count only with ``type_checking=True``."""
    tree = ast.parse(path.read_text())
    skip = set() if type_checking else _type_checking_blocks(tree)
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


def graph(pkg: Path = PKG, type_checking: bool = False) -> dict[str, set[str]]:
    return {module_name(p, pkg): imports(p, pkg, type_checking) for p in pkg.rglob("*.py")}


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
        tree = ast.parse((PKG / f"{name.replace('.', '/')}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
                assert not set(consts) & set(METHOD_NAMES), f"{m} branches on a method's name: {ast.unparse(node)}"


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


def test_hsd_core_has_no_cycle_even_through_type_checking_and_keeps_the_size_anchors(tmp_path: Path) -> None:
    """``hsd_core``: no import cycle, counting the imports under ``if TYPE_CHECKING:`` too (two modules
    that need each other, if only for their types, cannot be read apart), and every module within the
    size anchors (module <= 500 lines, class <= 200, function <= 80). The check can fail: a cycle that
    only a type-checking import closes is found, and so is an 81-line function."""
    pkg = tmp_path / "hsd_core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    a, b = f"{pkg.name}.a", f"{pkg.name}.b"  # spelled so that the cited-names check does not read them
    assert find_cycle(graph(pkg, type_checking=True)) == [a, b, a]
    (pkg / "c.py").write_text("def f():\n" + "    x = 1\n" * 80)
    assert oversized(pkg / "c.py", tmp_path) == ["hsd_core/c.py: f has 81 lines (at most 80)"]

    cycle = find_cycle(graph(CORE, type_checking=True))
    assert cycle is None, "import cycle in hsd_core: " + " -> ".join(cycle or [])
    bad = [b for path in sorted(CORE.rglob("*.py")) if path.relative_to(CORE).as_posix() not in KNOWN_OVERSIZED_CORE
           for b in oversized(path, CORE.parent)]
    assert not bad, "size anchors broken in hsd_core:\n" + "\n".join(bad)


#: hsd_core modules over the size anchors today, with what the fix is; each its own strict expected failure
#: (fixing one fails its xfail: then take it off this list).
KNOWN_OVERSIZED_CORE: dict[str, str] = {}  # none today


@pytest.mark.parametrize("rel", sorted(KNOWN_OVERSIZED_CORE))
@pytest.mark.xfail(strict=True, reason="a known hsd_core offender (KNOWN_OVERSIZED_CORE)")
def test_known_core_offenders_are_still_over(rel: str) -> None:
    """Each known offender still breaks the anchors (an xfail): once fixed, this fails until it leaves the list."""
    assert not oversized(CORE / rel, CORE.parent)


def test_known_core_offenders_exist() -> None:
    assert all((CORE / rel).is_file() for rel in KNOWN_OVERSIZED_CORE), "a known offender moved or is gone"


# --- the whole of hsd_torch: cycles through type-checking imports, sizes, README's layout ---

#: modules over the size anchors today, with who owns the fix; each its own strict expected failure.
KNOWN_OVERSIZED: dict[str, str] = {}


def _edges(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """``g`` without a package's edges to its own submodules (how packages are built, not a cycle)."""
    return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in g.items()}


def reaches(g: dict[str, set[str]], a: str, b: str) -> bool:
    """Whether ``b`` is imported from ``a``, directly or through other modules of ``g``."""
    edges, seen, todo = _edges(g), {a}, [a]
    while todo:
        for d in edges.get(todo.pop(), ()):
            if d == b:
                return True
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return False


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules of ``g`` that import one another (strongly connected, more than one)."""
    mods = sorted(_edges(g))
    out = []
    for m in mods:
        group = {m} | {d for d in mods if reaches(g, m, d) and reaches(g, d, m)}
        if len(group) > 1 and min(group) == m:  # each group once, found from its first module
            out.append(group)
    return out


def test_no_cycle_even_through_type_checking() -> None:
    found = [sorted(c) for c in cycles(graph(type_checking=True))]
    assert not found, f"import cycles (type-checking imports counted): {found}"


def test_the_cycle_checks_see_type_checking_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "hsd_torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    (pkg / "c.py").write_text("from .a import z\n")
    a, b = f"{pkg.name}.a", f"{pkg.name}.b"  # spelled so that the cited-names check does not read them
    assert cycles(graph(pkg)) == [] and cycles(graph(pkg, type_checking=True)) == [{a, b}]
    assert reaches(graph(pkg, type_checking=True), b, a) and not reaches(graph(pkg), b, a)


def _modules(pkg: Path = PKG) -> list[str]:
    return sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py"))


@pytest.mark.parametrize("rel", [
    pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=KNOWN_OVERSIZED[r])) if r in KNOWN_OVERSIZED else r
    for r in _modules()])
def test_size_anchors(rel: str) -> None:
    """Every module of hsd_torch: at most 500 lines, classes at most 200, functions at most 80."""
    bad = oversized(PKG / rel, PKG.parent)
    assert not bad, "size anchors broken:\n" + "\n".join(bad)


def test_known_offenders_exist() -> None:
    assert set(KNOWN_OVERSIZED) <= set(_modules()), "a known offender moved or is gone: update KNOWN_OVERSIZED"


README = PKG.parent / "README.md"


def layout_names(readme: str) -> list[str]:
    """The first word of each line of README's "Layout" section under ``hsd_torch/`` (the lines
    indented deeper than it): a module's path in the package, or a folder's with a slash."""
    lines = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0].splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("hsd_torch/"))
    indent = len(lines[i]) - len(lines[i].lstrip())
    out = []
    for line in lines[i + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        if line.strip():
            out.append(line.split()[0])
    return out


def package_names(pkg: Path = PKG) -> set[str]:
    """Every module of ``pkg`` as README's layout names it: a subpackage as its folder (``engine/``)."""
    out = set()
    for rel in _modules(pkg):
        out.add(rel[:-len("__init__.py")] if rel.endswith("/__init__.py") else rel)
    return out


def test_readme_layout_names_every_module(tmp_path: Path) -> None:
    names = layout_names(README.read_text(encoding="utf-8"))
    assert len(names) == len(set(names)), "a module named twice in README's layout"
    assert set(names) - package_names() == set(), "README's layout names modules that do not exist"
    assert package_names() - set(names) == set(), "README's layout misses modules"
    # the check can fail: a package with one module more than its layout
    (tmp_path / "p" / "sub").mkdir(parents=True)
    for f in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (tmp_path / "p" / f).write_text("")
    fake = "# p\n\n## Layout\n\n    hsd_torch/   x\n      __init__.py  y\n      a.py  z\n      sub/  w\n    tests/\n"
    assert package_names(tmp_path / "p") - set(layout_names(fake)) == {"sub/b.py"}


def test_methods_read_only_the_round_view_and_write_no_engine_state() -> None:
    """Every ``gen.X`` in the methods' files is a member of :class:`hsd_torch.engine.round_state.RoundView`
    (the facts a method may read and the services it may call), and none is assigned, augmented or
    mutated in place (``gen.X = ...``, ``gen.X[i] = ...``, ``gen.X[i].extend(...)``)."""
    from hsd_torch.engine.round_state import RoundView

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
