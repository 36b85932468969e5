"""Multi-head attention: the formula, gradients, row independence, the KV cache, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.attention import scaled_dot_product_attention
from tinyformer.functional import _UNSHIFTED
from tinyformer.gradcheck import check_module_gradients
from tinyformer.layers import Linear
from tinyformer.masks import causal_mask, combine_masks, padding_mask
from tinyformer.multihead import KVCache, MultiHeadAttention, multi_head_attention_loop
from tinyformer.positional import apply_rotary

seeds = st.integers(0, 2**32 - 1)
dtypes = st.sampled_from([np.float32, np.float64])
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def _layer(rng, d_model=8, n_heads=2, dtype=np.float64, **kwargs):
    """A layer whose every parameter is random (zero biases would hide their mistakes)."""
    layer = MultiHeadAttention(d_model, n_heads, rng=rng, dtype=dtype, **kwargs)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.5
    return layer


def _random_mask(rng, shape):
    mask = rng.random(shape) < 0.6
    mask[..., 0] = True
    return mask


def _as_dtype(layer, dtype):
    """The same layer (same weights, rounded) in another dtype."""
    other = MultiHeadAttention(
        layer.d_model,
        layer.n_heads,
        rng=np.random.default_rng(0),
        bias=layer.q_proj.bias is not None,
        rotary=layer.rotary,
        dtype=dtype,
    )
    other.load_state_dict(layer.state_dict())
    return other


def _formula(layer, x, context=None, mask=None):
    """Multi-head attention written out in float64 from its definition, without the package.

    head_i = softmax(Q_i K_i^T / sqrt(d_k), masked) V_i, heads side by side, times W_O.
    """
    params = {name: p.value.astype(np.float64) for name, p in layer.named_parameters()}

    def project(name, inputs):
        bias = params.get(f"{name}.bias", 0.0)
        return inputs.astype(np.float64) @ params[f"{name}.weight"] + bias

    source = x if context is None else context
    q, k, v = project("q_proj", x), project("k_proj", source), project("v_proj", source)
    d_k = layer.d_k
    heads = []
    for i in range(layer.n_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        scores = q[..., cols] @ np.swapaxes(k[..., cols], -1, -2) / np.sqrt(d_k)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        heads.append(weights @ v[..., cols])  # (B, T_q, d_k)
    return project("out_proj", np.concatenate(heads, axis=-1))


# ------------------------------------------------------------------ structure
def test_the_layer_is_four_linear_projections(rng):
    layer = MultiHeadAttention(12, 3, rng=rng)
    assert all(isinstance(getattr(layer, name), Linear) for name in PROJECTIONS)
    assert [n for n, _ in layer.named_parameters()] == [
        f"{name}.{kind}" for name in PROJECTIONS for kind in ("weight", "bias")
    ]
    assert all(getattr(layer, name).weight.shape == (12, 12) for name in PROJECTIONS)
    assert layer.d_k == 4
    assert layer.scale == 0.5
    no_bias = MultiHeadAttention(12, 3, rng=rng, bias=False, scale=1.0)
    assert [n for n, _ in no_bias.named_parameters()] == [f"{n}.weight" for n in PROJECTIONS]
    assert no_bias.scale == 1.0


def test_initialization_draws_query_key_value_output_in_order(rng):
    layer = MultiHeadAttention(6, 2, rng=np.random.default_rng(4))
    draws = np.random.default_rng(4)
    for name in PROJECTIONS:
        expected = Linear(6, 6, rng=draws).weight.value
        np.testing.assert_array_equal(getattr(layer, name).weight.value, expected)
        np.testing.assert_array_equal(getattr(layer, name).bias.value, 0.0)


# -------------------------------------------------------------------- values
@pytest.mark.parametrize(
    ("seed", "n_heads", "cross", "dtype"),
    [
        (0, 1, False, np.float64),
        (1, 2, True, np.float64),
        (2, 4, False, np.float64),
        (3, 4, True, np.float64),
        (4, 2, False, np.float32),
        (5, 2, True, np.float32),
    ],
)
def test_matches_the_formula_written_out(seed, n_heads, cross, dtype):
    rng = np.random.default_rng(seed)
    d_model, batch, t_q = 4 * n_heads, 2, 5
    t_k = 7 if cross else t_q
    layer = _layer(rng, d_model, n_heads, dtype=dtype)
    x = rng.standard_normal((batch, t_q, d_model)).astype(dtype)
    context = rng.standard_normal((batch, t_k, d_model)).astype(dtype) if cross else None
    mask = _random_mask(rng, (batch, t_q, t_k))  # every query keeps key 0
    out = layer.forward(x, context, mask=mask)
    assert out.dtype == layer.attention_weights.dtype == dtype
    expected = _formula(layer, x, context, mask)
    tolerance = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)
    assert layer.attention_weights.shape == (batch, n_heads, t_q, t_k)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 300.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_is_exact_for_small_and_huge_scores(rng, scale, dtype):
    """Scores from tiny to far beyond exp's range give the true attention, in both dtypes.

    Compared with the formula in float64, to a tolerance relative to the size of the
    output, the same at every scale (measured: about 1e-7 in float32, 2e-16 in float64).
    """
    layer = _layer(rng, 8, 2)
    layer.q_proj.weight.value *= scale
    layer.k_proj.weight.value *= scale
    layer = _as_dtype(layer, dtype)
    x = rng.standard_normal((2, 5, 8)).astype(dtype)
    mask = combine_masks(causal_mask(5), _random_mask(rng, (2, 1, 5)))
    out = layer.forward(x, mask=mask)
    assert np.isfinite(out).all()
    expected = _formula(layer, x, mask=mask)
    relative = 1e-12 if dtype == np.float64 else 1e-6
    error = np.max(np.abs(out - expected)) / np.max(np.abs(expected))
    assert error <= relative, f"relative error {error:.2e} above {relative:.0e}"
    assert np.all(layer.attention_weights[np.broadcast_to(~mask[:, None], (2, 2, 5, 5))] == 0)


@given(seeds, st.sampled_from([1, 2, 4]), st.integers(1, 5), st.integers(1, 6), st.booleans())
def test_one_head_at_a_time_agrees_with_all_heads_at_once(seed, n_heads, t_q, t_k, cross):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 4 * n_heads, n_heads, bias=bool(seed % 2))
    x = rng.standard_normal((2, t_q, 4 * n_heads))
    context = rng.standard_normal((2, t_k, 4 * n_heads)) if cross else None
    mask = _random_mask(rng, (2, t_q, t_k if cross else t_q))
    loop = multi_head_attention_loop(layer, x, context, mask)
    np.testing.assert_allclose(layer.forward(x, context, mask=mask), loop, rtol=1e-12, atol=1e-13)


def test_one_head_at_a_time_agrees_with_rotary_positions(rng):
    layer = _layer(rng, 8, 2, rotary=True)
    x = rng.standard_normal((3, 6, 8))
    loop = multi_head_attention_loop(layer, x, mask=causal_mask(6))
    np.testing.assert_allclose(layer.forward(x, mask=causal_mask(6)), loop, rtol=1e-12, atol=1e-13)
    plain = _layer(np.random.default_rng(0), 8, 2)
    plain.load_state_dict(layer.state_dict())
    assert np.abs(plain.forward(x, mask=causal_mask(6)) - loop).max() > 1e-3  # rotation matters


@given(seeds)
def test_masked_keys_get_exactly_zero_weight(seed):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 4)
    mask = _random_mask(rng, (3, 5, 5))
    layer.forward(rng.standard_normal((3, 5, 8)), mask=mask)
    weights = layer.attention_weights
    assert np.all(weights[np.broadcast_to(~mask[:, None], weights.shape)] == 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)


def test_fully_masked_query_gives_the_output_bias_not_nan(rng):
    layer = _layer(rng, 8, 2)
    mask = np.ones((2, 4, 4), bool)
    mask[0, 1] = False
    out = layer.forward(rng.standard_normal((2, 4, 8)), mask=mask)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(layer.attention_weights[0, :, 1], 0.0)
    np.testing.assert_array_equal(out[0, 1], layer.out_proj.bias.value)  # no value reached it
    grad = layer.backward(np.ones_like(out))
    assert np.isfinite(grad).all()


@given(seeds)
def test_self_attention_without_positions_is_permutation_equivariant(seed):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 2)
    x = rng.standard_normal((2, 6, 8))
    perm = rng.permutation(6)
    np.testing.assert_allclose(layer.forward(x[:, perm]), layer.forward(x)[:, perm], atol=1e-12)


def test_nan_input_is_an_error_not_nan_output(rng):
    x = rng.standard_normal((1, 3, 8))
    x[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        _layer(rng).forward(x)


@pytest.mark.parametrize("cross", [False, True])
def test_float32_agrees_with_float64_forward_and_backward(rng, cross):
    layer = _layer(rng, 8, 2)
    small = _as_dtype(layer, np.float32)
    x = rng.standard_normal((2, 3, 8))
    context = rng.standard_normal((2, 4, 8)) if cross else None
    mask = _random_mask(rng, (2, 3, 4 if cross else 3))
    g = rng.standard_normal((2, 3, 8))
    wide = layer.forward(x, context, mask=mask)
    wide_grads = layer.backward(g)
    narrow = small.forward(
        x.astype(np.float32), None if context is None else context.astype(np.float32), mask=mask
    )
    assert narrow.dtype == small.attention_weights.dtype == np.float32
    np.testing.assert_allclose(narrow, wide, rtol=1e-5, atol=1e-5)
    narrow_grads = small.backward(g.astype(np.float32))
    pairs = zip(narrow_grads, wide_grads, strict=True) if cross else [(narrow_grads, wide_grads)]
    for got, want in pairs:
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(small.named_parameters(), layer.parameters(), strict=True):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5, err_msg=name)


# ---------------------------------------------------------- row independence
def _batch(rng, dtype, d_model, t):
    """A batch whose sequences are scaled by 1, 30 or 100: scores of very different sizes."""
    b = int(rng.integers(2, 5))
    factors = rng.choice([1.0, 30.0, 100.0], size=(b, 1, 1))
    return (rng.standard_normal((b, t, d_model)) * factors).astype(dtype)


@given(seeds, dtypes, st.sampled_from([1, 2, 4]), st.integers(1, 6), st.booleans())
def test_self_attention_sequences_are_bitwise_independent(seed, dtype, n_heads, t, causal):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 2 * n_heads, n_heads, dtype=dtype)
    x = _batch(rng, dtype, 2 * n_heads, t)
    mask = causal_mask(t) if causal else None
    out = layer.forward(x, mask=mask)
    other = int(rng.integers(len(x)))
    changed = x.copy()
    changed[other] = (100 * rng.standard_normal(x.shape[1:])).astype(dtype)
    out2 = layer.forward(changed, mask=mask)
    rest = np.arange(len(x)) != other
    assert np.array_equal(out2[rest], out[rest])


@given(seeds, dtypes, st.sampled_from([1, 2]), st.integers(1, 5), st.integers(1, 6))
def test_cross_attention_sequences_are_bitwise_independent(seed, dtype, n_heads, t_q, t_k):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 4 * n_heads, n_heads, dtype=dtype)
    x = _batch(rng, dtype, 4 * n_heads, t_q)
    memory = (30 * rng.standard_normal((len(x), t_k, 4 * n_heads))).astype(dtype)
    mask = _random_mask(rng, (len(x), 1, t_k))
    out = layer.forward(x, memory, mask=mask)
    other = int(rng.integers(len(x)))
    x2, memory2, mask2 = x.copy(), memory.copy(), mask.copy()
    x2[other] *= 3
    memory2[other] = (100 * rng.standard_normal(memory.shape[1:])).astype(dtype)
    mask2[other] = True
    out2 = layer.forward(x2, memory2, mask=mask2)
    rest = np.arange(len(x)) != other
    assert np.array_equal(out2[rest], out[rest])


@given(seeds, dtypes, st.integers(2, 7), st.integers(1, 3), st.booleans())
def test_causal_earlier_positions_ignore_later_tokens_bitwise(seed, dtype, t, n_new, rotary):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 2, dtype=dtype, rotary=rotary)
    x = _batch(rng, dtype, 8, t)
    first = max(t - n_new, 1)
    out = layer.forward(x, mask=causal_mask(t))
    changed = x.copy()
    changed[:, first:] = (100 * rng.standard_normal(changed[:, first:].shape)).astype(dtype)
    out2 = layer.forward(changed, mask=causal_mask(t))
    assert np.array_equal(out2[:, :first], out[:, :first])
    # The later positions do see such a change (else the check above would prove nothing). Shown
    # on sequences of unit scale: at scale 100 a float32 softmax can give a changed token exactly
    # zero weight before and after the change (seed 152, float32, t=2: no output moved at all).
    unit = rng.standard_normal(x.shape).astype(dtype)
    unit2 = unit.copy()
    unit2[:, first:] = rng.standard_normal(unit2[:, first:].shape).astype(dtype)
    before = layer.forward(unit, mask=causal_mask(t))[:, first:]
    assert not np.array_equal(layer.forward(unit2, mask=causal_mask(t))[:, first:], before)


def test_a_float32_sequence_keeps_its_accuracy_beside_one_with_far_larger_scores(rng):
    layer = _layer(rng, 16, 2, dtype=np.float32)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    tame = layer.forward(x)
    high = x.copy()
    high[1] *= 20  # sequence 1's scores now lie far beyond float32's unshifted range
    q = layer.q_proj.forward(high[1]).reshape(6, 2, 8)  # (T, h, d_k)
    k = layer.k_proj.forward(high[1]).reshape(6, 2, 8)
    scores = np.einsum("qhd,khd->hqk", q, k) * layer.scale
    assert scores.max(axis=-1).max() > _UNSHIFTED[np.dtype(np.float32)][1]  # needs a shift
    beside_high = layer.forward(high)
    assert np.array_equal(beside_high[0], tame[0])
    expected = _formula(layer, x[:1])[0]
    error = np.abs(beside_high[0] - expected).max() / np.abs(expected).max()
    assert error < 1e-6, error


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
    assert set(errors) == {"input 0", "input 1"} | {n for n, _ in layer.named_parameters()}
    assert max(errors.values()) < 1e-6, errors


def test_gradients_with_rotary_positions_and_no_bias(rng):
    layer = _layer(rng, 8, 2, rotary=True, bias=False)
    x = rng.standard_normal((2, 5, 8))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"mask": causal_mask(5)})
    assert list(errors) == ["input 0"] + [f"{name}.weight" for name in PROJECTIONS]
    assert max(errors.values()) < 1e-6, errors


def test_gradients_with_attention_dropout(rng):
    layer = _layer(rng, 8, 4, dropout=0.3)
    state = layer.dropout.rng.bit_generator.state

    def reset():
        layer.dropout.rng.bit_generator.state = state

    x = rng.standard_normal((2, 4, 8))
    errors = check_module_gradients(layer, [x], rng=rng, before_forward=reset)
    assert max(errors.values()) < 1e-6, errors


def _heads(a, n_heads):
    b, t, d = a.shape
    return a.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)  # (B, h, T, d_k)


def test_attention_dropout_multiplies_the_weights_by_one_drawn_mask(rng):
    layer = _layer(rng, 8, 2, dropout=0.5)
    x = rng.standard_normal((2, 4, 8))
    state = layer.dropout.rng.bit_generator.state
    out = layer.forward(x)
    weights = layer.attention_weights  # before dropout: rows sum to one
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-14)
    layer.dropout.rng.bit_generator.state = state
    keep = layer.dropout.mask((2, 2, 4, 4), np.float64)  # the mask that forward drew
    assert set(np.unique(keep)) == {0.0, 2.0}
    heads = (weights * keep) @ _heads(layer.v_proj.forward(x), 2)  # (B, h, T, d_k)
    merged = heads.transpose(0, 2, 1, 3).reshape(2, 4, 8)
    assert np.array_equal(out, layer.out_proj.forward(merged))
    layer.eval()
    assert layer.dropout.mask((2, 2, 4, 4), np.float64) is None
    assert not np.allclose(layer.forward(x), out)


def test_gradients_with_a_fully_masked_query(rng):
    layer = _layer(rng, 4, 2)
    mask = np.ones((2, 3, 3), bool)
    mask[1, 2] = False
    errors = check_module_gradients(
        layer, [rng.standard_normal((2, 3, 4))], rng=rng, kwargs={"mask": mask}
    )
    assert max(errors.values()) < 1e-6, errors


# ------------------------------------------------------------------- KV cache
@given(seeds, st.lists(st.integers(1, 3), min_size=1, max_size=4), st.booleans(), dtypes)
def test_cached_decoding_matches_full_causal_attention_to_rounding(seed, chunks, rotary, dtype):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, 8, 2, rotary=rotary, dtype=dtype)
    total = sum(chunks)
    x = rng.standard_normal((2, total, 8)).astype(dtype)
    full = layer.forward(x, mask=causal_mask(total))
    cache, start, pieces = KVCache(), 0, []
    for n in chunks:
        mask = causal_mask(n, start + n)  # the new queries are the last positions
        pieces.append(layer.forward(x[:, start : start + n], mask=mask, cache=cache))
        start += n
    assert len(cache) == total
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(
        np.concatenate(pieces, axis=1), full, rtol=tolerance, atol=tolerance
    )


def test_cached_keys_are_the_rotated_projections_of_every_position(rng):
    layer = _layer(rng, 8, 2, rotary=True)
    x = rng.standard_normal((1, 5, 8))
    cache = KVCache()
    for i in range(5):
        layer.forward(x[:, i : i + 1], cache=cache)
    keys = apply_rotary(_heads(layer.k_proj.forward(x), 2), np.arange(5))
    np.testing.assert_allclose(cache.keys, keys, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(cache.values, _heads(layer.v_proj.forward(x), 2), rtol=1e-13)


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


def test_cross_attention_cache_is_filled_once_and_reused(rng):
    layer = _layer(rng, 8, 2)
    memory = rng.standard_normal((2, 5, 8))
    x = rng.standard_normal((2, 3, 8))
    full = layer.forward(x, memory)
    cache = KVCache()
    calls = []

    def counted(name, forward):
        def run(a):
            calls.append(name)
            return forward(a)

        return run

    for name in ("k_proj", "v_proj"):
        projection = getattr(layer, name)
        projection.forward = counted(name, projection.forward)
    steps = [layer.forward(x[:, :1], memory, cache=cache)]
    assert calls == ["k_proj", "v_proj"]
    assert len(cache) == 5  # the memory's keys, once
    keys = cache.keys.copy()
    # later steps read the cache: a different memory (they must not look at it) changes nothing
    steps += [layer.forward(x[:, i : i + 1], memory * 0, cache=cache) for i in (1, 2)]
    assert calls == ["k_proj", "v_proj"]  # not called again
    assert len(cache) == 5
    np.testing.assert_array_equal(cache.keys, keys)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-13)


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
    assert cache.values is None


def test_truncate_select_and_copy(rng):
    cache = KVCache()
    keys, values = rng.standard_normal((3, 2, 6, 4)), rng.standard_normal((3, 2, 6, 4))
    cache.append(keys, values)
    copy = cache.copy()
    beams = cache.select(np.array([2, 0, 2]))
    cache.truncate(4)
    assert len(cache) == 4
    np.testing.assert_array_equal(cache.keys, keys[:, :, :4])
    cache.append(keys[:, :, :1] + 1, values[:, :, :1])  # overwrites position 4
    np.testing.assert_array_equal(copy.keys, keys)  # the copy kept its own arrays
    assert len(copy) == 6
    np.testing.assert_array_equal(beams.keys, keys[[2, 0, 2]])
    np.testing.assert_array_equal(beams.values, values[[2, 0, 2]])
    with pytest.raises(ValueError, match="length must be at most the number of cached"):
        cache.truncate(9)
    with pytest.raises(ValueError, match=r"indices must be rows in \[0, 3\)"):
        cache.select(np.array([3]))
    with pytest.raises(TypeError, match="indices must be an integer array"):
        cache.select(np.array([0.0]))


def test_backward_after_a_cached_forward_is_a_clear_error(rng):
    layer = _layer(rng)
    out = layer.forward(rng.standard_normal((1, 2, 8)), cache=KVCache())
    with pytest.raises(RuntimeError, match="cache is for inference"):
        layer.backward(np.ones_like(out))


# ----------------------------------------------------------------- reference
def _torch_pairs(torch, layer):
    """Our weights in PyTorch's layout: in_proj stacks W_Q, W_K, W_V as (3d, d)."""
    p = {name: param.value for name, param in layer.named_parameters()}
    in_w = np.concatenate([p[f"{n}.weight"].T for n in PROJECTIONS[:3]])
    in_b = np.concatenate([p[f"{n}.bias"] for n in PROJECTIONS[:3]])
    return [
        torch.tensor(a, requires_grad=True)
        for a in (in_w, in_b, p["out_proj.weight"].T, p["out_proj.bias"])
    ]


