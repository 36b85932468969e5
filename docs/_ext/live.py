"""Run a chapter's code in the reader's browser: JupyterLite with a WebAssembly Python.

A chapter opts in cell by cell. Its code cells tagged ``live`` become, in order, the chapter's
live notebook, and each ``{live-exercise}`` directive (its argument a key of
:func:`tinyformer.exercises.get`, such as ``attention.masked_attention``) adds an exercise: a
notebook with the function's stub to complete and a cell that checks it with the check the
build runs on the chapter's hidden solution (``EXERCISE.require(solution)``).

Pages with live content get a "Run the code live" button under their title, and each exercise a
"Try it live" button. A button opens a panel in the page holding JupyterLite's notebook; nothing
of the live runtime is fetched before that click, and the page carries only the few hundred
bytes of the button and its script. Opened from ``file://`` (where a service worker, and so
JupyterLite, cannot run), the panel says what to run instead.

When an HTML build has read its pages, the notebooks and a copy of ``src/tinyformer`` (the package
as built, never an older copy) are written to ``<build>/live-contents`` and ``jupyter lite build``
(jupyterlite-core with jupyterlite-xeus-python's prebuilt Python 3.11 and NumPy 1.25, nothing
downloaded: the add-on that would solve a conda environment is disabled) starts building their
site while Sphinx writes the pages; at the end of the build it is checked and copied to
``<html>/live``. A digest of those inputs skips the step when nothing changed.
"""

from __future__ import annotations

import ast
import atexit
import hashlib
import html
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import nbformat
from docutils import nodes
from notebooks import PREAMBLE_CODE, notebook
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from tinyformer.exercises import get

LOGGER = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "tinyformer"
LIVE_DIR = "live"  # under the HTML output
KERNEL = {"name": "xeus-python", "display_name": "Python (XPython)", "language": "python"}
# Modules the in-browser Python has besides the standard library: a live notebook keeps the
# chapter's imports of these and drops the rest (matplotlib, myst_nb...).
BROWSER_MODULES = {"numpy", "tinyformer", "IPython"}
NEEDS_MATPLOTLIB = ("tinyformer.viz",)  # parts of tinyformer that import matplotlib
SETUP = """\
import sys

sys.dont_write_bytecode = True  # the package is read from the site; nothing to write back
"""
INTRO = """\
**{title}, live.** The cells below are the chapter's, run by Python 3.11 and NumPy 1.25 compiled
to WebAssembly in this browser tab, with the book's own `tinyformer`. Run a cell with
Shift+Enter, from the top; edit anything. Your changes stay in this browser (the page's menu
can download the notebook). Cells that train the book's models or draw its figures stay in the
chapter: they need more than a browser tab offers."""
# JupyterLab's settings for the live notebooks: every cell drawn (JupyterLab otherwise draws
# only the cells in view, and a short notebook gains nothing from that).
SETTINGS = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}
EXERCISE_INTRO = """\
**Exercise: write `{name}`** (from the chapter *{title}*). Complete the function in the next
cell: its docstring says what it takes and returns. Run it, then run the check below it: the
check compares your function with tinyformer's on fixed inputs, the same check the book's build
runs on the chapter's solution, and says in words what differs."""


def _in_browser(module: str) -> bool:
    """Whether the in-browser Python can import ``module``."""
    root = module.split(".", maxsplit=1)[0]
    if module.startswith(NEEDS_MATPLOTLIB):
        return False
    return root in BROWSER_MODULES or root in sys.stdlib_module_names


def browser_setup(source: str) -> str:
    """The chapter's first code cell as the in-browser Python can run it.

    Imports of modules the browser lacks (matplotlib, myst_nb...) and IPython magics
    (``%matplotlib inline``) are dropped, with their lines; everything else, such as the
    chapter's helper functions, stays.
    """
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("%", "!")):
            lines[i] = ""
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return ""
    for node in tree.body:
        if isinstance(node, ast.Import):
            modules = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = {node.module}
        else:
            continue
        if not all(_in_browser(module) for module in modules):
            for i in range(node.lineno - 1, node.end_lineno or node.lineno):
                lines[i] = ""
    kept = "\n".join(lines)
    while "\n\n\n\n" in kept:
        kept = kept.replace("\n\n\n\n", "\n\n\n")
    return kept.strip() + "\n"


