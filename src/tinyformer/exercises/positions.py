"""The live exercise of the chapter on positional information: rotary embeddings (RoPE)."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.positional import apply_rotary


def _rope(x, positions):
    """The package's rotation: adjacent pairs, base 10000."""
    return apply_rotary(x, positions)


def _halves(x, positions):
    """Pairs feature i with feature i + d/2 (the split-halves layout), not 2i with 2i + 1."""
    return apply_rotary(x, positions, layout="halves")


def _clockwise(x, positions):
    """Turns each pair by minus the angle (sin with the wrong sign)."""
    return apply_rotary(x, positions, inverse=True)


def _slow_frequencies(x, positions):
    """Uses omega_i = 10000^(-i/d), forgetting the 2 in the exponent."""
    d = x.shape[-1]
    angles = np.asarray(positions, dtype=np.float64)[:, None] * 10000.0 ** (-np.arange(d // 2) / d)
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    one = rng.standard_normal((1, 8))
    head = rng.standard_normal((6, 8))
    batch = rng.standard_normal((2, 3, 4, 16))  # (B, h, T, d_k)
    return [
        Case((one, np.array([0])), label="one vector at position 0 (no rotation at all)"),
        Case((head, np.arange(6)), label="6 positions 0..5 with d = 8"),
        Case(
            (batch, np.arange(100, 104)),
            label="a (2, 3, 4, 16) batch of heads at positions 100..103",
        ),
        Case(
            (head, np.array([5, 0, 3, 3, 4000, 1])),
            label="unordered and repeated positions up to 4000",
        ),
    ]


ROPE = Exercise(
    chapter="positions",
    name="rope",
    stub='''\
def rope(x, positions):
    """Rotary position embedding (RoPE), adjacent-pairs layout, base 10000.

    x: array of shape (..., T, d) with d even; positions: integer array of shape (T,),
    the position of each of the T rows (not necessarily 0..T-1).
    Features 2i and 2i+1 form pair i, with frequency omega_i = 10000 ** (-2i / d)
    for i = 0 .. d/2 - 1. The pair (a, b) in a row at position p becomes
    (a cos(p omega_i) - b sin(p omega_i), a sin(p omega_i) + b cos(p omega_i)).
    Returns a new array of the same shape as x; x is left unchanged.
    """
    raise NotImplementedError
''',
    reference=_rope,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    mistakes=(_halves, _clockwise, _slow_frequencies),
)
"""Write RoPE's rotation from its formula: pairs, frequencies and the sign of the sine."""
