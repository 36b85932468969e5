"""The live exercise of the chapter on the modern decoder: grouped-query attention."""

from __future__ import annotations

import numpy as np

from tinyformer.attention import scaled_dot_product_attention
from tinyformer.exercises import Case, Exercise
from tinyformer.masks import causal_mask
from tinyformer.multihead import _group_axis


def _grouped(q, k, v, mask=None):
    """The library's grouping: queries viewed as (B, h_kv, g, T_q, d_k), each key/value head broadcast."""
    b, h, t_q, _ = q.shape
    h_kv, t_k = k.shape[1], k.shape[2]
    if mask is not None:
        mask = _group_axis(np.broadcast_to(mask, (b, h, t_q, t_k)), h_kv)  # (B, h_kv, g, T_q, T_k)
    out, _ = scaled_dot_product_attention(
        _group_axis(q, h_kv), k[:, :, None], v[:, :, None], mask
    )  # (B, h_kv, g, T_q, d_v)
    return out.reshape(b, h, t_q, v.shape[-1])


def _tiled(q, k, v, mask=None):
    """Gives query head i the key/value head i % h_kv (np.tile) instead of i // g."""
    reps = q.shape[1] // k.shape[1]
    k, v = np.tile(k, (1, reps, 1, 1)), np.tile(v, (1, reps, 1, 1))
    return scaled_dot_product_attention(q, k, v, mask)[0]


def _scaled_by_model_width(q, k, v, mask=None):
    """Divides the scores by sqrt(h * d_k), the model width, instead of sqrt(d_k)."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    return scaled_dot_product_attention(
        q, k, v, mask, scale=1 / np.sqrt(q.shape[1] * q.shape[-1])
    )[0]


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 5, 6))  # 4 query heads
    k, v = rng.standard_normal((2, 1, 2, 5, 6))  # 2 key/value heads
    rng = np.random.default_rng(1)
    q6 = rng.standard_normal((2, 6, 4, 4))
    k3, v3 = rng.standard_normal((2, 2, 3, 4, 4))
    pad = np.array([[True] * 4, [True, True, True, False]])[:, None, None, :]  # (B, 1, 1, T_k)
    k1, v1 = rng.standard_normal((2, 2, 1, 4, 4))
    return [
        Case((q, k, v, None), label="4 query heads sharing 2 key/value heads, no mask"),
        Case((q, k, v, causal_mask(5)), label="the same heads with a causal mask"),
        Case(
            (q6, k3, v3, pad),
            label="a batch of 2, 6 query heads and 3 key/value heads, the second sequence padded",
        ),
        Case(
            (q6, k1, v1, causal_mask(4)),
            label="multi-query attention (1 key/value head for 6 query heads)",
        ),
    ]


GROUPED_QUERY_ATTENTION = Exercise(
    chapter="modern_decoder",
    name="grouped_query_attention",
    stub='''\
def grouped_query_attention(q, k, v, mask=None):
    """Scaled dot-product attention whose key/value heads are shared by groups of query heads.

    q: (B, h, T_q, d_k) queries of h heads; k: (B, h_kv, T_k, d_k) and v: (B, h_kv, T_k, d_v)
    keys and values of h_kv heads, where h_kv divides h. With g = h // h_kv, query heads
    0 .. g-1 use key/value head 0, heads g .. 2g-1 use head 1, and so on: query head i
    reads key/value head i // g. mask: None, or booleans that broadcast to (B, h, T_q, T_k),
    True where a query may attend to a key (no query has every key masked). Scores are
    divided by sqrt(d_k). Returns the output, shape (B, h, T_q, d_v).
    """
    raise NotImplementedError
''',
    reference=_grouped,
    cases=_cases,
    rtol=1e-6,
    atol=1e-9,
    mistakes=(_tiled, _scaled_by_model_width),
)
"""Write the attention of a grouped-query layer: which key/value head each query head reads."""
