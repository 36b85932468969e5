r"""Encoder and decoder blocks: attention and feed-forward sub-layers with residuals and norms.

Each sub-layer :math:`F` is wrapped in a residual connection and a LayerNorm,
in one of two orders:

- post-norm, as in :cite:t:`vaswani2017attention`: :math:`x \leftarrow \operatorname{LN}(x + F(x))`;
- pre-norm, :math:`x \leftarrow x + F(\operatorname{LN}(x))`, which keeps an
  identity path from the output to the input and trains deep stacks without
  warm-up :cite:p:`xiong2020layer`.

In the backward pass a residual connection simply adds the gradient that
flows around the sub-layer to the one that flows through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinyformer._validation import describe, float_dtype, generator, layer_input, positive_int
from tinyformer.feedforward import FeedForward
from tinyformer.layers import Dropout
from tinyformer.module import Module
from tinyformer.multihead import KVCache, MultiHeadAttention
from tinyformer.norm import LayerNorm

__all__ = ["DecoderBlock", "DecoderCache", "EncoderBlock"]


class _Residual(Module):
    """One sub-layer with dropout, a residual connection and a LayerNorm (post or pre)."""

    def __init__(
        self, layer: Module, d_model: int, *, dropout: float, norm_first: bool, rng, dtype
    ) -> None:
        super().__init__()
        self.layer = layer
        self.norm = LayerNorm(d_model, dtype=dtype)
        self.dropout = Dropout(dropout, rng=rng)
        self.norm_first = norm_first

    def forward(self, x: np.ndarray, *args, **kwargs) -> np.ndarray:
        """``LN(x + F(x, ...))`` (post-norm) or ``x + F(LN(x), ...)`` (pre-norm)."""
        if self.norm_first:
            out = self.dropout.forward(self.layer.forward(self.norm.forward(x), *args, **kwargs))
            out += x
            return out
        out = self.dropout.forward(self.layer.forward(x, *args, **kwargs))
        out += x  # ``out`` is a fresh array: adding in place leaves x alone
        return self.norm.forward(out)

    def backward(self, grad_out: np.ndarray) -> tuple[np.ndarray, ...]:
        """Gradient for ``x`` followed by the sub-layer's other input gradients, if any."""
        if self.norm_first:
            grads = self._layer_backward(grad_out)
            grad_x = self.norm.backward(grads[0])
            grad_x += grad_out  # the identity path
            return (grad_x, *grads[1:])
        grad_sum = self.norm.backward(grad_out)
        grads = self._layer_backward(grad_sum)
        grad_x = grads[0]
        grad_x += grad_sum
        return (grad_x, *grads[1:])

    def _layer_backward(self, grad: np.ndarray) -> tuple[np.ndarray, ...]:
        grads = self.layer.backward(self.dropout.backward(grad))
        return grads if isinstance(grads, tuple) else (grads,)


def _check_common(d_model: object, n_heads: object, d_ff: object, rng: object, dtype: object):
    return (
        positive_int(d_model, "d_model"),
        positive_int(n_heads, "n_heads"),
        positive_int(d_ff, "d_ff"),
        generator(rng),
        float_dtype(dtype),
    )


