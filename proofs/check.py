"""Check the proofs: every ``Check:`` line names a test that exists, every method has a proof, and
the named tests pass.

Usage (from anywhere; paths in ``Check:`` lines are relative to the repository root)::

    python -m proofs            # validate, then run exactly the named tests
    python proofs/check.py      # the same
    python -m proofs --no-run   # validate only

A proof is a Markdown file ``proofs/*.md`` other than ``proofs/README.md`` (the index). Its checks
are lines of the form::

    Check: tests/proofs/test_lemmas.py::test_name

(backticks around the node id are allowed). Validation fails, with one message per problem, when

* a named file does not exist, or does not define the named test (a top-level ``def``/``async def``,
  or ``Class::method``; a parametrization suffix ``[...]`` is ignored for the lookup);
* a result (a heading that starts with Lemma, Theorem, Proposition or Corollary) has no
  ``Check:`` line before the next heading of the same or a higher level;
* a proof file has no ``Check:`` line at all;
* a method class exported by ``hsd_core.methods.__all__`` (other than ``Method``, ``RoundOutcome``
  and ``State``) is mentioned, as a whole word, by no proof file.

When validation passes, the named tests (each once, in order of appearance) are run with
``pytest -q -p no:cacheprovider <node ids>`` from the repository root, and the exit status is
pytest's.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROOFS_DIR = Path(__file__).resolve().parent
BASE_NAMES = frozenset({"Method", "RoundOutcome", "State"})

CHECK_RE = re.compile(r"^\s*(?:[-*]\s+)?Check:\s*`?(?P<node>[^\s`]+)`?\s*$")
CHECK_LOOSE_RE = re.compile(r"^\s*(?:[-*]\s+)?Check:")
HEADING_RE = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.*?)\s*#*\s*$")
RESULT_RE = re.compile(r"^(?:\*\*)?(Lemma|Theorem|Proposition|Corollary)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Check:
    """One ``Check:`` line: the proof file, its line number, and the pytest node id it names."""

    proof: Path
    line: int
    node: str

    @property
    def path(self) -> str:
        return self.node.split("::", 1)[0]

    @property
    def names(self) -> list[str]:
        """The ``::``-separated names after the path, parametrization suffix removed."""
        parts = self.node.split("::")[1:]
        return [re.sub(r"\[.*\]$", "", p) for p in parts]

    def where(self) -> str:
        return f"{self.proof.name}:{self.line}"


def proof_files(proofs_dir: Path) -> list[Path]:
    """The proof files: ``*.md`` directly in ``proofs_dir`` but its ``README.md`` (the index), sorted by name."""
    return sorted(p for p in proofs_dir.glob("*.md") if p.is_file() and p.name != "README.md")


def parse_checks(text: str, proof: Path) -> tuple[list[Check], list[str]]:
    """The ``Check:`` lines of one proof, and messages for malformed ones."""
    checks: list[Check] = []
    errors: list[str] = []
    in_code = False
    for i, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or not CHECK_LOOSE_RE.match(line):
            continue
        m = CHECK_RE.match(line)
        if m is None or "::" not in m.group("node"):
            errors.append(f"{proof.name}:{i}: malformed check line {line.strip()!r} "
                          "(expected 'Check: path/to/test_file.py::test_name')")
            continue
        checks.append(Check(proof, i, m.group("node")))
    return checks, errors


def results_without_checks(text: str, proof: Path) -> list[str]:
    """Messages for results (Lemma/Theorem/... headings) whose section has no ``Check:`` line."""
    lines = text.splitlines()
    headings: list[tuple[int, int, str]] = []  # (line index, level, title)
    in_code = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else HEADING_RE.match(line)
        if m:
            headings.append((i, len(m.group("hashes")), m.group("title")))
    errors = []
    for k, (i, level, title) in enumerate(headings):
        if not RESULT_RE.match(title):
            continue
        end = len(lines)
        for j, lv, _ in headings[k + 1:]:
            if lv <= level:
                end = j
                break
        if not any(CHECK_LOOSE_RE.match(x) for x in lines[i + 1:end]):
            errors.append(f"{proof.name}:{i + 1}: result {title!r} has no 'Check:' line")
    return errors


def _defined(tree: ast.Module, names: Sequence[str]) -> bool:
    """Whether ``names`` (``[func]`` or ``[Class, method]``...) is defined at top level of ``tree``."""
    body: Iterable[ast.stmt] = tree.body
    for k, name in enumerate(names):
        last = k == len(names) - 1
        found: ast.stmt | None = None
        for node in body:
            if last and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = node
            elif not last and isinstance(node, ast.ClassDef) and node.name == name:
                found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def validate_checks(checks: Sequence[Check], repo_root: Path) -> list[str]:
    """Messages for checks whose file or test does not exist."""
    errors = []
    trees: dict[Path, ast.Module | None] = {}
    for c in checks:
        f = (repo_root / c.path).resolve()
        if not c.names or not all(c.names):
            errors.append(f"{c.where()}: {c.node!r} names no test")
            continue
        if not f.is_file():
            errors.append(f"{c.where()}: {c.node!r}: file {c.path} does not exist")
            continue
        if f not in trees:
            try:
                trees[f] = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
            except SyntaxError as e:
                trees[f] = None
                errors.append(f"{c.where()}: {c.path} does not parse: {e}")
        tree = trees[f]
        if tree is None:
            continue
        if not _defined(tree, c.names):
            errors.append(f"{c.where()}: {c.node!r}: {c.path} defines no test {'::'.join(c.names)}")
    return errors


def method_names() -> list[str]:
    """The method classes exported by ``hsd_core.methods`` (base names excluded)."""
    import hsd_core.methods as methods

    return [n for n in methods.__all__ if n not in BASE_NAMES and isinstance(getattr(methods, n), type)]


def unproved_methods(texts: dict[Path, str], names: Sequence[str]) -> list[str]:
    """Messages for method names that no proof mentions as a whole word."""
    errors = []
    for name in names:
        pat = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")
        if not any(pat.search(t) for t in texts.values()):
            errors.append(f"method {name} (hsd_core.methods.__all__) is mentioned by no proof file")
    return errors


def validate(proofs_dir: Path = PROOFS_DIR, repo_root: Path = REPO_ROOT,
             methods: Sequence[str] | None = None) -> tuple[list[Check], list[str]]:
    """All checks of all proofs in ``proofs_dir``, and every validation error (empty when valid).

    ``methods`` defaults to :func:`method_names`.
    """
    files = proof_files(proofs_dir)
    errors: list[str] = []
    if not files:
        errors.append(f"no proof files (*.md) in {proofs_dir}")
    texts = {f: f.read_text(encoding="utf-8") for f in files}
    checks: list[Check] = []
    for f, text in texts.items():
        cs, errs = parse_checks(text, f)
        errors += errs
        if not cs and not errs:
            errors.append(f"{f.name}: has no 'Check:' line")
        errors += results_without_checks(text, f)
        checks += cs
    errors += validate_checks(checks, repo_root)
    errors += unproved_methods(texts, method_names() if methods is None else methods)
    return checks, errors


def node_ids(checks: Sequence[Check]) -> list[str]:
    """The distinct node ids, in order of first appearance."""
    seen: dict[str, None] = {}
    for c in checks:
        seen.setdefault(c.node, None)
    return list(seen)


def run_tests(nodes: Sequence[str], repo_root: Path = REPO_ROOT) -> int:
    """Run exactly ``nodes`` with pytest from ``repo_root``; return pytest's exit status."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *nodes]
    print("$", " ".join(cmd[2:]), flush=True)
    return subprocess.call(cmd, cwd=repo_root)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-run", action="store_true", help="validate the proofs only; do not run the tests")
    ap.add_argument("--proofs-dir", type=Path, default=PROOFS_DIR, help="directory of the proof files")
    ap.add_argument("--repo-root", type=Path, default=REPO_ROOT, help="root the Check: paths are relative to")
    args = ap.parse_args(argv)
    if str(args.repo_root.resolve()) not in sys.path:
        sys.path.insert(0, str(args.repo_root.resolve()))
    checks, errors = validate(args.proofs_dir, args.repo_root)
    if errors:
        print(f"proofs: {len(errors)} problem(s):", file=sys.stderr)
        for e in errors:
            print(f"  - {e}", file=sys.stderr)
        return 2
    nodes = node_ids(checks)
    n_files = len(proof_files(args.proofs_dir))
    print(f"proofs: {n_files} proof files, {len(checks)} check lines, {len(nodes)} distinct tests: all exist")
    if args.no_run:
        return 0
    return run_tests(nodes, args.repo_root)


if __name__ == "__main__":
    raise SystemExit(main())
