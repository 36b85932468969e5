"""Pieces the models share: the position layer, the single-stack backward pass, fused decoding.

The fused decode step (:func:`decode_stack`) runs a stack of decoder blocks
over the new positions of step-by-step decoding with the operations of the
blocks' own ``forward`` methods, in the same order, so its outputs are the
same to the last bit; what it leaves out is the per-call overhead that a
one-token step pays many times: input checks, saved state for ``backward``
(a cached step has no backward) and reshapes between layers. The unit tests
compare the two paths bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer import functional
from tinyformer.module import Module
from tinyformer.multihead import KVCache, _softmax_in_place
from tinyformer.norm import LayerNorm
from tinyformer.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


def stack_backward(model: Any, grad_logits: np.ndarray) -> None:
    """Back through output layer, final norm, blocks, dropout, positions and embedding.

    ``model`` is a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` or an
    :class:`~tinyformer.models.encoder_only.EncoderOnlyMLM`: one embedding, one
    stack of blocks, one output layer, with the same attribute names.
    """
    if model._cache is not None:  # check first, so that a bad gradient can be retried
        model._check_grad(grad_logits, model._cache[0], model.dtype)
    (shape,) = model._saved()
    grad = model._check_grad(grad_logits, shape, model.dtype)
    grad = model.output.backward(grad)  # (B, T, d)
    if model.final_norm is not None:
        grad = model.final_norm.backward(grad)
    for block in reversed(model.layers):
        grad = block.backward(grad)
    grad = model.dropout.backward(grad)
    if model.positions is not None:
        grad = model.positions.backward(grad)
    model.embedding.backward(grad)


def make_positions(
    kind: str, max_len: int, d_model: int, *, rng: np.random.Generator, dtype: np.dtype
) -> Module | None:
    """The position layer added to the embeddings: sinusoidal, learned, or None (rotary, none)."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len, dtype=dtype)
    if kind == "learned":
        return LearnedPositionalEmbedding(max_len, d_model, rng=rng, dtype=dtype)
    return None


def can_fuse(model: Any) -> bool:
    """Whether :func:`decode_stack` computes ``model``'s blocks exactly.

    True for blocks without cross-attention, rotary positions or a gated
    feed-forward network, whose dropouts are all the identity (evaluation mode,
    or a rate of 0).
    """
    for block in model.layers:
        attention, ffn = block.self_attention.layer, block.feed_forward.layer
        if block.cross_attention is not None or attention.rotary or ffn.gated:
            return False
        dropouts = (
            block.self_attention.dropout,
            attention.dropout,
            block.feed_forward.dropout,
            ffn.dropout,
        )
        if any(dropout.training and dropout.p > 0.0 for dropout in dropouts):
            return False
    return True


def _layer_norm(norm: LayerNorm, rows: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``LayerNorm.forward`` of rows ``(N, d)``, its operations in its order, nothing saved.

    ``mean`` is the vector ``(d,)`` of entries ``1/d`` (row means as a matrix product).
    """
    d = rows.shape[1]
    x_hat = rows - (rows @ mean)[:, None]  # (N, d)
    inv_std = (1.0 / np.sqrt(np.einsum("ij,ij->i", x_hat, x_hat) / d + norm.eps))[:, None]
    x_hat *= inv_std
    y = x_hat * norm.gain.value
    y += norm.bias.value
    return y


def _linear(rows: np.ndarray, weight: Any, bias: Any) -> np.ndarray:
    """``rows @ W + b`` for rows ``(N, d_in)``, as ``Linear.forward`` computes it."""
    y = rows @ weight.value
    if bias is not None:
        y += bias.value
    return y


def _attention(layer: Any, rows: np.ndarray, b: int, n: int, cache: KVCache, mask) -> np.ndarray:
    """Cached self-attention of ``MultiHeadAttention.forward``: rows ``(B n, d)`` in and out."""
    h, d_k = layer.n_heads, layer.d_k
    qkv = _linear(rows, layer.w_qkv, layer.b_qkv)  # (B n, 3 d)
    qkv = qkv.reshape(b, n, 3, h, d_k).transpose(2, 0, 3, 1, 4)  # (3, B, h, n, d_k)
    q = qkv[0]
    k, v = cache.append(qkv[1], qkv[2])  # (B, h, T_cached + n, d_k)
    q *= layer.scale
    weights = _softmax_in_place(q @ k.transpose(0, 1, 3, 2), mask)  # (B, h, n, T)
    heads = np.empty((b, n, h, d_k), dtype=rows.dtype)  # (B, n, h, d_k)
    np.matmul(weights, v, out=heads.transpose(0, 2, 1, 3))
    return _linear(heads.reshape(b * n, h * d_k), layer.w_out, layer.b_out)  # (B n, d)


def _feed_forward(layer: Any, rows: np.ndarray) -> np.ndarray:
    """``FeedForward.forward`` (not gated) of rows ``(N, d)``."""
    pre = _linear(rows, layer.linear_in.weight, layer.linear_in.bias)  # (N, d_ff)
    if layer.activation == "relu":
        hidden = np.maximum(pre, 0, out=pre)
    else:
        hidden = functional._activation_and_derivative(pre, layer.activation)[0]
    return _linear(hidden, layer.linear_out.weight, layer.linear_out.bias)  # (N, d)


def _sublayer(residual: Any, rows: np.ndarray, compute, mean: np.ndarray) -> np.ndarray:
    """``x + F(LN(x))`` (pre-norm) or ``LN(x + F(x))`` (post-norm), as ``_Residual.forward``."""
    if residual.norm_first:
        out = compute(_layer_norm(residual.norm, rows, mean))
        out += rows
        return out
    out = compute(rows)
    out += rows
    return _layer_norm(residual.norm, out, mean)


def decode_stack(model: Any, x: np.ndarray, caches: list, mask: np.ndarray | None) -> np.ndarray:
    """Run ``model.layers`` over the new positions ``x`` ``(B, n, d)``, extending ``caches``.

    Only for a model for which :func:`can_fuse` is true; ``mask`` is the
    ``(n, T_cached + n)`` causal mask, or None for one new position.
    """
    b, n, d = x.shape
    rows = x.reshape(b * n, d)  # (B n, d)
    mean = np.full(d, 1.0 / d, dtype=x.dtype)  # (d,), as LayerNorm's row means use it
    for block, cache in zip(model.layers, caches, strict=True):
        attention, ffn = block.self_attention.layer, block.feed_forward.layer
        rows = _sublayer(
            block.self_attention,
            rows,
            lambda r, a=attention, c=cache.self_attention: _attention(a, r, b, n, c, mask),
            mean,
        )
        rows = _sublayer(block.feed_forward, rows, lambda r, f=ffn: _feed_forward(f, r), mean)
    return rows.reshape(b, n, d)
