"""A map of the whole book for the landing page, generated from its toctrees at build time.

The ``{book-map}`` directive (in index.md) becomes, for every toctree of the page in order,
its caption (the part) and a list of its pages, each linked by title with one line about it.
Chapters are numbered in reading order. The line for a page is, first found:

1. ``description`` in the page's front matter (the page's authors own it);
2. a line ``docname: text`` in the directive's content (the landing page's own words);
3. the first sentence of the page's first paragraph, with a warning (an error in the strict
   build): a first sentence often leans on the page before it, so every page needs a line of
   its own.

So a new chapter appears in the map as soon as it is in a toctree, and the build says that its
line is missing.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


class book_map(nodes.General, nodes.Element):  # noqa: N801  (docutils names nodes in lowercase)
    """Placeholder for the map, filled in once every page has been read."""


class BookMapDirective(SphinxDirective):
    """``{book-map}``: optional content lines ``docname: one line about the page``."""

    has_content = True
    option_spec: ClassVar[dict[str, Any]] = {}

    def run(self) -> list[nodes.Node]:
        """Parse the lines given in the content and return the placeholder."""
        node = book_map()
        lines = {}
        for offset, line in enumerate(self.content):
            if not line.strip():
                continue
            docname, sep, text = line.partition(":")
            if not sep:
                raise self.error(f"book-map: expected 'docname: text', got {line!r}")
            inline, messages = self.state.inline_text(text.strip(), self.lineno + offset + 1)
            paragraph = nodes.inline("", "", *inline)
            lines[docname.strip()] = paragraph
            if messages:
                return messages
        node["lines"] = lines
        return [node]


def _plain(node: nodes.Element) -> nodes.Element:
    """A copy of a paragraph fit to show on another page.

    Cross-references become plain text; citations and footnote marks are dropped.
    """
    node = node.deepcopy()
    for ref in list(node.findall(addnodes.pending_xref)):
        if ref.get("refdomain") in {"cite", "citation"} or ref.get("reftype") in {"p", "t"}:
            ref.parent.remove(ref)
        else:
            ref.replace_self(nodes.inline("", ref.astext()))
    for kind in (nodes.footnote_reference, nodes.citation_reference):
        for ref in list(node.findall(kind)):
            ref.parent.remove(ref)
    for ref in list(node.findall(nodes.reference)):
        ref.replace_self(nodes.inline("", ref.astext()))
    return node


def first_sentence(paragraph: nodes.Element) -> nodes.Element:
    """The paragraph cut after its first sentence (searching its top-level text)."""
    result = nodes.inline()
    for child in paragraph.children:
        if isinstance(child, nodes.Text):
            match = SENTENCE_END.search(str(child))
            if match:
                result += nodes.Text(str(child)[: match.end()])
                return result
        result += child.deepcopy()
    return result


def _doctree_read(app: Sphinx, doctree: nodes.document) -> None:
    env = app.env
    if not hasattr(env, "tf_first_paragraph"):
        env.tf_first_paragraph = {}
    for section in doctree.findall(nodes.section):
        for child in section.children:
            if isinstance(child, nodes.paragraph):
                env.tf_first_paragraph[env.docname] = first_sentence(_plain(child))
                return
        return


def _merge(_app: Sphinx, env: Any, docnames: set[str], other: Any) -> None:
    if not hasattr(env, "tf_first_paragraph"):
        env.tf_first_paragraph = {}
    for docname in docnames:
        if docname in getattr(other, "tf_first_paragraph", {}):
            env.tf_first_paragraph[docname] = other.tf_first_paragraph[docname]


def _purge(_app: Sphinx, env: Any, docname: str) -> None:
    getattr(env, "tf_first_paragraph", {}).pop(docname, None)


class FillBookMap(SphinxPostTransform):
    """Replace the placeholder by the map (before references are resolved)."""

    default_priority = 5

    def run(self, **_kwargs: Any) -> None:
        """Build the map from the page's toctrees."""
        placeholders = list(self.document.findall(book_map))
        if not placeholders:
            return
        env = self.env
        here = env.current_document.docname
        chapter = 0
        container = nodes.container(classes=["tf-book-map"])
        for toctree in self.document.findall(addnodes.toctree):
            caption = toctree.get("caption") or ""
            part = nodes.container(classes=["tf-map-part"])
            part += nodes.paragraph("", "", nodes.strong("", caption), classes=["tf-map-caption"])
            items = nodes.bullet_list(classes=["tf-map-list"])
            for _title, docname in toctree["entries"]:
                if docname not in env.titles:
                    continue
                label = env.titles[docname].astext()
                if docname.startswith("chapters/"):
                    chapter += 1
                    label = f"{chapter}. {label}"
                uri = self.app.builder.get_relative_uri(here, docname)
                line = nodes.paragraph()
                line += nodes.reference("", label, internal=True, refuri=uri)
                about = self._about(docname, placeholders[0]["lines"])
                if about is not None:
                    line += nodes.Text(": ")
                    line += about
                items += nodes.list_item("", line)
            part += items
            container += part
        placeholders[0].replace_self(container)
        for extra in placeholders[1:]:
            extra.parent.remove(extra)

    def _about(self, docname: str, lines: dict[str, nodes.Element]) -> nodes.Element | None:
        described = self.env.metadata.get(docname, {}).get("description")
        if described:
            return nodes.inline("", str(described))
        if docname in lines:
            return lines[docname].deepcopy()
        logger.warning(
            "book-map: no line about %r (add `description` to its front matter or a line"
            " to the book-map directive)",
            docname,
            location=self.document,
        )
        first = getattr(self.env, "tf_first_paragraph", {}).get(docname)
        return first.deepcopy() if first is not None else None


def setup(app: Sphinx) -> dict[str, object]:
    """Register the directive, its node and the transform that fills it."""
    app.add_node(book_map)
    app.add_directive("book-map", BookMapDirective)
    app.add_post_transform(FillBookMap)
    app.connect("doctree-read", _doctree_read)
    app.connect("env-merge-info", _merge)
    app.connect("env-purge-doc", _purge)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
