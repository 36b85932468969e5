r"""Hugging Face GPT-2 and Llama checkpoints in tinyformer's terms, and back.

Two Hugging Face model classes are a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM`
with particular options, tensor for tensor:

- ``GPT2LMHeadModel`` (``model_type="gpt2"``): pre-norm LayerNorm blocks, learned
  positions, a plain feed-forward network, biases everywhere, a tied output by default;
- ``LlamaForCausalLM`` (``model_type="llama"``; Mistral's has the same tensors): pre-norm
  RMSNorm blocks, a gated feed-forward network (SwiGLU), rotary positions, often
  grouped-query attention, usually no biases.

:func:`hf_layout` says which of the two a :class:`~tinyformer.models.config.DecoderOnlyConfig`
is, or refuses, naming every option neither can express. The conventions that differ
between the libraries are written once, in the table :func:`tensor_table` returns, and
both directions read that table (:func:`from_hf_state_dict`, :func:`to_hf_state_dict`):

- **Transposes.** PyTorch's ``nn.Linear`` stores its weight as ``(out, in)`` and
  computes ``x @ W.T``; tinyformer's :class:`~tinyformer.layers.Linear` stores
  ``(in, out)`` and computes ``x @ W``. Llama's projections and both models' output
  layer ``lm_head`` are ``nn.Linear``, so their weights are transposed each way.
  GPT-2's layers are ``Conv1D``, which (a relic of the original TensorFlow code)
  stores ``(in, out)`` as tinyformer does: no transpose there.
- **Side by side.** GPT-2's ``c_attn`` computes queries, keys and values in one
  product: its weight ``(d, 3d)`` is tinyformer's three ``(d, d)`` projections set
  side by side, in the order q, k, v (its bias likewise). The other way round,
  tinyformer's gated network keeps its two input matrices in one ``linear_in``
  ``(d, 2 d_ff)``, the activated branch first: Llama's ``gate_proj`` then ``up_proj``.
- **Rotary layout.** Hugging Face rotates the feature pairs :math:`(i, i + d_k/2)`
  of each head (``"halves"``); a tinyformer model may rotate :math:`(2i, 2i + 1)`
  (``"adjacent"``, its default). The scores are the same once the query and key
  features are reordered within each head
  (:func:`~tinyformer.positional.convert_rotary_layout`), so a checkpoint always
  holds the halves layout and an adjacent-layout model is converted on the way in
  and out. The reordering is a permutation: it is exact.
- **Tied output.** With ``tie_word_embeddings`` (tinyformer's ``tie_output``) the
  output layer is the embedding table; ``transformers`` leaves ``lm_head.weight``
  out of the file it saves, and tinyformer's model has no parameter for it. Such a
  tensor, when a file holds it anyway, must be an exact copy of the embedding (it is
  then not used); a different one is refused, since ``transformers`` would untie the
  model and use it.

Nothing here imports PyTorch or ``transformers``: a state dict may hold NumPy
arrays or CPU tensors (anything ``numpy.asarray`` reads). Files are written and
read by :mod:`tinyformer.models.pretrained`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer._validation import describe
from tinyformer.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.positional import convert_rotary_layout

__all__ = [
    "HF_ACTIVATIONS",
    "HF_LAYOUTS",
    "TensorGroup",
    "config_from_hf",
    "config_from_hf_gpt2",
    "config_from_hf_llama",
    "config_to_hf",
    "from_hf_llama",
    "from_hf_state_dict",
    "hf_layout",
    "hf_llama_state_dict",
    "tensor_table",
    "to_hf_state_dict",
]

HF_LAYOUTS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
"""The ``model_type`` of each layout and the class ``transformers`` builds for it."""

HF_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
r"""Names in ``transformers.activations`` of the functions tinyformer computes, exactly.

