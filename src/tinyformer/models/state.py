"""The state of step-by-step decoding: caches, encoder memory and how far each row has got.

A model's ``start`` returns a :class:`~tinyformer.models.state.DecodeState`; each ``step`` reads it and
extends it. Decoding algorithms need three operations on it besides: keep some
rows (several times over, for beam search), forget the last positions (for
speculative decoding) and copy it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer._validation import describe, non_negative_int
from tinyformer.blocks import BlockCache

__all__ = ["DecodeState"]


def _rows(indices: object, batch_size: int) -> np.ndarray:
    """``indices`` as a non-empty 1-D integer array of rows in ``[0, batch_size)``."""
    rows = np.asarray(indices)
    if rows.dtype.kind not in "iu":
        raise TypeError(f"indices must be an integer array of rows, got {describe(rows)}")
    if rows.ndim != 1 or rows.size == 0:
        raise ValueError(f"indices must be a non-empty 1-D array of rows, got shape {rows.shape}")
    if rows.min() < 0 or rows.max() >= batch_size:
        bad = rows.min() if rows.min() < 0 else rows.max()
        raise ValueError(f"indices must be rows in [0, {batch_size}) of the state, got {bad}")
    return rows


class DecodeState:
    """What a model remembers between decoding steps; made by the model's ``start``.

    Callers read :attr:`batch_size` and :attr:`length` and use :meth:`select`,
    :meth:`truncate` and :meth:`copy`; everything else belongs to the model
    that made the state (and only that model's ``step`` accepts it).

    Attributes
    ----------
    batch_size : int
        Number of sequences (rows) decoded side by side.
    length : int
        Number of decoder positions consumed so far, the same for every row.
    caches : list of BlockCache
        One key/value cache per decoder block.
    memory : numpy.ndarray or None
        Encoder output ``(B, S, d_model)`` of an encoder-decoder model.
    memory_mask : numpy.ndarray of bool or None
        ``(B, 1, S)``, True at real (not padded) source positions; ``None`` when
        every position is real.
    key_mask : numpy.ndarray of bool or None
        ``(B, length)``, True at decoder positions that are not padding (an
        encoder-decoder model masks padded decoder tokens); ``None`` for models
        without a padding id.
    """

    def __init__(
        self,
        owner: Any,
        *,
        batch_size: int,
        caches: list[BlockCache],
        memory: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        key_mask: np.ndarray | None = None,
        length: int = 0,
    ) -> None:
        self._owner = owner
        self.batch_size = batch_size
        self.length = length
        self.caches = caches
        self.memory = memory
        self.memory_mask = memory_mask
        self.key_mask = key_mask

    def __repr__(self) -> str:
        return (
            f"DecodeState(batch_size={self.batch_size}, length={self.length},"
            f" model={type(self._owner).__name__})"
        )

    def select(self, indices: np.ndarray) -> DecodeState:
        """A new state whose row ``i`` is a copy of this state's row ``indices[i]``.

        Repeats are allowed (a beam that continues in several ways) and the
        result may have more or fewer rows than this state. Every array is
        copied: stepping either state leaves the other unchanged.
        """
        rows = _rows(indices, self.batch_size)
        return DecodeState(
            self._owner,
            batch_size=len(rows),
            caches=[cache.select(rows) for cache in self.caches],
            memory=None if self.memory is None else self.memory[rows],
            memory_mask=None if self.memory_mask is None else self.memory_mask[rows],
            key_mask=None if self.key_mask is None else self.key_mask[rows],
            length=self.length,
        )

    def truncate(self, length: int) -> None:
        """Forget the positions ``length`` and later, in place (e.g. rejected draft tokens).

        The next ``step`` then continues at position ``length``, exactly as if
        the forgotten tokens had never been fed.
        """
        length = non_negative_int(length, "length")
        if length > self.length:
            raise ValueError(
                f"length must be at most the state's length {self.length}, got {length}"
            )
        for cache in self.caches:
            cache.truncate(length)
        if self.key_mask is not None:
            self.key_mask = self.key_mask[:, :length]
        self.length = length

    def copy(self) -> DecodeState:
        """An independent copy of this state."""
        return DecodeState(
            self._owner,
            batch_size=self.batch_size,
            caches=[cache.copy() for cache in self.caches],
            memory=None if self.memory is None else self.memory.copy(),
            memory_mask=None if self.memory_mask is None else self.memory_mask.copy(),
            key_mask=None if self.key_mask is None else self.key_mask.copy(),
            length=self.length,
        )