@pytest.mark.reference
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_forward_and_backward_agree_with_torch(rng, cross, masked, torch):
    layer = _layer(rng, 12, 3)
    x = rng.standard_normal((2, 5, 12))
    context = rng.standard_normal((2, 7, 12)) if cross else None
    mask = None
    if masked and cross:
        mask = padding_mask(np.array([[1, 2, 3, 4, 5, 0, 0], [1, 2, 3, 4, 5, 6, 7]]), 0)
    elif masked:
        mask = causal_mask(5) & (rng.random((2, 5, 5)) < 0.7)
        mask[..., 0] = True  # PyTorch turns a query with no key into NaN; we give zeros
    source = x if context is None else context
    xt = torch.tensor(x, requires_grad=True)
    st_ = xt if context is None else torch.tensor(context, requires_grad=True)
    in_w, in_b, out_w, out_b = _torch_pairs(torch, layer)
    attn_mask = None
    if mask is not None:  # ours: True = may attend, (B, T_q, T_k); torch: True = blocked
        full = np.broadcast_to(mask, (2, 5, source.shape[1]))
        attn_mask = torch.tensor(np.repeat(~full, layer.n_heads, axis=0))  # (B h, T_q, T_k)
    out_t, weights_t = torch.nn.functional.multi_head_attention_forward(
        xt.transpose(0, 1),
        st_.transpose(0, 1),
        st_.transpose(0, 1),
        12,
        3,
        in_w,
        in_b,
        None,
        None,
        False,
        0.0,
        out_w,
        out_b,
        training=True,
        need_weights=True,
        attn_mask=attn_mask,
        average_attn_weights=False,
    )
    out_t = out_t.transpose(0, 1)
    g = rng.standard_normal(out_t.shape)
    out_t.backward(torch.tensor(g))

    def close(ours, theirs):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-10, atol=1e-12)

    close(layer.forward(x, context, mask=mask), out_t)
    close(layer.attention_weights, weights_t)
    grads = layer.backward(g)
    grad_x, grad_context = grads if cross else (grads, None)
    close(grad_x, xt.grad)
    if cross:
        close(grad_context, st_.grad)
    for i, name in enumerate(PROJECTIONS[:3]):
        rows = slice(12 * i, 12 * (i + 1))
        close(getattr(layer, name).weight.grad, in_w.grad[rows].T)
        close(getattr(layer, name).bias.grad, in_b.grad[rows])
    close(layer.out_proj.weight.grad, out_w.grad.T)
    close(layer.out_proj.bias.grad, out_b.grad)


