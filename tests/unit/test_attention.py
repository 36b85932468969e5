"""Scaled dot-product attention: values, masking, row independence, dropout, backward, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
)
from tinyformer.functional import _UNSHIFTED
from tinyformer.gradcheck import max_relative_error, numerical_gradient
from tinyformer.masks import causal_mask, padding_mask

seeds = st.integers(0, 2**32 - 1)
dtypes = st.sampled_from([np.float32, np.float64])


def _qkv(rng, batch=(2,), t_q=4, t_k=5, d_k=3, d_v=2, dtype=np.float64):
    q = rng.standard_normal((*batch, t_q, d_k)).astype(dtype)
    k = rng.standard_normal((*batch, t_k, d_k)).astype(dtype)
    v = rng.standard_normal((*batch, t_k, d_v)).astype(dtype)
    return q, k, v


def _formula(q, k, v, mask=None, scale=None):
    """Attention written out in float64 from its definition, independently of the package."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("...qd,...kd->...qk", q, k) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total == 0, 1.0, total)
    return np.einsum("...qk,...kv->...qv", weights, v), weights


# --------------------------------------------------------------------- values
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_the_formula_written_out_with_heads_and_cross_shapes(rng, dtype):
    # batch and head axes, more keys than queries, d_v != d_k: every axis has its own size
    q, k, v = _qkv(rng, batch=(2, 3), t_q=4, t_k=6, d_k=8, d_v=5, dtype=dtype)
    out, w = scaled_dot_product_attention(q, k, v)
    expected_out, expected_w = _formula(q, k, v)
    assert out.dtype == w.dtype == dtype
    tolerance = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(w, expected_w, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(out, expected_out, rtol=tolerance, atol=tolerance)


@given(seeds)
def test_masked_keys_get_exactly_zero_weight(seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng)
    mask = rng.random((2, 4, 5)) < 0.6
    mask[:, :, 0] = True
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert np.all(w[~mask] == 0.0)
    np.testing.assert_allclose(w.sum(-1), 1.0)
    np.testing.assert_allclose(out, _formula(q, k, v, mask)[0], rtol=1e-13, atol=1e-14)


def test_fully_masked_row_gives_zeros_not_nan(rng):
    q, k, v = _qkv(rng)
    mask = np.ones((4, 5), bool)
    mask[2] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(w[:, 2], 0.0)
    np.testing.assert_array_equal(out[:, 2], 0.0)
    grads = scaled_dot_product_attention_backward(np.ones_like(out), q, k, v, w, out)
    assert all(np.isfinite(g).all() for g in grads)
    np.testing.assert_array_equal(grads[0][:, 2], 0.0)  # the empty query gets no gradient


def test_padding_keys_are_as_if_absent(rng):
    q, k, v = _qkv(rng, t_q=3, t_k=3)
    ids = np.array([[4, 9, 0], [3, 0, 0]])
    out, w = scaled_dot_product_attention(q, k, v, padding_mask(ids, 0))
    short, _ = scaled_dot_product_attention(q[1:], k[1:, :1], v[1:, :1])
    np.testing.assert_allclose(out[1:], short, rtol=1e-15)
    np.testing.assert_array_equal(out[1], np.broadcast_to(v[1, 0], (3, 2)))  # one key: its value
    assert np.all(w[0, :, 2] == 0)


@given(seeds)
def test_self_attention_is_permutation_equivariant(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 4))
    perm = rng.permutation(6)
    out, _ = scaled_dot_product_attention(x, x, x)
    shuffled, _ = scaled_dot_product_attention(x[perm], x[perm], x[perm])
    np.testing.assert_allclose(shuffled, out[perm], atol=1e-12)


def test_scale_none_means_one_over_sqrt_d_k_and_scale_one_removes_it(rng):
    q, k, v = _qkv(rng, d_k=4)
    _, default = scaled_dot_product_attention(q, k, v)
    _, explicit = scaled_dot_product_attention(q, k, v, scale=0.5)
    np.testing.assert_array_equal(default, explicit)  # 1/sqrt(4) = 0.5: the same computation
    _, unscaled = scaled_dot_product_attention(q, k, v, scale=1.0)
    np.testing.assert_allclose(unscaled, _formula(q, k, v, scale=1.0)[1], rtol=1e-14)
    assert np.abs(unscaled - default).max() > 0.01


