r"""An encoder-only model with a masked-language-model head, in the layout of BERT.

Every position attends to every other (no causal mask), so the output at a
position depends on the whole sequence, left and right:

.. math::
    h = \operatorname{Encoder}(E[x] + P), \qquad z = h\, E^\top

with :class:`~tinyformer.models.stack.TransformerStack` as the encoder (pre-norm
blocks with a final norm and a tied output, by default).
:cite:t:`devlin2019bert` train it to restore corrupted tokens
(:mod:`tinyformer.data.masking`); BERT's own head adds a dense layer, a GELU and
a LayerNorm before the tied projection, and an output bias.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import describe, generator
from tinyformer.layers import Embedding, Linear, TiedOutputProjection
from tinyformer.masks import padding_mask
from tinyformer.models._inputs import check_ids, check_mask
from tinyformer.models.config import EncoderOnlyConfig
from tinyformer.models.stack import TransformerStack
from tinyformer.module import Module

__all__ = ["EncoderOnlyMLM"]


class EncoderOnlyMLM(Module):
    """An encoder stack over token embeddings, with logits over the vocabulary at every position.

    Layout: ``encoder``, a :class:`~tinyformer.models.stack.TransformerStack`
    whose blocks attend in both directions (hiding padding only), then
    ``output``: the embedding table transposed when ``tie_output``, else a
    bias-free ``Linear``.

    Parameters
    ----------
    config : EncoderOnlyConfig
    rng : numpy.random.Generator
        Draws every initial weight and, in training mode, every dropout mask.

    Attributes
    ----------
    config : EncoderOnlyConfig
    vocab_size, context_length : int
        ``config.vocab_size`` and ``config.context_length``.
    dtype : numpy.dtype
    """

    family = "encoder-only"
    """The model family (an encoder-only model does not generate)."""

    def __init__(self, config: EncoderOnlyConfig, *, rng: np.random.Generator) -> None:
        super().__init__()
        if not isinstance(config, EncoderOnlyConfig):
            raise TypeError(f"config must be an EncoderOnlyConfig, got {describe(config)}")
        rng = generator(rng)
        c = self.config = config
        self.vocab_size, self.context_length = c.vocab_size, c.context_length
        self.dtype = np.dtype(c.dtype)
        embedding = Embedding(
            c.vocab_size, c.d_model, rng=rng, scale_by_sqrt_d=c.scale_embeddings, dtype=self.dtype
        )
        self.encoder = TransformerStack(c, embedding, c.n_layers, cross_attention=False, rng=rng)
        self.output: Module = (
            TiedOutputProjection(embedding)
            if c.tie_output
            else Linear(c.d_model, c.vocab_size, rng=rng, bias=False, dtype=self.dtype)
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
        return self.encoder.forward(ids, mask)  # every position sees every unmasked one

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
        grad = self._checked_gradient(grad_logits)
        self.encoder.backward(self.output.backward(grad))
