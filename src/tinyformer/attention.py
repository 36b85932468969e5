"""Scaled dot-product attention and its exact backward pass.

The mask convention, used everywhere in tinyformer and in the book: a mask is a
boolean array that broadcasts to the score shape ``(..., T_q, T_k)`` and is
**True where a query may attend to a key**. Masked scores become ``-inf`` before
the softmax, so masked keys get weight exactly 0. A query whose every key is
masked gets zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math

import numpy as np

from tinyformer._validation import bool_mask, describe, float_array, same_dtype
from tinyformer.functional import _softmax

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_backward"]

_SCORES = "the scores q @ k^T (check q and k for NaN and inf)"


def _check_qkv(q: object, k: object, v: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return q, k and v as float arrays of one dtype whose shapes fit together, else raise."""
    q = float_array(q, "q", min_ndim=2)
    k = float_array(k, "k", min_ndim=2)
    v = float_array(v, "v", min_ndim=2)
    same_dtype((q, k, v), ("q", "k", "v"))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "q and k must have the same last dimension d_k, got"
            f" q of shape {q.shape} and k of shape {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            "k and v must have the same number of keys T_k (axis -2), got"
            f" k of shape {k.shape} and v of shape {v.shape}"
        )
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            "the leading (batch, head) dimensions of q, k and v must broadcast, got"
            f" {q.shape}, {k.shape} and {v.shape}"
        ) from None
    return q, k, v


def _check_backward(
    grad_output: object, weights: object, q: np.ndarray, k: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Check the output gradient and the forward weights against the checked q, k and v."""
    out_shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), q.shape[-2])
    grad = float_array(grad_output, "grad_output")
    weights = float_array(weights, "weights")
    same_dtype((q, grad, weights), ("q", "grad_output", "weights"))
    if grad.shape != (*out_shape, v.shape[-1]):
        raise ValueError(
            f"grad_output must have the output shape {(*out_shape, v.shape[-1])}, got {grad.shape}"
        )
    if weights.shape != (*out_shape, k.shape[-2]):
        raise ValueError(
            f"weights must have the shape {(*out_shape, k.shape[-2])}, got {weights.shape}"
        )
    return grad, weights


def _scale(scale: object, d_k: int) -> float:
    """The factor for the scores: ``scale`` checked, or 1/sqrt(d_k) when it is None."""
    if scale is None:
        return 1.0 / math.sqrt(d_k)  # a Python float keeps float32 inputs float32
    if isinstance(scale, bool) or not isinstance(scale, int | float | np.floating):
        raise TypeError(f"scale must be a number or None, got {describe(scale)}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Attention of :cite:t:`vaswani2017attention`: each query takes a weighted average of values.

    .. math::
        \operatorname{Attention}(Q, K, V)
        = \operatorname{softmax}\!\Bigl(\frac{Q K^\top}{\sqrt{d_k}}\Bigr) V

    Parameters
    ----------
    q : numpy.ndarray
        Queries, shape ``(..., T_q, d_k)``.
    k : numpy.ndarray
        Keys, shape ``(..., T_k, d_k)``.
    v : numpy.ndarray
        Values, shape ``(..., T_k, d_v)``.
    mask : numpy.ndarray of bool, optional
        Broadcastable to ``(..., T_q, T_k)``; True where a query may attend.
    scale : float, optional
        Factor applied to the scores; defaults to :math:`1/\sqrt{d_k}`. Pass
        ``1.0`` to see what happens without scaling.

    Returns
    -------
    output : numpy.ndarray
        Shape ``(..., T_q, d_v)``.
    weights : numpy.ndarray
        The attention weights, shape ``(..., T_q, T_k)``; each row sums to one,
        or is all zeros where every key is masked.
    """
    q, k, v = _check_qkv(q, k, v)
    # attention-forward-begin
    scores = q @ np.swapaxes(k, -1, -2)  # (..., T_q, T_k)
    scores *= _scale(scale, q.shape[-1])
    if mask is not None:
        allowed = bool_mask(mask, "mask", scores.shape)
        scores = np.where(allowed, scores, -np.inf)  # masked keys: weight exactly 0
    weights = _softmax(scores, scores.ndim - 1, _SCORES)  # (..., T_q, T_k)
    return weights @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)
    # attention-forward-end


def _unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes along which an input of ``shape`` was broadcast."""
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def scaled_dot_product_attention_backward(
    grad_output: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    weights: np.ndarray,
    *,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Gradients of :func:`scaled_dot_product_attention` with respect to ``q``, ``k`` and ``v``.

    With :math:`A` the weights, :math:`S` the scaled scores and
    :math:`G = \partial L/\partial O`:

    .. math::
        \frac{\partial L}{\partial V} = A^\top G, \quad
        \frac{\partial L}{\partial A} = G V^\top, \quad
        \frac{\partial L}{\partial S} = A \odot \Bigl(\frac{\partial L}{\partial A}
            - \operatorname{rowsum}\bigl(A \odot \tfrac{\partial L}{\partial A}\bigr)\Bigr),

    .. math::
        \frac{\partial L}{\partial Q} = s\,\frac{\partial L}{\partial S} K, \qquad
        \frac{\partial L}{\partial K} = s\,\Bigl(\frac{\partial L}{\partial S}\Bigr)^{\!\top} Q.

    Masked entries have :math:`A = 0`, so no gradient flows through them; the
    mask itself is not needed.

    Parameters
    ----------
    grad_output : numpy.ndarray
        Gradient of the loss with respect to the output, ``(..., T_q, d_v)``.
    q, k, v : numpy.ndarray
        The forward inputs.
    weights : numpy.ndarray
        The weights the forward pass returned, ``(..., T_q, T_k)``.
    scale : float, optional
        The same scale as in the forward pass.

    Returns
    -------
    tuple of numpy.ndarray
        ``(grad_q, grad_k, grad_v)``, shaped like ``q``, ``k`` and ``v``.
    """
    q, k, v = _check_qkv(q, k, v)
    grad, weights = _check_backward(grad_output, weights, q, k, v)
    # attention-backward-begin
    grad_v = np.swapaxes(weights, -1, -2) @ grad  # dV = A^T G, (..., T_k, d_v)
    grad_w = grad @ np.swapaxes(v, -1, -2)  # dA = G V^T, (..., T_q, T_k)
    # softmax backward, a Jacobian-vector product: dS = A * (dA - rowsum(A * dA))
    grad_s = weights * (grad_w - (grad_w * weights).sum(axis=-1, keepdims=True))
    grad_s *= _scale(scale, q.shape[-1])  # the scale of S = s Q K^T, (..., T_q, T_k)
    grad_q = grad_s @ k  # dQ = s dS K, (..., T_q, d_k)
    grad_k = np.swapaxes(grad_s, -1, -2) @ q  # dK = s dS^T Q, (..., T_k, d_k)
    # attention-backward-end
    return (
        _unbroadcast(grad_q, q.shape),
        _unbroadcast(grad_k, k.shape),
        _unbroadcast(grad_v, v.shape),
    )
