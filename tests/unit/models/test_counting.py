"""The closed-form parameter count: equal to the built model's for every option, and to
the published sizes of GPT-2, the original Transformer, BERT, Llama 2 and Mistral 7B."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from small_models import OPTIONS, decoder_only, encoder_decoder, encoder_only

from tinyformer.feedforward import FeedForward
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
    parameter_count,
    parameter_terms,
    published_sizes,
)
from tinyformer.models.counting import (
    attention_parameters,
    bert_extra_terms,
    bert_sizes,
    block_forward_flops,
    feed_forward_parameters,
    gated_d_ff,
    gated_feed_forward_parameters,
    gpt2_config,
    kv_cache_bytes_per_token,
    llama2_config,
    mistral_7b_config,
    modern_sizes,
    transformer_config,
)
from tinyformer.models.encoder_only import EncoderOnlyConfig, EncoderOnlyMLM
from tinyformer.multihead import MultiHeadAttention


@st.composite
def widths(draw) -> dict:
    n_heads = draw(st.integers(1, 3))
    head_size = draw(st.sampled_from([2, 4]))  # even: every positional scheme applies
    return {"d_model": n_heads * head_size, "n_heads": n_heads, "d_ff": draw(st.integers(1, 9))}


@given(
    sizes=widths(),
    src=st.integers(1, 9),
    tgt=st.integers(1, 9),
    layers=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    context_length=st.integers(1, 8),
    norm_first=st.booleans(),
    positional=st.sampled_from(["sinusoidal", "learned", "rotary", "none"]),
    share=st.booleans(),
    tie=st.booleans(),
    scale=st.booleans(),
)
def test_formula_equals_encoder_decoder_model(
    sizes, src, tgt, layers, context_length, norm_first, positional, share, tie, scale
):
    config = EncoderDecoderConfig(
        src_vocab_size=src,
        tgt_vocab_size=src if share else tgt,
        n_encoder_layers=layers[0],
        n_decoder_layers=layers[1],
        context_length=context_length,
        norm_first=norm_first,
        positional=positional,
        share_embeddings=share,
        tie_output=tie,
        scale_embeddings=scale,
        **sizes,
    )
    model = EncoderDecoder(config, rng=np.random.default_rng(0))
    assert parameter_count(config) == model.num_parameters()
    assert parameter_count(config) == sum(v.size for v in model.state_dict().values())


@given(
    sizes=widths(),
    vocab=st.integers(1, 9),
    n_layers=st.integers(1, 3),
    context=st.integers(1, 8),
    norm_first=st.booleans(),
    positional=st.sampled_from(["learned", "sinusoidal", "rotary", "none"]),
    tie=st.booleans(),
    activation=st.sampled_from(["relu", "gelu", "gelu_tanh", "silu"]),
)
def test_formula_equals_decoder_only_model(
    sizes, vocab, n_layers, context, norm_first, positional, tie, activation
):
    config = DecoderOnlyConfig(
        vocab_size=vocab,
        n_layers=n_layers,
        context_length=context,
        norm_first=norm_first,
        positional=positional,
        tie_output=tie,
        activation=activation,
        **sizes,
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    assert parameter_count(config) == model.num_parameters()


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize(
    "make",
    [decoder_only, encoder_decoder, encoder_only],
    ids=["decoder-only", "encoder-decoder", "encoder-only"],
)
def test_formula_equals_the_model_for_every_option(make, name):
    model = make(**OPTIONS[name])
    assert parameter_count(model.config) == model.num_parameters()
    assert sum(parameter_terms(model.config).values()) == model.num_parameters()


def test_terms_are_named_and_zero_where_absent():
    config = EncoderDecoderConfig(src_vocab_size=10, tgt_vocab_size=10, share_embeddings=True)
    terms = parameter_terms(config)
    assert terms["target embedding"] == 0
    assert terms["output projection"] == 0
    assert terms["source positions"] == terms["target positions"] == 0
    assert terms["final norms"] == 0
    d, d_ff = 64, 256
    assert terms["encoder blocks"] == 2 * (4 * (d * d + d) + 2 * d * d_ff + d_ff + d + 4 * d)
    untied = parameter_terms(DecoderOnlyConfig(vocab_size=7, tie_output=False, d_model=8))
    assert untied["output projection"] == 7 * 8
    assert untied["final norm"] == 16
    assert untied["positions"] == 64 * 8
    assert sum(untied.values()) == parameter_count(
        DecoderOnlyConfig(vocab_size=7, tie_output=False, d_model=8)
    )


def test_parameter_count_refuses_other_objects():
    with pytest.raises(TypeError, match="config must be an EncoderDecoderConfig or a DecoderOnly"):
        parameter_count({"vocab_size": 3})


@pytest.mark.parametrize(
    ("d_model", "n_layers", "n_heads", "released"),
    [
        (768, 12, 12, 124_439_808),
        (1024, 24, 16, 354_823_168),
        (1280, 36, 20, 774_030_080),
        (1600, 48, 25, 1_557_611_200),
    ],
    ids=["small", "medium", "large", "xl"],
)
def test_gpt2_sizes_are_exact(d_model, n_layers, n_heads, released):
    """The released GPT-2 checkpoints' parameter counts, to the last parameter."""
    assert parameter_count(gpt2_config(d_model, n_layers, n_heads)) == released


