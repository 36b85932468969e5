r"""Two ways around attention's :math:`T_q \times T_k` matrix, and what the exact one saves.

- :func:`linear_attention` changes the function: a positive feature map
  replaces the softmax kernel, and reassociating the products makes the cost
  linear in the sequence length :cite:p:`katharopoulos2020transformers`.
- :func:`tiled_attention` computes *exactly* softmax attention, but visits the
  keys one tile at a time with an online softmax (a running maximum and a
  running sum, :cite:t:`milakov2018online`), so the full score matrix is never
  held in memory :cite:p:`rabe2021self,dao2022flashattention`. Its backward
  pass recomputes each tile's weights from the saved log-sum-exp.
- :func:`standard_attention_io` and :func:`flash_attention_io` count what the two
  algorithms of :cite:t:`dao2022flashattention` (their Algorithms 0 and 1) move between
  a slow memory and a fast memory of ``fast_memory`` elements, while computing the output:
  the IO complexity of their Theorem 2. :func:`standard_attention_backward_io` and
  :func:`flash_attention_backward_io` do the same for the backward passes (their
  Algorithms 3 and 4, Theorem 5).

All take the same ``q, k, v`` arrays as
:func:`~tinyformer.attention.scaled_dot_product_attention`, with any leading
(batch, head) axes (the counting functions want the same leading axes on all three).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import (
    bool_mask,
    describe,
    float_array,
    one_of,
    positive_float,
    positive_int,
    same_dtype,
)
from tinyformer.attention import _check_qkv, _scale, _unbroadcast

__all__ = [
    "FEATURE_MAPS",
    "MemoryTraffic",
    "flash_attention_backward_io",
    "flash_attention_io",
    "flash_block_sizes",
    "linear_attention",
    "linear_attention_backward",
    "standard_attention_backward_io",
    "standard_attention_io",
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


# ------------------------------------------------------- memory traffic (IO)
@dataclass(frozen=True)
class MemoryTraffic:
    """What one attention call moved between slow and fast memory, and the arithmetic it did.

    Attributes
    ----------
    reads, writes : dict of str to int
        Elements read from and written to each array kept in slow memory, summed over
        every load and store: ``"Q"``, ``"K"``, ``"V"``, ``"O"``, then ``"S"`` and ``"P"``
        (standard attention) or ``"l"`` and ``"m"`` (FlashAttention); the backward passes add
        ``"dO"``, ``"dQ"``, ``"dK"``, ``"dV"`` and, for standard attention, ``"dP"``, ``"dS"``.
    matmul_flops : int
        FLOPs of matrix products, :math:`2mnk` for an ``(m, k) @ (k, n)`` product.
    other_flops : int
        Every other floating-point operation: one per element for each elementwise
        operation, and one per input element for each row maximum or row sum.
    """

    reads: dict[str, int]
    writes: dict[str, int]
    matmul_flops: int
    other_flops: int

    @property
    def total(self) -> int:
        """Elements read plus elements written, the count of Theorems 2 and 5."""
        return sum(self.reads.values()) + sum(self.writes.values())

    @property
    def flops(self) -> int:
        """All floating-point operations, ``matmul_flops + other_flops``."""
        return self.matmul_flops + self.other_flops


class _SlowMemory:
    """Arrays kept outside the tile loop; every load, store and operation on a tile is counted."""

    def __init__(self, **arrays: np.ndarray) -> None:
        self.arrays = arrays
        self.reads = dict.fromkeys(arrays, 0)
        self.writes = dict.fromkeys(arrays, 0)
        self.matmul_flops = 0
        self.other_flops = 0

    def load(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """Copy rows of a slow array into fast memory."""
        block = self.arrays[name][..., rows, :].copy()  # (..., rows, columns)
        self.reads[name] += block.size
        return block

    def store(self, name: str, block: np.ndarray, rows: slice = slice(None)) -> None:
        """Write a block from fast memory back into rows of a slow array."""
        self.arrays[name][..., rows, :] = block
        self.writes[name] += block.size

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = a @ b
        self.matmul_flops += 2 * out.size * a.shape[-1]
        return out

    def ops(self, result: np.ndarray, per_element: int) -> np.ndarray:
        """Count ``per_element`` operations for each element of ``result``."""
        self.other_flops += per_element * result.size
        return result

    def traffic(self) -> MemoryTraffic:
        return MemoryTraffic(
            dict(self.reads), dict(self.writes), self.matmul_flops, self.other_flops
        )


def flash_block_sizes(fast_memory: int, d: int) -> tuple[int, int]:
    r"""Rows of queries and of keys per block, as in Algorithm 1 of :cite:t:`dao2022flashattention`.

    .. math::
        B_c = \left\lceil \frac{M}{4d} \right\rceil, \qquad
        B_r = \min\!\left(\left\lceil \frac{M}{4d} \right\rceil, d\right).

    A block of keys and one of values then take about :math:`M/2` elements, a block of
    queries and one of outputs at most as much, and the scores of a block pair
    :math:`B_r B_c` about :math:`M/4`: a working set of :math:`\Theta(M)`, as the paper's
    count needs (the sum may exceed :math:`M` by a constant factor, which the
    :math:`\Theta` absorbs).

    Parameters
    ----------
    fast_memory : int
        :math:`M`, elements of fast memory; at least ``d`` (the paper's range is
        :math:`d \le M \le Nd`).
    d : int
        Head dimension.

    Returns
    -------
    tuple of int
        ``(B_r, B_c)``.
    """
    d = positive_int(d, "d")
    memory = positive_int(fast_memory, "fast_memory")
    if memory < d:
        raise ValueError(f"fast_memory must be at least the head dimension d = {d}, got {memory}")
    keys_per_block = math.ceil(memory / (4 * d))
    return min(keys_per_block, d), keys_per_block


def _check_io(q: object, k: object, v: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = _check_qkv(q, k, v)
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            "q, k and v must have the same leading (batch, head) dimensions to be counted, got"
            f" {q.shape}, {k.shape} and {v.shape}"
        )
    return q, k, v


def standard_attention_io(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray, MemoryTraffic]:
    r"""Softmax attention as Algorithm 0 of :cite:t:`dao2022flashattention`, counting its traffic.

    Each step reads its inputs from slow memory and writes its result back:

    .. math::
        S = s\,Q K^\top \to \text{slow}, \quad
        P = \operatorname{softmax}(S) \to \text{slow}, \quad
        O = P V \to \text{slow},

    Each of :math:`Q, K, V` is read once, :math:`S` and :math:`P` are each written once
    and read once, and :math:`O` is written once:

    .. math::
        N_q d_k + N_k d_k + N_k d_v + 4 N_q N_k + N_q d_v

    elements, :math:`4Nd + 4N^2 = \Theta(Nd + N^2)` for :math:`N_q = N_k = N` and
    :math:`d_k = d_v = d`. As in the paper, each input counts once, as if the products
    were computed with enough fast memory to need no second pass over them.

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Shapes ``(..., N_q, d_k)``, ``(..., N_k, d_k)``, ``(..., N_k, d_v)``, the same
        leading axes.
    scale : float, optional
        Score scale :math:`s`, :math:`1/\sqrt{d_k}` by default.

    Returns
    -------
    output : numpy.ndarray
        ``(..., N_q, d_v)``, equal to :func:`~tinyformer.attention.scaled_dot_product_attention`.
    weights : numpy.ndarray
        :math:`P`, ``(..., N_q, N_k)``: what :func:`standard_attention_backward_io` reads.
    traffic : MemoryTraffic
        Elements moved per array, and the FLOPs.
    """
    q, k, v = _check_io(q, k, v)
    s = _scale(scale, q.shape[-1])
    lead, t_q, t_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    memory = _SlowMemory(
        Q=q, K=k, V=v,
        S=np.empty((*lead, t_q, t_k), dtype=q.dtype),
        P=np.empty((*lead, t_q, t_k), dtype=q.dtype),
        O=np.empty((*lead, t_q, v.shape[-1]), dtype=q.dtype),
    )  # fmt: skip
    product = memory.matmul(memory.load("Q"), np.swapaxes(memory.load("K"), -1, -2))
    memory.store("S", memory.ops(product * s, 1))  # (..., N_q, N_k)
    scores = memory.load("S")
    row_max = memory.ops(scores.max(axis=-1, keepdims=True), t_k)  # N_k per row
    e = memory.ops(np.exp(scores - row_max), 2)  # subtract, exponentiate
    total = memory.ops(e.sum(axis=-1, keepdims=True), t_k)
    memory.store("P", memory.ops(e / total, 1))
    memory.store("O", memory.matmul(memory.load("P"), memory.load("V")))  # (..., N_q, d_v)
    return memory.arrays["O"], memory.arrays["P"], memory.traffic()


def _flash_step(
    memory: _SlowMemory,
    q_i: np.ndarray,
    k_j: np.ndarray,
    v_j: np.ndarray,
    o_i: np.ndarray,
    l_i: np.ndarray,
    m_i: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lines 9 to 12 of Algorithm 1, on one block pair in fast memory: new ``O_i, l_i, m_i``."""
    keys = k_j.shape[-2]
    scores = memory.ops(memory.matmul(q_i, np.swapaxes(k_j, -1, -2)) * scale, 1)  # (..., B_r, B_c)
    tile_max = memory.ops(scores.max(axis=-1, keepdims=True), keys)  # (..., B_r, 1)
    p = memory.ops(np.exp(scores - tile_max), 2)  # (..., B_r, B_c)
    tile_sum = memory.ops(p.sum(axis=-1, keepdims=True), keys)  # (..., B_r, 1)
    m_new = memory.ops(np.maximum(m_i, tile_max), 1)
    old = memory.ops(np.exp(m_i - m_new), 2)  # e^(m_i - m_new); 0 while m_i = -inf
    new = memory.ops(np.exp(tile_max - m_new), 2)
    l_new = memory.ops(old * l_i + new * tile_sum, 3)
    kept = memory.ops(l_i * old, 1)  # (..., B_r, 1)
    pv = memory.matmul(p, v_j)  # (..., B_r, d_v)
    o_new = memory.ops((kept * o_i + new * pv) / l_new, 4)  # (..., B_r, d_v)
    return o_new, l_new, m_new


