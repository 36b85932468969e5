r"""Does a sample of tokens follow a given Markov source? Counts, distances and a test of fit.

A model trained on a :class:`~tinyformer.data.markov.MarkovSource` can be judged
by what it generates: count, for every context of :math:`k` tokens, which token
came next, and compare those frequencies with the source's transition table.

- :func:`transition_counts` counts (context, next token) pairs;
- :func:`mean_total_variation` is the count-weighted total-variation distance
  between the sample's conditional frequencies and the source's probabilities;
- :func:`chi_square_fit` is Pearson's test of fit for a Markov chain of known
  transitions :cite:p:`anderson1957statistical`, with transitions the source
  forbids counted apart (any one of them already rules the source out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import describe, positive_int

__all__ = [
    "FitResult",
    "chi_square_fit",
    "chi_square_survival",
    "mean_total_variation",
    "transition_counts",
]


def _check_table(probs: object, counts: np.ndarray) -> np.ndarray:
    """A ``(C, V)`` transition table with rows summing to one, matching ``counts``."""
    table = np.asarray(probs, dtype=np.float64)
    if table.shape != counts.shape:
        raise ValueError(
            f"probs must have the shape of counts {counts.shape} (contexts, vocabulary),"
            f" got {describe(table)}"
        )
    if not np.isfinite(table).all() or (table < 0).any():
        raise ValueError("probs must be finite and non-negative")
    if not np.allclose(table.sum(axis=1), 1.0, atol=1e-9):
        raise ValueError("every row of probs must sum to 1 (a distribution over the next token)")
    return table


def _check_counts(counts: object) -> np.ndarray:
    """Non-negative integer counts of shape ``(C, V)``."""
    c = np.asarray(counts)
    if c.ndim != 2 or c.dtype.kind not in "iu" or (c.size and c.min() < 0):
        raise ValueError(
            f"counts must be non-negative integers of shape (contexts, vocabulary),"
            f" got {describe(c)}"
        )
    return c.astype(np.int64)


def transition_counts(tokens: object, vocab_size: int, order: int) -> np.ndarray:
    r"""How often each context of ``order`` tokens is followed by each token.

    Parameters
    ----------
    tokens : array_like of int
        One stream ``(L,)`` or independent streams ``(n, L)``, ids in
        ``[0, vocab_size)``; pairs never span two streams.
    vocab_size, order : int
        :math:`V` and :math:`k`.

    Returns
    -------
    numpy.ndarray of int64
        ``counts[c, x]``, shape ``(V**k, V)``, where context ``c`` indexes the
        :math:`k` tokens :math:`(x_1, \dots, x_k)` as :math:`\sum_j x_j V^{k-j}`
        (the order of :meth:`MarkovSource.context_index
        <tinyformer.data.markov.MarkovSource.context_index>`).
    """
    vocab_size = positive_int(vocab_size, "vocab_size")
    order = positive_int(order, "order")
    streams = np.asarray(tokens)
    if streams.ndim == 1:
        streams = streams[None, :]
    if streams.ndim != 2 or streams.dtype.kind not in "iu":
        raise ValueError(
            f"tokens must be integer ids of shape (L,) or (n, L), got {describe(tokens)}"
        )
    if streams.shape[1] <= order:
        raise ValueError(
            f"each stream needs more than order={order} tokens, got length {streams.shape[1]}"
        )
    if streams.min() < 0 or streams.max() >= vocab_size:
        raise ValueError(
            f"token ids must be in [0, {vocab_size}), got {streams.min()}..{streams.max()}"
        )
    length = streams.shape[1]
    context = np.zeros((streams.shape[0], length - order), dtype=np.int64)  # (n, L - k)
    for j in range(order):
        context = context * vocab_size + streams[:, j : length - order + j]
    pair = context * vocab_size + streams[:, order:]  # (n, L - k): context, then next token
    counts = np.bincount(pair.ravel(), minlength=vocab_size ** (order + 1))
    return counts.reshape(vocab_size**order, vocab_size)


def mean_total_variation(counts: object, probs: object) -> float:
    r"""Count-weighted mean total-variation distance between frequencies and probabilities.

    .. math::
        \bar d = \sum_c \frac{n_c}{N}\, \frac12 \sum_x
        \Bigl|\frac{n_{c,x}}{n_c} - p(x \mid c)\Bigr|

    over the contexts seen (:math:`n_c > 0`). For a sample drawn from ``probs``
    itself it shrinks like :math:`1/\sqrt{N}`; for any other source it levels
    off at that source's own distance from ``probs``.
    """
    c = _check_counts(counts)
    table = _check_table(probs, c)
    n_c = c.sum(axis=1)  # (C,)
    seen = n_c > 0
    if not seen.any():
        raise ValueError("counts are all zero: nothing to compare")
    freq = c[seen] / n_c[seen, None]
    per_context = 0.5 * np.abs(freq - table[seen]).sum(axis=1)
    return float(n_c[seen] @ per_context / n_c.sum())


def chi_square_survival(statistic: float, dof: int) -> float:
    r"""Upper tail :math:`P(X \ge x)` of a chi-square variable with ``dof`` degrees of freedom.

    Wilson and Hilferty's cube-root normal approximation
    :cite:p:`wilson1931distribution`: :math:`(X / \nu)^{1/3}` is close to normal with
    mean :math:`1 - 2/(9\nu)` and variance :math:`2/(9\nu)`; its error in
    the tail probability is below 0.005 from about :math:`\nu = 10` on, and much smaller
    for the hundreds of degrees of freedom of a transition table.
    """
    dof = positive_int(dof, "dof")
    x = float(statistic)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"statistic must be a finite number >= 0, got {statistic!r}")
    spread = 2.0 / (9.0 * dof)
    z = ((x / dof) ** (1.0 / 3.0) - (1.0 - spread)) / math.sqrt(spread)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class FitResult:
    r"""Pearson's test of a transition table against counts (see :func:`chi_square_fit`).

    Attributes
    ----------
    statistic : float
        Pearson's :math:`X^2` over the allowed transitions.
    dof : int
        Degrees of freedom: for each context seen, its allowed next tokens minus one.
    p_value : float
        :math:`P(\chi^2_{\text{dof}} \ge X^2)`: small means the counts do not fit.
    forbidden : int
        Transitions counted that the table gives probability 0.
    n_transitions : int
        All transitions counted, forbidden ones included.
    """

    statistic: float
    dof: int
    p_value: float
    forbidden: int
    n_transitions: int


def chi_square_fit(counts: object, probs: object) -> FitResult:
    r"""Pearson's chi-square test that ``counts`` were generated by the chain ``probs``.

    Given the number :math:`n_c` of times each context occurs, the next tokens
    after it are a multinomial draw from :math:`p(\cdot \mid c)` if the chain
    generated them, so

    .. math::
        X^2 = \sum_{c} \sum_{x:\, p(x \mid c) > 0}
        \frac{(n_{c,x} - n_c\, p(x \mid c))^2}{n_c\, p(x \mid c)}

    is close to chi-square with :math:`\sum_c (|\{x : p(x\mid c) > 0\}| - 1)`
    degrees of freedom, summed over the contexts seen
    :cite:p:`anderson1957statistical`. Transitions with :math:`p(x \mid c) = 0` do
    not enter :math:`X^2` (their term would be infinite); :attr:`FitResult.forbidden`
    reports them, and :math:`n_c` counts only the allowed ones. The approximation
    wants expected counts of about five or more in most cells.
    """
    c = _check_counts(counts)
    table = _check_table(probs, c)
    allowed = table > 0
    kept = np.where(allowed, c, 0)
    n_c = kept.sum(axis=1)  # (C,) allowed transitions after each context
    seen = n_c > 0
    expected = n_c[:, None] * table  # (C, V)
    cells = allowed & seen[:, None]
    statistic = float(((kept - expected)[cells] ** 2 / expected[cells]).sum())
    dof = int((allowed.sum(axis=1) - 1)[seen].sum())
    if dof < 1:
        raise ValueError("the counts leave no degree of freedom (every seen context is certain)")
    return FitResult(
        statistic=statistic,
        dof=dof,
        p_value=chi_square_survival(statistic, dof),
        forbidden=int(c[~allowed].sum()),
        n_transitions=int(c.sum()),
    )
