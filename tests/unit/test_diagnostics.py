"""The diagnostics of common mistakes: the causal-leak probe, equivariance, fingerprints, memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyformer.attention import scaled_dot_product_attention
from tinyformer.diagnostics import (
    CausalLeak,
    causal_leak,
    parameter_fingerprint,
    peak_traced_bytes,
    permutation_equivariance_error,
    remove_causal_mask,
    score_matrix_bytes,
)
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.multihead import MultiHeadAttention
from tinyformer.positional import SinusoidalPositionalEncoding

VOCAB = 11


def small_model(seed: int = 0, **overrides) -> DecoderOnlyLM:
    settings_ = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2, "context_length": 12}
    settings_.update(overrides)
    config = DecoderOnlyConfig(vocab_size=VOCAB, **settings_)
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed)).eval()


def some_ids(seed: int = 1, shape: tuple[int, int] = (3, 9)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape)


# ------------------------------------------------------------------ causal leak
@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_a_causal_model_shows_no_leak_exactly(positional, norm_first):
    report = causal_leak(small_model(positional=positional, norm_first=norm_first), some_ids())
    assert report.is_causal
    assert report.max_leak == 0.0
    assert report.leaking_positions.size == 0
    # the token at j does move positions j and later: the probe is not blind
    lower = np.tril(report.influence)
    assert (np.diag(report.influence) > 0).all()
    assert (lower[np.tril_indices(9)] > 0).all()


def test_without_the_mask_every_earlier_position_leaks():
    model = remove_causal_mask(small_model())
    report = causal_leak(model, some_ids())
    assert not report.is_causal
    assert report.max_leak > 1e-3
    np.testing.assert_array_equal(report.leaking_positions, np.arange(8))


def test_a_single_probe_reports_only_its_column():
    model = remove_causal_mask(small_model())
    report = causal_leak(model, some_ids(), positions=[5])
    np.testing.assert_array_equal(report.probed, [5])
    assert np.isnan(report.influence[:, :5]).all()
    assert np.isnan(report.influence[:, 6:]).all()
    assert (report.influence[:, 5] > 0).all()
    np.testing.assert_array_equal(report.leaking_positions, np.arange(5))


def test_a_function_with_a_hand_made_leak_is_caught_at_the_right_place():
    def leaks_one_step(ids):
        logits = np.eye(VOCAB)[ids]  # (B, T, V): position i reads token i
        logits[:, 2] += np.eye(VOCAB)[ids[:, 6]]  # position 2 also reads token 6
        return logits

    report = causal_leak(leaks_one_step, some_ids(), vocab_size=VOCAB)
    np.testing.assert_array_equal(report.leaking_positions, [2])
    future = report.future_influence
    assert future[2, 6] == 1.0
    assert np.count_nonzero(future) == 1


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), length=st.integers(2, 12))
def test_causal_models_never_leak_property(seed, length):
    report = causal_leak(small_model(seed % 5), some_ids(seed, (2, length)))
    assert report.is_causal


def test_leak_report_properties_on_a_known_matrix():
    influence = np.array([[1.0, 0.5, np.nan], [0.2, 1.0, np.nan], [0.1, 0.0, np.nan]])
    report = CausalLeak(influence=influence, probed=np.array([0, 1]))
    assert report.max_leak == 0.5
    np.testing.assert_array_equal(report.leaking_positions, [0])
    assert not report.is_causal


# --------------------------------------------------------------- bad inputs
def test_dropout_in_training_mode_is_refused():
    model = small_model(dropout=0.3).train()
    with pytest.raises(ValueError, match="deterministic"):
        causal_leak(model, some_ids())


def test_bad_arguments_are_named():
    model = small_model()
    with pytest.raises(TypeError, match="vocab_size must be given"):
        causal_leak(lambda ids: np.zeros((*ids.shape, 3)), some_ids())
    with pytest.raises(TypeError, match="ids must be an integer array"):
        causal_leak(model, some_ids().astype(float))
    with pytest.raises(ValueError, match=r"ids must be a non-empty array of shape \(B, T\)"):
        causal_leak(model, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="ids must be below the vocabulary size 11"):
        causal_leak(model, some_ids() + VOCAB)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 9\)"):
        causal_leak(model, some_ids(), positions=[9])
    with pytest.raises(TypeError, match="positions must be a non-empty list of integers"):
        causal_leak(model, some_ids(), positions=[1.5])
    with pytest.raises(ValueError, match=r"model must return float logits of shape"):
        causal_leak(lambda ids: np.zeros(3), some_ids(), vocab_size=VOCAB)
    with pytest.raises(TypeError, match="model must be a callable"):
        causal_leak(3, some_ids(), vocab_size=VOCAB)
    with pytest.raises(TypeError, match="model must be a decoder-only model"):
        remove_causal_mask(MultiHeadAttention(4, 2, rng=np.random.default_rng(0)))


# -------------------------------------------------------------- equivariance
def test_self_attention_without_positions_is_equivariant_with_them_not(rng):
    layer = MultiHeadAttention(8, 2, rng=rng)
    x = rng.standard_normal((2, 7, 8))
    perm = rng.permutation(7)
    assert permutation_equivariance_error(layer, x, perm) < 1e-12
    positions = SinusoidalPositionalEncoding(8, context_length=16)
    with_positions = lambda z: layer.forward(positions.forward(z))
    assert permutation_equivariance_error(with_positions, x, perm) > 1e-2


def test_a_causal_mask_breaks_equivariance(rng):
    x = rng.standard_normal((1, 6, 4))

    def causal(z):
        return scaled_dot_product_attention(z, z, z, np.tril(np.ones((6, 6), bool)))[0]

    assert permutation_equivariance_error(causal, x, np.arange(6)[::-1].copy()) > 1e-2


def test_equivariance_bad_inputs(rng):
    layer = MultiHeadAttention(4, 2, rng=rng)
    x = rng.standard_normal((1, 3, 4))
    with pytest.raises(ValueError, match=r"permutation must reorder range\(3\)"):
        permutation_equivariance_error(layer, x, np.array([0, 0, 1]))
    with pytest.raises(ValueError, match=r"x must be a float array of shape \(B, T, d\)"):
        permutation_equivariance_error(layer, x[0], np.arange(3))


# ---------------------------------------------------------------- fingerprint
def test_fingerprint_sees_any_change_and_nothing_else():
    model = small_model()
    before = parameter_fingerprint(model)
    model.forward(some_ids())
    assert parameter_fingerprint(model) == before
    assert parameter_fingerprint(small_model()) == before  # same seed, same weights
    model.decoder.layers[1].parameters()[0].value.flat[3] += 1e-12
    assert parameter_fingerprint(model) != before
    with pytest.raises(TypeError, match="module must be a tinyformer Module"):
        parameter_fingerprint({"w": np.zeros(3)})


# --------------------------------------------------------------------- memory
def test_score_bytes_formula():
    assert score_matrix_bytes(8, 16, 4096, "float32") == 2**33
    assert score_matrix_bytes(1, 1, 10, np.float64) == 800
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        score_matrix_bytes(1, 1, 0)
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        score_matrix_bytes(1, 1, 4, np.int8)


def test_peak_memory_sees_an_allocation_and_its_growth():
    # tracemalloc counts every thread's allocations: beside pytest-xdist's messaging thread
    # a 512 KiB array once measured 7 KiB more. Arrays of 2 and 8 MiB, with 64 KiB of slack.
    slack = 64 * 1024
    _, small = peak_traced_bytes(np.ones, (512, 512))
    result, large = peak_traced_bytes(np.ones, (1024, 1024))
    assert result.shape == (1024, 1024)
    assert 512 * 512 * 8 <= small < 512 * 512 * 8 + slack
    assert 4 * 512 * 512 * 8 <= large < 4 * 512 * 512 * 8 + slack
    with pytest.raises(TypeError, match="function must be callable"):
        peak_traced_bytes(3)


def test_attention_memory_grows_like_the_square_of_the_length(rng):
    def peak(t):
        q = rng.standard_normal((1, 2, t, 8)).astype(np.float32)
        return peak_traced_bytes(scaled_dot_product_attention, q, q, q)[1]

    ratio = peak(256) / peak(128)
    assert 3.5 < ratio < 4.5
    assert peak(256) >= score_matrix_bytes(1, 2, 256)