def test_transformer_sizes_are_close_to_the_paper():
    """Vaswani et al. report 65M (base) and 213M (big) for a vocabulary of "about 37000".

    The formula gives 63.08M and 214.25M. Base is 3.0% below the paper (the
    size of about 3,700 more vocabulary rows), so the tolerance is 5% for
    base and 1% for big.
    """
    base = parameter_count(transformer_config(512, 8, 2048))
    big = parameter_count(transformer_config(1024, 16, 4096))
    # The same sums written out: shared table + 6 encoder + 6 decoder blocks.
    for total, d, d_ff in ((base, 512, 2048), (big, 1024, 4096)):
        attention, ffn, norm = 4 * d * d + 4 * d, 2 * d * d_ff + d_ff + d, 2 * d
        assert total == 37000 * d + 6 * (attention + ffn + 2 * norm) + 6 * (
            2 * attention + ffn + 3 * norm
        )
    assert abs(base - 65e6) / 65e6 < 0.05
    assert abs(big - 213e6) / 213e6 < 0.01
    assert round(base / 1e5) == 631
    assert round(big / 1e5) == 2142


def test_published_sizes_table():
    rows = {row.name: row for row in published_sizes()}
    assert list(rows) == [
        "GPT-2 small",
        "GPT-2 medium",
        "GPT-2 large",
        "GPT-2 XL",
        "Transformer base",
        "Transformer big",
    ]
    for row in rows.values():
        if row.released is not None:
            assert row.formula == row.released
            assert row.reported < row.released  # the paper's table is lower, not a rounding
    assert rows["GPT-2 small"].reported == 117_000_000
    assert rows["Transformer big"].released is None


# ------------------------------------------------ feed-forward sub-layers and their cost
@given(d_model=st.integers(1, 12), d_ff=st.integers(1, 12), bias=st.booleans())
def test_feed_forward_counts_equal_built_layers(d_model, d_ff, bias):
    rng = np.random.default_rng(0)
    plain = FeedForward(d_model, d_ff, rng=rng)
    gated = FeedForward(d_model, d_ff, rng=rng, gated=True, bias=bias)
    assert feed_forward_parameters(d_model, d_ff) == plain.num_parameters()
    assert gated_feed_forward_parameters(d_model, d_ff, bias=bias) == gated.num_parameters()


@given(d_model=st.integers(1, 500).map(lambda k: 3 * k), expansion=st.integers(1, 8))
def test_gated_width_keeps_the_weight_count_when_exact(d_model, expansion):
    d_ff = gated_d_ff(d_model, expansion=expansion)
    assert 3 * d_model * d_ff == 2 * d_model * (expansion * d_model)  # 3 d d_ff = 2 d (e d)


@given(d_model=st.integers(1, 5000), multiple_of=st.integers(1, 512))
def test_gated_width_is_a_rounded_up_multiple(d_model, multiple_of):
    d_ff = gated_d_ff(d_model, multiple_of=multiple_of)
    exact = 8 * d_model // 3
    assert d_ff % multiple_of == 0
    assert exact <= d_ff < exact + multiple_of


def test_gated_width_of_llama_7b():
    """LLaMA 7B: d_model 4096, multiple_of 256 gives the released hidden width 11008."""
    assert gated_d_ff(4096, multiple_of=256) == 11008


