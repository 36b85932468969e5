"""From logits to the distribution a decoder draws from: penalties, temperature, top-k, top-p, min-p.

Every function here works on the last axis of an array of logits ``(..., V)``
and keeps its floating dtype. A token that a filter removes gets log-probability
``-inf`` (probability exactly 0), and what remains is renormalized, so the result
is always a proper distribution over at least one token.

Ties are broken the same way everywhere: among tokens with equal scores the
smaller token id ranks first. That is also the choice of ``numpy.argmax``,
so ``top_k=1`` and a tiny ``top_p`` pick exactly the token greedy decoding picks.
"""

from __future__ import annotations

import numbers

import numpy as np

from tinyformer._validation import (
    as_array,
    describe,
    float_array,
    generator,
    positive_float,
    positive_int,
    token_ids,
)
from tinyformer.functional import log_softmax

__all__ = [
    "check_options",
    "check_penalties",
    "check_temperature",
    "log_probabilities",
    "penalize",
    "probabilities",
    "sample_tokens",
    "token_counts",
]


def check_temperature(temperature: object) -> float:
    """Return ``temperature`` as a float if it is a finite number > 0, else raise.

    Temperature 0 is refused rather than treated as a special case: its limit is
    greedy decoding, which :func:`~tinyformer.generation.search.greedy` does exactly.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a positive number, got {describe(temperature)}")
    if not np.isfinite(temperature) or temperature <= 0:
        hint = " (temperature 0 is greedy decoding: use greedy())" if temperature == 0 else ""
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}{hint}")
    return float(temperature)


def _check_top_k(top_k: object, vocab_size: int) -> int | None:
    if top_k is None:
        return None
    k = positive_int(top_k, "top_k")
    if k > vocab_size:
        raise ValueError(f"top_k must be at most the vocabulary size {vocab_size}, got {k}")
    return k


def _check_top_p(top_p: object) -> float | None:
    if top_p is None:
        return None
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
        raise TypeError(f"top_p must be a number in (0, 1], got {describe(top_p)}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return float(top_p)


def _check_min_p(min_p: object) -> float | None:
    if min_p is None:
        return None
    if isinstance(min_p, bool) or not isinstance(min_p, numbers.Real):
        raise TypeError(f"min_p must be a number in [0, 1], got {describe(min_p)}")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    return float(min_p)


def check_options(
    vocab_size: int,
    *,
    temperature: object,
    top_k: object,
    top_p: object,
    min_p: object = None,
) -> tuple[float, int | None, float | None, float | None]:
    """Check ``temperature``, ``top_k``, ``top_p`` and ``min_p`` for a vocabulary of ``vocab_size``; return them."""
    return (
        check_temperature(temperature),
        _check_top_k(top_k, vocab_size),
        _check_top_p(top_p),
        _check_min_p(min_p),
    )


def check_penalties(
    repetition_penalty: object, frequency_penalty: object, presence_penalty: object
) -> tuple[float, float, float]:
    """Check the three penalties of :func:`penalize` (a finite number, > 0 for the first); return them."""
    repetition = positive_float(repetition_penalty, "repetition_penalty")
    for value, name in (
        (frequency_penalty, "frequency_penalty"),
        (presence_penalty, "presence_penalty"),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a finite number, got {describe(value)}")
        if not np.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    return repetition, float(frequency_penalty), float(presence_penalty)  # type: ignore[arg-type]


def token_counts(history: object, vocab_size: int) -> np.ndarray:
    """How often each token id occurs in each row of ``history`` ``(B, T)``: ``(B, V)`` int64."""
    ids = token_ids(history, "history", vocab_size)
    if ids.ndim != 2:
        raise ValueError(f"history must have shape (B, T), got shape {ids.shape}")
    counts = np.zeros((ids.shape[0], vocab_size), dtype=np.int64)  # (B, V)
    rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)  # (B, T)
    np.add.at(counts, (rows, ids), 1)
    return counts


def penalize(
    logits: np.ndarray,
    history: np.ndarray,
    *,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> np.ndarray:
    r"""Lower the logits of the tokens that already occur in ``history``.

    With :math:`c_v` the number of times token :math:`v` occurs in a row of
    ``history``, :math:`\theta` the repetition penalty and :math:`\alpha_f`,
    :math:`\alpha_p` the frequency and presence penalties:

    .. math::
        z'_v = \begin{cases} z_v / \theta & c_v > 0,\ z_v > 0 \\
                             z_v \, \theta & c_v > 0,\ z_v \le 0 \\
                             z_v & c_v = 0 \end{cases}
        \qquad
        z''_v = z'_v - \alpha_f \, c_v - \alpha_p \, [c_v > 0].

    The repetition penalty is that of CTRL :cite:p:`keskar2019ctrl` (section 4.1),
    which divides the logit of a seen token by :math:`\theta`; a negative logit
    is multiplied instead, as Hugging Face Transformers does, so that
    :math:`\theta > 1` lowers it too. It depends on where zero lies, so unlike
    the softmax it changes when a constant is added to every logit. The frequency
    and presence penalties come from OpenAI's API documentation, not from a
    paper; they subtract, so a shift of all logits leaves them unchanged.
    Neutral values (1, 0, 0) return the logits as they are.

    Parameters
    ----------
    logits : numpy.ndarray
        ``(B, V)`` scores; ``-inf`` stays ``-inf``.
    history : numpy.ndarray
        ``(B, T)`` token ids seen so far in each row (``T`` may be 0).
    repetition_penalty : float
        :math:`\theta > 0`; 1 changes nothing, above 1 discourages repeats.
    frequency_penalty, presence_penalty : float
        Finite numbers; 0 changes nothing, above 0 discourages repeats.

    Returns
    -------
    numpy.ndarray
        ``(B, V)``, the dtype of ``logits``.
    """
    z = float_array(logits, "logits", ndim=2)
    repetition, frequency, presence = check_penalties(
        repetition_penalty, frequency_penalty, presence_penalty
    )
    history = as_array(history, "history")
    if history.ndim != 2 or history.shape[0] != z.shape[0]:
        raise ValueError(
            f"history must have shape ({z.shape[0]}, T), the rows of logits, got shape {history.shape}"
        )
    counts = token_counts(history, z.shape[1])  # (B, V)
    seen = counts > 0  # (B, V)
    theta = z.dtype.type(repetition)
    z = np.where(seen, np.where(z > 0, z / theta, z * theta), z)  # (B, V)
    return z - z.dtype.type(frequency) * counts.astype(z.dtype) - z.dtype.type(presence) * seen


def _ranks(log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order of the tokens, most likely first (ties: smaller id first), and each token's rank."""
    order = np.argsort(-log_probs, axis=-1, kind="stable")  # (..., V)
    ranks = np.empty_like(order)
    positions = np.broadcast_to(np.arange(order.shape[-1]), order.shape)
    np.put_along_axis(ranks, order, positions, axis=-1)
    return order, ranks


