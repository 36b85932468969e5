r"""A decoder-only language model in the layout of GPT-2 :cite:p:`radford2019language`.

Each position sees itself and the positions before it, and the logits at
position :math:`t` score the token at :math:`t + 1`:

.. math::
    h_0 = E[x] + P, \qquad h_\ell = \operatorname{Block}_\ell(h_{\ell-1}), \qquad
    z = \operatorname{LN}(h_L)\, E^\top

(pre-norm blocks with a final LayerNorm and a tied output, by default).
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import describe, generator, positive_int
from tinyformer.blocks import DecoderBlock, DecoderCache
from tinyformer.layers import Dropout, Embedding, Linear, TiedOutputProjection
from tinyformer.models._inputs import CausalMasks, check_ids, check_state
from tinyformer.models._stack import can_fuse, decode_step, make_positions, stack_backward
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.state import DecodeState
from tinyformer.module import Module
from tinyformer.norm import LayerNorm

__all__ = ["DecoderOnlyLM"]


class DecoderOnlyLM(Module):
    r"""Causal language model: embedding + positions, decoder blocks without cross-attention.

    Layout: token embedding (times :math:`\sqrt{d}` if ``scale_embeddings``) plus
    learned or sinusoidal positions (rotary positions instead rotate queries and
    keys inside every block), dropout, ``n_layers``
    :class:`~tinyformer.blocks.DecoderBlock` with ``cross_attention=False``, a final
    LayerNorm when ``norm_first``, then the output projection: the embedding table
    transposed when ``tie_output``, else a bias-free ``Linear``.

    Parameters
    ----------
    config : DecoderOnlyConfig
        Sizes and options.
    rng : numpy.random.Generator
        Draws every initial weight and, in training mode, every dropout mask.

    Attributes
    ----------
    config : DecoderOnlyConfig
    vocab_size : int
    max_positions : int
        ``config.context_length``.
    dtype : numpy.dtype
    """

    family = "decoder-only"
    """The model family, which tells the generation functions what ``start`` takes."""

    fused_decoding = True
    """Let :meth:`step` run through the fused decode path when it applies
    (``tinyformer.models._stack.decode_step``): the same numbers to the last bit, less
    overhead per token. ``False`` runs every layer's own ``forward``."""

    def __init__(self, config: DecoderOnlyConfig, *, rng: np.random.Generator) -> None:
        super().__init__()
        if not isinstance(config, DecoderOnlyConfig):
            raise TypeError(f"config must be a DecoderOnlyConfig, got {type(config).__name__}")
        rng = generator(rng)
        c = self.config = config
        self.vocab_size = c.vocab_size
        self.max_positions = c.context_length
        self.dtype = np.dtype(c.dtype)
        d, dtype = c.d_model, self.dtype
        self.embedding = Embedding(
            c.vocab_size, d, rng=rng, scale_by_sqrt_d=c.scale_embeddings, dtype=dtype
        )
        self.positions = make_positions(c.positional, c.context_length, d, rng=rng, dtype=dtype)
        self.dropout = Dropout(c.dropout, rng=rng)
        self.layers = [
            DecoderBlock(
                d,
                c.n_heads,
                c.d_ff,
                rng=rng,
                cross_attention=False,
                dropout=c.dropout,
                norm_first=c.norm_first,
                activation=c.activation,
                rotary=c.positional == "rotary",
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
        self._causal = CausalMasks()

    def _embed(self, ids: np.ndarray, start: int) -> np.ndarray:
        x = self.embedding.forward(ids)  # (B, T, d)
        if self.positions is not None:
            x = self.positions.forward(x, start)
        return self.dropout.forward(x)

    def _project(self, x: np.ndarray) -> np.ndarray:
        if self.final_norm is not None:
            x = self.final_norm.forward(x)
        return self.output.forward(x)  # (B, T, V)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """Logits ``(B, T, vocab_size)`` for token ids ``(B, T)``, ``T <= context_length``.

        The logits at position ``t`` depend on ``ids[:, :t + 1]`` only.
        """
        c = self.config
        ids = check_ids(ids, "ids", c.vocab_size, c.context_length, "context_length")
        t = ids.shape[1]
        mask = self._causal(t, t)  # (T, T)
        x = self._embed(ids, 0)
        for block in self.layers:
            x = block.forward(x, self_mask=mask)  # (B, T, d)
        logits = self._project(x)
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

    def start(self, batch_size: int) -> DecodeState:
        """An empty state for decoding ``batch_size`` sequences side by side."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
            raise TypeError(f"batch_size must be a positive integer, got {describe(batch_size)}")
        batch_size = positive_int(batch_size, "batch_size")
        self._cache = None
        return DecodeState(
            self, batch_size=batch_size, caches=[DecoderCache() for _ in self.layers]
        )

    def step(self, tokens: np.ndarray, state: DecodeState) -> np.ndarray:
        """Feed ``tokens`` ``(B, n)`` at positions ``state.length ..``; return their logits.

        Feed a whole prompt in one call, then one token at a time. The logits
        ``(B, n, vocab_size)`` equal (to rounding) those :meth:`forward` gives at
        the same positions for the whole prefix. ``state`` is extended in place.

        Raises
        ------
        ValueError
            If ``state.length + n`` exceeds ``context_length``, the batch sizes
            differ, or the state belongs to another model.
        """
        self._cache = None
        tokens = check_ids(tokens, "tokens", self.config.vocab_size, None, "context_length")
        b, n = tokens.shape
        state = check_state(state, self, n, b)
        total = state.length + n
        mask = None if n == 1 else self._causal(n, total)  # (n, total)
        if self.fused_decoding and can_fuse(self):
            logits = decode_step(self, tokens, state.length, state.caches, mask)  # (B, n, V)
        else:
            x = self._embed(tokens, state.length)
            for block, cache in zip(self.layers, state.caches, strict=True):
                x = block.forward(x, self_mask=mask, cache=cache)
            logits = self._project(x)
        state.length = total
        return logits
