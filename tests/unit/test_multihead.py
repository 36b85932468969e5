"""Multi-head attention: gradients, masks, the properties of attention, and the KV cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.functional import softmax
from tinyformer.gradcheck import check_module_gradients
from tinyformer.masks import causal_mask, combine_masks, padding_mask
from tinyformer.multihead import (
    KVCache,
    MultiHeadAttention,
    _softmax_in_place,
    multi_head_attention_loop,
)
from tinyformer.positional import RotaryEmbedding

seeds = st.integers(0, 2**32 - 1)


def _layer(rng, d_model=8, n_heads=2, **kwargs):
    layer = MultiHeadAttention(d_model, n_heads, rng=rng, **kwargs)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.5
    return layer


def _random_mask(rng, shape):
    mask = rng.random(shape) < 0.6
    mask[..., 0] = True
    return mask


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_self_attention_gradients_on_random_shapes_with_masks(seed):
    rng = np.random.default_rng(seed)
    n_heads = int(rng.choice([1, 2, 4]))
    d_model = n_heads * int(rng.integers(1, 4))
    batch, seq_len = int(rng.integers(1, 4)), int(rng.integers(2, 5))
    layer = _layer(rng, d_model, n_heads)
    mask = [None, causal_mask(seq_len), _random_mask(rng, (batch, seq_len, seq_len))][seed % 3]
    x = rng.standard_normal((batch, seq_len, d_model))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"mask": mask})
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cross_attention_gradients_with_padding(seed):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 6, 3)
    t_q, t_k = int(rng.integers(1, 4)), int(rng.integers(2, 5))
    ids = rng.integers(1, 9, size=(2, t_k))
    ids[0, -1] = 0  # one padded key
    x, context = rng.standard_normal((2, t_q, 6)), rng.standard_normal((2, t_k, 6))
    errors = check_module_gradients(
        layer, [x, context], rng=rng, kwargs={"mask": padding_mask(ids, 0)}
    )
    assert set(errors) >= {"input 0", "input 1", "w_qkv", "b_qkv", "w_out", "b_out"}
    assert max(errors.values()) < 1e-6, errors


def test_gradients_with_rotary_positions_and_no_bias(rng):
    layer = _layer(rng, 8, 2, rotary=True, bias=False)
    x = rng.standard_normal((2, 5, 8))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"mask": causal_mask(5)})
    assert list(errors) == ["input 0", "w_qkv", "w_out"]
    assert max(errors.values()) < 1e-6, errors


def test_gradients_with_attention_dropout(rng):
    layer = _layer(rng, 8, 4, dropout=0.3)
    state = layer.dropout.rng.bit_generator.state

    def reset():
        layer.dropout.rng.bit_generator.state = state

    x = rng.standard_normal((2, 4, 8))
    errors = check_module_gradients(layer, [x], rng=rng, before_forward=reset)
    assert max(errors.values()) < 1e-6, errors


def test_gradients_with_a_fully_masked_query(rng):
    layer = _layer(rng, 4, 2)
    mask = np.ones((2, 3, 3), bool)
    mask[1, 2] = False
    errors = check_module_gradients(
        layer, [rng.standard_normal((2, 3, 4))], rng=rng, kwargs={"mask": mask}
    )
    assert max(errors.values()) < 1e-6, errors


# ----------------------------------------------------------------- properties
@given(seeds, st.sampled_from([1, 2, 4]), st.integers(1, 5), st.integers(1, 6), st.booleans())
def test_loop_over_heads_equals_vectorized(seed, n_heads, t_q, t_k, cross):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 4 * n_heads, n_heads, bias=bool(seed % 2))
    x = rng.standard_normal((2, t_q, 4 * n_heads))
    context = rng.standard_normal((2, t_k, 4 * n_heads)) if cross else None
    mask = _random_mask(rng, (2, t_q, t_k if cross else t_q))
    fast = layer.forward(x, context, mask=mask)
    np.testing.assert_allclose(
        fast, multi_head_attention_loop(layer, x, context, mask), atol=1e-12
    )


def _reference_multi_head_attention(x, context, allowed, w_q, w_k, w_v, w_o, biases, n_heads):
    """Multi-head attention written out from its definition, independently of the package.

    head_i = softmax(Q_i K_i^T / sqrt(d_k), masked) V_i per head, the heads concatenated along
    the features, times W_O. Plain NumPy: no tinyformer function is called.
    """
    b_q, b_k, b_v, b_o = biases
    q, k, v = x @ w_q + b_q, context @ w_k + b_k, context @ w_v + b_v  # (B, T, d_model)
    d_k = w_q.shape[1] // n_heads
    heads = []
    for i in range(n_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        scores = q[..., cols] @ np.swapaxes(k[..., cols], -1, -2) / np.sqrt(d_k)  # (B, T_q, T_k)
        scores = np.where(allowed, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        heads.append(weights @ v[..., cols])  # (B, T_q, d_k)
    return np.concatenate(heads, axis=-1) @ w_o + b_o  # (B, T_q, d_model)


@pytest.mark.parametrize(
    ("seed", "n_heads", "cross"), [(0, 1, False), (1, 2, True), (2, 4, False), (3, 4, True)]
)
def test_multi_head_attention_matches_an_independent_reference(seed, n_heads, cross):
    rng = np.random.default_rng(seed)
    d_model, batch, t_q = 4 * n_heads, 2, 5
    t_k = 7 if cross else t_q
    layer = _layer(rng, d_model, n_heads)
    x = rng.standard_normal((batch, t_q, d_model))
    context = rng.standard_normal((batch, t_k, d_model)) if cross else None
    mask = _random_mask(rng, (batch, t_q, t_k))  # every query keeps key 0
    w, b, d = layer.w_qkv.value, layer.b_qkv.value, d_model
    expected = _reference_multi_head_attention(
        x,
        x if context is None else context,
        mask,
        w[:, :d],
        w[:, d : 2 * d],
        w[:, 2 * d :],
        layer.w_out.value,
        (b[:d], b[d : 2 * d], b[2 * d :], layer.b_out.value),
        n_heads,
    )
    np.testing.assert_allclose(layer.forward(x, context, mask=mask), expected, atol=1e-12)
    assert layer.attention_weights.shape == (batch, n_heads, t_q, t_k)


def test_loop_over_heads_equals_vectorized_with_rotary(rng):
    layer = _layer(rng, 8, 2, rotary=True)
    x = rng.standard_normal((3, 6, 8))
    np.testing.assert_allclose(
        layer.forward(x, mask=causal_mask(6)),
        multi_head_attention_loop(layer, x, mask=causal_mask(6)),
        atol=1e-12,
    )


@given(seeds)
def test_masked_keys_get_exactly_zero_weight(seed):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 4)
    mask = _random_mask(rng, (3, 5, 5))
    layer.forward(rng.standard_normal((3, 5, 8)), mask=mask)
    weights = layer.attention_weights
    assert weights.shape == (3, 4, 5, 5)
    assert np.all(weights[np.broadcast_to(~mask[:, None], weights.shape)] == 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)


def test_fully_masked_query_gives_zero_weights_not_nan(rng):
    layer = _layer(rng, 8, 2)
    mask = np.ones((2, 4, 4), bool)
    mask[0, 1] = False
    out = layer.forward(rng.standard_normal((2, 4, 8)), mask=mask)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(layer.attention_weights[0, :, 1], 0.0)
    np.testing.assert_allclose(out[0, 1], layer.b_out.value)  # no value reached it: the bias
    grad = layer.backward(np.ones_like(out))
    assert np.isfinite(grad).all()


@given(seeds)
def test_self_attention_without_positions_is_permutation_equivariant(seed):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 2)
    x = rng.standard_normal((2, 6, 8))
    perm = rng.permutation(6)
    np.testing.assert_allclose(layer.forward(x[:, perm]), layer.forward(x)[:, perm], atol=1e-12)


@given(seeds, st.integers(0, 5), st.booleans())
def test_causal_output_at_t_ignores_later_tokens(seed, t, rotary):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 2, rotary=rotary)
    x = rng.standard_normal((2, 6, 8))
    changed = x.copy()
    changed[:, t + 1 :] = rng.standard_normal((2, 5 - t, 8))
    a = layer.forward(x, mask=causal_mask(6))
    b = layer.forward(changed, mask=causal_mask(6))
    np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-12)
    if t < 5:
        assert not np.allclose(a[:, t + 1 :], b[:, t + 1 :])


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 300.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_is_exact_for_small_and_huge_scores(rng, scale, dtype):
    """Every way of shifting the scores (none, global, per row) gives the true softmax.

    Compared with the independent reference in float64, to a tolerance relative to
    the size of the output, the same at every scale.
    """
    layer = _layer(rng, 8, 2)
    layer.w_qkv.value *= scale
    layer = layer if dtype == np.float64 else _as_float32(layer, rng)
    x = rng.standard_normal((2, 5, 8)).astype(dtype)
    mask = combine_masks(causal_mask(5), _random_mask(rng, (2, 1, 5)))
    out = layer.forward(x, mask=mask)
    assert out.dtype == dtype
    assert np.isfinite(out).all()
    expected = _reference_from_layer(layer, x.astype(np.float64), mask)
    # measured: about 1.2e-7 in float32 and 2e-16 in float64 at every scale
    relative = 1e-12 if dtype == np.float64 else 1e-6
    error = np.max(np.abs(out - expected)) / np.max(np.abs(expected))
    assert error <= relative, f"relative error {error:.2e} above {relative:.0e}"
    assert np.all(layer.attention_weights[np.broadcast_to(~mask[:, None], (2, 2, 5, 5))] == 0)


def _reference_from_layer(layer, x, mask):
    """The independent reference with the layer's own weights, in float64."""
    w, b, d = (
        layer.w_qkv.value.astype(np.float64),
        layer.b_qkv.value.astype(np.float64),
        layer.d_model,
    )
    return _reference_multi_head_attention(
        x,
        x,
        mask,
        w[:, :d],
        w[:, d : 2 * d],
        w[:, 2 * d :],
        layer.w_out.value.astype(np.float64),
        (b[:d], b[d : 2 * d], b[2 * d :], layer.b_out.value.astype(np.float64)),
        layer.n_heads,
    )


