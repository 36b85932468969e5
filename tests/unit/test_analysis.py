"""Attention entropy, the softmax-saturation probe and errors against a known source."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.analysis import (
    SATURATED,
    attention_entropy,
    continue_from_source,
    next_token_errors,
    plant_forbidden,
    softmax_saturation,
)
from tinyformer.attention import scaled_dot_product_attention
from tinyformer.data import MarkovSource
from tinyformer.functional import softmax


def test_entropy_of_uniform_and_one_hot_rows():
    weights = np.array([[0.25, 0.25, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0]])
    np.testing.assert_allclose(attention_entropy(weights), [math.log(4), 0.0], atol=1e-15)


def test_entropy_matches_the_formula_written_out(rng):
    weights = softmax(rng.standard_normal((3, 5, 7)))
    expected = -np.sum(weights * np.log(weights), axis=-1)
    np.testing.assert_allclose(attention_entropy(weights), expected, rtol=1e-12)


def test_entropy_along_another_axis(rng):
    weights = softmax(rng.standard_normal((4, 6)), axis=0)
    np.testing.assert_allclose(
        attention_entropy(weights, axis=0), attention_entropy(weights.T), rtol=1e-12
    )


def test_fully_masked_row_has_zero_entropy(rng):
    q, k, v = rng.standard_normal((3, 4, 2))
    mask = np.ones((4, 4), bool)
    mask[1] = False
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    entropy = attention_entropy(weights)
    assert entropy[1] == 0.0
    assert np.all(entropy[[0, 2, 3]] > 0)


@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_entropy_lies_between_zero_and_log_t(seed, n_keys):
    rng = np.random.default_rng(seed)
    weights = softmax(3 * rng.standard_normal((5, n_keys)))
    entropy = attention_entropy(weights)
    assert np.all(entropy >= -1e-12)
    assert np.all(entropy <= math.log(n_keys) + 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_entropy_keeps_the_dtype(rng, dtype):
    weights = softmax(rng.standard_normal((2, 3)).astype(dtype))
    assert attention_entropy(weights).dtype == dtype


@pytest.mark.parametrize(
    ("weights", "error", "words"),
    [
        (np.array([[0.5, -0.5, 1.0]]), ValueError, "non-negative"),
        (np.array([[np.nan, 1.0]]), ValueError, "finite"),
        (np.array(["a"]), TypeError, "weights must be a real"),
        (np.float64(1.0), ValueError, "at least 1 dimensions"),
    ],
)
def test_entropy_bad_input(weights, error, words):
    with pytest.raises(error, match=words):
        attention_entropy(weights)


def test_saturation_takes_scale_as_attention_does():
    # None means 1/sqrt(d_k), exactly as in scaled_dot_product_attention
    default = softmax_saturation(16, rng=np.random.default_rng(3), n_samples=4)
    explicit = softmax_saturation(16, rng=np.random.default_rng(3), n_samples=4, scale=0.25)
    assert default == explicit


def test_saturation_is_reproducible():
    a = softmax_saturation(16, rng=np.random.default_rng(3), n_samples=4)
    b = softmax_saturation(16, rng=np.random.default_rng(3), n_samples=4)
    assert a == b


@pytest.mark.parametrize("d_k", [4, 64, 512])
def test_scores_have_unit_std_when_scaled_and_sqrt_dk_when_not(d_k):
    scaled = softmax_saturation(d_k, rng=np.random.default_rng(0), n_samples=32)
    raw = softmax_saturation(d_k, rng=np.random.default_rng(0), n_samples=32, scale=1.0)
    assert scaled.scale == pytest.approx(1 / math.sqrt(d_k))
    assert scaled.score_std == pytest.approx(1.0, rel=0.05)
    assert raw.score_std == pytest.approx(math.sqrt(d_k), rel=0.05)


def test_without_scaling_the_softmax_saturates_and_its_gradient_vanishes():
    scaled = softmax_saturation(512, rng=np.random.default_rng(1))
    raw = softmax_saturation(512, rng=np.random.default_rng(1), scale=1.0)
    assert scaled.saturated_fraction == 0.0
    assert raw.saturated_fraction > 0.5
    assert raw.max_weight > 0.9
    assert scaled.max_weight < 0.3
    assert raw.entropy < 0.25 * scaled.entropy
    assert raw.score_grad_norm < 0.01 * scaled.score_grad_norm


def test_scaled_attention_statistics_do_not_depend_on_dk():
    small = softmax_saturation(8, rng=np.random.default_rng(2))
    large = softmax_saturation(1024, rng=np.random.default_rng(2))
    assert large.max_weight == pytest.approx(small.max_weight, rel=0.1)
    assert large.entropy == pytest.approx(small.entropy, rel=0.05)
    assert large.score_grad_norm == pytest.approx(small.score_grad_norm, rel=0.1)


def test_saturated_fraction_counts_rows_above_the_threshold():
    # Scores scaled up enormously make nearly every row one-hot.
    report = softmax_saturation(64, rng=np.random.default_rng(5), scale=100.0, n_samples=8)
    assert SATURATED == 0.99
    assert report.saturated_fraction > 0.95
    assert report.max_weight > SATURATED


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "words"),
    [
        ((0,), {}, ValueError, "d_k must be a positive integer"),
        ((2.5,), {}, TypeError, "d_k must be a positive integer"),
        ((4,), {"rng": 0}, TypeError, "rng must be a numpy.random.Generator"),
        ((4,), {"scale": float("inf")}, ValueError, "scale must be finite"),
        ((4,), {"scale": "big"}, TypeError, "scale must be a number or None"),
        ((4,), {"seq_len": 0}, ValueError, "seq_len must be a positive integer"),
        ((4,), {"n_samples": 1.0}, TypeError, "n_samples must be a positive integer"),
        ((4,), {"d_v": -2}, ValueError, "d_v must be a positive integer"),
    ],
)
def test_saturation_bad_input(args, kwargs, error, words):
    kwargs = {"rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(error, match=words):
        softmax_saturation(*args, **kwargs)


# --- errors against a known source: plant_forbidden, continue_from_source, next_token_errors


def _markov(seed: int = 0):
    return MarkovSource.random(6, 2, 3, rng=np.random.default_rng(seed))


class _SourceModel:
    """A reference model whose logits are the source's own log-probabilities (or all zero)."""

    def __init__(self, source, *, uniform: bool = False) -> None:
        self.source, self.uniform = source, uniform

    def forward(self, ids: np.ndarray) -> np.ndarray:
        v, k = self.source.vocab_size, self.source.order
        logits = np.zeros((*ids.shape, v))
        if not self.uniform:
            for t in range(k - 1, ids.shape[1]):
                p = self.source.next_token_probs(ids[:, t - k + 1 : t + 1])
                logits[:, t] = np.log(np.maximum(p, 1e-300))
        return logits


