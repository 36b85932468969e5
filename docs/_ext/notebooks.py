"""Offer every executable page as a Jupyter notebook (``.ipynb``) in the theme's download menu.

For each page that myst-nb reads as a notebook, the page's source is converted with
myst-nb's own reader (the conversion the build executes) and written, without outputs, to
``_sources/<page>.ipynb`` beside the page's Markdown source; ``ipynb_source`` in the page's
context makes sphinx-book-theme's download button list it. The notebook runs top to bottom
with ``tinyformer`` installed (``pip install -e '.[book]'`` in the repository):
the chapters' ``from myst_nb import glue`` (which stores values for the book's prose) gets a
stand-in that shows the value when myst-nb is not installed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

import nbformat
from myst_nb.core.read import create_nb_reader
from sphinx.application import Sphinx

GLUE_IMPORT = "from myst_nb import glue"
# what reads a page into a notebook (with the page's suffix, which picks the reader)
READERS = ("myst-nb", "myst-parser", "markdown-it-py", "mdit-py-plugins", "PyYAML", "nbformat")
PREAMBLE_MD = """\
*This notebook is a page of the book* Understanding Transformers. *It runs top to bottom with
`tinyformer` installed (from the book's repository: `pip install -e '.[book]'`). A cell that
asks for one of the book's training runs trains it the first time (seconds to minutes) and
stores it in `~/.cache/tinyformer/experiments` (or `$TINYFORMER_STORE`). Its text is MyST
Markdown: roles such as `{term}` and `{glue:text}` render only in the book.*"""
PREAMBLE_CODE = f"""\
try:
    {GLUE_IMPORT}
except ImportError:  # outside the book's build: show a glued value instead of storing it
    from IPython.display import display as _display

    def glue(name, value, display=True):
        \"\"\"Stand-in for myst_nb.glue: display the value (when asked to).\"\"\"
        if display:
            _display(value)"""


@functools.cache
def _fixed_key() -> tuple[str, ...]:
    """What a conversion depends on besides the page: the readers' versions and this file."""
    return (*(version(name) for name in READERS), Path(__file__).read_text(encoding="utf-8"))


def _settings(config: object) -> str:
    """A reader's settings as text that does not depend on the order of their sets."""
    return json.dumps(
        dataclasses.asdict(config),
        sort_keys=True,
        default=lambda value: sorted(value) if isinstance(value, set | frozenset) else repr(value),
    )


def notebook(app: Sphinx, docname: str) -> nbformat.NotebookNode | None:
    """The page as a notebook without outputs, or None if the page is not a notebook.

    Converted once per version of the page (and of its readers, their settings and this file)
    and kept in the doctree folder: the live mode asks for every chapter at every build, and
    reading them all again took 1.5 s of a build that changed one page.
    """
    path = Path(app.env.doc2path(docname))
    text = path.read_text(encoding="utf-8")
    key = hashlib.sha256(
        "\0".join(
            (
                path.suffix,
                text,
                *_fixed_key(),
                _settings(app.env.myst_config),
                _settings(app.env.mystnb_config),
            )
        ).encode()
    ).hexdigest()
    cache = Path(app.doctreedir) / "notebooks" / f"{docname}.json"
    if cache.is_file():
        stored = json.loads(cache.read_text(encoding="utf-8"))
        if stored["key"] == key:
            found = stored["notebook"]
            return None if found is None else nbformat.from_dict(found)
    reader = create_nb_reader(str(path), app.env.myst_config, app.env.mystnb_config, text)
    nb = None if reader is None else downloadable(reader.read(text))
    # written whole, then renamed: a build stopped halfway leaves no half-written file
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f"{cache.name}.{os.getpid()}")
    partial.write_text(json.dumps({"key": key, "notebook": nb}), encoding="utf-8")
    partial.replace(cache)
    return nb


def downloadable(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A page read as a notebook (myst-nb's reader), as the download offers it."""
    for cell in nb.cells:
        if cell.cell_type == "code" and GLUE_IMPORT in cell.source:
            lines = cell.source.splitlines()
            cell.source = "\n".join(
                "# glue: see the first code cell" if line.strip() == GLUE_IMPORT else line
                for line in lines
            )
    preamble = [
        nbformat.v4.new_markdown_cell(PREAMBLE_MD),
        nbformat.v4.new_code_cell(PREAMBLE_CODE),
    ]
    nb.cells = preamble + list(nb.cells)
    for cell in nb.cells:
        cell.pop("id", None)
    nb.metadata.pop("source_map", None)
    out = nbformat.v4.upgrade(nb) if nb.nbformat < 4 else nb
    out.nbformat, out.nbformat_minor = 4, 5
    for i, cell in enumerate(out.cells):
        cell["id"] = f"cell-{i}"
    return out


def _add_notebook(
    app: Sphinx, pagename: str, _templatename: str, context: dict[str, Any], _doctree: Any
) -> None:
    if app.builder.format != "html" or pagename not in app.env.all_docs:
        return
    nb = notebook(app, pagename)
    if nb is None:
        return
    nbformat.validate(nb)
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app: Sphinx) -> dict[str, object]:
    """Register the extension (before the theme builds its download menu)."""
    app.connect("html-page-context", _add_notebook, priority=400)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