class LiveExercise(SphinxDirective):
    """``{live-exercise} <chapter>.<function>``: a button opening the exercise in the live panel."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        """Record the exercise for the page's live notebooks; return its button."""
        key = self.arguments[0]
        chapter, _, name = key.partition(".")
        if not name or chapter != Path(self.env.docname).name:
            raise self.error(
                f"live-exercise: expected '<chapter>.<function>' with this page's chapter"
                f" ({Path(self.env.docname).name!r}), got {key!r}"
            )
        store = self.env.__dict__.setdefault("live_exercises", {})
        store.setdefault(self.env.docname, [])
        if key not in store[self.env.docname]:
            store[self.env.docname].append(key)
        path = f"{chapter}--{name}.ipynb"
        button = (
            f'<p class="live-launch"><button type="button" class="live-open" data-live="{path}"'
            f' data-title="Exercise: {html.escape(name)}">Try it live: write'
            f" <code>{html.escape(name)}</code> and check it</button></p>"
        )
        return [nodes.raw("", button, format="html")]


# The panel's script and style, inlined into pages with live content only (about 2 KB).
# It loads nothing until a button is pressed; the panel's iframe then loads JupyterLite.
PANEL = """\
<style>
.live-launch button{font:inherit;cursor:pointer;border:1px solid var(--pst-color-primary);
background:var(--pst-color-background);color:var(--pst-color-text-base);border-radius:.3rem;
padding:.2rem .7rem}
.live-panel{position:fixed;top:0;right:0;bottom:0;width:min(100vw,max(50vw,40rem));z-index:2000;
display:flex;flex-direction:column;background:var(--pst-color-background);
border-left:1px solid var(--pst-color-border);box-shadow:-4px 0 12px rgba(0,0,0,.2)}
.live-panel header{display:flex;gap:1rem;align-items:center;padding:.3rem .7rem;
border-bottom:1px solid var(--pst-color-border)}
.live-panel header strong{flex:1}
.live-panel iframe{flex:1;border:0;width:100%}
.live-panel .live-help{padding:1rem}
</style>
<script>
document.addEventListener("click", function (event) {
  var button = event.target.closest(".live-open");
  if (!button) return;
  var root = document.documentElement.dataset.content_root || "./";
  var path = button.dataset.live;
  var url = root + "live/notebooks/index.html?path=" + encodeURIComponent(path);
  var panel = document.getElementById("live-panel");
  if (panel) panel.remove();
  panel = document.createElement("aside");
  panel.id = "live-panel";
  panel.className = "live-panel";
  panel.setAttribute("aria-label", "Live code");
  var header = document.createElement("header");
  var title = document.createElement("strong");
  title.textContent = button.dataset.title;
  var open = document.createElement("a");
  open.href = url;
  open.target = "_blank";
  open.textContent = "Open in a new tab";
  var close = document.createElement("button");
  close.type = "button";
  close.textContent = "Close";
  close.addEventListener("click", function () { panel.remove(); button.focus(); });
  header.append(title, open, close);
  panel.append(header);
  if (location.protocol === "file:") {
    var help = document.createElement("div");
    help.className = "live-help";
    help.innerHTML = "<p>The live code runs in a Python that this site serves to your browser, "
      + "and a page opened from a file cannot start it. Serve the book instead: in the "
      + "book's repository run <code>nox -s serve</code>, or <code>python -m http.server "
      + "--directory docs/_build/html</code>, and open this page from "
      + "<code>http://127.0.0.1:8000/</code>.</p>";
    panel.append(help);
  } else {
    var frame = document.createElement("iframe");
    frame.src = url;
    frame.title = "Live notebook: " + button.dataset.title;
    panel.append(frame);
  }
  document.body.append(panel);
  close.focus();
});
</script>
"""


def _has_live_cells(doctree: nodes.document) -> bool:
    for node in doctree.findall(nodes.container):
        if "live" in node.get("cell_metadata", {}).get("tags", []):
            return True
    return False


def _add_launcher(app: Sphinx, doctree: nodes.document) -> None:
    """Put the chapter's "Run the code live" button under its title, and the panel's script."""
    docname = app.env.docname
    has_exercises = bool(app.env.__dict__.get("live_exercises", {}).get(docname))
    if not (_has_live_cells(doctree) or has_exercises):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    chapter = Path(docname).name
    button = (
        f'<p class="live-launch"><button type="button" class="live-open" data-live="{chapter}.ipynb"'
        f' data-title="{html.escape(_title(app, docname))}, live">Run this chapter\'s code live'
        " in your browser</button></p>"
    )
    title_index = next(
        (i for i, child in enumerate(section.children) if isinstance(child, nodes.title)), 0
    )
    section.insert(title_index + 1, nodes.raw("", button + PANEL, format="html"))


def _purge(_app: Sphinx, env: Any, docname: str) -> None:
    env.__dict__.setdefault("live_exercises", {}).pop(docname, None)


def _merge(_app: Sphinx, env: Any, _docnames: Any, other: Any) -> None:
    env.__dict__.setdefault("live_exercises", {}).update(other.__dict__.get("live_exercises", {}))


