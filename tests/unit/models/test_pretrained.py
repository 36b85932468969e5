"""Hugging Face checkpoint folders: tinyformer writes them, reads them, and ``transformers`` agrees.

The first half needs only ``safetensors``: a model saved and read back is the same
model bit for bit, the files hold what ``transformers`` writes, and every model,
folder or argument that cannot be exchanged is refused by name with nothing written.
The reference tests (PyTorch and ``transformers``, models built from configs, nothing
downloaded) go both ways in float64: tinyformer saves and ``AutoModelForCausalLM``
loads, ``transformers`` saves and :func:`from_pretrained` loads; the logits agree to
1e-12 of their scale and, after a few training steps, greedy decoding picks the
same tokens.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from small_models import llama_in_float64, perturb

from tinyformer.generation import greedy
from tinyformer.lora import apply_lora, merge_lora
from tinyformer.losses import cross_entropy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.models.pretrained import from_pretrained, save_pretrained
from tinyformer.optim import AdamW

safetensors_numpy = pytest.importorskip("safetensors.numpy")

GPT2 = {"activation": "gelu_tanh"}
LLAMA = {
    "norm": "rmsnorm",
    "feed_forward": "gated",
    "activation": "silu",
    "positional": "rotary",
    "bias": False,
    "tie_output": False,
}
CASES = {
    "gpt2": GPT2,
    "gpt2-untied-relu-unscaled": {
        "activation": "relu",
        "tie_output": False,
        "attention_scale": "none",
    },
    "gpt2-float32-dropout": {**GPT2, "dtype": "float32", "dropout": 0.1, "activation": "gelu"},
    "llama-gqa-adjacent": {**LLAMA, "n_kv_heads": 2},
    "llama-halves-tied-biases": {
        **LLAMA,
        "rotary_layout": "halves",
        "tie_output": True,
        "bias": True,
    },
    "llama-linear-scaling-float32": {
        **LLAMA,
        "n_kv_heads": 1,
        "rotary_scaling": "linear",
        "rotary_scaling_factor": 4.0,
        "rotary_base": 500.0,
        "activation": "gelu_tanh",
        "dtype": "float32",
    },
}
IDS = np.random.default_rng(1).integers(0, 61, (2, 9))


def _model(seed: int = 0, **options) -> DecoderOnlyLM:
    """A tiny model with every parameter away from its initial value (gains, biases)."""
    sizes = {"d_model": 16, "n_heads": 4, "d_ff": 24, "n_layers": 2, "context_length": 24}
    config = DecoderOnlyConfig(61, **{**sizes, **options})
    return perturb(DecoderOnlyLM(config, rng=np.random.default_rng(seed)), seed + 1, 0.2)


def _names(folder) -> dict[str, tuple[int, ...]]:
    return {
        k: v.shape for k, v in safetensors_numpy.load_file(folder / "model.safetensors").items()
    }


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_round_trip_is_the_same_model_bit_for_bit(tmp_path, options):
    model = _model(**options)
    assert save_pretrained(model, tmp_path / "ckpt") == tmp_path / "ckpt"
    back = from_pretrained(tmp_path / "ckpt")
    assert back.config == model.config  # dropout, layout, dtype and all
    assert not back.training
    state = back.state_dict()
    assert state.keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        assert state[name].dtype == value.dtype
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    np.testing.assert_array_equal(back.forward(IDS), model.eval().forward(IDS))


def test_files_hold_what_transformers_writes(tmp_path):
    """Names and shapes as GPT2LMHeadModel.save_pretrained writes them (read off its files)."""
    save_pretrained(_model(n_layers=1, **GPT2), tmp_path / "g")
    layer = {
        "ln_1.weight": (16,), "ln_1.bias": (16,), "ln_2.weight": (16,), "ln_2.bias": (16,),
        "attn.c_attn.weight": (16, 48), "attn.c_attn.bias": (48,),
        "attn.c_proj.weight": (16, 16), "attn.c_proj.bias": (16,),
        "mlp.c_fc.weight": (16, 24), "mlp.c_fc.bias": (24,),
        "mlp.c_proj.weight": (24, 16), "mlp.c_proj.bias": (16,),
    }  # fmt: skip
    expected = {f"transformer.h.0.{k}": v for k, v in layer.items()} | {
        "transformer.wte.weight": (61, 16),
        "transformer.wpe.weight": (24, 16),
        "transformer.ln_f.weight": (16,),
        "transformer.ln_f.bias": (16,),
    }
    assert _names(tmp_path / "g") == expected  # tied: no lm_head.weight
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["model_type"] == "gpt2"
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert config["activation_function"] == "gelu_new"
    assert (config["n_embd"], config["n_inner"], config["n_positions"]) == (16, 24, 24)
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (0, 1, 2)
    assert config["dtype"] == config["torch_dtype"] == "float64"

    save_pretrained(_model(n_layers=1, n_kv_heads=2, **LLAMA), tmp_path / "l")
    layer = {
        "input_layernorm.weight": (16,), "post_attention_layernorm.weight": (16,),
        "self_attn.q_proj.weight": (16, 16), "self_attn.k_proj.weight": (8, 16),
        "self_attn.v_proj.weight": (8, 16), "self_attn.o_proj.weight": (16, 16),
        "mlp.gate_proj.weight": (24, 16), "mlp.up_proj.weight": (24, 16),
        "mlp.down_proj.weight": (16, 24),
    }  # fmt: skip
    expected = {f"model.layers.0.{k}": v for k, v in layer.items()} | {
        "model.embed_tokens.weight": (61, 16),
        "model.norm.weight": (16,),
        "lm_head.weight": (61, 16),  # untied: (out, in), as nn.Linear stores it
    }
    assert _names(tmp_path / "l") == expected
    config = json.loads((tmp_path / "l" / "config.json").read_text())
    assert (config["num_key_value_heads"], config["head_dim"], config["hidden_act"]) == (
        2,
        4,
        "silu",
    )
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}


def test_weights_are_transposed_split_and_joined(tmp_path):
    """The conventions, one tensor each: c_attn is q, k, v side by side; nn.Linear is (out, in)."""
    gpt2 = _model(**GPT2)
    save_pretrained(gpt2, tmp_path / "g")
    tensors = safetensors_numpy.load_file(tmp_path / "g" / "model.safetensors")
    attention = gpt2.decoder.layers[1].self_attention.layer
    q, k, v = (getattr(attention, f"{p}_proj").weight.value for p in "qkv")
    np.testing.assert_array_equal(
        tensors["transformer.h.1.attn.c_attn.weight"], np.hstack([q, k, v])
    )
    llama = _model(**{**LLAMA, "rotary_layout": "halves"})
    save_pretrained(llama, tmp_path / "l")
    tensors = safetensors_numpy.load_file(tmp_path / "l" / "model.safetensors")
    ffn = llama.decoder.layers[0].feed_forward.layer
    gate, up = np.split(ffn.linear_in.weight.value, 2, axis=1)
    np.testing.assert_array_equal(tensors["model.layers.0.mlp.gate_proj.weight"], gate.T)
    np.testing.assert_array_equal(tensors["model.layers.0.mlp.up_proj.weight"], up.T)
    np.testing.assert_array_equal(tensors["lm_head.weight"], llama.output.weight.value.T)
    q = llama.decoder.layers[0].self_attention.layer.q_proj.weight.value
    np.testing.assert_array_equal(tensors["model.layers.0.self_attn.q_proj.weight"], q.T)
    # the adjacent layout is stored as halves: the same numbers, reordered within each head
    adjacent = _model(**LLAMA)
    save_pretrained(adjacent, tmp_path / "a")
    stored = safetensors_numpy.load_file(tmp_path / "a" / "model.safetensors")
    q = adjacent.decoder.layers[0].self_attention.layer.q_proj.weight.value
    written = stored["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(written, q.T)
    np.testing.assert_array_equal(np.sort(written, axis=None), np.sort(q, axis=None))
    assert json.loads((tmp_path / "a" / "config.json").read_text())["tinyformer"] == {
        "rotary_layout": "adjacent"
    }
    as_halves = from_pretrained(tmp_path / "a", rotary_layout="halves")
    np.testing.assert_allclose(
        as_halves.forward(IDS), adjacent.forward(IDS), rtol=1e-12, atol=1e-13
    )


def test_merged_lora_is_saved_as_its_merged_weights(tmp_path):
    model = _model(**GPT2)
    apply_lora(model, 2, 4.0, rng=np.random.default_rng(5))
    for name, p in model.named_parameters():
        if name.endswith("lora_B"):
            p.value[...] = np.random.default_rng(6).standard_normal(p.shape)  # not zero
    with pytest.raises(ValueError, match=r"LoRA layers that are not merged: \['decoder\.layers"):
        save_pretrained(model, tmp_path / "unmerged")
    assert not (tmp_path / "unmerged").exists()
    merge_lora(model)
    save_pretrained(model, tmp_path / "merged")
    back = from_pretrained(tmp_path / "merged")
    np.testing.assert_array_equal(back.forward(IDS), model.eval().forward(IDS))


# ------------------------------------------------------------------ refusals

REFUSED = {
    "post-norm": ({**GPT2, "norm_first": False}, r"norm_first=False \(GPT-2 needs True"),
    "sinusoidal": ({**GPT2, "positional": "sinusoidal"}, r"positional='sinusoidal' \(GPT-2"),
    "no positions": ({**GPT2, "positional": "none"}, r"positional='none'"),
    "scaled embeddings": ({**LLAMA, "scale_embeddings": True}, "scale_embeddings=True"),
    "mixture of experts": ({**LLAMA, "feed_forward": "moe", "n_experts": 2}, "feed_forward='moe'"),
    "gpt2 with rotary": ({**GPT2, "positional": "rotary"}, r"positional='rotary' \(GPT-2 needs"),
    "gpt2 with grouped heads": ({**GPT2, "n_kv_heads": 2}, r"n_kv_heads=2 \(GPT-2 needs 4"),
    "gpt2 without biases": ({**GPT2, "bias": False}, r"bias=False \(GPT-2 needs True"),
    "llama unscaled": ({**LLAMA, "attention_scale": "none"}, r"attention_scale='none' \(Llama"),
    "ntk scaling": (
        {**LLAMA, "rotary_scaling": "ntk", "rotary_scaling_factor": 2.0},
        r"rotary_scaling='ntk' \(Llama needs None or 'linear'",
    ),
    "rmsnorm with learned positions": ({**GPT2, "norm": "rmsnorm"}, r"norm='rmsnorm' \(GPT-2"),
}


@pytest.mark.parametrize(("options", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_what_neither_layout_expresses_is_refused_by_name(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        save_pretrained(_model(**options), tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []  # not even a half folder


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    model = _model(**GPT2)
    with pytest.raises(TypeError, match="model must be a DecoderOnlyLM"):
        save_pretrained(model.decoder, tmp_path / "x")
    with pytest.raises(TypeError, match="folder must be a str or path-like"):
        save_pretrained(model, 3)
    with pytest.raises(TypeError, match=r"tokenizer must have a to_hf_json\(\) method"):
        save_pretrained(model, tmp_path / "x", tokenizer="abc")
    with pytest.raises(
        ValueError, match="tokenizer has 90 tokens but the model's vocab_size is 61"
    ):
        save_pretrained(model, tmp_path / "x", tokenizer=_Tokenizer(90))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="folder must be a directory"):
        save_pretrained(model, tmp_path / "file")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds another checkpoint's weights \(\['pytorch_model"):
        save_pretrained(model, tmp_path / "old")
    gain = model.decoder.final_norm.gain
    gain.value = gain.value.astype(np.float16)  # a half-precision parameter: no layout for it
    with pytest.raises(
        ValueError, match=r"must be float64 .*'decoder.final_norm.gain': 'float16'"
    ):
        save_pretrained(model, tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "old"]


def test_a_save_that_fails_midway_leaves_nothing(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors_numpy, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(_model(**GPT2), tmp_path / "ckpt", tokenizer=_Tokenizer(20))
    assert list(tmp_path.iterdir()) == []


def test_saving_into_an_existing_folder_replaces_our_files_and_keeps_others(tmp_path):
    folder = tmp_path / "ckpt"
    save_pretrained(_model(**GPT2), folder)
    (folder / "README.md").write_text("notes")
    second = _model(seed=3, **GPT2)
    save_pretrained(second, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no staging folder left
    assert (folder / "README.md").read_text() == "notes"
    np.testing.assert_array_equal(from_pretrained(folder).forward(IDS), second.eval().forward(IDS))


class _Tokenizer:
    """Stands for a tokenizer: what save_pretrained needs of one."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def to_hf_json(self) -> dict:
        return {
            "version": "1.0",
            "model": {"type": "BPE", "vocab": {"é": 4}},
            "n": self.vocab_size,
        }


