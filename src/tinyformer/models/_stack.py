"""Pieces the models share: the position layer, the single-stack backward pass, fused decoding.

The fused decode step (:func:`decode_step`, with :func:`decode_stack` for the
blocks) runs a decoder-only model over the new positions of step-by-step
decoding with the operations of its layers' own ``forward`` methods, in the same
order, so its logits are the same to the last bit; what it leaves out is the
per-call overhead that a one-token step pays many times: input checks, saved
state for ``backward`` (a cached step has no backward), the activation's
derivative and reshapes between layers. The unit tests compare the two paths bit
for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer import functional
from tinyformer.layers import TiedOutputProjection
from tinyformer.module import Module
from tinyformer.multihead import KVCache, _softmax_in_place
from tinyformer.norm import LayerNorm, _row_dot
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
    """Whether :func:`decode_step` computes ``model``'s step exactly.

    True for blocks without cross-attention, rotary positions or a gated
    feed-forward network, whose dropouts (and the embeddings' dropout) are
    all the identity (evaluation mode, or a rate of 0).
    """
    if model.dropout.training and model.dropout.p > 0.0:
        return False
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
    x_hat = rows - (rows @ mean)[:, None]  # (N, d)
    inv_std = (1.0 / np.sqrt(_row_dot(x_hat, x_hat) / norm.d_model + norm.eps))[:, None]
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


def _extend(cache: KVCache, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cache.append(keys, values)`` without the checks that a decoding step's arrays pass.

    When the batch matches and the storage has room, only the copies are made;
    anything else goes through :meth:`KVCache.append` and its checks.
    """
    stored, n_new = cache._keys, keys.shape[2]
    stop = cache._length + n_new
    if stored is None or stop > stored.shape[2] or keys.shape[0] != stored.shape[0]:
        return cache.append(keys, values)
    stored[:, :, cache._length : stop] = keys
    cache._values[:, :, cache._length : stop] = values
    cache._length = stop
    return stored[:, :, :stop], cache._values[:, :, :stop]


def _attention(layer: Any, rows: np.ndarray, b: int, n: int, cache: KVCache, mask) -> np.ndarray:
    """Cached self-attention of ``MultiHeadAttention.forward``: rows ``(B n, d)`` in and out."""
    h, d_k = layer.n_heads, layer.d_k
    qkv = _linear(rows, layer.w_qkv, layer.b_qkv)  # (B n, 3 d)
    qkv = qkv.reshape(b, n, 3, h, d_k).transpose(2, 0, 3, 1, 4)  # (3, B, h, n, d_k)
    q = qkv[0]
    k, v = _extend(cache, qkv[1], qkv[2])  # (B, h, T_cached + n, d_k)
    q *= layer.scale
    weights = _softmax_in_place(q @ k.transpose(0, 1, 3, 2), mask)  # (B, h, n, T)
    heads = np.empty((b, n, h, d_k), dtype=rows.dtype)  # (B, n, h, d_k)
    np.matmul(weights, v, out=heads.transpose(0, 2, 1, 3))
    return _linear(heads.reshape(b * n, h * d_k), layer.w_out, layer.b_out)  # (B n, d)


def _feed_forward(layer: Any, rows: np.ndarray) -> np.ndarray:
    """``FeedForward.forward`` (not gated) of rows ``(N, d)``, without the derivative."""
    pre = _linear(rows, layer.linear_in.weight, layer.linear_in.bias)  # (N, d_ff)
    if layer.activation == "relu":
        hidden = np.maximum(pre, 0, out=pre)
    else:  # the same value as the layer's, with no derivative: no backward follows
        hidden = functional._activation(pre, layer.activation)
    return _linear(hidden, layer.linear_out.weight, layer.linear_out.bias)  # (N, d)


def decode_stack(model: Any, x: np.ndarray, caches: list, mask: np.ndarray | None) -> np.ndarray:
    """Run ``model.layers`` over the new positions ``x`` ``(B, n, d)``, extending ``caches``.

    Only for a model for which :func:`can_fuse` is true; ``mask`` is the
    ``(n, T_cached + n)`` causal mask, or None for one new position. Each
    sublayer is ``x + F(LN(x))`` (pre-norm) or ``LN(x + F(x))`` (post-norm), as
    in ``_Residual.forward``.
    """
    b, n, d = x.shape
    rows = x.reshape(b * n, d)  # (B n, d)
    mean = np.full(d, 1.0 / d, dtype=x.dtype)  # (d,), as LayerNorm's row means use it
    for block, cache in zip(model.layers, caches, strict=True):
        attention, ffn = block.self_attention, block.feed_forward
        inputs = _layer_norm(attention.norm, rows, mean) if attention.norm_first else rows
        out = _attention(attention.layer, inputs, b, n, cache.self_attention, mask)
        out += rows
        rows = out if attention.norm_first else _layer_norm(attention.norm, out, mean)
        inputs = _layer_norm(ffn.norm, rows, mean) if ffn.norm_first else rows
        out = _feed_forward(ffn.layer, inputs)
        out += rows
        rows = out if ffn.norm_first else _layer_norm(ffn.norm, out, mean)
    return rows.reshape(b, n, d)


def decode_step(
    model: Any, tokens: np.ndarray, start: int, caches: list, mask: np.ndarray | None
) -> np.ndarray:
    """Logits ``(B, n, V)`` of checked ``tokens`` ``(B, n)`` at positions ``start ..``.

    ``DecoderOnlyLM.step`` with its embedding, positions, blocks, final norm and
    output layer in their own operations and order, without their checks or saved
    state. Only for a model for which :func:`can_fuse` is true, and tokens and a
    start the model has already checked.
    """
    b, n = tokens.shape
    embedding = model.embedding
    x = embedding.weight.value[tokens]  # (B, n, d), a fresh array, as Embedding.forward
    if embedding.scale != 1.0:
        x *= embedding.scale
    table = _position_table(model.positions)
    if table is not None:
        x = x + table[start : start + n]
    rows = decode_stack(model, x, caches, mask).reshape(b * n, -1)  # (B n, d)
    if model.final_norm is not None:
        rows = _layer_norm(
            model.final_norm, rows, np.full(rows.shape[1], 1.0 / rows.shape[1], rows.dtype)
        )
    output = model.output
    if isinstance(output, TiedOutputProjection):
        logits = rows @ output.weight.value.T  # (B n, V)
        if output.bias is not None:
            logits += output.bias.value
    else:
        logits = _linear(rows, output.weight, output.bias)
    return logits.reshape(b, n, -1)


def _position_table(positions: Module | None) -> np.ndarray | None:
    """The table a position layer adds rows of (None: no position layer)."""
    if isinstance(positions, LearnedPositionalEmbedding):
        return positions.weight.value
    if isinstance(positions, SinusoidalPositionalEncoding):
        return positions.table
    return None
