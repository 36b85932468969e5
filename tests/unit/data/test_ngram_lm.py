"""Count-based language models in tinyformer.data.ngram_lm: normalization, hand-worked counts, Kneser-Ney."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.data import MarkovSource
from tinyformer.data.ngram_lm import (
    AddOneUnigram,
    KneserNey,
    bits_per_byte,
    count_of_counts,
    kneser_ney_discounts,
)

A, B = 4, 5  # two token ids of a six-id vocabulary (0-3 are the special tokens)
TINY = [A, B, A, B, A, A]


def _zipf_stream(n: int, vocab_size: int, seed: int) -> np.ndarray:
    """A stream with repeats at every order: a noisy walk through a Zipf-like vocabulary."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab_size - 3)
    p = 1 / ranks / (1 / ranks).sum()
    ids = rng.choice(np.arange(4, vocab_size), size=n, p=p)
    copy = rng.random(n) < 0.4  # copy the token three back: longer n-grams repeat
    for t in np.flatnonzero(copy):
        if t >= 3:
            ids[t] = ids[t - 3]
    return ids


# ----------------------------------------------------------------- a reference
def _reference_log_probs(train, heldout, order, vocab_size, discounts):
    """Interpolated Kneser-Ney with dictionaries and loops, straight from the formulas."""
    train = [int(t) for t in train]
    raw = [Counter() for _ in range(order + 1)]
    for k in range(1, order + 1):
        for i in range(len(train) - k + 1):
            raw[k][tuple(train[i : i + k])] += 1
    counts = [None] * (order + 1)
    counts[order] = dict(raw[order])
    for k in range(1, order):
        left = defaultdict(set)
        for gram in raw[k + 1]:
            left[gram[1:]].add(gram[0])
        counts[k] = {g: len(left[g]) for g in raw[k]}
    d = [None] * (order + 1)
    for k in range(1, order + 1):
        n = [0] * 5
        for c in counts[k].values():
            if 1 <= c <= 4:
                n[c] += 1
        d[k] = kneser_ney_discounts(np.array(n), discounts)

    def p(word, context, k):
        if k == 0:
            return 1.0 / vocab_size
        h = tuple(context[len(context) - (k - 1) :]) if k > 1 else ()
        followers = {g[-1]: c for g, c in counts[k].items() if g[:-1] == h}
        total = sum(followers.values())
        lower = p(word, context, k - 1)
        if total == 0:
            return lower
        gamma = sum(d[k][min(int(c), 3)] for c in followers.values())
        c = followers.get(word, 0)
        return (max(c - d[k][min(int(c), 3)], 0.0) + gamma * lower) / total

    out = []
    for t, word in enumerate(int(w) for w in heldout):
        context = [int(w) for w in heldout[max(0, t - order + 1) : t]]
        out.append(math.log(p(word, context, min(order, len(context) + 1))))
    return np.array(out)


