"""Sessions that test the package and build, check and serve the book.

Run ``nox -l`` to list them. Every session uses the Python that runs nox and
installs what it needs from ``pyproject.toml``'s dependency groups.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests", "docs"]

ROOT = Path(__file__).resolve().parent
DOCS = ROOT / "docs"
# BOOK_BUILD moves the build (HTML, caches, screenshots) elsewhere, e.g. for a second
# build of the same tree at the same time; docs/conf.py reads it too.
BUILD = Path(os.environ.get("BOOK_BUILD", DOCS / "_build")).resolve()
HTML = BUILD / "html"
FIGURES = DOCS / "_static" / "figures"
SCRIPTS = ROOT / "scripts"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
PYPROJECT_SHA256 = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()

# Fixed settings for the processes a session starts: deterministic hashing and
# file dates, and (for scripts and tests) matplotlib's file-only backend.
# The book's training runs are stored in STORE (see tinyformer.experiments.store), shared by
# the tests, the figure scripts and the chapters (and by builds into another BOOK_BUILD: the
# store is safe for concurrent use), and computed once per version of the package.
STORE = Path(os.environ.get("TINYFORMER_STORE", DOCS / "_build" / "experiments")).resolve()
# Python may cache compiled modules (beside the sources, in __pycache__, ignored by git) even
# where the machine turns that off (PYTHONDONTWRITEBYTECODE=1, as on the book's machines):
# without it every process compiled tinyformer again, and every pytest worker rewrote and
# compiled the hundred test files again (collecting the tests: 9.0 s -> 2.8 s per worker;
# importing tinyformer and its models: 1.5 s -> 0.4 s). None: nox removes the variable.
ENV: dict[str, str | None] = {
    "PYTHONHASHSEED": "0",
    "SOURCE_DATE_EPOCH": "0",
    "TINYFORMER_STORE": str(STORE),
    "PYTHONDONTWRITEBYTECODE": None,
}
# Every conclusion a chapter asserts with tinyformer.claims.claim is appended here when its
# chapter executes; the docs session lists them with their margins (see _report_claims).
CLAIMS = BUILD / "claims.jsonl"
# Builds and tests run two processes at a time (Sphinx's parallel readers, pytest-xdist) on
# the two-core machines the book is built on; a BLAS that also starts a thread per core then
# oversubscribes the CPU, which made single figure scripts 50x slower on a busy machine. They
# use one BLAS thread each unless the caller set a count (the benchmarks choose their own).
ONE_THREAD = {
    name: os.environ.get(name, "1")
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
}
SCRIPT_ENV = {**ENV, **ONE_THREAD, "MPLBACKEND": "Agg"}
# pytest on every core; a worker that runs out of tests takes some of another's (worksteal),
# so one long test picked up late does not leave a core idle at the end (87-90 s -> 85-86 s).
PARALLEL = ["--numprocesses", "auto", "--dist", "worksteal"]


def _group(name: str) -> list[str]:
    return list(nox.project.dependency_groups(PYPROJECT, name))


def _install(session: nox.Session, *args: str) -> None:
    """``session.install(*args)``, unless this environment installed the same already.

    pip takes 5-10 s to find that nothing is to be installed, on every build; an author's
    rebuild should not wait for it. A stamp in the environment records each install by
    its arguments and pyproject.toml's bytes (which the package's own dependencies come
    from), so a changed requirement installs again; a new environment (``nox -N``, or the
    folder deleted) has no stamps. A failed install leaves none. A stamp cannot see what
    was changed in the environment by hand: ``nox -N`` makes it anew.
    """
    key = hashlib.sha256("\0".join([PYPROJECT_SHA256, *args]).encode()).hexdigest()[:16]
    location = getattr(session.virtualenv, "location", None)
    stamp = Path(location) / "installed-by-noxfile" / key if location else None
    if stamp is not None and stamp.is_file():
        session.log(f"installed already (stamp {key}): {' '.join(args)}")
        return
    session.install(*args)
    if stamp is not None:
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(" ".join(args) + "\n")


def _install_package(session: nox.Session, *groups: str, extra: tuple[str, ...] = ()) -> None:
    deps = [req for group in groups for req in _group(group)]
    _install(session, "-e", str(ROOT), *deps, *extra)


def _numpy_floor() -> str:
    """The oldest NumPy pyproject.toml allows ("numpy>=X.Y" -> "X.Y")."""
    for requirement in PYPROJECT["project"]["dependencies"]:
        name, _, floor = requirement.partition(">=")
        if name.strip() == "numpy":
            return floor.split(",")[0].split(";")[0].strip()
    raise ValueError("pyproject.toml: no 'numpy>=' dependency")


def _test_suite(session: nox.Session, *pytest_args: str) -> None:
    """Install the test tools and PyTorch's CPU build, store the book's runs, run pytest."""
    _install_package(session, "test")
    try:
        _install(session, *_group("reference"))
    except CommandFailed:
        session.warn("PyTorch could not be installed: the reference tests will be skipped")
    offset = _precompute_runs(session)
    session.run("pytest", *PARALLEL, *pytest_args, *session.posargs, env=SCRIPT_ENV)
    _report_runs(session, offset)


@nox.session(venv_backend="virtualenv")
def tests(session: nox.Session) -> None:
    """Run the whole test suite in parallel, PyTorch reference tests included.

    PyTorch's CPU build is installed with pip (which finds its wheel on disk on
    the book's machines, where uv would download a CUDA build); where it cannot
    be installed the session says so and the reference tests skip. The book's
    training runs come from the experiment store the book's build uses:
    computed here first (two at a time) if this version of the package has not
    stored them yet. ``nox -s coverage`` runs the same tests with a coverage report.
    """
    _test_suite(session)


@nox.session(venv_backend="virtualenv")
def coverage(session: nox.Session) -> None:
    """``nox -s tests`` with a report of the lines and branches of src/ the tests never ran.

    A session of its own because measuring coverage makes the suite about 45% slower
    (203.6 s against 141.3 s for pytest on two cores here, branch coverage on Python 3.11's
    tracer), and the report is read when tests are written, not at every change.
    """
    _test_suite(session, "--cov=tinyformer", "--cov-report=term-missing:skip-covered")


@nox.session(venv_backend="virtualenv")
@nox.parametrize("version", ["oldest", "newest"])
def numpy(session: nox.Session, version: str) -> None:
    """Run the unit tests on the oldest NumPy tinyformer supports, or on the newest.

    The oldest is the floor in pyproject.toml, the NumPy of the book's in-browser Python
    (1.25); ``nox -s tests`` runs with whatever NumPy pip picks, the newest on a fresh machine.
    The slow tests, which check the book's stored training runs, and the PyTorch reference
    tests are left to ``nox -s tests``: a run is stored per NumPy version, so here they would
    train all of them again. ``nox -s "numpy(oldest)"`` runs one version.
    """
    pin = f"numpy=={_numpy_floor()}.*" if version == "oldest" else "numpy"
    _install_package(session, "test", extra=(pin,))
    if version == "newest":
        session.install("--upgrade", "numpy")
    session.run("python", "-c", "import numpy; print('NumPy', numpy.__version__)")
    store = Path(session.create_tmp()) / "experiments"
    session.run(
        "pytest", *PARALLEL, "-p", "no:cacheprovider",
        "-m", "not book and not slow and not reference", *session.posargs,
        env={**SCRIPT_ENV, "TINYFORMER_STORE": str(store)},
    )  # fmt: skip


@nox.session(venv_backend="virtualenv")
def reference(session: nox.Session) -> None:
    """Run the reference tests against PyTorch's CPU build (pip finds its wheel on disk here)."""
    _install_package(session, "test", "reference")
    session.run("pytest", "-m", "reference", *session.posargs, env=SCRIPT_ENV)


