"""A glossary term's definition appears where the term is used, on hover and on keyboard focus."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.book

CHAPTER = "chapters/attention.html"


def _definition(html_root, term_id: str) -> str:
    """The definition's first words on the glossary page itself."""
    text = (html_root / "glossary.html").read_text(encoding="utf-8")
    match = re.search(rf'<dt id="{re.escape(term_id)}".*?<dd>(.*?)</dd>', text, re.DOTALL)
    assert match, f"no glossary entry {term_id}"
    words = re.sub(r"<[^>]+>", "", match[1]).split()
    return " ".join(words[:6])


def test_definition_shows_on_hover_and_on_focus_without_leaving_the_page(visit, html_root):
    opened = visit(CHAPTER)
    page = opened.page
    link = page.locator("article a.tf-term").first
    link.wait_for()
    term_id = link.get_attribute("href").split("#", 1)[1]
    tip_id = link.get_attribute("aria-describedby")
    assert tip_id == f"tf-tip-{term_id}"
    tip = page.locator(f"#{tip_id}")
    assert tip.get_attribute("role") == "tooltip"
    assert not tip.is_visible()
    expected = _definition(html_root, term_id)

    link.hover()
    tip.wait_for(state="visible")
    assert expected in " ".join(tip.inner_text().split())
    page.mouse.move(0, 0)
    tip.wait_for(state="hidden")

    link.focus()  # keyboard focus: no pointer involved
    tip.wait_for(state="visible")
    page.keyboard.press("Escape")
    tip.wait_for(state="hidden")

    # Tab moves the focus to the link as a keyboard user would.
    page.evaluate("() => document.activeElement.blur()")
    link.focus()
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Tab")
    tip.wait_for(state="visible")
    assert page.url.endswith(CHAPTER)
    assert not opened.console_errors, opened.console_errors
    assert not opened.off_host_requests, opened.off_host_requests


def test_every_term_link_has_its_definition(visit):
    opened = visit(CHAPTER)
    missing = opened.page.evaluate(
        """() => Array.from(document.querySelectorAll('article a[href*="glossary.html#term-"]'))
             .filter(a => !document.getElementById(a.getAttribute('aria-describedby') || '-'))
             .map(a => a.getAttribute('href'))"""
    )
    assert not missing, missing
