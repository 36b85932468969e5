"""Scaled dot-product attention and its exact backward pass.

The mask convention, used everywhere in tinyformer and in the book: a mask is a
boolean array that broadcasts to the score shape ``(..., T_q, T_k)`` and is
**True where a query may attend to a key**. Masked scores become ``-inf`` before
the softmax, so masked keys get weight exactly 0. A query whose every key is
masked gets zero weights and a zero output, never NaN.

These two functions are the attention of every model in tinyformer:
:class:`~tinyformer.multihead.MultiHeadAttention` projects its inputs, splits the
heads and calls them, in training, evaluation and cached decoding alike. Each
query's softmax is shifted by a number of its own row's, after masking, so a query's
output depends on its own row of scores only: not on the other sequences of a
batch, and under a causal mask not on later positions, to the last bit (for arrays of
one shape). The shift is 0 when the row's largest allowed score lies where ``exp``
cannot overflow, and that maximum otherwise (see ``functional._softmax``).
"""

from __future__ import annotations

import math

import numpy as np

from tinyformer._validation import (
    bool_mask,
    broadcasts_to,
    describe,
    float_array,
    same_dtype,
)
from tinyformer.functional import _row_dots, _softmax

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
    grad_output: object,
    weights: object,
    output: object,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check the output gradient and the forward's weights and output against q, k and v."""
    out_shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), q.shape[-2])
    grad = float_array(grad_output, "grad_output")
    weights = float_array(weights, "weights")
    output = float_array(output, "output")
    same_dtype((q, grad, weights, output), ("q", "grad_output", "weights", "output"))
    for name, array, shape in (
        ("grad_output", grad, (*out_shape, v.shape[-1])),
        ("output", output, (*out_shape, v.shape[-1])),
        ("weights", weights, (*out_shape, k.shape[-2])),
    ):
        if array.shape != shape:
            raise ValueError(f"{name} must have the shape {shape}, got {array.shape}")
    return grad, weights, output


