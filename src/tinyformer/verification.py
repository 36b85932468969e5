"""Gradient checks of every layer of the package, gathered into one table.

:func:`module_classes` walks the whole package and returns every public
:class:`~tinyformer.module.Module` subclass; :data:`RECIPES` says, for each of
them, how to build a small float64 instance and its inputs. :func:`gradient_check_table`
runs :mod:`tinyformer.gradcheck` on every input and every parameter of every
recipe and returns one row per gradient. A class without a recipe is an error,
so a layer added to the package later cannot be skipped silently.

Inputs that are integers (token ids) have no gradient: for the embedding and
the whole models only the parameters are checked, the models through the
cross-entropy of their logits (padding ignored).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tinyformer
from tinyformer._validation import non_negative_int
from tinyformer.blocks import Residual, TransformerBlock
from tinyformer.feedforward import FeedForward
from tinyformer.gradcheck import check_module_gradients, check_parameter_gradients
from tinyformer.layers import Dropout, Embedding, Linear, TiedOutputProjection
from tinyformer.lora import LoRALinear
from tinyformer.losses import cross_entropy
from tinyformer.masks import causal_mask, padding_mask
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    EncoderOnlyMLM,
    TransformerStack,
)
from tinyformer.module import Module
from tinyformer.moe import MixtureOfExperts
from tinyformer.multihead import MultiHeadAttention
from tinyformer.norm import BatchNorm, LayerNorm, RMSNorm
from tinyformer.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
)
from tinyformer.quantization import QuantizedLinear
from tinyformer.recompute import Checkpointed
from tinyformer.rnn import ElmanRNN

__all__ = [
    "RECIPES",
    "GradientCheck",
    "GradientCheckRow",
    "gradient_check_table",
    "missing_recipes",
    "module_classes",
    "run_check",
]

# Small sizes: every check runs in well under a second.
B, T, D, HEADS, D_FF, VOCAB = 2, 3, 4, 2, 6, 7


@dataclass
class GradientCheck:
    """One small float64 instance of a module and what to feed it.

    Attributes
    ----------
    label : str
        The class name and, when a class has several cases, what this one exercises.
    module : Module
        The instance, with its parameters moved away from their initial values.
    inputs : tuple of numpy.ndarray
        The differentiated positional inputs of ``forward``.
    input_names : tuple of str
        Their names, in the same order.
    kwargs : dict
        Further ``forward`` arguments that are not differentiated (masks).
    before_forward : callable, optional
        Called before every forward (resets a dropout generator).
    run : callable, optional
        For parameter-only checks: runs the forward pass and returns the loss
        and its gradient with respect to the output
        (see :func:`~tinyformer.gradcheck.check_parameter_gradients`).
    note : str
        Why some gradient is not checked, if any is not.
    """

    label: str
    module: Module
    inputs: tuple[np.ndarray, ...] = ()
    input_names: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    before_forward: Callable[[], None] | None = None
    run: Callable[[], tuple[Any, np.ndarray]] | None = None
    note: str = ""


@dataclass(frozen=True)
class GradientCheckRow:
    """The result of one gradient check: one input or one parameter of one module."""

    module: str
    gradient: str
    kind: str  # "input" or "parameter"
    size: int
    max_relative_error: float
    note: str = ""


def module_classes() -> list[type[Module]]:
    """Every public ``Module`` subclass defined anywhere in the package, sorted by name."""
    found: dict[str, type[Module]] = {}
    for info in pkgutil.walk_packages(tinyformer.__path__, "tinyformer."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Module)
                and obj is not Module
                and obj.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}.{name}"] = obj
    return sorted(found.values(), key=lambda cls: (cls.__name__, cls.__module__))


def _jitter(module: Module, rng: np.random.Generator, scale: float = 0.3) -> Module:
    """Move every parameter off its initial value (gains of one and biases of zero are special).

    Whole models take ``scale=0.1``: through their stacks a jitter of 0.3 can land where the
    loss curves faster than a finite difference of step 1e-4 resolves (seed 0 put the
    encoder-only model there: relative error 1.1e-5 at that step, 1.1e-7 at 1e-5).
    """
    for p in module.parameters():
        p.value += scale * rng.standard_normal(p.shape)
    return module


def _x(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """A standard-normal float64 input of the given shape."""
    return rng.standard_normal(shape)


def _with_upstream(module: Module, ids: Mapping[str, np.ndarray], rng: np.random.Generator):
    """A ``run`` for a module with integer inputs: the loss is ``sum(output * upstream)``."""
    upstream = rng.standard_normal(module.forward(**ids).shape)

    def run() -> tuple[np.ndarray, np.ndarray]:
        return module.forward(**ids) * upstream, upstream

    return run


def _linear(rng):
    layer = _jitter(Linear(3, 5, rng=rng), rng)  # not square: a missing transpose cannot hide
    return [GradientCheck("Linear", layer, (_x(rng, B, T, 3),), ("x",))]


def _embedding(rng):
    layer = Embedding(VOCAB, D, rng=rng, scale_by_sqrt_d=True)
    ids = np.array([[1, 4, 1], [6, 0, 4]])  # repeated ids: their gradients add up
    return [
        GradientCheck(
            "Embedding",
            layer,
            run=_with_upstream(layer, {"ids": ids}, rng),
            note="token ids are integers: parameters only",
        )
    ]


def _tied(rng):
    layer = _jitter(TiedOutputProjection(Embedding(VOCAB, D, rng=rng), bias=True), rng)
    return [GradientCheck("TiedOutputProjection", layer, (_x(rng, B, T, D),), ("x",))]


def _dropout(rng):
    layer = Dropout(0.3, rng=rng)

    def same_mask() -> None:
        layer.rng = np.random.default_rng(7)

    return [
        GradientCheck(
            "Dropout (training)", layer, (_x(rng, B, T, D),), ("x",), before_forward=same_mask
        )
    ]


def _norm(cls):
    def recipe(rng):
        return [GradientCheck(cls.__name__, _jitter(cls(5), rng), (_x(rng, B, T, 5),), ("x",))]

    return recipe


def _sinusoidal(rng):
    layer = SinusoidalPositionalEncoding(D, context_length=8)
    return [GradientCheck("SinusoidalPositionalEncoding", layer, (_x(rng, B, T, D),), ("x",))]


def _learned(rng):
    layer = _jitter(LearnedPositionalEmbedding(8, D, rng=rng), rng)
    return [
        GradientCheck(
            "LearnedPositionalEmbedding", layer, (_x(rng, B, T, D),), ("x",), kwargs={"start": 2}
        )
    ]


def _rotary(rng):
    layer = RotaryEmbedding(D)
    return [
        GradientCheck("RotaryEmbedding", layer, (_x(rng, B, T, D),), ("x",), kwargs={"start": 2})
    ]


def _rnn(rng):
    layer = _jitter(ElmanRNN(3, D, rng=rng), rng)
    return [GradientCheck("ElmanRNN", layer, (_x(rng, B, T, 3), _x(rng, B, D)), ("x", "h0"))]


def _feed_forward(rng):
    plain = _jitter(FeedForward(D, D_FF, rng=rng, activation="gelu"), rng)
    gated = _jitter(FeedForward(D, D_FF, rng=rng, activation="silu", gated=True), rng)
    return [
        GradientCheck("FeedForward (GELU)", plain, (_x(rng, B, T, D),), ("x",)),
        GradientCheck("FeedForward (SwiGLU)", gated, (_x(rng, B, T, D),), ("x",)),
    ]


def _quantized(rng):
    layer = QuantizedLinear.from_linear(_jitter(Linear(3, 5, rng=rng), rng))
    return [
        GradientCheck(
            "QuantizedLinear",
            layer,
            (_x(rng, B, T, 3),),
            ("x",),
            note="the int8 weight is frozen: only the bias is a parameter",
        )
    ]


def _padding(lengths: tuple[int, ...], t: int) -> np.ndarray:
    """A ``(B, 1, t)`` mask hiding the positions at and after each length."""
    ids = np.array([[1] * n + [0] * (t - n) for n in lengths])
    return padding_mask(ids, 0)


def _attention(rng):
    causal = causal_mask(T)
    self_layer = _jitter(MultiHeadAttention(D, HEADS, rng=rng), rng)
    cross_layer = _jitter(MultiHeadAttention(D, HEADS, rng=rng), rng)
    rotary_layer = _jitter(MultiHeadAttention(D, HEADS, rng=rng, rotary=True), rng)
    x, memory = _x(rng, B, T, D), _x(rng, B, 4, D)
    return [
        GradientCheck(
            "MultiHeadAttention (self, causal)",
            self_layer,
            (x,),
            ("x",),
            kwargs={"mask": causal},
        ),
        GradientCheck(
            "MultiHeadAttention (cross, padded)",
            cross_layer,
            (x, memory),
            ("x", "context"),
            kwargs={"mask": _padding((4, 2), 4)},
        ),
        GradientCheck(
            "MultiHeadAttention (rotary, causal)",
            rotary_layer,
            (x,),
            ("x",),
            kwargs={"mask": causal},
        ),
        GradientCheck(
            "MultiHeadAttention (one key/value head, causal)",
            _jitter(MultiHeadAttention(D, HEADS, rng=rng, n_kv_heads=1, rotary=True), rng),
            (x,),
            ("x",),
            kwargs={"mask": causal},
            note="grouped-query attention: the key and value heads are shared by every query head",
        ),
    ]


def _lora(rng):
    layer = LoRALinear(_jitter(Linear(3, 5, rng=rng), rng), 2, alpha=4.0, rng=rng)
    layer.lora_B.value += rng.standard_normal(layer.lora_B.shape)  # zero B would hide A's gradient
    return [
        GradientCheck(
            "LoRALinear",
            layer,
            (_x(rng, B, T, 3),),
            ("x",),
            note="the base weight and bias are frozen: only the adapters are parameters here",
        )
    ]


def _mixture_of_experts(rng):
    layer = _jitter(
        MixtureOfExperts(D, D_FF, 4, top_k=2, rng=rng, activation="silu", bias=True), rng
    )
    x = _x(rng, B, T, D)
    logits = np.sort(x.reshape(-1, D) @ layer.router.weight.value, axis=-1)  # (tokens, experts)
    # a finite-difference step must not change which experts are chosen: a wide gap between
    # the second and third router logit of every token keeps the choice fixed
    if (logits[:, -2] - logits[:, -3]).min() < 1e-2:
        raise ValueError("the drawn router has a near tie: choose inputs with a wider gap")
    return [
        GradientCheck(
            "MixtureOfExperts (top 2 of 4, gated)",
            layer,
            (x,),
            ("x",),
            note="the choice of experts is piecewise constant: checked away from ties",
        )
    ]


def _block(rng):
    post = _jitter(TransformerBlock(D, HEADS, D_FF, rng=rng), rng)
    pre = _jitter(
        TransformerBlock(D, HEADS, D_FF, rng=rng, norm_first=True, activation="gelu"), rng
    )
    modern = _jitter(
        TransformerBlock(
            D,
            HEADS,
            D_FF,
            rng=rng,
            norm_first=True,
            norm="rmsnorm",
            feed_forward="gated",
            activation="silu",
            bias=False,
            rotary=True,
        ),
        rng,
    )
    cross = _jitter(TransformerBlock(D, HEADS, D_FF, rng=rng, cross_attention=True), rng)
    x, memory = _x(rng, B, T, D), _x(rng, B, 4, D)
    causal = causal_mask(T)
    return [
        GradientCheck(
            "TransformerBlock (post-norm, padded: an encoder block)",
            post,
            (x,),
            ("x",),
            kwargs={"mask": _padding((3, 2), T)},
        ),
        GradientCheck(
            "TransformerBlock (pre-norm, causal)", pre, (x,), ("x",), kwargs={"mask": causal}
        ),
        GradientCheck(
            "TransformerBlock (RMSNorm, SwiGLU, no biases, rotary, causal)",
            modern,
            (x,),
            ("x",),
            kwargs={"mask": causal},
        ),
        GradientCheck(
            "TransformerBlock (cross-attention: a decoder block)",
            cross,
            (x, memory),
            ("x", "memory"),
            kwargs={"mask": causal, "memory_mask": _padding((4, 3), 4)},
        ),
    ]


def _residual(rng):
    post = _jitter(
        Residual(Linear(D, D, rng=rng), LayerNorm(D), Dropout(0.0, rng=rng), norm_first=False), rng
    )
    pre = _jitter(
        Residual(Linear(D, D, rng=rng), RMSNorm(D), Dropout(0.0, rng=rng), norm_first=True), rng
    )
    x = _x(rng, B, T, D)
    return [
        GradientCheck("Residual (post-norm, LayerNorm)", post, (x,), ("x",)),
        GradientCheck("Residual (pre-norm, RMSNorm)", pre, (x,), ("x",)),
    ]


def _stack(rng):
    config = DecoderOnlyConfig(
        vocab_size=VOCAB, d_model=D, n_heads=HEADS, d_ff=D_FF, context_length=5
    )
    stack = TransformerStack(
        config, Embedding(VOCAB, D, rng=rng), 2, cross_attention=False, rng=rng
    )
    _jitter(stack, rng, scale=0.1)
    ids = np.array([[1, 4, 2, 6, 3], [2, 2, 5, 1, 0]])
    run = _with_upstream(stack, {"ids": ids, "mask": causal_mask(5)}, rng)
    return [
        GradientCheck(
            "TransformerStack (pre-norm, causal)",
            stack,
            run=run,
            note="token ids are integers: parameters only",
        )
    ]


def _checkpointed(rng):
    blocks = [_jitter(TransformerBlock(D, HEADS, D_FF, rng=rng), rng) for _ in range(2)]
    x = _x(rng, B, T, D)
    return [
        GradientCheck(
            "Checkpointed (two encoder blocks, recomputed in backward)",
            Checkpointed(blocks),
            (x,),
            ("x",),
            kwargs={"mask": _padding((3, 2), T)},
        )
    ]


def _encoder_decoder(rng):
    config = EncoderDecoderConfig(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        d_model=D,
        n_heads=HEADS,
        d_ff=D_FF,
        n_encoder_layers=1,
        n_decoder_layers=1,
        context_length=5,
        share_embeddings=True,
    )
    model = _jitter(EncoderDecoder(config, rng=rng), rng, scale=0.1)
    source = np.array([[3, 5, 2, 6], [4, 4, 1, 0]])  # 0 is padding
    decoder_in = np.array([[1, 6, 2, 5], [1, 3, 0, 0]])
    targets = np.array([[6, 2, 5, 2], [3, 2, 0, 0]])  # padded targets are ignored

    def run() -> tuple[float, np.ndarray]:
        logits = model.forward(source, decoder_in)
        return cross_entropy(logits, targets, ignore_index=0)

    return [
        GradientCheck(
            "EncoderDecoder (shared, tied)",
            model,
            run=run,
            note="token ids are integers: parameters only, through the cross-entropy",
        )
    ]


def _decoder_only(rng):
    config = DecoderOnlyConfig(
        vocab_size=VOCAB, d_model=D, n_heads=HEADS, d_ff=D_FF, n_layers=2, context_length=5
    )
    model = _jitter(DecoderOnlyLM(config, rng=rng), rng, scale=0.1)
    ids = np.array([[1, 4, 2, 6, 3], [2, 2, 5, 1, 0]])
    targets = np.concatenate([ids[:, 1:], np.full((2, 1), -1)], axis=1)  # -1: nothing next

    def run() -> tuple[float, np.ndarray]:
        return cross_entropy(model.forward(ids), targets, ignore_index=-1)

    return [
        GradientCheck(
            "DecoderOnlyLM (tied)",
            model,
            run=run,
            note="token ids are integers: parameters only, through the cross-entropy",
        )
    ]


def _encoder_only(rng):
    config = EncoderOnlyConfig(
        vocab_size=VOCAB,
        d_model=D,
        n_heads=HEADS,
        d_ff=D_FF,
        n_layers=2,
        context_length=5,
        pad_id=0,
    )
    model = _jitter(EncoderOnlyMLM(config, rng=rng), rng, scale=0.1)
    ids = np.array([[3, 5, 2, 6, 1], [4, 1, 5, 0, 0]])  # 0 is padding
    targets = np.array([[-1, 2, -1, -1, 4], [6, -1, -1, -1, -1]])  # -1: not a prediction

    def run() -> tuple[float, np.ndarray]:
        return cross_entropy(model.forward(ids), targets, ignore_index=-1)

    return [
        GradientCheck(
            "EncoderOnlyMLM (tied, padded)",
            model,
            run=run,
            note="token ids are integers: parameters only, through the cross-entropy",
        )
    ]


RECIPES: dict[type[Module], Callable[[np.random.Generator], list[GradientCheck]]] = {
    Linear: _linear,
    Embedding: _embedding,
    TiedOutputProjection: _tied,
    Dropout: _dropout,
    LayerNorm: _norm(LayerNorm),
    RMSNorm: _norm(RMSNorm),
    BatchNorm: _norm(BatchNorm),
    SinusoidalPositionalEncoding: _sinusoidal,
    LearnedPositionalEmbedding: _learned,
    RotaryEmbedding: _rotary,
    ElmanRNN: _rnn,
    FeedForward: _feed_forward,
    QuantizedLinear: _quantized,
    MultiHeadAttention: _attention,
    LoRALinear: _lora,
    MixtureOfExperts: _mixture_of_experts,
    TransformerBlock: _block,
    Residual: _residual,
    TransformerStack: _stack,
    Checkpointed: _checkpointed,
    EncoderDecoder: _encoder_decoder,
    DecoderOnlyLM: _decoder_only,
    EncoderOnlyMLM: _encoder_only,
}
"""For each public ``Module`` subclass, a function ``rng -> [GradientCheck, ...]``."""


def missing_recipes() -> list[str]:
    """Names of the package's ``Module`` subclasses that :data:`RECIPES` does not cover."""
    return [f"{c.__module__}.{c.__name__}" for c in module_classes() if c not in RECIPES]


