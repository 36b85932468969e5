"""Tests of tinyformer.generation.processing: temperature, top-k, top-p and token draws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tinyformer.functional import log_softmax
from tinyformer.generation import log_probabilities, probabilities, sample_tokens

finite = st.floats(-20, 20, allow_nan=False, width=64)
logit_rows = arrays(np.float64, st.integers(1, 12), elements=finite)


def _nucleus_by_definition(p: np.ndarray, top_p: float) -> set[int]:
    """The smallest set of most likely tokens whose mass reaches top_p (ties: smaller id first)."""
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += p[i]
        if mass >= top_p:
            break
    return kept


# ------------------------------------------------------------------ temperature
@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_temperature_divides_the_logits(rng, temperature):
    z = rng.standard_normal((3, 7))
    expected = log_softmax(z / temperature)
    np.testing.assert_allclose(log_probabilities(z, temperature=temperature), expected, atol=1e-14)


def test_low_temperature_sharpens_and_high_flattens(rng):
    z = rng.standard_normal(9)
    entropy = [
        -(p * np.log(p)).sum() for p in (probabilities(z, temperature=t) for t in (0.5, 1, 2))
    ]
    assert entropy[0] < entropy[1] < entropy[2]


def test_tiny_temperature_is_one_hot_at_the_argmax(rng):
    z = rng.standard_normal((4, 10))
    p = probabilities(z, temperature=1e-6)
    np.testing.assert_array_equal(p, np.eye(10)[z.argmax(axis=1)])


# ------------------------------------------------------------------------ top-k
@pytest.mark.parametrize("k", [1, 2, 5])
def test_top_k_keeps_the_k_most_likely_and_renormalizes(rng, k):
    z = rng.standard_normal((6, 8))
    p = probabilities(z, top_k=k)
    full = probabilities(z)
    for row_p, row_full, row_z in zip(p, full, z, strict=True):
        kept = set(np.argsort(-row_z)[:k])
        assert set(np.flatnonzero(row_p)) == kept
        np.testing.assert_allclose(
            row_p[list(kept)], row_full[list(kept)] / row_full[list(kept)].sum()
        )
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-14)


def test_top_k_breaks_ties_towards_the_smaller_id():
    z = np.array([0.0, 1.0, 2.0, 1.0, 2.0, 1.0])
    np.testing.assert_array_equal(np.flatnonzero(probabilities(z, top_k=1)), [2])
    np.testing.assert_array_equal(np.flatnonzero(probabilities(z, top_k=3)), [1, 2, 4])


def test_top_k_equal_to_the_vocabulary_changes_nothing(rng):
    z = rng.standard_normal((2, 5))
    np.testing.assert_array_equal(log_probabilities(z, top_k=5), log_probabilities(z))


# ------------------------------------------------------------------------ top-p
def test_top_p_on_a_known_distribution():
    p = np.array([0.05, 0.5, 0.15, 0.3])
    z = np.log(p)
    kept = {
        top_p: set(np.flatnonzero(probabilities(z, top_p=top_p)))
        for top_p in (0.4, 0.6, 0.79, 0.81, 0.99)
    }
    assert kept == {0.4: {1}, 0.6: {1, 3}, 0.79: {1, 3}, 0.81: {1, 2, 3}, 0.99: {0, 1, 2, 3}}
    np.testing.assert_allclose(probabilities(z, top_p=0.6), [0, 0.5 / 0.8, 0, 0.3 / 0.8])


def test_top_p_stops_as_soon_as_the_mass_reaches_p():
    # four equally likely tokens (0.25 each, exact in binary): two reach 0.5, ties by id
    np.testing.assert_array_equal(probabilities(np.zeros(4), top_p=0.5), [0.5, 0.5, 0, 0])
    np.testing.assert_array_equal(probabilities(np.zeros(4), top_p=0.5 + 1e-9), [1 / 3] * 3 + [0])


@given(logit_rows, st.floats(1e-6, 1.0))
def test_top_p_keeps_the_smallest_set_reaching_p(z, top_p):
    full = probabilities(z)
    cumulative = np.cumsum(np.sort(full)[::-1])
    assume(np.abs(cumulative - top_p).min() > 1e-9)  # no set sits on the boundary
    assume(len(set(np.round(full, 12))) == len(full))  # no ties near the boundary
    kept = set(np.flatnonzero(probabilities(z, top_p=top_p)))
    assert kept == _nucleus_by_definition(full, top_p)


@given(logit_rows)
def test_top_p_one_changes_nothing(z):
    np.testing.assert_array_equal(log_probabilities(z, top_p=1.0), log_probabilities(z))


def test_tiny_top_p_keeps_only_the_argmax_even_on_ties():
    z = np.array([[0.5, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(probabilities(z, top_p=1e-9), [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_top_k_then_top_p_on_the_renormalized_distribution():
    p = np.array([0.4, 0.3, 0.2, 0.1])
    # top_k=2 leaves (4/7, 3/7); the nucleus of 0.5 is then the first token alone
    np.testing.assert_array_equal(probabilities(np.log(p), top_k=2, top_p=0.5), [1, 0, 0, 0])
    # without top-k the first token (0.4) does not reach 0.5
    assert np.count_nonzero(probabilities(np.log(p), top_p=0.5)) == 2


@given(logit_rows, st.floats(0.1, 5.0), st.integers(1, 12), st.floats(1e-3, 1.0))
def test_processed_rows_are_distributions(z, temperature, k, top_p):
    log_p = log_probabilities(z, temperature=temperature, top_k=min(k, len(z)), top_p=top_p)
    assert np.isclose(np.exp(log_p).sum(), 1.0, atol=1e-12)
    assert not np.isnan(log_p).any()
    assert np.isfinite(log_p).sum() >= 1


def test_dtype_and_impossible_tokens_are_kept(rng):
    z = rng.standard_normal((2, 6)).astype(np.float32)
    z[:, 3] = -np.inf
    for options in ({}, {"temperature": 0.5}, {"top_k": 4}, {"top_p": 0.9}):
        log_p = log_probabilities(z, **options)
        assert log_p.dtype == np.float32
        assert (log_p[:, 3] == -np.inf).all()


# ----------------------------------------------------------------- bad options
@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"temperature": 0}, ValueError, "greedy"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": float("inf")}, ValueError, "temperature"),
        ({"temperature": True}, TypeError, "temperature"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"top_k": 0}, ValueError, "top_k"),
        ({"top_k": 6}, ValueError, "vocabulary size 5"),
        ({"top_k": 2.0}, TypeError, "top_k"),
        ({"top_p": 0.0}, ValueError, "top_p"),
        ({"top_p": 1.5}, ValueError, "top_p"),
        ({"top_p": float("nan")}, ValueError, "top_p"),
        ({"top_p": "all"}, TypeError, "top_p"),
    ],
)
def test_bad_options_are_refused_by_name(options, error, words):
    with pytest.raises(error, match=words):
        log_probabilities(np.zeros(5), **options)


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="NaN"):
        log_probabilities(np.array([0.0, np.nan]))
    with pytest.raises(TypeError, match="logits"):
        log_probabilities(np.array(["a", "b"]))
    with pytest.raises(ValueError, match="logits"):
        log_probabilities(np.float64(1.0))


# ---------------------------------------------------------------- token draws
def test_sample_tokens_never_draws_a_zero_probability_token(rng):
    p = np.array([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 0, 0, 0, 0]])
    draws = np.stack([sample_tokens(p, rng) for _ in range(300)])
    assert set(draws[:, 0]) == {1, 3}
    assert (draws[:, 1] == 4).all()
    assert (draws[:, 2] == 0).all()


def test_sample_tokens_is_reproducible_from_the_generator():
    p = np.full((50, 7), 1 / 7)
    a = sample_tokens(p, np.random.default_rng(5))
    b = sample_tokens(p, np.random.default_rng(5))
    c = sample_tokens(p, np.random.default_rng(6))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_sample_tokens_refuses_bad_input(rng):
    with pytest.raises(TypeError, match="Generator"):
        sample_tokens(np.ones((1, 3)), np.random.RandomState(0))
    with pytest.raises(TypeError, match="Generator"):
        sample_tokens(np.ones((1, 3)), 0)
    with pytest.raises(ValueError, match="positive sum"):
        sample_tokens(np.zeros((1, 3)), rng)
    with pytest.raises(ValueError, match="non-negative"):
        sample_tokens(np.array([[0.5, -0.1, 0.6]]), rng)
    with pytest.raises(ValueError, match="2 dimensions"):
        sample_tokens(np.ones(3), rng)
