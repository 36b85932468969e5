r"""A decoder-only language model in the layout of GPT-2 :cite:p:`radford2019language`.

Each position sees itself and the positions before it, and the logits at
position :math:`t` score the token at :math:`t + 1`:

.. math::
    h = \operatorname{Decoder}(E[x] + P), \qquad z = h\, E^\top

with :class:`~tinyformer.models.stack.TransformerStack` as the decoder (blocks
without cross-attention, a causal mask; pre-norm blocks with a final norm and a
tied output, by default).
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import describe, generator, positive_int
from tinyformer.layers import Embedding, Linear, TiedOutputProjection
from tinyformer.models._inputs import CausalMasks, check_ids, check_state
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.stack import TransformerStack
from tinyformer.models.state import DecodeState
from tinyformer.module import Module, no_grad

__all__ = ["DecoderOnlyLM"]


class DecoderOnlyLM(Module):
    r"""Causal language model: one stack of blocks under a causal mask, and an output layer.

    Layout: ``decoder``, a :class:`~tinyformer.models.stack.TransformerStack`
    (token embedding, times :math:`\sqrt{d}` if ``scale_embeddings``, plus learned
    or sinusoidal positions, or rotary positions inside every block; dropout;
    ``n_layers`` blocks without cross-attention; a final norm when ``norm_first``),
    then ``output``: the embedding table transposed when ``tie_output``, else a
    bias-free ``Linear``.

    Parameters
    ----------
    config : DecoderOnlyConfig
        Sizes and options.
    rng : numpy.random.Generator
        Draws every initial weight and, in training mode, every dropout mask.

    Attributes
    ----------
    config : DecoderOnlyConfig
    vocab_size, context_length : int
        ``config.vocab_size`` and ``config.context_length``.
    dtype : numpy.dtype
    """

    family = "decoder-only"
    """The model family, which tells the generation functions what ``start`` takes."""

    def __init__(self, config: DecoderOnlyConfig, *, rng: np.random.Generator) -> None:
        super().__init__()
        if not isinstance(config, DecoderOnlyConfig):
            raise TypeError(f"config must be a DecoderOnlyConfig, got {type(config).__name__}")
        rng = generator(rng)
        c = self.config = config
        self.vocab_size, self.context_length = c.vocab_size, c.context_length
        self.dtype = np.dtype(c.dtype)
        embedding = Embedding(
            c.vocab_size, c.d_model, rng=rng, scale_by_sqrt_d=c.scale_embeddings, dtype=self.dtype
        )
        self.decoder = TransformerStack(c, embedding, c.n_layers, cross_attention=False, rng=rng)
        self.output: Module = (
            TiedOutputProjection(embedding)
            if c.tie_output
            else Linear(c.d_model, c.vocab_size, rng=rng, bias=False, dtype=self.dtype)
        )
        self._causal = CausalMasks()

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """Logits ``(B, T, vocab_size)`` for token ids ``(B, T)``, ``T <= context_length``.

        The logits at position ``t`` depend on ``ids[:, :t + 1]`` only.
        """
        ids = check_ids(ids, "ids", self.vocab_size, self.context_length, "context_length")
        t = ids.shape[1]
        h = self.decoder.forward(ids, self._causal(t, t))  # (B, T, d)
        logits = self.output.forward(h)  # (B, T, V)
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
        self.decoder.backward(self.output.backward(grad))

    def start(self, batch_size: int) -> DecodeState:
        """An empty state for decoding ``batch_size`` sequences side by side."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
            raise TypeError(f"batch_size must be a positive integer, got {describe(batch_size)}")
        batch_size = positive_int(batch_size, "batch_size")
        self._cache = None
        return DecodeState(self, batch_size=batch_size, caches=self.decoder.new_caches())

    def step(self, tokens: np.ndarray, state: DecodeState) -> np.ndarray:
        """Feed ``tokens`` ``(B, n)`` at positions ``state.length ..``; return their logits.

        Feed a whole prompt in one call, then one token at a time. The logits
        ``(B, n, vocab_size)`` equal (to rounding) those :meth:`forward` gives at
        the same positions for the whole prefix: the same stack runs, with each
        block's keys and values appended to ``state``'s caches, under
        :func:`~tinyformer.module.no_grad`. ``state`` is extended in place.

        Raises
        ------
        ValueError
            If ``state.length + n`` exceeds ``context_length``, the batch sizes
            differ, or the state belongs to another model.
        """
        self._cache = None
        tokens = check_ids(tokens, "tokens", self.vocab_size, None, "context_length")
        b, n = tokens.shape
        state = check_state(state, self, n, b)
        total = state.length + n
        mask = None if n == 1 else self._causal(n, total)  # (n, total): a new token sees all
        with no_grad():
            h = self.decoder.forward(tokens, mask, start=state.length, caches=state.caches)
            logits = self.output.forward(h)  # (B, n, V)
        state.length = total
        return logits
