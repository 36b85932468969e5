"""The live exercise of the chapter on fast inference: int8 weights with a scale per channel."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.quantization import quantize_int8


def _per_channel_reference(weight):
    """quantize_int8 along axis 1, as (integers, scales)."""
    quantized = quantize_int8(weight, axis=1)
    return quantized.q, quantized.scale


def _per_tensor(weight):
    """Uses one scale for the whole matrix, the largest entry anywhere."""
    quantized = quantize_int8(weight, axis=None)
    return quantized.q, np.broadcast_to(quantized.scale, (1, weight.shape[1])).copy()


def _truncated(weight):
    """Converts W / s to integers with astype, which truncates towards zero instead of rounding."""
    scale = np.abs(weight).max(axis=0, keepdims=True) / 127
    safe = np.where(scale > 0, scale, 1.0)
    return (weight / safe).astype(np.int8), scale


def _signed_max(weight):
    """Takes the largest entry of each column, not the largest magnitude: negative entries overflow the range."""
    scale = weight.max(axis=0, keepdims=True) / 127
    safe = np.where(scale != 0, scale, 1.0)
    return np.clip(np.rint(weight / safe), -127, 127).astype(np.int8), scale


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    small = rng.standard_normal((4, 3))  # (d_in, d_out)
    uneven = rng.standard_normal((6, 4)) * np.array([0.01, 1.0, 100.0, 3.0])  # columns far apart
    zero_column = rng.standard_normal((5, 3))
    zero_column[:, 1] = 0.0
    negative = -np.abs(rng.standard_normal((8, 5))) + 0.1  # the largest |w| is a negative entry
    return [
        Case((small,), label="a 4 x 3 matrix"),
        Case((uneven,), label="columns whose sizes differ ten-thousandfold"),
        Case((zero_column,), label="a matrix with a column of zeros"),
        Case((negative,), label="columns whose largest magnitude is a negative entry"),
    ]


QUANTIZE_INT8_PER_CHANNEL = Exercise(
    chapter="fast_inference",
    name="quantize_int8_per_channel",
    stub='''\
def quantize_int8_per_channel(weight):
    """Symmetric int8 quantization with one scale per output channel (column).

    weight: a (d_in, d_out) float64 matrix, used as x @ weight, so each column is one
    output channel. For column c the scale is s_c = max_i |W[i, c]| / 127, and the
    integers are Q = round(W / s) (to the nearest integer, halves to even as np.rint
    does), in [-127, 127]. A column of zeros gets scale 0 and integers 0.
    Returns (q, scale): q of shape (d_in, d_out) and dtype int8; scale of shape
    (1, d_out), float64, so that q * scale reads the matrix back.
    """
    raise NotImplementedError
''',
    reference=_per_channel_reference,
    cases=_cases,
    rtol=1e-12,
    atol=0.0,
    parts=("matrix of integers", "row of scales"),
    mistakes=(_per_tensor, _truncated, _signed_max),
)
"""Write per-channel int8 quantization: a scale per column, rounding, and the column of zeros."""
