"""Fixtures for checking the built book: a local HTTP server and headless Chromium.

The book is served from ``BOOK_HTML`` (default ``docs/_build/html``) on an
ephemeral port of 127.0.0.1, under the sub-path it is built to be published at (as a
static host serves a project's pages), with its 404 page for any missing address.
Chromium is Debian's (``CHROMIUM``, default ``/usr/bin/chromium``) driven by
Playwright; Playwright's own browser download is never used.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "docs" / "_build" / "html"))
SCREENSHOTS = Path(os.environ.get("BOOK_SCREENSHOTS", ROOT / "docs" / "_build" / "screenshots"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Flags for a root user on a machine with no outside network: no sandbox (root),
# and none of Chromium's background calls home.
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
]


# The first load of a page at a phone's width, compressed as a static host sends it (gzip),
# figures included: at most this many bytes (test_accessibility.py measures every page).
PAGE_WEIGHT_BUDGET = 1_000_000
PAGE_WEIGHTS = SCREENSHOTS / "page-weights.jsonl"


def book_pages() -> list[str]:
    """Every HTML page of the built book, relative to its root (assets and JupyterLite excluded)."""
    skip = {"_static", "_sources", "_images", "jupyter_execute", "live"}  # live: JupyterLite
    return sorted(
        p.relative_to(HTML).as_posix()
        for p in HTML.rglob("*.html")
        if not skip & set(p.relative_to(HTML).parts)
    )


def _require_book() -> None:
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run `nox -s docs` first", pytrace=False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run a test that takes ``page_path`` once for every page of the book."""
    if "page_path" in metafunc.fixturenames:
        # Collecting never fails; with no book built, the one placeholder case
        # fails when it runs (through the html_root fixture), saying what to do.
        metafunc.parametrize("page_path", book_pages() or ["(no book built)"])


@pytest.fixture(scope="session")
def html_root() -> Path:
    """Root folder of the built HTML book."""
    _require_book()
    return HTML


@pytest.fixture(scope="session")
def pdf_path(html_root: Path) -> Path:
    """Where ``nox -s pdf`` puts the whole book's PDF (noxfile.py's PDF_NAME); maybe not built."""
    return html_root / "understanding-transformers.pdf"


@pytest.fixture(scope="session")
def pdf_required() -> bool:
    """Whether a missing PDF is a failure (``BOOK_REQUIRE_PDF=1``, as in CI) or a skip."""
    return os.environ.get("BOOK_REQUIRE_PDF") == "1"


@pytest.fixture(scope="session")
def all_pages() -> list[str]:
    """Every page of the book, relative to the HTML root."""
    _require_book()
    return book_pages()


@pytest.fixture(scope="session")
def screenshots_dir() -> Path:
    """Where page screenshots are written."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


def site_prefix(html_root: Path) -> str:
    """The path the book is built to be published under (``/`` or ``/name/``), from its sitemap.

    The build writes ``sitemap.xml`` with the full address of every page (``BOOK_URL`` in
    docs/conf.py); the folder of the first page's address is where a host serves the book.
    """
    sitemap = html_root / "sitemap.xml"
    if not sitemap.is_file():
        pytest.fail(f"no sitemap.xml in {html_root}: the build must write one", pytrace=False)
    paths = [
        urlsplit(loc.text or "").path for loc in ElementTree.parse(sitemap).iterfind(".//{*}loc")
    ]
    first = [path for path in paths if path.endswith("/index.html")]
    if not first:
        pytest.fail(f"{sitemap} does not list the first page, index.html", pytrace=False)
    return min(first, key=len).removesuffix("index.html")


class _SubPathHandler(SimpleHTTPRequestHandler):
    """Serve the book's folder under ``prefix`` only, and 404.html for a missing page.

    As a static host does: an address outside the prefix, or one that names no file,
    gets status 404 and the book's 404 page.
    """

    prefix = "/"

    def log_message(self, format: str, *args: object) -> None:
        """Keep request logs out of the test output."""

    def translate_path(self, path: str) -> str:
        """The file for ``path`` under the prefix (a path outside it maps to no file)."""
        clean = urlsplit(path).path
        if not clean.startswith(self.prefix):  # no such file: the 404 page answers
            return str(Path(self.directory) / ".outside-the-site" / "missing")
        return super().translate_path("/" + clean[len(self.prefix) :])

    def send_error(self, code: int, message: str | None = None, explain: str | None = None):
        """Answer a missing file with the book's 404 page, as hosts do."""
        page = Path(self.directory) / "404.html"
        if code != 404 or not page.is_file():
            super().send_error(code, message, explain)
            return
        body = page.read_bytes()
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@pytest.fixture(scope="session")
def book_prefix(html_root: Path) -> str:
    """The path the book is built to be published under, such as ``/understanding-transformers/``."""
    return site_prefix(html_root)