``gelu`` and ``gelu_python`` are the exact (erf) GELU; ``gelu_new`` (GPT-2's),
``gelu_pytorch_tanh`` (PyTorch's kernel), ``gelu_python_tanh`` and ``gelu_accurate``
are all :math:`\tfrac12 x (1 + \tanh(\sqrt{2/\pi}(x + 0.044715 x^3)))`, tinyformer's
``"gelu_tanh"``. Not listed, so refused: ``gelu_fast`` (it rounds
:math:`\sqrt{2/\pi}` to ten digits), ``quick_gelu`` (a sigmoid), and functions
tinyformer does not have.
"""

_WRITTEN_ACTIVATIONS = {
    "gpt2": {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"},
    "llama": {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"},
}
"""The name each layout's own configurations use for tinyformer's activations."""

_NAMES = {"gpt2": "GPT-2", "llama": "Llama"}

# Hugging Face tensors that are not parameters: GPT-2's causal-mask buffers (in files
# written by old versions) and the rotary frequencies some Llama files carry.
_BUFFERS = re.compile(r"(\.attn\.(bias|masked_bias)|rotary_emb\.inv_freq)$")


def _requirements(config: DecoderOnlyConfig, layout: str) -> list[str]:
    """The options of ``config`` that ``layout`` cannot express, each said with what it needs."""
    c = config
    needs: list[tuple[str, object, tuple[object, ...], str]] = [
        ("norm_first", c.norm_first, (True,), "pre-norm blocks"),
        ("scale_embeddings", c.scale_embeddings, (False,), "unscaled embeddings"),
        ("activation", c.activation, tuple(_WRITTEN_ACTIVATIONS[layout]), "its activations"),
    ]
    if layout == "gpt2":
        needs += [
            ("norm", c.norm, ("layernorm",), "LayerNorm"),
            ("feed_forward", c.feed_forward, ("plain",), "a plain feed-forward network"),
            ("positional", c.positional, ("learned",), "learned positions"),
            ("bias", c.bias, (True,), "biases"),
            ("n_kv_heads", c.kv_heads, (c.n_heads,), "as many key/value heads as heads"),
        ]
    else:
        needs += [
            ("norm", c.norm, ("rmsnorm",), "RMSNorm"),
            ("feed_forward", c.feed_forward, ("gated",), "a gated feed-forward network"),
            ("positional", c.positional, ("rotary",), "rotary positions"),
            ("rotary_scaling", c.rotary_scaling, (None, "linear"), "plain or linear RoPE"),
            ("attention_scale", c.attention_scale, ("sqrt",), "scores scaled by 1/sqrt(d_k)"),
        ]
        if c.rotary_scaling == "linear" and c.rotary_scaling_factor < 1:
            needs.append(
                (
                    "rotary_scaling_factor",
                    c.rotary_scaling_factor,
                    ("a factor >= 1",),
                    "transformers rejects a linear factor below 1",
                )
            )
    return [
        f"{name}={value!r} ({_NAMES[layout]} needs {' or '.join(map(repr, allowed))}: {why})"
        for name, value, allowed, why in needs
        if value not in allowed
    ]


def hf_layout(config: DecoderOnlyConfig) -> str:
    """The Hugging Face layout, ``"gpt2"`` or ``"llama"``, that expresses ``config`` exactly.

    Raises
    ------
    ValueError
        If neither does; the message names every option in the way, for the nearer
        layout first (post-norm blocks, scaled embeddings, sinusoidal or no positions,
        a mixture of experts, NTK-aware rotary scaling, unscaled attention scores in
        a Llama-shaped model, GPT-2 with rotary positions or grouped-query heads, ...).
    """
    if not isinstance(config, DecoderOnlyConfig):
        raise TypeError(f"config must be a DecoderOnlyConfig, got {describe(config)}")
    problems = {layout: _requirements(config, layout) for layout in HF_LAYOUTS}
    nearest = sorted(HF_LAYOUTS, key=lambda layout: len(problems[layout]))
    if not problems[nearest[0]]:
        return nearest[0]
    said = "; ".join(
        f"as {_NAMES[layout]} ({HF_LAYOUTS[layout]}): {', '.join(problems[layout])}"
        for layout in nearest
    )
    raise ValueError(f"this model has no Hugging Face layout: {said}")


@dataclass(frozen=True)
class TensorGroup:
    """Tensors that hold the same numbers in the two libraries.

    The tinyformer tensors ``ours``, set side by side along their last axis, equal
    the Hugging Face tensors ``theirs`` (each transposed first when ``transpose``),
    set side by side along their last axis. Most groups are one tensor each way.

    Attributes
    ----------
    ours, theirs : tuple of str
        Parameter names in tinyformer's model and in the Hugging Face state dict.
    transpose : bool
        Theirs are ``nn.Linear`` weights ``(out, in)``; ours are ``(in, out)``.
    rotary_heads : int or None
        The heads of a query or key projection rotated by RoPE: ours are in the
        model's ``rotary_layout``, theirs in the halves layout.
    """

    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    transpose: bool = False
    rotary_heads: int | None = None


def _gpt2_table(config: DecoderOnlyConfig) -> list[TensorGroup]:
    table = [
        TensorGroup(("decoder.embedding.weight",), ("transformer.wte.weight",)),
        TensorGroup(("decoder.positions.weight",), ("transformer.wpe.weight",)),
    ]
    for i in range(config.n_layers):
        ours, theirs = f"decoder.layers.{i}.", f"transformer.h.{i}."
        attention, mlp = ours + "self_attention.", ours + "feed_forward."
        for kind in ("weight", "bias"):
            qkv = tuple(f"{attention}layer.{p}_proj.{kind}" for p in "qkv")
            table += [
                TensorGroup((f"{attention}norm.{_gain(kind)}",), (f"{theirs}ln_1.{kind}",)),
                TensorGroup(qkv, (f"{theirs}attn.c_attn.{kind}",)),  # q, k, v in one Conv1D
                TensorGroup(
                    (f"{attention}layer.out_proj.{kind}",), (f"{theirs}attn.c_proj.{kind}",)
                ),
                TensorGroup((f"{mlp}norm.{_gain(kind)}",), (f"{theirs}ln_2.{kind}",)),
                TensorGroup((f"{mlp}layer.linear_in.{kind}",), (f"{theirs}mlp.c_fc.{kind}",)),
                TensorGroup((f"{mlp}layer.linear_out.{kind}",), (f"{theirs}mlp.c_proj.{kind}",)),
            ]
    table += [
        TensorGroup(("decoder.final_norm.gain",), ("transformer.ln_f.weight",)),
        TensorGroup(("decoder.final_norm.bias",), ("transformer.ln_f.bias",)),
    ]
    return table


def _gain(kind: str) -> str:
    """The tinyformer name of a norm's ``weight`` (its ``gain``) or ``bias``."""
    return "gain" if kind == "weight" else kind


def _llama_table(config: DecoderOnlyConfig) -> list[TensorGroup]:
    table = [TensorGroup(("decoder.embedding.weight",), ("model.embed_tokens.weight",))]
    heads = {"q": config.n_heads, "k": config.kv_heads, "v": None, "o": None}
    kinds = ("weight", "bias") if config.bias else ("weight",)
    for i in range(config.n_layers):
        ours, theirs = f"decoder.layers.{i}.", f"model.layers.{i}."
        attention, mlp = ours + "self_attention.layer.", ours + "feed_forward.layer."
        for kind in kinds:
            weight = kind == "weight"
            for p, n_heads in heads.items():
                name = "out_proj" if p == "o" else f"{p}_proj"
                mine, hers = f"{attention}{name}.{kind}", f"{theirs}self_attn.{p}_proj.{kind}"
                table.append(TensorGroup((mine,), (hers,), weight, n_heads))
            gate_up = (f"{theirs}mlp.gate_proj.{kind}", f"{theirs}mlp.up_proj.{kind}")
            table += [
                TensorGroup((f"{mlp}linear_in.{kind}",), gate_up, weight),  # activated first
                TensorGroup(
                    (f"{mlp}linear_out.{kind}",), (f"{theirs}mlp.down_proj.{kind}",), weight
                ),
            ]
        table += [
            TensorGroup(
                (ours + "self_attention.norm.gain",), (theirs + "input_layernorm.weight",)
            ),
            TensorGroup(
                (ours + "feed_forward.norm.gain",), (theirs + "post_attention_layernorm.weight",)
            ),
        ]
    table.append(TensorGroup(("decoder.final_norm.gain",), ("model.norm.weight",)))
    return table


def tensor_table(config: DecoderOnlyConfig) -> list[TensorGroup]:
    """Every tensor of a model of ``config`` and its Hugging Face counterpart.

    The output layer is a group (``output.weight``, ``lm_head.weight``, transposed)
    only when it is not tied. Raises like :func:`hf_layout` for a configuration
    neither layout expresses.
    """
    layout = hf_layout(config)
    table = _gpt2_table(config) if layout == "gpt2" else _llama_table(config)
    if not config.tie_output:
        table.append(TensorGroup(("output.weight",), ("lm_head.weight",), transpose=True))
    return table


def _split(joined: np.ndarray, parts: int, name: str) -> list[np.ndarray]:
    """``joined`` cut into ``parts`` equal pieces along its last axis."""
    if joined.shape[-1] % parts:
        raise ValueError(
            f"{name} must have a last axis that splits into {parts} equal parts, got shape"
            f" {joined.shape}"
        )
    return [np.ascontiguousarray(p) for p in np.split(joined, parts, axis=-1)]


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=-1)


def _array(value: Any, name: str, dtype: np.dtype) -> np.ndarray:
    """A tensor of a state dict as a NumPy array of ``dtype`` (PyTorch tensors widened first)."""
    if hasattr(value, "detach"):  # a PyTorch tensor (bfloat16 has no NumPy dtype: widen)
        value = value.detach().cpu()
        if value.is_floating_point() and value.element_size() < 4:
            value = value.float()
        value = value.numpy()
    value = np.asarray(value)
    if value.dtype.kind != "f":
        raise TypeError(
            f"state_dict[{name!r}] must hold floating-point numbers, got {value.dtype}"
        )
    return value.astype(dtype, copy=True)


def _named_like(state: Mapping[str, Any], layout: str) -> dict[str, Any]:
    """The tensors of a Hugging Face state dict under the names of the causal-LM class.

    Buffers that are not parameters are dropped. A base model's names (``h.0...``,
    ``layers.0...``, as in files saved from ``GPT2Model``) get the prefix that the
    causal-LM class adds (``transformer.``, ``model.``).
    """
    prefix = "transformer." if layout == "gpt2" else "model."
    named: dict[str, Any] = {}
    for name, value in state.items():
        if _BUFFERS.search(name):
            continue
        full = name if name.startswith(prefix) or name == "lm_head.weight" else prefix + name
        if full in named:
            raise ValueError(f"state_dict holds {full!r} twice, with and without {prefix!r}")
        named[full] = value
    return named


def from_hf_state_dict(
    state_dict: Mapping[str, Any], config: DecoderOnlyConfig
) -> dict[str, np.ndarray]:
    """Hugging Face tensors renamed, transposed, split or joined and reordered into tinyformer's.

    The result loads with ``DecoderOnlyLM(config, ...).load_state_dict(...)``, in
    ``config.dtype``. Every tensor of ``state_dict`` must be used (buffers and a tied
    ``lm_head.weight`` excepted) and every tinyformer parameter found, else
    :class:`ValueError` names the difference.

    Parameters
    ----------
    state_dict : Mapping
        ``GPT2LMHeadModel.state_dict()`` or ``LlamaForCausalLM.state_dict()``, or the
        tensors of a ``model.safetensors`` file, as arrays or CPU tensors.
    config : DecoderOnlyConfig
        The matching configuration (:func:`config_from_hf`).
    """
    if not isinstance(config, DecoderOnlyConfig):
        raise TypeError(f"config must be a DecoderOnlyConfig, got {describe(config)}")
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"state_dict must be a mapping of names to tensors, got {describe(state_dict)}"
        )
    table = tensor_table(config)
    theirs = _named_like(state_dict, hf_layout(config))
    dtype = np.dtype(config.dtype)
    out: dict[str, np.ndarray] = {}
    for group in table:
        missing = [name for name in group.theirs if name not in theirs]
        if missing:
            raise ValueError(
                f"state_dict lacks {missing[0]!r}, which a model of this config needs"
            )
        parts = [_array(theirs[name], name, dtype) for name in group.theirs]
        joined = _joined([p.T if group.transpose else p for p in parts])
        if group.rotary_heads and config.rotary_layout != "halves":
            joined = convert_rotary_layout(
                joined, group.rotary_heads, source="halves", target=config.rotary_layout
            )
        out.update(zip(group.ours, _split(joined, len(group.ours), group.theirs[0]), strict=True))
    used = {name for group in table for name in group.theirs}
    if config.tie_output and "lm_head.weight" in theirs:
        # tied: a copy of the embedding table, which the model does not hold twice. A
        # different table would be used by transformers (it unties such a model), not by
        # a tied tinyformer model: refused rather than silently dropped.
        embedding = (
            "transformer.wte.weight"
            if hf_layout(config) == "gpt2"
            else "model.embed_tokens.weight"
        )
        head = _array(theirs["lm_head.weight"], "lm_head.weight", dtype)
        if not np.array_equal(head, out["decoder.embedding.weight"]):
            raise ValueError(
                "the config says tie_word_embeddings=true, but the checkpoint's"
                f" 'lm_head.weight' differs from {embedding!r}: set tie_word_embeddings to"
                " false in config.json to read the two tables apart"
            )
        used.add("lm_head.weight")
    unused = sorted(theirs.keys() - used)
    if unused:
        raise ValueError(f"state_dict holds tensors this config has no place for: {unused[:5]}")
    return out