def test_tokenizer_json_is_to_hf_json(tmp_path):
    save_pretrained(_model(**GPT2), tmp_path / "ckpt", tokenizer=_Tokenizer(50))
    written = json.loads((tmp_path / "ckpt" / "tokenizer.json").read_text(encoding="utf-8"))
    assert written == _Tokenizer(50).to_hf_json()


def test_tinyformer_tokenizer_json_is_written(tmp_path):
    from tinyformer.data.tokenizers import BPETokenizer  # noqa: PLC0415

    tokenizer = BPETokenizer.train(["the cat sat on the mat", "the dog"], vocab_size=30)
    save_pretrained(_model(**GPT2), tmp_path / "ckpt", tokenizer=tokenizer)
    written = json.loads((tmp_path / "ckpt" / "tokenizer.json").read_text(encoding="utf-8"))
    assert written == json.loads(json.dumps(tokenizer.to_hf_json()))
    config = json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text("utf-8"))
    assert (config["eos_token"], config["pad_token"]) == ("<eos>", "<pad>")


@pytest.mark.reference
def test_transformers_autotokenizer_reads_the_saved_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tinyformer.data.tokenizers import BPETokenizer  # noqa: PLC0415

    text = ["the cat sat on the mat", "naïve café, the dog 🐕 ran"] * 5
    tokenizer = BPETokenizer.train(
        text, vocab_size=290, pretokenize="bytes",
        special_tokens=("<|pad|>", "<|bos|>", "<|endoftext|>", "<|unk|>"),
    )  # fmt: skip
    config = DecoderOnlyConfig(tokenizer.vocab_size, d_model=8, n_heads=2, d_ff=16, **GPT2)
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    save_pretrained(model, tmp_path / "ckpt", tokenizer=tokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    held_out = "the café sat 🐕 on a naïve mat"
    assert theirs(held_out)["input_ids"] == tokenizer.encode(held_out).tolist()
    assert theirs.decode(theirs(held_out)["input_ids"]) == held_out
    roles = (theirs.pad_token_id, theirs.bos_token_id, theirs.eos_token_id, theirs.unk_token_id)
    assert roles == (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id)
    assert theirs.eos_token == "<|endoftext|>"


def test_without_safetensors_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install 'tinyformer\[hf\]'"):
        save_pretrained(_model(**GPT2), tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ reading


def test_reading_refuses_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        from_pretrained(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        from_pretrained(tmp_path)
    folder = tmp_path / "ckpt"
    save_pretrained(_model(**GPT2), folder)
    with pytest.raises(
        ValueError, match="dtype must be one of 'float32', 'float64', got 'float16'"
    ):
        from_pretrained(folder, dtype="float16")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(ValueError, match=r"model_type must be one of \['gpt2', 'llama'\].*'bert'"):
        from_pretrained(folder)
    for key, value, message in [
        ("activation_function", "gelu_fast", "activation_function must be one of"),
        ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx=True"),
        ("attn_pdrop", 0.3, "the dropout probabilities .* differ"),
    ]:
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(ValueError, match=message):
            from_pretrained(folder)
    assert from_pretrained(folder, dropout=0.05).config.dropout == 0.05  # the way out
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"holds \['pytorch_model.bin'\]: only safetensors"):
        from_pretrained(folder)
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no model\.safetensors"):
        from_pretrained(folder)


def test_tensors_that_do_not_fit_are_named(tmp_path):
    folder = tmp_path / "ckpt"
    save_pretrained(_model(**GPT2), folder)
    tensors = safetensors_numpy.load_file(folder / "model.safetensors")
    missing = {k: v for k, v in tensors.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    safetensors_numpy.save_file(missing, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"lacks 'transformer.h.1.mlp.c_fc.bias'"):
        from_pretrained(folder)
    extra = {**tensors, "transformer.h.2.ln_1.weight": np.ones(16)}
    safetensors_numpy.save_file(extra, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"no place for: \['transformer.h.2.ln_1.weight'\]"):
        from_pretrained(folder)
    mixed = {
        **tensors,
        "transformer.ln_f.bias": tensors["transformer.ln_f.bias"].astype(np.float32),
    }
    safetensors_numpy.save_file(mixed, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"mixes tensor dtypes \['float32', 'float64'\]"):
        from_pretrained(folder)
    assert from_pretrained(folder, dtype="float64").dtype == np.float64


def test_dtypes_kept_widened_or_chosen(tmp_path):
    model = _model(**{**GPT2, "dtype": "float32"})
    save_pretrained(model, tmp_path / "f32")
    assert from_pretrained(tmp_path / "f32").dtype == np.float32
    wide = from_pretrained(tmp_path / "f32", dtype="float64")
    assert wide.dtype == np.float64
    np.testing.assert_array_equal(
        wide.decoder.embedding.weight.value, model.decoder.embedding.weight.value
    )
    half = {
        k: v.astype(np.float16)
        for k, v in safetensors_numpy.load_file(tmp_path / "f32" / "model.safetensors").items()
    }
    safetensors_numpy.save_file(half, tmp_path / "f32" / "model.safetensors")
    widened = from_pretrained(tmp_path / "f32")  # float16 in the file: float32 in the model
    assert widened.dtype == np.float32
    np.testing.assert_array_equal(
        widened.decoder.positions.weight.value, half["transformer.wpe.weight"].astype(np.float32)
    )


def test_base_model_names_and_old_buffers_are_read(tmp_path):
    """Files saved from GPT2Model name tensors without "transformer." and may hold mask buffers."""
    model = _model(**GPT2)
    save_pretrained(model, tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "model.safetensors"
    tensors = safetensors_numpy.load_file(path)
    bare = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 24, 24)))
    bare["h.0.attn.masked_bias"] = np.array(-1e4)
    safetensors_numpy.save_file(bare, path)
    np.testing.assert_array_equal(
        from_pretrained(tmp_path / "ckpt").forward(IDS), model.forward(IDS)
    )


# ------------------------------------------------------------------ against transformers


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def _hf_logits(torch, hf_model, ids):
    if hf_model.config.model_type == "llama":
        llama_in_float64(torch, hf_model)
    with torch.no_grad():
        return hf_model(torch.tensor(ids)).logits.numpy()


def _relative(ours, theirs) -> float:
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


REFERENCE = {k: CASES[k] for k in ("gpt2", "gpt2-untied-relu-unscaled", "llama-gqa-adjacent")} | {
    "llama-halves-tied-biases": CASES["llama-halves-tied-biases"],
    "llama-linear-scaling": {**CASES["llama-linear-scaling-float32"], "dtype": "float64"},
}
MEASURED: dict[str, float] = {}


@pytest.mark.reference
@pytest.mark.parametrize("options", REFERENCE.values(), ids=REFERENCE.keys())
def test_transformers_loads_what_tinyformer_saves(torch, transformers, tmp_path, options):
    model = _model(**options).eval()
    save_pretrained(model, tmp_path / "ckpt")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    layout = "GPT2LMHeadModel" if options.get("norm") != "rmsnorm" else "LlamaForCausalLM"
    assert type(hf_model).__name__ == layout
    assert hf_model.dtype == torch.float64
    ids = np.random.default_rng(2).integers(0, 61, (3, 24))  # the whole context
    ours, theirs = model.forward(ids), _hf_logits(torch, hf_model, ids)
    assert _relative(ours, theirs) <= 1e-12
    # and back: the folder transformers writes is the model we started from, bit for bit
    hf_model.save_pretrained(tmp_path / "again")
    back = from_pretrained(tmp_path / "again")
    assert back.config == model.config
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[name], value, err_msg=name)


