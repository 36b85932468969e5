"""The one stack every model is made of: its parts, its forward pass, its gradients, its caches."""

from __future__ import annotations

import math

import numpy as np
import pytest
from small_models import OPTIONS, decoder_only, encoder_decoder, encoder_only, perturb

from tinyformer.blocks import BlockCache, TransformerBlock
from tinyformer.feedforward import FeedForward
from tinyformer.gradcheck import check_parameter_gradients, max_relative_error, numerical_gradient
from tinyformer.layers import Embedding, Linear
from tinyformer.masks import causal_mask
from tinyformer.models import DecoderOnlyConfig, EncoderDecoderConfig, TransformerStack
from tinyformer.models.stack import make_positions
from tinyformer.module import no_grad
from tinyformer.multihead import MultiHeadAttention
from tinyformer.norm import LayerNorm, RMSNorm
from tinyformer.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

MAKERS = {
    "decoder-only": decoder_only,
    "encoder-decoder": encoder_decoder,
    "encoder-only": encoder_only,
}


def stacks(model) -> list[TransformerStack]:
    return [s for s in (getattr(model, "encoder", None), getattr(model, "decoder", None)) if s]


def stack(config, n_layers: int = 2, *, cross_attention: bool = False, seed: int = 0):
    rng = np.random.default_rng(seed)
    vocab = getattr(config, "vocab_size", None) or config.tgt_vocab_size
    embedding = Embedding(
        vocab,
        config.d_model,
        rng=rng,
        scale_by_sqrt_d=config.scale_embeddings,
        dtype=np.dtype(config.dtype),
    )
    return TransformerStack(config, embedding, n_layers, cross_attention=cross_attention, rng=rng)


# ------------------------------------------------------------------ the parts
@pytest.mark.parametrize("family", list(MAKERS))
@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_option_of_the_config_reaches_every_layer(family, name):
    """Norm kind and epsilon, feed-forward kind, biases, score scale and rotary positions."""
    options = OPTIONS[name]
    model = MAKERS[family](**options)
    c = model.config
    norm_class = RMSNorm if c.norm == "rmsnorm" else LayerNorm
    blocks = [block for s in stacks(model) for block in s.layers]
    assert len(blocks) == (
        c.n_encoder_layers + c.n_decoder_layers if family == "encoder-decoder" else c.n_layers
    )
    norms = [m for m in model.modules() if isinstance(m, LayerNorm | RMSNorm)]
    assert all(type(n) is norm_class for n in norms)
    assert all(n.eps == c.norm_eps for n in norms)
    final_norms = sum(s.final_norm is not None for s in stacks(model))
    assert final_norms == (len(stacks(model)) if c.norm_first else 0)
    if family != "encoder-decoder":  # the encoder-decoder's count is the next test's
        assert len(norms) == 2 * len(blocks) + final_norms
    ffns = [m for m in model.modules() if isinstance(m, FeedForward)]
    assert len(ffns) == len(blocks)
    assert all(f.gated == (c.feed_forward == "gated") for f in ffns)
    assert all(f.activation == c.activation for f in ffns)
    linears = [m for m in model.modules() if isinstance(m, Linear) and m is not model.output]
    assert linears
    assert all((m.bias is not None) == c.bias for m in linears)
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attention) == len(blocks) + (
        c.n_decoder_layers if family == "encoder-decoder" else 0
    )
    expected_scale = 1.0 if c.attention_scale == "none" else 1 / math.sqrt(c.d_k)
    assert all(m.scale == pytest.approx(expected_scale, rel=1e-15) for m in attention)
    rotary = c.positional == "rotary"
    for block in blocks:
        assert block.self_attention.layer.rotary == rotary
        if block.cross_attention is not None:
            assert not block.cross_attention.layer.rotary  # the memory has no positions
        assert block.norm_first == c.norm_first
    assert isinstance(model.output, Linear) != c.tie_output


def test_the_encoder_decoder_has_three_norms_per_decoder_block_and_two_per_encoder_block():
    model = encoder_decoder(n_encoder_layers=2, n_decoder_layers=3, norm_first=True)
    count = {
        name: sum(isinstance(m, LayerNorm) for m in s.modules())
        for name, s in (("encoder", model.encoder), ("decoder", model.decoder))
    }
    assert count == {"encoder": 2 * 2 + 1, "decoder": 3 * 3 + 1}


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("learned", LearnedPositionalEmbedding),
        ("sinusoidal", SinusoidalPositionalEncoding),
        ("rotary", type(None)),
        ("none", type(None)),
    ],
)
def test_positions_by_kind(kind, expected):
    layer = make_positions(kind, 7, 8, rng=np.random.default_rng(0), dtype=np.dtype("float32"))
    assert type(layer) is expected
    if layer is not None:
        out = layer.forward(np.zeros((1, 7, 8), dtype=np.float32))
        assert out.dtype == np.float32
        assert np.abs(out[0, 1:] - out[0, :1]).max() > 0  # every position its own vector
    config = DecoderOnlyConfig(vocab_size=5, d_model=8, n_heads=2, positional=kind)
    assert type(stack(config).positions) is expected


