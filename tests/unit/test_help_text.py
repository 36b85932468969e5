"""``help()`` on the names a newcomer meets first opens with plain text, not Sphinx markup.

Docstrings stay NumPy style with reStructuredText in their bodies (the API pages
need the roles for links, the math and the citations, as NumPy's and SciPy's do),
but their summary line, the first thing ``help()``, ``pydoc`` and editors show,
reads as plain English: no role such as ``:class:`` or ``:cite:p:``, no directive.
"""

from __future__ import annotations

import inspect
import pydoc
import re

import pytest

import tinyformer

MARKUP = re.compile(
    r":[a-z]+(?::[a-z]+)?:`|^\.\. [a-z]+::|(?<![`\w])`[^`]+`_?(?![`\w])", re.MULTILINE
)
DOCUMENTED = ["tinyformer"] + [
    name
    for name in tinyformer.__all__
    if inspect.isclass(getattr(tinyformer, name))
    or inspect.isroutine(getattr(tinyformer, name))
    or inspect.ismodule(getattr(tinyformer, name))
]  # not the data (``__version__``, tuples of names): help() on those shows their type


def summary(obj: object) -> str:
    """The first paragraph of an object's docstring, as ``help()`` prints it first."""
    return (inspect.getdoc(obj) or "").split("\n\n")[0]


@pytest.mark.parametrize(
    "text",
    [
        "Adam :cite:p:`kingma2015adam`, as ``torch.optim.Adam``.",
        "Sizes of a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM`.",
        "Decay as :math:`1/\\sqrt{t}`.",
        ".. math::",
        "A `Batch` of pairs.",
    ],
)
def test_the_pattern_finds_markup(text):
    assert MARKUP.search(text)


def test_the_pattern_leaves_plain_text_and_literals_alone():
    assert not MARKUP.search("Adam with decoupled weight decay, as ``torch.optim.AdamW``.")


@pytest.mark.parametrize("name", DOCUMENTED)
def test_summary_lines_of_the_top_level_names_are_plain_text(name):
    obj = tinyformer if name == "tinyformer" else getattr(tinyformer, name)
    first = summary(obj)
    assert first, f"{name} has no docstring"
    assert not MARKUP.search(first), f"help({name}) opens with markup: {first!r}"
    assert first in pydoc.render_doc(obj, renderer=pydoc.plaintext)