def test_planted_tokens_are_impossible_and_nothing_else_changes(rng):
    source = _markov()
    streams = source.sample(12, rng, n_streams=50)
    planted = plant_forbidden(source, streams, [4, 9], rng=np.random.default_rng(1))
    table = source.transitions.reshape(source.n_contexts, source.vocab_size)
    for t in (4, 9):
        context = source.context_index(planted[:, t - 2 : t])
        assert (table[context, planted[:, t]] == 0).all()
    keep = np.ones(12, bool)
    keep[[4, 9]] = False
    assert np.array_equal(planted[:, keep], streams[:, keep])
    assert not np.shares_memory(planted, streams)
    again = plant_forbidden(source, streams, [9, 4], rng=np.random.default_rng(1))
    assert np.array_equal(again, planted)  # order of positions does not matter; seeded


def test_plant_forbidden_draws_every_forbidden_token(rng):
    source = _markov()
    streams = np.tile(source.sample(3, rng), (600, 1))  # one context, 600 times
    planted = plant_forbidden(source, streams, 2, rng=rng)[:, 2]
    table = source.transitions.reshape(source.n_contexts, source.vocab_size)
    forbidden = np.flatnonzero(table[source.context_index(streams[0, :2])] == 0)
    assert set(np.unique(planted)) == set(forbidden.tolist())


def test_plant_forbidden_rejects_bad_input(rng):
    source = _markov()
    streams = source.sample(8, rng, n_streams=4)
    with pytest.raises(ValueError, match="positions must lie in"):
        plant_forbidden(source, streams, 1, rng=rng)  # no full context before it
    with pytest.raises(ValueError, match="positions must lie in"):
        plant_forbidden(source, streams, 8, rng=rng)
    with pytest.raises(TypeError, match="MarkovSource"):
        plant_forbidden("source", streams, 3, rng=rng)
    with pytest.raises(TypeError, match="Generator"):
        plant_forbidden(source, streams, 3, rng=0)
    with pytest.raises(ValueError, match="below the vocabulary size"):
        plant_forbidden(source, streams + source.vocab_size, 3, rng=rng)


def test_source_continuations_are_possible_coupled_and_distributed_as_the_source(rng):
    source = _markov()
    prefix = np.tile(source.sample(2, rng), (4000, 1))  # one context
    out = continue_from_source(source, prefix, 5, rng=np.random.default_rng(3))
    assert out.shape == (4000, 7)
    assert np.array_equal(out[:, :2], prefix)
    table = source.transitions.reshape(source.n_contexts, source.vocab_size)
    for t in range(2, 7):
        assert (table[source.context_index(out[:, t - 2 : t]), out[:, t]] > 0).all()
    again = continue_from_source(source, prefix, 5, rng=np.random.default_rng(3))
    assert np.array_equal(again, out)
    frequencies = np.bincount(out[:, 2], minlength=source.vocab_size) / len(out)
    p = source.next_token_probs(prefix[0])
    # Hoeffding and a union bound over the 2^V sets: TV < 0.05 fails with probability < 1e-6
    assert 0.5 * np.abs(frequencies - p).sum() < 0.05
    assert continue_from_source(source, prefix[:3], 0, rng=rng).shape == (3, 2)


def test_next_token_errors_are_zero_for_the_source_and_known_for_a_uniform_model(rng):
    source = _markov()
    streams = source.sample(10, rng, n_streams=7)
    tv, forbidden = next_token_errors(_SourceModel(source), source, streams, batch_size=3)
    assert tv.shape == forbidden.shape == (7, 8)
    assert np.abs(tv).max() < 1e-12
    assert np.abs(forbidden).max() < 1e-12
    tv_u, forbidden_u = next_token_errors(_SourceModel(source, uniform=True), source, streams)
    v = source.vocab_size
    contexts = np.stack([streams[:, :-2], streams[:, 1:-1]], axis=-1)  # (7, 8, 2)
    p = source.next_token_probs(contexts)  # (7, 8, V)
    np.testing.assert_allclose(tv_u, 0.5 * np.abs(1 / v - p).sum(-1), atol=1e-12)
    np.testing.assert_allclose(forbidden_u, (p == 0).sum(-1) / v, atol=1e-12)


def test_next_token_errors_rejects_short_streams(rng):
    source = _markov()
    with pytest.raises(ValueError, match="longer than the source's order"):
        next_token_errors(_SourceModel(source), source, source.sample(2, rng, n_streams=3))
    with pytest.raises(ValueError, match=r"shape \(N, T\)"):
        next_token_errors(_SourceModel(source), source, source.sample(5, rng))
