"""Open every page of the built book in headless Chromium and check what a reader sees."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.book

# MathJax renders asynchronously; wait for it before inspecting the page.
WAIT_FOR_MATHJAX = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    return true;
  }
  return false;
}
"""

UNLOADED_IMAGES = """
() => Array.from(document.images)
  .filter(img => !img.complete || img.naturalWidth === 0)
  .map(img => img.getAttribute('src'))
"""

# Every image has finished loading, successfully or not (UNLOADED_IMAGES then tells which failed).
IMAGES_SETTLED = "() => Array.from(document.images).every(img => img.complete)"

# A .math element is rendered when MathJax replaced its TeX with an mjx-container.
UNRENDERED_MATH = """
() => {
  const bad = [];
  for (const el of document.querySelectorAll('.math')) {
    if (!el.querySelector('mjx-container')) bad.push(el.textContent.slice(0, 80));
  }
  for (const err of document.querySelectorAll('mjx-merror')) {
    bad.push('TeX error: ' + (err.getAttribute('data-mjx-error') || err.textContent));
  }
  const text = document.querySelector('main') ? document.querySelector('main').innerText : '';
  for (const delim of ['\\\\(', '\\\\[', '$$']) {
    if (text.includes(delim)) bad.push('raw delimiter ' + delim + ' left in the text');
  }
  return bad;
}
"""


@dataclass
class PageProblems:
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    off_host_requests: list[str] = field(default_factory=list)


def open_page(browser, url: str, problems: PageProblems):
    """Open ``url`` in a fresh context that records errors and blocks off-host requests."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    # The API reference is long and typesets a lot of math: on a busy two-core machine its
    # load took more than Playwright's default 30 s once. Allow two minutes per step.
    context.set_default_timeout(120_000)

    def route(request_route):
        host = urlsplit(request_route.request.url).hostname
        if request_route.request.url.startswith(("http:", "https:")) and host != "127.0.0.1":
            problems.off_host_requests.append(request_route.request.url)
            request_route.abort()
        else:
            request_route.continue_()

    context.route("**/*", route)
    page = context.new_page()
    page.on(
        "console",
        lambda msg: problems.console_errors.append(msg.text) if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: problems.console_errors.append(f"uncaught: {exc}"))
    page.on(
        "requestfailed",
        lambda req: problems.failed_requests.append(f"{req.url}: {req.failure}"),
    )
    page.on(
        "response",
        lambda resp: (
            problems.failed_requests.append(f"{resp.url}: HTTP {resp.status}")
            if resp.status >= 400
            else None
        ),
    )
    page.goto(url, wait_until="networkidle")
    return context, page


def test_page_renders_cleanly(browser, server, screenshots_dir, page_path):
    problems = PageProblems()
    context, page = open_page(browser, server + page_path, problems)
    try:
        has_math = page.evaluate(WAIT_FOR_MATHJAX)
        page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
        # Images below the fold load after the scroll; wait for them (not for "networkidle",
        # which any other late request resets: once, on the 1 MB API page, it never came).
        page.wait_for_function(IMAGES_SETTLED)
        unloaded = page.evaluate(UNLOADED_IMAGES)
        unrendered = page.evaluate(UNRENDERED_MATH) if has_math else []
        if not has_math and page.locator(".math").count():
            unrendered = ["the page has math but MathJax did not load"]
        page.evaluate("() => { window.scrollTo(0, 0); document.activeElement.blur(); }")
        shot = screenshots_dir / (page_path.replace("/", "__") + ".png")
        page.screenshot(path=shot, full_page=True)
    finally:
        context.close()
    assert not problems.off_host_requests, f"requests left 127.0.0.1: {problems.off_host_requests}"
    assert not problems.failed_requests, f"failed requests: {problems.failed_requests}"
    assert not problems.console_errors, f"console errors: {problems.console_errors}"
    assert not unloaded, f"images that did not load: {unloaded}"
    assert not unrendered, f"math left unrendered: {unrendered}"