@pytest.mark.parametrize("discounts", ["single", "modified"])
@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_kneser_ney_agrees_with_a_loop_over_dictionaries(order, discounts):
    train = _zipf_stream(400, 12, seed=order)
    heldout = _zipf_stream(80, 12, seed=10 + order)
    model = KneserNey(order, 12, discounts=discounts).fit(train)
    expected = _reference_log_probs(train, heldout, order, 12, discounts)
    np.testing.assert_allclose(model.log_probs(heldout), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("discounts", ["single", "modified"])
def test_fitting_every_order_at_once_gives_the_models_fitted_one_by_one(discounts):
    train = _zipf_stream(1500, 20, seed=7)
    heldout = _zipf_stream(200, 20, seed=8)
    models = KneserNey.fit_orders(train, 5, 20, discounts=discounts)
    assert sorted(models) == [1, 2, 3, 4, 5]
    for n, model in models.items():
        alone = KneserNey(n, 20, discounts=discounts).fit(train)
        assert model.order == n
        np.testing.assert_array_equal(model.log_probs(heldout), alone.log_probs(heldout))


# ---------------------------------------------------------------- normalization
@pytest.mark.parametrize("discounts", ["single", "modified"])
@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_every_distribution_sums_to_one_over_the_vocabulary(order, discounts):
    train = _zipf_stream(2000, 30, seed=0)
    model = KneserNey(order, 30, discounts=discounts).fit(train)
    contexts = [
        [],  # no context
        train[100:104].tolist(),  # seen at every order
        [4, 4, 4, 4],  # partly seen
        [29, 28, 27, 26],  # the rarest tokens: probably never seen together
        [0, 1, 2, 3],  # the special tokens never occur in training
    ]
    for context in contexts:
        p = model.distribution(context)
        assert p.shape == (30,)
        assert (p >= 0).all()
        assert p.sum() == pytest.approx(1.0, abs=1e-12)


def test_every_id_gets_some_probability_when_every_order_has_singletons():
    train = _zipf_stream(300, 60, seed=0)  # rare tokens: n-grams seen once at every order
    model = KneserNey(3, 60).fit(train)
    assert all(level.discounts[1] > 0 for level in model.levels)
    for context in ([], train[:2].tolist(), [0, 1]):
        assert (model.distribution(context) > 0).all()  # the uniform floor reaches every id


@given(
    train=st.lists(st.integers(4, 9), min_size=1, max_size=60),
    context=st.lists(st.integers(0, 9), max_size=5),
    order=st.integers(1, 4),
    discounts=st.sampled_from(["single", "modified"]),
)
def test_normalization_holds_for_any_training_stream(train, context, order, discounts):
    model = KneserNey(order, 10, discounts=discounts).fit(train)
    p = model.distribution(context)
    assert (p >= 0).all()
    assert p.sum() == pytest.approx(1.0, abs=1e-12)


def test_log_probs_are_the_distributions_of_the_preceding_tokens():
    train = _zipf_stream(1000, 20, seed=1)
    heldout = _zipf_stream(40, 20, seed=2)
    model = KneserNey(4, 20).fit(train)
    log_p = model.log_probs(heldout)
    for t in range(heldout.size):
        p = model.distribution(heldout[:t])  # only the last three count
        assert log_p[t] == pytest.approx(math.log(p[heldout[t]]), rel=1e-12)


# ----------------------------------------------------------------- by hand
def test_a_tiny_corpus_worked_by_hand():
    """Training stream a b a b a a (a = 4, b = 5, six ids), order 2, one discount per order.

    Bigrams: ab twice, ba twice, aa once, so n1 = 1, n2 = 2 and D2 = 1 / (1 + 2*2) = 1/5.
    Continuation counts: a follows b and a (2), b follows a (1): n1 = n2 = 1, D1 = 1/3.
    Order 1: total 3, gamma = 2/3, so p1(a) = (2 - 1/3 + (2/3)/6) / 3 = 16/27,
    p1(b) = (1 - 1/3 + 1/9) / 3 = 7/27 and each of the four other ids gets (1/9)/3 = 1/27.
    Order 2 after a: ab (2), aa (1), total 3, gamma = 2/5.
    """
    model = KneserNey(2, 6).fit(TINY)
    tokens, continuation = model.ngrams(1)
    assert dict(zip(tokens[:, 0].tolist(), continuation.tolist(), strict=True)) == {A: 2, B: 1}
    tokens, raw = model.ngrams(2)
    assert {tuple(g): c for g, c in zip(tokens.tolist(), raw.tolist(), strict=True)} == {
        (A, A): 1, (A, B): 2, (B, A): 2,
    }  # fmt: skip
    p1 = np.array([1, 1, 1, 1, 16, 7]) / 27
    np.testing.assert_allclose(model.distribution([]), p1, rtol=1e-14)
    after_a = np.array([0.4 * p1[i] for i in range(6)])
    after_a[A] += 1 - 0.2  # aa: count 1
    after_a[B] += 2 - 0.2  # ab: count 2
    np.testing.assert_allclose(model.distribution([A]), after_a / 3, rtol=1e-14)
    after_b = 0.2 * p1  # only ba follows b: gamma = 1/5, total 2
    after_b[A] += 2 - 0.2
    np.testing.assert_allclose(model.distribution([B]), after_b / 2, rtol=1e-14)
    np.testing.assert_allclose(model.distribution([0]), p1, rtol=1e-14)  # unseen context
    assert model.log_probs([A, B])[1] == pytest.approx(math.log(after_a[B] / 3), rel=1e-14)


def test_continuation_counts_count_distinct_left_neighbours_not_occurrences():
    # 'q' (6) occurs eight times, always after 'p' (7); 'x' (8) occurs twice after two tokens
    stream = [7, 6] * 4 + [4, 8, 5, 8]
    model = KneserNey(3, 9).fit(stream)
    tokens, counts = model.ngrams(1)
    by_token = dict(zip(tokens[:, 0].tolist(), counts.tolist(), strict=True))
    assert by_token[6] == 1  # frequent, but only ever after one token
    assert by_token[8] == 2
    assert by_token[7] == 1  # 7 follows 6 only
    # order 2: distinct tokens before each bigram
    tokens, counts = model.ngrams(2)
    bigram = {tuple(g): c for g, c in zip(tokens.tolist(), counts.tolist(), strict=True)}
    assert bigram[(7, 6)] == 1  # only 6 comes before 7 6 (and nothing before the first)
    assert bigram[(6, 7)] == 1
    _, raw = model.ngrams(3)
    assert raw.sum() == len(stream) - 2  # the highest order keeps raw counts
    # so the lower order prefers x to q after an unseen context, despite q's count
    p = model.distribution([0, 0])
    assert p[8] > p[6]


def test_an_unseen_context_backs_off_to_its_seen_suffix_exactly():
    train = _zipf_stream(3000, 25, seed=3)
    model = KneserNey(4, 25).fit(train)
    seen = train[500:502].tolist()
    np.testing.assert_array_equal(model.distribution([0, *seen]), model.distribution(seen))
    np.testing.assert_array_equal(model.distribution([0, 1, *seen]), model.distribution(seen))


def test_orders_up_to_the_sources_own_fit_a_markov_stream_better_and_better():
    source = MarkovSource.random(12, 2, 3, rng=np.random.default_rng(4))  # second order
    train, heldout = (source.sample(n, np.random.default_rng(n)) + 4 for n in (20000, 4000))
    totals = [-KneserNey(n, 16).fit(train).log_probs(heldout)[2:].sum() for n in (1, 2, 3)]
    assert totals[0] > totals[1] > totals[2]
    # order 3 sees the whole context: it comes within 3% of the source's own loss
    assert totals[2] / (len(heldout) - 2) < 1.03 * source.cross_entropy(heldout[None] - 4)


# ---------------------------------------------------------------- discounts
def test_discounts_follow_chen_and_goodman():
    n = np.array([0, 100, 40, 20, 10])
    y = 100 / (100 + 2 * 40)
    np.testing.assert_allclose(kneser_ney_discounts(n, "single"), [0, y, y, y])
    np.testing.assert_allclose(
        kneser_ney_discounts(n, "modified"),
        [0, 1 - 2 * y * 40 / 100, 2 - 3 * y * 20 / 40, 3 - 4 * y * 10 / 20],
    )
    # degenerate count-of-counts: modified falls back to the single discount Y for every
    # count as soon as one of its three leaves (0, c); no count is ever made negative
    for n in ([0, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 5, 0, 0], [0, 1, 9, 0, 0], [0, 5, 1, 1, 0]):
        single = kneser_ney_discounts(np.array(n), "single")
        np.testing.assert_array_equal(kneser_ney_discounts(np.array(n), "modified"), single)
        assert (single >= 0).all()
        assert (single <= 1).all()


def test_modified_discounts_never_leave_a_seen_context_without_mass_for_the_rest():
    """A stream whose order-2 counts give D(2) <= 0 and D(3+) = 3 by the formulas.

    Clipping them would give the context 6 (followed only by 7, twice) no mass for any
    other id: p(x | 6) = 0. With the fallback every id keeps some probability.
    """
    train = [5, 5, 5, 5, 4, 6, 7, 6, 7, 5, 6]
    model = KneserNey(2, 8, discounts="modified").fit(train)
    n = count_of_counts(model.levels[1].counts)
    assert n.tolist() == [0, 5, 1, 1, 0]
    y = n[1] / (n[1] + 2 * n[2])
    assert 2 - 3 * y * n[3] / n[2] <= 0
    assert 3 - 4 * y * n[4] / n[3] == 3
    np.testing.assert_allclose(model.levels[1].discounts, [0, y, y, y])
    after_six = model.distribution([6])
    assert after_six.min() > 0
    assert after_six.sum() == pytest.approx(1.0, abs=1e-12)


def test_count_of_counts_and_the_fitted_discounts():
    assert count_of_counts(np.array([1, 1, 2, 5, 3, 4, 4, 0])).tolist() == [0, 2, 1, 1, 2]
    train = _zipf_stream(3000, 25, seed=6)
    model = KneserNey(3, 25, discounts="modified").fit(train)
    for k in (1, 2, 3):
        _, counts = model.ngrams(k)
        expected = kneser_ney_discounts(count_of_counts(counts), "modified")
        np.testing.assert_array_equal(model.levels[k - 1].discounts, expected)


# ------------------------------------------------------------------ unigram
def test_add_one_unigram():
    model = AddOneUnigram(6).fit(TINY)
    expected = np.array([1, 1, 1, 1, 5, 3]) / 12  # counts + 1 over N + V = 6 + 6
    np.testing.assert_allclose(model.distribution(), expected, rtol=1e-15)
    np.testing.assert_allclose(model.log_probs([B, 0]), np.log([3 / 12, 1 / 12]), rtol=1e-15)
    assert model.distribution([A, B]).sum() == pytest.approx(1.0, abs=1e-15)


def test_bits_per_byte():
    assert bits_per_byte(math.log(2) * 10, 5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="n_bytes"):
        bits_per_byte(1.0, 0)
    with pytest.raises(TypeError, match="nats"):
        bits_per_byte("1", 3)


# ------------------------------------------------------------------- errors
def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="order"):
        KneserNey(0, 6)
    with pytest.raises(ValueError, match="discounts"):
        KneserNey(2, 6, discounts="absolute")
    with pytest.raises(ValueError, match="not fitted"):
        KneserNey(2, 6).log_probs([4, 5])
    with pytest.raises(ValueError, match="not fitted"):
        AddOneUnigram(6).distribution()
    with pytest.raises(ValueError, match="ids"):
        KneserNey(2, 6).fit([4, 6])  # 6 is outside the vocabulary
    with pytest.raises(ValueError, match="ids"):
        KneserNey(2, 6).fit([[4, 5]])
    with pytest.raises(ValueError, match="empty"):
        KneserNey(2, 6).fit(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="context"):
        KneserNey(2, 6).fit(TINY).distribution([9])
    with pytest.raises(ValueError, match="order"):
        KneserNey(2, 6).fit(TINY).ngrams(3)
    with pytest.raises(ValueError, match="count-of-counts"):
        kneser_ney_discounts(np.array([1, 2]))
