"""ZeRO simulated: per-device memory by formula and as held; every stage takes the same step."""

from __future__ import annotations

import copy

import ml_dtypes
import numpy as np
import pytest

from tinyformer.losses import cross_entropy
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.optim import AdamW
from tinyformer.training.mixed_precision import round_to
from tinyformer.zero import ZeroDataParallel, zero_bytes_per_device


def _loss(model, rows):
    model.backward(cross_entropy(model.forward(rows[:, :-1]), rows[:, 1:])[1])


def _model():
    config = DecoderOnlyConfig(
        vocab_size=7, d_model=8, n_heads=2, d_ff=16, n_layers=1, context_length=6, dtype="float32"
    )
    return DecoderOnlyLM(config, rng=np.random.default_rng(0))


BATCH = np.random.default_rng(1).integers(0, 7, (8, 7))


def test_the_formula_reproduces_zeros_figure_1():
    # Rajbhandari et al. (2020), Figure 1: 7.5B parameters on 64 devices, K = 12
    gb = [sum(zero_bytes_per_device(7_500_000_000, 64, s).values()) / 1e9 for s in range(4)]
    assert gb[0] == 120.0
    assert round(gb[1], 1) == 31.4
    assert round(gb[2], 1) == 16.6
    assert round(gb[3], 3) == 1.875


def test_each_stage_divides_the_parts_it_shards():
    n, d = 1000, 4
    per = [zero_bytes_per_device(n, d, s) for s in range(4)]
    assert [sum(p.values()) for p in per] == [
        16 * n,
        4 * n + 12 * n // d,
        2 * n + 14 * n // d,
        16 * n // d,
    ]
    assert zero_bytes_per_device(1001, 4, 3)["weights"] == 2 * 251  # a shard is rounded up


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n_devices", [1, 4, 7])
def test_each_device_holds_what_the_formula_says(stage, n_devices):
    """The arrays held between steps: their dtypes and sizes (shards rounded up, padded).

    Both sides follow ``SHARDED_PARTS``, so this guards the buffers' sizes and dtypes, not
    the choice of parts; nor the peak during ``step``, where the simulation holds each
    device's whole bfloat16 gradient before the average (real ZeRO-2 does not).
    """
    model = _model()
    zero = ZeroDataParallel(model, n_devices, stage, lr=1e-2)
    zero.step(_loss, BATCH[:7] if n_devices == 7 else BATCH)
    expected = zero_bytes_per_device(model.num_parameters(), n_devices, stage)
    assert n_devices != 7 or model.num_parameters() % 7  # 7 devices: the last shard is padded
    assert zero.held_bytes() == [expected] * n_devices
    assert all(d.weights.dtype == ml_dtypes.bfloat16 for d in zero.devices)
    assert all(d.master.grad is None for d in zero.devices)  # no float32 gradient kept


@pytest.mark.parametrize("n_devices", [2, 4, 7])
def test_every_stage_takes_the_unsharded_step_bit_for_bit(n_devices):
    # 7 devices do not divide the 720 parameters: the last shard is padded. The average is
    # computed once and sliced, so this checks the shards, padding and gathers, not the
    # summation order of a real collective
    batch = BATCH[:7] if n_devices == 7 else BATCH
    assert n_devices != 7 or _model().num_parameters() % 7
    results = []
    for stage in range(4):
        zero = ZeroDataParallel(_model(), n_devices, stage, lr=1e-2)
        for _ in range(3):
            zero.step(_loss, batch)
        results.append((zero.master_weights(), zero.weights()))
    for master, weights in results[1:]:
        np.testing.assert_array_equal(master, results[0][0])
        np.testing.assert_array_equal(weights.view(np.uint16), results[0][1].view(np.uint16))
    start = np.concatenate([p.value.ravel() for p in _model().parameters()])
    assert np.any(results[0][0] != start)  # the steps did move the weights


def test_one_device_is_adamw_on_bfloat16_gradients():
    model = _model()
    zero = ZeroDataParallel(copy.deepcopy(model), 1, 0, lr=1e-2, weight_decay=0.1)
    zero.step(_loss, BATCH)
    optimizer = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)  # the library's own step
    master = [p.value.copy() for p in model.parameters()]
    for p in model.parameters():
        p.value[...] = round_to(p.value, "bfloat16")  # the forward pass sees bfloat16 weights
    model.zero_grad()
    _loss(model, BATCH)
    for p, m in zip(model.parameters(), master, strict=True):
        p.grad[...] = round_to(p.grad, "bfloat16")
        p.value[...] = m
    optimizer.step()
    expected = np.concatenate([p.value.ravel() for p in model.parameters()])
    np.testing.assert_array_equal(zero.master_weights(), expected)


def test_more_devices_change_the_average_gradient_by_rounding_only():
    # each device rounds its own gradient to bfloat16 before the average: not bit for bit
    one, four = (ZeroDataParallel(_model(), n, 0, lr=1e-3) for n in (1, 4))
    one.step(_loss, BATCH)
    four.step(_loss, BATCH)
    g1, g4 = (z.devices[0].gradients.astype(np.float64) for z in (one, four))
    assert np.any(g1 != g4)
    assert np.linalg.norm(g4 - g1) / np.linalg.norm(g1) < 2.0**-7  # bfloat16's epsilon


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="stage"):
        zero_bytes_per_device(10, 2, 4)
    with pytest.raises(ValueError, match="n_devices"):
        zero_bytes_per_device(10, 0, 1)
    with pytest.raises(TypeError, match="model"):
        ZeroDataParallel(object(), 2, 1)
    zero = ZeroDataParallel(_model(), 3, 1)
    with pytest.raises(ValueError, match="n_devices=3 must divide"):
        zero.step(_loss, BATCH)
    config = DecoderOnlyConfig(
        vocab_size=7, d_model=8, n_heads=2, d_ff=16, n_layers=1, dtype="float64"
    )
    with pytest.raises(ValueError, match="float32"):
        ZeroDataParallel(DecoderOnlyLM(config, rng=np.random.default_rng(0)), 2, 1)
