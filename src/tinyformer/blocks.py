r"""The transformer block, assembled from named parts, and the residual sub-layer around each part.

One block serves every family. It is self-attention, optionally
cross-attention to an encoder's output, and a feed-forward network, each part
wrapped in a residual connection with a norm, in one of two orders:

- post-norm, as in :cite:t:`vaswani2017attention`: :math:`x \leftarrow \operatorname{N}(x + F(x))`;
- pre-norm, :math:`x \leftarrow x + F(\operatorname{N}(x))`, which keeps an
  identity path from the output to the input and trains deep stacks without
  warm-up :cite:p:`xiong2020layer`.

An encoder block is this block without cross-attention, attending with a
padding mask; a GPT-style decoder block is the same block with a causal mask;
the decoder block of an encoder-decoder adds cross-attention. The norm is a
name from :data:`~tinyformer.norm.NORMS` (LayerNorm, RMSNorm) and the
feed-forward network a name from :data:`~tinyformer.feedforward.FEED_FORWARDS`
(plain, gated). In the backward pass a residual connection simply adds the
gradient that flows around the sub-layer to the one that flows through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinyformer._validation import describe, float_dtype, generator, layer_input, positive_int
from tinyformer.feedforward import make_feed_forward
from tinyformer.layers import Dropout
from tinyformer.module import Module
from tinyformer.multihead import KVCache, MultiHeadAttention, _merge_heads, _split_heads
from tinyformer.norm import make_norm

__all__ = ["BlockCache", "Residual", "TransformerBlock", "trace_block"]


class Residual(Module):
    """One sub-layer with dropout, a residual connection and a norm (post or pre).

    Parameters
    ----------
    layer : Module
        The sub-layer :math:`F`: attention or a feed-forward network.
    norm : Module
        Its norm (a :class:`~tinyformer.norm.LayerNorm` or :class:`~tinyformer.norm.RMSNorm`).
    dropout : Dropout
        Dropout on the sub-layer's output.
    norm_first : bool
        Pre-norm (``x + F(N(x))``) instead of post-norm (``N(x + F(x))``).
    """

    def __init__(self, layer: Module, norm: Module, dropout: Dropout, *, norm_first: bool) -> None:
        super().__init__()
        self.layer = layer
        self.norm = norm
        self.dropout = dropout
        self.norm_first = bool(norm_first)

    def forward(self, x: np.ndarray, *args, **kwargs) -> np.ndarray:
        """``N(x + F(x, ...))`` (post-norm) or ``x + F(N(x), ...)`` (pre-norm)."""
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


@dataclass
class BlockCache:
    """Key/value caches of one :class:`TransformerBlock`, for step-by-step decoding.

    ``self_attention`` grows by the new positions at every step;
    ``cross_attention`` (used only by a block with cross-attention) is filled
    from the encoder memory at the first step and reused at every later one.
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

    def select(self, indices: np.ndarray) -> BlockCache:
        """A new cache whose sequence ``i`` is a copy of sequence ``indices[i]`` of this one."""
        return BlockCache(
            self.self_attention.select(indices), self.cross_attention.select(indices)
        )

    def copy(self) -> BlockCache:
        """An independent copy of both caches."""
        return BlockCache(self.self_attention.copy(), self.cross_attention.copy())


