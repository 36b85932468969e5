"""Multi-head attention: four linear projections around the attention of :mod:`tinyformer.attention`.

The layer projects its input into queries, keys and values with three
:class:`~tinyformer.layers.Linear` layers, views each result as ``(B, h, T, d_k)``
(heads as an array axis, no copy), runs every head at once through
:func:`~tinyformer.attention.scaled_dot_product_attention`, the function the
attention chapter derives, and mixes the heads with a fourth ``Linear``. Its
backward pass is those layers' backward passes around
:func:`~tinyformer.attention.scaled_dot_product_attention_backward`. (It calls the
two functions' bodies, ``_attention`` and ``_attention_backward``, without their
argument checks: the layer has checked its own inputs.) Training,
evaluation and cached decoding all run this one path; the only difference in a
decoding step is that new keys and values are appended to a :class:`KVCache` and
attention reads all of it.

With ``n_kv_heads`` smaller than ``n_heads`` the layer is grouped-query attention
(:cite:t:`ainslie2023gqa`; multi-query attention, :cite:t:`shazeer2019fast`, when
``n_kv_heads=1``): the key and value projections make ``n_kv_heads`` heads, and
each is shared by a group of ``n_heads // n_kv_heads`` query heads. The sharing is a
broadcast, never a copy: the queries are viewed as ``(B, h_kv, g, T, d_k)`` and each
key/value head as ``(B, h_kv, 1, T, d_k)``, so the attention's backward pass returns
one gradient per query head of a group, and the layer sums them over the group axis
(the chain rule for a shared input). The cache holds the ``n_kv_heads`` heads only.

:func:`multi_head_attention_loop` computes the same thing one head at a time; it
exists only to show (and test) that the two agree.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import (
    bool_mask,
    describe,
    float_dtype,
    generator,
    layer_input,
    non_negative_int,
    one_of,
    positive_float,
    positive_int,
)
from tinyformer.attention import (
    _attention,
    _attention_backward,
    _scale,
    scaled_dot_product_attention,
)
from tinyformer.layers import Dropout, Linear
from tinyformer.module import Module
from tinyformer.positional import ROTARY_LAYOUTS, apply_rotary

__all__ = ["KVCache", "MultiHeadAttention", "kv_heads", "multi_head_attention_loop"]


def kv_heads(n_kv_heads: object, n_heads: int, name: str = "n_kv_heads") -> int:
    """``n_kv_heads`` checked against ``n_heads`` (positive, dividing it); ``None`` gives ``n_heads``."""
    if n_kv_heads is None:
        return n_heads
    value = positive_int(n_kv_heads, name)
    if n_heads % value:
        raise ValueError(
            f"{name} must divide n_heads={n_heads} (each key/value head serves a whole"
            f" group of query heads), got {name}={value}"
        )
    return value


class KVCache:
    """Keys and values of the positions an attention layer has already seen.

    During step-by-step decoding each new token only needs its own query; its
    keys and values are appended here and every later step reuses them
    :cite:p:`pope2023efficiently`. Storage grows by doubling, so appending ``T``
    positions one at a time costs :math:`O(T)` copies in total.

    For self-attention :class:`MultiHeadAttention` appends the new positions
    at each call. For cross-attention it fills the cache from the encoder
    memory on the first call and reuses it afterwards (the memory does not
    change while a sequence is decoded).

    Its head axis ``h`` counts the layer's key/value heads (``n_kv_heads``), which
    with grouped-query attention is fewer than its query heads.
    """

    def __init__(self) -> None:
        self._keys: np.ndarray | None = None  # (B, h, capacity, d_k)
        self._values: np.ndarray | None = None  # (B, h, capacity, d_v)
        self._length = 0

    def __len__(self) -> int:
        """Number of cached positions."""
        return self._length

    @property
    def keys(self) -> np.ndarray | None:
        """Cached keys, ``(B, h, len(self), d_k)``, or ``None`` when empty."""
        return None if self._keys is None else self._keys[..., : self._length, :]

    @property
    def values(self) -> np.ndarray | None:
        """Cached values, ``(B, h, len(self), d_v)``, or ``None`` when empty."""
        return None if self._values is None else self._values[..., : self._length, :]

    def reset(self) -> None:
        """Forget every cached position (start a new sequence)."""
        self._keys = self._values = None
        self._length = 0

    def truncate(self, length: int) -> None:
        """Forget the cached positions ``length`` and later (storage is kept for reuse).

        Used to take back positions that were proposed but not accepted, as in
        speculative decoding; ``truncate(len(self))`` changes nothing.
        """
        length = non_negative_int(length, "length")
        if length > self._length:
            raise ValueError(
                f"length must be at most the number of cached positions {self._length},"
                f" got {length}"
            )
        self._length = length

    def select(self, indices: np.ndarray) -> KVCache:
        """A new cache whose sequence ``i`` is a copy of this cache's sequence ``indices[i]``.

        ``indices`` is a non-empty 1-D integer array; repeats are allowed (one
        sequence may continue as several beams). The copy owns its arrays, so
        appending to it leaves this cache unchanged.
        """
        new = KVCache()
        new._length = self._length
        if self._keys is None or self._values is None:
            _row_indices(indices, None)
            return new
        rows = _row_indices(indices, self._keys.shape[0])
        new._keys = self._keys[rows]  # (len(rows), h, capacity, d_k), a copy
        new._values = self._values[rows]
        return new

    def copy(self) -> KVCache:
        """An independent copy: appending to either leaves the other unchanged."""
        new = KVCache()
        new._length = self._length
        if self._keys is not None and self._values is not None:
            new._keys, new._values = self._keys.copy(), self._values.copy()
        return new

    def append(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add ``keys`` ``(B, h, T, d_k)`` and ``values`` ``(B, h, T, d_v)``; return all of them."""
        if keys.ndim != 4 or values.shape[:3] != keys.shape[:3]:
            raise ValueError(
                "keys and values must have shapes (B, h, T, d_k) and (B, h, T, d_v), got"
                f" {keys.shape} and {values.shape}"
            )
        n_new = keys.shape[2]
        if self._keys is None or self._values is None:
            self._keys = self._allocate(keys, n_new)
            self._values = self._allocate(values, n_new)
        elif (keys.shape[:2], keys.shape[3], keys.dtype) != (
            self._keys.shape[:2],
            self._keys.shape[3],
            self._keys.dtype,
        ) or values.shape[3] != self._values.shape[3]:
            raise ValueError(
                "keys must match the cached (B, h, *, d_k) = "
                f"{self._keys.shape[:2]} d_k={self._keys.shape[3]} ({self._keys.dtype}),"
                f" got {describe(keys)}: call reset() before a new batch"
            )
        elif self._length + n_new > self._keys.shape[2]:
            self._keys = self._grow(self._keys, self._length + n_new)
            self._values = self._grow(self._values, self._length + n_new)
        stop = self._length + n_new
        self._keys[..., self._length : stop, :] = keys
        self._values[..., self._length : stop, :] = values
        self._length = stop
        return self._keys[..., :stop, :], self._values[..., :stop, :]

    @staticmethod
    def _allocate(like: np.ndarray, n: int) -> np.ndarray:
        b, h, _, d = like.shape
        return np.empty((b, h, max(n, 16), d), dtype=like.dtype)

    def _grow(self, buffer: np.ndarray, needed: int) -> np.ndarray:
        b, h, capacity, d = buffer.shape
        bigger = np.empty((b, h, max(needed, 2 * capacity), d), dtype=buffer.dtype)
        bigger[..., : self._length, :] = buffer[..., : self._length, :]
        return bigger


