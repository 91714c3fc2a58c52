"""MkDocs hooks of the documentation site (``mkdocs.yml``; standard library and MkDocs only).

The site's pages are the repository's own Markdown, unmoved: ``docs/*.md``, plus pages added here
from outside ``docs/`` -- the README as the home page (``index.md``), ``proofs/*.md`` and
``bench/README.md`` / ``bench/RESULTS.md`` -- so each text has one source. Their relative links are
written for the repository; :func:`on_page_markdown` maps each one: a link to a file that is a page
of the site becomes that page's link; any other file of the repository (code, tests, JSON) becomes a
link to it in the repository browser when ``repo_url`` is set, else its path as code. So
``mkdocs build --strict`` fails only on a link that points nowhere (``tests/test_doc_links.py``
checks that every repository-relative link names an existing file).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXTRA_PAGES = {"index.md": "README.md", "bench/README.md": "bench/README.md", "bench/RESULTS.md": "bench/RESULTS.md"}
"""Site path -> repository path of the pages that live outside ``docs/`` (and ``proofs/*.md``)."""

_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def site_pages() -> dict[str, str]:
    """Every page the site adds from outside ``docs/``: site path -> repository path."""
    pages = dict(EXTRA_PAGES)
    for p in sorted((ROOT / "proofs").glob("*.md")):
        pages[f"proofs/{p.name}"] = f"proofs/{p.name}"
    return pages


def _repo_path(site_path: str) -> str:
    """The repository path of a site page (``docs/`` pages sit under ``docs/``)."""
    return site_pages().get(site_path, f"docs/{site_path}")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for site_path, repo_path in site_pages().items():
        files.append(File.generated(config, site_path, abs_src_path=str(ROOT / repo_path)))
    return files


def map_link(target: str, page_repo_path: str, site_of_repo: dict[str, str], repo_url: str | None) -> str | None:
    """The site's link for ``target`` written in the repository file ``page_repo_path``, relative to
    that page's site path (``site_of_repo``: repository path -> site path of every page); None: leave
    it (external or an anchor); ``""``: no place to link to (the caller writes the path as code)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path, _, anchor = target.partition("#")
    repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))
    if repo_target.startswith(".."):
        return None
    site_here = site_of_repo[page_repo_path]
    suffix = f"#{anchor}" if anchor else ""
    if repo_target in site_of_repo:
        rel = posixpath.relpath(site_of_repo[repo_target], posixpath.dirname(site_here) or ".")
        return rel + suffix
    if repo_target.startswith("docs/"):
        # a file under docs/ that is not a page (an image, a report): the site has it at the same place
        rel = posixpath.relpath(repo_target[len("docs/"):], posixpath.dirname(site_here) or ".")
        return rel + suffix
    if repo_url:
        return f"{repo_url.rstrip('/')}/blob/main/{repo_target}{suffix}"
    return ""  # no repository browser to link to: the caller writes the path as code


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    site_path = page.file.src_uri
    site_of_repo = {_repo_path(f.src_uri): f.src_uri for f in files if f.src_uri.endswith(".md")}
    page_repo_path = _repo_path(site_path)
    repo_url = config.get("repo_url")

    def sub(m: re.Match[str]) -> str:
        new = map_link(m.group(2), page_repo_path, site_of_repo, repo_url)
        if new is None:
            return m.group(0)
        if new == "":
            text = m.group(1)[1:-2] if m.group(1).startswith("[") else m.group(1)[2:-2]
            return f"{text} (`{posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), m.group(2)))}`)"
        return m.group(1) + new + m.group(3)

    out = []
    fenced = False
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else _LINK.sub(sub, line))
    return "".join(out)