def _title(app: Sphinx, docname: str) -> str:
    title = app.env.titles.get(docname)
    return title.astext() if title is not None else docname


def live_notebooks(app: Sphinx) -> dict[str, nbformat.NotebookNode]:
    """Every live notebook of the book, by file name."""
    exercises: dict[str, list[str]] = app.env.__dict__.get("live_exercises", {})
    books: dict[str, nbformat.NotebookNode] = {}
    for docname in sorted(app.env.found_docs):
        if not docname.startswith("chapters/"):
            continue
        nb = notebook(app, docname)
        if nb is not None:
            keys = exercises.get(docname, [])
            books.update(chapter_notebooks(nb, Path(docname).name, _title(app, docname), keys))
    return books


def chapter_notebooks(
    nb: nbformat.NotebookNode, chapter: str, title: str, keys: list[str]
) -> dict[str, nbformat.NotebookNode]:
    """A chapter's live notebooks by file name: its tagged cells and exercises, and each exercise.

    ``nb`` is the chapter as :func:`notebooks.notebook` converts it; ``keys`` are its
    exercises' keys. Empty if the chapter has neither live cells nor exercises.
    """
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    first_code = next((c for c in code if c.source != PREAMBLE_CODE), None)
    live = [cell for cell in code if "live" in cell.metadata.get("tags", [])]
    if not live and not keys:
        return {}
    books: dict[str, nbformat.NotebookNode] = {}
    chapter_setup = browser_setup(first_code.source) if first_code is not None else ""
    cells = [nbformat.v4.new_markdown_cell(INTRO.format(title=title))]
    cells.append(nbformat.v4.new_code_cell(SETUP + "\n" + PREAMBLE_CODE))
    cells.append(nbformat.v4.new_code_cell(chapter_setup))
    heading = None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = [line for line in cell.source.splitlines() if line.startswith("#")]
            heading = lines[-1] if lines else heading
        elif any(cell is c for c in live):
            if heading:
                cells.append(nbformat.v4.new_markdown_cell(heading))
                heading = None
            cells.append(nbformat.v4.new_code_cell(cell.source))
    for key in keys:
        exercise_cells = _exercise_cells(key, title)
        books[f"{chapter}--{key.partition('.')[2]}.ipynb"] = _notebook(
            [nbformat.v4.new_code_cell(SETUP), *exercise_cells]
        )
        cells.extend(exercise_cells)
    books[f"{chapter}.ipynb"] = _notebook(cells)
    return books


def _exercise_cells(key: str, title: str) -> list[nbformat.NotebookNode]:
    exercise = get(key)
    constant = next(
        name
        for name, value in vars(sys.modules[f"tinyformer.exercises.{exercise.chapter}"]).items()
        if value is exercise
    )
    check = f"from tinyformer.exercises.{exercise.chapter} import {constant}\n\n{constant}.check({exercise.name})"
    return [
        nbformat.v4.new_markdown_cell(EXERCISE_INTRO.format(name=exercise.name, title=title)),
        nbformat.v4.new_code_cell("import numpy as np\n\n" + exercise.stub.rstrip()),
        nbformat.v4.new_code_cell(check),
    ]