def _row_indices(indices: object, n_rows: int | None) -> np.ndarray:
    """Check ``indices``: a non-empty 1-D integer array of rows in ``[0, n_rows)``."""
    rows = np.asarray(indices)
    if rows.dtype.kind not in "iu":
        raise TypeError(f"indices must be an integer array of rows, got {describe(rows)}")
    if rows.ndim != 1 or rows.size == 0:
        raise ValueError(f"indices must be a non-empty 1-D array of rows, got shape {rows.shape}")
    if n_rows is not None and (rows.min() < 0 or rows.max() >= n_rows):
        bad = rows.min() if rows.min() < 0 else rows.max()
        raise ValueError(f"indices must be rows in [0, {n_rows}), got {bad}")
    return rows


def _split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """View ``(B, T, d_model)`` as ``(B, h, T, d_k)`` (no copy)."""
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """``(B, h, T, d_k)`` back to ``(B, T, h d_k)``: the heads side by side."""
    b, h, t, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d_k)


def _layer_mask(mask: object, shape: tuple[int, int, int]) -> np.ndarray:
    """Check a ``(B, T_q, T_k)``-broadcastable mask and give it a head axis."""
    allowed = bool_mask(mask, "mask", shape)
    return allowed[:, None] if allowed.ndim == 3 else allowed  # (B, 1, T_q, T_k) or less


