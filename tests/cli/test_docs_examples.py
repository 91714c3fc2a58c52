"""Every ```python block of every page of the documentation site (README.md, docs/**/*.md, proofs/*.md,
bench/README.md and bench/RESULTS.md: mkdocs.yml) runs as written (each on its own; documents in
``OWN_RUNNER`` run under their own test)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# documents whose blocks build on each other run under their own test, which also undoes what they
# install (auditing-transformers.md monkeypatches transformers: tests/torch/auditing/test_auditing_transformers_doc.py)
OWN_RUNNER = {"auditing-transformers.md"}
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name not in OWN_RUNNER),
        *sorted((ROOT / "proofs").glob("*.md")), ROOT / "bench" / "README.md", ROOT / "bench" / "RESULTS.md"]
BLOCKS = [(p, i, b) for p in DOCS for i, b in enumerate(re.findall(r"```python\n(.*?)```", p.read_text(), re.S))]


def test_docs_have_examples() -> None:
    assert {p.name for p, _, _ in BLOCKS} >= {"README.md", "slrs.md"}


@pytest.mark.parametrize("path, index, code", BLOCKS, ids=[f"{p.name}[{i}]" for p, i, _ in BLOCKS])
def test_doc_example_runs(path: Path, index: int, code: str) -> None:
    exec(compile(code, f"{path.name}[{index}]", "exec"), {"__name__": "__doc_example__"})