class EncoderBlock(Module):
    r"""Self-attention then a feed-forward network, each with residual, dropout and LayerNorm.

    Post-norm (``norm_first=False``):

    .. math::
        h = \operatorname{LN}_1\bigl(x + \operatorname{MHA}(x)\bigr), \qquad
        y = \operatorname{LN}_2\bigl(h + \operatorname{FFN}(h)\bigr)

    Pre-norm (``norm_first=True``):

    .. math::
        h = x + \operatorname{MHA}(\operatorname{LN}_1(x)), \qquad
        y = h + \operatorname{FFN}(\operatorname{LN}_2(h))

    Parameters
    ----------
    d_model, n_heads, d_ff : int
        Width, number of heads (dividing ``d_model``) and feed-forward width.
    rng : numpy.random.Generator
        Initializes every sub-layer and drives every dropout.
    dropout : float
        Dropout probability on the attention weights, the feed-forward hidden
        layer and each sub-layer's output (as in PyTorch's encoder layer).
    norm_first : bool
        Pre-norm instead of post-norm.
    activation : str
        Feed-forward nonlinearity: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
    dtype : float32 or float64
        Dtype of parameters and accepted inputs.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        rng: np.random.Generator,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation: str = "relu",
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        d_model, n_heads, d_ff, rng, self.dtype = _check_common(d_model, n_heads, d_ff, rng, dtype)
        self.d_model, self.norm_first = d_model, bool(norm_first)
        options = {"dropout": dropout, "norm_first": self.norm_first, "rng": rng, "dtype": dtype}
        attention = MultiHeadAttention(d_model, n_heads, rng=rng, dropout=dropout, dtype=dtype)
        ffn = FeedForward(
            d_model, d_ff, rng=rng, activation=activation, dropout=dropout, dtype=dtype
        )
        self.self_attention = _Residual(attention, d_model, **options)
        self.feed_forward = _Residual(ffn, d_model, **options)

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Encode ``x`` ``(B, T, d_model)``; ``mask`` broadcasts to ``(B, T, T)``."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model, min_ndim=3)
        h = self.self_attention.forward(x, mask=mask)  # (B, T, d_model)
        self._save(x.shape)
        return self.feed_forward.forward(h)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Gradient for ``x``; adds into every parameter's gradient."""
        (shape,) = self._saved()
        grad = self._check_grad(grad_out, shape, self.dtype)
        (grad_h,) = self.feed_forward.backward(grad)
        (grad_x,) = self.self_attention.backward(grad_h)
        return grad_x


@dataclass
class DecoderCache:
    """Key/value caches of one :class:`DecoderBlock`, for step-by-step decoding.

    ``self_attention`` grows by the new positions at every step;
    ``cross_attention`` is filled from the encoder memory at the first step and
    reused at every later one.
    """

    self_attention: KVCache = field(default_factory=KVCache)
    cross_attention: KVCache = field(default_factory=KVCache)

    def __len__(self) -> int:
        """Number of decoded positions cached so far."""
        return len(self.self_attention)

    def reset(self) -> None:
        """Forget everything (start a new batch of sequences)."""
        self.self_attention.reset()
        self.cross_attention.reset()

    def truncate(self, length: int) -> None:
        """Forget decoded positions ``length`` and later; the cross-attention cache stays."""
        self.self_attention.truncate(length)

    def select(self, indices: np.ndarray) -> DecoderCache:
        """A new cache whose sequence ``i`` is a copy of sequence ``indices[i]`` of this one."""
        return DecoderCache(
            self.self_attention.select(indices), self.cross_attention.select(indices)
        )

    def copy(self) -> DecoderCache:
        """An independent copy of both caches."""
        return DecoderCache(self.self_attention.copy(), self.cross_attention.copy())


