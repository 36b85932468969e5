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
"""

from __future__ import annotations

import copy

import numpy as np

from tinyformer._validation import axis_index, describe, layer_input
from tinyformer.layers import Embedding, Linear, TiedOutputProjection, sum_rows
from tinyformer.module import Module, Parameter
from tinyformer.positional import LearnedPositionalEmbedding

__all__ = [
    "INT8_MAX",
    "QuantizedLinear",
    "QuantizedTensor",
    "quantize_int8",
    "quantize_model",
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
            if isinstance(value, QuantizedTensor) and id(value) not in seen:
                seen.add(id(value))
                total += value.nbytes
    return total