def _notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def _write_contents(app: Sphinx, contents: Path) -> None:
    if contents.exists():
        shutil.rmtree(contents)
    shutil.copytree(
        PACKAGE, contents / "tinyformer", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    for name, nb in live_notebooks(app).items():
        nbformat.validate(nb)
        (contents / name).write_text(nbformat.writes(nb) + "\n", encoding="utf-8")


def _digest(contents: Path) -> str:
    h = hashlib.sha256(json.dumps(SETTINGS, sort_keys=True).encode())
    for package in ("jupyterlite-core", "jupyterlite-xeus-python"):
        h.update(f"{package}={version(package)}\n".encode())
    for path in sorted(contents.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(contents)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _listing(folder: Path) -> list[tuple[str, int]]:
    """Every file under ``folder`` with its size (empty if there is no folder)."""
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file()
    )


def _publish(site: Path, published: Path) -> None:
    """Replace the HTML's copy of the live site by the built one."""
    shutil.rmtree(published, ignore_errors=True)
    shutil.copytree(site, published)


@dataclass
class _LiteBuild:
    """A ``jupyter lite build`` started when reading ends and waited for when the build ends."""

    process: subprocess.Popen[bytes] | None  # None: the site was up to date
    contents: Path
    output: Path
    stamp: Path
    digest: str
    log: Path


_STARTED: dict[str, _LiteBuild] = {}  # by HTML output folder
_OWNER = os.getpid()  # Sphinx's process (its forked writers must not touch the builds)


def _stop(started: _LiteBuild | None) -> None:
    """Stop a site build still running (a build that ended early has no use for it)."""
    if started is not None and started.process is not None and started.process.poll() is None:
        started.process.kill()
        started.process.wait()


@atexit.register
def _stop_all() -> None:
    # Sphinx stopped by Ctrl-C (KeyboardInterrupt) or sys.exit ends without build-finished:
    # stop its site builds, or one would go on writing into the folder the next build writes
    # to. (A SIGTERM or SIGKILL skips this; the orphan then ends on its own within seconds.)
    if os.getpid() == _OWNER:
        for started in _STARTED.values():
            _stop(started)


def _start_lite(app: Sphinx, _env: Any) -> None:
    """Write the live contents and start building their site, beside Sphinx's writing.

    Everything the site holds is known once the pages are read (the notebooks come from the
    sources, the package from src/), so the site builds while Sphinx writes the pages: a build
    that changed one chapter used to wait the 3.7 s of ``jupyter lite build`` after writing.
    """
    if app.builder.format != "html":
        return
    build = Path(app.outdir).parent
    contents = build / "live-contents"
    _write_contents(app, contents)
    # JupyterLite builds in a folder of its own, and the site is then copied into the HTML:
    # it sets the time of every file in the folder around its working folder to
    # SOURCE_DATE_EPOCH, which, run beside the HTML, made Sphinx's next build rewrite every
    # page (Sphinx's record of the last build looked older than the theme's templates).
    output = build / "live" / "site"
    stamp = build / "live-digest.txt"
    log = build / "live" / "build.log"
    digest = _digest(contents)
    started = _LiteBuild(None, contents, output, stamp, digest, log)
    _STARTED[str(app.outdir)] = started
    if output.is_dir() and stamp.exists() and stamp.read_text() == digest:
        return
    stamp.unlink(missing_ok=True)
    lite_dir = build / "live" / "lite"
    shutil.rmtree(lite_dir, ignore_errors=True)
    lite_dir.mkdir(parents=True)
    (lite_dir / "overrides.json").write_text(json.dumps(SETTINGS, indent=2), encoding="utf-8")
    shutil.rmtree(output, ignore_errors=True)
    command = [
        sys.executable, "-m", "jupyterlite_core", "build",
        "--contents", str(contents),
        "--output-dir", str(output),
        "--disable-addons", "jupyterlite-xeus-python",
        "--apps", "notebooks",
        "--no-sourcemaps", "--no-unused-shared-packages",
    ]  # fmt: skip
    # JupyterLite stamps its files with SOURCE_DATE_EPOCH when set, and refuses 0 (which the
    # book's sessions set, for Sphinx): one second after the epoch is as reproducible.
    env = dict(os.environ)
    if env.get("SOURCE_DATE_EPOCH") == "0":
        env["SOURCE_DATE_EPOCH"] = "1"
    with log.open("wb") as out:
        started.process = subprocess.Popen(
            command, cwd=lite_dir, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def _build_lite(app: Sphinx, exception: Exception | None) -> None:
    """Wait for the site started by :func:`_start_lite`, check it, and copy it into the HTML."""
    started = _STARTED.pop(str(app.outdir), None)
    if started is None:
        return
    process = started.process
    if exception is not None:
        _stop(started)
        return
    published = Path(app.outdir) / LIVE_DIR
    if process is None:
        if _listing(published) != _listing(started.output):  # the HTML's copy lost a file
            _publish(started.output, published)
        LOGGER.info("live: the in-browser site is up to date")
        return
    try:
        code = process.wait()
    except BaseException:  # Ctrl-C while waiting: the site's build is stopped too
        _stop(started)
        raise
    if code != 0:
        output = started.log.read_text(encoding="utf-8", errors="replace")
        raise RuntimeError(f"jupyter lite build failed ({started.log}):\n{output[-6000:]}")
    index = started.output / "api" / "contents" / "all.json"
    listed = (
        {item["name"] for item in json.loads(index.read_text())["content"]}
        if index.exists()
        else set()
    )
    missing = sorted({p.name for p in started.contents.glob("*.ipynb")} - listed)
    if missing:
        raise RuntimeError(
            f"jupyter lite build: the contents index lacks {missing} (is jupyter_server installed?)"
        )
    _publish(started.output, published)
    started.stamp.write_text(started.digest)
    LOGGER.info("live: built the in-browser site in %s", published)


def setup(app: Sphinx) -> dict[str, object]:
    """Register the directive, and the live site's build (started after reading, ended last)."""
    app.add_directive("live-exercise", LiveExercise)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("doctree-read", _add_launcher)
    app.connect("env-updated", _start_lite)
    app.connect("build-finished", _build_lite)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
