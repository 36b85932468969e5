r"""The corruption of masked language modeling, and the exact best guess it allows on a Markov source.

:cite:t:`devlin2019bert` (section 3.1, "Task #1: Masked LM") train an encoder to
restore tokens it cannot see. Each position is *chosen* with probability
:math:`\rho` (15%); a chosen token is replaced by ``[MASK]`` with probability
0.8, by a random token with probability 0.1, and left as it is with
probability 0.1. The loss counts the chosen positions only. Here each position
is chosen independently (BERT's own data script picks a fixed count,
:math:`\operatorname{round}(0.15\,T)`, per sequence), and a random token is drawn
uniformly from the :math:`V` ordinary tokens (never ``[MASK]``; it may equal the
original).

Because every position is corrupted independently, the corrupted sequence
:math:`\tilde x` is a noisy observation of the clean one, position by position,
with the *emission* probabilities

.. math::
    e(\tilde x_t \mid x_t) = (1 - \rho)\,[\tilde x_t = x_t]
        + \rho\,\bigl(m\,[\tilde x_t = \text{MASK}] + r / V\,[\tilde x_t \ne \text{MASK}]
        + k\,[\tilde x_t = x_t]\bigr)

(:math:`m, r, k` = 0.8, 0.1, 0.1), and at a position known to be chosen the same
formula with :math:`\rho = 1`. On a source whose distribution is known exactly
(:class:`~tinyformer.data.markov.MarkovSource`) the best possible prediction of a
chosen token from everything the model sees,
:math:`p(x_t \mid \tilde x, t \text{ chosen})`, is then a hidden-Markov-model
posterior: :func:`optimal_predictions` computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyformer._validation import describe, generator, non_negative_int, positive_int, probability
from tinyformer.data.markov import MarkovSource

__all__ = [
    "KEPT",
    "MASKED",
    "NOT_CHOSEN",
    "RANDOM",
    "MLMDataset",
    "MaskedTokens",
    "MaskingScheme",
    "optimal_predictions",
]

# what the corruption did at a position: the codes of ``MaskedTokens.action``
NOT_CHOSEN, MASKED, RANDOM, KEPT = 0, 1, 2, 3


@dataclass(frozen=True)
class MaskedTokens:
    """A batch of corrupted sequences and what was done to them.

    Attributes
    ----------
    inputs : numpy.ndarray of int
        ``(B, T)``: what the model reads.
    tokens : numpy.ndarray of int
        ``(B, T)``: the clean sequences.
    action : numpy.ndarray of int
        ``(B, T)`` int8: ``NOT_CHOSEN`` (0), ``MASKED`` (1), ``RANDOM`` (2) or ``KEPT`` (3).
    """

    inputs: np.ndarray
    tokens: np.ndarray
    action: np.ndarray

    @property
    def chosen(self) -> np.ndarray:
        """``(B, T)`` bool: the positions the loss counts."""
        return self.action != NOT_CHOSEN

    @property
    def labels(self) -> np.ndarray:
        """``(B, T)``: the clean token at chosen positions, -1 (ignored) elsewhere."""
        return np.where(self.chosen, self.tokens, -1)


@dataclass(frozen=True)
class MaskingScheme:
    r"""BERT's corruption for a vocabulary of ``vocab_size`` ordinary tokens plus ``[MASK]``.

    Attributes
    ----------
    vocab_size : int
        Number of ordinary tokens, ids ``0 .. vocab_size - 1`` (at least 2).
    mask_id : int
        The id of ``[MASK]``, not an ordinary token (usually ``vocab_size``).
    select_prob : float
        :math:`\rho`, the chance that a position is chosen (BERT: 0.15).
    mask_prob, random_prob : float
        Of a chosen position, the chance of ``[MASK]`` (0.8) and of a random
        ordinary token (0.1); the rest (0.1) keeps the token.
    """

    vocab_size: int
    mask_id: int
    select_prob: float = 0.15
    mask_prob: float = 0.8
    random_prob: float = 0.1

    def __post_init__(self) -> None:
        """Check every field; raise naming the first bad one."""
        if positive_int(self.vocab_size, "vocab_size") < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if non_negative_int(self.mask_id, "mask_id") < self.vocab_size:
            raise ValueError(
                f"mask_id must not be an ordinary token id (below vocab_size={self.vocab_size}),"
                f" got {self.mask_id}"
            )
        for name in ("select_prob", "mask_prob", "random_prob"):
            probability(getattr(self, name), name)
        if self.select_prob == 0:
            raise ValueError("select_prob must be above 0: with none chosen there is no loss")
        if self.mask_prob + self.random_prob > 1:
            raise ValueError(
                f"mask_prob + random_prob must be at most 1, got {self.mask_prob}"
                f" + {self.random_prob}"
            )

    @property
    def keep_prob(self) -> float:
        """Of a chosen position, the chance that the token is left as it is."""
        return 1.0 - self.mask_prob - self.random_prob

    def _check_tokens(self, tokens: object) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"tokens must be an integer array of token ids, got {describe(arr)}")
        if arr.ndim != 2 or arr.size == 0:
            raise ValueError(f"tokens must be a non-empty (B, T) array, got shape {arr.shape}")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise ValueError(
                f"tokens must be ordinary ids in [0, {self.vocab_size}), got"
                f" {arr.min()}..{arr.max()}"
            )
        return arr.astype(np.int64)

    def corrupt(self, tokens: np.ndarray, rng: np.random.Generator) -> MaskedTokens:
        """Choose positions of ``tokens`` ``(B, T)`` and corrupt them; see the module docstring."""
        tokens = self._check_tokens(tokens)
        rng = generator(rng)
        chosen = rng.random(tokens.shape) < self.select_prob  # (B, T)
        fate = rng.random(tokens.shape)  # (B, T): which of the three happens if chosen
        masked = chosen & (fate < self.mask_prob)
        randomized = chosen & ~masked & (fate < self.mask_prob + self.random_prob)
        inputs = tokens.copy()
        inputs[masked] = self.mask_id
        inputs[randomized] = rng.integers(0, self.vocab_size, int(randomized.sum()))
        action = np.full(tokens.shape, NOT_CHOSEN, dtype=np.int8)
        action[chosen] = KEPT
        action[masked] = MASKED
        action[randomized] = RANDOM
        return MaskedTokens(inputs, tokens, action)

    def likelihoods(self, inputs: np.ndarray, *, chosen: bool) -> np.ndarray:
        r"""Emission probabilities :math:`e(\tilde x_t \mid x_t = v)`, shape ``(B, T, V)``.

        With ``chosen=False`` the position may or may not have been chosen
        (what the model knows of any position); with ``chosen=True`` it was.
        """
        arr = np.asarray(inputs)
        if arr.dtype.kind not in "iu" or arr.ndim != 2:
            raise TypeError(f"inputs must be a (B, T) integer array, got {describe(arr)}")
        if arr.size and (
            arr.min() < 0
            or arr.max() > self.mask_id
            or ((arr >= self.vocab_size) & (arr != self.mask_id)).any()
        ):
            raise ValueError(
                f"inputs must be ids in [0, {self.vocab_size - 1}] or mask_id={self.mask_id},"
                f" got {arr.min()}..{arr.max()}"
            )
        rho = 1.0 if chosen else self.select_prob
        same = np.arange(self.vocab_size) == arr[..., None]  # (B, T, V): x_t equals what we see
        is_mask = (arr == self.mask_id)[..., None]  # (B, T, 1)
        seen = (1 - rho + rho * self.keep_prob) * same + rho * self.random_prob / self.vocab_size
        return np.where(is_mask, rho * self.mask_prob, seen)  # (B, T, V)


class MLMDataset:
    """Clean windows, corrupted afresh every time a batch is drawn (dynamic masking).

    Parameters
    ----------
    tokens : numpy.ndarray of int
        ``(N, T)`` clean windows of ordinary tokens.
    scheme : MaskingScheme
    rng : numpy.random.Generator
        Draws every corruption, batch after batch.
    """

    def __init__(self, tokens: np.ndarray, scheme: MaskingScheme, *, rng: np.random.Generator):
        if not isinstance(scheme, MaskingScheme):
            raise TypeError(f"scheme must be a MaskingScheme, got {describe(scheme)}")
        self.tokens = scheme._check_tokens(tokens)
        self.scheme = scheme
        self.rng = generator(rng)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        """Window length ``T``."""
        return self.tokens.shape[1]

    def batch(self, indices: np.ndarray) -> MaskedTokens:
        """The windows at ``indices``, freshly corrupted."""
        return self.scheme.corrupt(self.tokens[np.asarray(indices)], self.rng)


def optimal_predictions(
    source: MarkovSource, scheme: MaskingScheme, inputs: np.ndarray, *, left_only: bool = False
) -> np.ndarray:
    r"""The best possible prediction of each chosen token from the corrupted windows.

    For every position :math:`t` of ``inputs`` ``(B, T)``, drawn from ``source``
    and corrupted by ``scheme``, returns :math:`p(x_t = v \mid \tilde x, t
    \text{ chosen})`: the cavity distribution of :math:`x_t` given the other
    positions' observations (each with the "maybe chosen" emission), times the
    emission of :math:`\tilde x_t` at a chosen position, normalized:

    .. math::
        q_t(v) \propto p(x_t = v \mid \tilde x_{s \ne t})\; e_\text{chosen}(\tilde x_t \mid v).

    With ``left_only`` the other positions are :math:`s < t` only: the best a
    reader that sees the corrupted sequence from the left up to and including
    :math:`t` can do. Its expected cross-entropy is the least any model can reach.

    Returns
    -------
    numpy.ndarray
        ``(B, T, V)`` float64, rows summing to 1.
    """
    if not isinstance(scheme, MaskingScheme):
        raise TypeError(f"scheme must be a MaskingScheme, got {describe(scheme)}")
    if not isinstance(source, MarkovSource) or source.vocab_size != scheme.vocab_size:
        raise ValueError(
            f"source must be a MarkovSource over the scheme's {scheme.vocab_size} tokens,"
            f" got {describe(source)}"
        )
    maybe = scheme.likelihoods(inputs, chosen=False)  # (B, T, V)
    cavity = source.token_posteriors(maybe, left_only=left_only)  # (B, T, V)
    q = cavity * scheme.likelihoods(inputs, chosen=True)
    return q / q.sum(axis=-1, keepdims=True)
