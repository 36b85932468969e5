"""Serve MathJax from the book's own ``_static/mathjax`` instead of a CDN.

The MathJax 3 files come from the ``sphinx-mathjax-offline`` package (a
dependency of the docs group); this extension copies the parts a reader's
browser can load (the TeX-to-HTML bundle, its fonts, and the extensions it loads
on demand) and points Sphinx's MathJax support at them. Unlike the package's
own extension it declares itself safe for parallel builds.

The bundles also carry the speech-rule engine (for the accessibility menu), whose
defaults name a CDN for its rule files and two Internet Explorer helpers. The copy
rewrites those addresses so nothing in the site names an off-machine file, and an
inline script points the engine at the local rule files (``_static/mathjax/sre``)
through ``window.SREfeature``, which the engine reads when it starts.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util.fileutil import copy_asset

ENTRY = "tex-chtml.js"
# Combined bundles for other input/output formats that the book never loads.
UNUSED = ("tex-chtml-full", "tex-mml-", "tex-svg", "mml-", "node-main.js", "latest.js")
# Off-machine defaults inside the bundles: the speech-rule engine's rule files and two helpers
# only Internet Explorer loads. They become relative names that are never fetched from off the
# machine (SREFEATURE below gives the engine the real, local folder).
CDN = re.compile(r"https://cdn\.jsdelivr\.net/npm/")
# Where the speech-rule engine finds its rule files: beside the MathJax script the page loaded.
SREFEATURE = """window.SREfeature = {
  get json() {
    const script = document.querySelector('script[src*="mathjax/tex-chtml.js"]');
    return script ? new URL("sre/mathmaps", script.src).href : "_static/mathjax/sre/mathmaps";
  },
};"""


def _localize(folder: Path) -> None:
    """Rewrite the CDN addresses in the copied bundles (only files that name one)."""
    for path in folder.rglob("*.js"):
        text = path.read_text(encoding="utf-8")
        if CDN.search(text):
            path.write_text(CDN.sub("", text), encoding="utf-8")


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
        force=True,  # the bundles _localize rewrote in an earlier build differ from the source
    )
    _localize(Path(app.outdir) / "_static" / "mathjax")


def setup(app: Sphinx) -> dict[str, object]:
    """Register the extension."""
    if not (mathjax_folder() / ENTRY).is_file():
        raise RuntimeError(f"{ENTRY} is missing from {mathjax_folder()}")
    app.config.mathjax_path = f"mathjax/{ENTRY}"
    app.add_js_file(None, body=SREFEATURE, priority=400)
    app.connect("build-finished", _copy)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
