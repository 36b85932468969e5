"""Serve MathJax from the book's own ``_static/mathjax`` instead of a CDN.

The MathJax 3 files come from the ``sphinx-mathjax-offline`` package (a
dependency of the docs group); this extension copies the parts a reader's
browser can load (the TeX-to-HTML bundle, its fonts, and the extensions it loads
on demand) and points Sphinx's MathJax support at them. Unlike the package's
own extension it declares itself safe for parallel builds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util.fileutil import copy_asset

ENTRY = "tex-chtml.js"
# Combined bundles for other input/output formats that the book never loads.
UNUSED = ("tex-chtml-full", "tex-mml-", "tex-svg", "mml-", "node-main.js", "latest.js")


def mathjax_folder() -> Path:
    """Folder of the MathJax files shipped by sphinx-mathjax-offline."""
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the docs need sphinx-mathjax-offline: pip install it")
    return Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax"


def _copy(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    copy_asset(
        mathjax_folder(),
        Path(app.outdir) / "_static" / "mathjax",
        excluded=lambda path: Path(path).name.startswith(UNUSED),
    )


def setup(app: Sphinx) -> dict[str, object]:
    """Register the extension."""
    if not (mathjax_folder() / ENTRY).is_file():
        raise RuntimeError(f"{ENTRY} is missing from {mathjax_folder()}")
    app.config.mathjax_path = f"mathjax/{ENTRY}"
    app.connect("build-finished", _copy)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
