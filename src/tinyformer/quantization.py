r"""Weight-only int8 quantization: 8-bit integer weights, a float scale per output channel.

A weight matrix :math:`W` is stored as integers :math:`Q \in \{-127, \dots, 127\}`
and scales :math:`s` :cite:p:`jacob2018quantization,dettmers2022llmint8`:

.. math::
    s_c = \frac{\max_i |W_{ic}|}{127}, \qquad
    Q_{ic} = \operatorname{round}(W_{ic} / s_c), \qquad
    \hat W_{ic} = s_c\, Q_{ic},

one scale per output channel :math:`c` (per-channel) or one for the whole matrix
(per-tensor). Rounding to the nearest integer gives
:math:`|W_{ic} - \hat W_{ic}| \le s_c / 2`. The matrix products still run in
floating point: NumPy has no int8 matrix-product kernel, so the integers are
converted back on use. What shrinks is the memory that holds the weights (one
byte per number instead of four), not the arithmetic.

- :func:`quantize_int8` and :class:`QuantizedTensor`: one matrix.
- :class:`QuantizedLinear`: :math:`y = (x Q) \odot s + b`, the layer a
  :class:`~tinyformer.layers.Linear` becomes.
- :func:`quantize_model`: a copy of a model whose every weight matrix is int8.
- :func:`weight_nbytes`: the bytes a model's weights occupy.
- :func:`quantize_int4`, :class:`GroupQuantizedTensor` and :func:`quantize_model_int4`:
  4-bit integers with one scale per group of ``group_size`` weights of a channel,
  two integers packed in each byte.
- :func:`quantize_vectors_int8` and :func:`round_kv_cache_int8`: a key/value cache in
  int8 with one scale per head and position, simulated on the cache's arrays.
"""

from __future__ import annotations

import copy

import numpy as np

from tinyformer._validation import axis_index, describe, layer_input, positive_int
from tinyformer.layers import Embedding, Linear, TiedOutputProjection, sum_rows
from tinyformer.module import Module, Parameter
from tinyformer.positional import LearnedPositionalEmbedding

__all__ = [
    "INT4_MAX",
    "INT8_MAX",
    "GroupQuantizedTensor",
    "QuantizedLinear",
    "QuantizedTensor",
    "quantize_int4",
    "quantize_int8",
    "quantize_model",
    "quantize_model_int4",
    "quantize_vectors_int8",
    "round_kv_cache_int8",
    "weight_nbytes",
]

INT8_MAX = 127
"""Largest integer used; the range is symmetric, ``[-127, 127]`` (-128 is left out)."""


def _check_weight(weight: object) -> np.ndarray:
    """``weight`` as a finite float32/float64 matrix, or an error that names it."""
    if not isinstance(weight, np.ndarray) or weight.dtype not in (np.float32, np.float64):
        raise TypeError(
            f"weight must be a float32 or float64 numpy.ndarray, got {describe(weight)}"
        )
    if weight.ndim != 2:
        raise ValueError(f"weight must be a 2-D matrix, got shape {weight.shape}")
    if not np.isfinite(weight).all():
        raise ValueError("weight must be finite, got NaN or infinite entries")
    return weight


class QuantizedTensor:
    r"""An int8 matrix with float scales; reads back as floats through :attr:`value`.

    Made by :func:`quantize_int8`. It stands in for a
    :class:`~tinyformer.module.Parameter` in a layer that reads ``weight.value``:
    each read dequantizes, :math:`\hat W = s \odot Q`. It has no gradient
    (quantized weights are for inference).

    Attributes
    ----------
    q : numpy.ndarray
        The int8 integers, in the shape of the original matrix.
    scale : numpy.ndarray
        Scales in the original dtype, shaped to broadcast against ``q``: ``(1, d_out)``
        for channels along axis 1, ``(d_0, 1)`` along axis 0, ``(1, 1)`` per tensor.
    axis : int or None
        The axis of the output channels, ``None`` for one scale per tensor.
    """

    __slots__ = ("axis", "q", "scale")

    def __init__(self, q: np.ndarray, scale: np.ndarray, axis: int | None) -> None:
        self.q, self.scale, self.axis = q, scale, axis

    @property
    def value(self) -> np.ndarray:
        r"""The dequantized matrix :math:`s \odot Q`, in the original dtype."""
        return self.q * self.scale  # int8 * float -> float; (d_0, d_1)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the matrix."""
        return self.q.shape

    @property
    def dtype(self) -> np.dtype:
        """Dtype of the dequantized values (the original weight's)."""
        return self.scale.dtype

    @property
    def nbytes(self) -> int:
        """Number of bytes held, one per integer plus those of the scales."""
        return self.q.nbytes + self.scale.nbytes

    def __repr__(self) -> str:
        return f"QuantizedTensor(shape={self.shape}, dtype={self.dtype}, axis={self.axis})"