def _hf_model(torch, transformers, kind: str, *, tie: bool, seed: int = 0):
    """A float64 GPT-2 or Llama built from a config, norms and biases away from 1 and 0."""
    torch.manual_seed(seed)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=61, n_positions=24, n_embd=16, n_layer=2, n_head=4, n_inner=24,
            activation_function="gelu_new", tie_word_embeddings=tie, bos_token_id=1,
            eos_token_id=2, pad_token_id=0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=24,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
            attention_bias=tie, mlp_bias=tie, tie_word_embeddings=tie, pad_token_id=0,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(torch.randn_like(p))
    return model


HF_CASES = {
    "gpt2-tied": ("gpt2", True, "adjacent"),
    "gpt2-untied": ("gpt2", False, "adjacent"),
    "llama-untied-adjacent": ("llama", False, "adjacent"),
    "llama-untied-halves": ("llama", False, "halves"),
    "llama-tied-biases-adjacent": ("llama", True, "adjacent"),
    "llama-tied-biases-halves": ("llama", True, "halves"),
}


@pytest.mark.reference
@pytest.mark.parametrize(("kind", "tie", "layout"), HF_CASES.values(), ids=HF_CASES.keys())
def test_tinyformer_loads_what_transformers_saves(
    torch, transformers, tmp_path, kind, tie, layout
):
    """GPT-2 and Llama (grouped-query heads, linear rotary scaling) as transformers saves them."""
    hf_model = _hf_model(torch, transformers, kind, tie=tie)
    hf_model.save_pretrained(tmp_path / "ckpt")
    model = from_pretrained(tmp_path / "ckpt", rotary_layout=layout)
    assert model.dtype == np.float64
    assert model.config.tie_output is tie
    assert model.config.rotary_layout == ("adjacent" if kind == "gpt2" else layout)
    ids = np.random.default_rng(3).integers(0, 61, (3, 24))
    ours, theirs = model.forward(ids), _hf_logits(torch, hf_model, ids)
    assert _relative(ours, theirs) <= 1e-12


