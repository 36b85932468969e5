r"""Two ways around attention's :math:`T_q \times T_k` matrix.

- :func:`linear_attention` changes the function: a positive feature map
  replaces the softmax kernel, and reassociating the products makes the cost
  linear in the sequence length :cite:p:`katharopoulos2020transformers`.
- :func:`tiled_attention` computes *exactly* softmax attention, but visits the
  keys one tile at a time with an online softmax (a running maximum and a
  running sum, :cite:t:`milakov2018online`), so the full score matrix is never
  held in memory :cite:p:`rabe2021self,dao2022flashattention`. Its backward
  pass recomputes each tile's weights from the saved log-sum-exp.

Both take the same ``q, k, v`` arrays as
:func:`~tinyformer.attention.scaled_dot_product_attention`, with any leading
(batch, head) axes.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import bool_mask, float_array, one_of, positive_float, positive_int
from tinyformer.attention import _check_qkv, _scale, _unbroadcast

__all__ = [
    "FEATURE_MAPS",
    "linear_attention",
    "linear_attention_backward",
    "tiled_attention",
    "tiled_attention_backward",
]

FEATURE_MAPS = ("elu+1", "relu")
r"""Feature maps :math:`\phi` for :func:`linear_attention`: :math:`\mathrm{elu}(x) + 1`, ReLU."""


# ------------------------------------------------------------ linear attention
def _features(x: np.ndarray, feature_map: str) -> tuple[np.ndarray, np.ndarray]:
    r"""The feature map :math:`\phi(x)` and its derivative :math:`\phi'(x)`."""
    if feature_map == "relu":
        return np.maximum(x, 0), (x > 0).astype(x.dtype)
    negative_part = np.exp(np.minimum(x, 0))  # never overflows
    return np.where(x > 0, x + 1, negative_part), np.where(x > 0, 1, negative_part).astype(x.dtype)


def _check_linear(
    q: object, k: object, v: object, causal: object, feature_map: object, eps: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    q, k, v = _check_qkv(q, k, v)
    one_of(feature_map, FEATURE_MAPS, "feature_map")
    if not isinstance(causal, bool | np.bool_):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            "causal linear attention needs as many queries as keys, got"
            f" q of shape {q.shape} and k of shape {k.shape}"
        )
    return q, k, v, positive_float(eps, "eps")


def _prefix_state(phi_k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Running sums :math:`S_i = \sum_{j \le i} \phi(k_j) v_j^\top` and :math:`z_i = \sum_{j \le i} \phi(k_j)`."""
    outer = phi_k[..., :, :, None] * v[..., :, None, :]  # (..., T, d_k, d_v)
    return np.cumsum(outer, axis=-3), np.cumsum(phi_k, axis=-2)


def linear_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    feature_map: str = "elu+1",
    eps: float = 1e-6,
) -> np.ndarray:
    r"""Kernelized linear attention of :cite:t:`katharopoulos2020transformers`.

    Replacing :math:`\exp(q \cdot k)` by :math:`\phi(q) \cdot \phi(k)` lets the
    sum over keys be taken once for all queries:

    .. math::
        o_i = \frac{\phi(q_i)^\top S}{\phi(q_i)^\top z + \epsilon}, \qquad
        S = \sum_j \phi(k_j)\, v_j^\top, \quad z = \sum_j \phi(k_j),

    which costs :math:`O(T d_k d_v)` instead of :math:`O(T^2 d)`. The causal form
    uses the prefix sums :math:`S_i, z_i` over :math:`j \le i` instead, which is
    what makes it a recurrent network with a :math:`d_k \times d_v` state.

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Shapes ``(..., T_q, d_k)``, ``(..., T_k, d_k)``, ``(..., T_k, d_v)``.
    causal : bool
        Query :math:`i` sees keys :math:`j \le i` only (needs ``T_q == T_k``).
    feature_map : str
        :math:`\phi`: ``"elu+1"`` (the paper's, positive everywhere) or ``"relu"``.
    eps : float
        Keeps the denominator away from zero.

    Returns
    -------
    numpy.ndarray
        ``(..., T_q, d_v)``, dtype of the inputs.
    """
    q, k, v, eps = _check_linear(q, k, v, causal, feature_map, eps)
    phi_q, _ = _features(q, feature_map)
    phi_k, _ = _features(k, feature_map)
    numerator, denominator = _linear_parts(phi_q, phi_k, v, causal, eps)
    return numerator / denominator


