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
    flash_attention_backward_io,
    flash_attention_io,
    flash_block_sizes,
    linear_attention,
    linear_attention_backward,
    standard_attention_backward_io,
    standard_attention_io,
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


# ------------------------------------------------- memory traffic (Theorem 2)
def test_block_sizes_follow_algorithm_1():
    assert flash_block_sizes(16, 2) == (2, 2)  # B_c = ceil(16 / 8) = 2, B_r = min(2, 2)
    assert flash_block_sizes(100, 4) == (4, 7)  # B_c = ceil(100 / 16) = 7, B_r = min(7, 4)
    assert flash_block_sizes(4, 4) == (1, 1)  # the smallest M the theorem allows, M = d


def test_standard_traffic_counted_by_hand(rng):
    q, k, v = _qkv(rng, batch=(), t_q=6, t_k=5, d_k=2, d_v=3)
    out, _, traffic = standard_attention_io(q, k, v)
    # reads: Q 6*2, K 5*2, V 5*3, S and P 6*5 each; writes: S, P 6*5 each, O 6*3
    assert traffic.reads == {"Q": 12, "K": 10, "V": 15, "S": 30, "P": 30, "O": 0}
    assert traffic.writes == {"Q": 0, "K": 0, "V": 0, "S": 30, "P": 30, "O": 18}
    assert traffic.total == 175
    assert traffic.matmul_flops == 2 * 6 * 5 * 2 + 2 * 6 * 3 * 5  # Q K^T, P V
    assert traffic.other_flops == 6 * 30  # scale, max, subtract, exp, sum, divide
    expected, _ = scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-15)


def test_flash_traffic_counted_by_hand(rng):
    """N_q = 6, N_k = 5, d_k = 2, d_v = 3, M = 16: B_r = B_c = 2, so 3 key blocks (2, 2, 1)."""
    q, k, v = _qkv(rng, batch=(), t_q=6, t_k=5, d_k=2, d_v=3)
    out, _, traffic = flash_attention_io(q, k, v, 16)
    # K, V once; Q, O, l, m once per key block (3 passes); O, l, m written at initialization
    # and once per pass
    assert traffic.reads == {"Q": 3 * 12, "K": 10, "V": 15, "O": 3 * 18, "l": 3 * 6, "m": 3 * 6}
    assert traffic.writes == {"Q": 0, "K": 0, "V": 0, "O": 4 * 18, "l": 4 * 6, "m": 4 * 6}
    assert traffic.total == 5 * (2 + 3) + 6 * (3 + 2) + 3 * 6 * (2 + 2 * 3 + 4)  # the docstring's
    assert traffic.matmul_flops == standard_attention_io(q, k, v)[2].matmul_flops
    expected, _ = scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-15)


def test_counts_grow_with_the_batch(rng):
    q, k, v = _qkv(rng, batch=(2, 3), t_q=6, t_k=5, d_k=2, d_v=3)
    assert standard_attention_io(q, k, v)[2].total == 6 * 175
    assert flash_attention_io(q, k, v, 16)[2].total == 6 * 271


@given(seeds, st.integers(1, 9), st.integers(1, 9), st.integers(2, 40))
def test_flash_io_equals_attention(seed, t_q, t_k, fast_memory):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, t_q=t_q, t_k=t_k, d_k=2)
    expected, _ = scaled_dot_product_attention(q, k, v)
    out, _, _ = flash_attention_io(q, k, v, fast_memory)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(standard_attention_io(q, k, v)[0], expected, rtol=1e-13, atol=1e-15)