def test_unscaled_scores_saturate_softmax(rng):
    d_k = 512
    q = rng.standard_normal((200, d_k))
    k = rng.standard_normal((10, d_k))
    _, scaled = scaled_dot_product_attention(q, k, k)
    _, unscaled = scaled_dot_product_attention(q, k, k, scale=1.0)
    assert np.median(unscaled.max(-1)) > 0.99
    assert np.median(scaled.max(-1)) < 0.9


# ---------------------------------------------------------- row independence
def _sizes(rng, dtype):
    """Queries, keys and values whose sequences have scores of very different sizes.

    Each sequence is multiplied by 1, 30 or 100, so in one batch some rows of scores
    lie where the softmax needs no shift and others far beyond it.
    """
    b, h, t, d = (int(n) for n in rng.integers([2, 1, 1, 1], [5, 4, 8, 6]))
    factors = rng.choice([1.0, 30.0, 100.0], size=(b, 1, 1, 1))
    q, k, v = (rng.standard_normal((b, h, t, d)) * factors for _ in range(3))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


@given(seeds, dtypes, st.booleans())
def test_each_sequence_is_bitwise_independent_of_the_rest_of_the_batch(seed, dtype, masked):
    rng = np.random.default_rng(seed)
    q, k, v = _sizes(rng, dtype)
    b, _, t, _ = q.shape
    mask = causal_mask(t) if masked else None
    out, w = scaled_dot_product_attention(q, k, v, mask)
    other = int(rng.integers(b))  # replace one sequence by one with scores 100 times larger
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[other] = (100 * rng.standard_normal(a.shape[1:])).astype(dtype)
    out2, w2 = scaled_dot_product_attention(q2, k2, v2, mask)
    rest = np.arange(b) != other
    assert np.array_equal(out2[rest], out[rest])
    assert np.array_equal(w2[rest], w[rest])


