"""Measurements on attention and on generated text, for the book's experiments.

Attention: how spread out the weights are (:func:`attention_entropy`) and how
saturated the softmax is (:func:`softmax_saturation`), built on
:mod:`tinyformer.attention` and :mod:`tinyformer.functional`.

Generation against a source whose next-token distribution is known (a
:class:`~tinyformer.data.markov.MarkovSource`): :func:`plant_forbidden` puts an
error into a stream, :func:`continue_from_source` lets the source write on from
any prefix, and :func:`next_token_errors` measures, at every position, how far a
model's next-token distribution lies from the source's. Together they measure
whether a model's errors compound: how its per-step error after a planted error
compares with its error after a correct prefix.

None of these functions takes part in a model's forward or backward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import (
    axis_index,
    describe,
    float_array,
    generator,
    non_negative_int,
    positive_int,
    token_ids,
)
from tinyformer.attention import (
    _scale,
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
)
from tinyformer.data.markov import MarkovSource
from tinyformer.functional import log_softmax, softmax_backward

__all__ = [
    "SATURATED",
    "SaturationReport",
    "attention_entropy",
    "continue_from_source",
    "next_token_errors",
    "plant_forbidden",
    "softmax_saturation",
]

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
    factor = _scale(scale, d_k)
    seq_len = positive_int(seq_len, "seq_len")
    n_samples = positive_int(n_samples, "n_samples")
    d_v = positive_int(d_v, "d_v")

    q = rng.standard_normal((n_samples, seq_len, d_k))  # (N, T, d_k)
    k = rng.standard_normal((n_samples, seq_len, d_k))  # (N, T, d_k)
    v = rng.standard_normal((n_samples, seq_len, d_v))  # (N, T, d_v)
    grad_out = rng.standard_normal((n_samples, seq_len, d_v)) / math.sqrt(d_v)

    out, weights = scaled_dot_product_attention(q, k, v, scale=factor)  # (N, T, T)
    scores = factor * (q @ np.swapaxes(k, -1, -2))  # (N, T, T), the softmax's input
    grad_weights = grad_out @ np.swapaxes(v, -1, -2)  # (N, T, T)
    grad_scores = softmax_backward(grad_weights, weights)  # (N, T, T)
    grad_q, _, _ = scaled_dot_product_attention_backward(
        grad_out, q, k, v, weights, out, scale=factor
    )
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


def _source(source: object) -> MarkovSource:
    if not isinstance(source, MarkovSource):
        raise TypeError(f"source must be a MarkovSource, got {describe(source)}")
    return source


def _streams(streams: object, source: MarkovSource, name: str = "streams") -> np.ndarray:
    """``streams`` as a ``(N, T)`` array of the source's token ids with ``T >= order``."""
    ids = token_ids(streams, name, source.vocab_size)
    if ids.ndim != 2 or ids.shape[1] < source.order:
        raise ValueError(
            f"{name} must have shape (N, T) with T >= the source's order {source.order},"
            f" got shape {ids.shape}"
        )
    return ids


def _contexts(streams: np.ndarray, order: int) -> np.ndarray:
    """The ``order`` tokens ending at each position ``order - 1 ..``: ``(N, T - order + 1, order)``."""
    n_positions = streams.shape[1] - order + 1
    return np.stack([streams[:, j : j + n_positions] for j in range(order)], axis=-1)


def plant_forbidden(
    source: MarkovSource, streams: np.ndarray, positions: object, *, rng: np.random.Generator
) -> np.ndarray:
    """Copies of ``streams`` with the token at each of ``positions`` replaced by an impossible one.

    At each position ``t`` (in increasing order) the token becomes one drawn
    uniformly from those the source never emits after the ``order`` tokens before
    ``t`` (as they stand after earlier replacements): a planted error that no
    stream of the source contains. The tokens after ``t`` are left as they were.

    Parameters
    ----------
    source : MarkovSource
        The source whose transitions define what is impossible.
    streams : numpy.ndarray of int
        ``(N, T)`` token ids.
    positions : int or sequence of int
        Positions to corrupt, each in ``[order, T)``.
    rng : numpy.random.Generator
        Draws the replacement tokens.

    Returns
    -------
    numpy.ndarray
        A new ``(N, T)`` array.
    """
    source = _source(source)
    planted = _streams(streams, source).copy()
    rng = generator(rng)
    order, length = source.order, planted.shape[1]
    spots = sorted({non_negative_int(t, "positions") for t in np.atleast_1d(positions).tolist()})
    if not spots or spots[0] < order or spots[-1] >= length:
        raise ValueError(
            f"positions must lie in [{order}, {length}) (after a full context), got {spots}"
        )
    forbidden = source.transitions.reshape(source.n_contexts, source.vocab_size) == 0  # (C, V)
    for t in spots:
        rows = forbidden[source.context_index(planted[:, t - order : t])]  # (N, V)
        if not rows.any(axis=1).all():
            raise ValueError(f"some context before position {t} allows every token")
        # the k-th forbidden token of each row, k uniform among that row's forbidden tokens
        pick = (rng.random(len(rows)) * rows.sum(axis=1)).astype(np.int64)
        planted[:, t] = np.argmax(np.cumsum(rows, axis=1) > pick[:, None], axis=1)
    return planted