def quantize_int8(weight: np.ndarray, *, axis: int | None = 1) -> QuantizedTensor:
    r"""Symmetric int8 quantization of a matrix, per output channel or per tensor.

    .. math:: s_c = \max |W_{\cdot c}| / 127, \qquad
              Q = \operatorname{clip}(\operatorname{round}(W / s), -127, 127)

    Parameters
    ----------
    weight : numpy.ndarray
        A float32 or float64 matrix, finite.
    axis : int or None
        The axis of the output channels, each with its own scale: 1 for a
        ``(d_in, d_out)`` weight used as ``x @ W``, 0 for an embedding table
        ``(vocab_size, d_model)`` (each row is one token's output vector).
        ``None``: one scale for the whole matrix.

    Returns
    -------
    QuantizedTensor
        A channel of zeros gets scale 0 and integers 0 (no division by zero).
    """
    weight = _check_weight(weight)
    if axis is None:
        reduce_over: tuple[int, ...] = (0, 1)
    else:
        axis = axis_index(axis, weight.ndim, "axis")
        reduce_over = (1 - axis,)
    largest = np.abs(weight).max(axis=reduce_over, keepdims=True)  # (1, d_1), (d_0, 1) or (1, 1)
    scale = largest / weight.dtype.type(INT8_MAX)
    safe = np.where(scale > 0, scale, 1)  # zero channels: W / 1 = 0
    q = np.clip(np.rint(weight / safe), -INT8_MAX, INT8_MAX).astype(np.int8)
    return QuantizedTensor(q, scale.astype(weight.dtype), axis)


INT4_MAX = 7
"""Largest 4-bit integer used; the range is symmetric, ``[-7, 7]`` (-8 is left out)."""


class GroupQuantizedTensor:
    r"""A matrix of 4-bit integers, two to a byte, with one scale per group; reads back as floats.

    Made by :func:`quantize_int4`. Like :class:`QuantizedTensor` it stands in for a
    :class:`~tinyformer.module.Parameter` whose layer reads ``weight.value``.

    Attributes
    ----------
    packed : numpy.ndarray
        uint8, ``size // 2`` bytes: integer :math:`Q + 8 \in [1, 15]` of the even
        entries (of the matrix laid out with its channels along the last axis) in
        the low four bits, of the odd ones in the high four.
    scale : numpy.ndarray
        ``(d_in / g, 1, d_out)`` scales in the original dtype, one per group of
        :math:`g` consecutive inputs of each output channel.
    axis : int
        The axis of the output channels in the original matrix (1, or 0 for a lookup table).
    group_size : int
    shape : tuple of int
        Shape of the original matrix.
    """

    __slots__ = ("axis", "group_size", "packed", "scale", "shape")

    def __init__(
        self, packed: np.ndarray, scale: np.ndarray, axis: int, group_size: int, shape: tuple
    ) -> None:
        self.packed, self.scale, self.axis = packed, scale, axis
        self.group_size, self.shape = group_size, tuple(shape)

    @property
    def q(self) -> np.ndarray:
        """The integers unpacked to int8, channels along the last axis, of shape ``(d_in, d_out)``."""
        low = (self.packed & 0x0F).astype(np.int8) - 8  # (size / 2,)
        high = (self.packed >> 4).astype(np.int8) - 8  # (size / 2,)
        rows = self.shape[1 - self.axis]
        return np.stack([low, high], axis=1).reshape(rows, -1)  # (d_in, d_out)

    @property
    def value(self) -> np.ndarray:
        r"""The dequantized matrix :math:`s_{\text{group}}\, Q`, original shape and dtype."""
        q = self.q
        groups = q.reshape(-1, self.group_size, q.shape[1])  # (d_in / g, g, d_out)
        w = (groups * self.scale).reshape(q.shape)  # (d_in, d_out)
        return w if self.axis == 1 else w.T

    @property
    def dtype(self) -> np.dtype:
        """Dtype of the dequantized values (the original weight's)."""
        return self.scale.dtype

    @property
    def nbytes(self) -> int:
        """Bytes held, half a byte per integer plus the scales."""
        return self.packed.nbytes + self.scale.nbytes

    def __repr__(self) -> str:
        return (
            f"GroupQuantizedTensor(shape={self.shape}, dtype={self.dtype}, axis={self.axis},"
            f" group_size={self.group_size})"
        )


