"""Every term of the glossary is linked from some page of the book (read from the sources).

The glossary (docs/glossary.md, a ``{glossary}`` directive) defines each term once; the
chapters link a term at its first use with ``{term}`name``` or ``{term}`text <name>```.
A term that no page links to is one no reader reaches from the text: link it where it is
used, or remove it. Docstrings count too (``:term:`name``` renders on the API pages).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GLOSSARY = DOCS / "glossary.md"
FENCE = re.compile(
    r"^(`{3,}|:{3,})\{glossary\}[^\n]*\n(?P<body>.*?)^\1\s*$", re.MULTILINE | re.DOTALL
)
# {term}`name`, {term}`text <name>`, and reST's :term:`name` / :term:`text <name>`.
LINK = re.compile(r"(?:\{term\}|:term:)`(?:[^`<]*<(?P<target>[^>`]+)>|(?P<plain>[^`]+))`")


def glossary_terms(text: str) -> list[str]:
    """The terms the glossary defines: unindented lines of its directive (not options)."""
    terms = []
    for match in FENCE.finditer(text):
        for line in match["body"].splitlines():
            if line and not line[0].isspace() and not line.startswith(":"):
                terms.append(line.strip())
    return terms


def linked_terms(paths: list[Path]) -> set[str]:
    """Every term named by a term link in the given files (lower case, spaces normalized)."""
    found = set()
    for path in paths:
        for match in LINK.finditer(path.read_text(encoding="utf-8")):
            name = match["target"] or match["plain"]
            found.add(" ".join(name.split()).lower())
    return found


def _sources() -> list[Path]:
    pages = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p != GLOSSARY]
    return pages + sorted((ROOT / "src").rglob("*.py"))


def test_the_glossary_parses():
    terms = glossary_terms(GLOSSARY.read_text(encoding="utf-8"))
    assert len(terms) >= 10
    assert "attention" in terms


def test_each_term_is_defined_once():
    terms = [t.lower() for t in glossary_terms(GLOSSARY.read_text(encoding="utf-8"))]
    twice = sorted({t for t in terms if terms.count(t) > 1})
    assert not twice, f"defined more than once in docs/glossary.md: {twice}"


def test_every_glossary_term_is_linked_from_a_page():
    terms = glossary_terms(GLOSSARY.read_text(encoding="utf-8"))
    linked = linked_terms(_sources())
    unlinked = [t for t in terms if " ".join(t.split()).lower() not in linked]
    assert not unlinked, (
        "glossary terms no page links to with {term}`...` (link each at its first use): "
        f"{unlinked}"
    )


def test_the_link_pattern_reads_both_forms():
    text = "{term}`Attention` and {term}`tokens <token>` and :term:`key\nvector <key vector>`"
    names = {" ".join((m["target"] or m["plain"]).split()).lower() for m in LINK.finditer(text)}
    assert names == {"attention", "token", "key vector"}
