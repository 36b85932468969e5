"""Pieces the models share: the position layer they add, and the single-stack backward pass."""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer.module import Module
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
