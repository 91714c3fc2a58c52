"""The documentation site (mkdocs.yml, docs/_site/hooks.py): every page of the repository's docs is in
its navigation, and the hook maps each kind of repository link to the right place on the site.
(CI builds the site with ``mkdocs build --strict``, which fails on any link that points nowhere.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
yaml = pytest.importorskip("yaml")


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location("site_hooks", ROOT / "docs" / "_site" / "hooks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _nav_pages(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(x) for x in nav))
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(v) for v in nav.values()))
    return set()


def test_every_page_is_in_the_navigation() -> None:
    """docs/*.md, docs/api/*.md, proofs/*.md and the pages the hook adds are all reachable from the nav
    (a new page that is not listed fails here); and the nav names no page that does not exist."""
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    hooks = _hooks()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")}
    pages |= {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs" / "api").glob("*.md")}
    pages |= set(hooks.site_pages())
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries that are no page"
    assert {"index.md", "proofs/sd.md", "bench/RESULTS.md", "auditing.md", "api/core.md"} <= nav


def test_the_hook_maps_repository_links() -> None:
    """A link to another page becomes that page's site link (from the README, from docs/, from proofs/,
    with its anchor); a file under docs/ that is not a page keeps its place; any other repository file
    becomes a link into the repository browser, or its path as code without one; external links and
    anchors are left alone."""
    h = _hooks()
    site_of_repo = {"README.md": "index.md", "docs/auditing.md": "auditing.md", "docs/api/core.md": "api/core.md",
                    "proofs/sd.md": "proofs/sd.md", "bench/RESULTS.md": "bench/RESULTS.md"}
    assert h.map_link("docs/auditing.md#sizes", "README.md", site_of_repo, None) == "auditing.md#sizes"
    assert h.map_link("../bench/RESULTS.md", "docs/auditing.md", site_of_repo, None) == "bench/RESULTS.md"
    assert h.map_link("../docs/auditing.md", "proofs/sd.md", site_of_repo, None) == "../auditing.md"
    assert h.map_link("sd.md", "proofs/sd.md", site_of_repo, None) == "sd.md"
    assert h.map_link("../auditing.md", "docs/api/core.md", site_of_repo, None) == "../auditing.md"
    assert h.map_link("auditing-transformers-reports/x.png", "docs/auditing.md", site_of_repo, None) == \
        "auditing-transformers-reports/x.png"
    assert h.map_link("../hsd_core/exact.py", "docs/auditing.md", site_of_repo, None) == ""
    assert h.map_link("../hsd_core/exact.py#L3", "docs/auditing.md", site_of_repo, "https://example.org/hsd/") == \
        "https://example.org/hsd/blob/main/hsd_core/exact.py#L3"
    for left in ("https://arxiv.org/abs/2502.05202", "#top", "mailto:a@b.c"):
        assert h.map_link(left, "docs/auditing.md", site_of_repo, None) is None


def test_links_inside_code_are_not_rewritten() -> None:
    """A fenced block's text is the page's text: the hook maps links in prose only."""
    h = _hooks()

    class _F:
        def __init__(self, uri: str) -> None:
            self.src_uri = uri

    class _P:
        file = _F("auditing.md")

    md = "see [RESULTS](../bench/RESULTS.md)\n```python\nx = '[a](../hsd_core/exact.py)'\n```\n[code](../hsd_core/exact.py)\n"
    out = h.on_page_markdown(md, _P(), {"repo_url": None}, [_F("auditing.md"), _F("bench/RESULTS.md")])
    assert "[RESULTS](bench/RESULTS.md)" in out
    assert "x = '[a](../hsd_core/exact.py)'" in out
    assert "code (`hsd_core/exact.py`)" in out