def _as_float32(layer, rng):
    small = MultiHeadAttention(layer.d_model, layer.n_heads, rng=rng, dtype=np.float32)
    small.load_state_dict(layer.state_dict())
    return small


def test_nan_input_is_an_error_not_nan_output(rng):
    x = rng.standard_normal((1, 3, 8))
    x[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        _layer(rng).forward(x)


@pytest.mark.parametrize("cross", [False, True])
def test_float32_in_float32_out(rng, cross):
    layer = MultiHeadAttention(8, 2, rng=rng, dtype=np.float32)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    context = rng.standard_normal((2, 4, 8)).astype(np.float32) if cross else None
    out = layer.forward(x, context, mask=np.ones((3, 4 if cross else 3), bool))
    assert out.dtype == np.float32
    assert layer.attention_weights.dtype == np.float32
    grads = layer.backward(np.ones_like(out))
    grads = grads if cross else (grads,)
    assert all(g.dtype == np.float32 for g in grads)
    assert all(p.grad.dtype == np.float32 for p in layer.parameters())


def test_float32_agrees_with_float64(rng):
    layer = _layer(rng, 8, 2)
    x = rng.standard_normal((2, 5, 8))
    small = _as_float32(layer, rng)
    np.testing.assert_allclose(
        small.forward(x.astype(np.float32)), layer.forward(x), atol=1e-4, rtol=1e-4
    )


# ------------------------------------------------------------------- KV cache
@given(seeds, st.lists(st.integers(1, 3), min_size=1, max_size=4), st.booleans())
def test_kv_cached_decoding_equals_full_causal_attention(seed, chunks, rotary):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 2, rotary=rotary)
    total = sum(chunks)
    x = rng.standard_normal((2, total, 8))
    full = layer.forward(x, mask=causal_mask(total))
    cache, start, pieces = KVCache(), 0, []
    for n in chunks:
        mask = causal_mask(n, start + n)  # the new queries are the last positions
        pieces.append(layer.forward(x[:, start : start + n], mask=mask, cache=cache))
        start += n
    assert len(cache) == total
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-12)


