"""A Hugging Face ``LlamaForCausalLM``, built from a small config (nothing downloaded), in tinyformer.

Its weights go through :func:`tinyformer.models.hf.from_hf_llama` into a
``DecoderOnlyLM``; the two models' logits agree, in the adjacent rotary layout
(weights converted) and in the halves layout (weights as they are). The last tests
need no PyTorch: GPT-2- and Llama-shaped configurations and tensors go to Hugging
Face's names and back unchanged, and what neither layout expresses is named.
(Folders and files, and the comparisons with ``transformers`` both ways, are in
``test_pretrained.py``.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from small_models import llama_in_float64

from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.models.hf import (
    config_from_hf,
    config_from_hf_gpt2,
    config_from_hf_llama,
    config_to_hf,
    from_hf_llama,
    from_hf_state_dict,
    hf_layout,
    hf_llama_state_dict,
    to_hf_state_dict,
)


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def _llama(torch, transformers, *, n_kv_heads=2, bias=False, tie=False, theta=10000.0):
    torch.manual_seed(0)
    hf_config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=32,
        rms_norm_eps=1e-6,
        rope_theta=theta,
        attention_bias=bias,
        mlp_bias=bias,
        tie_word_embeddings=tie,
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    with torch.no_grad():  # norms and biases away from their initial 1 and 0: every one counts
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
    return hf_config, model


def _compare(torch, hf_model, hf_config, dtype, layout):
    config = config_from_hf_llama(hf_config.to_dict(), dtype=dtype, rotary_layout=layout)
    torch_dtype = torch.float64 if dtype == "float64" else torch.float32
    hf_model = hf_model.to(torch_dtype)
    ours = from_hf_llama(hf_model.state_dict(), config)
    ids = np.random.default_rng(1).integers(0, 64, (3, 11))
    with torch.no_grad():
        theirs = hf_model(torch.tensor(ids)).logits.numpy()
    logits = ours.forward(ids)
    assert logits.dtype == np.dtype(dtype)
    return logits, theirs, ours, ids


@pytest.mark.reference
@pytest.mark.parametrize("layout", ["adjacent", "halves"])
@pytest.mark.parametrize(
    ("n_kv_heads", "bias", "tie", "theta"),
    [(2, False, False, 10000.0), (1, True, True, 500.0), (4, False, False, 10000.0)],
    ids=["grouped", "multi-query-biases-tied", "multi-head"],
)
def test_logits_equal_hugging_face_llama(
    torch, transformers, layout, n_kv_heads, bias, tie, theta
):
    hf_config, hf_model = _llama(
        torch, transformers, n_kv_heads=n_kv_heads, bias=bias, tie=tie, theta=theta
    )
    logits32, theirs32, _, _ = _compare(torch, hf_model, hf_config, "float32", layout)
    assert np.abs(logits32 - theirs32).max() <= 1e-5 * np.abs(theirs32).max()
    logits, theirs, ours, ids = _compare(torch, hf_model, hf_config, "float64", layout)
    assert ours.config.kv_heads == n_kv_heads
    assert ours.config.rotary_base == theta
    assert (
        np.abs(logits - theirs).max() <= 1e-6 * np.abs(theirs).max()
    )  # their float32 norms and angles
    llama_in_float64(torch, hf_model)
    assert hf_model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        theirs = hf_model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(logits, theirs, rtol=1e-10, atol=1e-12)
    # cached decoding in tinyformer gives the same logits as Hugging Face's full forward
    state = ours.start(3)
    steps = [ours.step(ids[:, :5], state)] + [
        ours.step(ids[:, i : i + 1], state) for i in range(5, 11)
    ]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), theirs, rtol=1e-10, atol=1e-11)


@pytest.mark.reference
@pytest.mark.parametrize("layout", ["adjacent", "halves"])
def test_linear_rope_scaling_equals_hugging_face(torch, transformers, layout):
    """Position interpolation: Hugging Face's "linear" rope type, read and computed alike."""
    hf_config, hf_model = _llama(torch, transformers)
    scaled = transformers.LlamaConfig(
        **{
            **hf_config.to_dict(),
            "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        }
    )
    hf_scaled = transformers.LlamaForCausalLM(scaled).eval()
    hf_scaled.load_state_dict(hf_model.state_dict())
    logits, theirs, ours, _ = _compare(torch, hf_scaled, scaled, "float32", layout)
    assert ours.config.rotary_interpolation == 4.0
    assert np.abs(logits - theirs).max() <= 1e-5 * np.abs(theirs).max()
    _, theirs_plain, _, _ = _compare(torch, hf_model, hf_config, "float32", layout)
    assert np.abs(theirs - theirs_plain).max() > 1e-3 * np.abs(theirs).max()  # scaling matters


@pytest.mark.reference
def test_unconverted_rotary_layout_would_not_match(torch, transformers):
    """The conversion is needed: Hugging Face's weights, unconverted, rotated in the adjacent
    layout give other logits."""
    hf_config, hf_model = _llama(torch, transformers)
    halves = config_from_hf_llama(hf_config.to_dict(), rotary_layout="halves")
    state = hf_model.double().state_dict()
    llama_in_float64(torch, hf_model)
    assert hf_model.config._attn_implementation == "sdpa"
    wrong = DecoderOnlyLM(
        dataclasses.replace(halves, rotary_layout="adjacent"), rng=np.random.default_rng(0)
    )
    wrong.load_state_dict(hf_llama_state_dict(state, halves))  # halves-layout weights as they are
    ids = np.arange(12)[None] % 64
    with torch.no_grad():
        theirs = hf_model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(
        from_hf_llama(state, halves).forward(ids), theirs, rtol=1e-10, atol=1e-11
    )
    assert np.abs(wrong.forward(ids) - theirs).max() > 1e-3


@pytest.mark.reference
def test_state_dict_mismatches_are_named(torch, transformers):
    hf_config, hf_model = _llama(torch, transformers)
    config = config_from_hf_llama(hf_config.to_dict())
    state = dict(hf_model.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"lacks 'model.layers.1.mlp.up_proj.weight'"):
        hf_llama_state_dict(state, config)
    state = {**hf_model.state_dict(), "model.layers.2.self_attn.q_proj.weight": np.zeros((32, 32))}
    with pytest.raises(ValueError, match="no place for"):
        hf_llama_state_dict(state, config)


def test_config_errors_are_named():
    base = {
        "vocab_size": 10, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1,
        "num_attention_heads": 2, "max_position_embeddings": 8,
    }  # fmt: skip
    assert config_from_hf_llama(base).kv_heads == 2
    with pytest.raises(ValueError, match="hidden_act must be one of"):
        config_from_hf_llama({**base, "hidden_act": "tanh"})
    with pytest.raises(ValueError, match="attention_bias and mlp_bias must agree"):
        config_from_hf_llama({**base, "attention_bias": True})
    linear = config_from_hf_llama({**base, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert (linear.rotary_scaling, linear.rotary_interpolation) == ("linear", 2.0)
    # the older spelling of config.json files: "type", not "rope_type"
    with pytest.raises(ValueError, match="rotary scaling 'dynamic'"):
        config_from_hf_llama({**base, "rope_scaling": {"type": "dynamic", "factor": 4.0}})
    with pytest.raises(ValueError, match=r"factor 2\.0"):
        config_from_hf_llama({**base, "rope_scaling": {"factor": 2.0}})
    with pytest.raises(ValueError, match="sliding_window=4 is not supported"):
        config_from_hf_llama({**base, "sliding_window": 4})
    assert config_from_hf_llama({**base, "sliding_window": 8}).context_length == 8  # no effect
    with pytest.raises(ValueError, match=r"lacks \['hidden_size', 'num_hidden_layers'\]"):
        config_from_hf_llama(
            {k: v for k, v in base.items() if k not in ("hidden_size", "num_hidden_layers")}
        )
    with pytest.raises(TypeError, match="hf_config must be a mapping"):
        config_from_hf_llama(["vocab_size"])
    with pytest.raises(TypeError, match="config must be a DecoderOnlyConfig"):
        hf_llama_state_dict({}, base)


@pytest.mark.reference
def test_bfloat16_weights_load(torch, transformers):
    hf_config, hf_model = _llama(torch, transformers)
    config = config_from_hf_llama(hf_config.to_dict(), dtype="float32")
    state = {k: v.to(torch.bfloat16) for k, v in hf_model.state_dict().items()}
    model = from_hf_llama(state, config)  # the released weights are bfloat16
    wide = {k: v.to(torch.bfloat16).float() for k, v in hf_model.state_dict().items()}
    ids = np.array([[1, 5, 9, 2]])
    np.testing.assert_array_equal(model.forward(ids), from_hf_llama(wide, config).forward(ids))


# ---------------------------------------------- both layouts, both directions (no files)

GPT2_SHAPED = {"activation": "gelu_tanh"}
LLAMA_SHAPED = {
    "norm": "rmsnorm", "feed_forward": "gated", "activation": "silu", "positional": "rotary",
    "bias": False, "tie_output": False, "n_kv_heads": 2,
}  # fmt: skip


@pytest.mark.parametrize(
    ("options", "layout"),
    [
        (GPT2_SHAPED, "gpt2"),
        ({**GPT2_SHAPED, "attention_scale": "none", "tie_output": False, "dropout": 0.2}, "gpt2"),
        (LLAMA_SHAPED, "llama"),
        ({**LLAMA_SHAPED, "rotary_layout": "halves", "bias": True, "tie_output": True}, "llama"),
        ({**LLAMA_SHAPED, "rotary_scaling": "linear", "rotary_scaling_factor": 2.0}, "llama"),
    ],
)
def test_config_and_tensors_go_to_hugging_face_and_back(options, layout):
    config = DecoderOnlyConfig(50, d_model=16, n_heads=4, d_ff=24, n_layers=2, **options)
    assert hf_layout(config) == layout
    hf_config = config_to_hf(config)
    assert hf_config["model_type"] == layout
    assert config_from_hf(hf_config) == config
    state = DecoderOnlyLM(config, rng=np.random.default_rng(0)).state_dict()
    theirs = to_hf_state_dict(state, config)
    assert ("lm_head.weight" in theirs) is not config.tie_output  # tied: left out
    back = from_hf_state_dict(theirs, config)
    assert back.keys() == state.keys()
    for name, value in state.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_layout_refusals_name_every_option_in_the_way():
    post_norm = DecoderOnlyConfig(50, norm_first=False, positional="sinusoidal")
    with pytest.raises(ValueError, match="no Hugging Face layout") as caught:
        hf_layout(post_norm)
    message = str(caught.value)
    # the nearer layout first, then the other, each with all that is in its way
    assert message.index("as GPT-2") < message.index("as Llama")
    for said in ("norm_first=False", "positional='sinusoidal'", "norm='layernorm' (Llama"):
        assert said in message
    with pytest.raises(TypeError, match="config must be a DecoderOnlyConfig"):
        hf_layout({"model_type": "gpt2"})
    gpt2 = config_from_hf_gpt2(
        {"vocab_size": 9, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 4}
    )
    assert (gpt2.d_ff, gpt2.activation, gpt2.dropout, gpt2.tie_output) == (
        32,
        "gelu_tanh",
        0.1,
        True,
    )
    with pytest.raises(ValueError, match=r"lacks \['n_positions'\]"):
        config_from_hf_gpt2({"vocab_size": 9, "n_embd": 8, "n_layer": 1, "n_head": 2})
    with pytest.raises(ValueError, match="add_cross_attention=True is not supported"):
        config_from_hf_gpt2({**config_to_hf(gpt2), "add_cross_attention": True})
    with pytest.raises(ValueError, match=r"hf_config lacks"):
        config_from_hf({"model_type": "llama"})
    llama = DecoderOnlyConfig(50, **LLAMA_SHAPED)
    ours = DecoderOnlyLM(llama, rng=np.random.default_rng(0)).state_dict()
    with pytest.raises(ValueError, match="config must describe a Llama-shaped model"):
        hf_llama_state_dict(to_hf_state_dict(ours, llama), DecoderOnlyConfig(50))
    del ours["output.weight"]
    with pytest.raises(ValueError, match=r"missing \['output.weight'\], extra \[\]"):
        to_hf_state_dict(ours, llama)
