"""Pickle each page's doctree without the build environment: nodes of a nested parse point to their page.

MyST's ``{eval-rst}`` (on the API pages, around ``automodule``) parses its text into a
document of its own and moves the nodes into the page, and each node keeps a reference to
that inner document, whose settings hold Sphinx's whole build environment. Sphinx pickles
every page's doctree after reading it, and reads all of them back at every build to number
the figures: an API page with 5 KB of text pickled as 2.2 MB (the environment and the
doctrees it had cached came along), and the API pages were 110 of the 116 MB of doctrees,
most of the 16 s a rebuild spent unpickling. Pointing those nodes at the page's own
document, whose settings Sphinx empties before pickling, leaves each page its own nodes.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx.application import Sphinx


def _adopt_nodes(_app: Sphinx, doctree: nodes.document) -> None:
    for node in doctree.findall(include_self=False):
        inner = node.__dict__.get("_document")
        if inner is not None and inner is not doctree:
            node.document = doctree


def setup(app: Sphinx) -> dict[str, Any]:
    """Connect the handler after every other reader of the doctree (Sphinx extension entry point)."""
    app.connect("doctree-read", _adopt_nodes, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
