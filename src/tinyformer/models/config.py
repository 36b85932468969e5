"""Configurations of the three model families: every size and option in one frozen record.

Every family builds its blocks from the same options, so they live in one base
class, :class:`TransformerConfig`: widths, heads, the norm and where it sits,
the feed-forward network and its activation, biases, positions, the attention
scale, dropout, output tying and dtype. The three family configurations add
only what is theirs: vocabularies, numbers of layers, padding and embedding
sharing. :class:`~tinyformer.models.stack.TransformerStack` reads nothing else.

A configuration is checked when it is made, so a model is never half-built from
a bad one: each problem raises a :class:`ValueError` or :class:`TypeError` that
names the field. ``to_dict`` gives plain JSON-able values and ``from_dict``
reads them back, refusing unknown and missing fields by name (checkpoints store
a model's configuration this way; fields added since a checkpoint was written
take their defaults, which are what the model of that time did).

One vocabulary for every family: ``context_length`` is the longest sequence a
model takes, ``n_layers`` counts the blocks of a one-stack model and
``n_encoder_layers``/``n_decoder_layers`` those of the two stacks of an
encoder-decoder. The older name ``max_len`` of the encoder-decoder and
encoder-only configurations still works until :data:`REMOVED_IN`, with a
:class:`DeprecationWarning`; checkpoints that store it keep loading.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

import numpy as np

from tinyformer._validation import (
    describe,
    non_negative_float,
    non_negative_int,
    one_of,
    positive_float,
    positive_int,
    probability,
)
from tinyformer.feedforward import ACTIVATIONS, FEED_FORWARDS
from tinyformer.multihead import kv_heads as _kv_heads
from tinyformer.norm import NORMS
from tinyformer.positional import ROTARY_LAYOUTS, ROTARY_SCALINGS, ntk_rotary_base

__all__ = [
    "ATTENTION_SCALES",
    "DTYPES",
    "POSITIONS",
    "REMOVED_IN",
    "DecoderOnlyConfig",
    "EncoderDecoderConfig",
    "EncoderOnlyConfig",
    "TransformerConfig",
]

DTYPES = ("float32", "float64")
POSITIONS = ("learned", "sinusoidal", "rotary", "none")
"""Values of ``positional``; rotary positions rotate queries and keys of self-attention only."""
ATTENTION_SCALES = ("sqrt", "none")
REMOVED_IN = "0.2.0"
"""The release in which the deprecated configuration names stop working."""

_C = TypeVar("_C", bound=type)


def _set(config: object, name: str, value: object) -> None:
    """Store a normalized value in a frozen dataclass (only from ``__post_init__``)."""
    object.__setattr__(config, name, value)


def _check_flag(config: object, name: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {describe(value)}")


def _renamed(old: str, new: str) -> Callable[[_C], _C]:
    """Class decorator: keep ``old`` working as a deprecated alias of the field ``new``.

    ``Config(old=v)`` warns and builds ``Config(new=v)``; passing both names
    raises a :class:`ValueError`; reading ``config.old`` warns and returns
    ``config.new``. Fields, ``repr``, equality, hashing, ``to_dict`` and
    :func:`dataclasses.replace` (by the new name) know only ``new``;
    ``from_dict`` also reads ``old``, silently (see :meth:`_Serializable.from_dict`).
    """

    def decorate(cls: _C) -> _C:
        message = (
            f"{cls.__name__}: {old} is deprecated and will be removed in tinyformer"
            f" {REMOVED_IN}; use {new} instead"
        )
        init = cls.__init__

        @functools.wraps(init)
        def init_with_old_name(self: object, *args: Any, **kwargs: Any) -> None:
            if old in kwargs:
                if new in kwargs:
                    raise ValueError(
                        f"{cls.__name__} got both {old}={kwargs[old]!r} (deprecated) and"
                        f" {new}={kwargs[new]!r}: pass {new} only"
                    )
                warnings.warn(message, DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        def read_old_name(self: object) -> Any:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return getattr(self, new)

        alias = property(read_old_name, doc=f"Deprecated alias of ``{new}`` ({message}).")
        cls.__init__ = init_with_old_name  # type: ignore[misc]
        setattr(cls, old, alias)
        cls._renamed_fields = {**getattr(cls, "_renamed_fields", {}), old: new}
        return cls

    return decorate


class _Serializable:
    """``to_dict`` and ``from_dict`` for the frozen configuration dataclasses."""

    _renamed_fields: ClassVar[dict[str, str]] = {}
    """Deprecated field names and the names they became (filled in by :func:`_renamed`)."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict of ints, floats, bools and strings (JSON-able)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """Rebuild a configuration from :meth:`to_dict`'s output.

        A dict written under a field's older name (``max_len`` for
        ``context_length``, by checkpoints saved before the rename) is read
        without a warning, and will still be after :data:`REMOVED_IN`: the
        file is data the caller cannot edit, not code that uses the old name.

        Raises
        ------
        TypeError
            If ``d`` is not a mapping.
        ValueError
            If ``d`` has a field this class does not know, lacks a required one,
            or holds a value the configuration refuses.
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"d must be a mapping of field names to values, got {describe(d)}")
        d = dict(d)
        for old, new in cls._renamed_fields.items():
            if old in d:
                if new in d:
                    raise ValueError(
                        f"d holds both {old!r} (the old name) and {new!r} for {cls.__name__}:"
                        f" keep {new!r} only"
                    )
                d[new] = d.pop(old)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in d.keys() - fields.keys())
        if unknown:
            raise ValueError(
                f"unknown field(s) {unknown} for {cls.__name__}; known fields: {sorted(fields)}"
            )
        missing = sorted(
            name
            for name, f in fields.items()
            if name not in d
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
        if missing:
            raise ValueError(f"missing required field(s) {missing} for {cls.__name__}")
        return cls(**d)


@dataclass(frozen=True, kw_only=True, repr=False)
class TransformerConfig(_Serializable):
    r"""The options every family's blocks are built from, checked when made.

    Not used on its own: :class:`EncoderDecoderConfig`, :class:`DecoderOnlyConfig`
    and :class:`EncoderOnlyConfig` add their vocabularies and layer counts, and
    set the defaults of their family.

    Attributes
    ----------
    d_model, n_heads, d_ff : int
        Width, number of attention heads (dividing ``d_model``; each head has
        :math:`d_k = d_\text{model} / h` features) and feed-forward width.
    context_length : int
        Longest sequence the model reads (for an encoder-decoder: the longest
        source and the most decoder positions).
    dropout : float
        Dropout probability in ``[0, 1)``: after embedding + position, on the
        attention weights, on the feed-forward hidden layer and on each
        sub-layer's output (training mode only).
    norm_first : bool
        Pre-norm blocks with a final norm after the stack (``True``) or the
        original post-norm blocks (``False``).
    norm : str
        ``"layernorm"`` or ``"rmsnorm"`` (:data:`tinyformer.norm.NORMS`).
    norm_eps : float
        The norm's :math:`\epsilon` (PyTorch's LayerNorm default, ``1e-5``).
    feed_forward : str
        ``"plain"`` (:math:`\phi(x W_1) W_2`), ``"gated"`` (GLU: SwiGLU with
        ``activation="silu"``) or ``"moe"`` (a mixture of experts, each of width
        ``d_ff``: :class:`~tinyformer.moe.MixtureOfExperts`), from
        :data:`tinyformer.feedforward.FEED_FORWARDS`.
    activation : str
        ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"`` (the experts' too).
    n_experts : int or None
        The number of experts of every block's mixture of experts: required
        with ``feed_forward="moe"`` and ``None`` (the default) otherwise.
    experts_per_token : int
        The experts each token is routed to, :math:`k \le` ``n_experts``
        (2, as in Mixtral, by default; read only with ``feed_forward="moe"``).
    expert_feed_forward : str
        Each expert's kind, ``"gated"`` (the default) or ``"plain"``.
    expert_capacity_factor : float or None
        The experts' capacity factor :math:`c > 0` (each takes at most
        :math:`\lceil c N k / E \rceil` of the :math:`N` tokens of a forward pass);
        ``None`` (the default) drops nothing.
    router_aux_loss_weight : float
        Weight :math:`\ge 0` of each block's load-balancing loss in the training
        objective (0 by default: none).
    bias : bool
        Biases in the attention projections and the feed-forward layers.
    n_kv_heads : int or None
        Key/value heads of every attention layer: ``None`` (the default) means
        ``n_heads`` (multi-head attention); fewer, dividing ``n_heads``, is
        grouped-query attention, each key/value head shared by
        ``n_heads // n_kv_heads`` query heads; ``1`` is multi-query attention
        (see :class:`~tinyformer.multihead.MultiHeadAttention`).
    positional : str
        ``"learned"``, ``"sinusoidal"`` (even ``d_model``), ``"rotary"`` (even
        head size; rotates the queries and keys of every self-attention, adds
        nothing to the embeddings; cross-attention gets no positions) or
        ``"none"`` (no position information at all: an ablation).
    rotary_base : float
        The base of the rotary frequencies :math:`\text{base}^{-2i/d_k}` (used
        with ``positional="rotary"``): 10,000 in RoFormer, Llama 2 and Mistral 7B.
    rotary_layout : str
        Which features a rotary position rotates together: ``"adjacent"``
        (:math:`(2i, 2i+1)`, the default) or ``"halves"`` (:math:`(i, i + d_k/2)`,
        Hugging Face's layout); :func:`~tinyformer.positional.convert_rotary_layout`
        converts trained weights between them.
    rotary_scaling : str or None
        Stretch the rotary positions to a context ``rotary_scaling_factor`` times
        longer than the one trained on: ``"linear"`` (position interpolation
        :cite:p:`chen2023extending`: position :math:`p` is rotated as :math:`p/s`),
        ``"ntk"`` (NTK-aware, the base becomes :math:`\text{base}\cdot s^{d_k/(d_k-2)}`,
        see :func:`~tinyformer.positional.ntk_rotary_base`) or ``None`` (the default).
    rotary_scaling_factor : float
        The stretch :math:`s > 0`; 1.0 unless ``rotary_scaling`` is set.
    attention_scale : str
        ``"sqrt"``: every attention layer multiplies its scores by :math:`1/\sqrt{d_k}`;
        ``"none"``: by 1 (an ablation).
    tie_output : bool
        The output projection is the (target) embedding table, transposed.
    scale_embeddings : bool
        Multiply embeddings by :math:`\sqrt{d_\text{model}}`.
    dtype : str
        ``"float32"`` or ``"float64"`` (``np.float32`` and ``np.float64`` are
        accepted and stored by name).
    """

    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    context_length: int = 64
    dropout: float = 0.0
    norm_first: bool = True
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    feed_forward: str = "plain"
    activation: str = "gelu"
    n_experts: int | None = None
    experts_per_token: int = 2
    expert_feed_forward: str = "gated"
    expert_capacity_factor: float | None = None
    router_aux_loss_weight: float = 0.0
    bias: bool = True
    n_kv_heads: int | None = None
    positional: str = "learned"
    rotary_base: float = 10000.0
    rotary_layout: str = "adjacent"
    rotary_scaling: str | None = None
    rotary_scaling_factor: float = 1.0
    attention_scale: str = "sqrt"
    tie_output: bool = True
    scale_embeddings: bool = False
    dtype: str = "float64"

    _sizes: ClassVar[tuple[str, ...]] = ()
    """Positive integer fields of the family (vocabularies, layer counts)."""

    def __post_init__(self) -> None:
        """Check every field; raise naming the first bad one."""
        for name in (*self._sizes, "d_model", "n_heads", "d_ff", "context_length"):
            _set(self, name, positive_int(getattr(self, name), name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.n_kv_heads is not None:
            _set(self, "n_kv_heads", _kv_heads(self.n_kv_heads, self.n_heads))
        _set(self, "rotary_base", positive_float(self.rotary_base, "rotary_base"))
        one_of(self.rotary_layout, ROTARY_LAYOUTS, "rotary_layout")
        for name in ("norm_first", "bias", "tie_output", "scale_embeddings"):
            _check_flag(self, name)
        _set(self, "dropout", probability(self.dropout, "dropout"))
        _set(self, "norm_eps", positive_float(self.norm_eps, "norm_eps"))
        one_of(self.norm, tuple(NORMS), "norm")
        one_of(self.feed_forward, tuple(FEED_FORWARDS), "feed_forward")
        self._check_experts()
        one_of(self.activation, ACTIVATIONS, "activation")
        one_of(self.positional, POSITIONS, "positional")
        one_of(self.attention_scale, ATTENTION_SCALES, "attention_scale")
        if not isinstance(self.dtype, str):  # np.float32 or np.dtype("float32"): keep its name
            with contextlib.suppress(TypeError):
                if np.dtype(self.dtype).name in DTYPES:
                    _set(self, "dtype", np.dtype(self.dtype).name)
        one_of(self.dtype, DTYPES, "dtype")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"positional='sinusoidal' needs an even d_model (sine and cosine pairs),"
                f" got d_model={self.d_model}"
            )
        if self.positional == "rotary" and self.d_k % 2:
            raise ValueError(
                f"positional='rotary' needs an even head size d_k = d_model / n_heads, got"
                f" d_model={self.d_model} / n_heads={self.n_heads} = {self.d_k}"
            )
        self._check_rotary_scaling()

    def _check_rotary_scaling(self) -> None:
        """Check ``rotary_scaling`` and its factor."""
        factor = positive_float(self.rotary_scaling_factor, "rotary_scaling_factor")
        _set(self, "rotary_scaling_factor", factor)
        if self.rotary_scaling is None:
            if factor != 1.0:
                raise ValueError(
                    f"rotary_scaling_factor must be 1.0 when rotary_scaling is None, got {factor}"
                )
            return
        one_of(self.rotary_scaling, ROTARY_SCALINGS, "rotary_scaling")
        if self.positional != "rotary":
            raise ValueError(
                f"rotary_scaling={self.rotary_scaling!r} needs positional='rotary', got"
                f" positional={self.positional!r}"
            )
        if self.rotary_scaling == "ntk" and self.d_k < 4:
            raise ValueError(f"rotary_scaling='ntk' needs a head size d_k >= 4, got {self.d_k}")

    @property
    def rotary_interpolation(self) -> float:
        """The factor of position interpolation (``rotary_scaling_factor`` for ``"linear"``, else 1.0)."""
        return self.rotary_scaling_factor if self.rotary_scaling == "linear" else 1.0

    @property
    def rotary_frequency_base(self) -> float:
        """The base the rotary positions use (``rotary_base``, changed by NTK-aware scaling)."""
        if self.rotary_scaling == "ntk":
            return ntk_rotary_base(self.rotary_base, self.d_k, self.rotary_scaling_factor)
        return self.rotary_base

    def _check_experts(self) -> None:
        """Check the mixture-of-experts fields (``n_experts`` exactly when ``feed_forward="moe"``)."""
        moe = self.feed_forward == "moe"
        if moe and self.n_experts is None:
            raise ValueError("n_experts is required with feed_forward='moe', got None")
        if not moe and self.n_experts is not None:
            raise ValueError(
                f"n_experts must be None unless feed_forward='moe', got n_experts="
                f"{self.n_experts!r} with feed_forward={self.feed_forward!r}"
            )
        if moe:
            _set(self, "n_experts", positive_int(self.n_experts, "n_experts"))
        _set(self, "experts_per_token", positive_int(self.experts_per_token, "experts_per_token"))
        if moe and self.experts_per_token > self.n_experts:
            raise ValueError(
                f"experts_per_token must be at most n_experts={self.n_experts},"
                f" got {self.experts_per_token}"
            )
        one_of(self.expert_feed_forward, ("gated", "plain"), "expert_feed_forward")
        if self.expert_capacity_factor is not None:
            factor = positive_float(self.expert_capacity_factor, "expert_capacity_factor")
            _set(self, "expert_capacity_factor", factor)
        weight = non_negative_float(self.router_aux_loss_weight, "router_aux_loss_weight")
        _set(self, "router_aux_loss_weight", weight)

    def __repr__(self) -> str:
        """The family's own fields first (vocabularies, layers), then the shared options."""
        shared = [f.name for f in dataclasses.fields(TransformerConfig)]
        own = [f.name for f in dataclasses.fields(self) if f.name not in shared]
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in [*own, *shared])
        return f"{type(self).__name__}({shown})"

    @property
    def d_k(self) -> int:
        """The size of each head's queries, keys and values, ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads in use (``n_kv_heads``, or ``n_heads`` when it is None)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def score_scale(self) -> float | None:
        r"""The factor every attention layer applies to its scores (None means :math:`1/\sqrt{d_k}`)."""
        return None if self.attention_scale == "sqrt" else 1.0


def _pad_id(config: Any, smallest_vocabulary: int, names: str) -> None:
    """Check ``config.pad_id`` (None allowed) against the vocabulary sizes named by ``names``."""
    if config.pad_id is None:
        return
    _set(config, "pad_id", non_negative_int(config.pad_id, "pad_id"))
    if config.pad_id >= smallest_vocabulary:
        raise ValueError(f"pad_id={config.pad_id} must be below {names}")


@_renamed("max_len", "context_length")
@dataclass(frozen=True, kw_only=True, repr=False)
class EncoderDecoderConfig(TransformerConfig):
    r"""Sizes and options of an encoder-decoder transformer, checked when made.

    The configuration of an :class:`~tinyformer.models.encoder_decoder.EncoderDecoder`:
    the options of :class:`TransformerConfig` (shared by encoder and decoder) and
    the fields below. The defaults are the book's small model in the layout of
    :cite:t:`vaswani2017attention` (post-norm, ReLU, sinusoidal positions, scaled
    embeddings); their base model is ``d_model=512, n_heads=8, d_ff=2048`` with
    six layers on each side, ``share_embeddings=True``. The keyword and attribute
    ``max_len`` are a deprecated alias of ``context_length``, removed in
    :data:`REMOVED_IN`.

    Attributes
    ----------
    src_vocab_size, tgt_vocab_size : int
        Sizes of the source and target vocabularies.
    n_encoder_layers, n_decoder_layers : int
        Number of blocks in the encoder stack and in the decoder stack (two
        stacks need two names; a one-stack model's configuration says ``n_layers``).
    share_embeddings : bool
        One embedding table for source and target; needs equal vocabulary sizes.
    pad_id : int
        Padding id of source and target, below both vocabulary sizes; padded
        positions are masked out of attention by default.
    """

    src_vocab_size: int = field(kw_only=False)
    tgt_vocab_size: int = field(kw_only=False)
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    share_embeddings: bool = False
    pad_id: int = 0
    norm_first: bool = False
    activation: str = "relu"
    positional: str = "sinusoidal"
    scale_embeddings: bool = True

    _sizes = ("src_vocab_size", "tgt_vocab_size", "n_encoder_layers", "n_decoder_layers")

    def __post_init__(self) -> None:
        """Check every field; raise naming the first bad one."""
        super().__post_init__()
        _check_flag(self, "share_embeddings")
        if self.pad_id is None:
            raise TypeError("pad_id must be a non-negative integer, got None")
        _pad_id(
            self,
            min(self.src_vocab_size, self.tgt_vocab_size),
            f"both src_vocab_size={self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}",
        )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings=True needs src_vocab_size == tgt_vocab_size, got"
                f" src_vocab_size={self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )


@dataclass(frozen=True, kw_only=True, repr=False)
class DecoderOnlyConfig(TransformerConfig):
    r"""Sizes and options of a decoder-only language model, checked when made.

    The configuration of a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM`:
    the options of :class:`TransformerConfig` and the fields below. The defaults
    follow GPT-2's layout :cite:p:`radford2019language` at the book's small size:
    pre-norm blocks with a final LayerNorm, GELU, learned positions and a tied
    output projection.

    Attributes
    ----------
    vocab_size : int
        Number of tokens.
    n_layers : int
        Number of blocks in the one stack.
    """

    vocab_size: int = field(kw_only=False)
    n_layers: int = 2

    _sizes = ("vocab_size", "n_layers")


@_renamed("max_len", "context_length")
@dataclass(frozen=True, kw_only=True, repr=False)
class EncoderOnlyConfig(TransformerConfig):
    r"""Sizes and options of an encoder-only masked language model, checked when made.

    The configuration of an :class:`~tinyformer.models.encoder_only.EncoderOnlyMLM`:
    the options of :class:`TransformerConfig` and the fields below (BERT's own
    layout is post-norm with learned positions: ``norm_first=False``). The keyword
    and attribute ``max_len`` are a deprecated alias of ``context_length``,
    removed in :data:`REMOVED_IN`.

    Attributes
    ----------
    vocab_size : int
        Number of token ids, special tokens (``[MASK]``, padding) included.
    n_layers : int
        Number of blocks in the one stack.
    pad_id : int or None
        Padding id, hidden from attention by default; ``None`` for data without padding.
    """

    vocab_size: int = field(kw_only=False)
    n_layers: int = 2
    pad_id: int | None = None

    _sizes = ("vocab_size", "n_layers")

    def __post_init__(self) -> None:
        """Check every field; raise naming the first bad one."""
        super().__post_init__()
        _pad_id(self, self.vocab_size, f"vocab_size={self.vocab_size}")
