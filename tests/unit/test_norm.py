"""LayerNorm and RMSNorm: what they normalize, their gradients, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.gradcheck import check_module_gradients
from tinyformer.norm import LayerNorm, RMSNorm


def _random_shape(rng, d):
    return (*rng.integers(1, 4, size=rng.integers(1, 3)), d)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_gradients_on_random_shapes(cls, seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 7))
    layer = cls(d)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape)
    x = rng.standard_normal(_random_shape(rng, d)) * 3 + 1
    errors = check_module_gradients(layer, [x], rng=rng)
    assert max(errors.values()) < 1e-6, errors


@given(st.integers(0, 2**32 - 1), st.floats(-1e3, 1e3), st.floats(1e-2, 1e3))
def test_layer_norm_output_has_zero_mean_and_unit_variance(seed, shift, spread):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 16)) * spread + shift
    y = LayerNorm(16, eps=1e-12).forward(x)
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(y.var(axis=-1), 1.0, rtol=1e-6)


def test_layer_norm_matches_the_formula(rng):
    layer = LayerNorm(5, eps=1e-3)
    layer.gain.value[:] = rng.standard_normal(5)
    layer.bias.value[:] = rng.standard_normal(5)
    x = rng.standard_normal((2, 3, 5))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    expected = (x - mu) / np.sqrt(var + 1e-3) * layer.gain.value + layer.bias.value
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12, atol=1e-12)


def test_rms_norm_matches_the_formula_and_keeps_direction(rng):
    layer = RMSNorm(6, eps=1e-6)
    x = rng.standard_normal((4, 6))
    y = layer.forward(x)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    np.testing.assert_allclose(np.sqrt((y**2).mean(-1)), 1.0, rtol=1e-5)


def test_constant_rows_do_not_give_nan():
    y = LayerNorm(4).forward(np.full((2, 4), 3.0))
    np.testing.assert_array_equal(y, 0.0)
    assert not np.isnan(RMSNorm(4).forward(np.zeros((2, 4)))).any()


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float32_in_float32_out(rng, cls, dtype):
    layer = cls(8, dtype=dtype)
    x = rng.standard_normal((2, 3, 8)).astype(dtype)
    y = layer.forward(x)
    assert y.dtype == dtype
    assert layer.backward(np.ones_like(y)).dtype == dtype
    assert all(p.grad.dtype == dtype for p in layer.parameters())


def test_float32_agrees_with_float64(rng):
    x = rng.standard_normal((4, 32)) * 10
    y64 = LayerNorm(32).forward(x)
    y32 = LayerNorm(32, dtype=np.float32).forward(x.astype(np.float32))
    np.testing.assert_allclose(y32, y64, atol=1e-5)
