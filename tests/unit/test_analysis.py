"""Attention entropy and the softmax-saturation probe: values, claims, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.analysis import SATURATED, attention_entropy, softmax_saturation
from tinyformer.attention import scaled_dot_product_attention
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
        ((4,), {"scale": -1.0}, ValueError, "scale must be a finite positive"),
        ((4,), {"scale": "big"}, TypeError, "scale must be a positive number"),
        ((4,), {"seq_len": 0}, ValueError, "seq_len must be a positive integer"),
        ((4,), {"n_samples": 1.0}, TypeError, "n_samples must be a positive integer"),
        ((4,), {"d_v": -2}, ValueError, "d_v must be a positive integer"),
    ],
)
def test_saturation_bad_input(args, kwargs, error, words):
    kwargs = {"rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(error, match=words):
        softmax_saturation(*args, **kwargs)