@pytest.mark.reference
@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(4, 4), (4, 2), (8, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_query_attention_agrees_with_torch_enable_gqa(
    rng, n_heads, n_kv_heads, dtype, torch
):
    """Grouped-query attention against ``scaled_dot_product_attention(..., enable_gqa=True)``.

    PyTorch shares key/value head ``j`` with query heads ``j g .. j g + g - 1``, as we do;
    forward and every gradient (inputs and the four projections' weights and biases) agree.
    """
    d_k, b, t = 3, 2, 6
    d = n_heads * d_k
    layer = MultiHeadAttention(d, n_heads, n_kv_heads=n_kv_heads, rng=rng, dtype=dtype)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.5
    x = rng.standard_normal((b, t, d)).astype(dtype)
    mask = causal_mask(t) & (rng.random((b, t, t)) < 0.7)
    mask[..., 0] = True  # PyTorch turns a query with no key into NaN; we give zeros
    leaves = {
        name: torch.tensor(p.value.copy(), requires_grad=True)
        for name, p in layer.named_parameters()
    }
    xt = torch.tensor(x, requires_grad=True)

    def heads(name, n):  # (B, n, T, d_k), from our (in, out) weights
        y = xt @ leaves[f"{name}.weight"] + leaves[f"{name}.bias"]
        return y.reshape(b, t, n, d_k).transpose(1, 2)

    out_t = torch.nn.functional.scaled_dot_product_attention(
        heads("q_proj", n_heads),
        heads("k_proj", n_kv_heads),
        heads("v_proj", n_kv_heads),
        attn_mask=torch.tensor(mask[:, None]),  # True = takes part, as ours; (B, 1, T, T)
        enable_gqa=True,
    )
    out_t = out_t.transpose(1, 2).reshape(b, t, d) @ leaves["out_proj.weight"]
    out_t = out_t + leaves["out_proj.bias"]
    g = rng.standard_normal(out_t.shape).astype(dtype)
    out_t.backward(torch.tensor(g))
    tolerance = (
        {"rtol": 2e-5, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}
    )

    def close(ours, theirs):
        assert ours.dtype == dtype
        np.testing.assert_allclose(ours, theirs.detach().numpy(), **tolerance)

    close(layer.forward(x, mask=mask), out_t)
    close(layer.backward(g), xt.grad)
    for name, p in layer.named_parameters():
        close(p.grad, leaves[name].grad)


# ----------------------------------------------------------------- bad input
def _x(*shape, dtype=np.float64):
    return np.ones(shape, dtype=dtype)


def _mha(**kwargs):
    return MultiHeadAttention(8, 2, rng=np.random.default_rng(0), **kwargs)


def _filled_cache():
    cache = KVCache()
    cache.append(_x(3, 2, 1, 4), _x(3, 2, 1, 4))  # a batch of 3, then a batch of 1 arrives
    return cache


def _after_forward(layer, *args, **kwargs):
    layer.forward(*args, **kwargs)
    return layer


# fmt: off
BAD = [
    ("d_model not divisible", lambda: MultiHeadAttention(10, 3, rng=np.random.default_rng(0)), ValueError, "d_model must be divisible by n_heads"),
    ("n_heads zero", lambda: MultiHeadAttention(8, 0, rng=np.random.default_rng(0)), ValueError, "n_heads must be a positive"),
    ("odd d_k with rotary", lambda: MultiHeadAttention(6, 2, rng=np.random.default_rng(0), rotary=True), ValueError, "even head size d_k"),
    ("rng is a seed", lambda: MultiHeadAttention(8, 2, rng=0), TypeError, "rng must be a numpy.random.Generator"),
    ("scale a string", lambda: _mha(scale="big"), TypeError, "scale must be a number"),
    ("rotary_base zero", lambda: _mha(rotary_base=0.0), ValueError, "rotary_base"),
    ("rank 2 input", lambda: _mha().forward(_x(4, 8)), ValueError, "x must have at least 3"),
    ("last dim", lambda: _mha().forward(_x(1, 4, 6)), ValueError, "x must have last dimension 8"),
    ("rank 4 input", lambda: _mha().forward(_x(1, 1, 4, 8)), ValueError, "x must have shape (B, T, d_model)"),
    ("float32 into float64", lambda: _mha().forward(_x(1, 4, 8, dtype=np.float32)), TypeError, "x must have the layer's dtype float64, got float32"),
    ("mask of ints", lambda: _mha().forward(_x(1, 4, 8), mask=np.ones((4, 4), int)), TypeError, "mask must be a boolean"),
    ("mask wrong shape", lambda: _mha().forward(_x(1, 4, 8), mask=np.ones((3, 5), bool)), ValueError, "mask"),
    ("mask with head axis", lambda: _mha().forward(_x(2, 4, 8), mask=np.ones((2, 2, 4, 4), bool)), ValueError, "mask"),
    ("context batch", lambda: _mha().forward(_x(2, 4, 8), _x(3, 5, 8)), ValueError, "context must have shape (B, T_k, d_model) with the batch size B=2"),
    ("context dtype", lambda: _mha().forward(_x(2, 4, 8), _x(2, 5, 8, dtype=np.float32)), TypeError, "context must have the layer's dtype float64"),
    ("rotary cross-attention", lambda: _mha(rotary=True).forward(_x(1, 2, 8), _x(1, 3, 8)), ValueError, "rotary positions apply to self-attention only"),
    ("cache not a KVCache", lambda: _mha().forward(_x(1, 2, 8), cache={}), TypeError, "cache must be a KVCache"),
    ("cache of another batch", lambda: _mha().forward(_x(1, 1, 8), cache=_filled_cache()), ValueError, "cache holds 3 sequences but x has batch size 1"),
    ("cache append mismatch", lambda: _filled_cache().append(_x(3, 2, 1, 5), _x(3, 2, 1, 4)), ValueError, "keys must match the cached"),
    ("cache append shapes", lambda: KVCache().append(_x(3, 2, 4), _x(3, 2, 4)), ValueError, "keys and values must have shapes"),
    ("grad wrong dtype", lambda: _after_forward(_mha(), _x(1, 2, 8)).backward(_x(1, 2, 8, dtype=np.float32)), TypeError, "grad_out must have the forward output's dtype"),
    ("grad wrong shape", lambda: _after_forward(_mha(), _x(1, 2, 8)).backward(_x(1, 3, 8)), ValueError, "grad_out must have the forward output's shape"),
    ("backward first", lambda: _mha().backward(_x(1, 2, 8)), RuntimeError, "backward was called before forward"),
    ("loop on a Linear", lambda: multi_head_attention_loop(Linear(8, 8, rng=np.random.default_rng(0)), _x(1, 2, 8)), TypeError, "layer must be a MultiHeadAttention"),
]
# fmt: on


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_raises_an_error_that_says_what_is_wrong(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value), str(info.value)


# ------------------------------------------------------------- the score scale
def _scaled_layer(rng, d_model=8, n_heads=2, **kwargs):
    layer = MultiHeadAttention(d_model, n_heads, rng=rng, **kwargs)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.5
    return layer


def test_default_scale_is_one_over_sqrt_d_k(rng):
    assert _scaled_layer(rng, 12, 3).scale == 1 / math.sqrt(4)
    assert _scaled_layer(rng, 12, 3, scale=1.0).scale == 1.0


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_scaled_layer_matches_the_function_with_that_scale(rng, scale):
    layer = _scaled_layer(rng, 8, 2, scale=scale)
    x = rng.standard_normal((2, 5, 8))
    out = layer.forward(x, mask=causal_mask(5))

    def heads(linear):  # (B, h, T, d_k)
        return (
            (x @ linear.weight.value + linear.bias.value).reshape(2, 5, 2, 4).transpose(0, 2, 1, 3)
        )

    o, _ = scaled_dot_product_attention(
        heads(layer.q_proj), heads(layer.k_proj), heads(layer.v_proj), causal_mask(5), scale=scale
    )
    merged = o.transpose(0, 2, 1, 3).reshape(2, 5, 8)
    expected = merged @ layer.out_proj.weight.value + layer.out_proj.bias.value
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_gradients_with_a_given_scale(rng, scale):
    layer = _scaled_layer(rng, 8, 2, scale=scale)
    x = rng.standard_normal((2, 4, 8))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"mask": causal_mask(4)})
    assert max(errors.values()) < 1e-6, errors
    context = rng.standard_normal((2, 3, 8))
    cross = _scaled_layer(rng, 8, 2, scale=scale)
    ids = np.array([[5, 6, 0], [5, 6, 7]])
    errors = check_module_gradients(
        cross, [x, context], rng=rng, kwargs={"mask": padding_mask(ids, 0)}
    )
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize(
    ("scale", "error", "words"),
    [("big", TypeError, "scale must be a number or None"), (math.inf, ValueError, "finite")],
)
def test_bad_scale_is_named(rng, scale, error, words):
    with pytest.raises(error, match=words):
        MultiHeadAttention(8, 2, rng=rng, scale=scale)