def run_check(case: GradientCheck, rng: np.random.Generator) -> list[GradientCheckRow]:
    """Run one :class:`GradientCheck`; one row per checked input and parameter."""
    if case.run is not None:
        errors = check_parameter_gradients(case.module, case.run)
    else:
        errors = check_module_gradients(
            case.module,
            case.inputs,
            rng=rng,
            kwargs=case.kwargs,
            before_forward=case.before_forward,
        )
    params = dict(case.module.named_parameters())
    rows = []
    for key, error in errors.items():
        if key.startswith("input "):
            i = int(key.split()[1])
            name, kind, size = case.input_names[i], "input", case.inputs[i].size
        else:
            name, kind, size = key, "parameter", params[key].value.size
        rows.append(GradientCheckRow(case.label, name, kind, size, error, case.note))
    return rows


def gradient_check_table(seed: int = 0) -> list[GradientCheckRow]:
    """Check the gradients of every ``Module`` subclass in the package.

    Parameters
    ----------
    seed : int
        Seeds the one generator that draws every weight, input and upstream gradient.

    Returns
    -------
    list of GradientCheckRow
        One row per input and per parameter of every case of every recipe, in
        the order of :func:`module_classes`.

    Raises
    ------
    LookupError
        If a ``Module`` subclass of the package has no recipe.
    """
    missing = missing_recipes()
    if missing:
        raise LookupError(
            f"no gradient-check recipe for {missing}: add one to tinyformer.verification.RECIPES"
        )
    rng = np.random.default_rng(non_negative_int(seed, "seed"))
    rows: list[GradientCheckRow] = []
    for cls in module_classes():
        for case in RECIPES[cls](rng):
            rows.extend(run_check(case, rng))
    return rows
