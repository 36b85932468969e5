"""The PDF of the whole book holds every chapter and figure, and every page's menu offers it.

``nox -s pdf`` builds the PDF (Sphinx's LaTeX builder and XeLaTeX) from docs/book.md, whose
parts must list index.md's chapters in index.md's order, and copies it beside index.html.
The checks read its text with Poppler's ``pdftotext``: every chapter's title and the words of
every figure caption of the HTML book must be in it (compared letters and digits only, so
line breaks, hyphenation and the rendering of math and citations do not matter).

With no PDF built these checks are skipped, saying so, unless ``BOOK_REQUIRE_PDF=1`` (CI
sets it): an author without TeX Live can still run the rest of the browser check.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _toctrees(source: Path) -> list[list[str]]:
    """The entries of every toctree of a MyST page, in order (options and blanks dropped)."""
    blocks = re.findall(r"```\{toctree\}\n(.*?)```", source.read_text(encoding="utf-8"), re.DOTALL)
    return [
        [line.strip() for line in block.splitlines() if line.strip() and line[0] != ":"]
        for block in blocks
    ]


def test_the_pdf_has_the_chapters_of_the_html_book_in_the_same_order():
    html_book = [doc for entries in _toctrees(DOCS / "index.md") for doc in entries]
    pdf_book = [doc for entries in _toctrees(DOCS / "book.md") for doc in entries]
    assert pdf_book == html_book


@pytest.fixture(scope="module")
def pdf(pdf_path: Path, pdf_required: bool) -> Path:
    if not pdf_path.is_file():
        message = f"no PDF at {pdf_path}: run `nox -s pdf` after `nox -s docs`"
        if pdf_required:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return pdf_path


def _letters(text: str) -> str:
    """Lower-case letters and digits only, ligatures and accents unfolded."""
    text = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in text.lower() if ch.isalnum() and ch.isascii())


@pytest.fixture(scope="module")
def pdf_letters(pdf: Path) -> str:
    text = subprocess.run(
        ["pdftotext", "-raw", "-enc", "UTF-8", str(pdf), "-"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return _letters(text)


class _Captions(HTMLParser):
    """The text of every figure caption, split where math or a figure number stands.

    Both are printed differently in the PDF: math as typeset glyphs, and figures numbered
    within their chapter ("Fig. 6.1" for the HTML's "Fig. 8").
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.captions: list[list[str]] = []
        self._in_figure = 0  # > 0 inside a <figcaption>
        self._depth = 0  # > 0 inside a caption's text
        self._math = 0  # > 0 inside a math span of it

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "figcaption":
            self._in_figure += 1
        if self._depth:
            self._depth += 1
            if self._math or "math" in classes or "std-numref" in classes:
                self._math += 1
                self.captions[-1].append("")
        elif tag == "span" and "caption-text" in classes and self._in_figure:
            self._depth = 1
            self.captions.append([""])

    def handle_endtag(self, tag: str) -> None:
        if tag == "figcaption":
            self._in_figure -= 1
        if self._depth:
            self._depth -= 1
            if self._math:
                self._math -= 1

    def handle_data(self, data: str) -> None:
        if self._depth and not self._math:
            self.captions[-1][-1] += data


def _chapter_sources() -> list[Path]:
    return [DOCS / f"{doc}.md" for entries in _toctrees(DOCS / "book.md") for doc in entries]


def test_every_chapter_title_is_in_the_pdf(pdf_letters):
    missing = []
    for source in _chapter_sources():
        title = next(
            line[2:]
            for line in source.read_text(encoding="utf-8").splitlines()
            if line[:2] == "# "
        )
        if _letters(title) not in pdf_letters:
            missing.append(title)
    assert not missing, f"chapter titles not found in the PDF: {missing}"


def test_every_figure_caption_is_in_the_pdf(html_root, pdf_letters):
    missing, n_captions = [], 0
    for source in _chapter_sources():
        page = html_root / source.relative_to(DOCS).with_suffix(".html")
        parser = _Captions()
        parser.feed(page.read_text(encoding="utf-8"))
        for pieces in parser.captions:
            n_captions += 1
            lost = [p for p in pieces if _letters(p) and _letters(p) not in pdf_letters]
            if lost:
                missing.append(f"{page.name}: {lost[0].strip()[:80]!r}")
    assert n_captions > 50, f"only {n_captions} figure captions found in the HTML book"
    assert not missing, f"{len(missing)} of {n_captions} figure captions not in the PDF: {missing}"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def test_every_chapter_offers_the_pdf_in_its_download_menu(html_root, pdf):
    without = []
    for source in _chapter_sources():
        page = html_root / source.relative_to(DOCS).with_suffix(".html")
        links = _Links()
        links.feed(page.read_text(encoding="utf-8"))
        targets = {(page.parent / href).resolve() for href in links.hrefs if pdf.name in href}
        if targets != {pdf.resolve()}:
            without.append(page.relative_to(html_root).as_posix())
    assert not without, f"pages whose menu does not link the book's PDF: {without}"