def test_flash_traffic_falls_like_one_over_m_and_standard_does_not_move(rng):
    """Theorem 2: the ratio of standard to tiled traffic grows in proportion to M."""
    n, d = 256, 8
    q, k, v = _qkv(rng, batch=(), t_q=n, t_k=n, d_k=d, d_v=d)
    standard = standard_attention_io(q, k, v)[2].total
    assert standard == 4 * n * n + 4 * n * d
    memories = np.array([128, 256, 512, 1024, 2048])  # d^2 to N d
    tiled = np.array([flash_attention_io(q, k, v, int(m))[2].total for m in memories])
    ratio = standard / tiled
    assert np.all(np.diff(ratio) > 0)  # more fast memory, fewer elements moved
    doubling = ratio[1:] / ratio[:-1]  # M doubles each step
    assert np.all((doubling > 1.7) & (doubling < 2.0))  # nearly doubles; the Nd terms lag
    constant = tiled * memories / (n * n * d * d)  # the constant hidden by Theta
    assert constant.max() / constant.min() < 1.5


def test_flash_traffic_grows_like_n_squared_at_fixed_memory(rng):
    d, memory = 4, 64
    totals = []
    for n in (64, 128, 256):
        q, k, v = _qkv(rng, batch=(), t_q=n, t_k=n, d_k=d, d_v=d)
        totals.append(flash_attention_io(q, k, v, memory)[2].total)
    growth = np.array(totals[1:]) / np.array(totals[:-1])
    assert np.all((growth > 3.5) & (growth < 4.0))  # N doubles, traffic nearly quadruples


def _backward_case(rng, batch=()):
    q, k, v = _qkv(rng, batch=batch, t_q=6, t_k=5, d_k=2, d_v=3)
    grad = rng.standard_normal((*batch, 6, 3))
    out, weights = scaled_dot_product_attention(q, k, v)
    expected = scaled_dot_product_attention_backward(grad, q, k, v, weights, out)
    return q, k, v, grad, expected


def test_standard_backward_traffic_counted_by_hand(rng):
    q, k, v, grad, expected = _backward_case(rng)
    _, weights, _ = standard_attention_io(q, k, v)
    grads, traffic = standard_attention_backward_io(grad, q, k, v, weights)
    # P read for dV and for dS; dP written, read; dS written, read for dQ and for dK
    assert traffic.reads == {
        "Q": 12, "K": 10, "V": 15, "dO": 2 * 18, "P": 2 * 30, "dP": 30, "dS": 2 * 30,
        "dQ": 0, "dK": 0, "dV": 0,
    }  # fmt: skip
    assert traffic.writes == {
        "Q": 0, "K": 0, "V": 0, "dO": 0, "P": 0, "dP": 30, "dS": 30, "dQ": 12, "dK": 10, "dV": 15,
    }  # fmt: skip
    # P^T dO (5x3, inner 6), dO V^T (6x5, inner 3), dS K (6x2, inner 5), dS^T Q (5x2, inner 6)
    assert traffic.matmul_flops == 2 * (15 * 6 + 30 * 3 + 12 * 5 + 10 * 6)
    for ours, theirs in zip(grads, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)


def test_flash_backward_traffic_counted_by_hand(rng):
    """M = 16: B_r = B_c = 2, three key blocks (2, 2, 1), three query blocks."""
    q, k, v, grad, expected = _backward_case(rng)
    out, statistics, _ = flash_attention_io(q, k, v, 16)
    grads, traffic = flash_attention_backward_io(grad, q, k, v, out, statistics, 16)
    passes = 3  # every key block reads all the query-side blocks once
    assert traffic.reads == {
        "Q": passes * 12, "K": 10, "V": 15, "O": passes * 18, "dO": passes * 18,
        "l": passes * 6, "m": passes * 6, "dQ": passes * 12, "dK": 0, "dV": 0,
    }  # fmt: skip
    assert traffic.writes == {
        "Q": 0, "K": 0, "V": 0, "O": 0, "dO": 0, "l": 0, "m": 0,
        "dQ": 12 + passes * 12, "dK": 2 * 10, "dV": 2 * 15,
    }  # fmt: skip
    assert traffic.total == 6 * 2 + 3 * 5 * 5 + passes * 6 * (3 * 2 + 2 * 3 + 2)  # the docstring's
    # the standard backward's four products, and the scores recomputed: Q K^T (6x5, inner 2)
    standard = standard_attention_backward_io(grad, q, k, v, standard_attention_io(q, k, v)[1])
    assert traffic.matmul_flops == standard[1].matmul_flops + 2 * 30 * 2
    for ours, theirs in zip(grads, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)