def _train(model: DecoderOnlyLM, steps: int = 8) -> DecoderOnlyLM:
    """A few AdamW steps on a tiny random batch, so that the weights are not at their init."""
    batch = np.random.default_rng(7).integers(3, 61, (4, 17))
    optimizer = AdamW(model.parameters(), lr=3e-2)
    model.train()
    losses = []
    for _ in range(steps):
        model.zero_grad()
        loss, grad = cross_entropy(model.forward(batch[:, :-1]), batch[:, 1:])
        model.backward(grad)
        optimizer.step()
        losses.append(loss)
    assert losses[-1] < losses[0] - 0.5  # it learned something
    return model.eval()


def _hf_greedy(torch, hf_model, prompts, n):
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor(prompts), max_new_tokens=n, do_sample=False, eos_token_id=None,
            pad_token_id=0, attention_mask=torch.ones(prompts.shape, dtype=torch.long),
        )  # fmt: skip
    return out[:, prompts.shape[1] :].numpy()


PROMPTS = np.array([[5, 9, 11], [40, 3, 17]])


@pytest.mark.reference
@pytest.mark.parametrize("options", [GPT2, {**LLAMA, "n_kv_heads": 2}], ids=["gpt2", "llama"])
def test_greedy_tokens_equal_after_training_tinyformer_to_transformers(
    torch, transformers, tmp_path, options
):
    model = _train(_model(dropout=0.1, **options))
    save_pretrained(model, tmp_path / "ckpt")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    if options.get("norm") == "rmsnorm":
        llama_in_float64(torch, hf_model)
    ours = np.stack(greedy(model, PROMPTS, max_new_tokens=20, eos_id=None).tokens)
    theirs = _hf_greedy(torch, hf_model, PROMPTS, 20)
    np.testing.assert_array_equal(ours, theirs)
    assert len(set(ours.ravel().tolist())) > 3  # not one token repeated


