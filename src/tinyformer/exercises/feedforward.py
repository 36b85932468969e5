"""The live exercise of the chapter on feed-forward networks: the backward pass of the gate."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.feedforward import FeedForward
from tinyformer.functional import silu, silu_grad


def _swiglu_backward(grad_h, a, u):
    """The backward pass of a SwiGLU ``FeedForward``, with identity weights around its gate."""
    n = a.shape[-1]
    layer = FeedForward(
        2 * n, n, rng=np.random.default_rng(0), activation="silu", gated=True, bias=False
    )
    layer.linear_in.weight.value[...] = np.eye(2 * n)  # the hidden pre-activation is [a, u]
    layer.linear_out.weight.value[...] = np.eye(n, 2 * n)  # the output is [h, 0]
    layer.forward(np.concatenate([a, u], axis=-1))
    grad_x = layer.backward(np.concatenate([grad_h, np.zeros_like(grad_h)], axis=-1))
    return grad_x[..., :n], grad_x[..., n:]  # (dL/da, dL/du)


def _forgot_u(grad_h, a, u):  # noqa: ARG001 - u is what it forgets
    """Drops the factor u from dL/da (the product rule half done)."""
    return grad_h * silu_grad(a), grad_h * silu(a)


def _sigmoid_as_slope(grad_h, a, u):
    """Takes sigmoid(a) for the derivative of SiLU, forgetting the derivative of the sigmoid."""
    return grad_h * u / (1 + np.exp(-a)), grad_h * silu(a)


def _gate_gets_a(grad_h, a, u):
    """Gives u the gradient G * a instead of G * SiLU(a)."""
    return grad_h * u * silu_grad(a), grad_h * a


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    g, a, u = rng.standard_normal((3, 5))
    batch = rng.standard_normal((3, 2, 3, 6))  # G, a, u for a (B, T, d_ff) hidden layer
    far = np.array([-40.0, -8.0, -1.28, 0.0, 1.0, 8.0, 40.0])  # -1.28: near SiLU's minimum
    closed = rng.standard_normal((2, 4, 8))
    return [
        Case((g, a, u), label="one position with 5 hidden units"),
        Case(tuple(batch), label="a (2, 3, 6) batch of hidden layers"),
        Case((np.ones(7), far, np.full(7, 0.5)), label="pre-activations from -40 to 40"),
        Case((closed[0], closed[1], np.zeros((4, 8))), label="a closed gate (u = 0 everywhere)"),
    ]


SWIGLU_BACKWARD = Exercise(
    chapter="feedforward",
    name="swiglu_backward",
    stub='''\
def swiglu_backward(grad_h, a, u):
    """The backward pass of the SwiGLU gate h = SiLU(a) * u (elementwise).

    SiLU(a) = a * sigmoid(a). grad_h, a and u are arrays of the same shape (..., d_ff):
    the gradient dL/dh arriving at the hidden layer, the activated branch's input a and
    the linear branch u. Returns the tuple (grad_a, grad_u), dL/da and dL/du, each of that
    same shape.
    """
    raise NotImplementedError
''',
    reference=_swiglu_backward,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    parts=("gradient for a", "gradient for u"),
    mistakes=(_forgot_u, _sigmoid_as_slope, _gate_gets_a),
)
"""Write the product rule through SwiGLU's gate, SiLU's derivative included."""
