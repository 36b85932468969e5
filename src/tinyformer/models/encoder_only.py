r"""An encoder-only model with a masked-language-model head, in the layout of BERT.

Every position attends to every other (no causal mask), so the output at a
position depends on the whole sequence, left and right:

.. math::
    h_0 = E[x] + P, \qquad h_\ell = \operatorname{EncoderBlock}_\ell(h_{\ell-1}), \qquad
    z = \operatorname{LN}(h_L)\, E^\top

(pre-norm blocks with a final LayerNorm and a tied output, by default).
:cite:t:`devlin2019bert` train it to restore corrupted tokens
(:mod:`tinyformer.data.masking`); BERT's own head adds a dense layer, a GELU and
a LayerNorm before the tied projection, and an output bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyformer._validation import describe, generator, non_negative_int, positive_int
from tinyformer.blocks import EncoderBlock
from tinyformer.layers import Dropout, Embedding, Linear, TiedOutputProjection
from tinyformer.masks import padding_mask
from tinyformer.models._inputs import check_ids, check_mask
from tinyformer.models._stack import make_positions, stack_backward
from tinyformer.models.config import (
    ENCODER_DECODER_POSITIONS,
    _check_common,
    _check_flag,
    _renamed,
    _Serializable,
    _set,
)
from tinyformer.module import Module
from tinyformer.norm import LayerNorm

__all__ = ["EncoderOnlyConfig", "EncoderOnlyMLM", "trace_encoder_block"]


@_renamed("max_len", "context_length")
@dataclass(frozen=True)
class EncoderOnlyConfig(_Serializable):
    r"""Sizes and options of an encoder-only masked language model, checked when made.

    The configuration of an :class:`EncoderOnlyMLM`.

    Attributes
    ----------
    vocab_size : int
        Number of token ids, special tokens (``[MASK]``, padding) included.
    d_model, n_heads, d_ff, n_layers : int
        Width, heads (dividing ``d_model``), feed-forward width and number of
        blocks in the one stack.
    context_length : int
        Longest sequence the model reads. The keyword and attribute ``max_len``
        are a deprecated alias, removed in tinyformer 0.2.0.
    dropout : float
        Dropout probability in ``[0, 1)``.
    norm_first : bool
        Pre-norm blocks with a final LayerNorm (``True``) or post-norm blocks (BERT's).
    activation : str
        ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
    positional : str
        ``"learned"`` (BERT's), ``"sinusoidal"`` (even ``d_model``) or ``"none"``
        (no position information: an ablation).
    tie_output : bool
        The output projection is the embedding table, transposed.
    scale_embeddings : bool
        Multiply embeddings by :math:`\sqrt{d_\text{model}}`.
    pad_id : int or None
        Padding id, hidden from attention by default; ``None`` for data without padding.
    dtype : str
        ``"float32"`` or ``"float64"``.
    """

    vocab_size: int
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    n_layers: int = 2
    context_length: int = 64
    dropout: float = 0.0
    norm_first: bool = True
    activation: str = "gelu"
    positional: str = "learned"
    tie_output: bool = True
    scale_embeddings: bool = False
    pad_id: int | None = None
    dtype: str = "float64"

    def __post_init__(self) -> None:
        """Check every field; raise naming the first bad one."""
        for name in ("vocab_size", "n_layers", "context_length"):
            _set(self, name, positive_int(getattr(self, name), name))
        for name in ("norm_first", "tie_output", "scale_embeddings"):
            _check_flag(self, name)
        _check_common(self, ENCODER_DECODER_POSITIONS)
        if self.pad_id is not None:
            _set(self, "pad_id", non_negative_int(self.pad_id, "pad_id"))
            if self.pad_id >= self.vocab_size:
                raise ValueError(
                    f"pad_id={self.pad_id} must be below vocab_size={self.vocab_size}"
                )


class EncoderOnlyMLM(Module):
    """An encoder stack over token embeddings, with logits over the vocabulary at every position.

    Parameters
    ----------
    config : EncoderOnlyConfig
    rng : numpy.random.Generator
        Draws every initial weight and, in training mode, every dropout mask.

    Attributes
    ----------
    config : EncoderOnlyConfig
    vocab_size, max_positions : int
        ``config.vocab_size`` and ``config.context_length``.
    dtype : numpy.dtype
    """

    def __init__(self, config: EncoderOnlyConfig, *, rng: np.random.Generator) -> None:
        super().__init__()
        if not isinstance(config, EncoderOnlyConfig):
            raise TypeError(f"config must be an EncoderOnlyConfig, got {describe(config)}")
        rng = generator(rng)
        c = self.config = config
        self.vocab_size, self.max_positions = c.vocab_size, c.context_length
        self.dtype = np.dtype(c.dtype)
        d, dtype = c.d_model, self.dtype
        self.embedding = Embedding(
            c.vocab_size, d, rng=rng, scale_by_sqrt_d=c.scale_embeddings, dtype=dtype
        )
        self.positions = make_positions(c.positional, c.context_length, d, rng=rng, dtype=dtype)
        self.dropout = Dropout(c.dropout, rng=rng)
        self.layers = [
            EncoderBlock(
                d,
                c.n_heads,
                c.d_ff,
                rng=rng,
                dropout=c.dropout,
                norm_first=c.norm_first,
                activation=c.activation,
                dtype=dtype,
            )
            for _ in range(c.n_layers)
        ]
        self.final_norm = LayerNorm(d, dtype=dtype) if c.norm_first else None
        self.output: Module = (
            TiedOutputProjection(self.embedding)
            if c.tie_output
            else Linear(d, c.vocab_size, rng=rng, bias=False, dtype=dtype)
        )

    def key_mask(self, ids: object, mask: object = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Checked ``ids`` ``(B, T)`` and the key mask ``(B, 1, T)`` (``None``: hide nothing).

        ``mask`` broadcasts to ``(B, 1, T)``, True at keys that may be attended
        to; by default the positions whose id is not ``config.pad_id``.
        """
        c = self.config
        ids = check_ids(ids, "ids", c.vocab_size, c.context_length, "context_length")
        b, t = ids.shape
        if mask is None:
            if c.pad_id is None:
                return ids, None
            mask = padding_mask(ids, c.pad_id)  # (B, 1, T)
        else:
            mask = check_mask(mask, "mask", (b, 1, t))
        if not np.broadcast_to(mask, (b, 1, t)).any(axis=-1).all():
            raise ValueError("mask hides every position of some sequence: nothing to attend to")
        return ids, (None if mask.all() else mask)

    def encode(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """The encoder's output ``(B, T, d_model)``: one vector per position, from both sides."""
        ids, mask = self.key_mask(ids, mask)
        x = self.embedding.forward(ids)  # (B, T, d)
        if self.positions is not None:
            x = self.positions.forward(x)
        x = self.dropout.forward(x)
        for block in self.layers:
            x = block.forward(x, mask)  # (B, T, d): every position sees every unmasked one
        return x if self.final_norm is None else self.final_norm.forward(x)

    def forward(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Logits ``(B, T, vocab_size)`` for token ids ``(B, T)``, ``T <= context_length``.

        The logits at each position depend on every position the mask lets through.
        """
        logits = self.output.forward(self.encode(ids, mask))  # (B, T, V)
        self._save(logits.shape)
        return logits

    def backward(self, grad_logits: np.ndarray) -> None:
        r"""Back through the whole model; add into every parameter's gradient.

        Parameters
        ----------
        grad_logits : numpy.ndarray
            :math:`\partial L / \partial z`, the shape ``(B, T, vocab_size)`` and
            dtype of the last :meth:`forward`'s logits.
        """
        stack_backward(self, grad_logits)


def trace_encoder_block(
    block: EncoderBlock, x: np.ndarray, mask: np.ndarray | None = None
) -> list[tuple[str, np.ndarray]]:
    """Run ``block`` on ``x`` ``(B, T, d_model)`` one step at a time; return every intermediate.

    Each entry is ``(name, array)``, in the order the block computes them; the
    last is the block's output, equal to ``block.forward(x, mask)``. Dropout is
    left out, so the block must be in evaluation mode or have no dropout.
    """
    if not isinstance(block, EncoderBlock):
        raise TypeError(f"block must be an EncoderBlock, got {describe(block)}")
    if block.training and any(getattr(m, "p", 0) > 0 for m in block.modules()):
        raise ValueError("block has dropout and is in training mode: call block.eval() first")
    steps: list[tuple[str, np.ndarray]] = [("input x", x)]
    attention, ffn = block.self_attention, block.feed_forward
    mha = attention.layer
    z = attention.norm.forward(x) if block.norm_first else x
    if block.norm_first:
        steps.append(("LayerNorm 1", z))
    q, k, v, _ = mha._queries_keys_values(z, None, None)  # (B, h, T, d_k) each
    steps += [("queries Q / sqrt(d_k), heads split", q), ("keys K", k), ("values V", v)]
    out = mha.forward(z, mask=mask)  # (B, T, d)
    weights = mha.attention_weights  # (B, h, T, T)
    heads = weights @ v  # (B, h, T, d_k)
    merged = heads.transpose(0, 2, 1, 3).reshape(x.shape)  # (B, T, h d_k) = (B, T, d)
    steps += [("attention weights", weights), ("heads: weights @ V", heads)]
    steps += [("heads concatenated", merged), ("output projection W_O", out)]
    h = x + out  # (B, T, d)
    steps.append(("residual x + attention", h))
    if not block.norm_first:
        h = attention.norm.forward(h)
        steps.append(("LayerNorm 1", h))
    z = ffn.norm.forward(h) if block.norm_first else h
    if block.norm_first:
        steps.append(("LayerNorm 2", z))
    steps.append(("FFN first linear", ffn.layer.linear_in.forward(z)))  # (B, T, d_ff)
    f = ffn.layer.forward(z)  # (B, T, d)
    steps += [("FFN output", f), ("residual + FFN", h + f)]
    if not block.norm_first:
        steps.append(("LayerNorm 2", ffn.norm.forward(h + f)))
    return steps
