"""The live exercise of the chapter on decoding: nucleus (top-p) sampling's distribution."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.generation import probabilities


def _nucleus_reference(logits, top_p, temperature=1.0):
    """The processed distribution of tinyformer, with temperature and top-p only."""
    return probabilities(logits, temperature=temperature, top_p=top_p)


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _inclusive_cumsum(logits, top_p, temperature=1.0):
    """Keeps the tokens whose mass up to and including them is below top_p: drops the one that crosses it."""
    p = _softmax(np.asarray(logits, dtype=np.float64) / temperature)
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    keep_sorted = np.cumsum(sorted_p, axis=-1) < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    kept = np.where(keep, p, 0.0)
    total = kept.sum(axis=-1, keepdims=True)
    return np.divide(kept, total, out=np.zeros_like(kept), where=total > 0)


def _nucleus_before_temperature(logits, top_p, temperature=1.0):
    """Forms the nucleus from the distribution at temperature 1, then applies the temperature."""
    nucleus = probabilities(logits, top_p=top_p) > 0
    z = np.where(nucleus, np.asarray(logits, dtype=np.float64) / temperature, -np.inf)
    return _softmax(z)


def _not_renormalized(logits, top_p, temperature=1.0):
    """Zeroes the tokens outside the nucleus but does not renormalize the rest."""
    p = probabilities(logits, temperature=temperature)
    return np.where(probabilities(logits, temperature=temperature, top_p=top_p) > 0, p, 0.0)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    one = rng.standard_normal(8) * 2.0  # (V,) = (8,)
    batch = rng.standard_normal((3, 10)) * np.array([[0.5], [2.0], [5.0]])  # flat to peaked
    sure = np.array([6.0, 1.0, 0.5, 0.0, -1.0])  # the top token alone holds more than top_p
    huge = rng.standard_normal(6) * 3.0 + 800.0  # exp(800) overflows float64
    impossible = np.array([1.5, -np.inf, 0.3, 1.0, -np.inf, -0.2])
    return [
        Case((one, 0.9), label="8 logits with top_p = 0.9"),
        Case(
            (batch, 0.8),
            {"temperature": 1.5},
            label="3 rows of 10 logits at temperature 1.5 with top_p = 0.8",
        ),
        Case((sure, 0.5), label="a top token whose probability alone exceeds top_p"),
        Case((huge, 0.7), {"temperature": 0.5}, label="logits in the hundreds at temperature 0.5"),
        Case(
            (impossible, 0.95),
            {"temperature": 2.0},
            label="two impossible tokens (logit -inf) at temperature 2",
        ),
    ]


NUCLEUS_PROBABILITIES = Exercise(
    chapter="decoding",
    name="nucleus_probabilities",
    stub='''\
def nucleus_probabilities(logits, top_p, temperature=1.0):
    """The distribution nucleus (top-p) sampling draws from, after a temperature.

    logits: (..., V) floats, possibly -inf for an impossible token (at least one finite
    per row); top_p in (0, 1]; temperature > 0.
    First divide the logits by temperature and take the softmax over the last axis.
    Then keep, in each row, the smallest set of most likely tokens whose total
    probability reaches top_p: a token is kept when the probability of the tokens
    ranked before it is still below top_p (so the most likely token is always kept;
    ties rank the smaller token id first). Set the others to 0 and renormalize the
    kept ones so each row sums to 1.
    Returns float64 probabilities of shape (..., V).
    """
    raise NotImplementedError
''',
    reference=_nucleus_reference,
    cases=_cases,
    rtol=1e-6,
    atol=1e-12,
    mistakes=(_inclusive_cumsum, _nucleus_before_temperature, _not_renormalized),
)
"""Write the processed distribution of nucleus sampling, including the token that crosses top_p."""
