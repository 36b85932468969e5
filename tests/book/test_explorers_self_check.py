"""The three self-checking explorers of docs/_static/explorers.js, in headless Chromium.

Each page's executed code cell writes tinyformer's results into its explorer's
data attributes. The tests read those values back, move a control with the
keyboard as a reader would, and compare what the explorer then shows with
tinyformer's numbers; they also check the explorer's own report on the page, the
absence of console errors and off-host requests, and that the explorer fits a
390 px phone.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.book

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def _open(browser, server, chapter: str, viewport: dict):
    errors: list[str] = []
    off_host: list[str] = []
    context = browser.new_context(viewport=viewport)

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
    page.goto(server + chapter, wait_until="networkidle")
    return context, page, errors, off_host


@pytest.fixture
def open_chapter(browser, server):
    """Open a chapter at a viewport; after the test, no console error and no off-host request."""
    opened = []

    def _open_chapter(chapter: str, viewport: dict = DESKTOP):
        context, page, errors, off_host = _open(browser, server, chapter, viewport)
        opened.append((context, errors, off_host))
        return page

    yield _open_chapter
    for context, errors, off_host in opened:
        context.close()
        assert not errors, f"console errors: {errors}"
        assert not off_host, f"requests left 127.0.0.1: {off_host}"


def _root(page, selector: str):
    root = page.locator(selector)
    assert root.count() == 1, f"the chapter must contain exactly one {selector}"
    root.locator(".tf-status").wait_for()
    return root


def _json(root, name: str):
    return json.loads(root.get_attribute(f"data-{name}"))


def _values(root, selector: str) -> list[float]:
    return root.locator(selector).evaluate_all("cells => cells.map(c => Number(c.dataset.value))")


def _press(root, name: str, key: str, times: int = 1) -> None:
    control = root.locator(f'[data-setting="{name}"]').first
    control.focus()
    for _ in range(times):
        control.press(key)


def _assert_self_check(root) -> None:
    status = root.locator(".tf-status")
    assert status.get_attribute("data-match") == "yes", status.inner_text()
    assert "matches tinyformer: yes" in status.inner_text()


def _fits(page, selector: str) -> None:
    """Nothing of the explorer sticks out of the screen, and the page does not scroll sideways."""
    widths = page.evaluate(
        """sel => {
          const root = document.querySelector(sel);
          return {page: document.documentElement.scrollWidth, screen: window.innerWidth,
                  right: root.getBoundingClientRect().right};
        }""",
        selector,
    )
    assert widths["page"] <= widths["screen"], widths
    assert widths["right"] <= widths["screen"] + 0.5, widths


# ---- Decoding: temperature, top-k, top-p, min-p ----

DECODING = ("chapters/decoding.html", ".tf-decoding-explorer")


def _decoding_state(root) -> tuple[list[float], float]:
    rows = root.locator("table.tf-bars tbody tr")
    tokens = rows.evaluate_all("rows => rows.map(r => Number(r.dataset.token))")
    drawn = _values(root, "table.tf-bars td.tf-draw")
    probs = [0.0] * len(tokens)
    for token, p in zip(tokens, drawn, strict=True):
        probs[token] = p
    kept = float(root.locator(".tf-kept").get_attribute("data-value"))
    return probs, kept


def _reference_for(reference, prompt: int, settings: dict) -> dict:
    wanted = {"min_p": None, **settings}  # min-p is off unless the caller sets it
    return next(r for r in reference if r["prompt"] == prompt and r["settings"] == wanted)


def test_decoding_explorer_reports_a_match(open_chapter):
    page = open_chapter(DECODING[0])
    _assert_self_check(_root(page, DECODING[1]))


def test_decoding_keyboard_moves_reach_tinyformers_distributions(open_chapter):
    page = open_chapter(DECODING[0])
    root = _root(page, DECODING[1])
    reference = _json(root, "reference")
    tolerance = float(root.get_attribute("data-tolerance"))
    vocab = len(_json(root, "tokens"))
    # The explorer opens on the first prompt's unprocessed distribution.
    model = _reference_for(reference, 0, {"temperature": 1.0, "top_k": None, "top_p": None})
    probs, kept = _decoding_state(root)
    assert max(abs(a - b) for a, b in zip(probs, model["probs"], strict=True)) < tolerance
    assert kept == pytest.approx(1.0)
    # Temperature 1.0 -> 0.5: ten steps of 0.05 to the left.
    _press(root, "temperature", "ArrowLeft", 10)
    assert root.locator('output[data-setting="temperature"]').inner_text() == "0.50"
    cold = _reference_for(reference, 0, {"temperature": 0.5, "top_k": None, "top_p": None})
    probs, kept = _decoding_state(root)
    assert max(abs(a - b) for a, b in zip(probs, cold["probs"], strict=True)) < tolerance
    # Back to 1.0, then top-p from off (1) to 0.9: two steps down.
    _press(root, "temperature", "ArrowRight", 10)
    _press(root, "top_p", "ArrowLeft", 2)
    nucleus = _reference_for(reference, 0, {"temperature": 1.0, "top_k": None, "top_p": 0.9})
    probs, kept = _decoding_state(root)
    assert max(abs(a - b) for a, b in zip(probs, nucleus["probs"], strict=True)) < tolerance
    assert kept == pytest.approx(nucleus["kept"], abs=tolerance)
    assert kept < 1.0
    # top-p back off, then top-k from off (V) to 2 with the keyboard.
    _press(root, "top_p", "End")
    _press(root, "top_k", "ArrowLeft", vocab - 2)
    top2 = _reference_for(reference, 0, {"temperature": 1.0, "top_k": 2, "top_p": None})
    probs, kept = _decoding_state(root)
    assert max(abs(a - b) for a, b in zip(probs, top2["probs"], strict=True)) < tolerance
    assert sum(p > 0 for p in probs) == 2
    assert root.locator(".tf-kept").inner_text().startswith(f"Kept probability mass: {kept:.3f}")
    # top-k back off, then min-p from off (0) to 0.1: ten steps of 0.01 to the right.
    _press(root, "top_k", "End")
    _press(root, "min_p", "ArrowRight", 10)
    assert root.locator('output[data-setting="min_p"]').inner_text() == "0.10"
    cut = _reference_for(
        reference, 0, {"temperature": 1.0, "top_k": None, "top_p": None, "min_p": 0.1}
    )
    probs, kept = _decoding_state(root)
    assert max(abs(a - b) for a, b in zip(probs, cut["probs"], strict=True)) < tolerance
    assert kept == pytest.approx(cut["kept"], abs=tolerance)


def test_decoding_prompt_choice_and_presets_match_tinyformer(open_chapter):
    page = open_chapter(DECODING[0])
    root = _root(page, DECODING[1])
    reference = _json(root, "reference")
    tolerance = float(root.get_attribute("data-tolerance"))
    _press(root, "prompt", "ArrowDown")  # the second prompt, chosen with the keyboard
    second = _reference_for(reference, 1, {"temperature": 1.0, "top_k": None, "top_p": None})
    probs, _ = _decoding_state(root)
    assert max(abs(a - b) for a, b in zip(probs, second["probs"], strict=True)) < tolerance
    for i, ref in enumerate(reference):
        if "preset" in ref:
            root.locator(f'button[data-preset="{i}"]').click()
            probs, kept = _decoding_state(root)
            assert max(abs(a - b) for a, b in zip(probs, ref["probs"], strict=True)) < tolerance
            assert kept == pytest.approx(ref["kept"], abs=tolerance), ref["preset"]


def test_decoding_explorer_fits_a_phone(open_chapter):
    page = open_chapter(DECODING[0], PHONE)
    root = _root(page, DECODING[1])
    _assert_self_check(root)
    _fits(page, DECODING[1])


# ---- The heads of the trained reversal model ----

HEADS = ("chapters/multihead.html", ".tf-attention-viewer")


def _shown_heads(root) -> list[list[float]]:
    return root.locator("table.tf-heads tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.querySelectorAll('td'))"
        ".map(td => Number(td.dataset.value)))"
    )


def _close(a: list[list[float]], b: list[list[float]], tolerance: float) -> bool:
    return all(
        abs(x - y) <= tolerance
        for r, s in zip(a, b, strict=True)
        for x, y in zip(r, s, strict=True)
    )


def test_heads_viewer_reports_a_match(open_chapter):
    page = open_chapter(HEADS[0])
    _assert_self_check(_root(page, HEADS[1]))


def test_heads_viewer_follows_the_keyboard_through_every_layer(open_chapter):
    page = open_chapter(HEADS[0])
    root = _root(page, HEADS[1])
    layers = _json(root, "layers")
    tolerance = float(root.get_attribute("data-tolerance"))
    assert len({layer["name"] for layer in layers}) == len(layers) >= 3
    for index, layer in enumerate(layers):
        root.locator('select[data-setting="layer"]').select_option(str(index))
        buttons = root.locator(".tf-tokens button")
        assert buttons.all_inner_texts() == layer["queries"]
        buttons.first.focus()  # Tab's target: the first query token
        for query in range(len(layer["queries"])):
            expected = [head[query] for head in layer["weights"]]  # (h, T_k)
            assert root.locator("table.tf-heads").get_attribute("data-query") == str(query)
            assert _close(_shown_heads(root), expected, tolerance), (layer["name"], query)
            page.keyboard.press("ArrowRight")
        page.keyboard.press("Home")
        assert root.locator("table.tf-heads").get_attribute("data-query") == "0"


def test_heads_viewer_follows_the_pointer(open_chapter):
    page = open_chapter(HEADS[0])
    root = _root(page, HEADS[1])
    layer = _json(root, "layers")[0]
    tolerance = float(root.get_attribute("data-tolerance"))
    last = len(layer["queries"]) - 1
    root.locator(f'.tf-tokens button[data-query="{last}"]').hover()
    expected = [head[last] for head in layer["weights"]]
    assert _close(_shown_heads(root), expected, tolerance)


def test_heads_viewer_fits_a_phone(open_chapter):
    page = open_chapter(HEADS[0], PHONE)
    root = _root(page, HEADS[1])
    _assert_self_check(root)
    _fits(page, HEADS[1])


# ---- Sinusoidal and rotary positions ----

POSITIONS = ("chapters/positions.html", ".tf-position-explorer")


def _readout(root, name: str) -> float:
    return float(root.locator(f'dd[data-name="{name}"]').get_attribute("data-value"))


def test_positions_explorer_reports_a_match(open_chapter):
    page = open_chapter(POSITIONS[0])
    _assert_self_check(_root(page, POSITIONS[1]))


def test_positions_keyboard_moves_show_tinyformers_offset_property(open_chapter):
    page = open_chapter(POSITIONS[0])
    root = _root(page, POSITIONS[1])
    settings = _json(root, "settings")
    reference = _json(root, "reference")
    tolerance = float(root.get_attribute("data-tolerance"))
    offset, position = settings["start_offset"], 0
    for key, times, control in [
        ("ArrowRight", 3, "offset"),
        ("ArrowRight", 5, "position"),
        ("ArrowLeft", 2, "offset"),
        ("End", 1, "position"),
    ]:
        _press(root, control, key, times)
        offset = int(root.locator('input[data-setting="offset"]').input_value())
        position = int(root.locator('input[data-setting="position"]').input_value())
        target = position + offset
        assert _readout(root, "sinusoidal") == pytest.approx(
            reference["gram"][position][target], abs=tolerance
        )
        assert _readout(root, "rotary") == pytest.approx(
            reference["rotary_scores"][position][target], abs=tolerance
        )
        # The offset property: the same value at every starting position.
        assert _readout(root, "sinusoidal_spread") < tolerance
        assert _readout(root, "rotary_spread") < tolerance
    assert (offset, position) == (
        settings["start_offset"] + 1,
        settings["n_positions"] - 1 - settings["max_offset"],
    )
    dots = root.locator(".tf-charts svg").first.locator(".tf-dot")
    assert dots.count() == settings["n_positions"] - offset


def test_positions_explorer_fits_a_phone(open_chapter):
    page = open_chapter(POSITIONS[0], PHONE)
    root = _root(page, POSITIONS[1])
    _assert_self_check(root)
    _fits(page, POSITIONS[1])
