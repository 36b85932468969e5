"""The live exercise of the chapter on scaled dot-product attention."""

from __future__ import annotations

import numpy as np

from tinyformer.attention import scaled_dot_product_attention
from tinyformer.exercises import Case, Exercise
from tinyformer.masks import causal_mask


def _large_negative(q, k, v, mask=None):
    """Masks by adding -1e9: a row with every key masked gets weights, not zeros."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + np.where(mask, 0.0, -1e9)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights @ v, weights


def _unscaled(q, k, v, mask=None):
    """Forgets the 1/sqrt(d_k)."""
    return scaled_dot_product_attention(q, k, v, mask, scale=1.0)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4, 8))
    left_padded = causal_mask(4) & np.array([False, True, True, True])  # key 0 is <pad>
    batch = rng.standard_normal((3, 2, 5, 4))
    pad = np.array([[True] * 5, [True, True, True, False, False]])[:, None, :]  # (B, 1, T_k)
    return [
        Case((q, k, v, None), label="4 queries and keys, no mask"),
        Case((q, k, v, causal_mask(4)), label="a causal mask"),
        Case((*batch, pad), label="a batch of 2 with the second sequence padded"),
        Case(
            (q, k, v, left_padded),
            label="a causal mask with a left-padded key (query 0 may see nothing)",
        ),
    ]


MASKED_ATTENTION = Exercise(
    chapter="attention",
    name="masked_attention",
    stub='''\
def masked_attention(q, k, v, mask=None):
    """Scaled dot-product attention with a boolean mask.

    q: (..., T_q, d_k), k: (..., T_k, d_k), v: (..., T_k, d_v); mask: None, or booleans
    that broadcast to (..., T_q, T_k), True where a query may attend to a key.
    Returns (output, weights): weights of shape (..., T_q, T_k), where masked keys get
    weight exactly 0 and each row sums to one, except a row whose every key is masked,
    which is all zeros (and so is its output row); output = weights @ v.
    """
    raise NotImplementedError
''',
    reference=scaled_dot_product_attention,
    cases=_cases,
    rtol=1e-6,
    atol=1e-9,
    parts=("output", "weights"),
    mistakes=(_large_negative, _unscaled),
)
"""Write attention with a mask, including the row a mask empties (exercise 3's question)."""
