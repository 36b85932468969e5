r"""The encoder-decoder transformer of :cite:t:`vaswani2017attention`, forward and backward.

The encoder reads the whole source at once; the decoder reads the target
shifted right and attends to the encoder's output (the *memory*) in every
block:

.. math::
    m = \operatorname{Encoder}(E_\text{src}[x] + P), \qquad
    z = \operatorname{Decoder}(E_\text{tgt}[y] + P,\ m)\,W_\text{out},

two :class:`~tinyformer.models.stack.TransformerStack` objects, the decoder's
blocks with cross-attention.

Training runs :meth:`EncoderDecoder.forward` then :meth:`EncoderDecoder.backward`;
generation runs :meth:`EncoderDecoder.start` (encode once) then
:meth:`EncoderDecoder.step` as often as needed, each step reusing the keys and
values of the positions before it.
"""

from __future__ import annotations

import copy

import numpy as np

from tinyformer._validation import generator
from tinyformer.layers import Embedding, Linear, TiedOutputProjection
from tinyformer.masks import padding_mask
from tinyformer.models._inputs import CausalMasks, check_ids, check_mask, check_state
from tinyformer.models.config import EncoderDecoderConfig
from tinyformer.models.stack import TransformerStack
from tinyformer.models.state import DecodeState
from tinyformer.module import Module, no_grad

__all__ = ["EncoderDecoder"]


