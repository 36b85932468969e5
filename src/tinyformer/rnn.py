"""An Elman recurrent layer with tanh, and its backward pass through time.

The transformer replaced recurrence; this layer is here so the book can measure
what was replaced. It reads a sequence one position after another, carrying a
fixed-size hidden state :cite:p:`elman1990finding`. Everything that does not
depend on the previous state (the input projection) is computed for all
positions at once; what remains is a loop of ``T`` steps, each of which needs
the result of the step before it.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import float_dtype, generator, layer_input, positive_int
from tinyformer.layers import glorot_uniform, sum_rows
from tinyformer.module import Module, Parameter

__all__ = ["ElmanRNN"]


def _finite(x: np.ndarray, name: str) -> np.ndarray:
    """Return ``x`` if it holds no NaN or infinity (one would spread to every later step)."""
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


class ElmanRNN(Module):
    r"""Elman recurrent layer :cite:p:`elman1990finding`, batch first.

    .. math::
        h_t = \tanh\bigl(x_t W_{xh} + h_{t-1} W_{hh} + b\bigr), \qquad t = 1, \dots, T,

    starting from a given :math:`h_0` (zeros by default). The output is every
    hidden state, :math:`(h_1, \dots, h_T)`.

    Parameters
    ----------
    d_in : int
        Width of each input vector :math:`x_t`.
    d_hidden : int
        Width of the hidden state :math:`h_t`: the fixed amount of memory the
        layer carries from one position to the next.
    rng : numpy.random.Generator
        Draws the Glorot-uniform weights; the bias starts at zero.
    dtype : float32 or float64
        Dtype of the parameters and of accepted inputs.

    Notes
    -----
    ``w_xh`` has shape ``(d_in, d_hidden)``, ``w_hh`` ``(d_hidden, d_hidden)``
    and ``bias`` ``(d_hidden,)``. Backpropagation through time
    :cite:p:`werbos1990backpropagation` runs the loop backwards. With
    :math:`a_t` the pre-activation, :math:`G_t = \partial L/\partial h_t` the
    gradient arriving from the output at step :math:`t` and :math:`c_t` the one
    arriving from step :math:`t + 1` (:math:`c_T = 0`):

    .. math::
        \delta_t = \frac{\partial L}{\partial a_t} = (G_t + c_t) \odot (1 - h_t^2), \qquad
        c_{t-1} = \delta_t W_{hh}^\top,

    .. math::
        \frac{\partial L}{\partial W_{xh}} = \sum_t x_t^\top \delta_t, \quad
        \frac{\partial L}{\partial W_{hh}} = \sum_t h_{t-1}^\top \delta_t, \quad
        \frac{\partial L}{\partial b} = \sum_t \delta_t, \quad
        \frac{\partial L}{\partial x_t} = \delta_t W_{xh}^\top, \quad
        \frac{\partial L}{\partial h_0} = c_0 .

    The gradient that reaches :math:`x_t` from :math:`h_T` has passed through
    :math:`T - t` factors :math:`\operatorname{diag}(1 - h^2)\, W_{hh}^\top`;
    when they shrink vectors, it decays geometrically with the distance
    :cite:p:`bengio1994learning`.
    """

    def __init__(
        self,
        d_in: int,
        d_hidden: int,
        *,
        rng: np.random.Generator,
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        self.d_in = positive_int(d_in, "d_in")
        self.d_hidden = positive_int(d_hidden, "d_hidden")
        self.dtype = float_dtype(dtype)
        rng = generator(rng)
        d, h = self.d_in, self.d_hidden
        self.w_xh = Parameter(glorot_uniform(d, h, rng=rng, dtype=self.dtype))
        self.w_hh = Parameter(glorot_uniform(h, h, rng=rng, dtype=self.dtype))
        self.bias = Parameter(np.zeros(h, dtype=self.dtype))

    def _check_inputs(self, x: object, h0: object) -> tuple[np.ndarray, np.ndarray]:
        """Check ``x`` ``(B, T, d_in)`` and ``h0`` ``(B, d_hidden)``; zeros for a missing ``h0``."""
        x = layer_input(x, "x", self.dtype)
        if x.ndim != 3 or x.shape[-1] != self.d_in:
            raise ValueError(
                f"x must have shape (B, T, d_in) with d_in={self.d_in}, got shape {x.shape}"
            )
        if x.shape[1] == 0:
            raise ValueError(f"x must hold at least one time step (T >= 1), got shape {x.shape}")
        _finite(x, "x")
        shape = (x.shape[0], self.d_hidden)
        if h0 is None:
            return x, np.zeros(shape, dtype=self.dtype)
        h0 = layer_input(h0, "h0", self.dtype)
        if h0.shape != shape:
            raise ValueError(
                f"h0 must have shape (B, d_hidden) = {shape} to match x of shape {x.shape},"
                f" got shape {h0.shape}"
            )
        return x, _finite(h0, "h0")

    def forward(self, x: np.ndarray, h0: np.ndarray | None = None) -> np.ndarray:
        """Run the recurrence over ``x`` ``(B, T, d_in)``; return all states ``(B, T, d_hidden)``.

        ``h0`` ``(B, d_hidden)`` is the initial state; without it the state starts at zero.
        """
        x, start = self._check_inputs(x, h0)
        b, t, _ = x.shape
        h = start  # (B, d_hidden)
        inputs = x @ self.w_xh.value + self.bias.value  # (B, T, d_hidden), all steps at once
        states = np.empty((b, t, self.d_hidden), dtype=self.dtype)  # (B, T, d_hidden)
        for step in range(t):  # sequential: step t needs h_{t-1}
            h = np.tanh(inputs[:, step] + h @ self.w_hh.value)  # (B, d_hidden)
            states[:, step] = h
        self._save(x, start, states, h0 is not None)
        return states

    def backward(self, grad_out: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Backpropagate through time; add into the parameter gradients.

        Returns the gradient for ``x``, or ``(grad_x, grad_h0)`` when ``forward``
        was given ``h0``.
        """
        x, h0, states, given_h0 = self._saved()
        b, t, d_h = states.shape
        grad = self._check_grad(grad_out, states.shape, self.dtype)
        delta = np.empty_like(states)  # dL/da_t for every step, (B, T, d_hidden)
        carry = np.zeros((b, d_h), dtype=self.dtype)  # dL/dh_t arriving from step t + 1
        for step in reversed(range(t)):
            delta[:, step] = (grad[:, step] + carry) * (1.0 - states[:, step] ** 2)
            carry = delta[:, step] @ self.w_hh.value.T  # (B, d_hidden): dL/dh_{t-1}
        previous = np.concatenate((h0[:, None], states[:, :-1]), axis=1)  # h_0 .. h_{T-1}
        delta_rows = delta.reshape(b * t, d_h)  # (B T, d_hidden)
        if self.w_xh.requires_grad:  # a frozen parameter costs nothing
            self.w_xh.grad += x.reshape(b * t, self.d_in).T @ delta_rows
        if self.w_hh.requires_grad:
            self.w_hh.grad += previous.reshape(b * t, d_h).T @ delta_rows
        if self.bias.requires_grad:
            self.bias.grad += sum_rows(delta_rows)
        grad_x = (delta_rows @ self.w_xh.value.T).reshape(x.shape)  # (B, T, d_in)
        return (grad_x, carry) if given_h0 else grad_x