def _check_keep(keep: object, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """A dropout multiplier that broadcasts to the weights' ``shape``, in their dtype (or None)."""
    if keep is None:
        return None
    arr = float_array(keep, "keep")
    if arr.dtype != dtype:
        raise TypeError(f"keep must have the dtype {dtype} of q, k and v, got {arr.dtype}")
    return broadcasts_to(arr, "keep", shape, "the weights' shape")


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
    keep: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Attention of :cite:t:`vaswani2017attention`: each query takes a weighted average of values.

    .. math::
        \operatorname{Attention}(Q, K, V)
        = \operatorname{softmax}\!\Bigl(\frac{Q K^\top}{\sqrt{d_k}}\Bigr) V

    The scale multiplies the queries before the product, which gives the same
    scores as scaling them afterwards (to rounding) for :math:`T_q d_k`
    multiplications instead of :math:`T_q T_k`.

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
        Broadcasting aligns trailing axes: with a head axis, ``(B, h, T_q, T_k)``
        scores need a padding mask of shape ``(B, 1, 1, T_k)``, not ``(B, 1, T_k)``
        (which would pair sequence ``b``'s padding with head ``b``).
    scale : float, optional
        Factor applied to the scores; ``None`` (the default) means
        :math:`1/\sqrt{d_k}`. Pass ``1.0`` to see what happens without scaling.
    keep : numpy.ndarray, optional
        Dropout on the weights, for training: a multiplier broadcastable to
        ``(..., T_q, T_k)``, 0 where a weight is dropped and :math:`1/(1-p)`
        elsewhere (:meth:`tinyformer.layers.Dropout.mask` draws one).

    Returns
    -------
    output : numpy.ndarray
        Shape ``(..., T_q, d_v)``.
    weights : numpy.ndarray
        The attention weights before dropout, shape ``(..., T_q, T_k)``; each
        row sums to one, or is all zeros where every key is masked.
    """
    q, k, v = _check_qkv(q, k, v)
    shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    allowed = None if mask is None else bool_mask(mask, "mask", shape)
    keep = _check_keep(keep, shape, q.dtype)
    return _attention(q, k, v, allowed, _scale(scale, q.shape[-1]), keep)


def _attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    allowed: np.ndarray | None,
    scale: float,
    keep: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`scaled_dot_product_attention` of checked arguments (what multi-head attention calls)."""
    # attention-forward-begin
    scores = (q * scale) @ np.swapaxes(k, -1, -2)  # (..., T_q, T_k); scaling q costs less
    weights = _softmax(scores, scores.ndim - 1, _SCORES, allowed)  # masked keys: exactly 0
    used = weights if keep is None else weights * keep  # dropout, in training only
    return used @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)
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
    output: np.ndarray,
    *,
    scale: float | None = None,
    keep: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Gradients of :func:`scaled_dot_product_attention` with respect to ``q``, ``k`` and ``v``.

    With :math:`A` the weights, :math:`O = AV` the output, :math:`S` the scaled
    scores, :math:`s` the scale and :math:`G = \partial L/\partial O`:

    .. math::
        \frac{\partial L}{\partial V} = A^\top G, \quad
        \frac{\partial L}{\partial A} = G V^\top, \quad
        \frac{\partial L}{\partial S} = A \odot \Bigl(\frac{\partial L}{\partial A}
            - \operatorname{rowsum}\bigl(A \odot \tfrac{\partial L}{\partial A}\bigr)\Bigr),

    .. math::
        \frac{\partial L}{\partial Q} = s\,\frac{\partial L}{\partial S} K, \qquad
        \frac{\partial L}{\partial K} = s\,\Bigl(\frac{\partial L}{\partial S}\Bigr)^{\!\top} Q.

    The softmax term needs no :math:`T_q \times T_k` product: row :math:`i` of
    :math:`A \odot G V^\top` sums to :math:`\sum_j A_{ij}\, g_i \cdot v_j
    = g_i \cdot o_i`, so :math:`\operatorname{rowsum}(A \odot \partial L/\partial A)
    = \operatorname{rowsum}(G \odot O)`, which costs :math:`d_v` per query
    instead of :math:`T_k` (the same identity holds with dropout, where :math:`O`
    is made from the kept weights). Masked entries have :math:`A = 0`, so no
    gradient flows through them; the mask itself is not needed.

    Parameters
    ----------
    grad_output : numpy.ndarray
        Gradient of the loss with respect to the output, ``(..., T_q, d_v)``.
    q, k, v : numpy.ndarray
        The forward inputs.
    weights, output : numpy.ndarray
        The weights ``(..., T_q, T_k)`` and the output ``(..., T_q, d_v)`` the
        forward pass returned.
    scale : float, optional
        The same scale as in the forward pass.
    keep : numpy.ndarray, optional
        The same dropout multiplier as in the forward pass.

    Returns
    -------
    tuple of numpy.ndarray
        ``(grad_q, grad_k, grad_v)``, shaped like ``q``, ``k`` and ``v``.
    """
    q, k, v = _check_qkv(q, k, v)
    grad, weights, output = _check_backward(grad_output, weights, output, q, k, v)
    keep = _check_keep(keep, weights.shape, weights.dtype)
    grad_q, grad_k, grad_v = _attention_backward(
        grad, q, k, v, weights, output, _scale(scale, q.shape[-1]), keep
    )
    return (
        _unbroadcast(grad_q, q.shape),
        _unbroadcast(grad_k, k.shape),
        _unbroadcast(grad_v, v.shape),
    )


def _attention_backward(
    grad: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    weights: np.ndarray,
    output: np.ndarray,
    scale: float,
    keep: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`scaled_dot_product_attention_backward` of checked arguments, before unbroadcasting."""
    used = weights if keep is None else weights * keep  # the weights that multiplied V
    # attention-backward-begin
    grad_v = np.swapaxes(used, -1, -2) @ grad  # dV = A^T G, (..., T_k, d_v)
    grad_w = grad @ np.swapaxes(v, -1, -2)  # dA = G V^T, (..., T_q, T_k)
    if keep is not None:
        grad_w *= keep  # back through the dropout
    # softmax backward, a vector-Jacobian product: dS = A * (dA - rowsum(A * dA)),
    # with rowsum(A * dA) = rowsum(G * O): d_v numbers per query instead of T_k
    grad_w -= _row_dots(grad, output)[..., None]
    grad_s = np.multiply(grad_w, weights, out=grad_w)  # (..., T_q, T_k)
    grad_q = grad_s @ k  # dQ = s dS K, (..., T_q, d_k)
    grad_q *= scale
    grad_k = np.swapaxes(grad_s, -1, -2) @ q  # dK = s dS^T Q, (..., T_k, d_k)
    grad_k *= scale
    # attention-backward-end
    return grad_q, grad_k, grad_v