def test_cross_attention_cache_is_filled_once_and_reused(rng):
    layer = _layer(rng, 8, 2)
    memory = rng.standard_normal((2, 5, 8))
    x = rng.standard_normal((2, 3, 8))
    full = layer.forward(x, memory)
    cache = KVCache()
    steps = [layer.forward(x[:, i : i + 1], memory, cache=cache) for i in range(3)]
    assert len(cache) == 5  # the memory's keys, stored once
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-12)


def test_cache_grows_past_its_first_capacity_and_resets(rng):
    cache = KVCache()
    keys = rng.standard_normal((1, 2, 40, 3))
    values = rng.standard_normal((1, 2, 40, 5))
    for i in range(40):
        k_all, v_all = cache.append(keys[:, :, i : i + 1], values[:, :, i : i + 1])
    np.testing.assert_array_equal(k_all, keys)
    np.testing.assert_array_equal(v_all, values)
    cache.reset()
    assert len(cache) == 0
    assert cache.keys is None


def test_backward_after_a_cached_forward_is_a_clear_error(rng):
    layer = _layer(rng)
    out = layer.forward(rng.standard_normal((1, 2, 8)), cache=KVCache())
    with pytest.raises(RuntimeError, match="cache is for inference"):
        layer.backward(np.ones_like(out))


