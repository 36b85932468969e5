"""int8 weight quantization: the rounding bound, storage, the quantized layer and model."""

from __future__ import annotations

import copy

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
    INT4_MAX,
    INT8_MAX,
    QuantizedLinear,
    QuantizedTensor,
    quantize_int4,
    quantize_int8,
    quantize_model,
    quantize_model_int4,
    quantize_vectors_int8,
    round_kv_cache_int8,
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


# ------------------------------------------------------------ int4, group-wise
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("axis", "group_size"), [(1, 4), (1, None), (0, 2), (0, None)])
def test_int4_round_trip_is_within_half_a_group_step(rng, dtype, axis, group_size):
    w = rng.standard_normal((8, 6)).astype(dtype)
    t = quantize_int4(w, group_size=group_size, axis=axis)
    assert t.value.shape == w.shape
    assert t.value.dtype == dtype
    q = t.q
    assert q.min() >= -INT4_MAX
    assert q.max() <= INT4_MAX
    # each weight within half a step of its own group's grid, group by group
    wt = (w if axis == 1 else w.T).astype(np.float64)  # (d_in, d_out)
    g = t.group_size
    err = np.abs(wt - (t.value if axis == 1 else t.value.T)).reshape(-1, g, wt.shape[1])
    slack = 4 * np.finfo(dtype).eps * np.abs(wt).reshape(err.shape)
    assert (err <= t.scale / 2 + slack).all()
    # the largest weight of every group is represented exactly by +-7 steps
    assert (np.abs(q).reshape(-1, g, wt.shape[1]).max(axis=1) == INT4_MAX).all()


def test_int4_packs_two_integers_per_byte_and_unpacks_them(rng):
    w = rng.standard_normal((16, 10)).astype(np.float32)
    t = quantize_int4(w, group_size=8)
    assert t.packed.dtype == np.uint8
    assert t.packed.nbytes == w.size // 2
    assert t.nbytes == w.size // 2 + 2 * 10 * 4  # two groups per column, float32 scales
    # unpacking gives back exactly the integers rint(w / s) that were packed
    scale = np.repeat(t.scale[:, 0, :], 8, axis=0)  # (16, 10)
    np.testing.assert_array_equal(t.q, np.clip(np.rint(w / scale), -7, 7))


def test_int4_smaller_groups_give_smaller_error(rng):
    w = rng.standard_normal((64, 32)) * np.exp(rng.standard_normal((64, 1)))  # uneven rows
    errors = [
        np.sqrt(((w - quantize_int4(w, group_size=g).value) ** 2).mean()) for g in (8, 32, None)
    ]
    assert errors[0] < errors[1] < errors[2]
    assert (
        np.abs(w - quantize_int8(w).value).max()
        < np.abs(w - quantize_int4(w, group_size=8).value).max()
    )


def test_int4_zero_group_reads_back_as_zeros():
    w = np.zeros((4, 2))
    w[:2, 0] = [1.0, -0.5]
    t = quantize_int4(w, group_size=2)
    assert np.array_equal(t.value[2:], np.zeros((2, 2)))  # two groups of zeros
    assert np.array_equal(t.value[:, 1], np.zeros(4))
    np.testing.assert_allclose(t.value[:2, 0], [1.0, -4 / 7])  # -3.5 steps round to -4


def test_int4_rejects_bad_groups(rng):
    with pytest.raises(ValueError, match="group_size"):
        quantize_int4(rng.standard_normal((6, 4)), group_size=4)
    with pytest.raises(ValueError, match="even number of entries"):
        quantize_int4(rng.standard_normal((3, 3)), group_size=3)


def test_int4_packs_pairs_across_rows_when_a_group_row_is_odd(rng):
    w = rng.standard_normal((6, 3)).astype(np.float32)  # groups of 3: 3 integers per group row
    t = quantize_int4(w, group_size=3)
    assert t.packed.nbytes == 9
    assert t.value.dtype == np.float32
    step = np.repeat(t.scale, 3, axis=0).reshape(6, 3)  # (6, 3): each entry's group scale
    assert (np.abs(w - t.value) <= step / 2 + 1e-6).all()
    assert np.array_equal(t.q, np.clip(np.rint(w / step), -7, 7))
    with pytest.raises(TypeError, match="weight"):
        quantize_int4([[1.0, 2.0]])


