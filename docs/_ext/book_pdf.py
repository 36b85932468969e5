"""The whole book as one PDF: HTML outputs made printable, and the download menu's link to it.

sphinx-book-theme's download menu offers ".pdf" as a button that prints the current page from
the browser. The book has a real PDF of every chapter, built by ``nox -s pdf`` with Sphinx's
LaTeX builder and XeLaTeX and placed beside ``index.html`` as :data:`PDF_NAME`; this extension
turns that entry into a link to it, on every page.

A few cells show HTML: tables of tokens and values, and the explorers (an element that the
page's script brings to life, around a sentence for readers without JavaScript). LaTeX cannot
typeset HTML, and would print the cell's plain-text stand-in,
``<IPython.core.display.HTML object>``. For the LaTeX build the HTML output is chosen instead
(``nb_mime_priority_overrides`` in conf.py) and turned here into what LaTeX can print: an HTML
table into a table with the same cells, anything else into its text, one paragraph per block.
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

PDF_NAME = "understanding-transformers.pdf"
"""The PDF's file name, in the root of the published folder (``nox -s pdf`` puts it there)."""


def _link_the_pdf(
    app: Sphinx, _pagename: str, _templatename: str, context: dict[str, Any], _doctree: Any
) -> None:
    if app.builder.format != "html":
        return
    for group in context.get("header_buttons", []):
        if group.get("label") != "download-buttons":
            continue
        for i, button in enumerate(group["buttons"]):
            if button.get("label") == "download-pdf-button":
                group["buttons"][i] = {
                    "type": "link",
                    "url": context["pathto"](PDF_NAME, 1),
                    "text": "book .pdf",
                    "tooltip": "Download the whole book as a PDF",
                    "icon": "fas fa-file-pdf",
                    "label": "download-pdf-button",
                }


class _Blocks(HTMLParser):
    """The rows of an HTML table (``<th>``/``<td>`` cells) and the text of its other blocks."""

    BLOCKS = frozenset({"p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "caption"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.head: list[list[str]] = []
        self.body: list[list[str]] = []
        self.paragraphs: list[str] = []
        self._row: list[str] = []
        self._cell: list[str] | None = None
        self._text: list[str] = []
        self._in_head = False

    def handle_starttag(self, tag: str, _attrs: list[tuple[str, str | None]]) -> None:
        if tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
            (self.head if self._in_head else self.body).append(self._row)
        elif tag in {"td", "th"}:
            self._cell = []
        elif tag in self.BLOCKS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag == "thead":
            self._in_head = False
        elif tag in {"td", "th"} and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag in self.BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        (self._cell if self._cell is not None else self._text).append(data)

    def _flush(self) -> None:
        text = " ".join("".join(self._text).split())
        if text:
            self.paragraphs.append(text)
        self._text = []

    def close(self) -> None:
        super().close()
        self._flush()


def _row(cells: list[str], n_cols: int) -> nodes.row:
    """A table row of ``n_cols`` entries: ``cells``, then empty ones."""
    padded = cells + [""] * (n_cols - len(cells))
    return nodes.row("", *(nodes.entry("", nodes.paragraph(text=text)) for text in padded))


def _table(head: list[list[str]], body: list[list[str]]) -> nodes.table:
    """A docutils table with header rows ``head`` and rows ``body`` of cell texts."""
    n_cols = max(len(row) for row in head + body)
    group = nodes.tgroup(cols=n_cols)
    group += [nodes.colspec(colwidth=1) for _ in range(n_cols)]
    for rows, part in ((head, nodes.thead), (body, nodes.tbody)):
        if rows:
            group += part("", *(_row(cells, n_cols) for cells in rows))
    table = nodes.table()
    table += group
    return table


def _printable_html(app: Sphinx, doctree: nodes.document, _docname: str) -> None:
    if app.builder.format != "latex":
        return
    for raw in list(doctree.findall(nodes.raw)):
        if raw.get("format") != "html" or "output" not in raw.get("classes", []):
            continue
        blocks = _Blocks()
        blocks.feed(raw.astext())
        blocks.close()
        printable: list[nodes.Node] = []
        if blocks.body or blocks.head:
            printable.append(_table(blocks.head, blocks.body))
        printable += [nodes.paragraph(text=text) for text in blocks.paragraphs]
        raw.replace_self(printable)


def setup(app: Sphinx) -> dict[str, object]:
    """Register the extension (after the theme has built its download menu)."""
    app.connect("html-page-context", _link_the_pdf, priority=600)
    app.connect("doctree-resolved", _printable_html)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