def test_block_flops_terms():
    flops = block_forward_flops(8, 32, 5)
    assert flops == {
        "attention projections": 8 * 5 * 8 * 8,
        "attention scores and mixing": 4 * 5 * 5 * 8,
        "feed-forward": 4 * 5 * 8 * 32,
    }
    # with d_ff = 4d the quadratic term equals the FFN's at T = 4d
    d = 16
    at = block_forward_flops(d, 4 * d, 4 * d)
    assert at["attention scores and mixing"] == at["feed-forward"]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: gated_d_ff(0), ValueError, "d_model"),
        (lambda: gated_d_ff(8, multiple_of=2.5), TypeError, "multiple_of"),
        (lambda: gated_d_ff(8, expansion=-1), ValueError, "expansion"),
        (lambda: gated_feed_forward_parameters(4, 0), ValueError, "d_ff"),
        (lambda: block_forward_flops(4, 8, 0), ValueError, "seq_len"),
        (lambda: block_forward_flops("4", 8, 2), TypeError, "d_model"),
    ],
)
def test_bad_feed_forward_count_inputs_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


# ------------------------------------------------ encoder-only models and BERT
@given(
    sizes=widths(),
    vocab=st.integers(1, 9),
    n_layers=st.integers(1, 3),
    context_length=st.integers(1, 8),
    norm_first=st.booleans(),
    positional=st.sampled_from(["sinusoidal", "learned", "rotary", "none"]),
    tie=st.booleans(),
)
def test_formula_equals_encoder_only_model(
    sizes, vocab, n_layers, context_length, norm_first, positional, tie
):
    config = EncoderOnlyConfig(
        vocab_size=vocab,
        n_layers=n_layers,
        context_length=context_length,
        norm_first=norm_first,
        positional=positional,
        tie_output=tie,
        **sizes,
    )
    model = EncoderOnlyMLM(config, rng=np.random.default_rng(0))
    assert parameter_count(config) == model.num_parameters()


def test_bert_encoder_matches_its_released_encoder_count():
    """Formula + segment table + embedding LayerNorm + pooler = BERT's encoder checkpoints.

    109,482,240 (base) and 335,141,888 (large) are the parameter counts of the
    released pre-trained encoders (uncased), without the pre-training heads.
    """
    encoder_parts = ("segment embeddings", "embedding LayerNorm", "pooler")
    for row, released in zip(bert_sizes(), (109_482_240, 335_141_888), strict=True):
        extras = bert_extra_terms(row.config.d_model)
        assert row.formula + sum(extras[k] for k in encoder_parts) == released
        assert row.formula < row.reported


def test_bert_extra_terms_by_hand():
    d, v = 4, 10
    assert bert_extra_terms(d, v) == {
        "segment embeddings": 8,
        "embedding LayerNorm": 8,
        "pooler": 20,
        "masked-LM head": 20 + 8 + 10,
        "next-sentence head": 10,
    }
    with pytest.raises(ValueError, match="d_model must be a positive"):
        bert_extra_terms(0)
    with pytest.raises(TypeError, match="vocab_size"):
        bert_extra_terms(4, 2.5)


# ------------------------------------------------ grouped-query attention and modern presets
COMBINATIONS = list(
    itertools.product(
        ["layernorm", "rmsnorm"],  # norm
        ["plain", "gated"],  # feed-forward
        [True, False],  # bias
        ["learned", "sinusoidal", "rotary", "none"],  # positions
        [True, False],  # tied output
        [True, False],  # pre-norm
        [None, 2, 1],  # key/value heads (of 4)
    )
)


@pytest.mark.parametrize("family", ["decoder-only", "encoder-only", "encoder-decoder"])
def test_formula_equals_the_built_model_for_every_combination_of_options(family):
    """Every combination of the modern decoder's options, grouped-query attention included."""
    for norm, ffn, bias, positional, tie, norm_first, n_kv_heads in COMBINATIONS:
        options = {
            "d_model": 8, "n_heads": 4, "d_ff": 6, "context_length": 5, "norm": norm,
            "feed_forward": ffn, "activation": "silu", "bias": bias, "positional": positional,
            "tie_output": tie, "norm_first": norm_first, "n_kv_heads": n_kv_heads,
        }  # fmt: skip
        if family == "decoder-only":
            model = DecoderOnlyLM(
                DecoderOnlyConfig(7, n_layers=2, **options), rng=np.random.default_rng(0)
            )
        elif family == "encoder-only":
            model = EncoderOnlyMLM(
                EncoderOnlyConfig(7, n_layers=2, **options), rng=np.random.default_rng(0)
            )
        else:
            config = EncoderDecoderConfig(7, 6, n_encoder_layers=1, n_decoder_layers=2, **options)
            model = EncoderDecoder(config, rng=np.random.default_rng(0))
        built = sum(p.value.size for p in model.parameters())
        assert parameter_count(model.config) == built, (family, options)


