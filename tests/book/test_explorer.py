"""The attention explorer of the chapter on scaled dot-product attention, in headless Chromium.

The chapter's executed code cell writes tinyformer's attention weights for a few
reference settings into the explorer's ``data-reference`` attribute; the page's
script (docs/_static/explorer.js) must reproduce them, react to its sliders, and
do so without console errors or requests off 127.0.0.1.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.book

CHAPTER = "chapters/attention.html"
TOLERANCE = 1e-9

READ_WEIGHTS = """
root => Array.from(root.querySelectorAll('table.tf-weights tbody tr')).map(
  tr => Array.from(tr.querySelectorAll('td')).map(td => Number(td.dataset.value)))
"""


@pytest.fixture
def explorer_page(browser, server):
    """The chapter in a fresh browser context, with its console errors and off-host requests."""
    errors: list[str] = []
    off_host: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 900})

    def route(request_route):
        url = request_route.request.url
        if url.startswith(("http:", "https:")) and urlsplit(url).hostname != "127.0.0.1":
            off_host.append(url)
            request_route.abort()
        else:
            request_route.continue_()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.goto(server + CHAPTER, wait_until="networkidle")
    yield page, errors, off_host
    context.close()
    assert not errors, f"console errors: {errors}"
    assert not off_host, f"requests left 127.0.0.1: {off_host}"


def _explorer(page):
    root = page.locator(".tf-explorer")
    assert root.count() == 1, "the chapter must contain exactly one explorer"
    root.locator("table.tf-weights td").first.wait_for()
    return root


def _reference(root) -> list[dict]:
    return json.loads(root.get_attribute("data-reference"))


def _weights(root) -> list[list[float]]:
    return root.evaluate(READ_WEIGHTS)


def _set(root, name: str, value: float) -> None:
    """Move one slider as a reader would: set its value and fire its input event."""
    root.locator(f'input[type="range"][data-setting="{name}"]').fill(str(value))


def _set_all(root, settings: dict) -> None:
    for name, value in settings.items():
        _set(root, name, value)


def _largest_difference(a: list[list[float]], b: list[list[float]]) -> float:
    assert len(a) == len(b)
    assert all(len(r) == len(s) for r, s in zip(a, b, strict=True))
    return max(abs(x - y) for r, s in zip(a, b, strict=True) for x, y in zip(r, s, strict=True))


def test_self_check_reports_a_match_with_tinyformer(explorer_page):
    page, _, _ = explorer_page
    status = _explorer(page).locator(".tf-status")
    assert status.get_attribute("data-match") == "yes"
    assert "matches tinyformer: yes" in status.inner_text()


def test_controls_are_labelled_and_cover_both_matrices(explorer_page):
    page, _, _ = explorer_page
    root = _explorer(page)
    names = root.locator('input[type="range"]').evaluate_all(
        "inputs => inputs.map(i => i.dataset.setting)"
    )
    assert sorted(names) == sorted(f"{m}_{p}" for m in ("q", "k") for p in ("angle", "sx", "sy"))
    labels = root.locator("label").all_inner_texts()
    assert any("rotation" in text for text in labels)
    assert any("scale" in text for text in labels)


def test_moving_a_slider_changes_the_matrix_and_its_shown_value(explorer_page):
    page, _, _ = explorer_page
    root = _explorer(page)
    before = _weights(root)
    _set(root, "q_angle", 45)
    after = _weights(root)
    assert _largest_difference(before, after) > 0.01
    assert root.locator('output[data-setting="q_angle"]').inner_text() == "45°"
    shown = [float(t) for t in root.locator("table.tf-weights td").all_inner_texts()]
    flat = [x for row in after for x in row]
    assert all(abs(s - x) <= 0.005 for s, x in zip(shown, flat, strict=True))


def test_matrix_at_every_preset_equals_tinyformers(explorer_page):
    page, _, _ = explorer_page
    root = _explorer(page)
    reference = _reference(root)
    assert len(reference) >= 3
    _set(root, "q_angle", 45)  # start away from every preset
    for ref in reference:
        _set_all(root, ref["settings"])
        assert _largest_difference(_weights(root), ref["weights"]) < TOLERANCE, ref["name"]


def test_preset_buttons_restore_tinyformers_weights(explorer_page):
    page, _, _ = explorer_page
    root = _explorer(page)
    reference = _reference(root)
    for i, ref in enumerate(reference):
        root.locator(f'button[data-preset="{i}"]').click()
        assert _largest_difference(_weights(root), ref["weights"]) < TOLERANCE, ref["name"]


def test_rotating_both_matrices_together_changes_nothing(explorer_page):
    page, _, _ = explorer_page
    root = _explorer(page)
    _set_all(root, {"q_angle": 0, "q_sx": 1.5, "q_sy": 0.5, "k_angle": 0, "k_sx": 2, "k_sy": 1})
    unrotated = _weights(root)
    _set(root, "q_angle", 70)
    _set(root, "k_angle", 70)
    assert _largest_difference(_weights(root), unrotated) < TOLERANCE
    _set(root, "k_angle", 100)  # a different angle between them does change the weights
    assert _largest_difference(_weights(root), unrotated) > 0.01