class DecoderBlock(Module):
    r"""Masked self-attention, cross-attention to the encoder memory, then a feed-forward network.

    Post-norm, with :math:`m` the memory:

    .. math::
        a = \operatorname{LN}_1(x + \operatorname{MHA}_\text{self}(x)), \quad
        b = \operatorname{LN}_2(a + \operatorname{MHA}_\text{cross}(a, m)), \quad
        y = \operatorname{LN}_3(b + \operatorname{FFN}(b)),

    and pre-norm as in :class:`EncoderBlock`. With ``cross_attention=False``
    the middle sub-layer is left out: the block of a decoder-only model.

    Parameters
    ----------
    d_model, n_heads, d_ff : int
        Width, number of heads (dividing ``d_model``) and feed-forward width.
    rng : numpy.random.Generator
        Initializes every sub-layer and drives every dropout.
    cross_attention : bool
        Include the cross-attention sub-layer.
    dropout, norm_first, activation, dtype
        As for :class:`EncoderBlock`.
    rotary : bool
        Use rotary positions in the self-attention (for decoder-only models).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        rng: np.random.Generator,
        cross_attention: bool = True,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation: str = "relu",
        rotary: bool = False,
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        d_model, n_heads, d_ff, rng, self.dtype = _check_common(d_model, n_heads, d_ff, rng, dtype)
        self.d_model, self.norm_first = d_model, bool(norm_first)
        options = {"dropout": dropout, "norm_first": self.norm_first, "rng": rng, "dtype": dtype}
        heads = {"rng": rng, "dropout": dropout, "dtype": dtype}
        masked = MultiHeadAttention(d_model, n_heads, rotary=rotary, **heads)
        self.self_attention = _Residual(masked, d_model, **options)
        self.cross_attention = (
            _Residual(MultiHeadAttention(d_model, n_heads, **heads), d_model, **options)
            if cross_attention
            else None
        )
        ffn = FeedForward(
            d_model, d_ff, rng=rng, activation=activation, dropout=dropout, dtype=dtype
        )
        self.feed_forward = _Residual(ffn, d_model, **options)

    def new_cache(self) -> DecoderCache:
        """An empty cache for decoding with this block."""
        return DecoderCache()

    def _check_memory(self, memory: object) -> np.ndarray | None:
        if self.cross_attention is None:
            if memory is not None:
                raise ValueError(
                    "memory must be None: this block was built with cross_attention=False"
                )
            return None
        if memory is None:
            raise ValueError(
                "memory (the encoder output, (B, T_src, d_model)) is required:"
                " this block has cross-attention"
            )
        return layer_input(memory, "memory", self.dtype, last_dim=self.d_model, min_ndim=3)

    def forward(
        self,
        x: np.ndarray,
        memory: np.ndarray | None = None,
        self_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        cache: DecoderCache | None = None,
    ) -> np.ndarray:
        """Decode ``x`` ``(B, T, d_model)`` against ``memory`` ``(B, T_src, d_model)``.

        Parameters
        ----------
        x : numpy.ndarray
            The target-side input, ``(B, T, d_model)``.
        memory : numpy.ndarray, optional
            Encoder output; required with cross-attention, refused without it.
        self_mask : numpy.ndarray of bool, optional
            Broadcasts to ``(B, T, T_cached + T)``, e.g. ``causal_mask(T)``; with a
            cache and one new position per step no mask is needed.
        memory_mask : numpy.ndarray of bool, optional
            Broadcasts to ``(B, T, T_src)``, e.g. a padding mask of the source.
        cache : DecoderCache, optional
            Inference only (no backward afterwards).

        Returns
        -------
        numpy.ndarray
            ``(B, T, d_model)``.
        """
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model, min_ndim=3)
        memory = self._check_memory(memory)
        if cache is not None and not isinstance(cache, DecoderCache):
            raise TypeError(f"cache must be a DecoderCache or None, got {describe(cache)}")
        self_cache = None if cache is None else cache.self_attention
        h = self.self_attention.forward(x, mask=self_mask, cache=self_cache)
        if self.cross_attention is not None:
            cross_cache = None if cache is None else cache.cross_attention
            h = self.cross_attention.forward(h, memory, mask=memory_mask, cache=cross_cache)
        self._save(x.shape)
        return self.feed_forward.forward(h)

    def backward(self, grad_out: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """``grad_x``, or ``(grad_x, grad_memory)`` when the block has cross-attention."""
        (shape,) = self._saved()
        grad = self._check_grad(grad_out, shape, self.dtype)
        (grad_h,) = self.feed_forward.backward(grad)
        if self.cross_attention is None:
            (grad_x,) = self.self_attention.backward(grad_h)
            return grad_x
        grad_h, grad_memory = self.cross_attention.backward(grad_h)
        (grad_x,) = self.self_attention.backward(grad_h)
        return grad_x, grad_memory
