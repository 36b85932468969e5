r"""Count-based language models over token ids: the baselines a neural model must beat.

Two models, each fitted on one stream of training ids and scoring any stream of ids
with a proper distribution over the whole vocabulary (the probabilities of the
``vocab_size`` possible next tokens sum to 1 in every context):

- :class:`AddOneUnigram`: every token's training count plus one, normalized,
  :math:`p(w) = (c(w) + 1) / (N + V)`; it ignores the context.
- :class:`KneserNey`: interpolated Kneser-Ney smoothing of any order :math:`n`
  :cite:p:`kneser1995improved,chen1998empirical`, with one absolute discount per order
  (``discounts="single"``, the "interpolated Kneser-Ney" of Chen and Goodman) or three
  (``"modified"``, their modified Kneser-Ney), estimated from the count-of-counts of the
  training data.

**Interpolated Kneser-Ney.** For a context :math:`h` of :math:`k - 1` tokens and its
shortening :math:`h'` (the first token dropped),

.. math::
    p_k(w \mid h) = \frac{\max(a_k(hw) - D_k(a_k(hw)),\, 0)
                    + \gamma_k(h)\, p_{k-1}(w \mid h')}{\sum_v a_k(hv)},
    \qquad \gamma_k(h) = \sum_{c \ge 1} D_k(c)\, N_c(h\,\bullet),

and :math:`p_k(w \mid h) = p_{k-1}(w \mid h')` when :math:`h` was never seen at order
:math:`k`; the recursion ends in the uniform distribution :math:`p_0(w) = 1/V`. At the
highest order :math:`a_n` is the raw count of the :math:`n`-gram; below it,
:math:`a_k(g)` is the *continuation count* of :math:`g`, the number of distinct tokens
seen right before it (how many contexts :math:`g` completes, not how often it occurs).
:math:`N_c(h\,\bullet)` is the number of distinct tokens that follow :math:`h` with
:math:`a_k = c`, all :math:`c \ge 1` counting for one discount and :math:`c = 1, 2,
\ge 3` apart for three. The discounts come from the count-of-counts :math:`n_c` (the
number of distinct :math:`k`-grams with :math:`a_k = c`) of each order
:cite:p:`chen1998empirical`: with :math:`Y = n_1 / (n_1 + 2 n_2)`, one discount
:math:`D = Y`, or three :math:`D(1) = 1 - 2Y n_2/n_1`, :math:`D(2) = 2 - 3Y n_3/n_2`,
:math:`D(c \ge 3) = 3 - 4Y n_4/n_3`. The three discounts need not lie in :math:`(0, c)`
on small data (with :math:`n_3 = 0` the last is 3, which removes every count of 3 or
more; a negative one would make a count grow): where any of them falls outside, the
order gets the single discount :math:`Y` for every count instead (a fallback of ours:
text of any size has no such order). Every id then gets some probability when
every order has n-grams seen once (:math:`n_1 > 0`, as in any real text, where
:math:`0 < Y \le 1`); an order without them (:math:`Y = 0`) keeps all its mass, and an id
it never saw in a context it knows gets probability 0.

**A stream, not sentences.** The training ids are one stream and every :math:`k`-gram
inside it counts (no sentence boundaries). The stream's first :math:`k`-gram has no token
before it, so that one occurrence adds no continuation count: a :math:`k`-gram seen only
there is, below the highest order, as if unseen (at most one per order). Scoring a stream, the token at position
:math:`t` is predicted from the :math:`\min(t, n - 1)` tokens before it: the first
tokens of a stream use shorter contexts, through the same formulas.

**Vectorized.** Each :math:`k`-gram is numbered by sorting integer keys
(:math:`\text{id of its first } k - 1 \text{ tokens} \times V + \text{its last token}`)
with ``numpy.unique``; counts and context sums are ``numpy.bincount``, lookups
of held-out :math:`k`-grams ``numpy.searchsorted``. Fitting order 5 on half a
million tokens takes about a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import describe, one_of, positive_int, token_ids

__all__ = [
    "DISCOUNTS",
    "AddOneUnigram",
    "KneserNey",
    "bits_per_byte",
    "count_of_counts",
    "kneser_ney_discounts",
]

DISCOUNTS = ("single", "modified")
"""The discount schemes of :class:`KneserNey`: one per order, or three per order."""


def bits_per_byte(nats: float, n_bytes: int) -> float:
    r"""A total loss in nats expressed per byte of text: :math:`\text{nats} / (\ln 2 \cdot \text{bytes})`.

    Bits per byte compare models whose tokenizers differ: the text is the same, however
    it was cut into tokens.
    """
    n_bytes = positive_int(n_bytes, "n_bytes")
    if isinstance(nats, bool) or not isinstance(nats, int | float | np.floating):
        raise TypeError(f"nats must be a number, got {describe(nats)}")
    return float(nats) / math.log(2) / n_bytes


def count_of_counts(counts: np.ndarray, largest: int = 4) -> np.ndarray:
    """``n[c]`` for ``c = 0..largest``: how many entries of ``counts`` equal ``c`` (``n[0]`` unused)."""
    counts = np.asarray(counts)
    kept = counts[(counts >= 1) & (counts <= largest)].astype(np.intp)
    return np.bincount(kept, minlength=largest + 1)


def kneser_ney_discounts(n: np.ndarray, discounts: str = "single") -> np.ndarray:
    r"""Chen and Goodman's discounts from count-of-counts ``n`` (``n[1]`` to ``n[4]``).

    Returns ``D`` of shape ``(4,)``: ``D[c]`` is subtracted from a count of ``c``
    (``D[3]`` from every count of 3 or more; ``D[0] = 0``). ``"single"`` gives
    :math:`Y = n_1/(n_1 + 2 n_2)` to every count; ``"modified"`` gives the three
    discounts of modified Kneser-Ney, or :math:`Y` to every count where one of them
    falls outside :math:`(0, c)`. A ratio whose denominator is zero counts as zero
    (no such counts: nothing to discount).
    """
    discounts = one_of(discounts, DISCOUNTS, "discounts")
    n = np.asarray(n, dtype=np.float64)
    if n.shape != (5,):
        raise ValueError(f"n must hold the count-of-counts n[0..4], shape (5,), got {describe(n)}")

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else 0.0

    y = ratio(n[1], n[1] + 2 * n[2])
    single = np.array([0.0, y, y, y])
    if discounts == "single":
        return single
    d = np.array(
        [
            0.0,
            1 - 2 * y * ratio(n[2], n[1]),
            2 - 3 * y * ratio(n[3], n[2]),
            3 - 4 * y * ratio(n[4], n[3]),
        ]
    )
    inside = (d[1:] > 0) & (d[1:] < np.arange(1, 4))
    return d if inside.all() else single


def _stream(ids: object, vocab_size: int, name: str) -> np.ndarray:
    ids = token_ids(ids, name, vocab_size)
    if ids.ndim != 1:
        raise ValueError(
            f"{name} must be one stream of token ids, shape (n,), got {describe(ids)}"
        )
    return ids


class AddOneUnigram:
    r"""The unigram model with add-one (Laplace) smoothing, :math:`p(w) = (c(w) + 1)/(N + V)`.

    Parameters
    ----------
    vocab_size : int
        :math:`V`, the number of ids a token can take.
    """

    order = 1

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = positive_int(vocab_size, "vocab_size")
        self.log_p: np.ndarray | None = None

    def __repr__(self) -> str:
        return f"AddOneUnigram(vocab_size={self.vocab_size})"

    def fit(self, ids: object) -> AddOneUnigram:
        """Count the training stream ``ids`` (shape ``(N,)``); returns the model."""
        ids = _stream(ids, self.vocab_size, "ids")
        counts = np.bincount(ids.astype(np.intp, copy=False), minlength=self.vocab_size) + 1.0
        self.log_p = np.log(counts / counts.sum())
        return self

    def _fitted(self) -> np.ndarray:
        if self.log_p is None:
            raise ValueError("the model is not fitted: call fit(ids) first")
        return self.log_p

    def log_probs(self, ids: object) -> np.ndarray:
        """``(n,)`` float64: the natural log-probability of each token of ``ids``."""
        log_p = self._fitted()
        return log_p[_stream(ids, self.vocab_size, "ids")]

    def distribution(self, context: object = ()) -> np.ndarray:
        """``(V,)``: the probability of every next token (the context is ignored)."""
        _stream(np.asarray(context, dtype=np.int64), self.vocab_size, "context")
        return np.exp(self._fitted())


@dataclass
class _Level:
    """The counts of one order ``k``: its k-grams (sorted keys), their counts, their contexts' sums."""

    keys: np.ndarray  # (G,) int64: prefix id * V + last token, sorted
    counts: np.ndarray  # (G,) float64: raw (highest order) or continuation counts
    totals: np.ndarray  # (C,) float64: sum of the counts of each context
    gammas: np.ndarray  # (C,) float64: the mass each context gives the order below
    discounts: np.ndarray  # (4,)


