"""Make sphinx-sitemap list every page of the book, whichever pages this build wrote.

sphinx-sitemap collects a page's address when the page is written, and writes ``sitemap.xml``
from what it collected. An incremental build writes only the pages that changed, so its
sitemap would list those alone, and the published site would lose the others from its
sitemap. Just before sphinx-sitemap writes the file, this extension adds every page of the
environment that was not written in this build (through sphinx-sitemap's own function, so
its exclusions and address scheme apply), and puts the whole list in the order of the page
names: a cold build and an incremental one give the same file.
"""

from __future__ import annotations

import queue
from typing import Any

import sphinx_sitemap
from sphinx.application import Sphinx

WRITTEN: set[str] = set()
"""The pages written in this build (kept outside the environment, which is pickled)."""


def _written(_app: Sphinx, pagename: str, *_args: Any) -> None:
    WRITTEN.add(pagename)


def _complete(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    links = app.env.app.sitemap_links  # sphinx-sitemap's queue of (address, last modified)
    for docname in sorted(app.env.found_docs - WRITTEN):
        sphinx_sitemap.add_html_link(app, docname, None, None, None)
    collected = []
    while True:
        try:
            collected.append(links.get_nowait())
        except queue.Empty:
            break
    for link in sorted(set(collected)):
        links.put(link)
    WRITTEN.clear()


def setup(app: Sphinx) -> dict[str, object]:
    """Record the pages written; complete sphinx-sitemap's list before it writes the file."""
    app.setup_extension("sphinx_sitemap")
    app.connect("html-page-context", _written)
    app.connect("build-finished", _complete, priority=400)  # sphinx-sitemap's runs at 500
    return {"parallel_read_safe": True, "parallel_write_safe": True}
