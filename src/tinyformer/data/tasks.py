"""Toy sequence-to-sequence tasks: copy, reverse and sort a string of symbols.

A task draws a source of ``min_len .. max_len`` symbols (the length uniformly,
then each symbol uniformly) and maps it to its target by a fixed rule. The
symbols are characters with ids from 4 on, after the special tokens of
:mod:`tinyformer.data.tokenizers`, so ``task.tokenizer`` shows any sequence
as text.

To measure generalization, :meth:`SequenceTask.split` sets aside a held-out
set of distinct sources; training pairs are then drawn by rejection, so that
**no held-out source ever occurs in training**.
"""

from __future__ import annotations

import string
from collections.abc import Callable

import numpy as np

from tinyformer._validation import describe, generator, positive_int
from tinyformer.data.batching import PairDataset
from tinyformer.data.tokenizers import N_SPECIAL, CharTokenizer

__all__ = ["TASKS", "SequenceTask", "TaskSplit"]

SYMBOLS = string.digits + string.ascii_uppercase + string.ascii_lowercase


def _copy(source: np.ndarray) -> np.ndarray:
    return source.copy()


def _reverse(source: np.ndarray) -> np.ndarray:
    return source[::-1].copy()


def _sort(source: np.ndarray) -> np.ndarray:
    return np.sort(source)


TASKS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "copy": _copy,
    "reverse": _reverse,
    "sort": _sort,
}


class SequenceTask:
    """A rule mapping a source sequence of symbols to its target.

    Parameters
    ----------
    name : str
        The rule, ``"copy"``, ``"reverse"`` or ``"sort"``: the source itself, the source backwards, or its symbols in
        increasing order.
    n_symbols : int
        Alphabet size, 1 to 62; the symbols are ``0-9``, then ``A-Z``, then
        ``a-z``, with ids ``4 .. 3 + n_symbols``.
    min_len, max_len : int
        Source lengths are drawn uniformly from ``min_len .. max_len``.

    Examples
    --------
    >>> task = SequenceTask("reverse", n_symbols=10)
    >>> src = task.tokenizer.encode("4071")
    >>> task.tokenizer.decode(task.target(src))
    '1704'
    """

    def __init__(
        self, name: str = "reverse", *, n_symbols: int = 10, min_len: int = 1, max_len: int = 8
    ) -> None:
        if not isinstance(name, str) or name not in TASKS:
            raise ValueError(f"name must be one of {sorted(TASKS)}, got {name!r}")
        self.name = name
        self.n_symbols = positive_int(n_symbols, "n_symbols")
        if self.n_symbols > len(SYMBOLS):
            raise ValueError(f"n_symbols must be at most {len(SYMBOLS)}, got {n_symbols}")
        self.min_len = positive_int(min_len, "min_len")
        self.max_len = positive_int(max_len, "max_len")
        if self.max_len < self.min_len:
            raise ValueError(f"max_len must be at least min_len={min_len}, got {max_len}")
        self.tokenizer = CharTokenizer(SYMBOLS[: self.n_symbols])

    @property
    def vocab_size(self) -> int:
        """How many ids there are, the 4 special tokens and the symbols."""
        return self.tokenizer.vocab_size

    @property
    def lengths(self) -> range:
        """The possible source lengths."""
        return range(self.min_len, self.max_len + 1)

    def n_sources(self, length: int | None = None) -> int:
        """How many distinct sources there are (of one length, or in all): ``n_symbols ** length``."""
        if length is None:
            return sum(self.n_symbols**n for n in self.lengths)
        if positive_int(length, "length") not in self.lengths:
            raise ValueError(f"length must be in [{self.min_len}, {self.max_len}], got {length}")
        return self.n_symbols**length

    def check_source(self, source: object, name: str = "source") -> np.ndarray:
        """``source`` as a 1-D int64 array of symbol ids of an allowed length, else raise."""
        arr = np.asarray(source)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must be an integer array of symbol ids, got {describe(arr)}")
        if arr.ndim != 1 or len(arr) not in self.lengths:
            raise ValueError(
                f"{name} must be 1-D with length in [{self.min_len}, {self.max_len}],"
                f" got shape {arr.shape}"
            )
        if arr.min() < N_SPECIAL or arr.max() >= self.vocab_size:
            raise ValueError(
                f"{name} must hold symbol ids in [{N_SPECIAL}, {self.vocab_size}),"
                f" got {arr.min()}..{arr.max()}"
            )
        return arr.astype(np.int64)

    def target(self, source: np.ndarray) -> np.ndarray:
        """The target of one source (both 1-D, without special tokens)."""
        return TASKS[self.name](self.check_source(source))

    def random_sources(self, n: int, rng: np.random.Generator) -> list[np.ndarray]:
        """``n`` random sources: each length uniform, then each symbol uniform."""
        n = positive_int(n, "n")
        rng = generator(rng)
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)
        symbols = rng.integers(N_SPECIAL, self.vocab_size, size=(n, self.max_len))  # (n, L)
        return [row[:length] for row, length in zip(symbols, lengths, strict=True)]

    def dataset(self, sources: list[np.ndarray]) -> PairDataset:
        """The pairs ``(source, target(source))`` for the given sources."""
        arrays = [np.asarray(s) for s in sources]
        if not self._all_valid(arrays):  # then find and name the first bad one
            arrays = [self.check_source(s, f"sources[{i}]") for i, s in enumerate(arrays)]
        return PairDataset(arrays, [TASKS[self.name](s) for s in arrays])

    def _all_valid(self, arrays: list[np.ndarray]) -> bool:
        """Whether every array is a valid source (one check over all, for speed)."""
        if not arrays or not all(
            a.dtype.kind in "iu" and a.ndim == 1 and len(a) in self.lengths for a in arrays
        ):
            return False
        flat = np.concatenate(arrays)
        return bool(flat.min() >= N_SPECIAL and flat.max() < self.vocab_size)

    def sample(self, n: int, rng: np.random.Generator) -> PairDataset:
        """``n`` random (source, target) pairs."""
        return self.dataset(self.random_sources(n, rng))

    def split(
        self, n_heldout: int = 1000, *, rng: np.random.Generator, max_fraction: float = 0.1
    ) -> TaskSplit:
        """Set aside ``n_heldout`` distinct sources that training will never see.

        The held-out sources are spread evenly over the lengths, but no length
        gives up more than ``max_fraction`` of its sources (there are only
        ``n_symbols`` sources of length 1); what a short length cannot give
        goes to the longer ones.
        """
        return TaskSplit(self, n_heldout, rng=rng, max_fraction=max_fraction)

    def __repr__(self) -> str:
        return (
            f"SequenceTask({self.name!r}, n_symbols={self.n_symbols},"
            f" min_len={self.min_len}, max_len={self.max_len})"
        )


