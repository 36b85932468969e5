"""The built folder can be copied to a static host as it is.

It carries no build state; its sitemap lists every page at the address it is built for
(``BOOK_URL`` in docs/conf.py); every page has link-preview tags whose card image is in the
folder; and an address that names no page gets the book's 404 page, whose styles, scripts
and links work from wherever the reader mistyped (the server of these checks answers every
missing address with it and status 404, as static hosts do).
"""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit
from xml.etree import ElementTree

import pytest
from PIL import Image

pytestmark = pytest.mark.book

# Pages a search engine has nothing to find on.
NOT_IN_SITEMAP = {"404.html", "search.html", "genindex.html", "py-modindex.html"}


def test_no_page_pickles_the_build_environment(html_root):
    # docs/_ext/small_doctrees.py: nodes of a nested parse (the API pages' eval-rst) kept a
    # reference to a document whose settings held the whole environment: 2.2 MB per page,
    # all of them read back at every build. The doctrees are beside the HTML (noxfile.py).
    doctrees = html_root.parent / "doctrees" / html_root.name
    if not doctrees.is_dir():
        pytest.skip(f"no doctrees beside the HTML at {doctrees}")
    pages = sorted(doctrees.rglob("*.doctree"))
    assert pages, f"no doctrees in {doctrees}"
    heavy = [p.name for p in pages if b"BuildEnvironment" in p.read_bytes()]
    assert not heavy, f"pages whose pickle holds the build environment: {heavy[:5]}"


def test_the_built_folder_holds_no_pickled_build_state(html_root):
    # Sphinx keeps its parsed pages (a pickle per page, the environment and the executed
    # notebooks' outputs) in a doctree folder; `nox -s docs` puts it beside the HTML.
    pickles = sorted(
        path.relative_to(html_root).as_posix()
        for path in html_root.rglob("*")
        if path.suffix in {".doctree", ".pickle"} or path.name == ".doctrees"
    )
    assert not pickles, f"build state in the published folder: {pickles[:5]} ({len(pickles)})"


def _sitemap(html_root) -> list[str]:
    root = ElementTree.parse(html_root / "sitemap.xml").getroot()
    return [loc.text for loc in root.iterfind("{*}url/{*}loc")]


def _site_url(html_root, book_prefix) -> str:
    first = urlsplit(_sitemap(html_root)[0])
    return f"{first.scheme}://{first.netloc}{book_prefix}"


def test_the_sitemap_lists_every_page_at_its_published_address(html_root, all_pages, book_prefix):
    listed = _sitemap(html_root)
    site = _site_url(html_root, book_prefix)
    assert all(url.startswith(site) for url in listed), listed[:3]
    assert len(set(listed)) == len(listed)
    paths = {url[len(site) :] for url in listed}
    assert paths == set(all_pages) - NOT_IN_SITEMAP, (
        f"missing: {sorted(set(all_pages) - NOT_IN_SITEMAP - paths)[:5]},"
        f" not pages: {sorted(paths - set(all_pages))[:5]}"
    )


class _Meta(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.properties: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "meta" and values.get("property", "").startswith("og:"):
            self.properties[values["property"]] = values.get("content") or ""


def test_every_page_has_link_preview_tags_and_the_card_is_in_the_folder(
    html_root, all_pages, book_prefix
):
    site = _site_url(html_root, book_prefix)
    problems = []
    for page in sorted(set(all_pages) - NOT_IN_SITEMAP):  # Sphinx's own pages have none
        meta = _Meta()
        meta.feed((html_root / page).read_text(encoding="utf-8"))
        tags = meta.properties
        missing = {"og:title", "og:type", "og:url", "og:image", "og:image:alt"} - set(tags)
        if missing:
            problems.append(f"{page}: no {sorted(missing)}")
            continue
        if tags["og:url"] != urljoin(site, page):
            problems.append(f"{page}: og:url {tags['og:url']}")
        if not tags["og:image"].startswith(site):
            problems.append(f"{page}: og:image {tags['og:image']} is not in the book's folder")
        elif not (html_root / tags["og:image"][len(site) :]).is_file():
            problems.append(f"{page}: og:image {tags['og:image']} names no file")
        if page.startswith("chapters/") and not tags.get("og:description"):
            problems.append(f"{page}: no og:description")
    assert not problems, "\n".join(problems[:20])
    with Image.open(html_root / "_static" / "figures" / "card.png") as card:
        width, height = card.size
    assert width >= 600, (width, height)
    assert abs(width / height - 1.91) < 0.02, (width, height)


def test_a_missing_address_shows_the_404_page_with_working_links(visit, server):
    wrong = urljoin(server, "chapters/no-such-chapter/deeper/page.html")
    statuses, failed = {}, []
    opened = visit("")  # a context that blocks and records off-host requests
    page = opened.page
    page.on("response", lambda r: statuses.setdefault(r.url, r.status))
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.goto(wrong, wait_until="networkidle")
    assert statuses.get(wrong) == 404
    others = {url: code for url, code in statuses.items() if url != wrong and code >= 400}
    assert not others, f"the 404 page's own files failed: {others}"
    assert not failed, failed
    assert not opened.off_host_requests, opened.off_host_requests
    # Chromium logs the page's own status as an error; nothing else may be logged
    assert opened.console_errors == [
        "Failed to load resource: the server responded with a status of 404 (Not Found)"
    ]
    assert page.title().startswith("Page not found")
    sheets = page.evaluate("document.styleSheets.length")
    assert sheets >= 3, f"the 404 page loaded {sheets} stylesheets: its styles are missing"
    page.get_by_role("link", name="first page").click()
    page.wait_for_load_state("networkidle")
    assert urlsplit(page.url).path == urlsplit(urljoin(server, "index.html")).path
    assert page.title().startswith("Understanding Transformers")
    outside = urljoin(server, "/elsewhere/index.html")  # on the host, outside the book
    if urlsplit(outside).path != urlsplit(page.url).path:
        response = page.goto(outside)
        assert response.status == 404
        assert page.title().startswith("Page not found")


def test_only_the_search_page_loads_the_search_index(html_root, all_pages):
    # 0.4 MB that a reading page has no use for (search runs on search.html)
    loading = sorted(
        page
        for page in all_pages
        if 'searchindex.js"' in (html_root / page).read_text(encoding="utf-8")
    )
    assert loading == ["search.html"], loading[:5]
