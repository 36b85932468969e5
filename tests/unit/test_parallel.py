"""Simulated data, tensor and pipeline parallelism give the unsplit results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyformer.feedforward import FeedForward
from tinyformer.losses import cross_entropy
from tinyformer.masks import causal_mask
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.multihead import MultiHeadAttention
from tinyformer.parallel import (
    Communication,
    all_reduce,
    data_parallel_gradients,
    gpipe_schedule,
    tensor_parallel_attention,
    tensor_parallel_feed_forward,
)


def _loss(model, batch):
    logits = model.forward(batch[:, :-1])
    model.backward(cross_entropy(logits, batch[:, 1:])[1])


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_data_parallel_average_matches_the_full_batch_to_rounding(replicas):
    config = DecoderOnlyConfig(vocab_size=7, d_model=8, n_heads=2, d_ff=16, n_layers=1)
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    batch = np.random.default_rng(1).integers(0, 7, (8, 6))
    model.zero_grad()
    _loss(model, batch)
    full = {n: p.grad.copy() for n, p in model.named_parameters()}
    log = Communication()
    averaged = data_parallel_gradients(model, _loss, batch, replicas, log)
    for name, grad in full.items():
        np.testing.assert_allclose(averaged[name], grad, rtol=1e-12, atol=1e-15)
    assert log.total_bytes == sum(p.value.nbytes for p in model.parameters())


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from(["relu", "gelu", "silu"]))
def test_tensor_parallel_feed_forward_matches_the_unsplit_layer_to_rounding(n_devices, activation):
    rng = np.random.default_rng(n_devices)
    ffn = FeedForward(6, 16, rng=rng, activation=activation)
    ffn.linear_in.bias.value[:] = rng.normal(size=16)
    x = rng.normal(size=(2, 3, 6))
    log = Communication()
    split = tensor_parallel_feed_forward(ffn, x, n_devices, log)
    # the devices' partial sums add up in another order than one matrix product: rounding
    np.testing.assert_allclose(split, ffn.forward(x), rtol=1e-13, atol=1e-14)
    assert log.payload_bytes == [x.nbytes]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n_devices", [1, 2, 4])
def test_tensor_parallel_attention_matches_the_unsplit_layer_to_rounding(n_devices, bias):
    rng = np.random.default_rng(n_devices)
    attention = MultiHeadAttention(12, 4, rng=rng, bias=bias)
    for p in attention.parameters():
        p.value[...] += 0.3 * rng.normal(size=p.shape)  # biases too: none stays zero
    x = rng.normal(size=(2, 5, 12))
    for mask in (None, causal_mask(5)):
        log = Communication()
        split = tensor_parallel_attention(attention, x, n_devices, mask, log)
        np.testing.assert_allclose(split, attention.forward(x, mask=mask), rtol=1e-12, atol=1e-13)
        assert log.payload_bytes == [x.nbytes]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 3))
def test_gpipe_bubble_matches_formula(stages, microbatches, backward_cost):
    schedule = gpipe_schedule(stages, microbatches, backward_cost)
    expected = (stages - 1) / (microbatches + stages - 1)
    assert schedule.bubble_fraction == pytest.approx(expected)
    for s in range(stages):  # every stage runs every micro-batch forward, then backward
        row = schedule.grid[s]
        assert np.count_nonzero(row > 0) == microbatches
        assert np.count_nonzero(row < 0) == microbatches * backward_cost


def test_bad_inputs():
    ffn = FeedForward(4, 6, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_devices must divide d_ff=6"):
        tensor_parallel_feed_forward(ffn, np.zeros((1, 4)), 4)
    with pytest.raises(TypeError, match="ffn must be"):
        tensor_parallel_feed_forward("ffn", np.zeros((1, 4)), 2)
    attention = MultiHeadAttention(8, 2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_heads=2"):
        tensor_parallel_attention(attention, np.zeros((1, 2, 8)), 4)
    grouped = MultiHeadAttention(8, 4, rng=np.random.default_rng(0), n_kv_heads=2)
    with pytest.raises(ValueError, match="n_kv_heads=2 for n_heads=4"):
        tensor_parallel_attention(grouped, np.zeros((1, 2, 8)), 2)
    with pytest.raises(ValueError, match="n_stages"):
        gpipe_schedule(0, 4)
    with pytest.raises(ValueError, match="parts"):
        all_reduce([])