@given(seeds, dtypes, st.integers(1, 3))
def test_under_a_causal_mask_earlier_positions_ignore_later_tokens_bitwise(seed, dtype, n_new):
    rng = np.random.default_rng(seed)
    q, k, v = _sizes(rng, dtype)
    t = q.shape[2]
    first = max(t - n_new, 0)  # positions first.. get new queries, keys and values
    out, w = scaled_dot_product_attention(q, k, v, causal_mask(t))
    for a in (q, k, v):
        a[..., first:, :] = (100 * rng.standard_normal(a[..., first:, :].shape)).astype(dtype)
    out2, w2 = scaled_dot_product_attention(q, k, v, causal_mask(t))
    assert np.array_equal(out2[..., :first, :], out[..., :first, :])
    assert np.array_equal(w2[..., :first, :], w[..., :first, :])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_that_need_a_shift_and_rows_that_do_not_share_a_batch(rng, dtype):
    # the case the row independence tests are about: one tensor holding both kinds of rows
    q, k, v = _qkv(rng, batch=(2,), t_q=5, t_k=5, d_k=4, d_v=3, dtype=dtype)
    q[1] *= 100
    k[1] *= 100
    scores = q @ np.swapaxes(k, -1, -2) / 2
    low, high = _UNSHIFTED[np.dtype(dtype)]
    row_max = scores.max(axis=-1)
    assert ((row_max >= low) & (row_max <= high))[0].all()  # sequence 0: no shift needed
    assert (row_max > high)[1].any()  # sequence 1: some rows overflow without a shift
    out, w = scaled_dot_product_attention(q, k, v)
    expected_out, expected_w = _formula(q, k, v)
    tolerance = 2e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(w, expected_w, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(out, expected_out, rtol=tolerance, atol=tolerance)


def test_a_float32_sequence_keeps_its_accuracy_beside_one_with_far_larger_scores(rng):
    q, k, v = _qkv(rng, batch=(2, 2), t_q=6, t_k=6, d_k=8, d_v=8, dtype=np.float32)
    tame, _ = scaled_dot_product_attention(q, k, v)
    q[1] += 10  # sequence 1's scores now sit about 85 higher: past float32's unshifted range
    k[1] += 3
    scores = q[1] @ np.swapaxes(k[1], -1, -2) / np.sqrt(8)
    assert scores.max(axis=-1).min() > _UNSHIFTED[np.dtype(np.float32)][1]  # every row shifts
    beside_high, _ = scaled_dot_product_attention(q, k, v)
    assert np.array_equal(beside_high[0], tame[0])  # sequence 0: the same bits as before
    expected, _ = _formula(q[0], k[0], v[0])
    error = np.abs(beside_high[0] - expected).max() / np.abs(expected).max()
    assert error < 1e-6, error  # float32 rounding alone: about 1e-7


# ------------------------------------------------------------------- dropout
def _keep(rng, shape, p, dtype=np.float64):
    """A dropout multiplier as ``Dropout.mask`` draws it: 0 or 1/(1-p)."""
    return ((rng.random(shape) >= p) / (1 - p)).astype(dtype)


def test_keep_multiplies_the_weights_and_the_returned_weights_are_before_dropout(rng):
    q, k, v = _qkv(rng, batch=(2, 2))
    keep = _keep(rng, (2, 2, 4, 5), 0.4)
    out, w = scaled_dot_product_attention(q, k, v, causal_mask(4, 5), keep=keep)
    _, expected_w = _formula(q, k, v, causal_mask(4, 5))
    np.testing.assert_allclose(w, expected_w, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(out, (expected_w * keep) @ v, rtol=1e-13, atol=1e-14)
    ones, _ = scaled_dot_product_attention(q, k, v, keep=np.ones((4, 5)))
    assert np.array_equal(ones, scaled_dot_product_attention(q, k, v)[0])


# ------------------------------------------------------------------ backward
@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_backward_matches_finite_differences(rng, masked, scale, dropout):
    q, k, v = _qkv(rng, batch=(2, 2))
    mask = causal_mask(4, 5) if masked else None
    keep = _keep(rng, (2, 2, 4, 5), 0.3) if dropout else None
    options = {"scale": scale, "keep": keep}
    out, w = scaled_dot_product_attention(q, k, v, mask, **options)
    g = rng.standard_normal(out.shape)
    grads = scaled_dot_product_attention_backward(g, q, k, v, w, out, **options)

    def loss():
        return scaled_dot_product_attention(q, k, v, mask, **options)[0] * g

    for analytic, x in zip(grads, (q, k, v), strict=True):
        assert max_relative_error(analytic, numerical_gradient(loss, x)) < 1e-6


def test_backward_with_a_broadcast_keep_and_broadcast_batch_axes(rng):
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 1, 6, 5))
    v = rng.standard_normal((1, 1, 6, 2))
    keep = _keep(rng, (1, 3, 4, 6), 0.25)  # one mask shared by the batch
    out, w = scaled_dot_product_attention(q, k, v, keep=keep)
    g = rng.standard_normal(out.shape)
    grads = scaled_dot_product_attention_backward(g, q, k, v, w, out, keep=keep)
    assert [x.shape for x in grads] == [q.shape, k.shape, v.shape]

    def loss():
        return scaled_dot_product_attention(q, k, v, keep=keep)[0] * g

    for analytic, x in zip(grads, (q, k, v), strict=True):
        assert max_relative_error(analytic, numerical_gradient(loss, x)) < 1e-6


