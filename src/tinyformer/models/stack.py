r"""The stack every model is made of: embedding, positions, blocks and a final norm.

.. math::
    h_0 = s\,E[x] + P, \qquad h_\ell = \operatorname{Block}_\ell(h_{\ell-1}), \qquad
    \text{out} = \operatorname{N}(h_L)

(:math:`s = \sqrt{d_\text{model}}` when embeddings are scaled, the final norm
:math:`\operatorname{N}` only for pre-norm blocks). A decoder-only model is one
stack with a causal mask and an output layer; an encoder-only model is one stack
with a padding mask and an output layer; an encoder-decoder is two stacks, the
second with cross-attention to the first's output. Training (``forward`` then
``backward``), evaluation and cached decoding (``forward`` with caches, under
:func:`~tinyformer.module.no_grad`) all run the same :meth:`TransformerStack.forward`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer._validation import describe
from tinyformer.blocks import BlockCache, TransformerBlock
from tinyformer.layers import Dropout, Embedding
from tinyformer.module import Module
from tinyformer.norm import make_norm
from tinyformer.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = ["TransformerStack", "make_positions"]


def make_positions(
    kind: str, context_length: int, d_model: int, *, rng: np.random.Generator, dtype: np.dtype
) -> Module | None:
    """The position layer added to the embeddings: sinusoidal, learned, or None (rotary, none)."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, context_length, dtype=dtype)
    if kind == "learned":
        return LearnedPositionalEmbedding(context_length, d_model, rng=rng, dtype=dtype)
    return None


class TransformerStack(Module):
    """Token embedding, positions, dropout, ``n_layers`` blocks and (pre-norm) a final norm.

    Parameters
    ----------
    config : TransformerConfig
        The options of every block and of the positions (any family's configuration).
    embedding : Embedding
        The token embedding; the model makes it, so that an output layer or a
        second stack can share its table.
    n_layers : int
        Number of blocks.
    cross_attention : bool
        Blocks with cross-attention to a memory (the decoder of an encoder-decoder).
    rng : numpy.random.Generator
        Initializes the positions and blocks (in that order) and drives dropout.
    """

    def __init__(
        self,
        config: Any,
        embedding: Embedding,
        n_layers: int,
        *,
        cross_attention: bool,
        rng: np.random.Generator,
    ) -> None:
        super().__init__()
        c = config
        d, dtype = c.d_model, np.dtype(c.dtype)
        self.embedding = embedding
        self.positions = make_positions(c.positional, c.context_length, d, rng=rng, dtype=dtype)
        self.dropout = Dropout(c.dropout, rng=rng)
        self.layers = [
            TransformerBlock(
                d,
                c.n_heads,
                c.d_ff,
                rng=rng,
                cross_attention=cross_attention,
                dropout=c.dropout,
                norm_first=c.norm_first,
                norm=c.norm,
                norm_eps=c.norm_eps,
                feed_forward=c.feed_forward,
                activation=c.activation,
                bias=c.bias,
                rotary=c.positional == "rotary",
                rotary_base=c.rotary_frequency_base,  # rotary_base unless NTK-scaled
                rotary_layout=c.rotary_layout,
                rotary_interpolation=c.rotary_interpolation,  # 1.0 unless linearly scaled
                scale=c.score_scale,
                n_kv_heads=c.n_kv_heads,
                n_experts=c.n_experts,
                experts_per_token=c.experts_per_token,
                expert_feed_forward=c.expert_feed_forward,
                expert_capacity_factor=c.expert_capacity_factor,
                router_aux_loss_weight=c.router_aux_loss_weight,
                dtype=dtype,
            )
            for _ in range(n_layers)
        ]
        self.final_norm = (
            make_norm(c.norm, d, eps=c.norm_eps, dtype=dtype) if c.norm_first else None
        )
        self.cross_attention = bool(cross_attention)
        self.dtype = dtype

    def new_caches(self) -> list[BlockCache]:
        """One empty key/value cache per block, for :meth:`forward` with ``caches``."""
        return [block.new_cache() for block in self.layers]

    def forward(
        self,
        ids: np.ndarray,
        mask: np.ndarray | None = None,
        *,
        memory: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        start: int = 0,
        caches: list[BlockCache] | None = None,
    ) -> np.ndarray:
        """The stack's output ``(B, T, d_model)`` for token ids ``(B, T)`` at positions ``start ..``.

        Parameters
        ----------
        ids : numpy.ndarray of int
            ``(B, T)`` token ids, checked by the model.
        mask : numpy.ndarray of bool, optional
            Every block's self-attention mask (see :meth:`~tinyformer.blocks.TransformerBlock.forward`).
        memory, memory_mask : numpy.ndarray, optional
            The encoder output and its mask, for a stack with cross-attention.
        start : int
            Position of ``ids[:, 0]``: the number of positions already cached.
        caches : list of BlockCache, optional
            One per block (from :meth:`new_caches`), extended in place: decoding.
        """
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(
                f"caches must hold one BlockCache per block ({len(self.layers)}),"
                f" got {describe(caches)}"
            )
        # stack-forward-begin
        x = self.embedding.forward(ids)  # (B, T, d)
        if self.positions is not None:
            x = self.positions.forward(x, start)
        x = self.dropout.forward(x)
        for i, block in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            x = block.forward(x, memory, mask=mask, memory_mask=memory_mask, cache=cache)
        if self.final_norm is not None:
            x = self.final_norm.forward(x)
        # stack-forward-end
        self._save(None if memory is None else memory.shape)
        return x

    def backward(self, grad_out: np.ndarray) -> np.ndarray | None:
        """Back through every layer; return the gradient for the memory (None without cross-attention)."""
        (memory_shape,) = self._saved()
        grad = grad_out
        if self.final_norm is not None:
            grad = self.final_norm.backward(grad)
        grad_memory = None if memory_shape is None else np.zeros(memory_shape, dtype=self.dtype)
        for block in reversed(self.layers):
            if grad_memory is None:
                grad = block.backward(grad)
            else:
                grad, grad_from_block = block.backward(grad)
                grad_memory += grad_from_block  # every block reads the memory
        grad = self.dropout.backward(grad)
        if self.positions is not None:
            grad = self.positions.backward(grad)
        self.embedding.backward(grad)
        return grad_memory
