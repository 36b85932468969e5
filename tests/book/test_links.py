"""Every internal link and anchor of the built book points at something that exists.

The one exception: the whole book's PDF, which every page's download menu links, is made by
``nox -s pdf`` after the HTML; with none built its links are left to tests/book/test_pdf.py,
which skips saying so (or fails, where ``BOOK_REQUIRE_PDF=1``, as in CI).
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.book


class _Collector(HTMLParser):
    """Collect element ids and the targets of links, images, scripts and styles."""

    ATTRS: ClassVar[dict[str, str]] = {
        "a": "href",
        "link": "href",
        "img": "src",
        "script": "src",
        "iframe": "src",
    }

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"])
        target = values.get(self.ATTRS.get(tag, ""))
        if target:
            self.targets.append(target)


def _parse(path: Path) -> _Collector:
    collector = _Collector()
    collector.feed(path.read_text(encoding="utf-8"))
    return collector


def test_internal_links_and_anchors_resolve(
    html_root, all_pages, book_prefix, pdf_path, pdf_required
):
    html = html_root
    prefix = book_prefix  # where a host serves the book (the 404 page's links start with it)
    parsed = {path: _parse(html / path) for path in all_pages}
    ids = {path: c.ids for path, c in parsed.items()}
    problems = []
    for page, collector in parsed.items():
        for target in collector.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc:  # external: nox -s linkcheck
                continue
            if parts.path.startswith("/"):  # from the host's root: must be inside the book
                if not parts.path.startswith(prefix):
                    problems.append(f"{page}: {target} -> outside the book's folder {prefix}")
                    continue
                file = html / unquote(parts.path[len(prefix) :])
            else:
                file = (html / page).parent / unquote(parts.path) if parts.path else html / page
            file = file.resolve()
            if not file.is_relative_to(html.resolve()):
                problems.append(f"{page}: {target} -> outside the book's folder")
                continue
            if not file.exists():
                if file != pdf_path.resolve() or pdf_required:  # else: left to test_pdf.py
                    problems.append(f"{page}: {target} -> missing file")
                continue
            if parts.fragment and file.suffix == ".html":
                key = file.relative_to(html.resolve()).as_posix()
                known = ids.get(key) or _parse(file).ids
                if unquote(parts.fragment) not in known:
                    problems.append(f"{page}: {target} -> no element with id {parts.fragment!r}")
    assert not problems, "\n".join(problems)