@given(seeds, st.integers(2, 40))
def test_flash_backward_equals_attention_backward(seed, fast_memory):
    rng = np.random.default_rng(seed)
    q, k, v, grad, expected = _backward_case(rng, batch=(2,))
    out, statistics, _ = flash_attention_io(q, k, v, fast_memory)
    grads, _ = flash_attention_backward_io(grad, q, k, v, out, statistics, fast_memory)
    for ours, theirs in zip(grads, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-11, atol=1e-13)


def test_training_flops_rise_while_traffic_falls(rng):
    """Forward plus backward: one more product per block pair, far fewer elements moved."""
    n, d, memory = 256, 8, 2048
    q, k, v = _qkv(rng, batch=(), t_q=n, t_k=n, d_k=d, d_v=d)
    grad = rng.standard_normal((n, d))
    _, weights, forward = standard_attention_io(q, k, v)
    _, backward = standard_attention_backward_io(grad, q, k, v, weights)
    out_f, statistics, forward_f = flash_attention_io(q, k, v, memory)
    _, backward_f = flash_attention_backward_io(grad, q, k, v, out_f, statistics, memory)
    matmuls = (forward_f.matmul_flops + backward_f.matmul_flops) / (
        forward.matmul_flops + backward.matmul_flops
    )
    assert matmuls == pytest.approx(14 / 12)  # 4 + 10 against 4 + 8 products of 2 N^2 d
    flops = (forward_f.flops + backward_f.flops) / (forward.flops + backward.flops)
    assert 1.05 < flops < 1.3
    assert (forward.total + backward.total) / (forward_f.total + backward_f.total) > 5


def test_flash_io_keeps_float32(rng):
    q, k, v = _qkv(rng, dtype=np.float32)
    out, statistics, _ = flash_attention_io(q, k, v, 8)
    assert out.dtype == statistics[0].dtype == statistics[1].dtype == np.float32
    out_s, weights, _ = standard_attention_io(q, k, v)
    assert out_s.dtype == weights.dtype == np.float32
    grad = np.ones_like(out)
    for grads, _ in (
        flash_attention_backward_io(grad, q, k, v, out, statistics, 8),
        standard_attention_backward_io(grad, q, k, v, weights),
    ):
        assert all(g.dtype == np.float32 for g in grads)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda q: flash_attention_io(q, q, q, 1), ValueError, "fast_memory must be at least"),
        (lambda q: flash_attention_io(q, q, q, 8.0), TypeError, "fast_memory must be a positive"),
        (lambda q: flash_attention_io(q, q[:1], q[:1], 8), ValueError, "same leading"),
        (lambda q: standard_attention_io(q, q[..., :1], q), ValueError, "last dimension"),
        (lambda q: flash_block_sizes(8, 0), ValueError, "d must be a positive"),
        (
            lambda q: standard_attention_backward_io(q, q, q, q, np.ones((2, 4, 3))),
            ValueError,
            "weights must have the shape (2, 4, 4)",
        ),
        (
            lambda q: flash_attention_backward_io(q[:, :1], q, q, q, q, (q[..., 0],) * 2, 8),
            ValueError,
            "grad_output must have",
        ),
        (
            lambda q: flash_attention_backward_io(q, q, q, q, q, q[..., 0], 8),
            TypeError,
            "statistics must be the tuple (l, m)",
        ),
    ],
)
def test_bad_io_input_is_named(call, error, words):
    q = np.ones((2, 4, 2))
    with pytest.raises(error) as info:
        call(q)
    assert words in str(info.value)