def to_hf_state_dict(
    state_dict: Mapping[str, np.ndarray], config: DecoderOnlyConfig
) -> dict[str, np.ndarray]:
    """A tinyformer state dict under the names and in the shapes ``transformers`` saves.

    The inverse of :func:`from_hf_state_dict`: the tensors keep their dtype, and a
    tied output layer has no ``lm_head.weight`` (``transformers`` leaves it out of
    the files it writes and ties it again when it loads them).

    Parameters
    ----------
    state_dict : Mapping
        ``DecoderOnlyLM.state_dict()`` of a model of ``config``.
    config : DecoderOnlyConfig
        Its configuration, one that :func:`hf_layout` accepts.

    Raises
    ------
    ValueError
        If ``config`` has no Hugging Face layout, or ``state_dict``'s names are
        not those of a model of ``config`` (both differences named).
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"state_dict must be a mapping of names to arrays, got {describe(state_dict)}"
        )
    table = tensor_table(config)
    expected = {name for group in table for name in group.ours}
    missing, extra = sorted(expected - state_dict.keys()), sorted(state_dict.keys() - expected)
    if missing or extra:
        raise ValueError(
            f"state_dict does not hold the parameters of a {_NAMES[hf_layout(config)]}-shaped"
            f" model: missing {missing[:5]}, extra {extra[:5]}"
        )
    out: dict[str, np.ndarray] = {}
    for group in table:
        joined = _joined([np.asarray(state_dict[name]) for name in group.ours])
        if group.rotary_heads and config.rotary_layout != "halves":
            joined = convert_rotary_layout(
                joined, group.rotary_heads, source=config.rotary_layout, target="halves"
            )
        parts = _split(joined, len(group.theirs), group.ours[0])
        for name, part in zip(group.theirs, parts, strict=True):
            out[name] = np.ascontiguousarray(part.T) if group.transpose else part
    return out


def _token_ids(
    vocab_size: int, special_ids: Mapping[str, int | None] | None = None
) -> dict[str, int | None]:
    """The special ids, by default tinyformer's (padding 0, BOS 1, EOS 2); None past the vocabulary."""
    ids = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID}
    if special_ids is not None:
        unknown = sorted(set(special_ids) - set(ids))
        if unknown:
            raise ValueError(f"special_ids may name 'pad', 'bos' and 'eos', got {unknown}")
        ids = {role: special_ids.get(role) for role in ids}
    return {
        f"{role}_token_id": (i if i is not None and 0 <= i < vocab_size else None)
        for role, i in ids.items()
    }


