r"""Sequences that repeat a random segment: the data of the in-context-learning experiment.

A row is a segment of :math:`L` tokens drawn uniformly at random, written out
again and again until the row is full:

.. math:: x_t = s_{t \bmod L}, \qquad s_0, \dots, s_{L-1} \sim \text{Uniform}\{0, \dots, V-1\}.

Every row draws a fresh segment, so nothing about the content can be learned
from the training set: the first :math:`L` tokens of a row are unpredictable
(a predictor told the period can do no better than :math:`\log V` on them; one that
must infer the period from the row does worse), and every later token is a copy
of the one :math:`L` places before it, which a model can predict only by
reading the row itself. The period :math:`L` is drawn per row from
``min_period .. max_period``, so no fixed offset finds the copy either.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import generator, positive_int

__all__ = ["repeated_halves", "repeated_segments"]


def _check_periods(length: int, min_period: int, max_period: int) -> tuple[int, int, int]:
    length = positive_int(length, "length")
    min_period = positive_int(min_period, "min_period")
    max_period = positive_int(max_period, "max_period")
    if not min_period <= max_period <= length:
        raise ValueError(
            "periods must satisfy min_period <= max_period <= length, got"
            f" min_period={min_period}, max_period={max_period}, length={length}"
        )
    return length, min_period, max_period


def repeated_segments(
    n_sequences: int,
    length: int,
    vocab_size: int,
    *,
    min_period: int,
    max_period: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``length`` tokens, each a fresh random segment repeated with its own period.

    Parameters
    ----------
    n_sequences, length, vocab_size : int
        Number of rows, tokens per row, and tokens to draw from (ids ``0 .. vocab_size - 1``).
    min_period, max_period : int
        Each row's period :math:`L` is uniform on ``min_period .. max_period``
        (``max_period <= length``).
    rng : numpy.random.Generator

    Returns
    -------
    tokens : numpy.ndarray of int64
        ``(n_sequences, length)``, with ``tokens[i, t] == tokens[i, t - periods[i]]``
        for every ``t >= periods[i]``.
    periods : numpy.ndarray of int64
        ``(n_sequences,)``.
    """
    n_sequences = positive_int(n_sequences, "n_sequences")
    vocab_size = positive_int(vocab_size, "vocab_size")
    length, min_period, max_period = _check_periods(length, min_period, max_period)
    rng = generator(rng)
    periods = rng.integers(min_period, max_period + 1, size=n_sequences)  # (N,)
    segments = rng.integers(0, vocab_size, size=(n_sequences, max_period))  # (N, L_max)
    where = np.arange(length)[None, :] % periods[:, None]  # (N, length): t mod L
    return np.take_along_axis(segments, where, axis=1), periods


def repeated_halves(
    n_sequences: int, half_length: int, vocab_size: int, *, rng: np.random.Generator
) -> np.ndarray:
    """Rows of ``2 * half_length`` tokens whose second half repeats a random first half.

    The special case ``min_period = max_period = half_length`` of
    :func:`repeated_segments`; returns the tokens ``(n_sequences, 2 * half_length)``.
    """
    half_length = positive_int(half_length, "half_length")
    tokens, _ = repeated_segments(
        n_sequences,
        2 * half_length,
        vocab_size,
        min_period=half_length,
        max_period=half_length,
        rng=rng,
    )
    return tokens