class _Counts:
    """The distinct k-grams of a stream for k = 1 .. ``max_order``: numbered, counted, located.

    Each k-gram is the pair (number of its first k - 1 tokens, its last token), written
    as the key ``number * V + token``; sorting the keys numbers the k-grams.
    """

    def __init__(self, ids: np.ndarray, max_order: int, vocab_size: int) -> None:
        if ids.size == 0:
            raise ValueError("ids must hold at least one token, got an empty stream")
        previous = np.zeros(ids.size, dtype=np.int64)  # number of the 0-gram before each position
        self.keys: list[np.ndarray] = []
        self.raw: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []  # where each distinct k-gram first ends
        self.numbers: list[np.ndarray] = []  # the number of the k-gram ending at each position
        for k in range(1, max_order + 1):
            span = np.arange(k - 1, ids.size)  # the positions where a k-gram ends
            prefix = previous[span - 1] if k > 1 else previous[span]
            keys, first, inverse, counts = np.unique(
                prefix * vocab_size + ids[span],
                return_index=True,
                return_inverse=True,
                return_counts=True,
            )
            current = np.full(ids.size, -1, dtype=np.int64)
            current[span] = inverse
            self.keys.append(keys)
            self.raw.append(counts.astype(np.float64))
            self.ends.append(span[first])
            self.numbers.append(current)
            previous = current

    def continuation(self, k: int) -> np.ndarray:
        """How many distinct tokens come before each k-gram: distinct (k+1)-grams ending in it."""
        suffix = self.numbers[k - 1][self.ends[k]].astype(np.intp, copy=False)
        return np.bincount(suffix, minlength=self.keys[k - 1].size).astype(np.float64)


