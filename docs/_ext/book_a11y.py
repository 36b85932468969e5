"""Small fixes to the HTML that Sphinx and its extensions write, for assistive technology.

- The bibliography (sphinxcontrib-bibtex, through docutils) is a ``role="list"`` whose
  entries carry ``role="doc-biblioentry"``: that role is deprecated in ARIA 1.2 and is not a
  list item, so the list has no items for a screen reader (axe: aria-required-children,
  aria-deprecated-role). Each entry becomes a ``listitem``.
- The theme's navigation opens and closes a page's sub-pages with a ``<summary>`` that holds
  only an icon, so a screen reader announces it without a name (axe: summary-name). It gets
  an ``aria-label``. The navigation is rendered by the theme's templates, after the page's
  context, so this is done on the written files once the build has finished.
- A display equation too wide for a phone scrolls in its own box (book.css);
  ``_static/book-a11y.js`` makes such a box focusable, so a keyboard can scroll it
  (axe: scrollable-region-focusable).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

BIBLIOENTRY = 'role="doc-biblioentry"'
TOGGLE = '<summary><span class="toctree-toggle" role="presentation">'
NAMED_TOGGLE = (
    '<summary aria-label="Show or hide this page\'s sections">'
    '<span class="toctree-toggle" role="presentation">'
)


def _fix_roles(
    _app: Sphinx, _pagename: str, _templatename: str, context: dict[str, Any], _doctree: Any
) -> None:
    body = context.get("body")
    if body and BIBLIOENTRY in body:
        context["body"] = body.replace(BIBLIOENTRY, 'role="listitem"')


def _name_toggles(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if TOGGLE in text:
            page.write_text(text.replace(TOGGLE, NAMED_TOGGLE), encoding="utf-8")


def setup(app: Sphinx) -> dict[str, object]:
    """Register the extension."""
    app.connect("html-page-context", _fix_roles)
    app.connect("build-finished", _name_toggles)
    app.add_js_file("book-a11y.js", loading_method="defer")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
