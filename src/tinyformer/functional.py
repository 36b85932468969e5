"""Elementwise and row-wise functions with their derivatives.

Each forward function sits next to the rule that differentiates it. The
``*_backward`` functions take the upstream gradient and return the gradient with
respect to the input (a vector-Jacobian product), so no Jacobian is ever built.
All functions keep the input's floating dtype: float32 in, float32 out.
"""

from __future__ import annotations

import math

import numpy as np

from tinyformer._validation import NonFiniteError, axis_index, describe, float_array

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
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_TANH_CUBIC = 0.044715


_BLOCK_BYTES = 1 << 17  # bytes per array in a pass of a blockwise function: all stay in cache


def _cdf_grid(step: float, z_max: float, dtype: type) -> np.ndarray:
    r""":math:`\Phi(z_j)` at :math:`z_j = -z_\text{max} + j\,\text{step}`, from :func:`math.erfc`."""
    z = np.arange(-round(z_max / step), round(z_max / step) + 1) * step
    return np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in z]).astype(dtype)


# The exact GELU needs Phi(x) for its value and phi(x) = exp(-x^2 / 2) / sqrt(2 pi) for its
# derivative. With phi(x) at hand, Phi(x) costs one table lookup: Taylor's series of Phi about
# x, evaluated at the nearest grid point z_j = x - h, gives
#     Phi(x) = Phi(z_j) + phi(x) sum_{k>=1} He_{k-1}(x) h^k / k!
# (He the probabilists' Hermite polynomials, from phi^(m) = (-1)^m He_m phi). Its remainder
# after K terms is about phi(x) |He_K(x)| |h|^(K+1) / (K+1)!: with |h| <= 1/1024 and K = 4
# below 1e-17 (float64), with |h| <= 1/2048 and K = 1 below 4e-8 (float32, whose rounding is
# larger). Beyond +-z_max, Phi is 0 or 1 to the dtype's precision (in absolute terms).
_CDF_GRIDS = {
    np.dtype(np.float64): (1.0 / 512.0, 8.5, _cdf_grid(1.0 / 512.0, 8.5, np.float64)),
    np.dtype(np.float32): (1.0 / 1024.0, 5.75, _cdf_grid(1.0 / 1024.0, 5.75, np.float32)),
}


def _constants(dtype: np.dtype) -> dict[str, np.ndarray]:
    """The scalars of :func:`_cdf_and_density` as 0-d arrays of ``dtype``.

    The same values a Python float would be rounded to, so the same results, but a
    ufunc takes a 0-d array of its own dtype in half the time: on the short rows of a
    decoding step, that call overhead is most of the cost.
    """
    step, z_max, _ = _CDF_GRIDS[dtype]
    values = {
        "z_max": z_max,
        "inverse_step": 1.0 / step,
        "step": step,
        "minus_half": -0.5,
        "inv_sqrt_2pi": _INV_SQRT_2PI,
        "one": 1.0,
        "three": 3.0,
        "half": 0.5,
        "sixth": 1.0 / 6.0,
        "twenty_fourth": 1.0 / 24.0,
    }
    return {name: np.array(value, dtype=dtype) for name, value in values.items()}


_CDF_CONSTANTS = {dtype: _constants(dtype) for dtype in _CDF_GRIDS}


