"""Elementwise and row-wise functions with their derivatives.

Each forward function sits next to the rule that differentiates it. The
``*_backward`` functions take the upstream gradient and return the gradient with
respect to the input (a vector-Jacobian product), so no Jacobian is ever built.
All functions keep the input's floating dtype: float32 in, float32 out.
"""

from __future__ import annotations

import math

import numpy as np

from tinyformer._validation import axis_index, describe, float_array

__all__ = [
    "gelu",
    "gelu_grad",
    "log_softmax",
    "log_softmax_backward",
    "relu",
    "relu_grad",
    "silu",
    "silu_grad",
    "softmax",
    "softmax_backward",
]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_TANH_CUBIC = 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _shifted_max(x: np.ndarray, axis: int, name: str) -> np.ndarray:
    """Row maxima used to shift ``x`` before exponentiating (0 for all ``-inf`` rows)."""
    row_max = np.max(x, axis=axis, keepdims=True)
    if np.isnan(row_max).any() or (row_max == np.inf).any():
        raise ValueError(f"{name} must not contain NaN or +inf, got {describe(x)}")
    return np.where(row_max == -np.inf, 0.0, row_max).astype(x.dtype, copy=False)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Softmax along ``axis``, computed stably.

    .. math:: \operatorname{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}},
              \qquad m = \max_j x_j

    Subtracting the row maximum changes nothing mathematically and keeps every
    exponent at most 0, so nothing overflows. Entries equal to ``-inf`` get
    weight exactly 0, and a row that is entirely ``-inf`` becomes all zeros
    (there is nothing to normalize over) rather than NaN.

    Parameters
    ----------
    x : array_like
        Scores of any shape; ``x.shape[axis]`` is the axis that sums to one.
    axis : int
        Axis to normalize over.

    Returns
    -------
    numpy.ndarray
        Same shape and floating dtype as ``x``.
    """
    x = float_array(x, "x", min_ndim=1)
    return _softmax(x, axis_index(axis, x.ndim), "x")


def _softmax(x: np.ndarray, axis: int, name: str) -> np.ndarray:
    """Softmax of a float array along a checked axis; ``name`` labels NaN/inf errors."""
    e = np.exp(x - _shifted_max(x, axis, name))
    total = e.sum(axis=axis, keepdims=True)
    total[total == 0] = 1  # rows that were all -inf: 0 / 1 = 0
    e /= total
    return e


def softmax_backward(grad_out: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Gradient through softmax, given its output ``y``.

    .. math:: \frac{\partial L}{\partial x_i}
              = y_i \Bigl(g_i - \sum_j g_j y_j\Bigr), \qquad g = \partial L / \partial y

    This is the product of the upstream gradient with the softmax Jacobian
    :math:`\operatorname{diag}(y) - y y^\top`, computed in :math:`O(n)` per row.
    """
    g = float_array(grad_out, "grad_out", min_ndim=1)
    y = float_array(y, "y", min_ndim=1)
    if g.shape != y.shape:
        raise ValueError(f"grad_out must have the shape of y {y.shape}, got {g.shape}")
    axis = axis_index(axis, y.ndim)
    return y * (g - (g * y).sum(axis=axis, keepdims=True))


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Logarithm of the softmax along ``axis``, without forming the softmax.

    .. math:: \log \operatorname{softmax}(x)_i = x_i - m - \log \sum_j e^{x_j - m}

    The log-sum-exp is taken after subtracting the row maximum ``m``, so large
    logits neither overflow nor lose the small differences between them.
    """
    x = float_array(x, "x", min_ndim=1)
    axis = axis_index(axis, x.ndim)
    if (x == -np.inf).all(axis=axis).any():
        raise ValueError("x has a row that is entirely -inf: its log-softmax is undefined")
    shifted = x - _shifted_max(x, axis, "x")
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def log_softmax_backward(grad_out: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Gradient through log-softmax, given its output ``y = log_softmax(x)``.

    .. math:: \frac{\partial L}{\partial x_i} = g_i - e^{y_i} \sum_j g_j
    """
    g = float_array(grad_out, "grad_out", min_ndim=1)
    y = float_array(y, "y", min_ndim=1)
    if g.shape != y.shape:
        raise ValueError(f"grad_out must have the shape of y {y.shape}, got {g.shape}")
    axis = axis_index(axis, y.ndim)
    return g - np.exp(y) * g.sum(axis=axis, keepdims=True)


def relu(x: np.ndarray) -> np.ndarray:
    r"""Rectified linear unit, :math:`\max(0, x)`."""
    x = float_array(x, "x")
    return np.maximum(x, 0)


def relu_grad(x: np.ndarray) -> np.ndarray:
    r"""Derivative of ReLU: 1 where :math:`x > 0`, else 0 (0 is used at :math:`x = 0`)."""
    x = float_array(x, "x")
    return (x > 0).astype(x.dtype)


def _gelu_approximation(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f'approximate must be "none" or "tanh", got {approximate!r}')
    return approximate


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    r"""Gaussian error linear unit :cite:p:`hendrycks2016gelu`.

    The exact form is :math:`x\,\Phi(x)` with :math:`\Phi` the standard normal
    CDF; ``approximate="tanh"`` gives the tanh approximation used by GPT-2 and
    BERT,

    .. math:: \tfrac12 x \bigl(1 + \tanh\bigl(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\bigr)\bigr).
    """
    x = float_array(x, "x")
    if _gelu_approximation(approximate) == "tanh":
        inner = _SQRT_2_OVER_PI * (x + _GELU_TANH_CUBIC * x**3)
        return 0.5 * x * (1.0 + np.tanh(inner))
    cdf = 0.5 * (1.0 + _erf(x * _INV_SQRT_2))
    return (x * cdf).astype(x.dtype, copy=False)


def gelu_grad(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    r"""Derivative of :func:`gelu`: :math:`\Phi(x) + x\,\varphi(x)` for the exact form."""
    x = float_array(x, "x")
    if _gelu_approximation(approximate) == "tanh":
        inner = _SQRT_2_OVER_PI * (x + _GELU_TANH_CUBIC * x**3)
        t = np.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_CUBIC * x**2)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner
    cdf = 0.5 * (1.0 + _erf(x * _INV_SQRT_2))
    pdf = _INV_SQRT_2PI * np.exp(-0.5 * x * x)
    return (cdf + x * pdf).astype(x.dtype, copy=False)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic sigmoid that never overflows: it only exponentiates ``-|x|``."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x: np.ndarray) -> np.ndarray:
    r"""Sigmoid linear unit (Swish with :math:`\beta = 1`): :math:`x\,\sigma(x)`."""
    x = float_array(x, "x")
    return x * _sigmoid(x)


def silu_grad(x: np.ndarray) -> np.ndarray:
    r"""Derivative of SiLU: :math:`\sigma(x)\,(1 + x\,(1 - \sigma(x)))`."""
    x = float_array(x, "x")
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))
