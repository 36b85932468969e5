"""The live exercise of the chapter on backpropagation: RMSNorm's backward pass."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.norm import RMSNorm


def _reference(x, gain, grad_y, eps=1e-6):
    """The package's RMSNorm backward pass: input and gain gradients."""
    norm = RMSNorm(x.shape[-1], eps=eps)
    norm.gain.value[:] = gain
    norm.forward(x)
    grad_x = norm.backward(grad_y)
    return grad_x, norm.gain.grad.copy()


def _by_hand(x, gain, grad_y, eps, *, mistake=""):
    """The backward pass written out, with one of the mistakes below if ``mistake`` names it."""
    d = x.shape[-1]
    r = 1.0 / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)
    x_hat = x * r
    grad_gain = (grad_y * x_hat).reshape(-1, d).sum(axis=0)
    g = grad_y if mistake == "no gain" else gain * grad_y
    if mistake == "constant rms":
        return r * g, grad_gain
    projection = g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    if mistake == "mean term":
        projection = projection - g.mean(axis=-1, keepdims=True)
    return r * projection, grad_gain


def _constant_rms(x, gain, grad_y, eps=1e-6):
    """Treats the rms as a constant: dx = r * gain * dy."""
    return _by_hand(x, gain, grad_y, eps, mistake="constant rms")


def _no_gain(x, gain, grad_y, eps=1e-6):
    """Forgets that the gradient reaching x_hat is gain * dy, not dy."""
    return _by_hand(x, gain, grad_y, eps, mistake="no gain")


def _layer_norm_mean_term(x, gain, grad_y, eps=1e-6):
    """Keeps LayerNorm's -mean(g) term, which comes from the centring RMSNorm does not do."""
    return _by_hand(x, gain, grad_y, eps, mistake="mean term")


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    x = 2.0 * rng.standard_normal((3, 6))
    gain = 1.0 + 0.5 * rng.standard_normal(6)
    batch = rng.standard_normal((2, 4, 5))
    batch_gain = 1.0 + 0.5 * rng.standard_normal(5)
    small = rng.standard_normal((3, 4))
    small[1] = 0.0  # mean square 0: only eps keeps r finite
    small[2] *= 1e-3  # mean square about 1e-6, the size of eps
    small_gain = 1.0 + 0.5 * rng.standard_normal(4)
    large = 1e3 + 10.0 * rng.standard_normal((3, 6))
    large_gain = 1.0 + 0.5 * rng.standard_normal(6)
    return [
        Case((x, gain, rng.standard_normal((3, 6)), 1e-6), label="3 positions of width 6"),
        Case((batch, batch_gain, rng.standard_normal((2, 4, 5)), 1e-6),
             label="a batch of 2 sequences of 4 positions"),
        Case((small, small_gain, rng.standard_normal((3, 4)), 1e-6),
             label="a row of zeros and a row of entries near 1e-3, where eps matters"),
        Case((large, large_gain, rng.standard_normal((3, 6)), 1e-6),
             label="rows of entries near 1e3"),
    ]  # fmt: skip


RMS_NORM_BACKWARD = Exercise(
    chapter="backprop",
    name="rms_norm_backward",
    stub='''\
def rms_norm_backward(x, gain, grad_y, eps=1e-6):
    """The backward pass of RMSNorm, from its input.

    The forward pass normalizes each vector x[..., :] of length d on its own, without
    centring it: r = 1 / sqrt(mean(x**2) + eps) (eps inside the square root, added to
    the mean square), x_hat = r * x, y = gain * x_hat.
    x: (..., d); gain: (d,); grad_y: dL/dy, the same shape as x.
    Returns (grad_x, grad_gain): dL/dx, of the shape of x, and dL/dgain, of shape (d,)
    and summed over every position (all leading axes).
    Remember that r depends on x too. A row of zeros must give a finite gradient.
    """
    raise NotImplementedError
''',
    reference=_reference,
    cases=_cases,
    rtol=1e-6,
    atol=1e-9,
    parts=("input gradient", "gain gradient"),
    mistakes=(_constant_rms, _no_gain, _layer_norm_mean_term),
)
"""Write RMSNorm's backward pass from its input (exercise 1's derivation, as code)."""