# ---------------------------------------------------------------------- RoPE
@given(seeds, st.integers(1, 30))
def test_rotary_attention_depends_only_on_relative_positions(seed, offset):
    """Moving the whole sequence ``offset`` positions later leaves its attention unchanged."""
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 2, rotary=True)
    x = rng.standard_normal((1, 4, 8))
    fresh = layer.forward(x, mask=causal_mask(4))
    weights = layer.attention_weights
    cache = KVCache()
    layer.forward(rng.standard_normal((1, offset, 8)), cache=cache)  # positions 0..offset-1
    hidden = np.concatenate([np.zeros((4, offset), bool), causal_mask(4)], axis=1)
    shifted = layer.forward(x, mask=hidden, cache=cache)  # positions offset..offset+3
    np.testing.assert_allclose(shifted, fresh, atol=1e-10)
    np.testing.assert_allclose(layer.attention_weights[..., offset:], weights, atol=1e-12)


@given(seeds, st.integers(0, 50), st.integers(0, 50))
def test_rotary_layer_scores_depend_only_on_the_offset(seed, start_q, start_k):
    rng = np.random.default_rng(seed)
    rope = RotaryEmbedding(8)
    q, k = rng.standard_normal((2, 1, 8))
    shift = int(rng.integers(1, 20))

    def score(m, n):
        return float(rope.forward(q, start=m)[0] @ rope.forward(k, start=n)[0])

    assert score(start_q, start_k) == pytest.approx(
        score(start_q + shift, start_k + shift), abs=1e-9
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("low", "high"),
    [(-5.0, 5.0), (-75.0, 0.0), (900.0, 960.0), (-2000.0, 3000.0)],
    ids=["no-shift", "low-scores", "global-shift", "row-maxima"],
)
def test_in_place_softmax_matches_the_reference_on_every_path(rng, dtype, low, high):
    scores = rng.uniform(low, high, size=(2, 3, 4, 6))
    scores = scores.astype(dtype).astype(np.float64)  # the reference sees the same inputs
    mask = _random_mask(rng, (2, 1, 4, 6))
    mask[0, 0, 2] = False  # one query with nothing to attend to
    expected = softmax(np.where(mask, scores, -np.inf))
    got = _softmax_in_place(scores.astype(dtype), mask)
    assert got.dtype == dtype
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=np.finfo(dtype).tiny)
    assert np.all(got[np.broadcast_to(~mask, got.shape)] == 0.0)