def flash_attention_io(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    fast_memory: int,
    *,
    scale: float | None = None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], MemoryTraffic]:
    r"""Algorithm 1 (FlashAttention) of :cite:t:`dao2022flashattention`, counting its traffic.

    The output :math:`O` and the statistics :math:`\ell, m` live in slow memory. For each
    block :math:`K_j, V_j` of :math:`B_c` keys (loaded once), every block of :math:`B_r`
    queries loads :math:`Q_i, O_i, \ell_i, m_i`, updates them with the online softmax,

    .. math::
        m_i^\text{new} = \max(m_i, \tilde m_{ij}), \quad
        \ell_i^\text{new} = e^{m_i - m_i^\text{new}} \ell_i
            + e^{\tilde m_{ij} - m_i^\text{new}} \tilde\ell_{ij}, \quad
        O_i \leftarrow \frac{\ell_i e^{m_i - m_i^\text{new}} O_i
            + e^{\tilde m_{ij} - m_i^\text{new}} \tilde P_{ij} V_j}{\ell_i^\text{new}},

    and writes them back. With :math:`T_c = \lceil N_k / B_c \rceil` passes over the
    queries, the traffic is :math:`N_k (d_k + d_v)` for the keys and values,
    :math:`N_q (d_v + 2)` for initializing :math:`O, \ell, m`, and
    :math:`T_c N_q (d_k + 2 d_v + 4)` for the passes: :math:`\Theta(N^2 d^2 / M)` since
    :math:`T_c \approx 4Nd/M` (Theorem 2).

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Shapes ``(..., N_q, d_k)``, ``(..., N_k, d_k)``, ``(..., N_k, d_v)``, the same
        leading axes.
    fast_memory : int
        :math:`M`, elements of fast memory; sets the block sizes (:func:`flash_block_sizes`).
    scale : float, optional
        Score scale, :math:`1/\sqrt{d_k}` by default.

    Returns
    -------
    output : numpy.ndarray
        ``(..., N_q, d_v)``, equal to :func:`~tinyformer.attention.scaled_dot_product_attention`
        to rounding.
    statistics : tuple of numpy.ndarray
        :math:`(\ell, m)`, each ``(..., N_q)``: the row sums and maxima that
        :func:`flash_attention_backward_io` needs to rebuild :math:`P`.
    traffic : MemoryTraffic
        Elements moved per array, and the FLOPs.
    """
    q, k, v = _check_io(q, k, v)
    s = _scale(scale, q.shape[-1])
    rows_per_block, keys_per_block = flash_block_sizes(fast_memory, q.shape[-1])
    lead, t_q, t_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    memory = _SlowMemory(
        Q=q, K=k, V=v,
        O=np.empty((*lead, t_q, v.shape[-1]), dtype=q.dtype),
        l=np.empty((*lead, t_q, 1), dtype=q.dtype),
        m=np.empty((*lead, t_q, 1), dtype=q.dtype),
    )  # fmt: skip
    memory.store("O", np.zeros_like(memory.arrays["O"]))  # line 2: initialize in slow memory
    memory.store("l", np.zeros_like(memory.arrays["l"]))
    memory.store("m", np.full_like(memory.arrays["m"], -np.inf))
    # flash-loop-begin
    for key_start in range(0, t_k, keys_per_block):
        keys = slice(key_start, key_start + keys_per_block)
        k_j, v_j = memory.load("K", keys), memory.load("V", keys)  # (..., B_c, d)
        for query_start in range(0, t_q, rows_per_block):
            rows = slice(query_start, query_start + rows_per_block)
            q_i, o_i, l_i, m_i = (memory.load(name, rows) for name in ("Q", "O", "l", "m"))
            o_i, l_i, m_i = _flash_step(memory, q_i, k_j, v_j, o_i, l_i, m_i, s)
            for name, block in (("O", o_i), ("l", l_i), ("m", m_i)):
                memory.store(name, block, rows)
    # flash-loop-end
    statistics = (memory.arrays["l"][..., 0], memory.arrays["m"][..., 0])
    return memory.arrays["O"], statistics, memory.traffic()