def config_to_hf(
    config: DecoderOnlyConfig, *, special_ids: Mapping[str, int | None] | None = None
) -> dict[str, Any]:
    """The ``config.json`` of a model of ``config``, as ``transformers``' ``AutoConfig`` reads it.

    GPT-2: ``n_embd``, ``n_head``, ``n_layer``, ``n_inner`` (``d_ff``), ``n_positions``
    (``context_length``), ``activation_function``, ``layer_norm_epsilon``,
    ``scale_attn_weights`` (False for ``attention_scale="none"``) and the three
    dropout probabilities ``embd_pdrop``, ``attn_pdrop``, ``resid_pdrop``, each
    tinyformer's one ``dropout``. Llama: ``hidden_size``, ``intermediate_size``,
    heads, ``head_dim``, ``hidden_act``, ``rms_norm_eps``, ``rope_parameters`` (also
    as the older ``rope_theta`` and ``rope_scaling``), ``attention_bias`` and
    ``mlp_bias`` (both ``bias``) and ``attention_dropout`` (``dropout``). Both:
    ``vocab_size``, ``tie_word_embeddings``, the special ids (``special_ids``, a
    mapping of ``"pad"``, ``"bos"`` and ``"eos"`` to ids or None, as a tokenizer
    gives them; by default those of tinyformer's tokenizers: padding 0, BOS 1, EOS 2)
    and the dtype, as ``dtype`` (read by ``transformers`` 5) and ``torch_dtype`` (by 4).

    Dropout is where the libraries differ in training only: tinyformer's also
    drops the feed-forward network's hidden layer, GPT-2's does not, and Llama's
    drops attention weights alone. Evaluation is the same.

    A Llama configuration also records, under the key ``"tinyformer"``, the
    ``rotary_layout`` of the model it came from, which
    :func:`~tinyformer.models.pretrained.from_pretrained` restores; ``transformers``
    keeps the key and ignores it.
    """
    layout = hf_layout(config)
    c = config
    common = {
        "model_type": layout,
        "architectures": [HF_LAYOUTS[layout]],
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": c.tie_output,
        **_token_ids(c.vocab_size, special_ids),
        "dtype": c.dtype,
        "torch_dtype": c.dtype,
        "use_cache": True,
    }
    if layout == "gpt2":
        return {
            **common,
            "n_embd": c.d_model,
            "n_head": c.n_heads,
            "n_layer": c.n_layers,
            "n_inner": c.d_ff,
            "n_positions": c.context_length,
            "activation_function": _WRITTEN_ACTIVATIONS[layout][c.activation],
            "layer_norm_epsilon": c.norm_eps,
            "scale_attn_weights": c.attention_scale == "sqrt",
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "add_cross_attention": False,
            "embd_pdrop": c.dropout,
            "attn_pdrop": c.dropout,
            "resid_pdrop": c.dropout,
        }
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rotary_base}
    if c.rotary_scaling == "linear":
        rope.update(rope_type="linear", factor=c.rotary_scaling_factor)
    legacy = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {
        **common,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.d_k,
        "hidden_act": _WRITTEN_ACTIVATIONS[layout][c.activation],
        "max_position_embeddings": c.context_length,
        "rms_norm_eps": c.norm_eps,
        "rope_parameters": rope,
        "rope_theta": c.rotary_base,
        "rope_scaling": legacy if c.rotary_scaling else None,
        "attention_bias": c.bias,
        "mlp_bias": c.bias,
        "attention_dropout": c.dropout,
        "pretraining_tp": 1,
        "tinyformer": {"rotary_layout": c.rotary_layout},
    }


