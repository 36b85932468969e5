"""The live exercise of the chapter on residual connections and normalization."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.norm import LayerNorm


def _layer_norm_backward(x, gain, grad_y, eps=1e-5):
    """The input gradient of the package's ``LayerNorm`` with this gain (bias irrelevant)."""
    layer = LayerNorm(x.shape[-1], eps=eps)
    layer.gain.value[...] = gain
    layer.forward(x)
    return layer.backward(grad_y)


def _x_hat(x, eps, *, one_pass=False, eps_outside=False):
    """The normalized input and 1 / sqrt(var + eps), computed as a mistake may compute them."""
    mean = x.mean(axis=-1, keepdims=True)
    if one_pass:
        var = (x**2).mean(axis=-1, keepdims=True) - mean**2
    else:
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    r = 1 / (np.sqrt(var) + eps) if eps_outside else 1 / np.sqrt(var + eps)
    return (x - mean) * r, r


def _formula(g, x_hat, r):
    return r * (
        g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    )


def _no_projection(x, gain, grad_y, eps=1e-5):
    """Subtracts the mean of g but forgets the term along x_hat (what the rescaling removes)."""
    _, r = _x_hat(x, eps)
    g = gain * grad_y
    return r * (g - g.mean(axis=-1, keepdims=True))


def _eps_outside(x, gain, grad_y, eps=1e-5):
    """Divides by sqrt(var) + eps instead of sqrt(var + eps)."""
    x_hat, r = _x_hat(x, eps, eps_outside=True)
    return _formula(gain * grad_y, x_hat, r)


def _one_pass_variance(x, gain, grad_y, eps=1e-5):
    """Takes the variance as mean(x**2) - mean(x)**2, which cancels badly for offset rows."""
    x_hat, r = _x_hat(x, eps, one_pass=True)
    return _formula(gain * grad_y, x_hat, r)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    hand = np.array([[1.0, 2.0, 3.0, 6.0]])
    batch = rng.standard_normal((2, 3, 8))
    constant = np.vstack([np.full(6, 2.5), rng.standard_normal(6)])  # row 0: variance 0
    offset = 1e6 + rng.standard_normal((3, 8))  # rows far from zero
    return [
        Case((hand, np.ones(4), rng.standard_normal((1, 4))), label="x = [1 2 3 6] with unit gain"),
        Case((batch, rng.standard_normal(8), rng.standard_normal((2, 3, 8))),
             label="a (2, 3, 8) batch with a random gain"),
        Case((constant, rng.standard_normal(6), rng.standard_normal((2, 6)), 1e-5),
             label="a constant row (variance 0) with eps = 1e-5"),
        Case((offset, rng.standard_normal(8), rng.standard_normal((3, 8)), 1e-12),
             label="rows near 1e6 with spread 1 and eps = 1e-12"),
    ]  # fmt: skip


LAYER_NORM_BACKWARD = Exercise(
    chapter="residuals",
    name="layer_norm_backward",
    stub='''\
def layer_norm_backward(x, gain, grad_y, eps=1e-5):
    """The gradient dL/dx of LayerNorm y = gain * (x - mean) / sqrt(var + eps) + bias.

    x: array of shape (..., d), normalized over its last axis (mean and variance of each
    row's d features; the variance divides by d). gain: shape (d,). grad_y: dL/dy, the
    shape of x. eps: added to the variance. The bias does not affect dL/dx.
    Returns dL/dx, an array of the shape of x.
    """
    raise NotImplementedError
''',
    reference=_layer_norm_backward,
    cases=_cases,
    rtol=1e-6,
    atol=1e-9,
    mistakes=(_no_projection, _eps_outside, _one_pass_variance),
)
"""Write LayerNorm's backward pass: both projections, eps inside the root, a stable variance."""