def test_layout_of_a_stack():
    config = DecoderOnlyConfig(vocab_size=5, d_model=8, n_heads=2, d_ff=6, dropout=0.25)
    s = stack(config, 3)
    assert len(s.layers) == 3
    assert all(isinstance(b, TransformerBlock) and b.cross_attention is None for b in s.layers)
    assert isinstance(s.final_norm, LayerNorm)
    assert s.dropout.p == 0.25
    names = [name for name, _ in s.named_parameters()]
    assert names[:2] == ["embedding.weight", "positions.weight"]
    assert "layers.2.self_attention.layer.q_proj.weight" in names
    assert names[-2:] == ["final_norm.gain", "final_norm.bias"]
    post = stack(DecoderOnlyConfig(vocab_size=5, d_model=8, n_heads=2, norm_first=False), 1)
    assert post.final_norm is None
    crossing = stack(EncoderDecoderConfig(5, 5, d_model=8, n_heads=2), 2, cross_attention=True)
    assert all(b.cross_attention is not None for b in crossing.layers)


# ---------------------------------------------------------------- forward
@pytest.mark.parametrize("name", ["pre-norm learned", "post-norm sinusoidal", "llama"])
def test_forward_is_embedding_positions_blocks_and_final_norm_in_order(name):
    """The stack's output is its parts run by hand, bit for bit (no hidden second path)."""
    options = {**OPTIONS[name], "scale_embeddings": True}
    s = stack(DecoderOnlyConfig(vocab_size=9, d_model=8, n_heads=2, d_ff=6, **options), 2)
    perturb(s, 1)
    ids = np.random.default_rng(2).integers(0, 9, (2, 5))
    mask = causal_mask(5)
    x = s.embedding.forward(ids)
    np.testing.assert_array_equal(x, s.embedding.weight.value[ids] * math.sqrt(8))
    if s.positions is not None:
        x = s.positions.forward(x, 0)
    for block in s.layers:
        x = block.forward(x, mask=mask)
    if s.final_norm is not None:
        x = s.final_norm.forward(x)
    np.testing.assert_array_equal(s.forward(ids, mask), x)


def test_forward_with_caches_in_pieces_matches_one_forward():
    s = stack(
        EncoderDecoderConfig(9, 9, d_model=8, n_heads=2, d_ff=6, positional="learned"),
        2,
        cross_attention=True,
    )
    perturb(s, 3)
    rng = np.random.default_rng(4)
    ids, memory = rng.integers(0, 9, (2, 6)), rng.standard_normal((2, 4, 8))
    memory_mask = np.array([[[True, True, True, True]], [[True, True, False, False]]])
    whole = s.forward(ids, causal_mask(6), memory=memory, memory_mask=memory_mask)
    caches = s.new_caches()
    assert len(caches) == 2
    assert all(isinstance(c, BlockCache) and len(c) == 0 for c in caches)
    pieces = []
    with no_grad():
        for a, b in ((0, 3), (3, 4), (4, 6)):
            mask = causal_mask(b - a, b)
            pieces.append(
                s.forward(
                    ids[:, a:b],
                    mask,
                    memory=memory,
                    memory_mask=memory_mask,
                    start=a,
                    caches=caches,
                )
            )
    assert all(len(c) == 6 for c in caches)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, rtol=0, atol=1e-12)


def test_forward_refuses_a_wrong_number_of_caches():
    s = stack(DecoderOnlyConfig(vocab_size=5, d_model=8, n_heads=2), 2)
    with pytest.raises(ValueError, match=r"caches must hold one BlockCache per block \(2\)"):
        s.forward(np.zeros((1, 2), dtype=np.int64), caches=[BlockCache()])


# --------------------------------------------------------------- backward
def test_backward_returns_none_without_cross_attention():
    s = stack(DecoderOnlyConfig(vocab_size=5, d_model=8, n_heads=2), 1)
    out = s.forward(np.array([[1, 2, 3]]), causal_mask(3))
    assert s.backward(np.ones_like(out)) is None


@pytest.mark.parametrize("name", ["post-norm sinusoidal", "llama"])
def test_gradients_of_parameters_and_memory_match_finite_differences(name):
    config = EncoderDecoderConfig(7, 7, d_model=4, n_heads=2, d_ff=6, **OPTIONS[name])
    s = perturb(stack(config, 2, cross_attention=True, seed=5), 6)
    rng = np.random.default_rng(7)
    ids, memory = rng.integers(0, 7, (2, 3)), rng.standard_normal((2, 4, 4))
    memory_mask = np.array([[[True, True, True, True]], [[True, True, True, False]]])
    mask = causal_mask(3)
    upstream = rng.standard_normal((2, 3, 4))

    def run():
        out = s.forward(ids, mask, memory=memory, memory_mask=memory_mask)
        return out * upstream, upstream

    errors = check_parameter_gradients(s, run)
    assert max(errors.values()) < 1e-6, errors
    run()
    grad_memory = s.backward(upstream)
    numeric = numerical_gradient(lambda: run()[0], memory)
    assert max_relative_error(grad_memory, numeric) < 1e-6
    assert np.abs(grad_memory[1, 3]).max() == 0  # a hidden memory position gets nothing
    assert np.abs(grad_memory[0]).min() > 0
