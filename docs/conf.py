"""Sphinx configuration of the book *Understanding Transformers*.

The book executes its chapters (MyST text notebooks) with myst-nb at build time
and caches the results. The cache is keyed by the source of ``tinyformer``: any
change to the package re-executes every chapter, so a page can never show
outputs of code that no longer exists. Nothing here touches the network: math
renders with a local copy of MathJax and no inventory is fetched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

# jsonschema, which nbformat imports to validate notebooks, compiles the grammar of its
# optional IRI checker (the rfc3987-syntax package, installed for JupyterLite's server) when
# it is imported: 1.5 s of every build. Nothing this process validates has a string format
# (nbformat's schemas use none, and no format checker is set), so it goes without.
sys.modules.setdefault("rfc3987_syntax", None)  # None: "import rfc3987_syntax" fails

from jupyter_cache import get_cache  # after the line above

from tinyformer.experiments import package_digest

DOCS = Path(__file__).resolve().parent
SRC = DOCS.parent / "src" / "tinyformer"
# The build folder (``nox -s docs`` sets BOOK_BUILD when it is not docs/_build).
BUILD = Path(os.environ.get("BOOK_BUILD", DOCS / "_build")).resolve()
sys.path.insert(0, str(DOCS / "_ext"))

# -- Project -------------------------------------------------------------------
project = "Understanding Transformers"
author = "The Understanding Transformers authors"
copyright = "2026, The Understanding Transformers authors"
language = "en"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "local_mathjax",  # serves MathJax from _static/mathjax: no CDN
    "build_report",  # writes build-report.json: phases, pages read and executed
    "small_doctrees",  # no build environment inside a page's pickled doctree
    "book_a11y",  # fixes to generated markup for assistive technology (bibliography roles)
    "glossary_tips",  # a term's definition on hover and on keyboard focus, built in
    "api_pages",  # one API page per module listed in api.md (docs/api/, generated)
    "book_map",  # the landing page's map of the book, from its toctrees
    "notebooks",  # every executable page downloadable as .ipynb
    "live",  # tagged cells and exercises run in the browser (JupyterLite)
    "icon_subset",  # FontAwesome's fonts cut to the icons the pages show
    "png_palette",  # figures stored with 256 colours where that changes no pixel visibly
    "sphinx_design",
    "sphinx_copybutton",
    "sphinxcontrib.bibtex",
    "sphinx_sitemap",  # sitemap.xml, for search engines, from BOOK_URL
    "whole_sitemap",  # ... listing every page, also after a build that rewrote only some
    "sphinxext.opengraph",  # link-preview tags (title, description, card image) on every page
    "notfound.extension",  # 404.html, whose links work from any missing address
    "book_pdf",  # the download menu links the whole book's PDF (nox -s pdf)
]

exclude_patterns = [
    "_build",
    "_build-perturbed",
    "_ext",
    "**.ipynb_checkpoints",
    ".jupyter_cache",
    "jupyter_execute",
]
templates_path = ["_templates"]
nitpicky = True
numfig = True
# Names outside this project that no local inventory describes (intersphinx
# would fetch one over the network, which the build must not do).
nitpick_ignore_regex = [
    (r"py:class", r"(numpy|np)\..*"),
    (r"py:class", r"(matplotlib|Axes|Figure)(\..*)?"),
    (r"py:class", r"(collections\.abc\.|typing\.)?(Sequence|Mapping|Iterator|Any|Callable)"),
    (r"py:class", r"int|float|bool|str|object|None|tuple|list|dict|type|optional"),
    (r"py:class", r"array_like|float32|float64|float32 or float64|Path|pathlib\.Path"),
    (r"py:class", r"numpy.ndarray of (int|bool)"),
    (r"py:class", r"tuple of numpy.ndarray"),
    (r"py:class", r"(sequence|mapping|callable|iterable|list|dict|tuple)( of .*)?"),
    (r"py:class", r"path-like|str to .*"),
]

# -- MyST and notebook execution ----------------------------------------------
myst_enable_extensions = ["amsmath", "colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

nb_execution_mode = "cache"
# text/markdown outputs (the table of runs in reproducing.md) with GitHub's tables
nb_render_markdown_format = "gfm"
# A cell that raises is reported as a warning that names the page and shows the
# cell and its traceback; the strict build (--fail-on-warning, as `nox -s docs`
# runs it) then fails. Raising instead would stop a parallel build with only the
# page's name, losing the cell and the traceback.
nb_execution_raise_on_error = False
nb_execution_show_tb = True
nb_execution_timeout = 600
nb_merge_streams = True
# Anything a cell prints to stderr (a NumPy warning, say) is a warning, so it fails the build.
nb_output_stderr = "warn"
nb_execution_excludepatterns: list[str] = []


def _execution_cache() -> str:
    """Create the cache for this version of the package and drop caches of older ones.

    Creating the jupyter-cache database here, before Sphinx starts parallel
    workers, stops two workers from creating it at the same moment.
    """
    root = BUILD / ".jupyter_cache"
    # outputs depend on NumPy's version as the stored runs and figures do: key on both
    current = root / f"{package_digest()}-numpy-{np.__version__}"
    if root.is_dir():
        for old in root.iterdir():
            if old != current and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    get_cache(current).list_cache_records()
    return str(current)


nb_execution_cache_path = _execution_cache()

# -- Autodoc -------------------------------------------------------------------
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "none"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# -- Bibliography --------------------------------------------------------------
# references.bib, plus one file per chapter under bib/ (keys must be unique across all).
bibtex_bibfiles = [
    "references.bib",
    *sorted(path.relative_to(DOCS).as_posix() for path in (DOCS / "bib").glob("*.bib")),
]
bibtex_default_style = "plain"
bibtex_reference_style = "author_year"

# -- HTML ----------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "Understanding Transformers"
html_static_path = ["_static"]
html_css_files = ["book.css", "explorers.css"]
# Ranks a chapter whose title names the query above API entries, and keeps TeX out of the
# result snippets (see the file).
html_search_scorer = str(DOCS / "_static" / "search-scorer.js")
# The theme's sidebar, with the book title wrapped in a landmark (_templates/tf-brand.html).
html_sidebars = {
    "**": ["tf-brand.html", "icon-links.html", "search-button-field.html", "sbt-sidebar-nav.html"]
}
html_js_files = ["explorer.js", "explorers.js"]
html_last_updated_fmt = None
html_copy_source = True
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    "home_page_in_toc": True,
}
# Without a default, pydata-sphinx-theme logs a console error on a reader's first visit.
html_context = {"default_mode": "auto"}
mathjax3_config = {"tex": {"tags": "ams"}}

# -- Publishing ------------------------------------------------------------------
# The one setting for where the book is published: BOOK_URL, the address of the folder that
# holds index.html, e.g. https://example.github.io/understanding-transformers/. The sitemap,
# the link previews and the 404 page are made for it; every other link in the book is
# relative and works under any address. Unset, the build uses an address that cannot exist
# (the reserved .invalid domain), under a sub-path, the way most hosts serve a project: the
# browser check serves the site under that sub-path.
BOOK_URL = os.environ.get("BOOK_URL", "https://book.invalid/understanding-transformers/")
if urlsplit(BOOK_URL).scheme not in {"http", "https"} or not urlsplit(BOOK_URL).netloc:
    raise ValueError(
        f"BOOK_URL must be an http(s) address such as https://host/path/, got {BOOK_URL!r}"
    )
BOOK_URL = BOOK_URL.rstrip("/") + "/"
html_baseurl = BOOK_URL
sitemap_url_scheme = "{link}"
sitemap_show_lastmod = False  # the same commit gives the same files
sitemap_excludes = ["404.html", "search.html", "genindex.html", "py-modindex.html"]
ogp_site_url = BOOK_URL
ogp_image = "_static/figures/card.png"  # made by scripts/fig_card.py
ogp_image_alt = "The title Understanding Transformers over a heatmap of sinusoidal position codes"
ogp_social_cards = {"enable": False}  # the card above, not one drawn per page
ogp_type = "website"
notfound_urls_prefix = urlsplit(BOOK_URL).path
notfound_context = {
    "title": "Page not found",
    "body": (
        "<h1>Page not found</h1>"
        "<p>No page of <em>Understanding Transformers</em> lives at this address: it may"
        " have moved, or the link that brought you here has a typing error. The"
        f' <a href="{notfound_urls_prefix}index.html">first page</a> maps the whole book,'
        " and the search box finds any term in it.</p>"
    ),
}

# -- Link checking (nox -s linkcheck) ------------------------------------------
linkcheck_timeout = 10
linkcheck_retries = 1
linkcheck_workers = 8
linkcheck_report_timeouts_as_broken = False

# -- The PDF (nox -s pdf) ----------------------------------------------------------
# Sphinx's LaTeX builder, typeset by XeLaTeX (Unicode text and the FreeFont faces of Debian's
# fonts-freefont-otf); the chapters' outputs come from the same execution cache as the HTML.
latex_engine = "xelatex"
# HTML outputs (tables, explorers) rather than their plain-text stand-ins: docs/_ext/book_pdf.py
# turns them into tables and paragraphs LaTeX can print
nb_mime_priority_overrides = [("latex", "text/html", 55)]  # text/plain is 60
# The PDF's root is book.md (index.md's parts and chapters without the landing page, whose
# toctrees sit inside its last section); the HTML build leaves it out. `nox -s pdf` sets the tag.
if tags.has("pdf"):  # noqa: F821 (Sphinx defines tags for conf.py)
    # the title page's date is the commit's (the same commit gives the same PDF); only the PDF
    # build sets it, as a change of `today` makes Sphinx read every page again
    try:
        _commit = subprocess.run(
            ["git", "log", "-1", "--format=%cs"],
            check=False,
            cwd=DOCS,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:  # no git: a copy of the tree, not a clone
        _commit = ""
    today = _commit or "undated"
else:
    exclude_patterns.append("book.md")
latex_documents = [("book", "understanding-transformers.tex", project, author, "manual")]
latex_show_urls = "no"
latex_show_pagerefs = False
latex_elements = {
    "papersize": "a4paper",
    "pointsize": "10pt",
    "figure_align": "htbp",
    # long code lines wrap instead of running off the page
    "sphinxsetup": "verbatimwrapslines=true, verbatimforcewraps=true",
    # a citation inside a figure caption is a moving argument: keep its link from expanding
    "preamble": r"""
\makeatletter
\let\bookDUrole\DUrole
\DeclareRobustCommand{\DUrole}[2]{\bookDUrole{#1}{#2}}
\AtBeginDocument{\let\bookhyperlink\hyperlink
  \DeclareRobustCommand{\hyperlink}[2]{\bookhyperlink{#1}{#2}}}
\makeatother
% characters outside FreeFont: CJK from Droid Sans Fallback, pictographs from Symbola
% (fonts-droid-fallback, fonts-symbola); any other glyph FreeFont lacks is only a warning,
% "Missing character", in docs/_build/latex/understanding-transformers.log
\usepackage{newunicodechar}
\newfontfamily\bookcjk{DroidSansFallbackFull.ttf}[Path=/usr/share/fonts/truetype/droid/]
\newfontfamily\booksymbols{Symbola_hint.ttf}[Path=/usr/share/fonts/truetype/ancient-scripts/]
\newunicodechar{日}{{\bookcjk 日}}
\newunicodechar{本}{{\bookcjk 本}}
\newunicodechar{語}{{\bookcjk 語}}
\newunicodechar{🐍}{{\booksymbols 🐍}}
\newunicodechar{🎉}{{\booksymbols 🎉}}
""",
}
