"""The live exercise of the chapter on NumPy for transformers."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.functional import log_softmax, softmax


def _log_of_softmax(x):
    """Takes the logarithm of the softmax: a weight that underflows to 0 becomes -inf."""
    with np.errstate(divide="ignore"):
        return np.log(softmax(x))


def _unshifted(x):
    """Subtracts no maximum: exp overflows for scores near 1000."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _global_shift(x):
    """Shifts every row by the maximum of the whole array: rows far below it underflow."""
    shifted = x - x.max()
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    offsets = np.array(
        [[0.0], [1000.0], [-1000.0]]
    )  # one row near 0, one near 1000, one near -1000
    return [
        Case((rng.standard_normal((3, 5)),), label="3 rows of 5 ordinary scores"),
        Case((5 * rng.standard_normal((2, 3, 6)),), label="a batch of shape (2, 3, 6)"),
        Case((offsets + rng.standard_normal((3, 4)),), label="rows near 0, 1000 and -1000"),
        Case(
            (np.array([[0.0, -50.0, -800.0]]),),
            label="a row whose last weight underflows (x = [0, -50, -800])",
        ),
    ]


LOG_SOFTMAX = Exercise(
    chapter="numpy",
    name="stable_log_softmax",
    stub='''\
def stable_log_softmax(x):
    """The logarithm of the softmax along the last axis, computed stably.

    x: a float64 array of shape (..., n) with finite entries. Returns an array of the same
    shape whose row i holds log(exp(x_i) / sum_j exp(x_j)). Every entry must be finite: for
    rows with entries near +1000 or -1000, and for rows such as [0, -50, -800] whose smallest
    softmax weight is below the smallest float64 number. Each row is computed from its own
    entries alone.
    """
    raise NotImplementedError
''',
    reference=log_softmax,
    cases=_cases,
    rtol=1e-9,
    atol=1e-9,
    mistakes=(_log_of_softmax, _unshifted, _global_shift),
)
"""Write the log-softmax so that neither overflow nor underflow reaches it (the log-sum-exp section)."""
