"""The live mode: each chapter's code and exercises, run by the in-browser Python.

The static checks read the built site: every chapter has a live notebook with at least one
exercise, JupyterLite's contents index lists them, and each notebook runs in a Python without
the modules the browser lacks (scripts/live_check.py). The browser check opens a chapter in
headless Chromium, makes sure nothing of the live runtime loaded before the reader asks, starts
the live mode, runs the chapter's cells in WebAssembly and compares a cell's output with the
one the build computed; then answers an exercise wrongly and rightly and reads the verdicts.
``nox -s browser`` runs it with the network cut (its own network namespace), and every request
that would leave 127.0.0.1 fails the test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "chapters/attention"
# The cell compared with the build's output: it imports tinyformer's masks and prints them.
COMPARED = "print(causal_mask(6).astype(int))"
EXERCISE = "attention--masked_attention.ipynb"
WRONG = """\
import numpy as np


def masked_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + np.where(mask, 0.0, -1e9)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    return weights @ v, weights
"""
RIGHT = """\
import numpy as np


def masked_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ v, weights
"""


def _live_check():
    spec = importlib.util.spec_from_file_location("live_check", ROOT / "scripts" / "live_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _contents(html_root: Path) -> set[str]:
    index = html_root / "live" / "api" / "contents" / "all.json"
    assert index.is_file(), f"{index} is missing: the build did not make the live site"
    return {item["name"] for item in json.loads(index.read_text())["content"]}


def test_every_chapter_has_a_live_notebook_and_exercise(html_root):
    listed = _contents(html_root)
    problems = []
    for page in sorted((html_root / "chapters").glob("*.html")):
        html = page.read_text(encoding="utf-8")
        chapter = page.stem
        if f'data-live="{chapter}.ipynb"' not in html:
            problems.append(f"{page.name}: no 'run live' button")
        exercises = re.findall(rf'data-live="({chapter}--\w+\.ipynb)"', html)
        if not exercises:
            problems.append(f"{page.name}: no live exercise")
        for name in [f"{chapter}.ipynb", *exercises]:
            if name not in listed or not (html_root / "live" / "files" / name).is_file():
                problems.append(f"{page.name}: {name} is not served by the live site")
    assert not problems, "\n".join(problems)


def test_live_site_serves_this_package(html_root):
    served = html_root / "live" / "files" / "tinyformer"
    source = ROOT / "src" / "tinyformer"
    for path in sorted(source.rglob("*.py")):
        copy = served / path.relative_to(source)
        assert copy.is_file(), f"{copy} is missing"
        assert copy.read_bytes() == path.read_bytes(), f"{copy} is stale"


def test_live_notebooks_run_without_what_the_browser_lacks(html_root):
    run_notebook = _live_check().run_notebook
    problems = []
    for path in sorted((html_root / "live" / "files").glob("*.ipynb")):
        records = run_notebook(json.loads(path.read_text(encoding="utf-8")))
        problems += [
            f"{path.name}, cell {r['index']}:\n{r['error']}" for r in records if r["error"]
        ]
    assert not problems, "\n\n".join(problems)


def test_network_is_cut_when_required():
    """Under ``nox -s browser`` with BOOK_REQUIRE_OFFLINE=1 (as in CI) nothing off the machine answers."""
    if os.environ.get("BOOK_REQUIRE_OFFLINE") != "1":
        pytest.skip("the network need not be cut (BOOK_REQUIRE_OFFLINE is not 1)")
    assert os.environ.get("BOOK_OFFLINE") == "1", "not run through scripts/without_network.py"
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
        pytest.raises(OSError, match="unreachable"),
    ):
        sock.connect(("192.0.2.1", 9))


def _frame(page, name: str):
    page.wait_for_function(
        "name => [...document.querySelectorAll('#live-panel iframe')].some(f => f.src.includes(name))",
        arg=name,
    )
    for _ in range(200):
        frames = [f for f in page.frames if "live/notebooks" in f.url and name in f.url]
        if frames:
            return frames[0]
        page.wait_for_timeout(100)
    raise AssertionError(f"no live frame for {name}")


def _run_cells(page, frame) -> int:
    """Run every cell of the open notebook (Run > Run All Cells); returns how many code cells."""
    frame.wait_for_selector(".jp-Notebook .jp-CodeCell")
    page.wait_for_timeout(1000)  # the menu bar takes clicks once the notebook is drawn
    code = frame.evaluate("document.querySelectorAll('.jp-CodeCell').length")
    frame.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    frame.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    # Every code cell has run when each shows its execution count, [1], [2]...
    frame.wait_for_function(
        """n => {
          const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
          return prompts.length === n && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""",
        arg=code,
        timeout=240_000,
    )
    return code


def _cell_output(frame, start: str) -> str:
    return frame.evaluate(
        """start => {
          for (const cell of document.querySelectorAll('.jp-CodeCell')) {
            const source = cell.querySelector('.jp-InputArea-editor').textContent;
            if (source.startsWith(start)) return cell.querySelector('.jp-OutputArea').textContent;
          }
          return null;
        }""",
        start,
    )


def _page_output(page, start: str) -> str:
    return page.evaluate(
        """start => {
          for (const cell of document.querySelectorAll('div.cell')) {
            const source = cell.querySelector('.cell_input pre');
            if (source && source.textContent.startsWith(start))
              return cell.querySelector('.cell_output').innerText;
          }
          return null;
        }""",
        start,
    )


PROMPT = re.compile(r"^\s*\[\d+\]:\s*")  # an output's "[5]:", which the page does not show


def _words(text: str | None) -> list[str]:
    return PROMPT.sub("", text or "").split()


CHAPTERS = sorted(p.stem for p in (ROOT / "docs" / "chapters").glob("*.md"))
# A cell per chapter whose output in the browser is compared with the build's (they compute
# the same thing with NumPy 1.25 in WebAssembly and the build's NumPy): the first line of its code.
COMPARED_CELLS = {"attention": COMPARED}


# The chapters whose live notebook the browser check runs in WebAssembly (every chapter's runs
# in CPython above, without what the browser lacks): attention, whose output is compared with
# the build's; real_text, whose counting once failed only there (np.bincount takes the
# platform's index type, int32 in a 32-bit WebAssembly build); residuals, the heaviest cell;
# training. BOOK_LIVE_ALL=1 runs every chapter (about 25 s each on the 2-core machine).
IN_BROWSER = (
    CHAPTERS
    if os.environ.get("BOOK_LIVE_ALL") == "1"
    else ["attention", "real_text", "residuals", "training"]
)


@pytest.mark.parametrize("chapter", IN_BROWSER)
def test_live_mode_runs_the_chapter_in_the_browser(visit, chapter):
    """The chapter's live notebook runs to the end in the in-browser Python without an error."""
    visit_ = visit(f"chapters/{chapter}.html")
    page = visit_.page
    before = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert not [u for u in before if "/live/" in u], (
        "the live runtime loaded before it was asked for"
    )
    page.get_by_role("button", name=re.compile("Run this chapter's code live")).click()
    frame = _frame(page, f"{chapter}.ipynb")
    n_code = _run_cells(page, frame)
    outputs = [
        frame.locator(".jp-OutputArea").nth(i).inner_text()
        for i in range(frame.locator(".jp-OutputArea").count())
    ]
    tracebacks = [text for text in outputs if "Traceback (most recent call last)" in text]
    assert n_code >= 3
    assert not tracebacks, tracebacks
    start = COMPARED_CELLS.get(chapter)
    if start is not None:
        live = _cell_output(frame, start)
        built = _page_output(page, start)
        assert built, f"the chapter shows no output for {start!r}"
        assert _words(live) == _words(built), f"in the browser:\n{live}\nin the build:\n{built}"
    assert not visit_.off_host_requests, visit_.off_host_requests


def _answer(page, frame, code: str) -> str:
    """Replace the stub cell's code by ``code``, run it and the check; the check's output."""
    editor = frame.locator(".jp-CodeCell .jp-InputArea-editor").nth(1)
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    check = frame.locator(".jp-CodeCell").nth(2)
    before = check.locator(".jp-InputPrompt").text_content()
    check.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    # Done when the check cell shows a new execution count and a verdict.
    frame.wait_for_function(
        """before => {
          const cell = document.querySelectorAll('.jp-CodeCell')[2];
          const prompt = cell.querySelector('.jp-InputPrompt').textContent;
          const out = cell.querySelector('.jp-OutputArea').innerText;
          return prompt !== before && /\\[\\d+\\]/.test(prompt)
            && (out.includes('Right') || out.includes('Not yet'));
        }""",
        arg=before,
        timeout=120_000,
    )
    return PROMPT.sub(
        "", frame.locator(".jp-CodeCell").nth(2).locator(".jp-OutputArea").inner_text()
    )


def test_live_exercise_says_wrong_then_right(visit):
    visit_ = visit(f"{CHAPTER}.html")
    page = visit_.page
    page.locator(f'button[data-live="{EXERCISE}"]').click()
    frame = _frame(page, EXERCISE)
    _run_cells(page, frame)
    first = PROMPT.sub("", _cell_output(frame, "from tinyformer.exercises") or "")
    assert "Not answered yet" in first, first
    wrong = _answer(page, frame, WRONG)
    assert wrong.startswith("Not yet."), wrong
    assert "left-padded" in wrong, wrong
    assert "expected 0" in wrong, wrong
    right = _answer(page, frame, RIGHT)
    assert right.startswith("Right: `masked_attention`"), right
    assert not visit_.off_host_requests, visit_.off_host_requests


def test_live_mode_from_a_file_says_what_to_run(browser, html_root):
    page = browser.new_page()
    try:
        page.goto((html_root / f"{CHAPTER}.html").resolve().as_uri())
        page.get_by_role("button", name=re.compile("Run this chapter's code live")).click()
        text = page.locator("#live-panel").inner_text()
        assert "nox -s serve" in text, text
        assert "http://127.0.0.1:8000/" in text, text
        assert page.locator("#live-panel iframe").count() == 0
    finally:
        page.close()