def _hf_activation(name: object, key: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ValueError(
            f"{key} must be one of {sorted(HF_ACTIVATIONS)} (the activations tinyformer"
            f" computes exactly), got {name!r}"
        )
    return HF_ACTIVATIONS[name]  # type: ignore[index]


def _rope(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The rotary base and scaling, wherever this version of ``transformers`` keeps them.

    Plain RoPE and ``"linear"`` scaling (position interpolation: Hugging Face divides
    the frequencies by the factor, tinyformer the positions, the same angles) are
    read; any other scaling is refused by name.
    """
    parameters = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    # newer configs name the kind "rope_type", older ones (many config.json files) "type"
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    factor = parameters.get("factor")
    if kind not in ("default", "linear") or (kind == "default" and factor not in (None, 1)):
        raise ValueError(
            f"rotary scaling {kind!r} (factor {factor}) is not supported: only plain RoPE"
            " and 'linear' (position interpolation)"
        )
    rope = {"rotary_base": float(parameters.get("rope_theta", hf.get("rope_theta", 10000.0)))}
    if kind == "linear" and factor != 1:
        rope.update(rotary_scaling="linear", rotary_scaling_factor=float(factor))
    return rope


def _mapping(hf_config: object) -> dict[str, Any]:
    if not isinstance(hf_config, Mapping):
        raise TypeError(
            f"hf_config must be a mapping (a config.json read as a dict, or"
            f" PreTrainedConfig.to_dict()), got {describe(hf_config)}"
        )
    return dict(hf_config)


def _require(hf: Mapping[str, Any], keys: tuple[str, ...], layout: str) -> None:
    missing = [key for key in keys if key not in hf]
    if missing:
        raise ValueError(
            f"hf_config lacks {missing}, which a {_NAMES[layout]} configuration must give"
        )


_LLAMA_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)


def config_from_hf_llama(
    hf_config: Mapping[str, Any], *, dtype: str = "float64", rotary_layout: str = "adjacent"
) -> DecoderOnlyConfig:
    """The :class:`~tinyformer.models.config.DecoderOnlyConfig` of a Hugging Face Llama configuration.

    ``attention_dropout`` becomes ``dropout``. Refused by name: a sliding window
    shorter than the context, an activation not in :data:`HF_ACTIVATIONS`,
    ``attention_bias`` and ``mlp_bias`` that differ, a ``head_dim`` other than
    ``hidden_size / num_attention_heads``, and rotary scalings other than
    ``"linear"``.

    Parameters
    ----------
    hf_config : Mapping
        ``LlamaConfig.to_dict()`` (or a ``config.json`` read as a dict).
    dtype : str
        ``"float32"`` or ``"float64"``.
    rotary_layout : str
        The layout the tinyformer model will use; :func:`from_hf_state_dict`
        converts the weights to it.
    """
    hf = _mapping(hf_config)
    _require(hf, _LLAMA_REQUIRED, "llama")
    window = hf.get("sliding_window")
    if window is not None and window < hf["max_position_embeddings"]:
        raise ValueError(
            f"sliding_window={window} is not supported: tinyformer attends to the whole"
            f" context (max_position_embeddings={hf['max_position_embeddings']}), so longer"
            " inputs would give other logits than the Hugging Face model"
        )
    activation = _hf_activation(hf.get("hidden_act", "silu"), "hidden_act")
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        raise ValueError(
            "attention_bias and mlp_bias must agree (tinyformer has one bias switch), got"
            f" {hf.get('attention_bias')} and {hf.get('mlp_bias')}"
        )
    n_heads = hf["num_attention_heads"]
    n_kv = hf.get("num_key_value_heads") or n_heads
    head_dim = hf.get("head_dim") or hf["hidden_size"] // n_heads
    if head_dim * n_heads != hf["hidden_size"]:
        raise ValueError(
            f"head_dim={head_dim} times num_attention_heads={n_heads} must equal"
            f" hidden_size={hf['hidden_size']} in tinyformer"
        )
    return DecoderOnlyConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_heads=n_heads,
        n_kv_heads=None if n_kv == n_heads else n_kv,
        d_ff=hf["intermediate_size"],
        n_layers=hf["num_hidden_layers"],
        context_length=hf["max_position_embeddings"],
        dropout=float(hf.get("attention_dropout") or 0.0),
        norm_first=True,
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        feed_forward="gated",
        activation=activation,
        bias=bool(hf.get("attention_bias", False)),
        positional="rotary",
        **_rope(hf),
        rotary_layout=rotary_layout,
        tie_output=bool(hf.get("tie_word_embeddings", False)),
        dtype=dtype,
    )


_GPT2_REQUIRED = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")
_GPT2_DROPOUTS = ("embd_pdrop", "attn_pdrop", "resid_pdrop")


def config_from_hf_gpt2(
    hf_config: Mapping[str, Any], *, dtype: str = "float64", dropout: float | None = None
) -> DecoderOnlyConfig:
    """The :class:`~tinyformer.models.config.DecoderOnlyConfig` of a Hugging Face GPT-2 configuration.

    ``scale_attn_weights=False`` becomes ``attention_scale="none"``;
    ``reorder_and_upcast_attn`` changes only how mixed-precision training rounds,
    so it is read as the same model. Refused by name: ``add_cross_attention``,
    ``scale_attn_by_inverse_layer_idx``, activations not in :data:`HF_ACTIVATIONS`,
    and three dropout probabilities that differ unless ``dropout`` is given.

    Parameters
    ----------
    hf_config : Mapping
        ``GPT2Config.to_dict()`` (or a ``config.json`` read as a dict).
    dtype : str
        ``"float32"`` or ``"float64"``.
    dropout : float, optional
        tinyformer's one dropout probability; by default the file's
        ``embd_pdrop``, ``attn_pdrop`` and ``resid_pdrop``, which must then agree
        (GPT-2's own checkpoints set all three to 0.1).
    """
    hf = _mapping(hf_config)
    _require(hf, _GPT2_REQUIRED, "gpt2")
    for key in ("add_cross_attention", "scale_attn_by_inverse_layer_idx"):
        if hf.get(key, False):
            raise ValueError(
                f"{key}=True is not supported: tinyformer's DecoderOnlyLM has no such option"
            )
    activation = _hf_activation(hf.get("activation_function", "gelu_new"), "activation_function")
    if dropout is None:
        dropouts = {key: hf.get(key, 0.1) for key in _GPT2_DROPOUTS}
        if len(set(dropouts.values())) > 1:
            raise ValueError(
                f"the dropout probabilities {dropouts} differ and tinyformer has one: pass"
                " dropout= to choose it (it changes training only, not the logits)"
            )
        dropout = dropouts["resid_pdrop"]
    return DecoderOnlyConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["n_embd"],
        n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
        n_layers=hf["n_layer"],
        context_length=hf["n_positions"],
        dropout=float(dropout),
        norm_first=True,
        norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        feed_forward="plain",
        activation=activation,
        bias=True,
        positional="learned",
        attention_scale="sqrt" if hf.get("scale_attn_weights", True) else "none",
        tie_output=bool(hf.get("tie_word_embeddings", True)),
        dtype=dtype,
    )


def config_from_hf(
    hf_config: Mapping[str, Any],
    *,
    dtype: str = "float64",
    rotary_layout: str | None = None,
    dropout: float | None = None,
) -> DecoderOnlyConfig:
    """The configuration of a GPT-2 or Llama ``config.json``, chosen by its ``model_type``.

    Parameters
    ----------
    hf_config : Mapping
        The ``config.json`` read as a dict.
    dtype : str
        ``"float32"`` or ``"float64"``.
    rotary_layout : str, optional
        Llama only: the tinyformer model's rotary layout; by default the one
        recorded by :func:`config_to_hf` under ``"tinyformer"``, else ``"adjacent"``.
    dropout : float, optional
        GPT-2 only: see :func:`config_from_hf_gpt2`.
    """
    hf = _mapping(hf_config)
    model_type = hf.get("model_type")
    if model_type not in HF_LAYOUTS:
        raise ValueError(
            f"model_type must be one of {sorted(HF_LAYOUTS)} (the layouts tinyformer reads),"
            f" got {model_type!r}"
        )
    if model_type == "gpt2":
        return config_from_hf_gpt2(hf, dtype=dtype, dropout=dropout)
    if rotary_layout is None:
        recorded = hf.get("tinyformer")
        rotary_layout = (
            recorded.get("rotary_layout", "adjacent")
            if isinstance(recorded, Mapping)
            else "adjacent"
        )
    return config_from_hf_llama(hf, dtype=dtype, rotary_layout=rotary_layout)


def hf_llama_state_dict(
    state_dict: Mapping[str, Any], config: DecoderOnlyConfig
) -> dict[str, np.ndarray]:
    """Hugging Face Llama tensors in tinyformer's names: :func:`from_hf_state_dict` for Llama.

    Parameters
    ----------
    state_dict : Mapping
        ``LlamaForCausalLM.state_dict()`` (names ``model.layers.{i}.self_attn.q_proj.weight``
        and so on, ``lm_head.weight`` unless tied).
    config : DecoderOnlyConfig
        The matching configuration (:func:`config_from_hf_llama`).
    """
    if isinstance(config, DecoderOnlyConfig) and hf_layout(config) != "llama":
        raise ValueError(f"config must describe a Llama-shaped model, got {config!r}")
    return from_hf_state_dict(state_dict, config)


def from_hf_llama(state_dict: Mapping[str, Any], config: DecoderOnlyConfig) -> DecoderOnlyLM:
    """A :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` holding a Hugging Face Llama's weights.

    The model comes back in evaluation mode; its logits equal those of the
    ``LlamaForCausalLM`` that ``state_dict`` came from, to rounding (the test
    suite compares them: ``tests/unit/models/test_hf.py``).
    """
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))  # weights replaced below
    model.load_state_dict(hf_llama_state_dict(state_dict, config))
    return model.eval()