def _make_figures(session: nox.Session, *, force: bool = False) -> None:
    """Bring docs/_static/figures up to date with ``scripts/fig_*.py`` (see scripts/make_figures.py).

    All scripts run in one Python process; a script runs only when its source,
    the package or a library version changed since it last ran (unless
    ``force``). Files whose bytes did not change are left untouched, so Sphinx
    does not re-read the pages that show them.
    """
    command = ["python", str(SCRIPTS / "make_figures.py"), "--out-dir", str(FIGURES)]
    command += ["--stamps", str(BUILD / "figure-stamps")]
    session.run(*command, *(["--force"] if force else []), env=SCRIPT_ENV)


@nox.session
def figures(session: nox.Session) -> None:
    """Regenerate every figure under docs/_static/figures from scripts/ (all of them, always)."""
    _install_package(session, "figures")
    _make_figures(session, force=True)


def _precompute_runs(session: nox.Session) -> int:
    """Compute every training run the book shows that is not stored yet, two at a time.

    Runs stored already are not loaded (``--missing``): their reports were printed when
    they were trained, and loading all of them again took 13 s of every build. Returns
    where the experiment store's log ended before, for :func:`_report_runs`.
    """
    log = STORE / "log.txt"
    offset = log.stat().st_size if log.is_file() else 0
    session.run(
        "python", "-m", "tinyformer.experiments",
        "--book", "--jobs", "2", "--prune", "--missing", env=ENV,
    )  # fmt: skip
    return offset