class EncoderDecoder(Module):
    r"""The encoder-decoder transformer: two stacks and an output layer.

    Layout, for ``config.norm_first=False`` (post-norm, the original) or ``True``
    (pre-norm, which adds a final norm after each stack):

    - ``encoder``: source embedding (times :math:`\sqrt{d}` if ``scale_embeddings``)
      + positions, dropout, ``n_encoder_layers`` blocks, [norm]: the memory;
    - ``decoder``: target embedding + positions, dropout, ``n_decoder_layers``
      blocks whose cross-attention reads the memory, [norm];
    - ``output``: the target embedding transposed when ``tie_output``
      :cite:p:`press2017using`, else a bias-free ``Linear``.

    With ``share_embeddings`` the source and target use one table, so with
    ``tie_output`` one matrix serves three times and its gradient is the sum of
    all three uses.

    Parameters
    ----------
    config : EncoderDecoderConfig
        Sizes and options.
    rng : numpy.random.Generator
        Draws every initial weight and, in training mode, every dropout mask.

    Attributes
    ----------
    config : EncoderDecoderConfig
    vocab_size : int
        The target vocabulary size (the width of the logits).
    context_length : int
        ``config.context_length``: the longest source and the most decoder positions.
    dtype : numpy.dtype
        Dtype of parameters and logits.
    """

    family = "encoder-decoder"
    """The model family, which tells the generation functions what ``start`` takes."""

    def __init__(self, config: EncoderDecoderConfig, *, rng: np.random.Generator) -> None:
        super().__init__()
        if not isinstance(config, EncoderDecoderConfig):
            raise TypeError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
        rng = generator(rng)
        c = self.config = config
        self.vocab_size, self.context_length = c.tgt_vocab_size, c.context_length
        self.dtype = np.dtype(c.dtype)
        embed = {"rng": rng, "scale_by_sqrt_d": c.scale_embeddings, "dtype": self.dtype}
        source_embedding = Embedding(c.src_vocab_size, c.d_model, **embed)
        if c.share_embeddings:  # a second layer object (its own saved ids) on the same table
            target_embedding = copy.copy(source_embedding)
        else:
            target_embedding = Embedding(c.tgt_vocab_size, c.d_model, **embed)
        stack = {"rng": rng}
        self.encoder = TransformerStack(
            c, source_embedding, c.n_encoder_layers, cross_attention=False, **stack
        )
        self.decoder = TransformerStack(
            c, target_embedding, c.n_decoder_layers, cross_attention=True, **stack
        )
        self.output: Module = (
            TiedOutputProjection(target_embedding)
            if c.tie_output
            else Linear(c.d_model, c.tgt_vocab_size, rng=rng, bias=False, dtype=self.dtype)
        )
        self._causal = CausalMasks()

    # ------------------------------------------------------------------ inputs
    def _source(
        self, source_ids: object, source_mask: object
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Checked source ids ``(B, S)`` and key mask (``None`` when nothing is hidden)."""
        c = self.config
        ids = check_ids(
            source_ids, "source_ids", c.src_vocab_size, c.context_length, "context_length"
        )
        b, s = ids.shape
        if source_mask is None:
            mask = padding_mask(ids, c.pad_id)  # (B, 1, S)
        else:
            mask = check_mask(source_mask, "source_mask", (b, 1, s))
        return ids, (None if mask.all() else mask)

    def _decoder_mask(self, ids: np.ndarray, decoder_mask: object) -> np.ndarray:
        """The given mask, or causal and hiding padded decoder positions."""
        b, t = ids.shape
        if decoder_mask is not None:
            return check_mask(decoder_mask, "decoder_mask", (b, t, t))
        causal = self._causal(t, t)  # (T, T)
        real = ids != self.config.pad_id  # (B, T)
        return causal if real.all() else causal & real[:, None, :]  # (B, T, T)

    # ----------------------------------------------------------------- forward
    def encode(self, source_ids: np.ndarray, source_mask: np.ndarray | None) -> np.ndarray:
        """The memory ``(B, S, d_model)`` of checked ``source_ids``; kept for backward."""
        return self.encoder.forward(source_ids, source_mask)

    def forward(
        self,
        source_ids: np.ndarray,
        decoder_input_ids: np.ndarray,
        *,
        source_mask: np.ndarray | None = None,
        decoder_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Logits for every decoder position, with teacher forcing.

        Parameters
        ----------
        source_ids : numpy.ndarray of int
            ``(B, S)``, ``S <= context_length``.
        decoder_input_ids : numpy.ndarray of int
            ``(B, T)``, ``T <= context_length``: ``<bos>`` followed by the target.
        source_mask : numpy.ndarray of bool, optional
            Broadcasts to ``(B, 1, S)``: True at source positions that may be
            attended to (by the encoder and by the decoder's cross-attention).
            Defaults to the positions whose id is not ``config.pad_id``.
        decoder_mask : numpy.ndarray of bool, optional
            Broadcasts to ``(B, T, T)``. Defaults to causal and hiding padded
            decoder positions, as :class:`~tinyformer.data.batching.Batch` builds it.

        Returns
        -------
        numpy.ndarray
            Logits ``(B, T, tgt_vocab_size)`` in the model's dtype.
        """
        c = self.config
        source_ids, source_mask = self._source(source_ids, source_mask)
        ids = check_ids(
            decoder_input_ids,
            "decoder_input_ids",
            c.tgt_vocab_size,
            c.context_length,
            "context_length",
        )
        if ids.shape[0] != source_ids.shape[0]:
            raise ValueError(
                f"decoder_input_ids has {ids.shape[0]} rows but source_ids has"
                f" {source_ids.shape[0]}: they must pair up"
            )
        self_mask = self._decoder_mask(ids, decoder_mask)
        memory = self.encode(source_ids, source_mask)  # (B, S, d)
        y = self.decoder.forward(ids, self_mask, memory=memory, memory_mask=source_mask)
        logits = self.output.forward(y)  # (B, T, V)
        self._save(logits.shape)
        return logits

    # ---------------------------------------------------------------- backward
    def backward(self, grad_logits: np.ndarray) -> None:
        r"""Back through decoder and encoder; add into every parameter's gradient.

        Parameters
        ----------
        grad_logits : numpy.ndarray
            :math:`\partial L / \partial z`, the shape ``(B, T, tgt_vocab_size)``
            and dtype of the last :meth:`forward`'s logits.
        """
        grad = self._checked_gradient(grad_logits)
        grad_memory = self.decoder.backward(self.output.backward(grad))  # (B, S, d)
        self.encoder.backward(grad_memory)

    # --------------------------------------------------------------- inference
    def start(
        self, source_ids: np.ndarray, *, source_mask: np.ndarray | None = None
    ) -> DecodeState:
        """Encode ``source_ids`` ``(B, S)`` once; return a state with empty decoder caches.

        ``source_mask`` is as in :meth:`forward`. A ``backward`` after ``start``
        (or :meth:`step`) is refused: run :meth:`forward` again to train.
        """
        self._cache = None
        source_ids, source_mask = self._source(source_ids, source_mask)
        with no_grad():
            memory = self.encode(source_ids, source_mask)  # (B, S, d)
        b = source_ids.shape[0]
        return DecodeState(
            self,
            batch_size=b,
            caches=self.decoder.new_caches(),
            memory=memory,
            memory_mask=None
            if source_mask is None
            else np.broadcast_to(source_mask, (b, 1, source_ids.shape[1])).copy(),
            key_mask=np.ones((b, 0), dtype=bool),
        )

    def step(self, tokens: np.ndarray, state: DecodeState) -> np.ndarray:
        """Feed the next ``n`` decoder inputs of every row; return their logits.

        Parameters
        ----------
        tokens : numpy.ndarray of int
            ``(B, n)``: decoder inputs at positions ``state.length .. state.length + n - 1``
            (the first call usually gets ``<bos>``).
        state : DecodeState
            From this model's :meth:`start`; extended in place.

        Returns
        -------
        numpy.ndarray
            Logits ``(B, n, tgt_vocab_size)``, equal (to rounding) to those
            :meth:`forward` gives at the same positions for the whole prefix.

        Raises
        ------
        ValueError
            If ``state.length + n`` exceeds ``context_length``, the batch sizes differ, or
            the state belongs to another model.
        """
        self._cache = None
        c = self.config
        tokens = check_ids(tokens, "tokens", c.tgt_vocab_size, None, "context_length")
        b, n = tokens.shape
        state = check_state(state, self, n, b)
        total = state.length + n
        key_mask = np.concatenate([state.key_mask, tokens != c.pad_id], axis=1)  # (B, total)
        if key_mask.all():
            self_mask = None if n == 1 else self._causal(n, total)
        else:
            self_mask = self._causal(n, total) & key_mask[:, None, :]  # (B, n, total)
        with no_grad():
            y = self.decoder.forward(
                tokens,
                self_mask,
                memory=state.memory,
                memory_mask=state.memory_mask,
                start=state.length,
                caches=state.caches,
            )
            logits = self.output.forward(y)  # (B, n, V)
        state.length, state.key_mask = total, key_mask
        return logits
