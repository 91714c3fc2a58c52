"""The documentation's links stay inside the repository: every markdown link ``[text](path)`` of
README.md, docs/, bench/RESULTS.md, bench/README.md and proofs/ names a file or folder of the
repository that exists, and every backticked path that climbs (``../x``) names one too (``../shared/...`` named a
file only the machine that wrote it had). Web links (``http``) and anchors are not checked."""

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