def _report_runs(session: nox.Session, offset: int) -> None:
    """Print what the experiment store did in this session: each run computed at most once."""
    log = STORE / "log.txt"
    if not log.is_file():
        return
    with log.open(encoding="utf-8") as file:
        file.seek(offset)
        lines = file.read().splitlines()
    computed = [line for line in lines if " computed " in line]
    session.log(
        f"experiment store: {len(computed)} run(s) computed, "
        f"{sum(' loaded ' in line for line in lines)} load(s), "
        f"{sum(' discarded ' in line for line in lines)} discarded"
    )
    for line in lines:
        session.log(f"  {line}")
    names = [line.split("[", 1)[1].split("]", 1)[0] for line in computed]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        session.error(f"runs computed more than once in one build: {twice}")


def _kernel_quiet(session: nox.Session) -> None:
    """Keep the notebook kernels' own start-up chatter out of the build log.

    ipykernel warns at every start that its local TCP sockets are unencrypted;
    this config (read only by kernels of this session's environment) keeps
    kernel log lines to errors. Cell output and tracebacks are unaffected.
    """
    config = Path(session.virtualenv.location) / "etc" / "ipython"
    config.mkdir(parents=True, exist_ok=True)
    (config / "ipython_kernel_config.json").write_text(
        json.dumps({"IPKernelApp": {"log_level": "ERROR"}})
    )


def _doctrees(out: Path) -> Path:
    """Where Sphinx keeps its pickled pages for the output folder ``out`` (outside it)."""
    return out.parent / "doctrees" / out.name


def _sphinx(
    session: nox.Session,
    builder: str,
    out: Path,
    *extra: str,
    env: dict | None = None,
    **kw: object,
) -> None:
    session.run(
        "sphinx-build",
        "--builder",
        builder,
        "--fail-on-warning",
        "--keep-going",
        "--nitpicky",
        "--jobs",
        "auto",
        # Sphinx's pickles go beside the output, not into it: a published folder carries none.
        "--doctree-dir",
        str(_doctrees(out)),
        str(DOCS),
        str(out),
        *extra,
        env={**ENV, **ONE_THREAD, "TINYFORMER_CLAIMS_LOG": str(CLAIMS), **(env or {})},
        **kw,
    )


def _install_book_tools(session: nox.Session) -> None:
    """The package with the docs group, the reference group where it installs, quiet kernels."""
    _install_package(session, "docs")
    try:
        _install(session, *_group("reference"))
    except CommandFailed:
        session.warn("PyTorch could not be installed: pages cannot compare with transformers")
    _kernel_quiet(session)