def test_position_interpolation_rotates_position_p_as_p_over_s(rng):
    """With ``rotary_interpolation=s``, queries and keys are rotated as positions p / s."""
    layer = _layer(rng, 8, 2, rotary=True, rotary_interpolation=4.0)
    x = rng.standard_normal((2, 6, 8))
    out = layer.forward(x, mask=causal_mask(6))
    loop = multi_head_attention_loop(layer, x, mask=causal_mask(6))
    np.testing.assert_allclose(out, loop, rtol=1e-12, atol=1e-13)
    # by hand: rotate one head's queries and keys at positions p / 4
    q = x @ layer.q_proj.weight.value[:, :4] + layer.q_proj.bias.value[:4]
    k = x @ layer.k_proj.weight.value[:, :4] + layer.k_proj.bias.value[:4]
    angles = np.arange(6)[:, None] / 4.0 * 10000.0 ** (-np.arange(0, 4, 2) / 4)  # (T, d_k/2)

    def rotate(a):  # adjacent pairs (2i, 2i+1) turned by the angles
        out = np.empty_like(a)
        out[..., 0::2] = a[..., 0::2] * np.cos(angles) - a[..., 1::2] * np.sin(angles)
        out[..., 1::2] = a[..., 0::2] * np.sin(angles) + a[..., 1::2] * np.cos(angles)
        return out

    scores = rotate(q) @ rotate(k).swapaxes(-1, -2) / 2.0
    scores = np.where(causal_mask(6), scores, -np.inf)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(layer.attention_weights[:, 0], expected, rtol=1e-10, atol=1e-13)
    plain = _layer(np.random.default_rng(0), 8, 2, rotary=True)
    plain.load_state_dict(layer.state_dict())
    assert np.abs(plain.forward(x, mask=causal_mask(6)) - out).max() > 1e-3  # the factor matters
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"mask": causal_mask(6)})
    assert max(errors.values()) < 1e-6, errors
    with pytest.raises(
        ValueError, match=r"rotary_interpolation must be a finite positive number, got 0\.0"
    ):
        _layer(rng, 8, 2, rotary=True, rotary_interpolation=0.0)


def test_cached_decoding_with_position_interpolation_matches_full_attention(rng):
    layer = _layer(rng, 8, 2, rotary=True, rotary_interpolation=2.5)
    x = rng.standard_normal((2, 7, 8))
    full = layer.forward(x, mask=causal_mask(7))
    cache = KVCache()
    steps = [layer.forward(x[:, :4], mask=causal_mask(4), cache=cache)]
    steps += [layer.forward(x[:, t : t + 1], cache=cache) for t in range(4, 7)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-13)
