"""BERT's corruption: the shares of each action, the emission model, the exact optimum, bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tinyformer.data import MarkovSource
from tinyformer.data.masking import (
    KEPT,
    MASKED,
    NOT_CHOSEN,
    RANDOM,
    MaskedTokens,
    MaskingScheme,
    MLMDataset,
    optimal_predictions,
)


@pytest.fixture(scope="module")
def scheme() -> MaskingScheme:
    return MaskingScheme(vocab_size=16, mask_id=16)


def test_shares_of_each_action_match_the_scheme(scheme):
    tokens = np.random.default_rng(0).integers(0, 16, (400, 500))  # 200,000 positions
    batch = scheme.corrupt(tokens, np.random.default_rng(1))
    n = tokens.size
    chosen = batch.chosen.sum()
    shares = {
        "chosen": (chosen / n, 0.15, n),
        "masked": ((batch.action == MASKED).sum() / chosen, 0.8, chosen),
        "random": ((batch.action == RANDOM).sum() / chosen, 0.1, chosen),
        "kept": ((batch.action == KEPT).sum() / chosen, 0.1, chosen),
    }
    for name, (share, p, count) in shares.items():
        assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / count), name


def test_corruption_does_what_the_action_says(scheme):
    tokens = np.random.default_rng(2).integers(0, 16, (50, 40))
    batch = scheme.corrupt(tokens, np.random.default_rng(3))
    untouched = (batch.action == NOT_CHOSEN) | (batch.action == KEPT)
    assert np.array_equal(batch.inputs[untouched], tokens[untouched])
    assert (batch.inputs[batch.action == MASKED] == 16).all()
    randomized = batch.inputs[batch.action == RANDOM]
    assert randomized.min() >= 0
    assert randomized.max() < 16
    assert np.array_equal(batch.labels[batch.chosen], tokens[batch.chosen])
    assert (batch.labels[~batch.chosen] == -1).all()
    assert np.array_equal(batch.tokens, tokens)


def test_corruption_is_reproducible(scheme):
    tokens = np.random.default_rng(4).integers(0, 16, (5, 30))
    a = scheme.corrupt(tokens, np.random.default_rng(9))
    b = scheme.corrupt(tokens, np.random.default_rng(9))
    assert np.array_equal(a.inputs, b.inputs)
    assert np.array_equal(a.action, b.action)


@pytest.mark.parametrize("chosen", [False, True])
def test_likelihoods_are_the_corruption_probabilities(chosen):
    """Monte Carlo frequencies of what is seen, for each clean token, against the formula."""
    small = MaskingScheme(vocab_size=3, mask_id=3, select_prob=0.3)
    rng = np.random.default_rng(5)
    n = 60_000
    for token in range(3):
        tokens = np.full((n, 1), token)
        batch = small.corrupt(tokens, rng)
        keep = batch.chosen[:, 0] if chosen else np.ones(n, bool)
        seen = np.bincount(batch.inputs[keep, 0], minlength=4) / keep.sum()
        formula = small.likelihoods(np.arange(4)[None], chosen=chosen)[0, :, token]  # (4,)
        assert np.abs(seen - formula).max() < 5 * math.sqrt(0.25 / keep.sum())
        np.testing.assert_allclose(formula.sum(), 1.0)


def test_dataset_corrupts_afresh_each_batch(scheme):
    tokens = np.random.default_rng(6).integers(0, 16, (10, 20))
    data = MLMDataset(tokens, scheme, rng=np.random.default_rng(7))
    first, second = data.batch(np.arange(10)), data.batch(np.arange(10))
    assert isinstance(first, MaskedTokens)
    by_hand = scheme.corrupt(tokens, np.random.default_rng(7))  # the dataset's generator
    np.testing.assert_array_equal(first.inputs, by_hand.inputs)
    np.testing.assert_array_equal(first.action, by_hand.action)
    assert len(data) == 10
    assert data.seq_len == 20
    assert np.array_equal(first.tokens, second.tokens)
    assert not np.array_equal(first.action, second.action)


def test_optimal_predictions_match_brute_force_over_windows_and_corruptions():
    """p(x_t | corrupted window, t chosen) by summing over every clean window and choice set."""
    rng = np.random.default_rng(8)
    source = MarkovSource.random(3, 1, 2, rng=rng)
    scheme = MaskingScheme(3, mask_id=3, select_prob=0.3)
    seen = np.array([[0, 3, 2, 1], [1, 1, 3, 3]])  # two corrupted windows of 4 tokens
    table = source.transitions
    for left_only in (False, True):
        got = optimal_predictions(source, scheme, seen, left_only=left_only)
        for b, t in itertools.product(range(2), range(4)):
            want = np.zeros(3)
            for window in itertools.product(range(3), repeat=4):
                p = source.stationary[window[0]]
                for s in range(1, 4):
                    p *= table[window[s - 1], window[s]]
                others = range(t) if left_only else [s for s in range(4) if s != t]
                for s in others:  # each position chosen or not, independently
                    p *= scheme.likelihoods(seen[b : b + 1, s : s + 1], chosen=False)[
                        0, 0, window[s]
                    ]
                p *= scheme.likelihoods(seen[b : b + 1, t : t + 1], chosen=True)[0, 0, window[t]]
                want[window[t]] += p
            np.testing.assert_allclose(got[b, t], want / want.sum(), rtol=1e-12)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: MaskingScheme(1, 1), ValueError, "vocab_size must be at least 2"),
        (lambda: MaskingScheme(5, 3), ValueError, "mask_id must not be an ordinary"),
        (lambda: MaskingScheme(5, 5, select_prob=0.0), ValueError, "select_prob"),
        (lambda: MaskingScheme(5, 5, select_prob=1.5), ValueError, "select_prob"),
        (lambda: MaskingScheme(5, 5, mask_prob=0.8, random_prob=0.3), ValueError, "at most 1"),
        (lambda: MaskingScheme(5.0, 5), TypeError, "vocab_size"),
    ],
)
def test_bad_schemes_are_refused_by_name(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("tokens", "error", "words"),
    [
        (np.array([[0.0, 1.0]]), TypeError, "integer array"),
        (np.array([1, 2]), ValueError, "(B, T)"),
        (np.array([[0, 16]]), ValueError, "ordinary ids in [0, 16)"),
    ],
)
def test_bad_tokens_are_refused_by_name(scheme, tokens, error, words):
    with pytest.raises(error) as info:
        scheme.corrupt(tokens, np.random.default_rng(0))
    assert words in str(info.value)


def test_bad_inputs_of_the_optimum_are_refused(scheme):
    other = MarkovSource.random(4, 1, 2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="over the scheme's 16 tokens"):
        optimal_predictions(other, scheme, np.zeros((1, 3), int))
    with pytest.raises(TypeError, match="MaskingScheme"):
        optimal_predictions(other, "bert", np.zeros((1, 3), int))
    with pytest.raises(ValueError, match=r"inputs must be ids in \[0, 15\] or mask_id=16"):
        scheme.likelihoods(np.array([[17]]), chosen=True)
