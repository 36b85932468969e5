"""Shuffled mini-batches with a state that can be saved and restored exactly.

The loop reads its training data through a :class:`~tinyformer.training.batches.BatchStream`: every epoch
is a fresh permutation of the examples drawn from one
:class:`numpy.random.Generator`, cut into batches of ``batch_size`` (the
incomplete last batch of an epoch is dropped, so every step sees the same
number of examples). The stream's position (epoch, permutation, offset)
together with its generator's state is all that a resumed run needs to see
the same batches in the same order.

A dataset is anything with ``len()`` and ``batch(indices)``:
:class:`~tinyformer.data.batching.PairDataset` for an encoder-decoder, and
:class:`~tinyformer.training.batches.WindowDataset` here for a language model.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from tinyformer._validation import describe, generator, positive_int, token_ids

__all__ = ["BatchStream", "Dataset", "WindowDataset"]


class Dataset(Protocol):
    """What the loop needs of training data: a length and batches by index."""

    def __len__(self) -> int:
        """Number of examples."""

    def batch(self, indices: np.ndarray) -> Any:
        """The examples at ``indices`` as one batch."""


class WindowDataset:
    """Language-model windows: ``inputs[i]`` and the tokens ``targets[i]`` that follow them.

    Parameters
    ----------
    inputs, targets : numpy.ndarray of int
        Shape ``(N, T)`` each, e.g. from
        :meth:`~tinyformer.data.markov.MarkovSource.sample_windows`.
    """

    def __init__(self, inputs: np.ndarray, targets: np.ndarray) -> None:
        inputs = token_ids(inputs, "inputs")
        targets = token_ids(targets, "targets")
        if inputs.ndim != 2 or inputs.shape != targets.shape or inputs.shape[0] == 0:
            raise ValueError(
                "inputs and targets must be non-empty 2-D arrays of one shape (N, T), got"
                f" shapes {inputs.shape} and {targets.shape}"
            )
        self.inputs = inputs
        self.targets = targets

    @classmethod
    def from_tokens(
        cls, ids: np.ndarray, seq_len: int, *, stride: int | None = None
    ) -> WindowDataset:
        """Cut one stream of token ids into windows whose targets are the inputs shifted by one.

        Window ``i`` reads ``ids[s : s + seq_len]`` and predicts
        ``ids[s + 1 : s + seq_len + 1]``, with ``s = i * stride``: every target is
        the token that follows its input, which is the one shift a language
        model's data needs.

        Parameters
        ----------
        ids : numpy.ndarray of int
            A 1-D stream of at least ``seq_len + 1`` token ids (a text encoded
            by a tokenizer, say).
        seq_len : int
            Window length ``T`` (at most the model's context length).
        stride : int, optional
            Tokens between the starts of two windows; the default ``seq_len``
            makes windows that do not overlap (and use every token as a target
            once), a smaller stride makes more, overlapping windows.

        Returns
        -------
        WindowDataset
            ``1 + (len(ids) - seq_len - 1) // stride`` windows; tokens after the
            last full window are left out.
        """
        stream = token_ids(ids, "ids")
        seq_len = positive_int(seq_len, "seq_len")
        stride = seq_len if stride is None else positive_int(stride, "stride")
        if stream.ndim != 1 or stream.size < seq_len + 1:
            raise ValueError(
                f"ids must be a 1-D stream of at least seq_len + 1 = {seq_len + 1} token ids,"
                f" got {describe(stream)}"
            )
        windows = np.lib.stride_tricks.sliding_window_view(stream, seq_len + 1)[::stride]
        return cls(windows[:, :-1].copy(), windows[:, 1:].copy())  # (N, T) each

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def seq_len(self) -> int:
        """Window length ``T``."""
        return self.inputs.shape[1]

    def batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The windows at ``indices``: ``(inputs, targets)``, each ``(len(indices), T)``."""
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" or idx.ndim != 1 or idx.size == 0:
            raise ValueError(f"indices must be a non-empty 1-D integer array, got {describe(idx)}")
        if idx.min() < 0 or idx.max() >= len(self):
            raise ValueError(f"indices must be in [0, {len(self)}), got {idx.min()}..{idx.max()}")
        return self.inputs[idx], self.targets[idx]

    def __repr__(self) -> str:
        return f"WindowDataset({len(self)} windows of {self.seq_len} tokens)"


class BatchStream:
    """An endless stream of shuffled, equally sized mini-batches of a dataset.

    Parameters
    ----------
    data : Dataset
        ``len(data) >= batch_size``.
    batch_size : int
    rng : numpy.random.Generator
        Draws one permutation per epoch; nothing else.

    Attributes
    ----------
    epoch : int
        Epochs started so far (0 before the first batch).
    offset : int
        Position of the next batch in the current permutation.
    """

    def __init__(self, data: Dataset, batch_size: int, *, rng: np.random.Generator) -> None:
        if not hasattr(data, "batch") or not hasattr(data, "__len__"):
            raise TypeError(
                "data must have len() and batch(indices) (a PairDataset or a WindowDataset),"
                f" got {describe(data)}"
            )
        self.data = data
        self.batch_size = positive_int(batch_size, "batch_size")
        if len(data) < self.batch_size:
            raise ValueError(
                f"batch_size must be at most the number of examples ({len(data)}),"
                f" got {batch_size}"
            )
        self.rng = generator(rng)
        self.epoch = 0
        self.offset = 0
        self.order: np.ndarray | None = None

    @property
    def steps_per_epoch(self) -> int:
        """Full batches in one pass over the data."""
        return len(self.data) // self.batch_size

    def next_indices(self) -> np.ndarray:
        """Indices of the next batch, starting a new epoch (a new permutation) when needed."""
        if self.order is None or self.offset + self.batch_size > len(self.order):
            self.order = self.rng.permutation(len(self.data))
            self.epoch += 1
            self.offset = 0
        indices = self.order[self.offset : self.offset + self.batch_size]
        self.offset += self.batch_size
        return indices

    def next_batch(self) -> Any:
        """The next batch, as ``data.batch`` builds it."""
        return self.data.batch(self.next_indices())

    def state(self) -> tuple[dict[str, int], np.ndarray]:
        """The position (epoch, offset) and the current permutation (empty before the first batch)."""
        order = np.zeros(0, dtype=np.int64) if self.order is None else self.order.copy()
        return {"epoch": self.epoch, "offset": self.offset}, order

    def check_state(self, position: dict[str, Any], order: np.ndarray) -> None:
        """Raise ValueError unless ``position`` and ``order`` fit this stream's dataset."""
        n = len(self.data)
        if set(position) != {"epoch", "offset"}:
            raise ValueError(f"the stream position needs 'epoch' and 'offset', got {position!r}")
        epoch, offset = position["epoch"], position["offset"]
        if not all(isinstance(v, int) and v >= 0 for v in (epoch, offset)):
            raise ValueError(
                f"the stream position must be non-negative integers, got {position!r}"
            )
        if order.size == 0:
            if epoch or offset:
                raise ValueError("the stream has no permutation but a non-zero position")
            return
        if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
            raise ValueError(f"the stream permutation is not a permutation of {n} examples")
        if offset > n or epoch == 0:
            raise ValueError(f"the stream position {position!r} does not fit {n} examples")

    def set_state(self, position: dict[str, int], order: np.ndarray) -> None:
        """Restore what :meth:`state` returned (checked first with :meth:`check_state`)."""
        self.check_state(position, order)
        self.epoch, self.offset = int(position["epoch"]), int(position["offset"])
        self.order = order.astype(np.int64).copy() if order.size else None
