"""Every page passes axe-core with no violation, and fits a phone's width, light and dark.

axe-core is the copy shipped inside the ``axe-playwright-python`` package (nothing is
downloaded when the test runs). Each page is loaded once; the test then checks it in four
variants, by resizing the viewport and switching the theme's colour mode in place:
1280 px and 390 px wide (a desktop window and a phone), each in light and dark mode. In
every variant axe must report no violation of any impact (at 390 px the two colour rules
leave out the article, whose colours the width does not change: see ``COLOUR_RULES``), and
no part of the page may be wider than the viewport (wide equations, tables and outputs
scroll in their own boxes). The page is first opened at 390 px, and that first load, gzipped,
may weigh at most ``PAGE_WEIGHT_BUDGET`` (conftest.py), figures included; every page's weight
is printed at the end of the run.
"""

from __future__ import annotations

import contextlib

import pytest

pytestmark = pytest.mark.book

VARIANTS = [(1280, "light"), (1280, "dark"), (390, "light"), (390, "dark")]
# The theme (and book-a11y.js) update scrollable boxes 300 ms after the last resize: wait
# until every box that scrolls is focusable and no other is (slower on a busy machine).
RESIZE_SETTLE_MS = 400
SCROLLERS_SETTLED = """
() => {
  const scrolls = e => e.scrollWidth > e.clientWidth || e.scrollHeight > e.clientHeight;
  const theme = document.querySelectorAll(
    'pre, .cell_output > .output, .pst-scrollable-table-container');
  const maths = document.querySelectorAll('.bd-article div.math');
  return Array.from(theme).every(e => scrolls(e) === (e.tabIndex === 0)) &&
    Array.from(maths).every(e => (e.scrollWidth > e.clientWidth + 1) === (e.tabIndex === 0));
}
"""

NO_TRANSITIONS = (
    "*, *::before, *::after { transition: none !important; animation: none !important; }"
)

WAIT_FOR_MATHJAX = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
}
"""

SET_MODE = """
async (mode) => {
  document.documentElement.dataset.theme = mode;
  document.documentElement.dataset.mode = mode;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
}
"""

# Colour rules: their result depends on colours (the mode), and on the layout only through
# what overlaps what. The article's colours do not change with the width (no stylesheet of the
# book or its theme sets a colour in the article by width), so at the phone's width they run on
# everything outside it (header, drawers, sidebars, footer, which do change), after a run on the
# whole page at the desktop's width in the same mode; every other rule runs on the whole page in
# every variant. (At 390 px the colour rules over a long chapter were half of the check's time.)
COLOUR_RULES = ["color-contrast", "link-in-text-block"]
RUN_AXE = """
async ([colourRules, narrow]) => {
  const options = {resultTypes: ['violations']};
  let violations = (await axe.run(document, narrow
    ? {...options, rules: Object.fromEntries(colourRules.map(r => [r, {enabled: false}]))}
    : options)).violations;
  if (narrow) {
    const outside = await axe.run({exclude: [['.bd-article']]},
      {...options, runOnly: {type: 'rule', values: colourRules}});
    violations = violations.concat(outside.violations);
  }
  return violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ' :: ' + (n.failureSummary || '')
      .replace(/\\s+/g, ' ').slice(0, 200)),
    count: v.nodes.length,
  }));
}
"""

# Elements sticking out past the right edge of the viewport, unless an ancestor that clips
# or scrolls them ends inside it (that is the wanted behaviour: they scroll in their box).
TOO_WIDE = """
() => {
  const width = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth <= width + 1) return [];
  const describe = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (el.className && typeof el.className === 'string'
      ? '.' + el.className.trim().split(/\\s+/).slice(0, 3).join('.') : '');
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= width + 1) continue;
    if (getComputedStyle(el).visibility === 'hidden') continue;
    // Fixed boxes (the off-canvas sidebars) do not widen the page; boxes that clip or
    // scroll and end inside the viewport contain what sticks out of them.
    let parent = el, contained = false;
    while (parent && parent !== document.body) {
      const style = getComputedStyle(parent);
      if (style.position === 'fixed') { contained = true; break; }
      if (parent !== el && style.overflowX !== 'visible' &&
          parent.getBoundingClientRect().right <= width + 1) { contained = true; break; }
      parent = parent.parentElement;
    }
    if (!contained)
      out.push({selector: describe(el), right: Math.round(box.right),
                path: (el.parentElement ? describe(el.parentElement) + ' > ' : '') + describe(el)});
  }
  return [`page is ${document.documentElement.scrollWidth} px wide in a ${width} px viewport`]
    .concat(out.slice(-4).map(o => `${o.path} reaches ${o.right} px`));
}
"""


@pytest.fixture(scope="session")
def axe_script() -> str:
    """axe-core's JavaScript, from the axe-playwright-python package."""
    from axe_playwright_python.base import AXE_SCRIPT  # noqa: PLC0415  (browser session only)

    return AXE_SCRIPT


def test_page_is_accessible_and_fits_a_phone(visit, axe_script, weigh_page, page_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: PLC0415

    opened = visit(page_path, width=390)  # a phone's first load: its weight is measured too
    page = opened.page
    # Colours are checked at rest: with transitions, a theme switch on a busy machine left
    # axe measuring a button halfway between its light and dark colours.
    page.add_style_tag(content=NO_TRANSITIONS)
    page.evaluate(WAIT_FOR_MATHJAX)
    problems = weigh_page(page, page_path)  # before axe adds its own script
    page.evaluate(axe_script)
    for width, mode in VARIANTS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(RESIZE_SETTLE_MS)
        with contextlib.suppress(PlaywrightTimeout):  # if not, axe says which box is wrong
            page.wait_for_function(SCROLLERS_SETTLED, timeout=10_000)
        page.evaluate(SET_MODE, mode)
        for violation in page.evaluate(RUN_AXE, [COLOUR_RULES, width < 1280]):
            problems.append(
                f"[{width} px, {mode}] axe {violation['id']} ({violation['impact']}, "
                f"{violation['count']} element(s)): {violation['help']}\n      "
                + "\n      ".join(violation["nodes"])
            )
        too_wide = page.evaluate(TOO_WIDE)
        if too_wide:
            problems.append(f"[{width} px, {mode}] " + "\n      ".join(too_wide))
    assert not problems, f"{page_path}:\n  " + "\n  ".join(problems)