def test_quantize_model_int4_matches_float_closely_and_counts_its_bytes():
    config = DecoderOnlyConfig(
        vocab_size=16,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_layers=1,
        context_length=8,
        dtype="float32",
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0)).eval()
    ids = np.random.default_rng(1).integers(0, 16, (2, 8))
    reference = model.forward(ids)
    q4 = quantize_model_int4(model, group_size=8)
    out = q4.forward(ids)
    assert out.dtype == np.float32
    # reference: the float model with every matrix replaced by its dequantized int4 form
    rounded = copy.deepcopy(model)
    for name, p in rounded.named_parameters():
        if p.value.ndim == 2:
            axis = 0 if name.split(".")[-2] in ("embedding", "positions") else 1
            p.value = quantize_int4(p.value, group_size=8, axis=axis).value
    np.testing.assert_allclose(out, rounded.forward(ids), rtol=1e-5, atol=1e-6)
    assert not np.allclose(out, reference, atol=1e-3)  # four bits do change the outputs
    assert np.array_equal(model.forward(ids), reference)  # the original is untouched
    matrices = [p.value for p in model.parameters() if p.value.ndim == 2]
    vectors = sum(p.value.nbytes for p in model.parameters() if p.value.ndim != 2)
    expected = vectors + sum(w.size // 2 + (w.size // 8) * 4 for w in matrices)
    assert weight_nbytes(q4) == expected
    assert weight_nbytes(q4) < weight_nbytes(quantize_model(model)) < weight_nbytes(model)


# ------------------------------------------------------------ int8 key/value cache
def test_quantize_vectors_int8_has_one_scale_per_vector(rng):
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    q, scale = quantize_vectors_int8(x)
    assert q.dtype == np.int8
    assert scale.shape == (2, 3, 5, 1)
    assert scale.dtype == np.float32
    assert (np.abs(q).max(axis=-1) == INT8_MAX).all()  # each vector uses the whole range
    assert (np.abs(x - q * scale) <= scale / 2 * (1 + 1e-6)).all()
    with pytest.raises(TypeError, match="x"):
        quantize_vectors_int8([1.0])
    with pytest.raises(ValueError, match="finite"):
        quantize_vectors_int8(np.array([np.nan]))


def test_round_kv_cache_int8_rounds_only_new_positions_and_counts_bytes():
    config = DecoderOnlyConfig(
        vocab_size=16,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_layers=2,
        context_length=8,
        dtype="float32",
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0)).eval()
    ids = np.random.default_rng(1).integers(0, 16, (3, 8))
    state = model.start(3)
    model.step(ids[:, :5], state)
    before = [c.self_attention.keys.copy() for c in state.caches]
    held = round_kv_cache_int8(state, 2)
    for c, k in zip(state.caches, before, strict=True):
        np.testing.assert_array_equal(c.self_attention.keys[..., :2, :], k[..., :2, :])
        q, scale = quantize_vectors_int8(k[..., 2:, :])
        np.testing.assert_array_equal(c.self_attention.keys[..., 2:, :], q * scale)
    numbers = 2 * 2 * 3 * 5 * 32  # keys and values, layers, batch, positions, d_model
    assert held == numbers + (numbers // 8) * 4  # one float32 scale per head's 8 numbers
    # a step after rounding attends to the rounded keys: close to, not equal to, float
    rounded = model.step(ids[:, 5:6], state)
    exact = model.forward(ids[:, :6])[:, 5:6]
    assert 0 < np.abs(rounded - exact).max() < 0.05 * np.abs(exact).max()
    with pytest.raises(TypeError, match="state"):
        round_kv_cache_int8(object(), 0)
    with pytest.raises(ValueError, match="start"):
        round_kv_cache_int8(state, -1)