def _renormalize(log_probs: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Set the tokens outside ``keep`` to ``-inf`` and renormalize the rest."""
    return log_softmax(np.where(keep, log_probs, -np.inf))


def log_probabilities(
    logits: np.ndarray,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    r"""Log-probabilities of the next token after temperature, top-k, top-p and min-p.

    The four steps run in this order, each on the output of the one before:

    1. **temperature** :math:`\tau`: :math:`\log p_i = z_i/\tau - \log\sum_j e^{z_j/\tau}`.
       Below 1 it sharpens the distribution, above 1 it flattens it.
    2. **top-k** :cite:p:`fan2018hierarchical`: keep the ``top_k`` most likely
       tokens and renormalize.
    3. **top-p** (nucleus) :cite:p:`holtzman2020curious`: keep the smallest set of
       most likely tokens whose total probability reaches ``top_p``, and
       renormalize. A token is kept when the mass of the tokens ranked before it
       is still below ``top_p``, so the most likely token is always kept.
    4. **min-p** :cite:p:`nguyen2025minp`: keep the tokens whose probability is
       at least ``min_p`` times that of the most likely token,
       :math:`p_v \ge p_{\min} \max_u p_u`, and renormalize. The cut scales with
       the top token: high when the model is sure, low when it is not.

    Parameters
    ----------
    logits : numpy.ndarray
        Unnormalized scores ``(..., V)``; ``-inf`` marks a token that is impossible.
    temperature : float
        A finite number > 0. Temperature 0 is refused; its limit is greedy decoding.
    top_k : int, optional
        Between 1 and ``V``; ``None`` keeps every token.
    top_p : float, optional
        In :math:`(0, 1]`; ``None`` or 1 keeps every token.
    min_p : float, optional
        In :math:`[0, 1]`; ``None`` or 0 keeps every token, 1 only the most likely
        (and any tied with it).

    Returns
    -------
    numpy.ndarray
        ``(..., V)``, the dtype of ``logits``; ``-inf`` for every removed token, and
        ``logsumexp`` over the last axis equal to 0.
    """
    z = float_array(logits, "logits", min_ndim=1)
    temperature, top_k, top_p, min_p = check_options(
        z.shape[-1], temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
    )
    # Shift before dividing: the largest logit becomes 0 and the others can only fall, so
    # a tiny temperature sends them to -inf (probability 0) instead of overflowing to inf.
    shifted = z - np.max(z, axis=-1, keepdims=True)  # (..., V), <= 0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = np.where(shifted == 0, shifted, shifted / z.dtype.type(temperature))
    log_p = log_softmax(scaled)  # (..., V)
    if top_k is not None and top_k < z.shape[-1]:
        _, ranks = _ranks(log_p)
        log_p = _renormalize(log_p, ranks < top_k)
    if top_p is not None and top_p < 1.0:
        order, ranks = _ranks(log_p)
        sorted_p = np.exp(np.take_along_axis(log_p, order, axis=-1).astype(np.float64))
        mass_before = np.zeros_like(sorted_p)  # (..., V), in rank order; 0 for the first
        np.cumsum(sorted_p[..., :-1], axis=-1, out=mass_before[..., 1:])
        keep_sorted = mass_before < top_p
        log_p = _renormalize(log_p, np.take_along_axis(keep_sorted, ranks, axis=-1))
    if min_p is not None and min_p > 0.0:
        # p_v >= min_p * p_max, in logs: the most likely token always passes.
        cut = np.max(log_p, axis=-1, keepdims=True) + np.log(min_p)  # (..., 1), float64
        log_p = _renormalize(log_p, log_p >= cut.astype(log_p.dtype))
    return log_p


def probabilities(
    logits: np.ndarray,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    """Probabilities of the next token: the exponential of :func:`~tinyformer.generation.processing.log_probabilities`.

    Removed tokens get probability exactly 0; each row sums to 1.
    """
    return np.exp(
        log_probabilities(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    )


def sample_tokens(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    r"""Draw one token per row of ``probs`` ``(B, V)`` by inverting the cumulative distribution.

    One uniform number :math:`u \in [0, 1)` per row (drawn with ``rng.random(B)``)
    picks the first token whose cumulative probability exceeds :math:`u` times
    the row total. A token of probability 0 is therefore never drawn, and the
    same generator state gives the same tokens.

    Parameters
    ----------
    probs : numpy.ndarray
        ``(B, V)`` non-negative weights with a positive sum in every row (they
        need not sum exactly to 1).
    rng : numpy.random.Generator
        The only source of randomness.

    Returns
    -------
    numpy.ndarray
        ``(B,)`` int64 token ids.
    """
    p = float_array(probs, "probs", ndim=2).astype(np.float64)
    rng = generator(rng)
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError("probs must be finite and non-negative")
    cumulative = np.cumsum(p, axis=-1)  # (B, V)
    totals = cumulative[:, -1]
    if (totals <= 0).any():
        raise ValueError("probs must have a positive sum in every row")
    u = rng.random(p.shape[0]) * totals  # (B,)
    u = np.minimum(u, np.nextafter(totals, 0.0))  # u * total may round up to the total
    return (cumulative <= u[:, None]).sum(axis=-1).astype(np.int64)