def test_backward_softmax_term_matches_the_full_jacobian_product(rng):
    # rowsum(A * dA) = rowsum(G * O): the backward pass uses the right side
    q, k, v = _qkv(rng, batch=(1,), t_q=3, t_k=4, d_k=2, d_v=3)
    out, w = scaled_dot_product_attention(q, k, v, scale=1.0)
    g = rng.standard_normal(out.shape)
    grad_q, _, _ = scaled_dot_product_attention_backward(g, q, k, v, w, out, scale=1.0)
    grad_w = g @ np.swapaxes(v, -1, -2)  # (1, T_q, T_k)
    jacobians = [np.diag(row) - np.outer(row, row) for row in w[0]]  # softmax Jacobian per row
    grad_s = np.stack([jac @ gw for jac, gw in zip(jacobians, grad_w[0], strict=True)])[None]
    np.testing.assert_allclose(grad_q, grad_s @ k, rtol=1e-12, atol=1e-14)


def test_a_key_masked_for_every_query_gets_zero_gradient(rng):
    q, k, v = _qkv(rng)
    ids = np.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    mask = padding_mask(ids, 0)  # (B, 1, T_k): keys 3 and 4 of sequence 0 are padding
    out, w = scaled_dot_product_attention(q, k, v, mask)
    _, grad_k, grad_v = scaled_dot_product_attention_backward(
        rng.standard_normal(out.shape), q, k, v, w, out
    )
    np.testing.assert_array_equal(grad_k[0, 3:], 0.0)
    np.testing.assert_array_equal(grad_v[0, 3:], 0.0)
    assert np.abs(grad_k[1, 3:]).min() > 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_keeps_the_dtype_and_agrees_with_float64(rng, dtype):
    q, k, v = _qkv(rng, batch=(2, 2))
    g = rng.standard_normal((2, 2, 4, 2))
    out, w = scaled_dot_product_attention(q, k, v)
    expected = scaled_dot_product_attention_backward(g, q, k, v, w, out)
    low = [a.astype(dtype) for a in (g, q, k, v)]
    out32, w32 = scaled_dot_product_attention(*low[1:])
    grads = scaled_dot_product_attention_backward(low[0], *low[1:], w32, out32)
    for got, want in zip(grads, expected, strict=True):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 if dtype == np.float32 else 0)


# ----------------------------------------------------------------- reference
@pytest.mark.reference
def test_forward_and_backward_agree_with_torch(rng, torch):
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
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    grads = scaled_dot_product_attention_backward(g, q, k, v, weights, out)
    np.testing.assert_allclose(out, out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    for ours, theirs in zip(grads, (qt, kt, vt), strict=True):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------- bad input
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
        ((np.ones((2, 3)),) * 3, {"mask": np.ones((2, 2))}, TypeError, "mask must be a boolean"),
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
        ((np.ones((2, 3)),) * 3, {"scale": True}, TypeError, "scale must be a number"),
        ((np.ones((2, 3)),) * 3, {"scale": float("nan")}, ValueError, "scale must be finite"),
        (
            (np.ones((2, 3)),) * 3,
            {"keep": np.ones((2, 2), np.float32)},
            TypeError,
            "keep must have the dtype float64",
        ),
        ((np.ones((2, 3)),) * 3, {"keep": np.ones((3, 2))}, ValueError, "keep of shape (3, 2)"),
        ((np.ones((2, 3)),) * 3, {"keep": np.ones((2, 2, 2))}, ValueError, "does not broadcast"),
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


def test_backward_rejects_arrays_that_do_not_fit(rng):
    q, k, v = _qkv(rng)
    out, w = scaled_dot_product_attention(q, k, v)
    backward = scaled_dot_product_attention_backward
    with pytest.raises(ValueError, match=r"grad_output must have the shape \(2, 4, 2\)"):
        backward(out[..., :1], q, k, v, w, out)
    with pytest.raises(ValueError, match=r"weights must have the shape \(2, 4, 5\)"):
        backward(out, q, k, v, w[..., :1], out)
    with pytest.raises(ValueError, match=r"output must have the shape \(2, 4, 2\)"):
        backward(out, q, k, v, w, out[:1])
    with pytest.raises(TypeError, match="must share one dtype"):
        backward(out.astype(np.float32), q, k, v, w, out)
    with pytest.raises(ValueError, match="keep of shape"):
        backward(out, q, k, v, w, out, keep=np.ones((3, 3)))