# What the last successful `nox -s docs` was built from, and what it left in HTML.
BOOK_STAMP = BUILD / "book-inputs.txt"
# Written by the build itself, from files that are hashed: the API pages (from docs/api.md
# and the package) and the figures (from scripts/, the package and its stored runs).
_DERIVED = {DOCS / "api", FIGURES}
# Environment variables the build reads besides ENV and ONE_THREAD.
_READ_BY_BUILD = ("BOOK_URL", "TINYFORMER_PERTURB")


def _book_inputs(session: nox.Session) -> str:
    """A digest of everything `nox -s docs` builds the book from, or "" if it cannot say.

    The text of docs/ (less build folders and the generated API pages and figures), src/,
    scripts/, pyproject.toml and this file; the settings the build passes on; the Python
    and every package installed in the session's environment (by name and version), which
    the outputs depend on as the execution cache and the stored runs do. Arguments after
    ``--`` always build.
    """
    if session.posargs:
        return ""
    digest = hashlib.sha256()
    settings = {**ENV, **ONE_THREAD, **{k: os.environ.get(k, "") for k in _READ_BY_BUILD}}
    venv = Path(session.virtualenv.location)
    installed = sorted(p.name for p in venv.glob("lib/python*/site-packages/*.dist-info"))
    digest.update(json.dumps([settings, str(BUILD), str(venv), installed]).encode())
    digest.update((venv / "pyvenv.cfg").read_bytes())
    for top in (DOCS, ROOT / "src", SCRIPTS, ROOT / "pyproject.toml", ROOT / "noxfile.py"):
        for path in _source_files(top):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _source_files(top: Path) -> list[Path]:
    """The regular files under ``top`` that `_book_inputs` reads, in a fixed order.

    Build folders (``docs/_build*``, BUILD) and caches are not entered at all; links are
    skipped (editors' lock files are dangling ones), as are the files the build derives.
    """
    if top.is_file():
        return [top]
    found = []
    for folder, subfolders, files in os.walk(top):
        here = Path(folder)
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not (name.startswith("_build") or name == "__pycache__" or here / name == BUILD)
        )
        if here not in _DERIVED:
            found += [here / name for name in sorted(files) if not (here / name).is_symlink()]
    return found