def quantize_int4(
    weight: np.ndarray, *, group_size: int | None = 32, axis: int = 1
) -> GroupQuantizedTensor:
    r"""Symmetric 4-bit quantization with one scale per group of ``group_size`` inputs.

    For an output channel :math:`c` and a group :math:`G` of :math:`g` consecutive
    inputs (rows of a ``(d_in, d_out)`` weight):

    .. math:: s_{Gc} = \max_{i \in G} |W_{ic}| / 7, \qquad
              Q_{ic} = \operatorname{clip}(\operatorname{round}(W_{ic} / s_{Gc}), -7, 7),

    so :math:`|W_{ic} - s_{Gc} Q_{ic}| \le s_{Gc} / 2`. Storage: 4 bits per weight
    plus one scale per group, :math:`4 + 8\,\text{itemsize}/g` bits per weight.

    Parameters
    ----------
    weight : numpy.ndarray
        A float32 or float64 matrix, finite.
    group_size : int or None
        Inputs per group, a divisor of the input dimension; ``None``: one group per
        channel (per-channel int4). The matrix must have an even number of entries
        (two integers share a byte; a pair may straddle two rows).
    axis : int
        The axis of the output channels: 1 for ``(d_in, d_out)`` used as ``x @ W``,
        0 for a lookup table ``(vocab_size, d_model)``.
    """
    weight = _check_weight(weight)
    axis = axis_index(axis, weight.ndim, "axis")
    w = weight if axis == 1 else weight.T  # (d_in, d_out): groups run down the columns
    d_in = w.shape[0]
    g = d_in if group_size is None else positive_int(group_size, "group_size")
    if d_in % g:
        raise ValueError(f"group_size must divide the input dimension {d_in}, got {group_size}")
    if w.size % 2:
        raise ValueError(
            "weight must have an even number of entries (two 4-bit integers share a byte),"
            f" got shape {weight.shape}"
        )
    groups = w.reshape(d_in // g, g, w.shape[1])  # (d_in / g, g, d_out)
    scale = np.abs(groups).max(axis=1, keepdims=True) / w.dtype.type(
        INT4_MAX
    )  # (d_in/g, 1, d_out)
    safe = np.where(scale > 0, scale, 1)  # zero groups: W / 1 = 0
    q = np.clip(np.rint(groups / safe), -INT4_MAX, INT4_MAX).astype(np.int8).reshape(-1)
    nibbles = (q + 8).astype(np.uint8)  # (d_in * d_out,) in [1, 15]
    packed = nibbles[0::2] | (nibbles[1::2] << 4)  # (d_in * d_out / 2,)
    return GroupQuantizedTensor(packed, scale.astype(w.dtype), axis, g, weight.shape)


class QuantizedLinear(Module):
    r"""A :class:`~tinyformer.layers.Linear` with int8 weights: :math:`y = (x Q) \odot s + b`.

    With one scale per output column, :math:`x \hat W = x (Q \odot s) = (x Q) \odot s`:
    the scales can be applied after the product, to ``d_out`` numbers per row
    instead of ``d_in * d_out`` weights. NumPy multiplies ``x`` by ``Q``
    converted to ``x``'s dtype (it has no int8 matrix product).

    The weight is frozen; ``backward`` returns the input gradient
    :math:`\partial L / \partial x = (G \odot s) Q^\top` and adds into the bias
    gradient only.

    Parameters
    ----------
    weight : QuantizedTensor
        ``(d_in, d_out)``, quantized per column (``axis=1``) or per tensor.
    bias : numpy.ndarray, optional
        ``(d_out,)`` in the weight's dtype; kept in floating point.
    """

    def __init__(self, weight: QuantizedTensor, bias: np.ndarray | None = None) -> None:
        super().__init__()
        if not isinstance(weight, QuantizedTensor) or weight.axis not in (1, None):
            raise TypeError(
                "weight must be a QuantizedTensor with output channels along axis 1 (or one"
                f" scale per tensor), got {weight!r}"
            )
        self.weight = weight
        self.d_in, self.d_out = weight.shape
        self.dtype = weight.dtype
        self.bias = None if bias is None else Parameter(bias.astype(self.dtype, copy=True))

    @classmethod
    def from_linear(cls, linear: Linear, *, per_channel: bool = True) -> QuantizedLinear:
        """Quantize a trained :class:`~tinyformer.layers.Linear` (its bias stays float)."""
        if not isinstance(linear, Linear):
            raise TypeError(f"linear must be a tinyformer Linear layer, got {describe(linear)}")
        weight = quantize_int8(linear.weight.value, axis=1 if per_channel else None)
        return cls(weight, None if linear.bias is None else linear.bias.value)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Map ``x`` of shape ``(..., d_in)`` to ``(..., d_out)`` in ``x``'s dtype."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_in)
        rows = x.reshape(-1, self.d_in)  # (N, d_in)
        y = rows @ self.weight.q.astype(self.dtype)  # (N, d_out): integers, as floats
        y *= self.weight.scale  # scale each output column
        if self.bias is not None:
            y += self.bias.value
        self._save(x.shape)
        return y.reshape(*x.shape[:-1], self.d_out)  # (..., d_out)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        r"""Add into the bias gradient; return :math:`(G \odot s) Q^\top`, the input gradient."""
        (shape,) = self._saved()
        grad = self._check_grad(grad_out, (*shape[:-1], self.d_out), self.dtype)
        grad = grad.reshape(-1, self.d_out)  # (N, d_out)
        if self.bias is not None and self.bias.requires_grad:
            self.bias.grad += sum_rows(grad)
        return ((grad * self.weight.scale) @ self.weight.q.T.astype(self.dtype)).reshape(shape)


def _channel_axis(module: Module) -> int:
    """Output channels of a module's matrices: rows of a lookup table, else columns."""
    tables = Embedding | TiedOutputProjection | LearnedPositionalEmbedding
    return 0 if isinstance(module, tables) else 1


def quantize_model(model: Module, *, per_channel: bool = True) -> Module:
    """A copy of ``model`` in evaluation mode whose every weight matrix is int8.

    Each :class:`~tinyformer.layers.Linear` becomes a :class:`QuantizedLinear`;
    every other two-dimensional parameter (embedding tables, which a tied output
    projection shares, attention projections, learned positions) becomes a
    :class:`QuantizedTensor` that the layer reads as before, dequantized on use.
    Vectors (biases, normalization gains) stay in floating point. ``model`` is
    unchanged.

    Parameters
    ----------
    model : Module
        Any tinyformer module, e.g. a trained ``DecoderOnlyLM``.
    per_channel : bool
        One scale per output channel (True) or one per matrix (False).
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    if not isinstance(per_channel, bool):
        raise TypeError(f"per_channel must be True or False, got {describe(per_channel)}")
    quantized = copy.deepcopy(model)
    done: dict[int, QuantizedTensor] = {}  # id(Parameter) -> its int8 form, once when shared
    for module in list(quantized.modules()):
        if isinstance(module, Linear):  # replaced as a whole by its parent
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, Linear):
                setattr(module, name, QuantizedLinear.from_linear(value, per_channel=per_channel))
            elif isinstance(value, list) and any(isinstance(v, Linear) for v in value):
                value[:] = [
                    QuantizedLinear.from_linear(v, per_channel=per_channel)
                    if isinstance(v, Linear)
                    else v
                    for v in value
                ]
            elif isinstance(value, Parameter) and value.value.ndim == 2:
                if id(value) not in done:
                    axis = _channel_axis(module) if per_channel else None
                    done[id(value)] = quantize_int8(value.value, axis=axis)
                setattr(module, name, done[id(value)])
    quantized.eval()
    return quantized


def quantize_model_int4(model: Module, *, group_size: int | None = 32) -> Module:
    """A copy of ``model`` in evaluation mode whose every weight matrix is 4-bit, group-wise.

    Every two-dimensional parameter (those of :class:`~tinyformer.layers.Linear` layers
    included) becomes a :class:`GroupQuantizedTensor` (:func:`quantize_int4`) that its
    layer reads back, dequantized, on use; lookup tables get their channels along axis 0.
    Vectors stay in floating point. ``model`` is unchanged.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    quantized = copy.deepcopy(model)
    done: dict[int, GroupQuantizedTensor] = {}  # id(Parameter) -> its int4 form, once if shared
    for module in list(quantized.modules()):
        for name, value in list(vars(module).items()):
            if isinstance(value, Parameter) and value.value.ndim == 2:
                if id(value) not in done:
                    axis = _channel_axis(module)
                    done[id(value)] = quantize_int4(value.value, group_size=group_size, axis=axis)
                setattr(module, name, done[id(value)])
    quantized.eval()
    return quantized


def weight_nbytes(model: Module) -> int:
    """Bytes held by a model's weights: float parameters plus int8 matrices and their scales.

    A parameter or quantized matrix shared by two layers (weight tying) counts once.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    total = sum(p.value.nbytes for p in model.parameters())
    seen: set[int] = set()
    for module in model.modules():
        for value in vars(module).values():
            quantized = isinstance(value, QuantizedTensor | GroupQuantizedTensor)
            if quantized and id(value) not in seen:
                seen.add(id(value))
                total += value.nbytes
    return total


# ------------------------------------------------------------ int8 key/value cache
def quantize_vectors_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Symmetric int8 with one scale per vector along the last axis.

    .. math:: s_{\dots} = \max_j |x_{\dots j}| / 127, \qquad
              Q_{\dots j} = \operatorname{round}(x_{\dots j} / s_{\dots})

    For a cache ``(B, h, T, d_k)`` that is one scale per sequence, head and position:
    a new position is quantized when it is appended, and nothing already stored is
    quantized again.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        The int8 integers, shaped like ``x``, and the scales ``(..., 1)`` in ``x``'s dtype;
        ``q * scale`` reads back within ``scale / 2`` of ``x``.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64) or x.ndim < 1:
        raise TypeError(f"x must be a float32 or float64 numpy.ndarray, got {describe(x)}")
    if not np.isfinite(x).all():
        raise ValueError("x must be finite, got NaN or infinite entries")
    scale = np.abs(x).max(axis=-1, keepdims=True) / x.dtype.type(INT8_MAX)  # (..., 1)
    safe = np.where(scale > 0, scale, 1)
    q = np.clip(np.rint(x / safe), -INT8_MAX, INT8_MAX).astype(np.int8)  # like x
    return q, scale


def round_kv_cache_int8(state: object, start: int) -> int:
    """Replace cached keys and values at positions ``start ..`` by their int8 read-back, in place.

    A simulation of an int8 cache that leaves the model's code alone: after each
    ``model.step(tokens, state)``, calling this with ``start`` = the length before
    the step rounds what the step appended (:func:`quantize_vectors_int8`, one scale
    per sequence, head and position), so that every later step attends to keys and
    values exactly as an int8 cache would return them. Arithmetic stays in floating point.
    The step that appends a position attends to that position's own key and value
    unrounded; they are rounded only after the step, for every later one (a real int8
    cache would round them before the step's attention: the simulation leaves out the
    rounding of the newest position during its own step).

    Parameters
    ----------
    state : DecodeState
        A decoder-only model's decoding state (each block's ``self_attention`` cache).
    start : int
        First position to round.

    Returns
    -------
    int
        Bytes an int8 cache of ``state``'s current length would hold: one byte per
        number and one scale per vector.
    """
    caches = getattr(state, "caches", None)
    if caches is None:
        raise TypeError(f"state must be a model's DecodeState, got {describe(state)}")
    if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")
    held = 0
    for block in caches:
        for array in (block.self_attention.keys, block.self_attention.values):
            if array is None:
                continue
            new = array[..., start:, :]  # (B, h, T - start, d_k): a view into the cache
            q, scale = quantize_vectors_int8(new)
            new[...] = q * scale
            held += array.size + (array.size // array.shape[-1]) * scale.itemsize
    return held
