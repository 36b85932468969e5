"""Gradient checkpointing: the same gradients, less saved state, one more forward pass."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer import cost
from tinyformer.blocks import TransformerBlock
from tinyformer.gradcheck import check_module_gradients
from tinyformer.losses import cross_entropy
from tinyformer.masks import causal_mask
from tinyformer.models.config import DecoderOnlyConfig, EncoderDecoderConfig
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.models.encoder_decoder import EncoderDecoder
from tinyformer.recompute import Checkpointed, checkpoint_blocks, uncheckpoint_blocks

CONFIG = DecoderOnlyConfig(
    vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=4, context_length=10, dropout=0.1
)


def _gradients(model, ids):
    model.zero_grad()
    logits = model.forward(ids)
    model.backward(cross_entropy(logits, ids)[1])
    return {name: p.grad.copy() for name, p in model.named_parameters()}


@pytest.mark.parametrize("segment", [1, 2, 3, 4])
def test_checkpointed_gradients_are_identical_with_dropout(segment):
    model = DecoderOnlyLM(CONFIG, rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, 13, (3, 10))
    generator = model.decoder.dropout.rng  # every dropout of the model draws from it
    state = generator.bit_generator.state
    plain = _gradients(model, ids)
    after = generator.bit_generator.state
    generator.bit_generator.state = state
    checkpoint_blocks(model.decoder, segment)
    assert all(isinstance(s, Checkpointed) for s in model.decoder.layers)
    assert len(model.decoder.layers) == -(-4 // segment)
    again = _gradients(model, ids)
    assert generator.bit_generator.state == after  # the same draws, no extra ones
    assert list(again) == list(plain)  # the wrapper adds no names
    for name in plain:
        np.testing.assert_array_equal(again[name], plain[name])


def test_checkpointing_saves_memory_and_adds_one_forward_of_the_blocks():
    config = DecoderOnlyConfig(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=4)
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    ids = np.ones((2, 8), dtype=int)
    model.forward(ids)
    full = sum(cost.saved_bytes(model).values())
    with cost.count_matmuls(model) as plain:
        model.backward(cross_entropy(model.forward(ids), ids)[1])
    checkpoint_blocks(model.decoder)
    model.forward(ids)
    kept = cost.saved_bytes(model)
    assert sum(kept.values()) < full / 3
    assert kept["decoder.layers.1"] == 2 * 8 * 16 * 8  # its input only
    with cost.count_matmuls(model) as recomputed:
        model.backward(cross_entropy(model.forward(ids), ids)[1])
    terms = cost.forward_flops(config, 8, 2)
    blocks = sum(terms.values()) - terms["output layer"]
    assert recomputed.matrix - plain.matrix == blocks


def test_checkpoint_blocks_accepts_a_whole_model():
    model = DecoderOnlyLM(CONFIG, rng=np.random.default_rng(0))
    checkpoint_blocks(model)
    assert all(isinstance(s, Checkpointed) for s in model.decoder.layers)


def test_segment_passes_finite_difference_check():
    rng = np.random.default_rng(0)
    blocks = [TransformerBlock(3, 1, 2, rng=rng, dropout=0.2) for _ in range(2)]
    segment = Checkpointed(blocks)
    generator = blocks[0].feed_forward.dropout.rng
    state = generator.bit_generator.state

    def reset():
        generator.bit_generator.state = state

    x = rng.normal(size=(2, 3, 3))
    errors = check_module_gradients(segment, [x], rng=rng, before_forward=reset)
    assert max(errors.values()) < 1e-6


def test_segment_with_memory_passes_finite_difference_check():
    rng = np.random.default_rng(1)
    segment = Checkpointed(
        [TransformerBlock(3, 1, 2, rng=rng, cross_attention=True) for _ in range(2)]
    )
    x, memory = rng.normal(size=(2, 3, 3)), rng.normal(size=(2, 2, 3))
    errors = check_module_gradients(segment, [x, memory], rng=rng, kwargs={"mask": causal_mask(3)})
    assert max(errors.values()) < 1e-6


def test_encoder_decoder_checkpointed_gradients_and_decoding():
    config = EncoderDecoderConfig(src_vocab_size=9, tgt_vocab_size=9, d_model=8, n_heads=2)
    model = EncoderDecoder(config, rng=np.random.default_rng(0))
    src, tgt = np.ones((2, 5), dtype=int), np.full((2, 4), 2)

    def grads():
        model.zero_grad()
        logits = model.forward(src, tgt)
        model.backward(cross_entropy(logits, tgt)[1])
        return {n: p.grad.copy() for n, p in model.named_parameters()}

    plain = grads()
    checkpoint_blocks(model.encoder)
    checkpoint_blocks(model.decoder)
    again = grads()
    assert list(again) == list(plain)
    for name in plain:
        # the decoder's memory gradient adds up in another order: rounding only
        np.testing.assert_allclose(again[name], plain[name], rtol=1e-13, atol=1e-15)
    uncheckpoint_blocks(model.decoder)
    assert all(isinstance(b, TransformerBlock) for b in model.decoder.layers)


def test_bad_inputs():
    with pytest.raises(TypeError, match="blocks must be"):
        Checkpointed([])
    with pytest.raises(TypeError, match=r"blocks\[0\] must be"):
        Checkpointed([np.zeros(3)])
    with pytest.raises(ValueError, match="segment"):
        checkpoint_blocks(DecoderOnlyLM(CONFIG, rng=np.random.default_rng(0)).decoder, 0)
    with pytest.raises(TypeError, match="model must hold its blocks in a list named layers"):
        checkpoint_blocks(TransformerBlock(8, 2, 8, rng=np.random.default_rng(0)))
