"""Measurements on attention: how spread out the weights are and how saturated the softmax is.

These functions do not take part in a model's forward or backward pass; they
measure what the pass does, for the book's experiments and for inspecting
trained heads. Both build on :mod:`tinyformer.attention` and
:mod:`tinyformer.functional`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import axis_index, describe, float_array, positive_float, positive_int
from tinyformer.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
)
from tinyformer.functional import softmax_backward

__all__ = ["SATURATED", "SaturationReport", "attention_entropy", "softmax_saturation"]

SATURATED = 0.99
"""A row of attention weights counts as saturated when its largest weight exceeds this."""


def attention_entropy(weights: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Shannon entropy, in nats, of each attention distribution along ``axis``.

    .. math:: H(a) = -\sum_j a_j \log a_j, \qquad 0 \log 0 = 0

    :math:`H` is 0 when a query puts all its weight on one key and
    :math:`\log T_k` when it spreads it evenly over :math:`T_k` keys. A row
    whose every key was masked (all weights 0) gets entropy 0.

    Parameters
    ----------
    weights : numpy.ndarray
        Non-negative attention weights, for example ``(..., T_q, T_k)``, whose
        slices along ``axis`` sum to one (or are all zero).
    axis : int
        The axis of the keys.

    Returns
    -------
    numpy.ndarray
        ``weights`` with ``axis`` removed, same floating dtype.
    """
    a = float_array(weights, "weights", min_ndim=1)
    axis = axis_index(axis, a.ndim)
    if not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(f"weights must be finite and non-negative, got {describe(a)}")
    safe = np.where(a > 0, a, 1)  # log(1) = 0 supplies 0 log 0 = 0
    return -(a * np.log(safe)).sum(axis=axis)


@dataclass(frozen=True)
class SaturationReport:
    r"""What :func:`softmax_saturation` measured, over all query rows of all samples.

    Attributes
    ----------
    d_k : int
        Dimension of queries and keys.
    scale : float
        The factor the scores were multiplied by before the softmax.
    score_std : float
        Standard deviation of the scaled scores, the softmax's input.
    max_weight : float
        Mean of each row's largest weight (1/T_k if uniform, 1 if one-hot).
    saturated_fraction : float
        Fraction of rows whose largest weight exceeds ``SATURATED`` (0.99).
    entropy : float
        Mean entropy of the rows in nats (see :func:`attention_entropy`).
    score_grad_norm : float
        Median over rows of the Euclidean norm of a row of
        :math:`\partial L / \partial S`, the gradient that reaches the scaled
        scores through the softmax.
    query_grad_norm : float
        Median over rows of the norm of a row of :math:`\partial L / \partial Q`.

    Notes
    -----
    The gradient norms are medians because their distribution is heavy-tailed
    once the softmax saturates: most rows get almost no gradient while the few
    whose two largest scores nearly tie get a large one, and a mean would
    report the few.
    """

    d_k: int
    scale: float
    score_std: float
    max_weight: float
    saturated_fraction: float
    entropy: float
    score_grad_norm: float
    query_grad_norm: float


def softmax_saturation(
    d_k: int,
    *,
    rng: np.random.Generator,
    scale: float | None = None,
    seq_len: int = 32,
    n_samples: int = 64,
    d_v: int = 16,
) -> SaturationReport:
    r"""Run attention on random inputs and measure how peaked and how trainable it is.

    Queries and keys have independent standard-normal components, the setting
    in which :math:`\operatorname{Var}(q \cdot k) = d_k`. Values are standard
    normal too, and the loss is :math:`L = \sum O \odot G` for a random
    :math:`G` with variance :math:`1/d_v`, so that every entry of
    :math:`\partial L/\partial A = G V^\top` has unit variance whatever
    :math:`d_k` is. The gradient then flows back through the softmax,

    .. math:: \frac{\partial L}{\partial S}
              = A \odot \Bigl(\frac{\partial L}{\partial A}
              - \operatorname{rowsum}\bigl(A \odot \tfrac{\partial L}{\partial A}\bigr)\Bigr),

    which vanishes as the rows of :math:`A` approach one-hot vectors. The
    gradient norms are reported as medians over rows (see
    :class:`SaturationReport`).

    Parameters
    ----------
    d_k : int
        Dimension of queries and keys.
    rng : numpy.random.Generator
        Source of every random number.
    scale : float, optional
        Factor for the scores, as in
        :func:`~tinyformer.attention.scaled_dot_product_attention`; the default
        is :math:`1/\sqrt{d_k}`, and ``1.0`` means no scaling.
    seq_len : int
        Number of queries and of keys in each sample.
    n_samples : int
        Number of independent samples, each ``(seq_len, d_k)``.
    d_v : int
        Dimension of the values.

    Returns
    -------
    SaturationReport
        The measurements, as Python floats.
    """
    d_k = positive_int(d_k, "d_k")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {describe(rng)}")
    factor = 1.0 / math.sqrt(d_k) if scale is None else positive_float(scale, "scale")
    seq_len = positive_int(seq_len, "seq_len")
    n_samples = positive_int(n_samples, "n_samples")
    d_v = positive_int(d_v, "d_v")

    q = rng.standard_normal((n_samples, seq_len, d_k))  # (N, T, d_k)
    k = rng.standard_normal((n_samples, seq_len, d_k))  # (N, T, d_k)
    v = rng.standard_normal((n_samples, seq_len, d_v))  # (N, T, d_v)
    grad_out = rng.standard_normal((n_samples, seq_len, d_v)) / math.sqrt(d_v)

    _, weights = scaled_dot_product_attention(q, k, v, scale=factor)  # (N, T, T)
    scores = factor * (q @ np.swapaxes(k, -1, -2))  # (N, T, T), the softmax's input
    grad_weights = grad_out @ np.swapaxes(v, -1, -2)  # (N, T, T)
    grad_scores = softmax_backward(grad_weights, weights)  # (N, T, T)
    grad_q, _, _ = scaled_dot_product_attention_backward(grad_out, q, k, v, weights, scale=factor)
    largest = weights.max(axis=-1)  # (N, T)
    return SaturationReport(
        d_k=d_k,
        scale=factor,
        score_std=float(scores.std()),
        max_weight=float(largest.mean()),
        saturated_fraction=float((largest > SATURATED).mean()),
        entropy=float(attention_entropy(weights).mean()),
        score_grad_norm=float(np.median(np.linalg.norm(grad_scores, axis=-1))),
        query_grad_norm=float(np.median(np.linalg.norm(grad_q, axis=-1))),
    )
