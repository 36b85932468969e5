"""Toy models with the start/step/DecodeState interface and next-token logits known exactly.

A toy's logits at every position are a plain Python function of the prefix (and,
for the encoder-decoder, of the source), so tests can compute the exact
distribution of any next token. The state keeps the whole history, so a wrong
``select`` or ``truncate`` changes the logits and shows up.

Test files ``import toy_decoders``: pytest puts ``tests/unit`` on the path
(``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

import numpy as np

NextLogits = Callable[[tuple[int, ...]], np.ndarray]


class ToyState:
    """History of every row; ``select``, ``truncate`` and ``copy`` as in tinyformer.models."""

    def __init__(self, history: np.ndarray, source: np.ndarray | None = None) -> None:
        self.history = history  # (B, length)
        self.source = source  # (B, S) or None

    @property
    def batch_size(self) -> int:
        return self.history.shape[0]

    @property
    def length(self) -> int:
        return self.history.shape[1]

    def select(self, indices: np.ndarray) -> ToyState:
        rows = np.asarray(indices)
        source = None if self.source is None else self.source[rows].copy()
        return ToyState(self.history[rows].copy(), source)

    def truncate(self, length: int) -> None:
        if length > self.length:
            raise ValueError("cannot truncate beyond the length")
        self.history = self.history[:, :length]

    def copy(self) -> ToyState:
        return self.select(np.arange(self.batch_size))


class _ToyBase:
    def __init__(self, vocab_size: int, context_length: int, dtype: str = "float64") -> None:
        self.vocab_size, self.context_length, self.dtype = vocab_size, context_length, dtype
        self.step_calls = 0
        self.start_calls = 0

    def _logits(self, row: int, prefix: tuple[int, ...], state: ToyState) -> np.ndarray:
        raise NotImplementedError

    def step(self, tokens: np.ndarray, state: ToyState) -> np.ndarray:
        self.step_calls += 1
        tokens = np.asarray(tokens)
        assert tokens.ndim == 2
        assert tokens.shape[0] == state.batch_size
        assert tokens.min() >= 0
        assert tokens.max() < self.vocab_size
        if state.length + tokens.shape[1] > self.context_length:
            raise ValueError("toy model: too many positions")
        old = state.length
        state.history = np.concatenate([state.history, tokens], axis=1)
        b, n = tokens.shape
        out = np.empty((b, n, self.vocab_size), dtype=self.dtype)
        for i in range(b):
            row = tuple(int(t) for t in state.history[i])
            for j in range(n):
                out[i, j] = self._logits(i, row[: old + j + 1], state)
        return out


class ToyLM(_ToyBase):
    """Decoder-only toy: the logits after a prefix are ``next_logits(prefix)``."""

    family = "decoder-only"

    def __init__(self, next_logits: NextLogits, vocab_size: int, context_length: int = 32) -> None:
        super().__init__(vocab_size, context_length)
        self.next_logits = next_logits

    def start(self, batch_size: int) -> ToyState:
        self.start_calls += 1
        return ToyState(np.zeros((batch_size, 0), dtype=np.int64))

    def _logits(self, row: int, prefix: tuple[int, ...], state: ToyState) -> np.ndarray:
        return self.next_logits(prefix)


class ToyEncoderDecoder(_ToyBase):
    """Encoder-decoder toy: the logits are ``next_logits(source + (-1,) + prefix)``."""

    family = "encoder-decoder"

    def __init__(self, next_logits: NextLogits, vocab_size: int, context_length: int = 32) -> None:
        super().__init__(vocab_size, context_length)
        self.next_logits = next_logits

    def start(self, source_ids: np.ndarray, *, source_mask: np.ndarray | None = None) -> ToyState:
        self.start_calls += 1
        source = np.asarray(source_ids)
        return ToyState(np.zeros((source.shape[0], 0), dtype=np.int64), source.copy())

    def _logits(self, row: int, prefix: tuple[int, ...], state: ToyState) -> np.ndarray:
        assert state.source is not None
        return self.next_logits((*(int(s) for s in state.source[row]), -1, *prefix))


def bigram(table: np.ndarray) -> NextLogits:
    """Logits of the next token = ``table[last token]`` (a Markov chain)."""
    return lambda prefix: table[prefix[-1]]


def mixing(rng: np.random.Generator, vocab_size: int, scale: float = 2.0) -> NextLogits:
    """Logits that depend on the last token, the position and the sum of the whole prefix."""
    last = scale * rng.standard_normal((vocab_size + 1, vocab_size))
    position = scale * rng.standard_normal((64, vocab_size))
    total = scale * rng.standard_normal((vocab_size, vocab_size))

    def next_logits(prefix: tuple[int, ...]) -> np.ndarray:
        return last[prefix[-1]] + position[len(prefix) % 64] + total[sum(prefix) % vocab_size]

    return next_logits


def chi_square_critical(dof: int, false_alarm: float = 1e-4) -> float:
    """Upper quantile of the chi-square distribution by Wilson and Hilferty's cube-root formula."""
    z = NormalDist().inv_cdf(1.0 - false_alarm)
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * math.sqrt(c)) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs`` and its degrees of freedom.

    Cells of probability 0 must have no counts (asserted) and are left out.
    """
    counts, probs = np.ravel(counts), np.ravel(probs)
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was drawn"
    live = probs > 0
    expected = counts.sum() * probs[live]
    return float(((counts[live] - expected) ** 2 / expected).sum()), int(live.sum()) - 1
