"""The book's search page puts each chapter first for the words of its title, with clean snippets.

The test types into the theme's search page as a reader would. For every chapter, the query
is the chapter's "main term": the word of its title (at least four letters) that the fewest
other chapter titles share, the later word on a tie (in English titles the head noun comes
last). The chapter must be among the first three results, and no result's snippet may show
raw TeX.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

pytestmark = pytest.mark.book

SEARCH_PAGE = "search.html"
STOPWORDS = {"with", "from", "that", "this", "into", "what", "through", "their"}
# Math delimiters and common TeX commands (code in a snippet may hold other backslashes).
RAW_TEX = re.compile(
    r"\\\(|\\\[|\$\$|\\(frac|sqrt|mathrm|mathbf|text|times|cdot|sum|left|right|top|log|exp)\b"
)

RESULTS = """
() => Array.from(document.querySelectorAll('#search-results ul.search > li')).map(li => ({
  href: li.querySelector('a').getAttribute('href'),
  summary: (li.querySelector('p.context') || {textContent: ''}).textContent,
}))
"""


class _ChapterTitles(HTMLParser):
    """The landing page's navigation links to chapters: href -> title."""

    def __init__(self) -> None:
        super().__init__()
        self.titles: dict[str, str] = {}
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href") or ""
        if tag == "a" and href.startswith("chapters/") and "#" not in href:
            self._href, self._text = href, []

    def handle_data(self, data: str) -> None:
        if self._href:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href:
            self.titles.setdefault(self._href, " ".join("".join(self._text).split()))
            self._href = None


def chapter_titles(html_root) -> dict[str, str]:
    """Every chapter's page and title, from the sidebar of the landing page."""
    parser = _ChapterTitles()
    parser.feed((html_root / "index.html").read_text(encoding="utf-8"))
    return {href: re.sub(r"^\d+\.\s*", "", title) for href, title in parser.titles.items()}


def _words(title: str, ignored: set[str]) -> list[str]:
    words = re.findall(r"[a-z]+", title.lower())
    return [w for w in words if len(w) >= 4 and w not in STOPWORDS | ignored]


def main_terms(titles: dict[str, str], ignored: set[str]) -> dict[str, str]:
    """Each chapter's main term: its title's word shared by the fewest titles, later on a tie.

    Words the search itself ignores (its stop words, ``ignored``) are never chosen.
    """
    shared = {}
    for title in titles.values():
        for word in set(_words(title, ignored)):
            shared[word] = shared.get(word, 0) + 1
    terms = {}
    for href, title in titles.items():
        words = _words(title, ignored)
        if words:
            fewest = min(shared[w] for w in words)
            terms[href] = [w for w in words if shared[w] == fewest][-1]
    return terms


def search(page, query: str) -> list[dict]:
    """Type ``query`` into the search page's field, press Enter, and return the results."""
    field = page.locator('.bd-search-container form.bd-search input[name="q"]')
    field.fill(query)
    field.press("Enter")
    page.wait_for_url(re.compile(r"search\.html\?q="))
    page.wait_for_function(
        "() => /Search finished|did not match/.test("
        "(document.querySelector('#search-results .search-summary') || {}).innerText || '')"
    )
    page.wait_for_load_state("networkidle")  # the snippets are fetched one page at a time
    return page.evaluate(RESULTS)


def test_every_chapter_ranks_in_the_top_three_for_its_title_term(visit, html_root):
    titles = chapter_titles(html_root)
    assert len(titles) >= 10, titles
    opened = visit(SEARCH_PAGE)
    ignored = set(opened.page.evaluate("() => Array.from(window.stopwords || [])"))
    failures, tex = [], []
    for href, term in main_terms(titles, ignored).items():
        results = search(opened.page, term)
        pages = list(dict.fromkeys(r["href"].split("#")[0] for r in results))
        if href not in pages[:3]:
            rank = pages.index(href) + 1 if href in pages else None
            failures.append(f"{term!r}: {titles[href]} ranks {rank} of {len(pages)}: {pages[:4]}")
        tex += [
            f"{term!r}: {r['href']}: {r['summary'][:120]}"
            for r in results
            if RAW_TEX.search(r["summary"])
        ]
    assert not failures, "\n".join(failures)
    assert not tex, "raw TeX in result snippets:\n" + "\n".join(tex)
    assert not opened.console_errors, opened.console_errors
    assert not opened.off_host_requests, opened.off_host_requests


def test_softmax_finds_the_chapters_before_the_api(visit):
    opened = visit(SEARCH_PAGE)
    results = search(opened.page, "softmax")
    pages = list(dict.fromkeys(r["href"].split("#")[0] for r in results))
    first_api = next((i for i, p in enumerate(pages) if p.startswith("api")), len(pages))
    first_chapter = next((i for i, p in enumerate(pages) if p.startswith("chapters/")), None)
    assert first_chapter is not None, pages[:6]
    assert first_chapter < first_api, pages[:6]
    assert not [r for r in results if RAW_TEX.search(r["summary"])]
