"""Figure text is at least 9 CSS pixels on a 1280 px desktop, on every page, in headless Chromium.

The text size of a figure as shown is the font size it was drawn with, in the
image's own pixels, times the ratio of its rendered width to its natural width.

- Figures made by ``scripts/`` (shown with the ``{figure}`` directive) record
  their smallest font in image pixels in a PNG text chunk written by
  :func:`tinyformer.viz.save_figure` (``tinyformer.viz.PNG_FONT_KEY``).
- Figures drawn in a page's code cell come from matplotlib's inline backend,
  which writes no such chunk. They are drawn by :func:`tinyformer.viz.new_figure`,
  whose figures refuse (with a warning, which fails the strict build) any text
  smaller than ``MIN_FONT_PT`` points, at ``DPI`` dots per inch (the unit tests in
  tests/unit/test_viz.py check both). Their smallest text is therefore at least
  ``MIN_FONT_PT * DPI / 72`` image pixels, which is what is measured here; an
  image wider than a style-made figure can be (so not drawn by the style) fails.
"""

from __future__ import annotations

from urllib.parse import unquote, urljoin, urlsplit

import pytest
from PIL import Image

from tinyformer import viz

pytestmark = pytest.mark.book

DESKTOP = {"width": 1280, "height": 900}
# Natural width of a page figure: FIGURE_WIDTH at DPI, give or take the inline backend's
# tight bounding box (which trims margins, or adds a little for text that sticks out).
MAX_PAGE_FIGURE_PX = viz.FIGURE_WIDTH * viz.DPI * 1.05

MEASURE = """
async () => {
  const images = Array.from(document.querySelectorAll('.bd-article img')).filter(
    (img) => /_images\\/[^/]+\\.png$/.test(img.getAttribute('src') || ''));
  for (const img of images) {
    img.loading = 'eager';
    if (!img.complete) await new Promise((done) => { img.onload = img.onerror = done; });
  }
  return images.map((img) => ({
    src: img.src,
    natural: img.naturalWidth,
    rendered: img.getBoundingClientRect().width,
    output: Boolean(img.closest('.cell_output')),
  }));
}
"""


@pytest.fixture(scope="module")
def desktop(browser):
    """One browser context at 1280 x 900 for every page."""
    context = browser.new_context(viewport=DESKTOP)
    yield context
    context.close()


def _recorded_px(html_root, server: str, src: str) -> float | None:
    assert src.startswith(server), f"{src} is not served from the book's folder {server}"
    path = html_root / unquote(urlsplit(src[len(server) :]).path)
    with Image.open(path) as image:
        value = image.text.get(viz.PNG_FONT_KEY) if hasattr(image, "text") else None
    return None if value is None else float(value)


def test_the_style_promises_nine_css_pixels():
    assert viz.displayed_font_px(viz.MIN_FONT_PT) >= viz.MIN_FONT_CSS_PX == 9.0


def test_figure_text_is_at_least_nine_css_pixels(desktop, server, html_root, page_path):
    page = desktop.new_page()
    try:
        page.goto(urljoin(server, page_path), wait_until="networkidle")
        images = page.evaluate(MEASURE)
    finally:
        page.close()
    too_small = []
    for image in images:
        assert image["natural"] > 0, f"{image['src']} did not load"
        shrink = image["rendered"] / image["natural"]
        recorded = _recorded_px(html_root, server, image["src"])
        if recorded is None:
            assert image["output"], f"{image['src']}: a figure without {viz.PNG_FONT_KEY}"
            assert image["natural"] <= MAX_PAGE_FIGURE_PX, (
                f"{image['src']} is {image['natural']} px wide: not drawn by tinyformer.viz"
            )
            recorded = viz.MIN_FONT_PT * viz.DPI / 72
        shown = recorded * shrink
        if shown < viz.MIN_FONT_CSS_PX:
            too_small.append(f"{image['src']}: smallest text {shown:.1f} CSS px")
    assert not too_small, f"text under {viz.MIN_FONT_CSS_PX} CSS px at 1280 px: {too_small}"
