"""int8 weight quantization: the rounding bound, storage, the quantized layer and model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tinyformer.generation import greedy
from tinyformer.gradcheck import check_module_gradients
from tinyformer.layers import Linear
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.quantization import (
    INT8_MAX,
    QuantizedLinear,
    QuantizedTensor,
    quantize_int8,
    quantize_model,
    weight_nbytes,
)


def _bound_holds(w: np.ndarray, t: QuantizedTensor) -> bool:
    """|w - deq(q(w))| <= scale / 2, allowing the rounding of the float product."""
    error = np.abs(w.astype(np.float64) - t.value.astype(np.float64))
    slack = 4 * np.finfo(w.dtype).eps * np.abs(w)
    return bool((error <= t.scale / 2 + slack).all())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, None])
def test_round_trip_error_is_at_most_half_a_step(rng, dtype, axis):
    w = rng.standard_normal((7, 5)).astype(dtype)
    t = quantize_int8(w, axis=axis)
    assert t.q.dtype == np.int8
    assert t.q.shape == w.shape
    assert t.scale.dtype == dtype
    assert t.value.dtype == dtype
    expected_scale_shape = {0: (7, 1), 1: (1, 5), None: (1, 1)}[axis]
    assert t.scale.shape == expected_scale_shape
    assert _bound_holds(w, t)
    assert np.abs(t.q).max() == INT8_MAX  # the largest entry of a channel maps to +-127


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 6), st.integers(1, 6)),
        elements=st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False),
    ),
    st.sampled_from([0, 1, None]),
)
def test_round_trip_bound_holds_for_any_matrix(w, axis):
    assert _bound_holds(w, quantize_int8(w, axis=axis))


def test_scale_is_largest_magnitude_over_127_per_column(rng):
    w = rng.standard_normal((6, 3))
    t = quantize_int8(w, axis=1)
    np.testing.assert_allclose(t.scale[0], np.abs(w).max(axis=0) / 127)
    per_tensor = quantize_int8(w, axis=None)
    np.testing.assert_allclose(per_tensor.scale, np.abs(w).max() / 127)


def test_zero_channel_gets_zero_scale_without_division_warnings(rng):
    w = rng.standard_normal((4, 3))
    w[:, 1] = 0.0
    with np.errstate(all="raise"):
        t = quantize_int8(w, axis=1)
    assert t.scale[0, 1] == 0
    assert not t.q[:, 1].any()
    assert np.array_equal(t.value[:, 1], np.zeros(4))
    zeros = quantize_int8(np.zeros((2, 2)), axis=None)
    assert not zeros.value.any()


def test_per_channel_is_no_worse_than_per_tensor_on_uneven_columns(rng):
    w = rng.standard_normal((32, 4)) * np.array([0.01, 0.1, 1.0, 10.0])
    err_channel = np.abs(w - quantize_int8(w, axis=1).value).max(axis=0)
    err_tensor = np.abs(w - quantize_int8(w, axis=None).value).max(axis=0)
    assert (err_channel <= err_tensor + 1e-12).all()
    assert err_channel[0] < err_tensor[0] / 100  # the small column keeps its precision


def test_quantized_linear_matches_linear_with_the_dequantized_weight(rng):
    layer = Linear(5, 3, rng=rng)
    layer.bias.value[...] = rng.standard_normal(3)
    q = QuantizedLinear.from_linear(layer)
    x = rng.standard_normal((2, 4, 5))
    expected = x @ q.weight.value + layer.bias.value
    np.testing.assert_allclose(q.forward(x), expected, rtol=1e-12, atol=1e-12)
    assert q.forward(x).shape == (2, 4, 3)
    assert q.forward(x).dtype == np.float64


@pytest.mark.parametrize("per_channel", [True, False])
def test_quantized_linear_gradients(rng, per_channel):
    layer = Linear(4, 3, rng=rng)
    layer.bias.value[...] = rng.standard_normal(3)
    q = QuantizedLinear.from_linear(layer, per_channel=per_channel)
    errors = check_module_gradients(q, [rng.standard_normal((2, 3, 4))], rng=rng)
    assert set(errors) == {"input 0", "bias"}
    assert max(errors.values()) < 1e-6, errors


def _small_lm(dtype="float32"):
    config = DecoderOnlyConfig(
        vocab_size=12, d_model=16, n_heads=2, d_ff=32, n_layers=2, context_length=16, dtype=dtype
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    model.eval()
    return model


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_quantized_model_logits_are_close_and_keep_the_dtype(rng, dtype):
    model = _small_lm(dtype)
    ids = rng.integers(0, 12, (3, 16))
    before = model.forward(ids)
    quantized = quantize_model(model)
    after = quantized.forward(ids)
    assert after.dtype == before.dtype == np.dtype(dtype)
    assert after.shape == before.shape
    assert np.abs(after - before).max() < 0.05 * np.abs(before).max()
    np.testing.assert_array_equal(model.forward(ids), before)  # the original is untouched


def test_quantized_model_stores_one_byte_per_weight():
    model = _small_lm()
    quantized = quantize_model(model)
    tensors = [
        v for m in quantized.modules() for v in vars(m).values() if isinstance(v, QuantizedTensor)
    ]
    assert tensors
    assert all(t.q.dtype == np.int8 for t in tensors)
    assert quantized.output.weight is quantized.decoder.embedding.weight  # tying survives
    vectors = sum(p.value.nbytes for p in model.parameters() if p.value.ndim == 1)
    matrices = sum(p.value.size for p in model.parameters() if p.value.ndim == 2)
    scales = sum(t.scale.nbytes for t in {id(t): t for t in tensors}.values())
    assert weight_nbytes(quantized) == vectors + matrices + scales  # one byte per weight
    assert weight_nbytes(model) == vectors + 4 * matrices  # four bytes per float32


def test_quantized_model_decodes_with_and_without_cache():
    quantized = quantize_model(_small_lm(), per_channel=False)
    prompt = np.array([[1, 2, 3]])
    cached = greedy(quantized, prompt, max_new_tokens=8, eos_id=None)
    uncached = greedy(quantized, prompt, max_new_tokens=8, eos_id=None, use_cache=False)
    np.testing.assert_array_equal(cached.tokens[0], uncached.tokens[0])


@pytest.mark.parametrize(
    ("weight", "kwargs", "error", "match"),
    [
        (np.ones((2, 2), dtype=np.int64), {}, TypeError, "weight must be a float32 or float64"),
        (np.ones((2, 2), dtype=np.float16), {}, TypeError, "weight must be a float32"),
        ([[1.0, 2.0]], {}, TypeError, "weight must be .* got list"),
        (np.ones(3), {}, ValueError, r"weight must be a 2-D matrix, got shape \(3,\)"),
        (np.array([[1.0, np.nan]]), {}, ValueError, "weight must be finite"),
        (np.ones((2, 2)), {"axis": 2}, ValueError, r"axis must be in \[-2, 1\].*got 2"),
        (np.ones((2, 2)), {"axis": 1.0}, TypeError, "axis must be an integer"),
    ],
)
def test_quantize_int8_rejects_bad_input(weight, kwargs, error, match):
    with pytest.raises(error, match=match):
        quantize_int8(weight, **kwargs)


def test_quantize_model_and_layer_reject_bad_input(rng):
    with pytest.raises(TypeError, match="model must be a tinyformer Module"):
        quantize_model(np.ones(3))
    with pytest.raises(TypeError, match="per_channel must be True or False"):
        quantize_model(_small_lm(), per_channel=1)
    with pytest.raises(TypeError, match="linear must be a tinyformer Linear"):
        QuantizedLinear.from_linear(np.ones((2, 2)))
    with pytest.raises(TypeError, match="weight must be a QuantizedTensor with output channels"):
        QuantizedLinear(quantize_int8(np.ones((2, 2)), axis=0))
    layer = QuantizedLinear.from_linear(Linear(3, 2, rng=rng, dtype=np.float32))
    with pytest.raises(TypeError, match="x must have the layer's dtype float32, got float64"):
        layer.forward(np.ones((1, 3)))
    with pytest.raises(TypeError, match="model must be a tinyformer Module"):
        weight_nbytes("model")
