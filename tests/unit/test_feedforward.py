"""The position-wise feed-forward network, plain and gated, with every activation."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer import functional as F
from tinyformer.feedforward import ACTIVATIONS, FeedForward
from tinyformer.gradcheck import check_module_gradients


def _ffn(rng, d_model=4, d_ff=6, **kwargs):
    layer = FeedForward(d_model, d_ff, rng=rng, **kwargs)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.7
    return layer


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradients(rng, activation, gated):
    layer = _ffn(rng, activation=activation, gated=gated)
    x = rng.standard_normal((2, 3, 4))
    errors = check_module_gradients(layer, [x], rng=rng)
    assert max(errors.values()) < 1e-6, errors


def test_gradients_without_bias_and_with_dropout(rng):
    layer = _ffn(rng, gated=True, activation="silu", bias=False, dropout=0.3)
    state = layer.dropout.rng.bit_generator.state

    def reset():
        layer.dropout.rng.bit_generator.state = state

    errors = check_module_gradients(
        layer, [rng.standard_normal((3, 2, 4))], rng=rng, before_forward=reset
    )
    assert max(errors.values()) < 1e-6, errors
    assert [n for n, _ in layer.named_parameters()] == ["linear_in.weight", "linear_out.weight"]


@pytest.mark.parametrize(
    ("activation", "fn"),
    [
        ("relu", F.relu),
        ("gelu", F.gelu),
        ("gelu_tanh", lambda x: F.gelu(x, "tanh")),
        ("silu", F.silu),
    ],
)
def test_plain_ffn_matches_the_formula(rng, activation, fn):
    layer = _ffn(rng, activation=activation)
    x = rng.standard_normal((2, 5, 4))
    w1, b1 = layer.linear_in.weight.value, layer.linear_in.bias.value
    w2, b2 = layer.linear_out.weight.value, layer.linear_out.bias.value
    np.testing.assert_allclose(layer.forward(x), fn(x @ w1 + b1) @ w2 + b2, rtol=1e-12)


def test_swiglu_matches_the_formula(rng):
    layer = _ffn(rng, activation="silu", gated=True, bias=False)
    x = rng.standard_normal((3, 4))
    w = layer.linear_in.weight.value
    w1, v = w[:, :6], w[:, 6:]
    expected = (F.silu(x @ w1) * (x @ v)) @ layer.linear_out.weight.value
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12)


def test_each_position_is_transformed_independently(rng):
    layer = _ffn(rng)
    x = rng.standard_normal((2, 5, 4))
    whole = layer.forward(x)
    np.testing.assert_allclose(layer.forward(x[:, 3:4]), whole[:, 3:4], rtol=1e-12)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_float32_in_float32_out(rng, activation, gated):
    layer = FeedForward(4, 8, rng=rng, activation=activation, gated=gated, dtype=np.float32)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    y = layer.forward(x)
    assert y.dtype == np.float32
    assert layer.backward(np.ones_like(y)).dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in layer.parameters())
