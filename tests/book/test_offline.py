"""Nothing in the built book names an off-machine address for a file a browser would load.

The browser check blocks and reports off-host requests of the pages it opens; this test
reads the files instead, so it also covers code paths a page load does not take (MathJax's
menu and speech engine, say). It looks at every HTML page's script, style, image, font and
frame addresses and inline styles, every stylesheet's ``url()`` and ``@import``, and every
script for an address of a file to fetch (a script, style, font or data file, or any address
on a content-delivery network). Links a reader clicks (``<a href>``) are not loads.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import ClassVar
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.book

OFF_HOST = re.compile(r"^(https?:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)
JS_URL = re.compile(r"""(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}(?:/[^\s'"`)<>]*)?""", re.IGNORECASE)
# In scripts: an address is a load if it is on a CDN or names a file type a page fetches.
CDN_HOST = re.compile(r"cdn|jsdelivr|unpkg|googleapis|gstatic|cloudflare|bootstrapcdn|polyfill")
FETCHED = re.compile(r"\.(js|mjs|css|json|woff2?|ttf|otf|eot|wasm|png|svg|jpe?g|gif)(\?|$)")
# XML namespace names are identifiers that no one fetches; so are two JSON Schema identifiers
# in JupyterLab's scripts (the live pages): ajv's "$id" of its data schema and Vega's "$schema".
NAMESPACES = (
    "www.w3.org/",
    "exslt.org/",
    "ns.saxonica.com/",
    "raw.githubusercontent.com/ajv-validator/ajv/master/lib/refs/data.json",
    "vega.github.io/schema/",
)


class _Loads(HTMLParser):
    ATTRS: ClassVar[dict[str, tuple[str, ...]]] = {
        "script": ("src",),
        "link": ("href",),
        "img": ("src", "srcset"),
        "source": ("src", "srcset"),
        "iframe": ("src",),
        "embed": ("src",),
        "object": ("data",),
        "video": ("src", "poster"),
        "audio": ("src",),
        "track": ("src",),
        "image": ("href", "xlink:href"),
        "use": ("href", "xlink:href"),
    }

    def __init__(self) -> None:
        super().__init__()
        self.addresses: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "link" and (values.get("rel") or "") in {"canonical", "alternate"}:
            return
        for name in self.ATTRS.get(tag, ()):
            for value in (values.get(name) or "").split(","):
                if value.strip():
                    self.addresses.append(value.strip().split()[0])
        self.addresses += [m[0] or m[1] for m in CSS_URL.findall(values.get("style") or "")]
        self._in_style = tag == "style"

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.addresses += [m[0] or m[1] for m in CSS_URL.findall(data)]

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False


def _script_loads(text: str) -> list[str]:
    found = []
    for match in JS_URL.finditer(text):
        url = match[0]
        if url.startswith("//") and text[max(0, match.start() - 1)] not in "'\"`(=":
            continue  # a comment, not an address
        plain = url.split("//", 1)[1]
        if plain.startswith(NAMESPACES):
            continue
        host = urlsplit("https://" + plain).hostname or ""
        if CDN_HOST.search(host) or FETCHED.search(urlsplit("https://" + plain).path):
            found.append(url)
    return found


def test_no_off_host_loads_in_html_css_or_scripts(html_root):
    problems = []
    for page in sorted(html_root.rglob("*.html")):
        if "_sources" in page.parts:
            continue
        parser = _Loads()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        bad = sorted({a for a in parser.addresses if OFF_HOST.match(a)})
        problems += [f"{page.relative_to(html_root)}: {a}" for a in bad]
    for sheet in sorted(html_root.rglob("*.css")):
        text = sheet.read_text(encoding="utf-8", errors="replace")
        bad = sorted({m[0] or m[1] for m in CSS_URL.findall(text) if OFF_HOST.match(m[0] or m[1])})
        problems += [f"{sheet.relative_to(html_root)}: {a}" for a in bad]
    for script in sorted(html_root.rglob("*.js")):
        text = script.read_text(encoding="utf-8", errors="replace")
        problems += [
            f"{script.relative_to(html_root)}: {a}" for a in sorted(set(_script_loads(text)))
        ]
    assert not problems, "off-host addresses of files to load:\n" + "\n".join(problems)
