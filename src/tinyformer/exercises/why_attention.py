"""The live exercise of the chapter on why attention replaced recurrence."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.rnn import ElmanRNN


def _elman_input_gradient(x, w_xh, w_hh, bias, grad_out):
    """dL/dx from tinyformer's :class:`ElmanRNN` backward pass, with these weights."""
    rnn = ElmanRNN(*w_xh.shape, rng=np.random.default_rng(0))
    rnn.w_xh.value[...] = w_xh
    rnn.w_hh.value[...] = w_hh
    rnn.bias.value[...] = bias
    rnn.forward(x)
    return rnn.backward(grad_out)


def _states(x, w_xh, w_hh, bias):
    """The forward pass: every state h_1 .. h_T, from h_0 = 0."""
    h = np.zeros((x.shape[0], w_hh.shape[0]))
    states = []
    for t in range(x.shape[1]):
        h = np.tanh(x[:, t] @ w_xh + h @ w_hh + bias)
        states.append(h)
    return np.stack(states, axis=1)  # (B, T, d_hidden)


def _no_carry(x, w_xh, w_hh, bias, grad_out):
    """Backpropagates only the gradient at each step's own state, nothing from later steps."""
    states = _states(x, w_xh, w_hh, bias)
    return (grad_out * (1 - states**2)) @ w_xh.T


def _untransposed(x, w_xh, w_hh, bias, grad_out):
    """Sends the gradient back through W_hh instead of its transpose (square, so it runs)."""
    states = _states(x, w_xh, w_hh, bias)
    grad_x = np.empty_like(x)
    carry = np.zeros_like(states[:, 0])
    for t in reversed(range(x.shape[1])):
        delta = (grad_out[:, t] + carry) * (1 - states[:, t] ** 2)
        grad_x[:, t] = delta @ w_xh.T
        carry = delta @ w_hh
    return grad_x


def _slope_on_own_only(x, w_xh, w_hh, bias, grad_out):
    """Multiplies only the step's own gradient by tanh's slope, not what later steps send."""
    states = _states(x, w_xh, w_hh, bias)
    grad_x = np.empty_like(x)
    carry = np.zeros_like(states[:, 0])
    for t in reversed(range(x.shape[1])):
        delta = grad_out[:, t] * (1 - states[:, t] ** 2) + carry
        grad_x[:, t] = delta @ w_xh.T
        carry = delta @ w_hh.T
    return grad_x


def _weights(rng, d_in, d_hidden):
    """Random weights and bias, large enough that tanh's slope matters."""
    w_xh = 0.7 * rng.standard_normal((d_in, d_hidden))
    w_hh = 0.7 * rng.standard_normal((d_hidden, d_hidden))
    return w_xh, w_hh, 0.3 * rng.standard_normal(d_hidden)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((1, 5, 3))
    last_only = np.zeros((1, 5, 4))
    last_only[0, -1] = rng.standard_normal(4)  # a loss on the last state only
    x2 = rng.standard_normal((2, 6, 4))
    x3 = rng.standard_normal((3, 1, 2))
    x4 = rng.standard_normal((1, 8, 3))
    return [
        Case(
            (x1, *_weights(rng, 3, 4), last_only),
            label="T = 5 with a gradient at the last state only",
        ),
        Case(
            (x2, *_weights(rng, 4, 4), rng.standard_normal((2, 6, 4))),
            label="a batch of 2 sequences of length 6",
        ),
        Case(
            (x3, *_weights(rng, 2, 5), rng.standard_normal((3, 1, 5))),
            label="a single step (T = 1)",
        ),
        Case(
            (x4, *_weights(rng, 3, 6), rng.standard_normal((1, 8, 6))),
            label="T = 8 with d_in = 3 and d_hidden = 6",
        ),
    ]


RNN_INPUT_GRADIENT = Exercise(
    chapter="why_attention",
    name="rnn_input_gradient",
    stub='''\
def rnn_input_gradient(x, w_xh, w_hh, bias, grad_out):
    """Backpropagation through time: the gradient of the loss with respect to the inputs.

    The Elman layer computes h_t = tanh(x_t @ w_xh + h_{t-1} @ w_hh + bias) for
    t = 1 .. T, from h_0 = 0. x: (B, T, d_in); w_xh: (d_in, d_hidden);
    w_hh: (d_hidden, d_hidden); bias: (d_hidden,); grad_out: (B, T, d_hidden), the
    gradient dL/dh_t of the loss with respect to every state, as the layers above send it.
    Returns dL/dx, of shape (B, T, d_in): x_t reaches the loss through h_t and, through h_t,
    every later state, so its gradient includes what the later steps send back.
    """
    raise NotImplementedError
''',
    reference=_elman_input_gradient,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    mistakes=(_no_carry, _untransposed, _slope_on_own_only),
)
"""Write the backward pass of the recurrent layer, the loop the path-length section measures."""
