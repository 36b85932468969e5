"""Fixtures for checking the built book: a local HTTP server and headless Chromium.

The book is served from ``BOOK_HTML`` (default ``docs/_build/html``) on an
ephemeral port of 127.0.0.1. Chromium is Debian's (``CHROMIUM``, default
``/usr/bin/chromium``) driven by Playwright; Playwright's own browser download is
never used.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

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


def book_pages() -> list[str]:
    """Every HTML page of the built book, relative to its root (assets excluded)."""
    skip = {"_static", "_sources", "_images", "jupyter_execute"}
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
def all_pages() -> list[str]:
    """Every page of the book, relative to the HTML root."""
    _require_book()
    return book_pages()


@pytest.fixture(scope="session")
def screenshots_dir() -> Path:
    """Where page screenshots are written."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep request logs out of the test output."""


@pytest.fixture(scope="session")
def server(html_root: Path) -> Iterator[str]:
    """Serve the built book on 127.0.0.1 and yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(html_root))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
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