@pytest.mark.reference
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_tokens_equal_after_training_transformers_to_tinyformer(
    torch, transformers, tmp_path, kind
):
    hf_model = _hf_model(torch, transformers, kind, tie=False)
    batch = torch.tensor(np.random.default_rng(8).integers(3, 61, (4, 17)))
    optimizer = torch.optim.AdamW(hf_model.parameters(), lr=3e-2)
    hf_model.train()
    for _ in range(8):
        optimizer.zero_grad()
        hf_model(batch, labels=batch).loss.backward()
        optimizer.step()
    hf_model.eval()
    hf_model.save_pretrained(tmp_path / "ckpt")
    model = from_pretrained(tmp_path / "ckpt")
    if kind == "llama":
        llama_in_float64(torch, hf_model)
    ours = np.stack(greedy(model, PROMPTS, max_new_tokens=20, eos_id=None).tokens)
    np.testing.assert_array_equal(ours, _hf_greedy(torch, hf_model, PROMPTS, 20))


@pytest.mark.reference
def test_bfloat16_and_sharded_checkpoints_are_read(torch, transformers, tmp_path):
    hf_model = _hf_model(torch, transformers, "llama", tie=False)
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = from_pretrained(tmp_path / "bf16")
    assert model.dtype == np.float32  # widened, exactly
    embedding = hf_model.model.embed_tokens.weight.detach().float().numpy()
    np.testing.assert_array_equal(model.decoder.embedding.weight.value, embedding)
    hf_model = _hf_model(torch, transformers, "gpt2", tie=True)
    hf_model.save_pretrained(tmp_path / "sharded", max_shard_size="8KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    model = from_pretrained(tmp_path / "sharded")
    ids = np.random.default_rng(4).integers(0, 61, (2, 10))
    assert _relative(model.forward(ids), _hf_logits(torch, hf_model, ids)) <= 1e-12


class _RolesTokenizer(_Tokenizer):
    """A stand-in whose special tokens sit where a Hugging Face file put them."""

    tokens = ("<|endoftext|>", "!", '"', "#", *(f"t{i}" for i in range(46)))
    pad_id, bos_id, eos_id, unk_id = None, 0, 0, None


def test_config_and_tokenizer_config_take_the_tokenizers_special_ids(tmp_path):
    save_pretrained(_model(**GPT2), tmp_path / "ckpt", tokenizer=_RolesTokenizer(50))
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text(encoding="utf-8"))
    ids = (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"])
    assert ids == (None, 0, 0)
    roles = json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text("utf-8"))
    assert (roles["bos_token"], roles["eos_token"]) == ("<|endoftext|>", "<|endoftext|>")
    assert "pad_token" not in roles
    assert "unk_token" not in roles
    # without a tokenizer the ids are those of tinyformer's own layout
    save_pretrained(_model(**GPT2), tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text(encoding="utf-8"))
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (0, 1, 2)


def test_a_tied_config_with_a_different_lm_head_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    save_pretrained(_model(**GPT2), folder)
    tensors = safetensors_numpy.load_file(folder / "model.safetensors")
    copy = {**tensors, "lm_head.weight": tensors["transformer.wte.weight"].copy()}
    safetensors_numpy.save_file(copy, folder / "model.safetensors", metadata={"format": "pt"})
    from_pretrained(folder)  # an exact copy of the embedding is accepted
    copy["lm_head.weight"] = copy["lm_head.weight"] + 1.0
    safetensors_numpy.save_file(copy, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="tie_word_embeddings=true, but the checkpoint's"):
        from_pretrained(folder)


def test_a_linear_rope_factor_below_one_and_a_bad_dtype_are_refused(tmp_path):
    shrunk = _model(**{**LLAMA, "rotary_scaling": "linear", "rotary_scaling_factor": 0.5})
    with pytest.raises(ValueError, match=r"rotary_scaling_factor=0\.5"):
        save_pretrained(shrunk, tmp_path / "ckpt")
    save_pretrained(_model(**GPT2), tmp_path / "ok")
    with pytest.raises(TypeError, match=r"dtype must be one of .* got int 3"):
        from_pretrained(tmp_path / "ok", dtype=3)
