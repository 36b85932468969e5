"""Configurations of the two model families: every size and option in one frozen record.

A configuration is checked when it is made, so a model is never half-built from
a bad one: each problem raises a :class:`ValueError` or :class:`TypeError` that
names the field. ``to_dict`` gives plain JSON-able values and ``from_dict``
reads them back, refusing unknown and missing fields by name (checkpoints store
a model's configuration this way).

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
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

import numpy as np

from tinyformer._validation import (
    describe,
    non_negative_int,
    one_of,
    positive_int,
    probability,
)
from tinyformer.feedforward import ACTIVATIONS

__all__ = [
    "ATTENTION_SCALES",
    "DTYPES",
    "REMOVED_IN",
    "DecoderOnlyConfig",
    "EncoderDecoderConfig",
]

DTYPES = ("float32", "float64")
ENCODER_DECODER_POSITIONS = ("sinusoidal", "learned", "none")
DECODER_ONLY_POSITIONS = ("learned", "sinusoidal", "rotary", "none")
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


def _check_common(config: Any, positions: tuple[str, ...]) -> None:
    """The fields both families share: sizes, heads, dropout and the option strings."""
    for name in ("d_model", "n_heads", "d_ff"):
        _set(config, name, positive_int(getattr(config, name), name))
    if config.d_model % config.n_heads:
        raise ValueError(f"d_model={config.d_model} must be divisible by n_heads={config.n_heads}")
    _set(config, "dropout", probability(config.dropout, "dropout"))
    one_of(config.activation, ACTIVATIONS, "activation")
    one_of(config.positional, positions, "positional")
    if not isinstance(config.dtype, str):  # np.float32 or np.dtype("float32"): keep its name
        with contextlib.suppress(TypeError):
            if np.dtype(config.dtype).name in DTYPES:
                _set(config, "dtype", np.dtype(config.dtype).name)
    one_of(config.dtype, DTYPES, "dtype")
    if config.positional == "sinusoidal" and config.d_model % 2:
        raise ValueError(
            f"positional='sinusoidal' needs an even d_model (sine and cosine pairs),"
            f" got d_model={config.d_model}"
        )
    head_size = config.d_model // config.n_heads
    if config.positional == "rotary" and head_size % 2:
        raise ValueError(
            f"positional='rotary' needs an even head size d_model / n_heads, got"
            f" d_model={config.d_model} / n_heads={config.n_heads} = {head_size}"
        )


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


@_renamed("max_len", "context_length")
@dataclass(frozen=True)
class EncoderDecoderConfig(_Serializable):
    r"""Sizes and options of an encoder-decoder transformer, checked when made.

    The configuration of an :class:`~tinyformer.models.encoder_decoder.EncoderDecoder`.
    The defaults are the book's small model; :cite:t:`vaswani2017attention`'s
    base model is ``d_model=512, n_heads=8, d_ff=2048`` with six layers on each
    side, ``share_embeddings=True``.

    Attributes
    ----------
    src_vocab_size, tgt_vocab_size : int
        Sizes of the source and target vocabularies.
    d_model, n_heads, d_ff : int
        Width, number of attention heads (dividing ``d_model``) and feed-forward width.
    n_encoder_layers, n_decoder_layers : int
        Number of blocks in the encoder stack and in the decoder stack (two
        stacks need two names; a one-stack model's configuration says ``n_layers``).
    context_length : int
        Longest source and longest decoder input the model accepts (the name
        :class:`DecoderOnlyConfig` uses). The keyword and attribute ``max_len``
        are a deprecated alias, removed in :data:`REMOVED_IN`.
    dropout : float
        Dropout probability in ``[0, 1)`` after embedding + position and inside every block.
    norm_first : bool
        Pre-norm blocks, with a final LayerNorm on the encoder output and on the
        decoder output; ``False`` is the original post-norm.
    activation : str
        Feed-forward nonlinearity: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
    positional : str
        ``"sinusoidal"`` (fixed, needs an even ``d_model``), ``"learned"``
        (one table for the encoder and one for the decoder, ``context_length`` rows each)
        or ``"none"`` (no position information at all: an ablation).
    attention_scale : str
        ``"sqrt"``: every attention layer multiplies its scores by :math:`1/\sqrt{d_k}`;
        ``"none"``: by 1 (an ablation).
    share_embeddings : bool
        One embedding table for source and target; needs equal vocabulary sizes.
    tie_output : bool
        The output projection is the target embedding table, transposed.
    scale_embeddings : bool
        Multiply embeddings by :math:`\sqrt{d_\text{model}}`.
    pad_id : int
        Padding id of source and target, below both vocabulary sizes; padded
        positions are masked out of attention by default.
    dtype : str
        ``"float32"`` or ``"float64"`` (``np.float32`` and ``np.float64`` are
        accepted and stored by name).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    context_length: int = 64
    dropout: float = 0.0
    norm_first: bool = False
    activation: str = "relu"
    positional: str = "sinusoidal"
    attention_scale: str = "sqrt"
    share_embeddings: bool = False
    tie_output: bool = True
    scale_embeddings: bool = True
    pad_id: int = 0
    dtype: str = "float64"

    def __post_init__(self) -> None:
        """Check every field; raise naming the first bad one."""
        for name in ("src_vocab_size", "tgt_vocab_size", "n_encoder_layers", "n_decoder_layers"):
            _set(self, name, positive_int(getattr(self, name), name))
        _set(self, "context_length", positive_int(self.context_length, "context_length"))
        for name in ("norm_first", "share_embeddings", "tie_output", "scale_embeddings"):
            _check_flag(self, name)
        _check_common(self, ENCODER_DECODER_POSITIONS)
        one_of(self.attention_scale, ATTENTION_SCALES, "attention_scale")
        _set(self, "pad_id", non_negative_int(self.pad_id, "pad_id"))
        smallest = min(self.src_vocab_size, self.tgt_vocab_size)
        if self.pad_id >= smallest:
            raise ValueError(
                f"pad_id={self.pad_id} must be below both src_vocab_size={self.src_vocab_size}"
                f" and tgt_vocab_size={self.tgt_vocab_size}"
            )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings=True needs src_vocab_size == tgt_vocab_size, got"
                f" src_vocab_size={self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )


@dataclass(frozen=True)
class DecoderOnlyConfig(_Serializable):
    r"""Sizes and options of a decoder-only language model, checked when made.

    The configuration of a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM`.
    The defaults follow GPT-2's layout :cite:p:`radford2019language` at the book's
    small size: pre-norm blocks with a final LayerNorm, GELU, learned positions
    and a tied output projection.

    Attributes
    ----------
    vocab_size : int
        Number of tokens.
    d_model, n_heads, d_ff, n_layers : int
        Width, heads (dividing ``d_model``), feed-forward width and number of
        blocks in the one stack.
    context_length : int
        Longest sequence the model reads (the size of the learned position table).
    dropout : float
        Dropout probability in ``[0, 1)``.
    norm_first : bool
        Pre-norm blocks with a final LayerNorm (``True``) or post-norm blocks.
    activation : str
        ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
    positional : str
        ``"learned"``, ``"sinusoidal"`` (even ``d_model``), ``"rotary"`` (even
        head size ``d_model / n_heads``; rotates queries and keys, adds nothing to
        the embeddings) or ``"none"`` (no position information: an ablation).
    tie_output : bool
        The output projection is the embedding table, transposed.
    scale_embeddings : bool
        Multiply embeddings by :math:`\sqrt{d_\text{model}}`.
    dtype : str
        ``"float32"`` or ``"float64"`` (``np.float32`` and ``np.float64`` are
        accepted and stored by name).
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
    dtype: str = "float64"

    def __post_init__(self) -> None:
        """Check every field; raise naming the first bad one."""
        for name in ("vocab_size", "n_layers", "context_length"):
            _set(self, name, positive_int(getattr(self, name), name))
        for name in ("norm_first", "tie_output", "scale_embeddings"):
            _check_flag(self, name)
        _check_common(self, DECODER_ONLY_POSITIONS)