@pytest.fixture(scope="session")
def server(html_root: Path, book_prefix: str) -> Iterator[str]:
    """Serve the built book on 127.0.0.1 under its publishing sub-path; yield its base URL."""
    prefix = book_prefix
    handler_class = type("Handler", (_SubPathHandler,), {"prefix": prefix})
    handler = functools.partial(handler_class, directory=str(html_root))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}{prefix}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Debian's headless Chromium, launched through Playwright."""
    from playwright import sync_api  # noqa: PLC0415  (only the browser session installs it)

    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Chromium not found at {CHROMIUM} (apt-get install chromium)", pytrace=False)
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@dataclass
class Visit:
    """A page open in its own browser context, with what went wrong while it loaded."""

    page: object
    context: object
    console_errors: list[str] = field(default_factory=list)
    off_host_requests: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Close the page's context."""
        self.context.close()


def block_off_host(context: object, record: list[str]) -> None:
    """Abort (and record) every request of ``context`` that would leave 127.0.0.1."""

    def route(request_route: object) -> None:
        url = request_route.request.url
        if url.startswith(("http:", "https:")) and urlsplit(url).hostname != "127.0.0.1":
            record.append(url)
            request_route.abort()
        else:
            request_route.continue_()

    context.route("**/*", route)


@pytest.fixture
def visit(browser, server) -> Iterator[Callable[..., Visit]]:
    """Open a page of the book (path relative to its root) in a fresh context; closed after."""
    opened: list[Visit] = []

    def open_page(path: str, *, width: int = 1280, height: int = 900) -> Visit:
        context = browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(120_000)
        result = Visit(page=None, context=context)
        block_off_host(context, result.off_host_requests)
        page = context.new_page()
        page.on(
            "console",
            lambda msg: result.console_errors.append(msg.text) if msg.type == "error" else None,
        )
        page.on("pageerror", lambda exc: result.console_errors.append(f"uncaught: {exc}"))
        page.goto(server + path, wait_until="networkidle")
        result.page = page
        opened.append(result)
        return result

    yield open_page
    for item in opened:
        item.close()


# Every address the page loaded (the document, then its resources) and every image it shows,
# loaded or not (an image further down may load only when scrolled to).
LOADED_ADDRESSES = """
() => [location.href]
  .concat(performance.getEntriesByType('resource').map(e => e.name))
  .concat(Array.from(document.images).map(img => img.currentSrc || img.src))
"""


@functools.cache
def gzipped_size(path: Path) -> int:
    """The bytes a host sends for ``path`` with gzip on (never more than the file itself)."""
    data = path.read_bytes()
    return min(len(data), len(gzip.compress(data, compresslevel=6, mtime=0)))


def page_weight(page: object, server: str, html_root: Path) -> dict[str, int]:
    """Gzipped bytes of every file of the book the open page loaded, by path under the root."""
    files: dict[str, int] = {}
    for address in page.evaluate(LOADED_ADDRESSES):
        if not address.startswith(server):
            continue  # off-host requests are blocked and reported by the tests themselves
        relative = urlsplit(address[len(server) :]).path or "index.html"
        path = html_root / (relative + "index.html" if relative.endswith("/") else relative)
        if path.is_file():
            files[path.relative_to(html_root).as_posix()] = gzipped_size(path)
    return files


@pytest.fixture
def weigh_page(server: str, html_root: Path) -> Callable[[object, str], list[str]]:
    """Measure an open page's weight, record it for the summary, and say if it is over budget."""

    def weigh(page: object, page_path: str) -> list[str]:
        files = page_weight(page, server, html_root)
        total = sum(files.values())
        heaviest = sorted(files.items(), key=lambda item: -item[1])
        line = {"page": page_path, "bytes": total, "files": len(files), "top": heaviest[:3]}
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        with PAGE_WEIGHTS.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        if total <= PAGE_WEIGHT_BUDGET:
            return []
        return [
            f"first load at 390 px: {total:,} bytes gzipped, over the budget of "
            f"{PAGE_WEIGHT_BUDGET:,}; heaviest: "
            + ", ".join(f"{name} {size:,}" for name, size in heaviest[:5])
        ]

    return weigh


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start a fresh record of page weights (in the controlling process only)."""
    if not hasattr(session.config, "workerinput"):
        PAGE_WEIGHTS.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print every page's first-load weight at 390 px, heaviest first."""
    if hasattr(config, "workerinput") or not PAGE_WEIGHTS.is_file():
        return
    rows = [json.loads(line) for line in PAGE_WEIGHTS.read_text(encoding="utf-8").splitlines()]
    rows.sort(key=lambda row: -row["bytes"])
    write = terminalreporter.write_line
    terminalreporter.section("first load at 390 px, gzipped (budget 1,000 KB)")
    for row in rows:
        top = ", ".join(f"{name} {size / 1000:.0f}" for name, size in row["top"])
        write(f"{row['bytes'] / 1000:7.0f} KB  {row['files']:3d} files  {row['page']}  ({top})")
