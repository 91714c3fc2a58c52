"""The documentation's links stay inside the repository: every markdown link ``[text](path)`` of
README.md, docs/, bench/RESULTS.md, bench/README.md and proofs/ names a file or folder of the
repository that exists, and every backticked path that climbs (``../x``) names one too (``../shared/...`` named a
file only the machine that wrote it had), and so does every backticked path of a file in the repository's own
folders (``tests/torch/test_head.py``: a results page once cited a test file that never existed). Web links
(``http``) and anchors are not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "bench" / "RESULTS.md", ROOT / "bench" / "README.md",
               *(ROOT / "docs").rglob("*.md"),
               *(ROOT / "proofs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
CLIMB = re.compile(r"`(\.\./[^`\s]+)`")
FILE = re.compile(r"`((?:tests|hsd_core|hsd_torch|bench|docs|proofs|scripts)/[^`\s:*]+"
                  r"\.(?:py|md|json|png|sh|lean|txt|yaml|toml))`")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (code may index dicts with ``](``)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_links_stay_inside_the_repository(doc: Path) -> None:
    text = _prose(doc.read_text(encoding="utf-8"))
    bad = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    for t in CLIMB.findall(text):
        path = (doc.parent / t).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(t)
    assert not bad, f"{doc.relative_to(ROOT)} links outside the repository or to nothing: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_cited_files_exist(doc: Path) -> None:
    text = _prose(doc.read_text(encoding="utf-8"))
    bad = [t for t in FILE.findall(text) if not (ROOT / t).exists()]
    assert not bad, f"{doc.relative_to(ROOT)} cites files the repository does not have: {bad}"