def _lookup(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The index of each wanted key in the sorted ``keys``, or -1 where it is absent."""
    if keys.size == 0:
        return np.full(wanted.shape, -1, dtype=np.int64)
    at = np.searchsorted(keys, wanted)
    inside = at < keys.size
    found = np.zeros(wanted.shape, dtype=bool)
    found[inside] = keys[at[inside]] == wanted[inside]
    return np.where(found, at, -1)


class KneserNey:
    r"""Interpolated Kneser-Ney smoothing of order ``order``, one or three discounts per order.

    See :mod:`tinyformer.data.ngram_lm` for the formulas.

    Parameters
    ----------
    order : int
        :math:`n`: the longest n-gram counted (a context of ``order - 1`` tokens).
    vocab_size : int
        :math:`V`, the number of ids a token can take.
    discounts : str
        ``"single"`` (interpolated Kneser-Ney) or ``"modified"`` (modified Kneser-Ney).

    Examples
    --------
    >>> model = KneserNey(3, vocab_size=6).fit([4, 5, 4, 5, 4, 4])
    >>> float(model.distribution([4, 5]).sum())
    1.0
    """

    def __init__(self, order: int, vocab_size: int, *, discounts: str = "single") -> None:
        self.order = positive_int(order, "order")
        self.vocab_size = positive_int(vocab_size, "vocab_size")
        self.discounts = one_of(discounts, DISCOUNTS, "discounts")
        self.levels: list[_Level] = []

    def __repr__(self) -> str:
        return (
            f"KneserNey(order={self.order}, vocab_size={self.vocab_size},"
            f" discounts={self.discounts!r})"
        )

    # ----------------------------------------------------------------- fitting
    def fit(self, ids: object) -> KneserNey:
        """Count the k-grams of the training stream ``ids`` (shape ``(N,)``) for every order."""
        return self._from_counts(
            _Counts(_stream(ids, self.vocab_size, "ids"), self.order, self.vocab_size)
        )

    @classmethod
    def fit_orders(
        cls, ids: object, max_order: int, vocab_size: int, *, discounts: str = "single"
    ) -> dict[int, KneserNey]:
        """One model of every order from 1 to ``max_order``, fitted on ``ids`` with one count.

        The same as ``KneserNey(n, vocab_size, discounts=discounts).fit(ids)`` for each
        ``n``, but the n-grams of the stream are numbered once for all the orders.
        """
        models = {
            n: cls(n, vocab_size, discounts=discounts)
            for n in range(1, positive_int(max_order, "max_order") + 1)
        }
        counts = _Counts(_stream(ids, models[1].vocab_size, "ids"), max_order, vocab_size)
        return {n: model._from_counts(counts) for n, model in models.items()}

    def _from_counts(self, counted: _Counts) -> KneserNey:
        self.levels = []
        for k in range(1, self.order + 1):
            keys = counted.keys[k - 1]
            counts = counted.raw[k - 1] if k == self.order else counted.continuation(k)
            n_contexts = 1 if k == 1 else counted.keys[k - 2].size
            self.levels.append(self._level(keys, counts, n_contexts))
        return self

    def _level(self, keys: np.ndarray, counts: np.ndarray, n_contexts: int) -> _Level:
        d = kneser_ney_discounts(count_of_counts(counts), self.discounts)
        # np.bincount takes the platform's index type: int32 on 32-bit builds (WebAssembly)
        context = (keys // self.vocab_size).astype(np.intp, copy=False)
        totals = np.bincount(context, weights=counts, minlength=n_contexts)
        taken = d[np.minimum(counts, 3).astype(np.int64)]  # D(c) of each k-gram, D(0) = 0
        gammas = np.bincount(context, weights=taken, minlength=n_contexts)
        return _Level(keys, counts, totals, gammas, d)

    def _fitted(self) -> list[_Level]:
        if not self.levels:
            raise ValueError("the model is not fitted: call fit(ids) first")
        return self.levels

    def ngrams(self, order: int) -> tuple[np.ndarray, np.ndarray]:
        """The distinct ``order``-grams of the training stream and the counts the model uses for them.

        Returns ``(tokens, counts)``: ``tokens`` of shape ``(G, order)``, one n-gram per
        row, in the model's order (sorted by their first ``order - 1`` tokens' numbering,
        then by the last token); ``counts`` of shape ``(G,)``: raw counts at the model's
        own order, continuation counts (distinct tokens seen before the n-gram) below it.
        """
        levels = self._fitted()
        order = positive_int(order, "order")
        if order > self.order:
            raise ValueError(f"order must be at most the model's order={self.order}, got {order}")
        tokens = np.zeros((1, 0), dtype=np.int64)  # the one 0-gram
        for level in levels[:order]:
            prefix, last = np.divmod(level.keys, self.vocab_size)
            tokens = np.concatenate([tokens[prefix], last[:, None]], axis=1)
        return tokens, levels[order - 1].counts.copy()

    # ----------------------------------------------------------------- scoring
    def _context_ids(self, ids: np.ndarray) -> list[np.ndarray]:
        """For each order k, the id of the (k-1)-gram ending at each position (-1: unseen)."""
        levels = self._fitted()
        numbered = [np.zeros(ids.size, dtype=np.int64)]  # the 0-gram: always id 0
        for k in range(1, self.order):
            before = np.full(ids.size, -1, dtype=np.int64)
            if k == 1:
                before[:] = 0
            else:
                before[1:] = numbered[k - 1][:-1]
            known = before >= 0
            current = np.full(ids.size, -1, dtype=np.int64)
            current[known] = _lookup(
                levels[k - 1].keys, before[known] * self.vocab_size + ids[known]
            )
            numbered.append(current)
        return numbered

    def _probabilities(self, contexts: list[np.ndarray], targets: np.ndarray) -> np.ndarray:
        """p(target | context) with ``contexts[k - 1]`` the id of each row's (k-1)-token context."""
        p = np.full(targets.shape, 1.0 / self.vocab_size)
        for k, level in enumerate(self._fitted(), start=1):
            context = contexts[k - 1]
            seen = context >= 0
            seen[seen] = level.totals[context[seen]] > 0
            if not seen.any():
                continue
            h = context[seen]
            at = _lookup(level.keys, h * self.vocab_size + targets[seen])
            count = np.where(at >= 0, level.counts[np.maximum(at, 0)], 0.0)
            taken = level.discounts[np.minimum(count, 3).astype(np.int64)]
            kept = np.maximum(count - taken, 0.0)
            p[seen] = (kept + level.gammas[h] * p[seen]) / level.totals[h]
        return p

    def log_probs(self, ids: object) -> np.ndarray:
        r"""``(n,)`` float64: the natural log-probability of each token given the ones before it.

        Token :math:`t` is predicted from the :math:`\min(t, n - 1)` tokens before it in
        ``ids``; the first token from none.
        """
        ids = _stream(ids, self.vocab_size, "ids")
        numbered = self._context_ids(ids)
        contexts = []
        for k in range(1, self.order + 1):
            context = np.full(ids.size, -1, dtype=np.int64)
            if k == 1:
                context[:] = 0
            else:  # the (k-1)-gram ending just before each position
                context[1:] = numbered[k - 1][:-1]
            contexts.append(context)
        return np.log(self._probabilities(contexts, ids))

    def distribution(self, context: object = ()) -> np.ndarray:
        """``(V,)``: the probability of every next token after ``context`` (its last ``n - 1`` ids count)."""
        context = _stream(np.asarray(context, dtype=np.int64), self.vocab_size, "context")
        context = context[max(context.size - (self.order - 1), 0) :]
        numbered = self._context_ids(context)
        targets = np.arange(self.vocab_size)
        rows = []
        for k in range(1, self.order + 1):
            if k == 1:
                rows.append(np.zeros(self.vocab_size, dtype=np.int64))
            else:
                last = numbered[k - 1][-1] if context.size >= k - 1 else -1
                rows.append(np.full(self.vocab_size, last, dtype=np.int64))
        return self._probabilities(rows, targets)
