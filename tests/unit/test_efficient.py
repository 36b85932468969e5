"""Linear attention and tiled (memory-efficient) attention: values, properties, gradients."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
)
from tinyformer.efficient import (
    FEATURE_MAPS,
    linear_attention,
    linear_attention_backward,
    tiled_attention,
    tiled_attention_backward,
)
from tinyformer.gradcheck import max_relative_error, numerical_gradient
from tinyformer.masks import causal_mask

seeds = st.integers(0, 2**32 - 1)


def _qkv(rng, batch=(2, 3), t_q=5, t_k=5, d_k=4, d_v=3, dtype=np.float64):
    return (
        rng.standard_normal((*batch, t_q, d_k)).astype(dtype),
        rng.standard_normal((*batch, t_k, d_k)).astype(dtype),
        rng.standard_normal((*batch, t_k, d_v)).astype(dtype),
    )


def _phi(x, feature_map):
    return np.where(x > 0, x + 1, np.exp(x)) if feature_map == "elu+1" else np.maximum(x, 0)


# ------------------------------------------------------------ linear attention
@given(seeds, st.sampled_from(FEATURE_MAPS), st.booleans())
def test_linear_attention_matches_the_quadratic_formula(seed, feature_map, causal):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng)
    kernel = _phi(q, feature_map) @ np.swapaxes(_phi(k, feature_map), -1, -2)  # (..., T, T)
    if causal:
        kernel = kernel * np.tril(np.ones((5, 5)))
    expected = (kernel @ v) / (kernel.sum(-1, keepdims=True) + 1e-6)
    out = linear_attention(q, k, v, causal=causal, feature_map=feature_map)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


@given(seeds, st.integers(0, 4))
def test_causal_linear_attention_ignores_later_tokens(seed, t):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng)
    k2, v2 = k.copy(), v.copy()
    k2[..., t + 1 :, :] += 1.0
    v2[..., t + 1 :, :] -= 2.0
    a = linear_attention(q, k, v, causal=True)
    b = linear_attention(q, k2, v2, causal=True)
    np.testing.assert_allclose(a[..., : t + 1, :], b[..., : t + 1, :], atol=1e-12)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_gradients(rng, feature_map, causal):
    q, k, v = _qkv(rng, batch=(2, 2), t_q=4, t_k=4)
    q, k = q + 0.05 * np.sign(q), k + 0.05 * np.sign(k)  # away from ReLU's kink at 0
    g = rng.standard_normal((2, 2, 4, 3))
    options = {"causal": causal, "feature_map": feature_map}
    grads = linear_attention_backward(g, q, k, v, **options)

    def loss():
        return linear_attention(q, k, v, **options) * g

    # The first causal query sees one key, so its output hardly depends on it: a
    # step of 1e-3 (truncation error ~1e-12) keeps the rounding noise down.
    for analytic, x in zip(grads, (q, k, v), strict=True):
        assert max_relative_error(analytic, numerical_gradient(loss, x, eps=1e-3)) < 1e-6


def test_linear_attention_gradients_with_broadcast_batch(rng):
    q = rng.standard_normal((2, 3, 4, 2))
    k = rng.standard_normal((1, 3, 6, 2))
    v = rng.standard_normal((2, 1, 6, 3))
    g = rng.standard_normal((2, 3, 4, 3))
    grads = linear_attention_backward(g, q, k, v)
    assert [x.shape for x in grads] == [q.shape, k.shape, v.shape]
    for analytic, x in zip(grads, (q, k, v), strict=True):
        numeric = numerical_gradient(lambda: linear_attention(q, k, v) * g, x)
        assert max_relative_error(analytic, numeric) < 1e-6


# ------------------------------------------------------------- tiled attention
@given(
    seeds,
    st.integers(1, 6),
    st.integers(1, 9),
    st.integers(1, 10),
    st.sampled_from(["none", "causal", "random", "keys"]),
)
def test_tiled_attention_agrees_with_full_attention(seed, t_q, t_k, block_size, mask_kind):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, batch=(2,), t_q=t_q, t_k=t_k)
    mask = {
        "none": None,
        "causal": causal_mask(t_q, t_k) if t_k >= t_q else None,
        "random": rng.random((2, t_q, t_k)) < 0.5,  # may mask a whole row
        "keys": rng.random(t_k) < 0.7,  # a (T_k,) mask broadcast over queries
    }[mask_kind]
    out, lse = tiled_attention(q, k, v, mask, block_size=block_size)
    expected, weights = scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(out, expected, atol=1e-12)
    scores = q @ np.swapaxes(k, -1, -2) / 2.0
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), atol=1e-12)
    assert not np.isnan(out).any()
    assert np.all(out[weights.sum(-1) == 0] == 0)


@pytest.mark.parametrize("block_size", [1, 2, 3, 64])
@pytest.mark.parametrize("masked", [False, True])
def test_tiled_attention_gradients(rng, block_size, masked):
    q, k, v = _qkv(rng, batch=(2, 2), t_q=4, t_k=5)
    mask = None
    if masked:
        mask = causal_mask(4, 5) & (rng.random((2, 1, 4, 5)) < 0.8)
        mask[0, 0, 1] = False  # a query with no key at all
    out, lse = tiled_attention(q, k, v, mask, block_size=block_size, scale=0.7)
    g = rng.standard_normal(out.shape)
    grads = tiled_attention_backward(g, q, k, v, out, lse, mask, block_size=block_size, scale=0.7)

    def loss():
        return tiled_attention(q, k, v, mask, block_size=block_size, scale=0.7)[0] * g

    for analytic, x in zip(grads, (q, k, v), strict=True):
        assert max_relative_error(analytic, numerical_gradient(loss, x)) < 1e-6


@given(seeds, st.integers(1, 8))
def test_tiled_backward_agrees_with_full_backward(seed, block_size):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, t_q=6, t_k=7)
    mask = causal_mask(6, 7)
    out, lse = tiled_attention(q, k, v, mask, block_size=block_size)
    g = rng.standard_normal(out.shape)
    full, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = scaled_dot_product_attention_backward(g, q, k, v, weights, full)
    got = tiled_attention_backward(g, q, k, v, out, lse, mask, block_size=block_size)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_tiled_attention_survives_huge_scores(rng):
    q, k, v = _qkv(rng, batch=(1,), t_q=3, t_k=8)
    out, _ = tiled_attention(q * 300, k * 300, v, block_size=3)
    expected, _ = scaled_dot_product_attention(q * 300, k * 300, v)
    np.testing.assert_allclose(out, expected, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float32_agrees_with_float64(rng, dtype):
    q, k, v = _qkv(rng)
    g = rng.standard_normal((2, 3, 5, 3))
    low = [a.astype(dtype) for a in (q, k, v)]
    tolerance = 1e-5 if dtype == np.float32 else 0.0
    out = linear_attention(*low, causal=True)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, linear_attention(q, k, v, causal=True), atol=tolerance)
    grads = linear_attention_backward(g.astype(dtype), *low, causal=True)
    for got, want in zip(grads, linear_attention_backward(g, q, k, v, causal=True), strict=True):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, atol=10 * tolerance)
    out, lse = tiled_attention(*low, causal_mask(5), block_size=2)
    wide, wide_lse = tiled_attention(q, k, v, causal_mask(5), block_size=2)
    assert out.dtype == lse.dtype == dtype
    np.testing.assert_allclose(out, wide, atol=tolerance)
    np.testing.assert_allclose(lse, wide_lse, atol=tolerance)
    grads = tiled_attention_backward(g.astype(dtype), *low, out, lse, causal_mask(5), block_size=2)
    wide_grads = tiled_attention_backward(g, q, k, v, wide, wide_lse, causal_mask(5), block_size=2)
    for got, want in zip(grads, wide_grads, strict=True):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, atol=10 * tolerance)


@given(seeds, st.integers(1, 6), st.integers(0, 3), st.integers(1, 8))
def test_causal_option_equals_the_causal_mask(seed, t_q, extra_keys, block_size):
    # the same tiles, the same operations: the same bits (and fewer masks built)
    rng = np.random.default_rng(seed)
    t_k = t_q + extra_keys
    q, k, v = _qkv(rng, batch=(2,), t_q=t_q, t_k=t_k)
    mask = causal_mask(t_q, t_k)
    out, lse = tiled_attention(q, k, v, block_size=block_size, causal=True)
    expected, expected_lse = tiled_attention(q, k, v, mask, block_size=block_size)
    assert np.array_equal(out, expected)
    assert np.array_equal(lse, expected_lse)
    g = rng.standard_normal(out.shape)
    got = tiled_attention_backward(g, q, k, v, out, lse, block_size=block_size, causal=True)
    want = tiled_attention_backward(g, q, k, v, out, lse, mask, block_size=block_size)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)


def test_causal_option_combines_with_a_mask(rng):
    q, k, v = _qkv(rng, batch=(2,), t_q=5, t_k=5)
    keep = rng.random((2, 5, 5)) < 0.6
    out, _ = tiled_attention(q, k, v, keep, block_size=2, causal=True)
    expected, _ = scaled_dot_product_attention(q, k, v, keep & causal_mask(5))
    np.testing.assert_allclose(out, expected, atol=1e-12)


def test_causal_tiled_gradients(rng):
    q, k, v = _qkv(rng, batch=(2,), t_q=4, t_k=6)
    options = {"block_size": 4, "causal": True}
    out, lse = tiled_attention(q, k, v, **options)
    g = rng.standard_normal(out.shape)
    grads = tiled_attention_backward(g, q, k, v, out, lse, **options)
    for analytic, x in zip(grads, (q, k, v), strict=True):
        numeric = numerical_gradient(lambda: tiled_attention(q, k, v, **options)[0] * g, x)
        assert max_relative_error(analytic, numeric) < 1e-6


@pytest.mark.parametrize("allowed", [True, False])
def test_a_scalar_mask_broadcasts_over_everything(rng, allowed):
    q, k, v = _qkv(rng, batch=(1,), t_q=3, t_k=7)
    out, _ = tiled_attention(q, k, v, np.bool_(allowed), block_size=2)
    expected, _ = scaled_dot_product_attention(q, k, v, np.full((3, 7), allowed))
    np.testing.assert_allclose(out, expected, atol=1e-12)


def test_tiling_keeps_memory_linear_in_the_length(rng):
    """The peak allocation is a few (T, block) tiles, far below one (T, T) matrix."""
    t, block = 1024, 16
    q, k, v = rng.standard_normal((3, t, 8))
    tracemalloc.start()
    tiled_attention(q, k, v, block_size=block, causal=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * t * t / 8  # an eighth of the float64 score matrix
    assert peak < 16 * 8 * t * block  # a bounded number of (T, block) tiles


def _nan(q):
    q = q.copy()
    q[0, 1, 1] = np.nan
    return q


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda q: tiled_attention(q, q[:, :2], q[:, :2], causal=True), ValueError, "causal"),
        (lambda q: tiled_attention(q, q, q, causal=1), TypeError, "causal must be True"),
        (lambda q: tiled_attention(q, q, q, block_size=0), ValueError, "block_size"),
        (lambda q: tiled_attention(q, q, q, np.ones((4, 4))), TypeError, "mask must be a"),
        (lambda q: tiled_attention(q, q, q, np.ones((3, 4), bool)), ValueError, "mask of shape"),
        (lambda q: linear_attention(q, q, q, feature_map="exp"), ValueError, "feature_map"),
        (lambda q: linear_attention(q, q[:, :2], q[:, :2], causal=True), ValueError, "causal"),
        (lambda q: linear_attention(q, q, q, eps=0.0), ValueError, "eps"),
        (lambda q: linear_attention(q, q, q, causal="yes"), TypeError, "causal must be True"),
        (
            lambda q: linear_attention_backward(q[..., :1], q, q, q),
            ValueError,
            "grad_output",
        ),
        (lambda q: tiled_attention(_nan(q), q, q), ValueError, "q must not contain NaN or inf"),
        (
            lambda q: tiled_attention_backward(q, q, q, q, q, np.ones(3)),
            ValueError,
            "log_sum_exp",
        ),
    ],
)
def test_bad_input_is_named(call, error, words):
    q = np.ones((1, 4, 2))
    with pytest.raises(error) as info:
        call(q)
    assert words in str(info.value)


# ----------------------------------------------------------------- reference
@pytest.mark.reference
def test_tiled_attention_and_its_backward_agree_with_torch(rng, torch):
    q, k, v = (rng.standard_normal((2, 3, n, 4)) for n in (5, 6, 6))
    v = v[..., :3]
    mask = causal_mask(5, 6) & (rng.random((2, 1, 5, 6)) < 0.8)
    mask[..., 0] = True  # PyTorch turns a query with no key into NaN; we give zeros
    g = rng.standard_normal((2, 3, 5, 3))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out_t = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=torch.tensor(mask)
    )
    out_t.backward(torch.tensor(g))
    out, lse = tiled_attention(q, k, v, mask, block_size=4)
    grads = tiled_attention_backward(g, q, k, v, out, lse, mask, block_size=4)
    np.testing.assert_allclose(out, out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    for ours, theirs in zip(grads, (qt, kt, vt), strict=True):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)