def continue_from_source(
    source: MarkovSource, streams: np.ndarray, n_new: int, *, rng: np.random.Generator
) -> np.ndarray:
    r"""``streams`` extended by ``n_new`` tokens that the source draws after each one's last tokens.

    Each new token is drawn from :math:`p(\cdot \mid \text{the } k \text{ tokens
    before it})` by inverting the cumulative distribution with one uniform number
    per stream and step (``rng.random(N)``), so two calls whose generators are in
    the same state draw coupled continuations: where two prefixes end in the same
    context, their next tokens agree. A prefix may end in a context the source
    never reaches from its own history (after :func:`plant_forbidden`); the source
    continues from it all the same, as a Markov chain does.

    Returns
    -------
    numpy.ndarray
        ``(N, T + n_new)``.
    """
    source = _source(source)
    out = _streams(streams, source)
    rng = generator(rng)
    n_new = non_negative_int(n_new, "n_new")
    order = source.order
    for _ in range(n_new):
        probs = source.next_token_probs(out[:, -order:])  # (N, V)
        cdf = np.cumsum(probs, axis=1)
        u = rng.random(len(out))[:, None] * cdf[:, -1:]
        out = np.concatenate([out, np.argmax(cdf > u, axis=1)[:, None]], axis=1)
    return out


def next_token_errors(
    model: object, source: MarkovSource, streams: np.ndarray, *, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    r"""How far the model's next-token distribution lies from the source's, at every position.

    For stream :math:`i` and each position :math:`t \ge k - 1` (the first with a
    full context of the source's order :math:`k`), with :math:`q` the model's
    distribution after tokens :math:`0..t` and :math:`p` the source's after the
    last :math:`k` of them:

    .. math::
        \operatorname{TV}_{i t} = \tfrac12 \sum_v |q(v) - p(v)|, \qquad
        F_{i t} = \sum_{v:\, p(v) = 0} q(v),

    the total-variation distance and the probability the model puts on tokens the
    source never emits there (the chance that sampling writes an error). The
    source's distribution depends only on the last :math:`k` tokens; the model
    reads everything before, so a planted error further back can move :math:`q`
    but not :math:`p`.

    Parameters
    ----------
    model : DecoderOnlyLM
        A decoder-only model over the source's vocabulary; ``streams`` must fit
        its context (at most ``context_length`` tokens are read: the last token
        of each stream is only a target).
    source : MarkovSource
    streams : numpy.ndarray of int
        ``(N, T)`` token ids.
    batch_size : int
        Streams per forward pass.

    Returns
    -------
    tv, forbidden : numpy.ndarray
        Each ``(N, T - k)``: column ``j`` is the prediction made at position
        ``j + k - 1``, of token ``j + k``.
    """
    source = _source(source)
    ids = _streams(streams, source)
    batch_size = positive_int(batch_size, "batch_size")
    order = source.order
    if ids.shape[1] <= order:
        raise ValueError(
            f"streams must be longer than the source's order {order}, got {ids.shape[1]}"
        )
    p = source.next_token_probs(_contexts(ids[:, :-1], order))  # (N, T - k, V)
    q = np.concatenate(
        [
            np.exp(log_softmax(model.forward(ids[i : i + batch_size, :-1]).astype(np.float64)))
            for i in range(0, len(ids), batch_size)
        ]
    )[:, order - 1 :]  # (N, T - k, V)
    tv = 0.5 * np.abs(q - p).sum(axis=-1)
    forbidden = np.where(p == 0, q, 0.0).sum(axis=-1)
    return tv, forbidden
