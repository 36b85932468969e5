"""Scaled dot-product attention: values, masking, properties, backward, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
)
from tinyformer.gradcheck import max_relative_error, numerical_gradient
from tinyformer.masks import causal_mask, padding_mask


def _qkv(rng, batch=(2,), t_q=4, t_k=5, d_k=3, d_v=2, dtype=np.float64):
    q = rng.standard_normal((*batch, t_q, d_k)).astype(dtype)
    k = rng.standard_normal((*batch, t_k, d_k)).astype(dtype)
    v = rng.standard_normal((*batch, t_k, d_v)).astype(dtype)
    return q, k, v


def test_matches_the_formula_written_out(rng):
    q, k, v = _qkv(rng)
    out, w = scaled_dot_product_attention(q, k, v)
    scores = np.einsum("bqd,bkd->bqk", q, k) / np.sqrt(3)
    expected_w = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    np.testing.assert_allclose(w, expected_w, rtol=1e-12)
    np.testing.assert_allclose(out, np.einsum("bqk,bkv->bqv", expected_w, v), rtol=1e-12)


def test_shapes_with_heads(rng):
    q, k, v = _qkv(rng, batch=(2, 3), t_q=4, t_k=6, d_k=8, d_v=5)
    out, w = scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 4, 5)
    assert w.shape == (2, 3, 4, 6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved(rng, dtype):
    out, w = scaled_dot_product_attention(*_qkv(rng, dtype=dtype))
    assert out.dtype == dtype
    assert w.dtype == dtype


@given(st.integers(0, 2**32 - 1))
def test_masked_keys_get_exactly_zero_weight(seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng)
    mask = rng.random((2, 4, 5)) < 0.6
    mask[:, :, 0] = True
    _, w = scaled_dot_product_attention(q, k, v, mask)
    assert np.all(w[~mask] == 0.0)
    np.testing.assert_allclose(w.sum(-1), 1.0)


def test_fully_masked_row_gives_zeros_not_nan(rng):
    q, k, v = _qkv(rng)
    mask = np.ones((4, 5), bool)
    mask[2] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(w[:, 2], 0.0)
    np.testing.assert_array_equal(out[:, 2], 0.0)
    grads = scaled_dot_product_attention_backward(np.ones_like(out), q, k, v, w)
    assert not any(np.isnan(g).any() for g in grads)


def test_mask_changes_only_what_it_should(rng):
    q, k, v = _qkv(rng, t_q=3, t_k=3)
    ids = np.array([[4, 9, 0], [3, 0, 0]])
    out, w = scaled_dot_product_attention(q, k, v, padding_mask(ids, 0))
    ref, _ = scaled_dot_product_attention(q[1:, :, :], k[1:, :1], v[1:, :1])
    np.testing.assert_allclose(out[1:], ref)
    assert np.all(w[0, :, 2] == 0)


@given(st.integers(0, 2**32 - 1))
def test_self_attention_is_permutation_equivariant(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 4))
    perm = rng.permutation(6)
    out, _ = scaled_dot_product_attention(x, x, x)
    shuffled, _ = scaled_dot_product_attention(x[perm], x[perm], x[perm])
    np.testing.assert_allclose(shuffled, out[perm], atol=1e-12)


@given(st.integers(0, 2**32 - 1), st.integers(0, 5))
def test_causal_output_ignores_the_future(seed, t):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 4))
    changed = x.copy()
    changed[t + 1 :] = rng.standard_normal((5 - t, 4))
    mask = causal_mask(6)
    a, _ = scaled_dot_product_attention(x, x, x, mask)
    b, _ = scaled_dot_product_attention(changed, changed, changed, mask)
    np.testing.assert_allclose(a[: t + 1], b[: t + 1], atol=1e-12)


def test_scale_argument(rng):
    q, k, v = _qkv(rng)
    _, w1 = scaled_dot_product_attention(q, k, v, scale=1.0)
    _, w2 = scaled_dot_product_attention(q * np.sqrt(3), k, v)
    np.testing.assert_allclose(w1, w2)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_backward_matches_finite_differences(rng, masked, scale):
    q, k, v = _qkv(rng, batch=(2, 2))
    mask = causal_mask(4, 5) if masked else None
    out, w = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    g = rng.standard_normal(out.shape)
    grads = scaled_dot_product_attention_backward(g, q, k, v, w, scale=scale)

    def loss():
        return scaled_dot_product_attention(q, k, v, mask, scale=scale)[0] * g

    for analytic, x in zip(grads, (q, k, v), strict=True):
        assert max_relative_error(analytic, numerical_gradient(loss, x)) < 1e-6


def test_backward_sums_over_broadcast_batch_axes(rng):
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 1, 6, 5))
    v = rng.standard_normal((1, 1, 6, 2))
    out, w = scaled_dot_product_attention(q, k, v)
    g = rng.standard_normal(out.shape)
    grads = scaled_dot_product_attention_backward(g, q, k, v, w)
    assert [x.shape for x in grads] == [q.shape, k.shape, v.shape]

    def loss():
        return scaled_dot_product_attention(q, k, v)[0] * g

    for analytic, x in zip(grads, (q, k, v), strict=True):
        assert max_relative_error(analytic, numerical_gradient(loss, x)) < 1e-6


def test_unscaled_scores_saturate_softmax(rng):
    d_k = 512
    q = rng.standard_normal((200, d_k))
    k = rng.standard_normal((10, d_k))
    _, scaled = scaled_dot_product_attention(q, k, k)
    _, unscaled = scaled_dot_product_attention(q, k, k, scale=1.0)
    assert np.median(unscaled.max(-1)) > 0.99
    assert np.median(scaled.max(-1)) < 0.9


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "words"),
    [
        ((np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 3))), {}, ValueError, "same last"),
        ((np.ones((2, 3)), np.ones((4, 3)), np.ones((5, 3))), {}, ValueError, "number of keys"),
        ((np.ones(3), np.ones((2, 3)), np.ones((2, 3))), {}, ValueError, "q must have at least"),
        (
            (np.ones((2, 2, 3)), np.ones((3, 2, 3)), np.ones((3, 2, 3))),
            {},
            ValueError,
            "must broadcast",
        ),
        (
            (np.ones((2, 3), np.float32), np.ones((2, 3)), np.ones((2, 3))),
            {},
            TypeError,
            "share one dtype",
        ),
        (
            (np.ones((2, 3)),) * 3,
            {"mask": np.ones((2, 2))},
            TypeError,
            "mask must be a boolean",
        ),
        (
            (np.ones((2, 3)),) * 3,
            {"mask": np.ones((3, 2), bool)},
            ValueError,
            "does not broadcast",
        ),
        (
            (np.ones((2, 3)),) * 3,
            {"mask": np.ones((4, 2, 2), bool)},
            ValueError,
            "does not broadcast",
        ),
        ((np.ones((2, 3)),) * 3, {"scale": "big"}, TypeError, "scale must be a number"),
        ((np.ones((2, 3)),) * 3, {"scale": float("nan")}, ValueError, "scale must be finite"),
        (
            (np.array([[np.nan, 1.0]]), np.ones((2, 2)), np.ones((2, 2))),
            {},
            ValueError,
            "check q and k for NaN",
        ),
        ((np.array([["a"]]),) * 3, {}, TypeError, "q must be a real"),
    ],
)
def test_bad_input_is_named(args, kwargs, error, words):
    with pytest.raises(error) as info:
        scaled_dot_product_attention(*args, **kwargs)
    assert words in str(info.value)


def test_backward_rejects_wrong_gradient_shape(rng):
    q, k, v = _qkv(rng)
    out, w = scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="grad_output must have the output shape"):
        scaled_dot_product_attention_backward(out[..., :1], q, k, v, w)
    with pytest.raises(ValueError, match="weights must have the shape"):
        scaled_dot_product_attention_backward(out, q, k, v, w[..., :1])


def test_cross_attention_rows_sum_to_one(rng):
    q, k, v = _qkv(rng, t_q=3, t_k=5, d_k=4, d_v=6)
    out, w = scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 6)
    assert w.shape == (2, 3, 5)
    np.testing.assert_allclose(w.sum(-1), 1.0)


def test_a_key_masked_for_every_query_gets_zero_gradient(rng):
    q, k, v = _qkv(rng)
    ids = np.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    mask = padding_mask(ids, 0)  # (B, 1, T_k): keys 3 and 4 of sequence 0 are padding
    out, w = scaled_dot_product_attention(q, k, v, mask)
    _, grad_k, grad_v = scaled_dot_product_attention_backward(
        rng.standard_normal(out.shape), q, k, v, w
    )
    np.testing.assert_array_equal(grad_k[0, 3:], 0.0)
    np.testing.assert_array_equal(grad_v[0, 3:], 0.0)
    assert np.abs(grad_k[1, 3:]).min() > 0


def test_backward_rejects_mixed_dtypes(rng):
    q, k, v = _qkv(rng)
    out, w = scaled_dot_product_attention(q, k, v)
    with pytest.raises(TypeError, match="must share one dtype"):
        scaled_dot_product_attention_backward(out.astype(np.float32), q, k, v, w)
