"""The proof checker (``proofs/check.py``): its parsing and validation, without the pytest run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proofs_check_under_test", REPO / "proofs" / "check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while the class is built
    spec.loader.exec_module(mod)
    return mod


check = _load_checker()

TESTS = '''
def test_real():
    assert True

class TestGroup:
    def test_inside(self):
        pass
'''

GOOD = """# Proof of everything for Foo

### Lemma 1 (a step)
It holds.

Check: tests/test_x.py::test_real

### Theorem 2
Bar follows.

Check: `tests/test_x.py::TestGroup::test_inside`
"""


def make_repo(tmp_path: Path, proofs: dict[str, str]) -> tuple[Path, Path]:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(TESTS)
    pdir = tmp_path / "proofs"
    pdir.mkdir()
    for name, text in proofs.items():
        (pdir / name).write_text(text)
    return pdir, tmp_path


def test_accepts_a_valid_proof(tmp_path: Path) -> None:
    pdir, root = make_repo(tmp_path, {"foo.md": GOOD})
    checks, errors = check.validate(pdir, root, methods=["Foo", "Bar"])
    assert errors == []
    assert [c.node for c in checks] == ["tests/test_x.py::test_real", "tests/test_x.py::TestGroup::test_inside"]
    assert [c.line for c in checks] == [6, 11]


def test_the_index_is_not_a_proof(tmp_path: Path) -> None:
    """``proofs/README.md`` (the index, no ``Check:`` line) is skipped; another file without one is not."""
    pdir, root = make_repo(tmp_path, {"foo.md": GOOD, "README.md": "# Proofs\n\n### Lemma 9 (listed)\nfoo.md\n"})
    assert check.validate(pdir, root, methods=["Foo"])[1] == []
    (pdir / "index.md").write_text("# Proofs\n\nfoo.md\n")
    assert check.validate(pdir, root, methods=["Foo"])[1]


def test_rejects_a_missing_test(tmp_path: Path) -> None:
    text = GOOD + "\n### Lemma 3\nCheck: tests/test_x.py::test_missing\n"
    pdir, root = make_repo(tmp_path, {"foo.md": text})
    _, errors = check.validate(pdir, root, methods=["Foo"])
    assert len(errors) == 1 and "test_missing" in errors[0] and "foo.md:14" in errors[0]


def test_rejects_a_missing_file(tmp_path: Path) -> None:
    text = GOOD + "\n### Lemma 3\nCheck: tests/test_nope.py::test_real\n"
    pdir, root = make_repo(tmp_path, {"foo.md": text})
    _, errors = check.validate(pdir, root, methods=["Foo"])
    assert len(errors) == 1 and "does not exist" in errors[0]


def test_rejects_a_method_without_proof(tmp_path: Path) -> None:
    pdir, root = make_repo(tmp_path, {"foo.md": GOOD})
    _, errors = check.validate(pdir, root, methods=["Foo", "Baz", "Fo"])
    assert len(errors) == 2 and any("Baz" in e for e in errors) and any("method Fo " in e for e in errors)


def test_rejects_a_lemma_without_check_and_malformed_lines(tmp_path: Path) -> None:
    text = GOOD + "\n### Lemma 3 (unchecked)\nNo check here.\n\n## Next section\nCheck: tests/test_x.py\n"
    pdir, root = make_repo(tmp_path, {"foo.md": text, "empty.md": "# Nothing to check\n"})
    _, errors = check.validate(pdir, root, methods=["Foo"])
    joined = "\n".join(errors)
    assert "Lemma 3 (unchecked)" in joined
    assert "malformed" in joined
    assert "empty.md: has no 'Check:' line" in joined
    assert len(errors) == 3


def test_ignores_check_lines_in_code_blocks(tmp_path: Path) -> None:
    text = GOOD + "\n```\nCheck: tests/test_x.py::test_missing\n```\n"
    pdir, root = make_repo(tmp_path, {"foo.md": text})
    checks, errors = check.validate(pdir, root, methods=["Foo"])
    assert errors == [] and len(checks) == 2


def test_main_fails_on_a_missing_test(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD + "\n### Lemma 3\nCheck: tests/test_x.py::test_missing\n"
    pdir, root = make_repo(tmp_path, {"foo.md": text})
    status = check.main(["--no-run", "--proofs-dir", str(pdir), "--repo-root", str(root)])
    assert status != 0
    assert "test_missing" in capsys.readouterr().err


def test_the_real_proofs_validate() -> None:
    """The repository's proofs: every named test exists and every method has a proof. The checks live
    in the lemma tests, and the token-tree proofs' in the tree tests (``tests/exact/test_trees.py``)."""
    checks, errors = check.validate()
    assert errors == []
    assert checks and {c.path for c in checks} <= {"tests/proofs/test_lemmas.py", "tests/exact/test_trees.py"}
    assert {"AR", "SD", "SLEM", "TLI", "SLRS"} <= set(check.method_names())