def _linear_parts(
    phi_q: np.ndarray, phi_k: np.ndarray, v: np.ndarray, causal: bool, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Numerator ``(..., T_q, d_v)`` and denominator ``(..., T_q, 1)`` of linear attention."""
    if causal:
        state, norm = _prefix_state(phi_k, v)  # (..., T, d_k, d_v), (..., T, d_k)
        numerator = np.einsum("...td,...tde->...te", phi_q, state)
        denominator = np.einsum("...td,...td->...t", phi_q, norm)[..., None]
    else:
        state = np.swapaxes(phi_k, -1, -2) @ v  # (..., d_k, d_v)
        numerator = phi_q @ state  # (..., T_q, d_v)
        denominator = phi_q @ phi_k.sum(axis=-2)[..., None]  # (..., T_q, 1)
    return numerator, denominator + eps


def linear_attention_backward(
    grad_output: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    feature_map: str = "elu+1",
    eps: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Gradients of :func:`linear_attention` for ``q``, ``k`` and ``v`` (recomputing the forward).

    With :math:`n_i` and :math:`d_i` the numerator and denominator, :math:`g_i`
    the upstream gradient, :math:`a_i = g_i / d_i` and
    :math:`c_i = -g_i \cdot o_i / d_i`:

    .. math::
        \frac{\partial L}{\partial \phi(q_i)} = S a_i + c_i z, \quad
        \frac{\partial L}{\partial \phi(k_j)} = R\, v_j + r, \quad
        \frac{\partial L}{\partial v_j} = R^\top \phi(k_j),

    with :math:`R = \sum_i \phi(q_i) a_i^\top` and :math:`r = \sum_i c_i \phi(q_i)`.
    In the causal form :math:`S, z` become the prefix sums over :math:`j \le i`
    and :math:`R, r` the suffix sums over :math:`i \ge j`. Finally
    :math:`\partial L/\partial q = \phi'(q) \odot \partial L/\partial \phi(q)`,
    and the same for :math:`k`.

    Returns
    -------
    tuple of numpy.ndarray
        ``(grad_q, grad_k, grad_v)`` shaped like ``q``, ``k``, ``v``.
    """
    q, k, v, eps = _check_linear(q, k, v, causal, feature_map, eps)
    phi_q, dphi_q = _features(q, feature_map)
    phi_k, dphi_k = _features(k, feature_map)
    numerator, denominator = _linear_parts(phi_q, phi_k, v, causal, eps)
    out_shape = numerator.shape
    grad = float_array(grad_output, "grad_output")
    if grad.shape != out_shape:
        raise ValueError(f"grad_output must have the output shape {out_shape}, got {grad.shape}")
    a = grad / denominator  # (..., T_q, d_v)
    c = -(a * (numerator / denominator)).sum(axis=-1, keepdims=True)  # (..., T_q, 1)
    if causal:
        state, norm = _prefix_state(phi_k, v)
        grad_phi_q = np.einsum("...tde,...te->...td", state, a) + c * norm
        outer = phi_q[..., :, :, None] * a[..., :, None, :]  # (..., T, d_k, d_v)
        suffix = np.flip(np.cumsum(np.flip(outer, -3), axis=-3), -3)
        suffix_norm = np.flip(np.cumsum(np.flip(c * phi_q, -2), axis=-2), -2)
        grad_phi_k = np.einsum("...tde,...te->...td", suffix, v) + suffix_norm
        grad_v = np.einsum("...tde,...td->...te", suffix, phi_k)
    else:
        state = np.swapaxes(phi_k, -1, -2) @ v  # (..., d_k, d_v)
        norm = phi_k.sum(axis=-2)[..., None, :]  # (..., 1, d_k)
        grad_phi_q = a @ np.swapaxes(state, -1, -2) + c * norm
        total = np.swapaxes(phi_q, -1, -2) @ a  # R, (..., d_k, d_v)
        total_norm = (c * phi_q).sum(axis=-2, keepdims=True)  # r, (..., 1, d_k)
        grad_phi_k = v @ np.swapaxes(total, -1, -2) + total_norm
        grad_v = phi_k @ total
    return (
        _unbroadcast(grad_phi_q * dphi_q, q.shape),
        _unbroadcast(grad_phi_k * dphi_k, k.shape),
        _unbroadcast(grad_v, v.shape),
    )


# ------------------------------------------------------------- tiled attention
def _check_tiled(
    q: object, k: object, v: object, mask: object, block_size: object, causal: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, int, tuple[int, ...]]:
    q, k, v = _check_qkv(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not np.isfinite(x).all():
            raise ValueError(f"{name} must not contain NaN or inf")
    block = positive_int(block_size, "block_size")
    if not isinstance(causal, bool | np.bool_):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__}")
    if causal and k.shape[-2] < q.shape[-2]:
        raise ValueError(
            "causal tiled attention needs at least as many keys as queries (queries are the"
            f" last positions), got q of shape {q.shape} and k of shape {k.shape}"
        )
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    allowed = None
    if mask is not None:
        allowed = bool_mask(mask, "mask", (*batch, q.shape[-2], k.shape[-2]))
    return q, k, v, allowed, block, batch


def _tile_scores(
    q: np.ndarray,
    k_tile: np.ndarray,
    scale: float,
    allowed: np.ndarray | None,
    keys: slice,
    causal: bool,
    t_k: int,
) -> np.ndarray:
    """Scaled scores of every query against one tile of keys, masked to ``-inf``.

    The causal mask of the tile is built from positions here, so no ``(T_q, T_k)``
    mask ever exists; queries are the last ``T_q`` of the ``t_k`` positions.
    """
    scores = q @ np.swapaxes(k_tile, -1, -2)  # (..., T_q, tile)
    scores *= scale
    if allowed is not None:
        whole = allowed.ndim == 0 or allowed.shape[-1] == 1  # broadcast over keys
        scores = np.where(allowed if whole else allowed[..., keys], scores, -np.inf)
    if causal:
        t_q = q.shape[-2]
        query_position = np.arange(t_k - t_q, t_k)[:, None]  # (T_q, 1)
        key_position = np.arange(keys.start, keys.stop)[None, :]  # (1, tile)
        scores = np.where(key_position <= query_position, scores, -np.inf)
    return scores


def tiled_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    block_size: int = 64,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact softmax attention over tiles of keys, with an online softmax.

    For each tile of keys it updates, per query, the running maximum :math:`m`,
    the running sum :math:`\ell` of :math:`e^{s - m}` and the running output
    :math:`a` (an unnormalized weighted sum of values):

    .. math::
        m' = \max\bigl(m, \max_j s_j\bigr), \quad
        \ell' = e^{m - m'} \ell + \sum_j e^{s_j - m'}, \quad
        a' = e^{m - m'} a + \sum_j e^{s_j - m'} v_j,

    and finally returns :math:`o = a / \ell`, which equals
    :func:`~tinyformer.attention.scaled_dot_product_attention` to rounding.
    Only a ``(T_q, block_size)`` slice of scores exists at any time. A query
    whose keys are all masked gets a zero output and log-sum-exp :math:`-\infty`.

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Shapes ``(..., T_q, d_k)``, ``(..., T_k, d_k)``, ``(..., T_k, d_v)``.
    mask : numpy.ndarray of bool, optional
        Broadcastable to ``(..., T_q, T_k)``; True where a query may attend.
    block_size : int
        Number of keys per tile.
    causal : bool
        Query :math:`i` sees keys :math:`j \le i` only, with the queries aligned to
        the last keys as in :func:`~tinyformer.masks.causal_mask`; the mask is built
        tile by tile, so it never takes :math:`T_q \times T_k` memory. Combines
        with ``mask`` (a key must be allowed by both).
    scale : float, optional
        Score scale, :math:`1/\sqrt{d_k}` by default.

    Returns
    -------
    output : numpy.ndarray
        ``(..., T_q, d_v)``.
    log_sum_exp : numpy.ndarray
        :math:`m + \log \ell` per query, ``(..., T_q)``: all the backward pass
        needs to rebuild any tile's weights.
    """
    q, k, v, allowed, block, batch = _check_tiled(q, k, v, mask, block_size, causal)
    s = _scale(scale, q.shape[-1])
    t_q, t_k = q.shape[-2], k.shape[-2]
    running_max = np.full((*batch, t_q, 1), -np.inf, dtype=q.dtype)
    running_sum = np.zeros((*batch, t_q, 1), dtype=q.dtype)
    acc = np.zeros((*batch, t_q, v.shape[-1]), dtype=q.dtype)  # (..., T_q, d_v)
    # online-softmax-begin
    for start in range(0, t_k, block):
        keys = slice(start, min(start + block, t_k))
        k_tile = k[..., keys, :]  # (..., tile, d_k)
        scores = _tile_scores(q, k_tile, s, allowed, keys, causal, t_k)  # (..., T_q, tile)
        new_max = np.maximum(running_max, scores.max(axis=-1, keepdims=True))
        shift = np.where(new_max == -np.inf, 0, new_max)  # rows masked so far stay at 0 weight
        p = np.exp(scores - shift)  # (..., T_q, tile)
        correction = np.exp(running_max - shift)
        running_sum = running_sum * correction + p.sum(axis=-1, keepdims=True)
        acc = acc * correction + p @ v[..., keys, :]
        running_max = new_max
    # online-softmax-end
    empty = running_sum == 0  # every key masked
    output = acc / np.where(empty, 1, running_sum)
    with np.errstate(divide="ignore"):
        log_sum_exp = np.where(empty, -np.inf, running_max + np.log(running_sum))
    return output, log_sum_exp[..., 0]


def tiled_attention_backward(
    grad_output: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    output: np.ndarray,
    log_sum_exp: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    block_size: int = 64,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Gradients of :func:`tiled_attention`, one tile of keys at a time.

    Each tile's weights are rebuilt as :math:`P = e^{S - \text{lse}}`; with
    :math:`G` the upstream gradient and :math:`D = \operatorname{rowsum}(G \odot O)`,

    .. math::
        \frac{\partial L}{\partial V_\text{tile}} = P^\top G, \quad
        \frac{\partial L}{\partial S} = P \odot (G V_\text{tile}^\top - D), \quad
        \frac{\partial L}{\partial Q} \mathrel{+}= s\,\frac{\partial L}{\partial S} K_\text{tile},
        \quad
        \frac{\partial L}{\partial K_\text{tile}} = s \Bigl(\frac{\partial L}{\partial S}\Bigr)^{\!\top} Q.

    Pass the same ``mask``, ``block_size``, ``causal`` and ``scale`` as in the forward pass.

    Returns
    -------
    tuple of numpy.ndarray
        ``(grad_q, grad_k, grad_v)`` shaped like ``q``, ``k``, ``v``.
    """
    q, k, v, allowed, block, batch = _check_tiled(q, k, v, mask, block_size, causal)
    s = _scale(scale, q.shape[-1])
    t_q, t_k = q.shape[-2], k.shape[-2]
    out_shape = (*batch, t_q, v.shape[-1])
    grad = float_array(grad_output, "grad_output")
    output = float_array(output, "output")
    lse = float_array(log_sum_exp, "log_sum_exp")
    for name, x, shape in (
        ("grad_output", grad, out_shape),
        ("output", output, out_shape),
        ("log_sum_exp", lse, out_shape[:-1]),
    ):
        if x.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {x.shape}")
    lse = np.where(lse == -np.inf, 0, lse)[..., None]  # fully masked rows: P = e^(-inf) = 0
    row_term = (grad * output).sum(axis=-1, keepdims=True)  # D, (..., T_q, 1)
    grad_q = np.zeros((*batch, t_q, q.shape[-1]), dtype=q.dtype)
    grad_k = np.empty((*batch, t_k, k.shape[-1]), dtype=q.dtype)
    grad_v = np.empty((*batch, t_k, v.shape[-1]), dtype=q.dtype)
    # tiled-backward-begin
    for start in range(0, t_k, block):
        keys = slice(start, min(start + block, t_k))
        k_tile = k[..., keys, :]  # (..., tile, d_k)
        scores = _tile_scores(q, k_tile, s, allowed, keys, causal, t_k)  # (..., T_q, tile)
        p = np.exp(scores - lse)  # the tile's weights, rebuilt
        grad_v[..., keys, :] = np.swapaxes(p, -1, -2) @ grad
        grad_scores = p * (grad @ np.swapaxes(v[..., keys, :], -1, -2) - row_term)  # dL/dS
        grad_scores *= s
        grad_q += grad_scores @ k_tile
        grad_k[..., keys, :] = np.swapaxes(grad_scores, -1, -2) @ q
    # tiled-backward-end
    return (
        _unbroadcast(grad_q, q.shape),
        _unbroadcast(grad_k, k.shape),
        _unbroadcast(grad_v, v.shape),
    )