@given(n_kv_heads=st.sampled_from([1, 2, 3, 6]), d_k=st.integers(1, 4), bias=st.booleans())
def test_attention_count_with_shared_key_value_heads(n_kv_heads, d_k, bias):
    layer = MultiHeadAttention(
        6 * d_k, 6, n_kv_heads=n_kv_heads, bias=bias, rng=np.random.default_rng(0)
    )
    count = attention_parameters(6 * d_k, bias=bias, n_heads=6, n_kv_heads=n_kv_heads)
    assert count == layer.num_parameters()
    if n_kv_heads == 6:
        assert count == attention_parameters(6 * d_k, bias=bias)  # plain multi-head


def test_attention_count_needs_the_number_of_heads_with_n_kv_heads():
    with pytest.raises(ValueError, match="n_heads is needed with n_kv_heads"):
        attention_parameters(8, n_kv_heads=2)


@pytest.mark.parametrize(
    ("name", "released"),
    [
        ("Llama 2 7B", 6_738_415_616),
        ("Llama 2 70B", 68_976_648_192),
        ("Mistral 7B", 7_241_732_096),
    ],
)
def test_modern_presets_count_the_released_weights_exactly(name, released):
    rows = {row.name: row for row in modern_sizes()}
    assert rows[name].released == released
    assert parameter_count(rows[name].config) == released


def test_modern_presets_written_out():
    """The sums by hand, from the Hugging Face configurations' numbers."""
    v = 32000
    for config, d, layers, d_kv, d_ff in (
        (llama2_config("7b"), 4096, 32, 4096, 11008),
        (llama2_config("70b"), 8192, 80, 1024, 28672),
        (mistral_7b_config(), 4096, 32, 1024, 14336),
    ):
        block = 2 * d * d + 2 * d * d_kv + 3 * d * d_ff + 2 * d  # attention, SwiGLU, 2 RMSNorms
        assert (
            parameter_count(config) == 2 * v * d + layers * block + d
        )  # + untied output, final norm
        assert (config.norm, config.feed_forward, config.activation) == (
            "rmsnorm",
            "gated",
            "silu",
        )
        assert (config.bias, config.tie_output, config.positional) == (False, False, "rotary")
        assert config.rotary_base == 10000.0
        assert config.norm_eps == 1e-5
    assert llama2_config("70b").n_kv_heads == mistral_7b_config().n_kv_heads == 8
    assert llama2_config("7b").kv_heads == 32
    with pytest.raises(ValueError, match="size must be one of"):
        llama2_config("13b")


def test_kv_cache_bytes_per_token_of_the_presets():
    """2 L h_kv d_k numbers per token, in float16: 512 KiB, 320 KiB and 128 KiB."""
    assert kv_cache_bytes_per_token(llama2_config("7b"), 2) == 2 * 32 * 32 * 128 * 2 == 524_288
    assert kv_cache_bytes_per_token(llama2_config("70b"), 2) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_cache_bytes_per_token(mistral_7b_config(), 2) == 2 * 32 * 8 * 128 * 2 == 131_072
    with pytest.raises(TypeError, match="config must be a DecoderOnlyConfig"):
        kv_cache_bytes_per_token(transformer_config(512, 8, 2048))
    with pytest.raises(ValueError, match="bytes_per_element"):
        kv_cache_bytes_per_token(llama2_config("7b"), 0)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kv_cache_bytes_per_token_is_what_decoding_stores(n_kv_heads, dtype):
    config = DecoderOnlyConfig(
        9, d_model=16, n_heads=4, n_kv_heads=n_kv_heads, d_ff=8, n_layers=3,
        context_length=12, positional="rotary", dtype=dtype,
    )  # fmt: skip
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    state = model.start(1)
    model.step(np.arange(7)[None] % 9, state)
    stored = sum(
        c.self_attention.keys.nbytes + c.self_attention.values.nbytes for c in state.caches
    )
    assert stored == 7 * kv_cache_bytes_per_token(config)


def test_gpt2_uses_the_tanh_gelu_of_its_released_code():
    assert gpt2_config(768, 12, 12).activation == "gelu_tanh"


def test_block_flops_with_shared_key_value_heads():
    flops = block_forward_flops(8, 32, 5, d_kv=2)
    assert flops["attention projections"] == 2 * 5 * (2 * 8 * 8 + 2 * 8 * 2)  # 2 T (weights)
    assert block_forward_flops(8, 32, 5, d_kv=8) == block_forward_flops(8, 32, 5)
