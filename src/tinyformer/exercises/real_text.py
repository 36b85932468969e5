"""The live exercise of the chapter on real text: a Kneser-Ney bigram model."""

from __future__ import annotations

import numpy as np

from tinyformer.data.ngram_lm import KneserNey
from tinyformer.exercises import Case, Exercise


def _library_bigram(ids, vocab_size):
    """Every row p(. | h) of the library's order-2 KneserNey fitted on ``ids``."""
    lm = KneserNey(2, vocab_size).fit(ids)
    return np.stack([lm.distribution([h]) for h in range(vocab_size)])  # (V, V)


def _discount(counts):
    n1, n2 = np.sum(counts == 1), np.sum(counts == 2)
    return n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else 0.0


def _bigram_from(ids, vocab_size, lower):
    """The order-2 formula over a given lower-order array ``lower`` of counts, (V,)."""
    v = vocab_size
    c = (
        np.bincount((ids[:-1] * v + ids[1:]).astype(np.intp), minlength=v * v)
        .reshape(v, v)
        .astype(float)
    )
    d1, d2 = _discount(lower), _discount(c)
    p1 = (np.maximum(lower - d1, 0) + d1 * np.sum(lower > 0) / v) / lower.sum()
    total = c.sum(axis=1, keepdims=True)  # (V, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p2 = (np.maximum(c - d2, 0) + d2 * (c > 0).sum(axis=1, keepdims=True) * p1) / total
    return p2, p1, total


def _raw_unigram(ids, vocab_size):
    """Backs off to how often each token occurs, not to how many tokens it follows."""
    p2, p1, total = _bigram_from(
        ids, vocab_size, np.bincount(ids.astype(np.intp), minlength=vocab_size).astype(float)
    )
    return np.where(total > 0, p2, p1)


def _no_unseen_context(ids, vocab_size):
    """Divides by the count of a context never followed by a token: a row of NaN."""
    pairs = np.bincount((ids[:-1] * vocab_size + ids[1:]).astype(np.intp), minlength=vocab_size**2)
    a = (pairs.reshape(vocab_size, vocab_size) > 0).sum(axis=0).astype(float)
    return _bigram_from(ids, vocab_size, a)[0]


def _unsmoothed_lower(ids, vocab_size):
    """Takes the lower order as a(w) / sum a(v), undiscounted: a symbol never seen gets 0."""
    pairs = np.bincount((ids[:-1] * vocab_size + ids[1:]).astype(np.intp), minlength=vocab_size**2)
    c = pairs.reshape(vocab_size, vocab_size).astype(float)
    a = (c > 0).sum(axis=0).astype(float)
    p1 = a / a.sum()
    d2 = _discount(c)
    total = c.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p2 = (np.maximum(c - d2, 0) + d2 * (c > 0).sum(axis=1, keepdims=True) * p1) / total
    return np.where(total > 0, p2, p1)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    small = rng.integers(0, 5, 60)
    rare = rng.integers(0, 5, 60)
    rare[0] = 6  # token 6 only starts the stream (never follows a token); token 5 never occurs
    rng = np.random.default_rng(1)
    hong_kong = rng.integers(0, 4, 80)
    hong_kong[rng.choice(np.arange(1, 79), 20, replace=False)] = 4  # "hong" ...
    hong_kong = np.concatenate(
        [[t, 5] if t == 4 else [t] for t in hong_kong]
    )  # ... is followed by "kong"
    skewed = np.random.default_rng(2).choice(12, 400, p=np.arange(12, 0, -1) / 78)
    # The platform's index type, which np.bincount takes (int32 in the in-browser Python).
    small, rare, hong_kong, skewed = (x.astype(np.intp) for x in (small, rare, hong_kong, skewed))
    return [
        Case((small, 5), label="a stream of 60 tokens over 5 symbols"),
        Case((rare, 7), label="7 symbols, one never seen and one seen only as the first token"),
        Case(
            (hong_kong, 7),
            label="a frequent token that only ever follows one other token, and a symbol never seen",
        ),  # the one case whose lower-order discount D1 is not 0 and does not cancel out
        Case((skewed, 12), label="400 tokens over 12 symbols of unequal frequency"),
    ]


KNESER_NEY_BIGRAM = Exercise(
    chapter="real_text",
    name="kneser_ney_bigram",
    stub='''\
def kneser_ney_bigram(ids, vocab_size):
    """Interpolated Kneser-Ney bigram probabilities, with one discount per order.

    ids: 1-D int array, the training stream, values in [0, vocab_size); V = vocab_size.
    Returns P, shape (V, V), with P[h, w] = p(w | h); every row sums to one. With
      c(h, w) = how often w comes right after h in the stream, and
      a(w)    = the number of distinct tokens h with c(h, w) > 0 (w's continuation count),
    the lower order is
      p1(w) = (max(a(w) - D1, 0) + D1 * #{v : a(v) > 0} / V) / sum_v a(v)
    and the bigram
      p(w | h) = (max(c(h, w) - D2, 0) + D2 * #{v : c(h, v) > 0} * p1(w)) / sum_v c(h, v),
    or p(w | h) = p1(w) for a token h that is never followed by a token in the stream.
    D2 = n1 / (n1 + 2 n2), where n_k is the number of pairs (h, w) with c(h, w) = k;
    D1 is the same formula over the values a(w); a discount is 0 if its n1 + 2 n2 is 0.
    """
    raise NotImplementedError
''',
    reference=_library_bigram,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    mistakes=(_raw_unigram, _no_unseen_context, _unsmoothed_lower),
)
"""Write Kneser-Ney smoothing of order 2: continuation counts below, the unseen context's row."""
