"""Counts, distances and the chi-square test of fit in tinyformer.data.ngram_fit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tinyformer.data import MarkovSource
from tinyformer.data.ngram_fit import (
    chi_square_fit,
    chi_square_survival,
    mean_total_variation,
    transition_counts,
)


def _source(seed: int = 0) -> MarkovSource:
    return MarkovSource.random(6, 2, 3, rng=np.random.default_rng(seed))


def test_transition_counts_match_a_plain_loop():
    tokens = np.random.default_rng(0).integers(0, 4, size=(3, 20))
    counts = transition_counts(tokens, vocab_size=4, order=2)
    expected = np.zeros((16, 4), dtype=np.int64)
    for row in tokens:
        for a, b, c in zip(row, row[1:], row[2:], strict=False):
            expected[4 * a + b, c] += 1
    np.testing.assert_array_equal(counts, expected)
    assert counts.sum() == 3 * 18  # no pair spans two streams


def test_context_order_is_the_sources():
    source = _source()
    tokens = source.sample(50, np.random.default_rng(1))
    counts = transition_counts(tokens, source.vocab_size, source.order)
    contexts = source.context_index(np.stack([tokens[:-2], tokens[1:-1]], axis=1))
    assert np.array_equal(np.bincount(contexts, minlength=36), counts.sum(axis=1))


def test_source_samples_never_make_forbidden_transitions():
    source = _source()
    tokens = source.sample(400, np.random.default_rng(2), n_streams=50)
    result = chi_square_fit(transition_counts(tokens, 6, 2), source.transitions.reshape(36, 6))
    assert result.forbidden == 0
    assert result.n_transitions == 50 * 398


def test_p_values_of_the_true_source_are_not_small_and_spread_out():
    """Under the null the p-value is roughly uniform: over 40 samples none tiny, mean near 1/2."""
    source = _source()
    probs = source.transitions.reshape(36, 6)
    p_values = []
    for seed in range(40):
        tokens = source.sample(200, np.random.default_rng(seed), n_streams=40)
        p_values.append(chi_square_fit(transition_counts(tokens, 6, 2), probs).p_value)
    p_values = np.array(p_values)
    assert p_values.min() > 1e-3
    assert 0.3 < p_values.mean() < 0.7


def test_a_different_source_is_rejected_and_its_distance_levels_off():
    truth, other = _source(0), _source(0)
    probs = truth.transitions.reshape(36, 6)
    # the same allowed transitions, other probabilities: no forbidden step, only wrong weights
    mixed = 0.7 * probs + 0.3 * (probs > 0) / (probs > 0).sum(axis=1, keepdims=True)
    other = MarkovSource(mixed.reshape(6, 6, 6))
    small = transition_counts(other.sample(100, np.random.default_rng(3), n_streams=20), 6, 2)
    large = transition_counts(other.sample(100, np.random.default_rng(4), n_streams=2000), 6, 2)
    assert chi_square_fit(large, probs).p_value < 1e-12
    exact = float(
        other.stationary.ravel() @ (0.5 * np.abs(mixed - probs).sum(axis=1))
    )  # the distance the sample estimates
    assert mean_total_variation(large, probs) == pytest.approx(exact, abs=0.01)
    assert mean_total_variation(small, probs) > mean_total_variation(large, probs)


def test_forbidden_transitions_are_counted_not_scored():
    probs = np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5]])
    counts = np.array([[10, 10, 3], [0, 5, 5], [4, 0, 6]])
    result = chi_square_fit(counts, probs)
    assert result.forbidden == 3
    assert result.n_transitions == 43
    # by hand: context 0 scores 10/10 against 10/10, context 2 scores 4/6 against 5/5
    assert result.statistic == pytest.approx(2 * 1 / 5)
    assert result.dof == 3


@pytest.mark.parametrize(
    ("dof", "quantile", "tail"),
    [(100, 124.342, 0.05), (100, 135.807, 0.01), (768, 833.58, 0.05), (30, 43.773, 0.05)],
)
def test_survival_matches_chi_square_tables(dof, quantile, tail):
    """Upper quantiles: NIST/SEMATECH tables (dof 30, 100); dof 768 from the exact formula below."""
    assert chi_square_survival(quantile, dof) == pytest.approx(tail, rel=0.03)


def test_survival_against_the_exact_even_dof_formula():
    """For even dof, P(X >= x) = exp(-x/2) sum_{i < dof/2} (x/2)^i / i!, exactly."""
    for dof, x in itertools.product([20, 60, 200], [0.8, 1.0, 1.3]):
        half, y = dof // 2, x * dof / 2
        exact = math.exp(-y) * sum(
            math.exp(i * math.log(y) - math.lgamma(i + 1)) for i in range(half)
        )
        assert chi_square_survival(x * dof, dof) == pytest.approx(exact, abs=2e-3)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: transition_counts([[0, 1, 2]], 2, 1), r"token ids must be in \[0, 2\)"),
        (lambda: transition_counts([0.5, 1.0], 2, 1), "tokens must be integer ids"),
        (lambda: transition_counts([0, 1], 2, 2), "more than order=2 tokens"),
        (lambda: transition_counts([0, 1, 1], 0, 1), "vocab_size"),
        (lambda: chi_square_fit(np.ones((2, 2), int), np.ones((2, 3)) / 3), "shape of counts"),
        (lambda: chi_square_fit(np.ones((2, 2), int), np.ones((2, 2))), "sum to 1"),
        (lambda: chi_square_fit(-np.ones((2, 2), int), np.ones((2, 2)) / 2), "non-negative"),
        (lambda: mean_total_variation(np.zeros((2, 2), int), np.ones((2, 2)) / 2), "all zero"),
        (lambda: chi_square_survival(float("nan"), 3), "statistic must be"),
        (lambda: chi_square_survival(1.0, 0), "dof"),
    ],
)
def test_bad_inputs_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