def _cdf_and_density(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r""":math:`\Phi(x)` and :math:`\varphi(x)` of a float32 or float64 block (see above)."""
    _step, z_max, grid = _CDF_GRIDS[x.dtype]
    c = _CDF_CONSTANTS[x.dtype]
    xc = x.clip(-z_max, z_max)  # NaN stays NaN; the method costs less than np.clip
    s = np.add(xc, c["z_max"])
    np.multiply(s, c["inverse_step"], out=s)
    nearest = np.rint(s)
    with np.errstate(invalid="ignore"):  # NaN becomes some index; its h stays NaN
        cdf = grid.take(nearest.astype(np.int32), mode="clip")  # Phi(z_j); int32 casts faster
    h = np.subtract(s, nearest, out=s)
    np.multiply(h, c["step"], out=h)  # x - z_j, at most step / 2 in size
    density = np.multiply(x, x)
    np.multiply(density, c["minus_half"], out=density)
    np.exp(density, out=density)
    np.multiply(density, c["inv_sqrt_2pi"], out=density)  # phi(x)
    if x.dtype == np.float64:  # sum_{k=1..4} He_{k-1}(x) h^k / k!, by Horner in h
        x2 = np.multiply(xc, xc)
        series = np.subtract(x2, c["three"])
        np.multiply(series, xc, out=series)
        np.multiply(series, h, out=series)
        np.multiply(series, c["twenty_fourth"], out=series)  # He_3 h / 4!
        np.subtract(x2, c["one"], out=x2)
        np.multiply(x2, c["sixth"], out=x2)
        np.add(series, x2, out=series)  # He_2 / 3!
        np.multiply(series, h, out=series)
        np.add(series, np.multiply(c["half"], xc, out=x2), out=series)  # He_1 / 2!
        np.multiply(series, h, out=series)
        np.add(series, c["one"], out=series)  # He_0 / 1!
        np.multiply(series, h, out=series)
        np.multiply(series, density, out=series)
        np.add(cdf, series, out=cdf)
    else:  # k = 1 only: Phi(z_j) + phi(x) h
        np.multiply(h, density, out=h)
        np.add(cdf, h, out=cdf)
    return cdf, density


def _blockwise(function, x: np.ndarray, n_out: int) -> tuple[np.ndarray, ...]:
    """Run ``function(block, *out_blocks)`` over blocks of ``x``; return the outputs, shaped as x."""
    flat = np.ascontiguousarray(x).reshape(-1)
    outs = [np.empty_like(flat) for _ in range(n_out)]
    block = _BLOCK_BYTES // flat.itemsize
    if flat.size <= block:  # one block (a decoding step): no slices to make
        function(flat, *outs)
        return tuple(out.reshape(x.shape) for out in outs)
    for start in range(0, flat.size, block):
        stop = start + block
        function(flat[start:stop], *(out[start:stop] for out in outs))
    return tuple(out.reshape(x.shape) for out in outs)


def _gelu_block(x: np.ndarray, y: np.ndarray, dy: np.ndarray | None = None) -> None:
    r"""Exact GELU :math:`x\Phi(x)` and its derivative :math:`\Phi(x) + x\varphi(x)` (if ``dy``)."""
    cdf, density = _cdf_and_density(x)
    np.multiply(x, cdf, out=y)
    if dy is not None:
        density *= x
        np.add(cdf, density, out=dy)


def _gelu_tanh_block(x: np.ndarray, y: np.ndarray, dy: np.ndarray | None = None) -> None:
    r"""The tanh-approximated GELU and (if ``dy``) its derivative, for one block."""
    x2 = x * x
    inner = x2 * _GELU_TANH_CUBIC
    inner += 1.0
    inner *= _SQRT_2_OVER_PI * x  # sqrt(2/pi) (x + 0.044715 x^3)
    t = np.tanh(inner, out=inner)
    half = t + 1.0
    half *= 0.5  # (1 + t) / 2
    np.multiply(x, half, out=y)
    if dy is None:
        return
    x2 *= 3.0 * _GELU_TANH_CUBIC
    x2 += 1.0
    x2 *= _SQRT_2_OVER_PI  # d inner / dx
    t *= t
    np.subtract(1.0, t, out=t)
    t *= x2
    t *= 0.5 * x
    np.add(half, t, out=dy)


def _silu_block(x: np.ndarray, y: np.ndarray, dy: np.ndarray | None = None) -> None:
    r"""SiLU :math:`x\sigma(x)` and (if ``dy``) its derivative :math:`\sigma(x)(1 + x(1 - \sigma(x)))`."""
    s = _sigmoid(x)
    np.multiply(x, s, out=y)
    if dy is None:
        return
    one_minus = np.subtract(1.0, s)
    one_minus *= x
    one_minus += 1.0
    np.multiply(s, one_minus, out=dy)


_WITH_DERIVATIVE = {"gelu": _gelu_block, "gelu_tanh": _gelu_tanh_block, "silu": _silu_block}


def _activation_and_derivative(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """An activation and its derivative at ``x`` in one blockwise pass (what a layer keeps)."""
    y, dy = _blockwise(_WITH_DERIVATIVE[name], x, 2)
    return y, dy


def _activation(x: np.ndarray, name: str) -> np.ndarray:
    """The activation alone, by the same operations (the same bits) as its value above.

    For passes that no backward follows (a cached decoding step).
    """
    (y,) = _blockwise(_WITH_DERIVATIVE[name], x, 1)
    return y


def _row_sums(x: np.ndarray) -> np.ndarray:
    """Sums over the last axis, shape ``x.shape[:-1]``.

    ``einsum`` sums each row in one pass, several times faster than
    ``x.sum(axis=-1)`` on the short rows of attention, and each row's sum depends on
    that row alone.
    """
    return np.einsum("...i->...", x)


def _row_dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dot products of matching rows (the last axis) of ``a`` and ``b``, shape ``a.shape[:-1]``."""
    return np.einsum("...i,...i->...", a, b)


# exp(s) of every s in [low, high] is a normal number, and a sum of up to 1e9 such terms
# cannot overflow: a row whose largest entry lies in this range needs no shift.
_UNSHIFTED = {np.dtype(np.float32): (-80.0, 60.0), np.dtype(np.float64): (-700.0, 680.0)}


def _shifts(x: np.ndarray, axis: int, name: str) -> np.ndarray:
    """Each row's shift before exponentiating: 0 if its maximum needs none, else that maximum."""
    row_max = _row_max(x, axis, name)  # rows that are all -inf: 0
    low, high = _UNSHIFTED[x.dtype]
    return np.where((row_max >= low) & (row_max <= high), 0.0, row_max).astype(x.dtype)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Softmax along ``axis``, computed stably.

    .. math:: \operatorname{softmax}(x)_i = \frac{e^{x_i - c}}{\sum_j e^{x_j - c}}

    for any constant :math:`c`: subtracting it changes nothing mathematically. The
    textbook takes the row maximum, so that no exponent exceeds 0 and nothing
    overflows; here each row is shifted by its maximum only when it needs to be,
    and otherwise by 0 (see ``_softmax`` below). Entries equal to ``-inf`` get
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


def _softmax(x: np.ndarray, axis: int, name: str, allowed: np.ndarray | None = None) -> np.ndarray:
    """Softmax of a float array along a checked axis, in a new array.

    Entries where the boolean ``allowed`` (broadcast to ``x``) is False get
    weight exactly 0, as if they were ``-inf``. Each row is shifted by a number
    of its own: its largest allowed entry, unless that lies in a range where
    ``exp`` can neither overflow nor lose the row to underflow, and then 0. So a
    row's weights depend on that row's allowed entries alone; and when every
    entry is in that range (the usual case) the slow per-row maxima over short
    rows are skipped. ``name`` labels NaN and inf errors.
    """
    low, high = _UNSHIFTED[x.dtype]
    unshifted = low <= x.min() and x.max() <= high  # no row needs a shift (no NaN, no inf)
    if unshifted:
        e = np.exp(x)  # every entry at least exp(low) > 0
        if allowed is not None:
            e *= allowed  # masked entries: exactly 0
    else:
        if allowed is not None:
            x = np.where(allowed, x, -np.inf)  # masked entries: exactly 0 after exp
        e = np.exp(x - _shifts(x, axis, name))
    last = axis == x.ndim - 1  # attention's scores: the fast row sums
    total = _row_sums(e)[..., None] if last else e.sum(axis=axis, keepdims=True)
    if allowed is not None or not unshifted:
        total[total == 0] = 1  # rows that were all masked or -inf: 0 / 1 = 0
    e /= total
    return e


def _row_max(x: np.ndarray, axis: int, name: str) -> np.ndarray:
    """Row maxima used to shift ``x`` before exponentiating (0 for all ``-inf`` rows)."""
    row_max = np.max(x, axis=axis, keepdims=True)
    if np.isnan(row_max).any() or (row_max == np.inf).any():
        raise NonFiniteError(f"{name} must not contain NaN or +inf, got {describe(x)}")
    return np.where(row_max == -np.inf, 0.0, row_max).astype(x.dtype, copy=False)


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
    shifted = x - _row_max(x, axis, "x")
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


def _gelu_block_for(approximate: str):
    """The block function of the exact GELU or (``approximate="tanh"``) of its tanh form."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f'approximate must be "none" or "tanh", got {approximate!r}')
    return _gelu_tanh_block if approximate == "tanh" else _gelu_block


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    r"""Gaussian error linear unit :cite:p:`hendrycks2016gelu`.

    The exact form is :math:`x\,\Phi(x)` with :math:`\Phi` the standard normal
    CDF; ``approximate="tanh"`` gives the tanh approximation used by GPT-2 and
    BERT,

    .. math:: \tfrac12 x \bigl(1 + \tanh\bigl(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\bigr)\bigr).

    The arithmetic is in ``_gelu_block`` and ``_gelu_tanh_block``, the functions a
    feed-forward layer runs (value and derivative in one pass, a cache-sized block at a time).
    """
    x = float_array(x, "x")
    (y,) = _blockwise(_gelu_block_for(approximate), x, 1)
    return y


def gelu_grad(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    r"""Derivative of :func:`gelu`: :math:`\Phi(x) + x\,\varphi(x)` for the exact form."""
    x = float_array(x, "x")
    _, dy = _blockwise(_gelu_block_for(approximate), x, 2)
    return dy


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic sigmoid that never overflows: it only exponentiates ``-|x|``."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x: np.ndarray) -> np.ndarray:
    r"""Sigmoid linear unit (Swish with :math:`\beta = 1`): :math:`x\,\sigma(x)`.

    The arithmetic is in ``_silu_block``, the function a feed-forward layer runs.
    """
    x = float_array(x, "x")
    (y,) = _blockwise(_silu_block, x, 1)
    return y


def silu_grad(x: np.ndarray) -> np.ndarray:
    r"""Derivative of SiLU: :math:`\sigma(x)\,(1 + x\,(1 - \sigma(x)))`."""
    x = float_array(x, "x")
    _, dy = _blockwise(_silu_block, x, 2)
    return dy
