"""Show a glossary term's definition where the term is used, on hover and on keyboard focus.

Sphinx links each ``{term}`` to its entry on the glossary page. For every page, this
extension finds those links in the page's body and appends the definitions they point at,
rendered at build time, as hidden ``role="tooltip"`` elements; ``_static/glossary-tips.js``
ties each link to its definition with ``aria-describedby`` (so a screen reader announces it)
and shows the definition beside the link while the pointer is over it or it has the keyboard
focus (Escape hides it). Nothing is fetched: a page carries the definitions it needs, and
math in them is typeset by the page's local MathJax.
"""

from __future__ import annotations

import html
import re
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx

GLOSSARY = "glossary"
TERM_LINK = re.compile(r'href="[^"#]*glossary\.html#(term-[^"]+)"')
_CACHE: dict[int, dict[str, tuple[str, str]]] = {}


def _inline(node: nodes.Node) -> str:
    """HTML of a definition's inline content: text, emphasis, code and math (links as text)."""
    if isinstance(node, nodes.Text):
        return html.escape(node.astext(), quote=False)
    if isinstance(node, nodes.math):
        tex = html.escape(node.astext(), quote=False)
        return f'<span class="math notranslate nohighlight">\\({tex}\\)</span>'
    inner = "".join(_inline(child) for child in node.children)
    tag = {nodes.emphasis: "em", nodes.strong: "strong", nodes.literal: "code"}.get(type(node))
    return f"<{tag}>{inner}</{tag}>" if tag else inner


def _block(node: nodes.Node) -> str:
    """HTML of a definition's blocks: paragraphs (and any block math) in order."""
    if isinstance(node, nodes.paragraph):
        return f"<p>{_inline(node)}</p>"
    if isinstance(node, nodes.math_block):
        tex = html.escape(node.astext(), quote=False)
        return f'<div class="math notranslate nohighlight">\\[{tex}\\]</div>'
    return "".join(_block(child) for child in node.children)


def definitions(app: Sphinx) -> dict[str, tuple[str, str]]:
    """Map each glossary term id (``term-...``) to the term and its definition's HTML."""
    key = id(app.env)
    if key not in _CACHE:
        found: dict[str, tuple[str, str]] = {}
        if GLOSSARY in app.env.all_docs:
            doctree = app.env.get_doctree(GLOSSARY)
            for glossary in doctree.findall(addnodes.glossary):
                for item in glossary.findall(nodes.definition_list_item):
                    body = "".join(_block(d) for d in item.findall(nodes.definition))
                    for term in item.findall(nodes.term):
                        for term_id in term["ids"]:
                            found[term_id] = (term.astext(), body)
        _CACHE[key] = found
    return _CACHE[key]


def _add_tips(
    app: Sphinx, pagename: str, _templatename: str, context: dict[str, Any], _doctree: Any
) -> None:
    body = context.get("body")
    if not body or pagename == GLOSSARY:
        return
    known = definitions(app)
    ids = [i for i in dict.fromkeys(TERM_LINK.findall(body)) if i in known]
    if not ids:
        return
    tips = []
    for term_id in ids:
        term, definition = known[term_id]
        tips.append(
            f'<div class="tf-tip" role="tooltip" id="tf-tip-{term_id}" hidden>'
            f'<p class="tf-tip-term">{html.escape(term)}</p>{definition}</div>'
        )
    context["body"] = body + '\n<div class="tf-tips">' + "".join(tips) + "</div>\n"


def setup(app: Sphinx) -> dict[str, object]:
    """Register the extension."""
    app.add_js_file("glossary-tips.js", loading_method="defer")
    app.connect("html-page-context", _add_tips)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
