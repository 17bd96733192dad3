"""The documentation site builds under ``mkdocs build --strict`` and links only to what exists.

mkdocs runs as a subprocess (it and its plugins may warn on import, and pytest turns warnings
into errors). Its own validation already fails the strict build on a broken Markdown link or
anchor; this test checks the HTML as built, theme included: every internal ``href``/``src``
of every page must name a file of the site and, with a ``#fragment``, an ``id`` in that file.
It also checks that every Markdown file under ``docs/`` is a page of the nav.
"""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"


class _Page(HTMLParser):
    """The ids of one HTML page and the URLs its elements point at."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.urls.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def _nav_pages(entry: object) -> list[str]:
    """Every Markdown path named in a (nested) mkdocs nav."""
    if isinstance(entry, str):
        return [entry] if entry.endswith(".md") else []
    if isinstance(entry, list):
        return [page for item in entry for page in _nav_pages(item)]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in _nav_pages(value)]
    return []


def _target(site: Path, page: Path, path: str) -> Path:
    """The file a link's path names, from the page at ``page`` (``site``-relative rules)."""
    base = PurePosixPath("/" + page.relative_to(site).as_posix()).parent
    joined = PurePosixPath(path) if path.startswith("/") else base / path
    parts: list[str] = []
    for part in joined.parts[1:]:
        if part == "..":
            if not parts:
                raise ValueError(f"{path} leaves the site")
            parts.pop()
        elif part != ".":
            parts.append(part)
    target = site.joinpath(*parts)
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target


def broken_links(site: Path) -> list[str]:
    """``page: url (why)`` for every internal link of the built site that does not resolve."""
    pages = {path: _parse(path) for path in sorted(site.rglob("*.html"))}
    problems = []
    for page, parsed in pages.items():
        for url in parsed.urls:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc:  # http(s), mailto, data, protocol-relative
                continue
            where = f"{page.relative_to(site)}: {url}"
            try:
                target = _target(site, page, unquote(parts.path)) if parts.path else page
            except ValueError as exc:
                problems.append(f"{where} ({exc})")
                continue
            if not target.is_file():
                problems.append(f"{where} (no file {target.relative_to(site)})")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{where} (no id {parts.fragment!r})")
    return problems


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_every_internal_link_and_anchor_resolves(site: Path) -> None:
    pages = list(site.rglob("*.html"))
    assert site / "index.html" in pages
    assert site / "quickstart" / "torchserve" / "index.html" in pages
    assert broken_links(site) == []


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    files = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert sorted(files - set(nav)) == [], "pages missing from the nav"
    assert sorted(set(nav) - files) == [], "nav entries without a page"


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text(
        '<h2 id="here">x</h2><a href="#here">ok</a><a href="../">up</a>'
        '<a href="https://example.com/x">out</a><a href="../b/">missing page</a>'
        '<a href="../index.html#nowhere">missing anchor</a>',
        encoding="utf-8",
    )
    (tmp_path / "index.html").write_text('<a href="a/#here">ok</a>', encoding="utf-8")
    assert broken_links(tmp_path) == [
        "a/index.html: ../b/ (no file b/index.html)",
        "a/index.html: ../index.html#nowhere (no id 'nowhere')",
    ]
