"""Encoder and decoder blocks: gradients, residual structure, masks and cached decoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.blocks import DecoderBlock, DecoderCache, EncoderBlock
from tinyformer.gradcheck import check_module_gradients
from tinyformer.masks import causal_mask, padding_mask
from tinyformer.norm import LayerNorm

seeds = st.integers(0, 2**32 - 1)


def _randomize(block, rng):
    for p in block.parameters():
        p.value[...] = p.value + 0.3 * rng.standard_normal(p.shape)
    return block


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_gradients_with_padding_mask(rng, norm_first, activation):
    block = _randomize(
        EncoderBlock(8, 2, 12, rng=rng, norm_first=norm_first, activation=activation), rng
    )
    ids = np.array([[3, 4, 5, 0], [6, 7, 0, 0]])
    errors = check_module_gradients(
        block, [rng.standard_normal((2, 4, 8))], rng=rng, kwargs={"mask": padding_mask(ids, 0)}
    )
    assert len(errors) == 1 + 12  # the input, 4 attention, 4 feed-forward, 2 x 2 norm parameters
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_gradients_with_causal_and_memory_masks(rng, norm_first):
    block = _randomize(DecoderBlock(8, 4, 12, rng=rng, norm_first=norm_first), rng)
    src = np.array([[1, 2, 3], [4, 5, 0]])
    errors = check_module_gradients(
        block,
        [rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 3, 8))],
        rng=rng,
        kwargs={"self_mask": causal_mask(4), "memory_mask": padding_mask(src, 0)},
    )
    assert {"input 0", "input 1"} <= set(errors)
    assert max(errors.values()) < 1e-6, errors


def test_decoder_only_block_gradients_with_dropout(rng):
    block = _randomize(
        DecoderBlock(8, 2, 8, rng=rng, cross_attention=False, dropout=0.2, rotary=True), rng
    )
    generator = block.feed_forward.dropout.rng  # every dropout shares the block's generator
    state = generator.bit_generator.state

    def reset():
        generator.bit_generator.state = state

    errors = check_module_gradients(
        block,
        [rng.standard_normal((2, 3, 8))],
        rng=rng,
        kwargs={"self_mask": causal_mask(3)},
        before_forward=reset,
    )
    assert max(errors.values()) < 1e-6, errors


def test_post_norm_encoder_is_the_formula_written_out(rng):
    block = _randomize(EncoderBlock(8, 2, 16, rng=rng), rng)
    x = rng.standard_normal((2, 5, 8))
    attention = block.self_attention.layer
    ffn = block.feed_forward.layer
    h = block.self_attention.norm.forward(x + attention.forward(x))
    expected = block.feed_forward.norm.forward(h + ffn.forward(h))
    np.testing.assert_allclose(block.forward(x), expected, rtol=1e-12, atol=1e-12)


def test_pre_norm_keeps_an_identity_path(rng):
    block = _randomize(EncoderBlock(8, 2, 16, rng=rng, norm_first=True), rng)
    for p in (block.self_attention.layer.w_out, block.feed_forward.layer.linear_out.weight):
        p.value[...] = 0.0  # sub-layers whose output is only a bias
    x = rng.standard_normal((2, 5, 8))
    bias = block.self_attention.layer.b_out.value + block.feed_forward.layer.linear_out.bias.value
    np.testing.assert_allclose(block.forward(x), x + bias, atol=1e-12)


@given(seeds, st.integers(0, 4))
def test_decoder_output_at_t_ignores_later_target_tokens(seed, t):
    rng = np.random.default_rng(seed)
    block = _randomize(DecoderBlock(8, 2, 8, rng=rng), rng)
    x, memory = rng.standard_normal((1, 5, 8)), rng.standard_normal((1, 3, 8))
    changed = x.copy()
    changed[:, t + 1 :] += 1.0
    a = block.forward(x, memory, self_mask=causal_mask(5))
    b = block.forward(changed, memory, self_mask=causal_mask(5))
    np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-12)


@given(seeds, st.booleans(), st.booleans())
def test_cached_step_by_step_decoding_equals_full_decoding(seed, cross, norm_first):
    rng = np.random.default_rng(seed)
    block = DecoderBlock(8, 2, 8, rng=rng, cross_attention=cross, norm_first=norm_first)
    block = _randomize(block, rng).eval()
    x = rng.standard_normal((2, 6, 8))
    memory = rng.standard_normal((2, 4, 8)) if cross else None
    memory_mask = padding_mask(np.array([[1, 2, 3, 4], [5, 6, 0, 0]]), 0) if cross else None
    full = block.forward(x, memory, self_mask=causal_mask(6), memory_mask=memory_mask)
    cache = block.new_cache()
    steps = [
        block.forward(x[:, i : i + 1], memory, memory_mask=memory_mask, cache=cache)
        for i in range(6)
    ]
    assert len(cache) == 6
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-12)
    cache.reset()
    assert len(cache) == 0


def test_backward_after_cached_decoding_is_refused(rng):
    block = DecoderBlock(8, 2, 8, rng=rng, cross_attention=False)
    out = block.forward(rng.standard_normal((1, 1, 8)), cache=DecoderCache())
    with pytest.raises(RuntimeError, match="cache is for inference"):
        block.backward(np.ones_like(out))


def test_blocks_list_their_parameters(rng):
    decoder = DecoderBlock(8, 2, 16, rng=rng)
    names = [n for n, _ in decoder.named_parameters()]
    assert names[0] == "self_attention.layer.w_qkv"
    assert "cross_attention.norm.gain" in names
    attention = 4 * 8 * 8 + 4 * 8  # W_Q, W_K, W_V, W_O and their biases
    ffn = 8 * 16 + 16 + 16 * 8 + 8
    norms = 3 * 2 * 8
    assert decoder.num_parameters() == 2 * attention + ffn + norms
    assert len(list(DecoderBlock(8, 2, 16, rng=rng, cross_attention=False).parameters())) == 12


def test_encoder_layer_norms_are_layer_norms(rng):
    block = EncoderBlock(4, 1, 4, rng=rng)
    assert isinstance(block.self_attention.norm, LayerNorm)
    assert isinstance(block.feed_forward.norm, LayerNorm)


@pytest.mark.parametrize("norm_first", [False, True])
def test_float32_in_float32_out(rng, norm_first):
    encoder = EncoderBlock(8, 2, 16, rng=rng, norm_first=norm_first, dtype=np.float32)
    decoder = DecoderBlock(8, 2, 16, rng=rng, norm_first=norm_first, dtype=np.float32)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    memory = encoder.forward(x, mask=np.ones(3, bool))
    assert memory.dtype == np.float32
    y = decoder.forward(x, memory, self_mask=causal_mask(3))
    assert y.dtype == np.float32
    grad_x, grad_memory = decoder.backward(np.ones_like(y))
    assert grad_x.dtype == grad_memory.dtype == np.float32
    assert encoder.backward(grad_memory).dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in decoder.parameters())
