"""Hugging Face Llama-family weights in a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM`.

A ``LlamaForCausalLM`` (and Mistral's, which has the same tensors) is a pre-norm
RMSNorm decoder with SwiGLU feed-forward networks, rotary positions and, often,
grouped-query attention: a :class:`~tinyformer.models.config.DecoderOnlyConfig`
describes it exactly. Three conventions differ between the two libraries, and
:func:`from_hf_llama` translates each:

- PyTorch's ``nn.Linear`` stores its weight as ``(out, in)`` and computes
  ``x @ W.T``; tinyformer's :class:`~tinyformer.layers.Linear` stores ``(in, out)``
  and computes ``x @ W``. Every weight is transposed.
- Hugging Face rotates the feature pairs :math:`(i, i + d_k/2)` of each head (the
  ``"halves"`` layout, ``rotate_half``); tinyformer's default is :math:`(2i, 2i+1)`
  (``"adjacent"``). Unless the configuration asks for ``rotary_layout="halves"``,
  the query and key weights are reordered with
  :func:`~tinyformer.positional.convert_rotary_layout` (halves to adjacent).
- The gated network's two input matrices (``gate_proj``, activated, and
  ``up_proj``, linear) sit side by side in one ``linear_in``, the activated
  branch first.

Nothing here imports PyTorch or ``transformers``: the state dict may hold NumPy
arrays or CPU tensors (anything ``numpy.asarray`` reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tinyformer._validation import describe
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.positional import convert_rotary_layout

__all__ = ["config_from_hf_llama", "from_hf_llama", "hf_llama_state_dict"]

_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


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


_REQUIRED = (
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

    Parameters
    ----------
    hf_config : Mapping
        ``LlamaConfig.to_dict()`` (or a ``config.json`` read as a dict).
    dtype : str
        ``"float32"`` or ``"float64"``.
    rotary_layout : str
        The layout the tinyformer model will use; :func:`from_hf_llama` converts
        the weights to it.
    """
    if not isinstance(hf_config, Mapping):
        raise TypeError(
            f"hf_config must be a mapping (LlamaConfig.to_dict()), got {describe(hf_config)}"
        )
    hf = dict(hf_config)
    missing = [key for key in _REQUIRED if key not in hf]
    if missing:
        raise ValueError(f"hf_config lacks {missing}, which a Llama configuration must give")
    window = hf.get("sliding_window")
    if window is not None and window < hf["max_position_embeddings"]:
        raise ValueError(
            f"sliding_window={window} is not supported: tinyformer attends to the whole"
            f" context (max_position_embeddings={hf['max_position_embeddings']}), so longer"
            " inputs would give other logits than the Hugging Face model"
        )
    act = hf.get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {sorted(_ACTIVATIONS)}, got {act!r}")
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
        norm_first=True,
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        feed_forward="gated",
        activation=_ACTIVATIONS[act],
        bias=bool(hf.get("attention_bias", False)),
        positional="rotary",
        **_rope(hf),
        rotary_layout=rotary_layout,
        tie_output=bool(hf.get("tie_word_embeddings", False)),
        dtype=dtype,
    )


def hf_llama_state_dict(
    state_dict: Mapping[str, Any], config: DecoderOnlyConfig
) -> dict[str, np.ndarray]:
    """Hugging Face Llama tensors renamed, transposed and reordered into tinyformer's names.

    The result loads with ``DecoderOnlyLM(config, ...).load_state_dict(...)``. Every
    tensor of ``state_dict`` must be used (rotary frequency buffers excepted) and
    every tinyformer parameter found, else :class:`ValueError` names the difference.

    Parameters
    ----------
    state_dict : Mapping
        ``LlamaForCausalLM.state_dict()`` (names ``model.layers.{i}.self_attn.q_proj.weight``
        and so on, ``lm_head.weight`` unless tied).
    config : DecoderOnlyConfig
        The matching configuration (:func:`config_from_hf_llama`).
    """
    if not isinstance(config, DecoderOnlyConfig):
        raise TypeError(f"config must be a DecoderOnlyConfig, got {describe(config)}")
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"state_dict must be a mapping of names to tensors, got {describe(state_dict)}"
        )
    hf = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
    used: set[str] = set()

    def take(name: str) -> np.ndarray:
        if name not in hf:
            raise ValueError(f"state_dict lacks {name!r}, which a model of this config needs")
        used.add(name)
        value = hf[name]
        if hasattr(value, "detach"):  # a PyTorch tensor (bfloat16 has no NumPy dtype: widen)
            value = value.detach().cpu()
            if not value.is_floating_point() or value.element_size() < 4:
                value = value.float()
            value = value.numpy()
        return np.array(value, dtype=np.float64 if config.dtype == "float64" else np.float32)

    def rotated(weight: np.ndarray, n_heads: int) -> np.ndarray:
        """Query or key features, in the layout the tinyformer model rotates."""
        if config.rotary_layout == "halves":
            return weight
        return convert_rotary_layout(weight, n_heads, source="halves", target="adjacent")

    out: dict[str, np.ndarray] = {"decoder.embedding.weight": take("model.embed_tokens.weight")}
    for i in range(config.n_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention, mlp = dst + "self_attention.layer.", dst + "feed_forward.layer."
        heads = {"q": config.n_heads, "k": config.kv_heads}
        for name in ("q", "k", "v", "o"):
            w = take(f"{src}self_attn.{name}_proj.weight").T  # (in, out)
            target = "out_proj" if name == "o" else f"{name}_proj"
            out[f"{attention}{target}.weight"] = rotated(w, heads[name]) if name in heads else w
            if config.bias:
                b = take(f"{src}self_attn.{name}_proj.bias")
                out[f"{attention}{target}.bias"] = rotated(b, heads[name]) if name in heads else b
        out[dst + "self_attention.norm.gain"] = take(src + "input_layernorm.weight")
        out[dst + "feed_forward.norm.gain"] = take(src + "post_attention_layernorm.weight")
        gate, up = take(src + "mlp.gate_proj.weight").T, take(src + "mlp.up_proj.weight").T
        out[mlp + "linear_in.weight"] = np.concatenate([gate, up], axis=1)  # (d, 2 d_ff)
        out[mlp + "linear_out.weight"] = take(src + "mlp.down_proj.weight").T
        if config.bias:
            bias_in = [take(src + "mlp.gate_proj.bias"), take(src + "mlp.up_proj.bias")]
            out[mlp + "linear_in.bias"] = np.concatenate(bias_in)
            out[mlp + "linear_out.bias"] = take(src + "mlp.down_proj.bias")
    out["decoder.final_norm.gain"] = take("model.norm.weight")
    if not config.tie_output:
        out["output.weight"] = take("lm_head.weight").T  # (d, V)
    elif "lm_head.weight" in hf:
        used.add("lm_head.weight")  # tied: the same table as the embedding
    unused = sorted(hf.keys() - used)
    if unused:
        raise ValueError(f"state_dict holds tensors this config has no place for: {unused[:5]}")
    return out


def from_hf_llama(state_dict: Mapping[str, Any], config: DecoderOnlyConfig) -> DecoderOnlyLM:
    """A :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` holding a Hugging Face Llama's weights.

    The model comes back in evaluation mode; its logits equal those of the
    ``LlamaForCausalLM`` that ``state_dict`` came from, to rounding (the test
    suite compares them: ``tests/unit/models/test_hf.py``).
    """
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))  # weights replaced below
    model.load_state_dict(hf_llama_state_dict(state_dict, config))
    return model.eval()