def _quotas(capacity: dict[int, int], total: int) -> dict[int, int]:
    """Share ``total`` over lengths as evenly as ``capacity`` allows (water filling)."""
    quota = dict.fromkeys(capacity, 0)
    left = total
    open_lengths = [n for n in sorted(capacity) if capacity[n] > 0]
    while left and open_lengths:
        share, extra = divmod(left, len(open_lengths))
        for i, n in enumerate(open_lengths):
            take = min(share + (i >= len(open_lengths) - extra), capacity[n] - quota[n])
            quota[n] += take
            left -= take
        open_lengths = [n for n in open_lengths if quota[n] < capacity[n]]
    return quota


class TaskSplit:
    """A task's held-out sources, and training pairs drawn without them.

    Made by :meth:`SequenceTask.split`. Membership is decided on the whole
    source sequence, so the split holds for any rule: a held-out source is
    never a training source.

    Attributes
    ----------
    heldout : PairDataset
        The held-out pairs, shortest first, then in id order.
    per_length : dict
        How many held-out sources each length has.
    """

    def __init__(
        self,
        task: SequenceTask,
        n_heldout: int,
        *,
        rng: np.random.Generator,
        max_fraction: float = 0.1,
    ) -> None:
        if not isinstance(task, SequenceTask):
            raise TypeError(f"task must be a SequenceTask, got {describe(task)}")
        n_heldout = positive_int(n_heldout, "n_heldout")
        rng = generator(rng)
        if isinstance(max_fraction, bool) or not isinstance(max_fraction, int | float):
            raise TypeError(
                f"max_fraction must be a number in (0, 0.5], got {describe(max_fraction)}"
            )
        if not 0.0 < max_fraction <= 0.5:
            raise ValueError(f"max_fraction must be in (0, 0.5], got {max_fraction}")
        capacity = {n: int(max_fraction * task.n_sources(n)) for n in task.lengths}
        if sum(capacity.values()) < n_heldout:
            raise ValueError(
                f"n_heldout must be at most {sum(capacity.values())} for this task"
                f" (max_fraction={max_fraction} of each length's sources), got {n_heldout}"
            )
        self.task = task
        self.per_length = _quotas(capacity, n_heldout)
        held: set[tuple[int, ...]] = set()
        for length, count in self.per_length.items():
            held |= self._draw_distinct(length, count, rng)
        self._heldout = frozenset(held)
        ordered = sorted(held, key=lambda s: (len(s), s))
        self.heldout = task.dataset([np.array(s, dtype=np.int64) for s in ordered])

    def _draw_distinct(
        self, length: int, count: int, rng: np.random.Generator
    ) -> set[tuple[int, ...]]:
        """``count`` distinct uniform sources of one length (at most half of them all)."""
        chosen: set[tuple[int, ...]] = set()
        while len(chosen) < count:
            draws = rng.integers(N_SPECIAL, self.task.vocab_size, size=(count, length))
            for row in draws.tolist():
                if len(chosen) < count:
                    chosen.add(tuple(row))
        return chosen

    def is_heldout(self, source: np.ndarray) -> bool:
        """Whether ``source`` is one of the held-out sources."""
        return tuple(self.task.check_source(source).tolist()) in self._heldout

    def train_sources(self, n: int, rng: np.random.Generator) -> list[np.ndarray]:
        """``n`` random sources drawn as :meth:`SequenceTask.random_sources`, rejecting held-out ones."""
        n = positive_int(n, "n")
        kept: list[np.ndarray] = []
        while len(kept) < n:
            for source in self.task.random_sources(n - len(kept), rng):
                if tuple(source.tolist()) not in self._heldout:
                    kept.append(source)
        return kept

    def sample_train(self, n: int, rng: np.random.Generator) -> PairDataset:
        """``n`` random training pairs, none with a held-out source."""
        return self.task.dataset(self.train_sources(n, rng))