def _transpose(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _check_io_backward(
    grad_output: object, q: np.ndarray, v: np.ndarray, arrays: dict[str, tuple[object, tuple]]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The output gradient and the saved arrays, checked against the shapes they must have."""
    grad = float_array(grad_output, "grad_output")
    shape = (*q.shape[:-1], v.shape[-1])
    if grad.shape != shape:
        raise ValueError(f"grad_output must have the output's shape {shape}, got {grad.shape}")
    checked = {}
    for name, (value, expected) in arrays.items():
        checked[name] = float_array(value, name)
        if checked[name].shape != expected:
            raise ValueError(f"{name} must have the shape {expected}, got {checked[name].shape}")
    same_dtype((q, grad, *checked.values()), ("q", "grad_output", *checked))
    return grad, checked


def standard_attention_backward_io(
    grad_output: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    weights: np.ndarray,
    *,
    scale: float | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], MemoryTraffic]:
    r"""The backward pass of standard attention, Algorithm 3 of :cite:t:`dao2022flashattention`, counted.

    With :math:`dO` the output gradient, each step again goes through slow memory:

    .. math::
        dV = P^\top dO, \quad dP = dO\, V^\top, \quad
        dS_{ij} = P_{ij}\Bigl(dP_{ij} - \sum_l P_{il}\, dP_{il}\Bigr), \quad
        dQ = s\, dS\, K, \quad dK = s\, dS^\top Q.

    :math:`P` is read twice, :math:`dP` written once and read once, :math:`dS` written once
    and read twice: :math:`7N^2` elements, plus :math:`8Nd` for the inputs and the
    gradients (:math:`N_q = N_k = N`, :math:`d_k = d_v = d`), :math:`\Theta(Nd + N^2)`.

    Parameters
    ----------
    grad_output : numpy.ndarray
        :math:`dO`, ``(..., N_q, d_v)``.
    q, k, v : numpy.ndarray
        As for :func:`standard_attention_io`.
    weights : numpy.ndarray
        :math:`P` from :func:`standard_attention_io`, ``(..., N_q, N_k)``.
    scale : float, optional
        The forward pass's score scale, :math:`1/\sqrt{d_k}` by default.

    Returns
    -------
    gradients : tuple of numpy.ndarray
        ``(grad_q, grad_k, grad_v)`` shaped like ``q``, ``k``, ``v``.
    traffic : MemoryTraffic
        Elements moved per array, and the FLOPs.
    """
    q, k, v = _check_io(q, k, v)
    s = _scale(scale, q.shape[-1])
    grad, saved = _check_io_backward(
        grad_output, q, v, {"weights": (weights, (*q.shape[:-1], k.shape[-2]))}
    )
    t_k = k.shape[-2]
    memory = _SlowMemory(
        Q=q, K=k, V=v, dO=grad, P=saved["weights"],
        dP=np.empty_like(saved["weights"]), dS=np.empty_like(saved["weights"]),
        dQ=np.empty_like(q), dK=np.empty_like(k), dV=np.empty_like(v),
    )  # fmt: skip
    memory.store("dV", memory.matmul(_transpose(memory.load("P")), memory.load("dO")))  # line 1
    memory.store("dP", memory.matmul(memory.load("dO"), _transpose(memory.load("V"))))  # line 2
    p, grad_p = memory.load("P"), memory.load("dP")  # line 3, (..., N_q, N_k) each
    row = memory.ops((p * grad_p).sum(axis=-1, keepdims=True), 2 * t_k)  # multiply, add
    memory.store("dS", memory.ops(p * (grad_p - row) * s, 3))  # the scale folded in
    memory.store("dQ", memory.matmul(memory.load("dS"), memory.load("K")))  # line 4
    memory.store("dK", memory.matmul(_transpose(memory.load("dS")), memory.load("Q")))  # line 5
    gradients = (memory.arrays["dQ"], memory.arrays["dK"], memory.arrays["dV"])
    return gradients, memory.traffic()


def _flash_backward_step(
    memory: _SlowMemory,
    blocks: dict[str, np.ndarray],
    k_j: np.ndarray,
    v_j: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lines 11 to 22 of Algorithm 4 on one block pair: ``dQ_i`` and the additions to ``dK_j, dV_j``."""
    q_i, o_i, grad_i = blocks["Q"], blocks["O"], blocks["dO"]
    scores = memory.ops(memory.matmul(q_i, _transpose(k_j)) * scale, 1)  # (..., B_r, B_c)
    p = memory.ops(np.exp(scores - blocks["m"]) / blocks["l"], 3)  # P_ij, recomputed
    add_v = memory.matmul(_transpose(p), grad_i)  # (..., B_c, d_v)
    grad_p = memory.matmul(grad_i, _transpose(v_j))  # (..., B_r, B_c)
    row = memory.ops((grad_i * o_i).sum(axis=-1, keepdims=True), 2 * o_i.shape[-1])  # D_i
    grad_s = memory.ops(p * (grad_p - row) * scale, 3)  # (..., B_r, B_c), the scale folded in
    grad_q = memory.ops(blocks["dQ"] + memory.matmul(grad_s, k_j), 1)  # (..., B_r, d_k)
    add_k = memory.matmul(_transpose(grad_s), q_i)  # (..., B_c, d_k)
    return grad_q, add_k, add_v


def flash_attention_backward_io(
    grad_output: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    output: np.ndarray,
    statistics: tuple[np.ndarray, np.ndarray],
    fast_memory: int,
    *,
    scale: float | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], MemoryTraffic]:
    r"""The backward pass of FlashAttention, Algorithm 4 of :cite:t:`dao2022flashattention`, counted.

    For each block :math:`K_j, V_j` (loaded once, its gradients kept in fast memory and
    written once), every block of queries loads :math:`Q_i, O_i, dO_i, dQ_i, \ell_i, m_i`,
    *recomputes* its scores and weights, :math:`P_{ij} = e^{s Q_i K_j^\top - m_i} / \ell_i`,
    and with :math:`D_i = \operatorname{rowsum}(dO_i \circ O_i)` accumulates

    .. math::
        dV_j \mathrel{+}= P_{ij}^\top dO_i, \quad
        dS_{ij} = P_{ij} \circ (dO_i V_j^\top - D_i), \quad
        dQ_i \mathrel{+}= s\, dS_{ij} K_j \ (\text{written back}), \quad
        dK_j \mathrel{+}= s\, dS_{ij}^\top Q_i .

    The traffic is :math:`N_q d_k + 3 N_k (d_k + d_v)` once (zeroing :math:`dQ, dK, dV`,
    reading :math:`K, V`, writing :math:`dK, dV`) and :math:`T_c N_q (3 d_k + 2 d_v + 2)` for
    the :math:`T_c` passes over the queries, :math:`7Nd + T_c N (5d + 2)` for
    :math:`N_q = N_k = N` and :math:`d_k = d_v = d`: :math:`\Theta(N^2 d^2 / M)` (Theorem 5).
    The recomputation of :math:`S_{ij}` is a fifth matrix product that standard attention's
    backward pass does not have.

    Parameters
    ----------
    grad_output : numpy.ndarray
        :math:`dO`, ``(..., N_q, d_v)``.
    q, k, v : numpy.ndarray
        As for :func:`flash_attention_io`.
    output, statistics
        :math:`O` and :math:`(\ell, m)` from :func:`flash_attention_io`.
    fast_memory : int
        :math:`M`, which sets the block sizes as in the forward pass.
    scale : float, optional
        The forward pass's score scale, :math:`1/\sqrt{d_k}` by default.

    Returns
    -------
    gradients : tuple of numpy.ndarray
        ``(grad_q, grad_k, grad_v)`` shaped like ``q``, ``k``, ``v``.
    traffic : MemoryTraffic
        Elements moved per array, and the FLOPs.
    """
    q, k, v = _check_io(q, k, v)
    s = _scale(scale, q.shape[-1])
    rows_per_block, keys_per_block = flash_block_sizes(fast_memory, q.shape[-1])
    if not isinstance(statistics, tuple) or len(statistics) != 2:
        raise TypeError(f"statistics must be the tuple (l, m), got {describe(statistics)}")
    grad, saved = _check_io_backward(
        grad_output, q, v,
        {"output": (output, (*q.shape[:-1], v.shape[-1])),
         "l": (statistics[0], q.shape[:-1]), "m": (statistics[1], q.shape[:-1])},
    )  # fmt: skip
    memory = _SlowMemory(
        Q=q, K=k, V=v, O=saved["output"], dO=grad,
        l=saved["l"][..., None], m=saved["m"][..., None],
        dQ=np.empty_like(q), dK=np.empty_like(k), dV=np.empty_like(v),
    )  # fmt: skip
    for name in ("dQ", "dK", "dV"):  # line 5: zeros in slow memory
        memory.store(name, np.zeros_like(memory.arrays[name]))
    # flash-backward-begin
    for key_start in range(0, k.shape[-2], keys_per_block):
        keys = slice(key_start, key_start + keys_per_block)
        k_j, v_j = memory.load("K", keys), memory.load("V", keys)  # (..., B_c, d)
        grad_k, grad_v = np.zeros_like(k_j), np.zeros_like(v_j)  # in fast memory
        for query_start in range(0, q.shape[-2], rows_per_block):
            rows = slice(query_start, query_start + rows_per_block)
            blocks = {name: memory.load(name, rows) for name in ("Q", "O", "dO", "dQ", "l", "m")}
            grad_q, add_k, add_v = _flash_backward_step(memory, blocks, k_j, v_j, s)
            memory.store("dQ", grad_q, rows)
            grad_k = memory.ops(grad_k + add_k, 1)
            grad_v = memory.ops(grad_v + add_v, 1)
        memory.store("dK", grad_k, keys)
        memory.store("dV", grad_v, keys)
    # flash-backward-end
    gradients = (memory.arrays["dQ"], memory.arrays["dK"], memory.arrays["dV"])
    return gradients, memory.traffic()
