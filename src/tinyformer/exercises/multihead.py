"""The live exercise of the chapter on multi-head attention."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.masks import causal_mask, padding_mask
from tinyformer.multihead import MultiHeadAttention


def _layer_forward(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """The forward pass of a bias-free :class:`MultiHeadAttention` with these weights."""
    layer = MultiHeadAttention(x.shape[-1], n_heads, rng=np.random.default_rng(0), bias=False)
    for linear, weight in zip(
        (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj),
        (w_q, w_k, w_v, w_o),
        strict=True,
    ):
        linear.weight.value[...] = weight
    return layer.forward(x, mask=mask)


def _attend(q, k, v, mask, scale):
    """Masked softmax attention over the last two axes (every row keeps a key)."""
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v


def _reshape_only(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Cuts the heads with a reshape and no transpose: a head's 'tokens' are not tokens."""
    b, t, d = x.shape
    q, k, v = ((x @ w).reshape(b, n_heads, t, d // n_heads) for w in (w_q, w_k, w_v))
    if mask is not None:
        mask = np.expand_dims(mask, -3)
    return _attend(q, k, v, mask, (d // n_heads) ** -0.5).reshape(b, t, d) @ w_o


def _model_width_scale(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Scales the scores by 1/sqrt(d_model) instead of 1/sqrt(d_k)."""
    b, t, d = x.shape
    q, k, v = ((x @ w).reshape(b, t, n_heads, -1).transpose(0, 2, 1, 3) for w in (w_q, w_k, w_v))
    if mask is not None:
        mask = np.expand_dims(mask, -3)
    return _attend(q, k, v, mask, d**-0.5).transpose(0, 2, 1, 3).reshape(b, t, d) @ w_o


def _mask_without_head_axis(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Applies a (B, T_q, T_k) mask to (B, h, T_q, T_k) scores as it is: its batch axis meets the heads."""
    b, t, d = x.shape
    q, k, v = ((x @ w).reshape(b, t, n_heads, -1).transpose(0, 2, 1, 3) for w in (w_q, w_k, w_v))
    return (
        _attend(q, k, v, mask, (d // n_heads) ** -0.5).transpose(0, 2, 1, 3).reshape(b, t, d) @ w_o
    )


def _weights(rng, d_model):
    """W_Q, W_K, W_V, W_O with entries of standard deviation 1/sqrt(d_model)."""
    return tuple(rng.standard_normal((4, d_model, d_model)) / np.sqrt(d_model))


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    x1, x2, x3 = (
        rng.standard_normal((1, 4, 8)),
        rng.standard_normal((3, 5, 12)),
        rng.standard_normal((2, 5, 8)),
    )
    ids = np.array([[4, 7, 2, 9, 5], [6, 3, 8, 0, 0]])  # the second sequence ends in two <pad>
    return [
        Case((x1, *_weights(rng, 8), 2), label="one sequence of 4 tokens with 2 heads and no mask"),
        Case((x2, *_weights(rng, 12), 3, causal_mask(5)), label="a batch of 3 with 3 heads and a causal mask (T, T)"),
        Case((x3, *_weights(rng, 8), 2, padding_mask(ids, 0)), label="a batch of 2 with 2 heads and a padding mask (B, 1, T)"),
        Case((x3, *_weights(rng, 8), 4), label="4 heads of d_k = 2"),
    ]  # fmt: skip


MULTI_HEAD_ATTENTION = Exercise(
    chapter="multihead",
    name="multi_head_attention",
    stub='''\
def multi_head_attention(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Multi-head self-attention without biases.

    x: (B, T, d_model); w_q, w_k, w_v, w_o: (d_model, d_model); n_heads divides d_model,
    and head i owns columns i*d_k .. (i+1)*d_k - 1 of x @ w_q, x @ w_k and x @ w_v, with
    d_k = d_model // n_heads. mask: None, or booleans that broadcast to (B, T, T) (no head
    axis), True where a query may attend to a key; every query may attend to some key.
    Each head computes softmax(q k^T / sqrt(d_k)) v on its slices; the heads' outputs,
    side by side in the same column order, are multiplied by w_o.
    Returns the output, of shape (B, T, d_model).
    """
    raise NotImplementedError
''',
    reference=_layer_forward,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    mistakes=(_reshape_only, _model_width_scale, _mask_without_head_axis),
)
"""Write the layer: cut the projections into heads, attend with each, merge, project (eq-multihead)."""
