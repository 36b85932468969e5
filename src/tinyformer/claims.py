"""Conclusions drawn from measurements, asserted with a margin and recorded.

A number can be right and the sentence about it wrong: "post-norm collapses" may rest on
a loss that sits a hair above the line that defines collapse, where the next seed or a
last-bit change in a kernel would put it below. :func:`claim` asserts a conclusion in the
form "this value lies beyond that bound by at least this margin", where the margin is what
the measurement may move by (a seed-to-seed spread measured with the result, or a stated
tolerance). It returns nothing (a notebook cell that ends with it prints nothing); the room
left is in its record and in the log below.

When the environment variable ``TINYFORMER_CLAIMS_LOG`` names a file, every claim made in
the process is appended to it as one JSON line (the statement, value, bound, margin and
the room left), so that a build can list every conclusion of the book with its margin and
show the narrowest ones first.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

from tinyformer._validation import describe, one_of

__all__ = ["RELATIONS", "Claim", "claim"]

RELATIONS = (">", "<")
"""``">"``: the value lies above the bound; ``"<"``: below it."""


@dataclass(frozen=True)
class Claim:
    """One conclusion that was checked: ``value relation bound``, by at least ``margin``.

    Attributes
    ----------
    statement : str
        The conclusion in words, as the text states it.
    value, bound, margin : float
        The measured value, the bound it must be beyond, and the least distance required.
    relation : str
        ``">"`` or ``"<"``.
    room : float
        How far beyond the bound the value lies, in the claim's direction; at least
        ``margin`` for a claim that holds.
    """

    statement: str
    value: float
    relation: str
    bound: float
    margin: float
    room: float


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a real number, got {describe(value)}")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}")
    return number


def claim(statement: str, value: float, relation: str, bound: float, *, margin: float) -> None:
    """Assert that ``value`` lies strictly beyond ``bound`` (above for ``">"``), by ``margin`` at least.

    Parameters
    ----------
    statement : str
        The conclusion, in the words the text uses ("post-norm without warm-up stays at
        the unigram loss").
    value : float
        What was measured.
    relation : str
        ``">"`` or ``"<"``.
    bound : float
        The threshold the conclusion is about.
    margin : float
        The least distance between value and bound for the conclusion to stand: at
        least what the measurement may move by (its seed spread, its rounding), so that
        no seed or rounding change can carry it across. Zero or more.

    Raises
    ------
    AssertionError
        If the value is not beyond the bound by the margin: the conclusion does not hold.
    """
    if not isinstance(statement, str) or not statement.strip():
        raise TypeError(f"statement must be a non-empty string, got {describe(statement)}")
    one_of(relation, RELATIONS, "relation")
    value, bound = _number(value, "value"), _number(bound, "bound")
    margin = _number(margin, "margin")
    if margin < 0:
        raise ValueError(f"margin must be at least 0, got {margin}")
    room = value - bound if relation == ">" else bound - value
    if not (room > 0 and room >= margin):  # strictly beyond the bound, and by the margin
        raise AssertionError(
            f"the conclusion {statement!r} does not hold: it needs {value:.6g} {relation}"
            f" {bound:.6g} by at least {margin:.3g}, and the room is {room:.3g}"
        )
    _record(Claim(statement, value, relation, bound, margin, room))


def _record(checked: Claim) -> None:
    path = os.environ.get("TINYFORMER_CLAIMS_LOG")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as file:  # noqa: PTH123 (a path from the environment)
        file.write(json.dumps(asdict(checked)) + "\n")