def _html_listing() -> str:
    """A digest of every file's name, size and time in the HTML folder (the PDF aside)."""
    digest = hashlib.sha256()
    for path in sorted(HTML.rglob("*")):
        if path.is_file() and path.name != PDF_NAME:
            stat = path.stat()
            digest.update(f"{path.relative_to(HTML)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _up_to_date(inputs: str) -> bool:
    """Whether the last build was made from these inputs and its HTML is untouched since."""
    if not inputs or not BOOK_STAMP.is_file() or not (HTML / "index.html").is_file():
        return False
    return BOOK_STAMP.read_text() == f"{inputs}\n{_html_listing()}\n"


@nox.session(venv_backend="virtualenv")
def docs(session: nox.Session) -> None:
    """Regenerate the figures, then build the HTML book strictly (warnings are errors).

    Chapters execute at build time and their results are cached in
    docs/_build/.jupyter_cache: an unchanged chapter is not run again unless
    the tinyformer package changed. Pass ``-- -E`` to re-read every page. The log
    ends with every conclusion the chapters assert, with its margin. When nothing it
    is built from changed since its last build (:func:`_book_inputs`) and the HTML is
    as that build left it, it does nothing.

    The reference group (PyTorch's CPU build, ``transformers``, ``tokenizers``) is
    installed too, so a page can compare a model it exports with Hugging Face's
    (pip finds PyTorch's wheel on disk on the book's machines, hence virtualenv and
    pip here); where it cannot be installed, the session says so.
    """
    _install_book_tools(session)
    inputs = _book_inputs(session)
    if _up_to_date(inputs):
        session.log(
            "nothing the book is built from changed since its last build, and the built book is"
            f" as that build left it: nothing to do (delete {BOOK_STAMP.name} to build anyway)"
        )
        _report_claims(session, CLAIMS)
        session.log(f"The book is in {HTML / 'index.html'}")
        return
    BOOK_STAMP.unlink(missing_ok=True)  # until this build has succeeded
    times = {}
    started = time.perf_counter()
    offset = _precompute_runs(session)
    times["training runs"], started = time.perf_counter() - started, time.perf_counter()
    _make_figures(session)
    times["figures"], started = time.perf_counter() - started, time.perf_counter()
    _sphinx(session, "html", HTML, *session.posargs)
    times["sphinx"] = time.perf_counter() - started
    _report_runs(session, offset)
    _report_claims(session, CLAIMS)
    # benchmarks/bench_build.py reads this line
    session.log("timing: " + ", ".join(f"{name} {sec:.2f} s" for name, sec in times.items()))
    session.log(f"The book is in {HTML / 'index.html'}")
    if inputs and _book_inputs(session) == inputs:  # nothing was edited during the build
        BOOK_STAMP.write_text(f"{inputs}\n{_html_listing()}\n")


# The PDF of the whole book (nox -s pdf): its LaTeX build folder, and its name in the HTML folder,
# where every page's download menu links it (docs/_ext/book_pdf.py).
LATEX = BUILD / "latex"
PDF_NAME = "understanding-transformers.pdf"
# What the PDF needs from the system (Debian): XeLaTeX and latexmk, the fonts, pdftotext/pdfinfo.
TEX_PACKAGES = (
    "texlive-xetex texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended"
    " tex-gyre fonts-freefont-otf fonts-droid-fallback fonts-symbola latexmk xindy poppler-utils"
)


@nox.session(venv_backend="virtualenv")
def pdf(session: nox.Session) -> None:
    """Build the whole book as one PDF and put it in the HTML folder (after `nox -s docs`).

    Sphinx's LaTeX builder reads docs/book.md (index.md's parts and chapters, the back matter
    as appendices) with the tag ``pdf``; the chapters' outputs come from the execution cache
    that `nox -s docs` filled, so nothing is executed again. XeLaTeX typesets it (latexmk runs
    it until the cross-references settle); the PDF is copied beside index.html, where the
    download menu of every page links it. `nox -s browser` then checks with pdftotext that
    every chapter title and figure caption is in it. Needs Debian's TeX Live (TEX_PACKAGES).
    """
    missing = [tool for tool in ("xelatex", "latexmk", "pdftotext") if not shutil.which(tool)]
    if missing:
        session.error(f"{', '.join(missing)} not found: apt-get install {TEX_PACKAGES}")
    if not (HTML / "index.html").is_file():
        session.error("no built book found: run `nox -s docs` first (the PDF reuses its outputs)")
    _install_book_tools(session)
    started = time.perf_counter()
    _sphinx(session, "latex", LATEX, "-t", "pdf", *session.posargs)
    typeset = time.perf_counter()
    session.run(
        "make", "-C", str(LATEX), "all-pdf",
        env={"LATEXMKOPTS": "-interaction=nonstopmode -halt-on-error", "SOURCE_DATE_EPOCH": "0"},
        external=True, silent=True,
    )  # fmt: skip
    built = LATEX / PDF_NAME
    shutil.copyfile(built, HTML / PDF_NAME)
    info = subprocess.run(["pdfinfo", str(built)], check=True, capture_output=True, text=True)
    pages = next(line.split()[-1] for line in info.stdout.splitlines() if line[:6] == "Pages:")
    session.log(
        f"timing: sphinx {typeset - started:.2f} s, xelatex {time.perf_counter() - typeset:.2f} s"
    )
    session.log(
        f"The PDF ({pages} pages, {built.stat().st_size / 1e6:.1f} MB) is in {HTML / PDF_NAME}"
    )


@nox.session(name="docs-perturbed")
def docs_perturbed(session: nox.Session) -> None:
    """Build the book from runs whose initial weights all moved by one ulp; every assertion must hold.

    ``TINYFORMER_PERTURB=1`` moves every parameter of every stored run one unit in the
    last place before training (the store keeps those results apart), and the strict
    build executes every chapter afresh into its own folder (``<build>-perturbed``), so
    no conclusion can rest on a knife edge that a last-bit change would flip. The
    figures are the published ones: brought up to date first from the unperturbed
    runs (a fresh clone has none, and the strict build needs every image), never
    drawn from perturbed runs. Not part of CI: run it before calling the book's
    conclusions true.
    """
    _install_package(session, "docs")
    _kernel_quiet(session)
    _make_figures(session)  # the published figures, from the unperturbed runs
    build = BUILD.with_name(BUILD.name + "-perturbed")
    claims = build / "claims.jsonl"
    env = {
        "TINYFORMER_PERTURB": "1",
        "BOOK_BUILD": str(build),
        "TINYFORMER_CLAIMS_LOG": str(claims),
    }
    started = time.perf_counter()
    session.run(
        "python", "-m", "tinyformer.experiments", "--book", "--jobs", "2", env={**ENV, **env}
    )
    _sphinx(session, "html", build / "html", "-E", *session.posargs, env=env)
    _report_claims(session, claims)
    session.log(
        f"perturbed build passed in {time.perf_counter() - started:.0f} s: {build / 'html'}"
    )


def _report_claims(session: nox.Session, log: Path) -> None:
    """List every conclusion checked (the latest check of each), the narrowest margins first.

    ``room`` is how far the measured value lies beyond its bound; ``margin`` what the
    chapter required (at least the measurement's own spread). A chapter taken from the
    execution cache did not run, so its claims are those of its last execution.
    """
    if not log.is_file():
        session.log("claims: none recorded (no chapter executed)")
        return
    latest = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            latest[row["statement"]] = row
    rows = sorted(latest.values(), key=lambda r: r["room"] / r["margin"] if r["margin"] else 1e300)
    session.log(f"claims: {len(rows)} conclusions asserted with a margin (narrowest first)")
    for r in rows:
        ratio = f"{r['room'] / r['margin']:7.1f}x" if r["margin"] else "    n/a"
        session.log(
            f"  room {r['room']:.3g} >= margin {r['margin']:.3g} ({ratio}): {r['statement']}"
            f" [{r['value']:.6g} {r['relation']} {r['bound']:.6g}]"
        )


@nox.session
def serve(session: nox.Session) -> None:
    """Serve the book on http://127.0.0.1:8000 and rebuild it when a page or src/ changes."""
    _install_package(session, "serve")
    _kernel_quiet(session)
    _make_figures(session)
    session.run(
        "sphinx-autobuild",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--watch",
        str(ROOT / "src"),
        "--ignore",
        str(FIGURES),
        "--ignore",
        str(BUILD),  # what a build writes (the live pages' notebooks, caches) is not a change
        "--re-ignore",
        "__pycache__",  # compiled modules written by the build's processes are not a change
        "--nitpicky",
        "--doctree-dir",
        str(_doctrees(HTML)),
        str(DOCS),
        str(HTML),
        *session.posargs,
        env=ENV,
    )


@nox.session
def linkcheck(session: nox.Session) -> None:
    """Check every link: internal links and anchors always, external ones when online.

    External links that cannot be reached (no network) are listed as such and do
    not fail the session; a link that answers with an error does.
    """
    _install_package(session, "docs")
    _kernel_quiet(session)
    _make_figures(session)
    out = BUILD / "linkcheck"
    _sphinx(session, "linkcheck", out, success_codes=[0, 1])
    _report_external_links(session, out / "output.json")
    _install(session, *_group("browser"))
    session.run("pytest", "-m", "book", "tests/book/test_links.py", env={"BOOK_HTML": str(HTML)})


_UNREACHABLE = (
    "NameResolution",
    "Failed to resolve",
    "Max retries",
    "Connection",
    "timed out",
    "Temporary failure",
    "Network is unreachable",
)


def _report_external_links(session: nox.Session, report: Path) -> None:
    rows = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    broken = [r for r in rows if r["status"] == "broken"]
    unreachable = [r for r in broken if any(s in r["info"] for s in _UNREACHABLE)]
    failing = [r for r in broken if r not in unreachable]
    ok = sum(r["status"] == "working" for r in rows)
    session.log(
        f"external links: {ok} working, {len(unreachable)} unreachable, {len(failing)} broken"
    )
    for r in unreachable:
        session.warn(
            f"could not be reached (offline?): {r['uri']} ({r['filename']}:{r['lineno']})"
        )
    for r in failing:
        session.warn(f"broken: {r['uri']} ({r['filename']}:{r['lineno']}): {r['info']}")
    if failing:
        session.error(f"{len(failing)} broken link(s)")


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff's linter and formatter check."""
    _install(session, *_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def browser(session: nox.Session) -> None:
    """Open every page of the built book in headless Chromium and check it (needs `nox -s docs`).

    The book is served as a static host would serve it: under the sub-path of the address
    it is built for (``BOOK_URL``, see docs/conf.py), with its 404 page for a missing one.

    Fails on console errors, failed or off-host requests, images that did not
    load and unrendered math; on any axe-core accessibility violation or a page
    wider than the viewport (1280 and 390 px, light and dark); on a chapter not
    found in the top three search results for its title's main term; on a
    glossary definition missing on hover or focus; on an off-host address in
    the built files; and runs one downloaded notebook (so tinyformer is
    installed); starts the live mode of a chapter and runs its code and an exercise in the
    in-browser Python. It runs in a network namespace of its own where it can (``unshare
    --net``): nothing but 127.0.0.1 is reachable. Screenshots go to docs/_build/screenshots/.
    """
    if not (HTML / "index.html").is_file():
        session.error("no built book found: run `nox -s docs` first")
    _install_package(session, "browser")
    env = {
        "BOOK_HTML": str(HTML),
        "BOOK_SCREENSHOTS": str(BUILD / "screenshots"),
        "CHROMIUM": os.environ.get("CHROMIUM", "/usr/bin/chromium"),
    }
    # Two workers, each with its own server and Chromium: the pages are independent, and one
    # browser leaves a core idle while Python waits on it (BOOK_BROWSER_WORKERS=0: one process).
    workers = os.environ.get("BOOK_BROWSER_WORKERS", "2")
    command = ["pytest", "-m", "book", "-n", workers, "tests/book", *session.posargs]
    # With the network cut: a network namespace of its own, where only 127.0.0.1 answers
    # (needs root, or unprivileged user namespaces; BOOK_REQUIRE_OFFLINE=1 makes it required).
    offline = ["unshare", "--net", "python", str(SCRIPTS / "without_network.py")]
    if (
        shutil.which("unshare")
        and subprocess.run([*offline[:2], "true"], check=False).returncode == 0
    ):
        command = [*offline, *command]
    elif os.environ.get("BOOK_REQUIRE_OFFLINE") == "1":
        session.error("cannot cut the network (unshare --net failed) and BOOK_REQUIRE_OFFLINE=1")
    else:
        session.warn("unshare --net is not available: checking with the network on")
    session.run(*command, env=env)


@nox.session(venv_backend="virtualenv")
def benchmarks(session: nox.Session) -> None:
    """Time tinyformer against PyTorch's CPU build, side by side, and print the ratios.

    ``nox -s benchmarks -- --quick`` takes fewer repeats. Two scripts run on their own:
    ``bench_build.py`` times ``nox -s docs`` itself, and ``bench_versions.py`` compares
    two source trees of tinyformer (``--old`` and ``--new``).
    """
    _install_package(session, "reference")
    on_their_own = {"bench_build.py", "bench_versions.py"}
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        if script.name not in on_their_own:
            session.run("python", str(script), *session.posargs, env=ENV)