def _group_axis(x: np.ndarray | None, n_kv_heads: int) -> np.ndarray | None:
    """View ``(B, h, ...)`` as ``(B, h_kv, g, ...)``: query head ``i`` is member ``i % g`` of group ``i // g``."""
    if x is None:
        return None
    b, h = x.shape[:2]
    return x.reshape(b, n_kv_heads, h // n_kv_heads, *x.shape[2:])  # splits an axis: a view


def _rotate(
    layer: MultiHeadAttention, x: np.ndarray, positions: np.ndarray, *, inverse: bool = False
) -> np.ndarray:
    """``x`` (..., T, d_k) rotated as ``layer`` rotates queries and keys at ``positions``, or back."""
    if layer.rotary_interpolation != 1.0:  # position interpolation: p is read as p / s
        return apply_rotary(
            x,
            positions,
            base=layer.rotary_base,
            inverse=inverse,
            layout=layer.rotary_layout,
            scaling="linear",
            scaling_factor=layer.rotary_interpolation,
        )
    if layer.rotary_layout == "adjacent":  # the default, in the call it has always made
        return apply_rotary(x, positions, base=layer.rotary_base, inverse=inverse)
    return apply_rotary(
        x, positions, base=layer.rotary_base, inverse=inverse, layout=layer.rotary_layout
    )


class MultiHeadAttention(Module):
    r"""Multi-head attention of :cite:t:`vaswani2017attention`, all heads at once.

    .. math::
        \operatorname{head}_i = \operatorname{softmax}\!\Bigl(
            \frac{(x W^Q_i)(c W^K_i)^\top}{\sqrt{d_k}} + M\Bigr)\, c W^V_i, \qquad
        \operatorname{MHA}(x, c) = [\operatorname{head}_1, \dots, \operatorname{head}_h]\, W^O

    with :math:`c = x` for self-attention, :math:`d_k = d_\text{model} / h`,
    biases after each projection, and :math:`M` equal to :math:`-\infty` where
    the mask forbids a key. :math:`W^Q, W^K, W^V, W^O` are the weights of the
    ``Linear`` layers ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``; head
    :math:`i` uses columns ``i d_k .. (i+1) d_k - 1`` of each of the first three.

    Grouped-query attention (``n_kv_heads`` :math:`= h_{kv} < h`): ``k_proj`` and
    ``v_proj`` make :math:`h_{kv}` heads, ``(d_model, h_kv d_k)`` each, and query
    head :math:`i` reads key/value head :math:`\lfloor i / g \rfloor`, with
    :math:`g = h / h_{kv}` (the order of ``repeat_interleave`` in PyTorch and of
    Hugging Face's ``repeat_kv``). The gradient of a shared key or value head is
    the sum of its :math:`g` query heads' gradients.

    Backward, with :math:`G` the gradient at the output: ``out_proj`` gives the
    gradient of the merged heads, split into heads it goes through
    :func:`~tinyformer.attention.scaled_dot_product_attention_backward` (and back
    through the rotation, with rotary positions), and each projection's backward
    pass takes its share. For self-attention the three input gradients add up.

    Parameters
    ----------
    d_model : int
        Model width; must be divisible by ``n_heads``.
    n_heads : int
        Number of (query) heads :math:`h`.
    rng : numpy.random.Generator
        Draws the Glorot-uniform projections (in the order query, key, value,
        output; biases start at zero) and the attention dropout.
    dropout : float
        Dropout on the attention weights in training mode.
    bias : bool
        Whether the projections have biases.
    rotary : bool
        Rotate queries and keys by their positions (RoPE, :cite:t:`su2021roformer`)
        in self-attention; with a cache, new positions continue after the cached ones.
    rotary_base : float
        The frequency base of the rotation.
    rotary_layout : str
        Which features form a rotated pair: ``"adjacent"`` (the default:
        :math:`(2i, 2i+1)`, as in the RoFormer paper and Meta's original LLaMA
        code) or ``"halves"`` (:math:`(i, i + d_k/2)`, Hugging Face's
        ``rotate_half``). :func:`~tinyformer.positional.convert_rotary_layout`
        converts query and key weights from one to the other.
    rotary_interpolation : float
        Position interpolation :cite:p:`chen2023extending`: position :math:`p` is
        rotated as position :math:`p/s` would be, for a factor :math:`s \ge 1`
        (1.0, the default, rotates by the position itself). It stretches a
        model trained on :math:`n` positions over :math:`s n` of them.
    scale : float, optional
        Factor :math:`s` applied to the scores; ``None`` (the default) means
        :math:`1/\sqrt{d_k}`. ``scale=1.0`` removes the scaling (an ablation).
    n_kv_heads : int, optional
        Number of key/value heads :math:`h_{kv}`, dividing ``n_heads``; ``None``
        (the default) means ``n_heads``: plain multi-head attention. ``1`` is
        multi-query attention.
    dtype : float32 or float64
        Dtype of parameters and accepted inputs.

    Attributes
    ----------
    group : int
        Query heads per key/value head, :math:`g = h / h_{kv}`.
    scale : float
        The factor :math:`s` in use.
    attention_weights : numpy.ndarray
        After each forward, the weights ``(B, h, T_q, T_k)`` (before dropout),
        for figures.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        rng: np.random.Generator,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: bool = False,
        rotary_base: float = 10000.0,
        rotary_layout: str = "adjacent",
        rotary_interpolation: float = 1.0,
        scale: float | None = None,
        n_kv_heads: int | None = None,
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        self.d_model = positive_int(d_model, "d_model")
        self.n_heads = positive_int(n_heads, "n_heads")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model must be divisible by n_heads, got d_model={self.d_model}"
                f" and n_heads={self.n_heads}"
            )
        self.n_kv_heads = kv_heads(n_kv_heads, self.n_heads)
        self.group = self.n_heads // self.n_kv_heads
        self.d_k = self.d_model // self.n_heads
        if rotary and self.d_k % 2:
            raise ValueError(f"rotary positions need an even head size d_k, got {self.d_k}")
        self.rotary = bool(rotary)
        self.rotary_base = positive_float(rotary_base, "rotary_base")
        self.rotary_layout = one_of(rotary_layout, ROTARY_LAYOUTS, "rotary_layout")
        self.rotary_interpolation = positive_float(rotary_interpolation, "rotary_interpolation")
        self.dtype = float_dtype(dtype)
        self.scale = _scale(scale, self.d_k)  # a Python float: float32 stays float32
        rng = generator(rng)
        d, options = self.d_model, {"rng": rng, "bias": bias, "dtype": self.dtype}
        d_kv = self.n_kv_heads * self.d_k  # d, unless the key/value heads are shared
        self.q_proj = Linear(d, d, **options)  # W^Q, (d, h d_k)
        self.k_proj = Linear(d, d_kv, **options)  # W^K, (d, h_kv d_k)
        self.v_proj = Linear(d, d_kv, **options)  # W^V
        self.out_proj = Linear(d, d, **options)  # W^O, (h d_k, d)
        self.dropout = Dropout(dropout, rng=rng)
        self.attention_weights: np.ndarray | None = None

    def _check_inputs(
        self, x: object, context: object, cache: object
    ) -> tuple[np.ndarray, np.ndarray | None]:
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model, min_ndim=3)
        if x.ndim != 3:
            raise ValueError(f"x must have shape (B, T, d_model), got shape {x.shape}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {describe(cache)}")
        held = None if cache is None or cache._keys is None else cache._keys.shape[0]
        if held is not None and held != x.shape[0]:
            raise ValueError(
                f"cache holds {held} sequences but x has batch size"
                f" {x.shape[0]}: call cache.reset() before decoding a new batch"
            )
        if context is None:
            return x, None
        if self.rotary:
            raise ValueError("rotary positions apply to self-attention only: pass context=None")
        context = layer_input(context, "context", self.dtype, last_dim=self.d_model, min_ndim=3)
        if context.ndim != 3 or context.shape[0] != x.shape[0]:
            raise ValueError(
                f"context must have shape (B, T_k, d_model) with the batch size B={x.shape[0]}"
                f" of x, got shape {context.shape}"
            )
        return x, context

    def _rotate(
        self, x: np.ndarray, positions: np.ndarray, *, inverse: bool = False
    ) -> np.ndarray:
        """Queries or keys ``(B, heads, T, d_k)`` rotated for ``positions`` (RoPE), or back."""
        return _rotate(self, x, positions, inverse=inverse)

    def forward(
        self,
        x: np.ndarray,
        context: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        cache: KVCache | None = None,
    ) -> np.ndarray:
        """Attend from ``x`` to itself (``context=None``) or to ``context``.

        Parameters
        ----------
        x : numpy.ndarray
            Queries' input, ``(B, T_q, d_model)``.
        context : numpy.ndarray, optional
            Keys' and values' input for cross-attention, ``(B, T_k, d_model)``.
        mask : numpy.ndarray of bool, optional
            Broadcastable to ``(B, T_q, T_k)`` (no head axis), True where a
            query may attend. With a cache, ``T_k`` counts the cached positions.
        cache : KVCache, optional
            For decoding: self-attention appends the new keys and values and
            attends to all cached ones; cross-attention fills it from
            ``context`` once and reuses it. A forward with a cache cannot be
            followed by backward.

        Returns
        -------
        numpy.ndarray
            ``(B, T_q, d_model)``.
        """
        x, context = self._check_inputs(x, context, cache)
        b, t, _ = x.shape
        h = self.n_heads
        q = _split_heads(self.q_proj.forward(x), h)  # (B, h, T_q, d_k)
        positions = None
        if context is not None and cache is not None and len(cache):
            k, v = cache.keys, cache.values  # the memory's, computed at the first step
        else:
            source = x if context is None else context
            k = _split_heads(self.k_proj.forward(source), self.n_kv_heads)  # (B, h_kv, T_k, d_k)
            v = _split_heads(self.v_proj.forward(source), self.n_kv_heads)
            if self.rotary:  # x's positions continue after the cached ones
                start = 0 if cache is None else len(cache)
                positions = np.arange(start, start + t)
                q = self._rotate(q, positions)
                k = self._rotate(k, positions)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, h_kv, T_cached + T, d_k)
        allowed = None if mask is None else _layer_mask(mask, (b, t, k.shape[2]))
        keep = self.dropout.mask((b, h, t, k.shape[2]), self.dtype)  # None unless training
        if self.group > 1:  # grouped queries, (B, h_kv, g, T_q, d_k), share a key/value head
            q, keep = _group_axis(q, self.n_kv_heads), _group_axis(keep, self.n_kv_heads)
            if allowed is not None and allowed.ndim == 4:  # (B, 1, T_q, T_k): one more axis
                allowed = allowed[:, :, None]  # (B, 1, 1, T_q, T_k)
            k, v = k[:, :, None], v[:, :, None]  # (B, h_kv, 1, T_k, d_k): broadcast, no copy
        heads, weights = _attention(q, k, v, allowed, self.scale, keep)  # as derived, all heads
        # heads (B, h, T_q, d_k), weights (B, h, T_q, T_k); grouped: (B, h_kv, g, ...)
        self.attention_weights = weights.reshape(b, h, t, k.shape[-2])
        merged = _merge_heads(heads.reshape(b, h, t, -1))  # (B, T_q, d_model): heads side by side
        out = self.out_proj.forward(merged)  # (B, T_q, d_model)
        if cache is None:
            self._save(q, k, v, weights, merged, keep, positions, context is not None)
        else:
            self._save(None)
        return out

    def backward(self, grad_out: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Gradient for ``x`` (self-attention) or ``(grad_x, grad_context)`` (cross)."""
        saved = self._saved()
        if saved[0] is None:
            raise RuntimeError(
                "MultiHeadAttention.backward is not available after a forward with a cache:"
                " the key/value cache is for inference; run forward without it to train"
            )
        q, k, v, weights, merged, keep, positions, cross = saved
        h = self.n_heads
        grad_heads = _split_heads(self.out_proj.backward(grad_out), h)  # (B, h, T, d_k)
        output = _split_heads(merged, h)  # the heads' outputs, (B, h, T, d_k)
        if self.group > 1:
            grad_heads, output = (_group_axis(a, self.n_kv_heads) for a in (grad_heads, output))
        grad_q, grad_k, grad_v = _attention_backward(
            grad_heads, q, k, v, weights, output, self.scale, keep
        )  # (B, h, T, d_k) each; grouped: (B, h_kv, g, T, d_k)
        if self.group > 1:  # a shared key/value head: the sum of its group's gradients
            grad_q = grad_q.reshape(grad_q.shape[0], h, *grad_q.shape[3:])  # (B, h, T_q, d_k)
            grad_k, grad_v = grad_k.sum(axis=2), grad_v.sum(axis=2)  # (B, h_kv, T_k, d_k)
        if positions is not None:  # the rotation's transpose is the inverse rotation
            grad_q = self._rotate(grad_q, positions, inverse=True)
            grad_k = self._rotate(grad_k, positions, inverse=True)
        grad_x = self.q_proj.backward(_merge_heads(grad_q))  # (B, T_q, d)
        grad_source = self.k_proj.backward(_merge_heads(grad_k))  # (B, T_k, d)
        grad_source += self.v_proj.backward(_merge_heads(grad_v))
        if cross:
            return grad_x, grad_source
        grad_x += grad_source  # self-attention: x fed all three projections
        return grad_x


def multi_head_attention_loop(
    layer: MultiHeadAttention,
    x: np.ndarray,
    context: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """The forward pass of ``layer`` computed one head at a time, for comparison only.

    Each head slices its own columns out of the projections and calls
    :func:`~tinyformer.attention.scaled_dot_product_attention`; the outputs are
    concatenated and projected. With grouped-query attention, query head ``i``
    takes the key and value columns of head ``i // layer.group``. It ignores
    dropout (use evaluation mode).
    """
    if not isinstance(layer, MultiHeadAttention):
        raise TypeError(f"layer must be a MultiHeadAttention, got {type(layer).__name__}")
    source = x if context is None else context
    d_k = layer.d_k

    def project(linear: Linear, inputs: np.ndarray, cols: slice) -> np.ndarray:
        out = inputs @ linear.weight.value[:, cols]
        return out if linear.bias is None else out + linear.bias.value[cols]

    heads = []
    for i in range(layer.n_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        j = i // layer.group  # the key/value head this query head reads
        kv_cols = slice(j * d_k, (j + 1) * d_k)
        q = project(layer.q_proj, x, cols)  # (B, T_q, d_k)
        k = project(layer.k_proj, source, kv_cols)  # (B, T_k, d_k)
        v = project(layer.v_proj, source, kv_cols)
        if layer.rotary:
            q = _rotate(layer, q, np.arange(q.shape[-2]))
            k = _rotate(layer, k, np.arange(k.shape[-2]))
        head, _ = scaled_dot_product_attention(q, k, v, mask, scale=layer.scale)  # (B, T_q, d_k)
        heads.append(head)
    return project(layer.out_proj, np.concatenate(heads, axis=-1), slice(None))
