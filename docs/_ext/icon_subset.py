"""Cut FontAwesome's web fonts down to the icons the book's pages show.

pydata-sphinx-theme's stylesheet draws its icons (the menu, search, colour-mode, download and
navigation buttons) from FontAwesome's web fonts, which hold about two thousand icons each:
0.1 MB of font for a dozen glyphs, on every page of a phone's first load. After the HTML is
written, this extension finds every ``fa-*`` class the pages and the site's scripts name (a
script may add an icon at run time), looks up each class's code point in the theme's own
stylesheet, and writes each font with only those glyphs, subset from the theme's original file
(so a later build that shows a new icon gets it back). The subsetting is fontTools', with its
WOFF2 compression (``fonttools[woff]``, a dependency of the docs group).
"""

from __future__ import annotations

import re
from pathlib import Path

import pydata_sphinx_theme
from fontTools import subset
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

FONTS = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static"
FONT_FOLDER = Path("vendor") / "fontawesome" / "webfonts"
STYLESHEET = Path("styles") / "pydata-sphinx-theme.css"
CLASS = re.compile(r"fa-[a-z0-9-]+")
# ".fa-bars,.fa-navicon{--fa:"\f0c9"}": the selectors of one icon, then its code point
RULE = re.compile(r'((?:\.fa-[a-z0-9-]+,?)+)\{--fa:"\\([0-9a-f]+)')


def code_points(css: str) -> dict[str, int]:
    """Each icon class of the stylesheet (aliases included) and the code point it draws."""
    points = {}
    for selectors, code in RULE.findall(css):
        for name in CLASS.findall(selectors):
            points[name] = int(code, 16)
    return points


def classes_used(outdir: Path) -> set[str]:
    """Every ``fa-*`` name in the built pages and in the site's scripts, bar FontAwesome's own."""
    names: set[str] = set()
    files = [*outdir.rglob("*.html"), *(outdir / "_static").rglob("*.js")]
    for path in files:
        if path.name != "fontawesome.js":
            names |= set(CLASS.findall(path.read_text(encoding="utf-8", errors="ignore")))
    return names


def _subset(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    points = code_points((static / STYLESHEET).read_text(encoding="utf-8"))
    wanted = sorted({points[name] for name in classes_used(Path(app.outdir)) if name in points})
    for original in sorted((FONTS / FONT_FOLDER).glob("*.woff2")):
        target = static / FONT_FOLDER / original.name
        if not target.is_file():
            continue
        options = subset.Options()
        options.flavor = "woff2"
        font = subset.load_font(str(original), options)
        subsetter = subset.Subsetter(options)
        subsetter.populate(unicodes=wanted)
        subsetter.subset(font)
        subset.save_font(font, str(target), options)
    logger.info(
        "icon fonts cut to %d glyphs: %s",
        len(wanted),
        ", ".join(
            f"{p.name} {p.stat().st_size // 1024} KB"
            for p in sorted((static / FONT_FOLDER).glob("*.woff2"))
        ),
    )


def setup(app: Sphinx) -> dict[str, object]:
    """Subset the icon fonts once the HTML is written."""
    app.connect("build-finished", _subset)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
