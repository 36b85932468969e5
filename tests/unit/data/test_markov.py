"""The synthetic Markov source: exact stationary distribution and entropy rate, sampling."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.data.markov import MarkovSource, _de_bruijn, empirical_entropy_rate


@pytest.fixture(scope="module")
def source() -> MarkovSource:
    return MarkovSource.random(rng=np.random.default_rng(0))  # V = 16, k = 2, 4 successors


@pytest.fixture(scope="module")
def long_sample(source) -> np.ndarray:
    return source.sample(20_000, np.random.default_rng(1), n_streams=64)  # 1.28 M tokens


def _entropy(p):
    p = np.asarray(p, dtype=float)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_default_source_shape_and_sparsity(source):
    assert (source.vocab_size, source.order, source.n_contexts) == (16, 2, 256)
    table = source.transitions
    assert table.shape == (16, 16, 16)
    assert ((table > 0).sum(axis=-1) == 4).all()
    np.testing.assert_allclose(table.sum(axis=-1), 1.0, rtol=1e-15)


def test_stationary_distribution_balances_the_flow(source):
    pi = source.stationary
    assert pi.shape == (16, 16)
    assert (pi > 0).all()
    assert math.isclose(pi.sum(), 1.0, rel_tol=1e-13)
    table = source.transitions
    flow = np.zeros_like(pi)
    for a, b, x in itertools.product(range(16), repeat=3):
        flow[b, x] += pi[a, b] * table[a, b, x]  # context (a, b) emits x and becomes (b, x)
    np.testing.assert_allclose(flow, pi, rtol=1e-10, atol=1e-15)


def test_entropy_rate_is_the_stationary_mean_of_the_context_entropies(source):
    expected = sum(
        source.stationary[a, b] * _entropy(source.transitions[a, b])
        for a, b in itertools.product(range(16), repeat=2)
    )
    assert math.isclose(source.entropy_rate, expected, rel_tol=1e-12)
    assert 0 < source.entropy_rate < math.log(4) < math.log(16)


def test_two_state_chain_matches_the_closed_form():
    a, b = 0.3, 0.8  # p(1 | 0) and p(0 | 1)
    src = MarkovSource(np.array([[1 - a, a], [b, 1 - b]]))
    np.testing.assert_allclose(src.stationary, [b / (a + b), a / (a + b)], rtol=1e-14)

    def h(p):
        return -p * math.log(p) - (1 - p) * math.log(1 - p)

    assert math.isclose(src.entropy_rate, (b * h(a) + a * h(b)) / (a + b), rel_tol=1e-13)


def test_uniform_table_has_entropy_log_v():
    src = MarkovSource(np.full((5, 5, 5), 0.2))
    assert math.isclose(src.entropy_rate, math.log(5), rel_tol=1e-14)
    np.testing.assert_allclose(src.optimal_cross_entropy(4), math.log(5), rtol=1e-14)


def test_order_two_table_that_ignores_the_older_token_has_its_order_one_entropy_rate(rng):
    first = rng.dirichlet(np.ones(3), size=3)  # p(x | b)
    second = np.broadcast_to(first, (3, 3, 3))  # p(x | a, b) = p(x | b)
    assert math.isclose(
        MarkovSource(first).entropy_rate, MarkovSource(second).entropy_rate, rel_tol=1e-12
    )


@given(st.integers(2, 6), st.integers(1, 3), st.integers(0, 2**32 - 1), st.data())
def test_random_sources_are_always_valid(vocab_size, order, seed, data):
    branching = data.draw(st.integers(2, vocab_size))
    src = MarkovSource.random(vocab_size, order, branching, rng=np.random.default_rng(seed))
    assert ((src.transitions > 0).sum(axis=-1) == branching).all()
    assert 0 < src.entropy_rate <= math.log(branching) + 1e-12
    assert math.isclose(src.stationary.sum(), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize(("vocab_size", "order"), [(2, 3), (3, 2), (4, 1), (16, 2), (5, 3)])
def test_de_bruijn_holds_every_context_exactly_once(vocab_size, order):
    seq = _de_bruijn(vocab_size, order)
    assert len(seq) == vocab_size**order
    cyclic = seq + seq[: order - 1]
    grams = {tuple(cyclic[i : i + order]) for i in range(len(seq))}
    assert len(grams) == vocab_size**order


def test_long_sample_estimates_approach_the_entropy_rate(source, long_sample):
    h = source.entropy_rate
    plug_in = empirical_entropy_rate(long_sample, vocab_size=16, order=2)
    oracle = source.cross_entropy(long_sample)
    assert abs(plug_in - h) < 0.005
    assert abs(oracle - h) < 0.005
    assert plug_in < oracle  # the plug-in estimate is biased low: it fits the sample itself
    short = empirical_entropy_rate(long_sample[:4, :200], vocab_size=16, order=2)
    assert short < plug_in  # ... the more so on a small sample


def test_sample_starts_stationary_and_makes_only_allowed_moves(source, long_sample):
    assert long_sample.shape == (64, 20_000)
    assert long_sample.dtype == np.int64
    starts = source.sample(2, np.random.default_rng(3), n_streams=50_000)
    freq = np.zeros((16, 16))
    np.add.at(freq, (starts[:, 0], starts[:, 1]), 1 / len(starts))
    assert np.abs(freq - source.stationary).sum() < 0.1  # about 0.05 expected
    table = source.transitions
    assert (table[long_sample[:, :-2], long_sample[:, 1:-1], long_sample[:, 2:]] > 0).all()


def test_token_frequencies_match_the_stationary_marginal(source, long_sample):
    freq = np.bincount(long_sample.ravel(), minlength=16) / long_sample.size
    np.testing.assert_allclose(freq, source.stationary.sum(axis=0), atol=0.005)


def test_sampling_is_reproducible(source):
    a = source.sample(500, np.random.default_rng(11))
    b = source.sample(500, np.random.default_rng(11))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (500,)


def test_windows_are_shifted_by_one(source, rng):
    inputs, targets = source.sample_windows(8, 12, rng)
    assert inputs.shape == targets.shape == (8, 12)
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])


def test_optimal_cross_entropy_per_position(source):
    best = source.optimal_cross_entropy(6)
    pi = source.stationary
    first = _entropy(pi) - _entropy(pi.sum(axis=1))  # H(X_1 | X_0)
    assert math.isclose(best[0], first, rel_tol=1e-12)
    np.testing.assert_allclose(best[1:], source.entropy_rate, rtol=1e-15)
    assert best[0] > source.entropy_rate


def test_next_token_probs_reads_the_table(source):
    ctx = np.array([[3, 7], [0, 15]])
    np.testing.assert_array_equal(
        source.next_token_probs(ctx), source.transitions[[3, 0], [7, 15]]
    )


def _two_cycle():
    return MarkovSource(np.array([[0.0, 1.0], [1.0, 0.0]]))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda: MarkovSource(np.array([[0.5, 0.4], [0.5, 0.5]])),
            ValueError,
            "transitions[0] must sum to 1",
        ),
        (lambda: MarkovSource(np.array([[1.5, -0.5], [0.5, 0.5]])), ValueError, "non-negative"),
        (lambda: MarkovSource(np.array([[np.nan, 1.0], [0.5, 0.5]])), ValueError, "finite"),
        (lambda: MarkovSource(np.ones((2, 3)) / 3), ValueError, "shape (V, ..., V)"),
        (lambda: MarkovSource(np.ones(3) / 3), ValueError, "at least 2 dimensions"),
        (lambda: MarkovSource(np.array([["a"]])), TypeError, "transitions must be a real"),
        (lambda: MarkovSource(np.eye(3)), ValueError, "irreducible"),
        (_two_cycle, ValueError, "aperiodic chain, got period 2"),
        (lambda: MarkovSource(np.full((9, 9, 9, 9, 9), 1 / 9)), ValueError, "at most 4096"),
        (
            lambda: MarkovSource.random(16, 2, 1, rng=np.random.default_rng(0)),
            ValueError,
            "branching must be in [2, vocab_size=16]",
        ),
        (
            lambda: MarkovSource.random(4, 2, 5, rng=np.random.default_rng(0)),
            ValueError,
            "branching",
        ),
        (
            lambda: MarkovSource.random(1, 2, 2, rng=np.random.default_rng(0)),
            ValueError,
            "vocab_size must be at least 2",
        ),
        (
            lambda: MarkovSource.random(32, 3, rng=np.random.default_rng(0)),
            ValueError,
            "32**3 = 32768",
        ),
        (
            lambda: MarkovSource.random(order=0, rng=np.random.default_rng(0)),
            ValueError,
            "order must be a positive",
        ),
        (lambda: MarkovSource.random(rng=0), TypeError, "rng must be a numpy.random.Generator"),
        (
            lambda: MarkovSource.random(rng=np.random.default_rng(0), concentration=0),
            ValueError,
            "concentration must be a finite positive",
        ),
        (
            lambda: MarkovSource.random(rng=np.random.default_rng(0), concentration=0.01),
            ValueError,
            "concentration must be at least 0.1",
        ),
        (
            lambda: _two_cycle_free().sample(1, np.random.default_rng(0)),
            ValueError,
            "at least the order 2",
        ),
        (
            lambda: _two_cycle_free().sample(5, np.random.default_rng(0), n_streams=0),
            ValueError,
            "n_streams",
        ),
        (
            lambda: empirical_entropy_rate(np.array([0, 1, 5]), 4, 1),
            ValueError,
            "tokens must be ids in [0, 4)",
        ),
        (lambda: empirical_entropy_rate(np.array([0, 1]), 4, 2), ValueError, "L > order=2"),
        (
            lambda: empirical_entropy_rate(np.array([0.0, 1.0, 2.0]), 4, 1),
            TypeError,
            "integer array",
        ),
        (
            lambda: _two_cycle_free().next_token_probs(np.array([1, 2, 3])),
            ValueError,
            "shape (..., 2)",
        ),
        (lambda: _two_cycle_free().next_token_probs(np.array([1, 9])), ValueError, "in [0, 3)"),
        (
            lambda: _two_cycle_free().cross_entropy(np.array([0, 0, 0, 0])),
            ValueError,
            "cannot make",
        ),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def _two_cycle_free():
    """An order-2 source over 3 symbols in which (0, 0) never emits 0."""
    table = np.full((3, 3, 3), 1 / 3)
    table[0, 0] = [0.0, 0.5, 0.5]
    return MarkovSource(table)


# ------------------------------------------------------- posteriors from noisy observations
def _brute_force_posteriors(source, likelihoods, left_only):
    """p(x_t | y_s, s != t) (or s < t) by summing over every window, for one window."""
    t_len, v, k = likelihoods.shape[0], source.vocab_size, source.order
    out = np.zeros((t_len, v))
    table = source.transitions.reshape(-1, v)
    for window in itertools.product(range(v), repeat=t_len + k - 1):  # k - 1 unseen tokens first
        p = source.stationary[window[:k]]
        for t in range(k, len(window)):
            p *= table[source.context_index(np.array(window[t - k : t])), window[t]]
        tokens = window[k - 1 :]
        for t in range(t_len):
            others = range(t) if left_only else (s for s in range(t_len) if s != t)
            weight = p * math.prod(likelihoods[s, tokens[s]] for s in others)
            out[t, tokens[t]] += weight
    return out / out.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("left_only", [False, True])
def test_token_posteriors_match_brute_force_enumeration(order, left_only):
    rng = np.random.default_rng(order)
    tiny = MarkovSource.random(3, order, 2, rng=rng)
    likelihoods = rng.random((2, 4, 3))  # two windows of 4 noisy observations
    likelihoods[0, 2] = 1.0  # position 2 of window 0 unobserved
    likelihoods[1, 1] = [0.0, 1.0, 0.0]  # position 1 of window 1 observed exactly
    got = tiny.token_posteriors(likelihoods, left_only=left_only)
    for b in range(2):
        want = _brute_force_posteriors(tiny, likelihoods[b], left_only)
        np.testing.assert_allclose(got[b], want, rtol=1e-12, atol=1e-15)


def test_token_posteriors_without_observations_are_the_stationary_marginal(source):
    got = source.token_posteriors(np.ones((3, 5, 16)))
    marginal = source.stationary.sum(axis=0)  # p(x_t) of the stationary chain
    np.testing.assert_allclose(got, np.broadcast_to(marginal, got.shape), atol=1e-12)


def test_exact_left_observations_give_the_next_token_distribution(source):
    """Observing x_<t exactly, the left-only posterior of x_t is p(x_t | context)."""
    window = source.sample(6, np.random.default_rng(4))
    exact = np.eye(16)[window][None]  # (1, 6, 16) one-hot: every token observed exactly
    got = source.token_posteriors(exact, left_only=True)[0]
    for t in range(2, 6):
        np.testing.assert_allclose(got[t], source.next_token_probs(window[t - 2 : t]), atol=1e-12)


def test_token_posteriors_do_not_depend_on_the_chunking(source):
    likelihoods = np.random.default_rng(5).random((300, 4, 16))  # more windows than one chunk
    whole = source.token_posteriors(likelihoods)
    np.testing.assert_array_equal(whole[290:], source.token_posteriors(likelihoods[290:]))


@pytest.mark.parametrize(
    ("likelihoods", "error", "words"),
    [
        (np.ones((2, 3, 5)), ValueError, "shape (B, T, 3)"),
        (np.ones((3, 3)), ValueError, "at least 3 dimensions"),
        (-np.ones((1, 2, 3)), ValueError, "non-negative"),
        (np.zeros((1, 2, 3)), ValueError, "probability 0"),
        (np.full((1, 2, 3), "a"), TypeError, "floating-point"),
    ],
)
def test_token_posteriors_refuse_bad_likelihoods(likelihoods, error, words):
    with pytest.raises(error) as info:
        _two_cycle_free().token_posteriors(likelihoods)
    assert words in str(info.value)
