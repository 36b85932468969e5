"""The Elman RNN: forward against the formula, backward through time against finite
differences, properties of a recurrence, and bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.gradcheck import check_module_gradients
from tinyformer.rnn import ElmanRNN


def _layer(d_in, d_hidden, seed=0, scale=0.7, dtype=np.float64):
    """An RNN with random weights and bias (a zero bias would hide a wrong bias gradient)."""
    rng = np.random.default_rng(seed)
    layer = ElmanRNN(d_in, d_hidden, rng=rng, dtype=dtype)
    for p in layer.parameters():
        p.value[...] = scale * rng.standard_normal(p.shape)
    return layer


def _reference(layer, x, h0):
    """The recurrence written out sequence by sequence, step by step."""
    w_xh, w_hh, b = layer.w_xh.value, layer.w_hh.value, layer.bias.value
    out = np.zeros((*x.shape[:2], layer.d_hidden))
    for i in range(x.shape[0]):
        h = h0[i]
        for t in range(x.shape[1]):
            h = np.tanh(x[i, t] @ w_xh + h @ w_hh + b)
            out[i, t] = h
    return out


# ------------------------------------------------------------------- gradients
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gradients_of_input_and_parameters(seed):
    rng = np.random.default_rng(seed)
    b, t, d_in, d_hidden = (int(n) for n in rng.integers(1, 6, size=4))
    layer = _layer(d_in, d_hidden, seed=seed)
    errors = check_module_gradients(layer, [rng.standard_normal((b, t, d_in))], rng=rng)
    assert set(errors) == {"input 0", "w_xh", "w_hh", "bias"}
    assert max(errors.values()) < 1e-7, errors


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradients_with_an_initial_state(seed):
    rng = np.random.default_rng(seed)
    layer = _layer(3, 4, seed=seed)
    inputs = [rng.standard_normal((2, 6, 3)), 0.5 * rng.standard_normal((2, 4))]
    errors = check_module_gradients(layer, inputs, rng=rng)
    assert set(errors) == {"input 0", "input 1", "w_xh", "w_hh", "bias"}
    assert max(errors.values()) < 1e-7, errors


def test_gradients_over_a_long_sequence():
    """Forty steps: a wrong carry between steps would compound and show up here."""
    rng = np.random.default_rng(7)
    layer = _layer(2, 3, seed=7, scale=0.9)
    errors = check_module_gradients(layer, [rng.standard_normal((1, 40, 2))], rng=rng)
    assert max(errors.values()) < 1e-7, errors


def test_backward_returns_the_h0_gradient_only_when_h0_was_given(rng):
    layer = _layer(3, 4)
    x = rng.standard_normal((2, 5, 3))
    grad = rng.standard_normal((2, 5, 4))
    layer.forward(x)
    assert isinstance(layer.backward(grad), np.ndarray)
    layer.forward(x, np.zeros((2, 4)))
    grad_x, grad_h0 = layer.backward(grad)
    assert grad_x.shape == x.shape
    assert grad_h0.shape == (2, 4)


def test_parameter_gradients_accumulate(rng):
    layer = _layer(3, 4)
    x, g = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 4))
    layer.forward(x)
    layer.backward(g)
    once = {name: p.grad.copy() for name, p in layer.named_parameters()}
    layer.forward(x)
    layer.backward(g)
    for name, p in layer.named_parameters():
        np.testing.assert_allclose(p.grad, 2 * once[name], rtol=1e-13, err_msg=name)


# --------------------------------------------------------------------- forward
def test_forward_matches_the_recurrence_written_out(rng):
    layer = _layer(3, 5)
    x = rng.standard_normal((4, 7, 3))
    h0 = rng.standard_normal((4, 5))
    np.testing.assert_allclose(layer.forward(x, h0), _reference(layer, x, h0), rtol=1e-13)
    np.testing.assert_allclose(
        layer.forward(x), _reference(layer, x, np.zeros((4, 5))), rtol=1e-13
    )


def test_one_step_by_hand():
    layer = ElmanRNN(1, 1, rng=np.random.default_rng(0))
    layer.w_xh.value[...] = 1.0
    layer.w_hh.value[...] = 0.5
    layer.bias.value[...] = 0.25
    out = layer.forward(np.array([[[2.0], [0.0]]]), np.array([[1.0]]))
    h1 = np.tanh(2.0 + 0.5 + 0.25)
    np.testing.assert_allclose(out[0, :, 0], [h1, np.tanh(0.5 * h1 + 0.25)], rtol=1e-15)


def test_initialization_is_reproducible_with_a_zero_bias():
    a = ElmanRNN(5, 3, rng=np.random.default_rng(4))
    b = ElmanRNN(5, 3, rng=np.random.default_rng(4))
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.value, q.value, err_msg=name)
    np.testing.assert_array_equal(a.bias.value, 0.0)
    assert a.w_xh.shape == (5, 3)
    assert a.w_hh.shape == (3, 3)
    assert a.num_parameters() == 5 * 3 + 3 * 3 + 3


def test_float32_stays_float32(rng):
    layer = _layer(3, 4, dtype=np.float32)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    out = layer.forward(x)
    assert out.dtype == np.float32
    grad_x = layer.backward(np.ones_like(out))
    assert grad_x.dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in layer.parameters())


def test_integer_lists_become_the_layer_dtype():
    layer = _layer(2, 3)
    out = layer.forward([[[1, 0], [0, 1]]])
    assert out.dtype == np.float64
    assert out.shape == (1, 2, 3)


# ------------------------------------------------------------------ properties
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(2, 12),
    cut=st.integers(1, 11),
)
def test_an_output_ignores_later_inputs(seed, t, cut):
    cut = min(cut, t - 1)
    rng = np.random.default_rng(seed)
    layer = _layer(3, 4, seed=seed % 1000)
    x = rng.standard_normal((2, t, 3))
    changed = x.copy()
    changed[:, cut:] = rng.standard_normal((2, t - cut, 3))
    np.testing.assert_array_equal(layer.forward(x)[:, :cut], layer.forward(changed)[:, :cut])


@given(seed=st.integers(0, 2**32 - 1), t=st.integers(2, 12), cut=st.integers(1, 11))
def test_running_in_two_pieces_matches_running_at_once(seed, t, cut):
    """The state is all the layer carries: resume from h_cut and nothing is lost."""
    cut = min(cut, t - 1)
    rng = np.random.default_rng(seed)
    layer = _layer(3, 4, seed=seed % 1000)
    x = rng.standard_normal((2, t, 3))
    whole = layer.forward(x)
    first = layer.forward(x[:, :cut])
    second = layer.forward(x[:, cut:], first[:, -1])
    np.testing.assert_allclose(
        np.concatenate([first, second], axis=1), whole, rtol=1e-12, atol=1e-15
    )


@given(seed=st.integers(0, 2**32 - 1), b=st.integers(1, 5))
def test_sequences_of_a_batch_are_independent_and_bounded(seed, b):
    rng = np.random.default_rng(seed)
    layer = _layer(3, 4, seed=seed % 1000, scale=2.0)
    x = 3 * rng.standard_normal((b, 6, 3))
    out = layer.forward(x)
    assert np.all(np.abs(out) <= 1.0)
    # One row and a batch go through different BLAS kernels, which round differently: about
    # 1e-16 of pre-activations up to ~30, so an output near 0 can differ by a few 1e-15.
    for i in range(b):
        np.testing.assert_allclose(layer.forward(x[i : i + 1])[0], out[i], rtol=1e-12, atol=1e-13)


def test_the_gradient_from_the_last_output_vanishes_with_distance():
    """The effect the book measures: with the default initialization, the gradient of
    h_T with respect to x_t shrinks geometrically as T - t grows."""
    rng = np.random.default_rng(0)
    layer = ElmanRNN(16, 16, rng=rng)
    x = rng.standard_normal((16, 48, 16))
    out = layer.forward(x)
    grad = np.zeros_like(out)
    grad[np.arange(16), -1, np.arange(16)] = 1.0  # one coordinate of h_T per sequence copy
    norms = np.linalg.norm(layer.backward(grad), axis=(0, 2))  # (T,)
    assert norms[0] < 1e-6 * norms[-1]


# ------------------------------------------------------------------- bad input
def _x(*shape, dtype=np.float64):
    return np.ones(shape, dtype=dtype)


def _nan(*shape):
    x = _x(*shape)
    x.flat[1] = np.nan
    return x


def _rnn(dtype=np.float64):
    return ElmanRNN(4, 3, rng=np.random.default_rng(0), dtype=dtype)


def _after_forward(layer, *args):
    layer.forward(*args)
    return layer


# fmt: off
BAD = [
    ("d_in zero", lambda: ElmanRNN(0, 3, rng=np.random.default_rng(0)), ValueError, "d_in", "positive"),
    ("d_hidden float", lambda: ElmanRNN(4, 2.5, rng=np.random.default_rng(0)), TypeError, "d_hidden", "integer"),
    ("rng is a seed", lambda: ElmanRNN(4, 3, rng=0), TypeError, "rng", "Generator"),
    ("integer dtype", lambda: ElmanRNN(4, 3, rng=np.random.default_rng(0), dtype=np.int64), TypeError, "dtype", "float"),
    ("x of rank 2", lambda: _rnn().forward(_x(5, 4)), ValueError, "x", "(B, T, d_in)"),
    ("x of rank 4", lambda: _rnn().forward(_x(1, 2, 5, 4)), ValueError, "x", "(B, T, d_in)"),
    ("x feature size", lambda: _rnn().forward(_x(2, 5, 3)), ValueError, "x", "d_in=4"),
    ("x integer array", lambda: _rnn().forward(np.ones((2, 5, 4), dtype=int)), TypeError, "x", "floating"),
    ("x strings", lambda: _rnn().forward(np.full((1, 2, 4), "a")), TypeError, "x", "floating"),
    ("x float32 into float64", lambda: _rnn().forward(_x(1, 2, 4, dtype=np.float32)), TypeError, "x", "float64"),
    ("x no time steps", lambda: _rnn().forward(_x(2, 0, 4)), ValueError, "x", "time step"),
    ("x with NaN", lambda: _rnn().forward(_nan(1, 2, 4)), ValueError, "x", "NaN"),
    ("h0 batch", lambda: _rnn().forward(_x(2, 5, 4), _x(3, 3)), ValueError, "h0", "(2, 3)"),
    ("h0 width", lambda: _rnn().forward(_x(2, 5, 4), _x(2, 4)), ValueError, "h0", "d_hidden"),
    ("h0 with a time axis", lambda: _rnn().forward(_x(2, 5, 4), _x(2, 1, 3)), ValueError, "h0", "(B, d_hidden)"),
    ("h0 dtype", lambda: _rnn().forward(_x(2, 5, 4), _x(2, 3, dtype=np.float32)), TypeError, "h0", "float64"),
    ("h0 infinite", lambda: _rnn().forward(_x(1, 5, 4), np.array([[0.0, np.inf, 0.0]])), ValueError, "h0", "infinite"),
    ("backward first", lambda: _rnn().backward(_x(1, 2, 3)), RuntimeError, "backward", "forward"),
    ("grad_out shape", lambda: _after_forward(_rnn(), _x(1, 2, 4)).backward(_x(1, 2, 4)), ValueError, "grad_out", "(1, 2, 3)"),
    ("grad_out dtype", lambda: _after_forward(_rnn(), _x(1, 2, 4)).backward(_x(1, 2, 3, dtype=np.float32)), TypeError, "grad_out", "dtype"),
]
# fmt: on


@pytest.mark.parametrize(
    ("call", "error", "name", "expected"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_bad_input_names_the_argument(call, error, name, expected):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert re.search(rf"\b{re.escape(name)}\b", message), message
    assert expected in message, message
