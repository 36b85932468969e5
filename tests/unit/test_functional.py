"""Softmax, log-softmax and the activations: values, derivatives, dtypes, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tinyformer import functional as F
from tinyformer.gradcheck import max_relative_error, numerical_gradient

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)


@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 9)), elements=finite))
def test_softmax_rows_are_distributions(x):
    y = F.softmax(x)
    assert np.all(y >= 0)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-12)


@given(arrays(np.float64, st.integers(1, 9), elements=finite), st.floats(-1e4, 1e4))
def test_softmax_ignores_a_constant_shift(x, c):
    np.testing.assert_allclose(F.softmax(x + c), F.softmax(x), atol=1e-9)


def test_softmax_survives_huge_inputs_where_the_naive_formula_overflows():
    x = np.array([1e4, 1e4 - 1.0, 0.0])
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(x) / np.exp(x).sum()
    assert np.isnan(naive).any()
    expected = np.array([1.0, math.exp(-1.0), 0.0]) / (1.0 + math.exp(-1.0))
    np.testing.assert_allclose(F.softmax(x), expected, rtol=1e-15, atol=1e-300)


def test_softmax_gives_zero_weight_to_minus_infinity_and_zeros_for_empty_rows():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    y = F.softmax(x)
    assert y[0, 1] == 0.0
    np.testing.assert_array_equal(y[1], 0.0)
    assert not np.isnan(y).any()


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_along_any_axis(rng, axis):
    x = rng.standard_normal((3, 4))
    np.testing.assert_allclose(F.softmax(x, axis=axis).sum(axis=axis), 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "fn",
    [F.softmax, F.log_softmax, F.relu, F.relu_grad, F.gelu, F.gelu_grad, F.silu, F.silu_grad],
)
def test_functions_keep_the_input_dtype(rng, fn, dtype):
    x = rng.standard_normal((2, 5)).astype(dtype)
    assert fn(x).dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_gelu_keeps_dtype(rng, dtype):
    x = rng.standard_normal(7).astype(dtype)
    assert F.gelu(x, "tanh").dtype == dtype
    assert F.gelu_grad(x, "tanh").dtype == dtype


def test_log_softmax_matches_log_of_softmax_and_is_stable(rng):
    x = rng.standard_normal((4, 6)) * 3
    np.testing.assert_allclose(F.log_softmax(x), np.log(F.softmax(x)), atol=1e-12)
    big = np.array([1e4, 0.0])
    np.testing.assert_allclose(F.log_softmax(big), [0.0, -1e4])


def _check_vjp(forward, backward, x, rng):
    g = rng.standard_normal(x.shape)
    y = forward(x)
    analytic = backward(g, y)
    numeric = numerical_gradient(lambda: forward(x) * g, x)
    assert max_relative_error(analytic, numeric) < 1e-6


def test_softmax_backward_matches_finite_differences(rng):
    x = rng.standard_normal((3, 5))
    _check_vjp(F.softmax, F.softmax_backward, x, rng)


def test_softmax_backward_along_axis_zero(rng):
    x = rng.standard_normal((4, 3))
    _check_vjp(
        lambda a: F.softmax(a, axis=0), lambda g, y: F.softmax_backward(g, y, axis=0), x, rng
    )


def test_log_softmax_backward_matches_finite_differences(rng):
    x = rng.standard_normal((3, 5))
    _check_vjp(F.log_softmax, F.log_softmax_backward, x, rng)


@pytest.mark.parametrize(
    ("fn", "grad"),
    [
        (F.relu, F.relu_grad),
        (F.gelu, F.gelu_grad),
        (lambda x: F.gelu(x, "tanh"), lambda x: F.gelu_grad(x, "tanh")),
        (F.silu, F.silu_grad),
    ],
    ids=["relu", "gelu", "gelu-tanh", "silu"],
)
def test_activation_derivatives_match_finite_differences(rng, fn, grad):
    x = rng.standard_normal(40) * 3
    x = x[np.abs(x) > 1e-2]  # ReLU has a kink at zero
    numeric = numerical_gradient(lambda: float(fn(x).sum()), x)
    assert max_relative_error(grad(x), numeric) < 1e-6


def test_gelu_exact_matches_the_normal_cdf():
    # x * Phi(x) with Phi from math.erfc, which keeps its relative accuracy in the far
    # left tail; GELU forms Phi as (1 + erf) / 2 (as PyTorch does), so there it is
    # accurate in absolute terms (a few 1e-16 of |x|), everywhere else to rounding.
    xs = np.concatenate([np.linspace(-9, 9, 1801), [0.0, -0.0, 1e-300, -1e-8, 40.0, -40.0]])
    expected = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in xs])
    got = F.gelu(xs)
    assert np.all(np.abs(got - expected) <= 5e-16 * np.maximum(1.0, np.abs(xs)))
    central = xs >= -2
    np.testing.assert_allclose(got[central], expected[central], rtol=2e-15, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exact_gelu_keeps_dtype_and_accuracy(dtype):
    xs = np.linspace(-9, 9, 3601)
    for forward in (F.gelu, F.gelu_grad):
        got = forward(xs.astype(dtype))
        assert got.dtype == dtype
        tolerance = 1e-6 if dtype == np.float32 else 1e-15
        np.testing.assert_allclose(got, forward(xs), rtol=0, atol=tolerance * 9)


def test_gelu_tanh_is_close_to_exact():
    xs = np.linspace(-5, 5, 201)
    assert np.abs(F.gelu(xs, "tanh") - F.gelu(xs)).max() < 1e-3


def test_silu_does_not_overflow_for_large_negative_input():
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = F.silu(np.array([-1e4, 1e4]))
    np.testing.assert_allclose(y, [0.0, 1e4])


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: F.softmax(np.array([1.0, np.nan])), ValueError, "x must not contain NaN"),
        (lambda: F.softmax(np.array([1.0, np.inf])), ValueError, "+inf"),
        (lambda: F.softmax(np.array(["a", "b"])), TypeError, "x must be a real"),
        (lambda: F.softmax(np.ones(3) + 1j), TypeError, "complex"),
        (lambda: F.softmax(np.float64(1.0)), ValueError, "at least 1 dimensions"),
        (lambda: F.softmax(np.ones((2, 3)), axis=2), ValueError, "axis must be in"),
        (lambda: F.softmax(np.ones(3), axis=1.0), TypeError, "axis must be an integer"),
        (lambda: F.softmax_backward(np.ones(3), np.ones(4)), ValueError, "grad_out must have"),
        (lambda: F.log_softmax(np.full(3, -np.inf)), ValueError, "entirely -inf"),
        (lambda: F.gelu(np.ones(3), approximate="fast"), ValueError, "approximate must be"),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value)


def test_integer_input_is_promoted_to_float64():
    assert F.softmax(np.array([1, 2, 3])).dtype == np.float64


def _exact_cdf(xs: np.ndarray) -> np.ndarray:
    return np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in xs])


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float64, 4e-16), (np.float32, 2e-7)])
def test_normal_cdf_is_accurate_in_each_dtype(dtype, tolerance):
    # the grid lookup with its Taylor correction, against math.erfc, across and beyond the grid
    xs = np.concatenate(
        [np.linspace(-12, 12, 240_001), [0.0, -0.0, 1e-30, 5.74, 5.76, 8.49, 8.51]]
    )
    xs = xs.astype(dtype)
    exact = _exact_cdf(xs.astype(np.float64))
    got = F._cdf_and_density(xs)[0]
    assert got.dtype == dtype
    assert np.abs(got - exact).max() <= tolerance
    assert np.all((got >= 0) & (got <= 1))
    special = F._cdf_and_density(np.array([np.inf, -np.inf, np.nan], dtype=dtype))[0]
    assert special[0] == 1.0
    assert abs(special[1]) <= tolerance
    assert np.isnan(special[2])


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activation_and_derivative_in_one_pass_agree_with_the_separate_functions(rng, name, dtype):
    # more than one block, an odd size and a non-contiguous view
    x = (3 * rng.standard_normal((3, 40_001))).astype(dtype)[:, ::2]
    value, slope = F._activation_and_derivative(x, name)
    forward, derivative = {
        "gelu": (F.gelu, F.gelu_grad),
        "gelu_tanh": (lambda v: F.gelu(v, "tanh"), lambda v: F.gelu_grad(v, "tanh")),
        "silu": (F.silu, F.silu_grad),
    }[name]
    assert value.dtype == slope.dtype == dtype
    assert value.shape == slope.shape == x.shape
    tolerance = 2e-6 if dtype == np.float32 else 1e-14
    reference = x.astype(np.float64)
    np.testing.assert_allclose(value, forward(reference), rtol=0, atol=tolerance * 10)
    np.testing.assert_allclose(slope, derivative(reference), rtol=0, atol=tolerance)
    empty_value, empty_slope = F._activation_and_derivative(np.zeros((2, 0), dtype), name)
    assert empty_value.shape == empty_slope.shape == (2, 0)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 512), (3, 40_001), (0,)])
def test_the_value_alone_is_the_value_of_the_pass_with_the_derivative(rng, name, dtype, shape):
    # a decoding step takes the value alone: it must be the training pass's, bit for bit,
    # for one block (one token) and for several
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    x.reshape(-1)[:4] = [np.nan, 50.0, -50.0, 0.0][: x.size]
    value = F._activation(x, name)
    assert value.dtype == dtype
    assert value.shape == x.shape
    np.testing.assert_array_equal(value, F._activation_and_derivative(x, name)[0])


def test_exact_gelu_derivative_is_accurate_in_float32():
    xs = np.linspace(-9, 9, 36_001)
    exact = _exact_cdf(xs) + xs * np.exp(-0.5 * xs * xs) / math.sqrt(2 * math.pi)
    _, slope = F._activation_and_derivative(xs.astype(np.float32), "gelu")
    assert np.abs(slope - exact).max() <= 3e-7


# ------------------------------------------------------- softmax row by row
def _rows(rng, dtype):
    """Rows of scores of very different sizes: some need a shift before exp, some do not."""
    n_rows, n = (int(v) for v in rng.integers([2, 1], [7, 9]))
    size = rng.choice([1.0, 30.0, 100.0, 1000.0], size=(n_rows, 1))
    x = (rng.standard_normal((n_rows, n)) * size).astype(dtype)
    allowed = rng.random((n_rows, n)) < 0.7
    allowed[rng.integers(n_rows)] = False  # one row with nothing allowed
    return x, allowed


@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]))
def test_each_softmax_row_depends_on_its_own_allowed_entries_alone_bitwise(seed, dtype):
    rng = np.random.default_rng(seed)
    x, allowed = _rows(rng, dtype)
    y = F._softmax(x, 1, "x", allowed)
    row = int(rng.integers(len(x)))
    changed = x.copy()
    changed[row] = (rng.standard_normal(x.shape[1]) * 1000).astype(dtype)
    changed[~allowed] = (rng.standard_normal(np.count_nonzero(~allowed)) * 1e4).astype(dtype)
    y2 = F._softmax(changed, 1, "x", allowed)
    others = np.arange(len(x)) != row
    assert np.array_equal(y2[others], y[others])  # masked entries and other rows: no effect
    assert np.all(y2[~allowed] == 0.0)
    sums = y2.sum(axis=1)
    np.testing.assert_allclose(sums[allowed.any(axis=1)], 1.0, rtol=1e-5)
    np.testing.assert_array_equal(sums[~allowed.any(axis=1)], 0.0)


@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]))
def test_allowed_gives_the_same_bits_as_minus_infinity(seed, dtype):
    rng = np.random.default_rng(seed)
    x, allowed = _rows(rng, dtype)
    with_allowed = F._softmax(x, 1, "x", allowed)
    assert np.array_equal(with_allowed, F.softmax(np.where(allowed, x, -np.inf), axis=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_in_and_beyond_the_unshifted_range_are_each_exact(dtype):
    low, high = F._UNSHIFTED[np.dtype(dtype)]
    x = np.array(
        [
            [0.0, 1.0, 2.0],  # no shift
            [high, high - 1, high - 2],  # the largest unshifted row
            [high + 1, high, high - 1],  # just beyond: shifted by its maximum
            [low, low - 1, low - 2],  # the smallest unshifted row
            [low - 1, low - 2, low - 3],  # just below: shifted
        ],
        dtype=dtype,
    )
    expected = np.exp([0.0, -1.0, -2.0]) / np.exp([0.0, -1.0, -2.0]).sum()
    y = F.softmax(x)
    assert np.isfinite(y).all()
    tolerance = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(y[0], expected[::-1], rtol=tolerance)
    for row in y[1:]:
        np.testing.assert_allclose(row, expected, rtol=tolerance)


# ----------------------------------------------------------------- reference
@pytest.mark.reference
@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_and_log_softmax_agree_with_torch(rng, kind, torch):
    x = rng.standard_normal((3, 4, 7)) * 4
    g = rng.standard_normal(x.shape)
    xt = torch.tensor(x, requires_grad=True)
    yt = getattr(torch, kind)(xt, dim=-1)
    yt.backward(torch.tensor(g))
    y = getattr(F, kind)(x)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    grad = getattr(F, f"{kind}_backward")(g, y)
    np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.reference
@pytest.mark.parametrize(
    ("name", "options"),
    [("gelu", {}), ("gelu", {"approximate": "tanh"}), ("relu", {}), ("silu", {})],
    ids=["gelu", "gelu-tanh", "relu", "silu"],
)
def test_activations_and_derivatives_agree_with_torch(rng, name, options, torch):
    x = rng.standard_normal(500) * 3
    g = rng.standard_normal(500)
    xt = torch.tensor(x, requires_grad=True)
    yt = getattr(torch.nn.functional, name)(xt, **options)
    yt.backward(torch.tensor(g))
    approximate = options.get("approximate", "none")
    ours = F.gelu(x, approximate) if name == "gelu" else getattr(F, name)(x)
    slope = F.gelu_grad(x, approximate) if name == "gelu" else getattr(F, f"{name}_grad")(x)
    np.testing.assert_allclose(ours, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g * slope, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
