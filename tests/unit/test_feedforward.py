"""The position-wise feed-forward network, plain and gated, with every activation."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer import functional as F
from tinyformer.feedforward import ACTIVATIONS, FEED_FORWARDS, FeedForward, make_feed_forward
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
def test_float32_agrees_with_float64_forward_and_backward(rng, activation, gated):
    wide = _ffn(rng, 4, 8, activation=activation, gated=gated)
    narrow = FeedForward(4, 8, rng=rng, activation=activation, gated=gated, dtype=np.float32)
    narrow.load_state_dict(wide.state_dict())
    x, g = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    y = narrow.forward(x.astype(np.float32))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, wide.forward(x), rtol=1e-5, atol=1e-5)
    grad = narrow.backward(g.astype(np.float32))
    assert grad.dtype == np.float32
    np.testing.assert_allclose(grad, wide.backward(g), rtol=1e-4, atol=1e-5)
    for p, q in zip(narrow.parameters(), wide.parameters(), strict=True):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------- registry
def test_the_registry_builds_plain_and_gated_networks_with_every_option(rng):
    assert set(FEED_FORWARDS) == {"plain", "gated", "moe"}
    for kind in ("plain", "gated"):
        layer = make_feed_forward(
            kind, 4, 6, rng=rng, activation="silu", dropout=0.2, bias=False, dtype=np.float32
        )
        assert isinstance(layer, FeedForward)
        assert layer.gated == (kind == "gated")
        assert (layer.activation, layer.dropout.p, layer.dtype) == ("silu", 0.2, np.float32)
        assert layer.linear_in.weight.shape == (4, 12 if kind == "gated" else 6)
        assert layer.linear_in.bias is None
        assert layer.linear_out.bias is None


def test_the_registry_draws_the_same_weights_as_the_class():
    made = make_feed_forward(
        "gated",
        4,
        6,
        rng=np.random.default_rng(3),
        activation="relu",
        dropout=0.0,
        bias=True,
        dtype=np.float64,
    )
    direct = FeedForward(4, 6, rng=np.random.default_rng(3), gated=True)
    for (name, p), q in zip(made.named_parameters(), direct.parameters(), strict=True):
        np.testing.assert_array_equal(p.value, q.value, err_msg=name)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda: make_feed_forward(
                "experts",
                4,
                6,
                rng=np.random.default_rng(0),
                activation="relu",
                dropout=0.0,
                bias=True,
                dtype=np.float64,
            ),
            ValueError,
            "kind must be one of ['gated', 'moe', 'plain'], got 'experts'",
        ),
        (
            lambda: FeedForward(4, 8, rng=np.random.default_rng(0), activation="tanh"),
            ValueError,
            "activation must be one of",
        ),
        (
            lambda: FeedForward(4, 8, rng=np.random.RandomState(0)),
            TypeError,
            "rng must be a numpy.random.Generator",
        ),
        (lambda: FeedForward(4, 0, rng=np.random.default_rng(0)), ValueError, "d_ff must be"),
        (
            lambda: FeedForward(4, 8, rng=np.random.default_rng(0)).forward(np.ones((2, 5))),
            ValueError,
            "x must have last dimension 4",
        ),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