class TransformerBlock(Module):
    r"""Self-attention, optional cross-attention and a feed-forward network, each a :class:`Residual`.

    Post-norm, with :math:`\operatorname{N}` the norm and :math:`m` the memory:

    .. math::
        a = \operatorname{N}_1(x + \operatorname{MHA}_\text{self}(x)), \quad
        b = \operatorname{N}_2(a + \operatorname{MHA}_\text{cross}(a, m)), \quad
        y = \operatorname{N}_3(b + \operatorname{FFN}(b)),

    pre-norm

    .. math::
        a = x + \operatorname{MHA}_\text{self}(\operatorname{N}_1(x)), \quad
        b = a + \operatorname{MHA}_\text{cross}(\operatorname{N}_2(a), m), \quad
        y = b + \operatorname{FFN}(\operatorname{N}_3(b)),

    and without cross-attention the middle sub-layer is left out (:math:`b = a`).

    Parameters
    ----------
    d_model, n_heads, d_ff : int
        Width, number of heads (dividing ``d_model``) and feed-forward width.
    rng : numpy.random.Generator
        Initializes every sub-layer (self-attention, cross-attention, feed-forward,
        in that order) and drives every dropout.
    cross_attention : bool
        Include the cross-attention sub-layer (the decoder of an encoder-decoder).
    dropout : float
        Dropout probability on the attention weights, the feed-forward hidden
        layer and each sub-layer's output (as in PyTorch's transformer layers).
    norm_first : bool
        Pre-norm instead of post-norm.
    norm : str
        ``"layernorm"`` or ``"rmsnorm"``; ``norm_eps`` is its :math:`\epsilon`.
    feed_forward : str
        ``"plain"``, ``"gated"`` or ``"moe"`` (see :data:`~tinyformer.feedforward.FEED_FORWARDS`).
    activation : str
        Feed-forward nonlinearity: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
    bias : bool
        Biases in the attention projections and the feed-forward layers.
    rotary : bool
        Rotary positions in the self-attention.
    rotary_base : float
        The rotary frequency base.
    rotary_layout : str
        ``"adjacent"`` or ``"halves"``: the features rotated together.
    rotary_interpolation : float
        Position interpolation's factor (1.0: none), as in
        :class:`~tinyformer.multihead.MultiHeadAttention`.
    scale : float, optional
        The attention scores' factor in every attention sub-layer; ``None``
        means :math:`1/\sqrt{d_k}`.
    n_kv_heads : int, optional
        Key/value heads of every attention sub-layer (grouped-query attention);
        ``None`` means ``n_heads``.
    n_experts : int, optional
        With ``feed_forward="moe"`` (and only then, where it is required): the
        number of experts of the :class:`~tinyformer.moe.MixtureOfExperts`, each
        of width ``d_ff``.
    experts_per_token : int
        The experts each token is routed to (``top_k``), at most ``n_experts``.
    expert_feed_forward : str
        The kind of each expert, ``"gated"`` or ``"plain"``.
    expert_capacity_factor : float, optional
        The experts' capacity factor; ``None`` drops nothing.
    router_aux_loss_weight : float
        Weight of the load-balancing loss whose gradient the layer's backward pass adds.
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
        cross_attention: bool = False,
        dropout: float = 0.0,
        norm_first: bool = False,
        norm: str = "layernorm",
        norm_eps: float = 1e-5,
        feed_forward: str = "plain",
        activation: str = "relu",
        bias: bool = True,
        rotary: bool = False,
        rotary_base: float = 10000.0,
        rotary_layout: str = "adjacent",
        rotary_interpolation: float = 1.0,
        scale: float | None = None,
        n_kv_heads: int | None = None,
        n_experts: int | None = None,
        experts_per_token: int = 2,
        expert_feed_forward: str = "gated",
        expert_capacity_factor: float | None = None,
        router_aux_loss_weight: float = 0.0,
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        self.d_model = positive_int(d_model, "d_model")
        positive_int(d_ff, "d_ff")
        rng, self.dtype = generator(rng), float_dtype(dtype)
        self.norm_first = bool(norm_first)
        heads = {
            "rng": rng,
            "dropout": dropout,
            "bias": bias,
            "scale": scale,
            "n_kv_heads": n_kv_heads,
            "dtype": dtype,
        }

        def residual(layer: Module) -> Residual:
            norm_layer = make_norm(norm, self.d_model, eps=norm_eps, dtype=dtype)
            return Residual(layer, norm_layer, Dropout(dropout, rng=rng), norm_first=norm_first)

        rotation = {
            "rotary": rotary,
            "rotary_base": rotary_base,
            "rotary_layout": rotary_layout,
            "rotary_interpolation": rotary_interpolation,
        }
        attention = MultiHeadAttention(self.d_model, n_heads, **rotation, **heads)
        self.self_attention = residual(attention)
        self.cross_attention = (
            residual(MultiHeadAttention(self.d_model, n_heads, **heads))
            if cross_attention
            else None
        )
        experts = {}  # the further options of a mixture of experts
        if feed_forward == "moe":
            experts = {
                "n_experts": n_experts,
                "top_k": experts_per_token,
                "feed_forward": expert_feed_forward,
                "capacity_factor": expert_capacity_factor,
                "aux_loss_weight": router_aux_loss_weight,
            }
        elif n_experts is not None:
            raise ValueError(
                f"n_experts must be None unless feed_forward='moe', got n_experts={n_experts!r}"
                f" with feed_forward={feed_forward!r}"
            )
        ffn = make_feed_forward(
            feed_forward,
            self.d_model,
            d_ff,
            rng=rng,
            activation=activation,
            dropout=dropout,
            bias=bias,
            dtype=dtype,
            **experts,
        )
        self.feed_forward = residual(ffn)

    def new_cache(self) -> BlockCache:
        """An empty cache for decoding with this block."""
        return BlockCache()

    def _check_memory(self, memory: object) -> np.ndarray | None:
        if self.cross_attention is None:
            if memory is not None:
                raise ValueError("memory must be None: this block has no cross-attention")
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
        *,
        mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        cache: BlockCache | None = None,
    ) -> np.ndarray:
        """Run the block on ``x`` ``(B, T, d_model)``.

        Parameters
        ----------
        x : numpy.ndarray
            The input, ``(B, T, d_model)``.
        memory : numpy.ndarray, optional
            Encoder output ``(B, T_src, d_model)``; required with cross-attention,
            refused without it.
        mask : numpy.ndarray of bool, optional
            The self-attention mask, broadcastable to ``(B, T, T_cached + T)``:
            a padding mask for an encoder, ``causal_mask(T)`` for a decoder.
            With a cache and one new position per step no mask is needed.
        memory_mask : numpy.ndarray of bool, optional
            Broadcasts to ``(B, T, T_src)``, e.g. a padding mask of the source.
        cache : BlockCache, optional
            For decoding (no backward afterwards).

        Returns
        -------
        numpy.ndarray
            ``(B, T, d_model)``.
        """
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model, min_ndim=3)
        memory = self._check_memory(memory)
        if cache is not None and not isinstance(cache, BlockCache):
            raise TypeError(f"cache must be a BlockCache or None, got {describe(cache)}")
        # block-forward-begin
        self_cache = None if cache is None else cache.self_attention
        h = self.self_attention.forward(x, mask=mask, cache=self_cache)  # (B, T, d)
        if self.cross_attention is not None:
            cross_cache = None if cache is None else cache.cross_attention
            h = self.cross_attention.forward(h, memory, mask=memory_mask, cache=cross_cache)
        y = self.feed_forward.forward(h)  # (B, T, d)
        # block-forward-end
        self._save(x.shape)
        return y

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


def trace_block(
    block: TransformerBlock, x: np.ndarray, mask: np.ndarray | None = None
) -> list[tuple[str, np.ndarray]]:
    """Run a block without cross-attention on ``x`` ``(B, T, d_model)``; return every intermediate.

    Each entry is ``(name, array)``, in the order the block computes them,
    each made by the block's own parts (its projections, attention, norms and
    feed-forward layers); the last is the block's output, equal to
    ``block.forward(x, mask=mask)``. Dropout is left out, so the block must be in
    evaluation mode or have no dropout.
    """
    if not isinstance(block, TransformerBlock):
        raise TypeError(f"block must be a TransformerBlock, got {describe(block)}")
    if block.cross_attention is not None:
        raise ValueError("block has cross-attention: trace_block follows blocks without it")
    if not hasattr(block.feed_forward.layer, "linear_in"):
        raise ValueError(
            "block has a mixture of experts: trace_block follows a plain or gated feed-forward"
        )
    if block.training and any(getattr(m, "p", 0) > 0 for m in block.modules()):
        raise ValueError("block has dropout and is in training mode: call block.eval() first")
    steps: list[tuple[str, np.ndarray]] = [("input x", x)]
    attention, ffn = block.self_attention, block.feed_forward
    mha = attention.layer
    z = attention.norm.forward(x) if block.norm_first else x
    if block.norm_first:
        steps.append(("norm 1", z))
    q = _split_heads(mha.q_proj.forward(z), mha.n_heads)  # (B, h, T, d_k)
    k = _split_heads(mha.k_proj.forward(z), mha.n_kv_heads)  # (B, h_kv, T, d_k)
    v = _split_heads(mha.v_proj.forward(z), mha.n_kv_heads)
    steps += [("queries Q, heads split", q), ("keys K", k), ("values V", v)]
    out = mha.forward(z, mask=mask)  # (B, T, d)
    weights = mha.attention_weights  # (B, h, T, T)
    if mha.group > 1:  # for display: each key/value head beside each query head of its group
        v = np.repeat(v, mha.group, axis=1)  # (B, h, T, d_k)
    heads = weights @ v  # (B, h, T, d_k)
    steps += [("attention weights", weights), ("heads: weights @ V", heads)]
    steps += [("heads concatenated", _merge_heads(heads)), ("output projection W_O", out)]
    h = x + out  # (B, T, d)
    steps.append(("residual x + attention", h))
    if not block.norm_first:
        h = attention.norm.forward(h)
        steps.append(("norm 1", h))
    z = ffn.norm.forward(h) if block.norm_first else h
    if block.norm_first:
        steps.append(("norm 2", z))
    steps.append(("FFN first linear", ffn.layer.linear_in.forward(z)))  # (B, T, d_ff)
    f = ffn.layer.forward(z)  # (B, T, d)
    steps += [("FFN output", f), ("residual + FFN", h + f)]
    if not block.norm_first:
        steps.append(("norm 2", ffn.norm.forward(h + f)))
    return steps
