"""bfloat16 simulated: its range, its rounding, loss scaling it does not need, updates it loses."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.layers import Linear
from tinyformer.optim import SGD
from tinyformer.training.mixed_precision import (
    StaticLossScaler,
    format_limits,
    mixed_precision_step,
    round_to,
    rounded_update,
)


def test_bfloat16_has_float32s_range_and_a_coarser_epsilon():
    bf16, fp16, fp32 = (format_limits(f) for f in ("bfloat16", "float16", "float32"))
    assert bf16["smallest_normal"] == fp32["smallest_normal"] == 2.0**-126
    assert bf16["max"] == (2 - 2.0**-7) * 2.0**127
    assert bf16["eps"] == 2.0**-7
    assert fp16["eps"] == 2.0**-10
    assert fp16["max"] == 65504.0
    assert fp16["smallest_subnormal"] == 2.0**-24
    assert bf16["smallest_subnormal"] == 2.0**-133


def test_round_to_bfloat16_keeps_eight_significant_bits_ties_to_even():
    x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-7, 1e-8, 3.4e38], dtype=np.float32)
    rounded = round_to(x, "bfloat16")
    assert rounded.dtype == np.float32
    assert rounded[0] == 1.0  # a tie, to the even neighbour 1
    assert rounded[1] == 1 + 2 * 2.0**-7  # a tie, to the even neighbour above
    assert rounded[2] == 1 + 2.0**-7  # representable: unchanged
    assert rounded[3] != 0  # far above bfloat16's smallest subnormal
    assert np.isinf(rounded[4])  # beyond bfloat16's largest
    assert round_to(x.astype(np.float64), "float16")[3] == 0


def test_round_to_bfloat16_agrees_with_pytorch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    x *= np.float32(10.0) ** np.random.default_rng(1).integers(-30, 30, x.shape).astype(np.float32)
    ours = round_to(x, "bfloat16")
    theirs = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_relative_rounding_error_is_at_most_half_an_epsilon():
    x = np.random.default_rng(2).standard_normal(100_000)  # float64: the error is exact
    for fmt in ("float16", "bfloat16"):
        rel = np.abs(round_to(x, fmt) - x) / np.abs(x)
        assert rel[np.abs(x) > 1e-4].max() <= format_limits(fmt)["eps"] / 2


def _layer():
    return Linear(4, 3, rng=np.random.default_rng(0), dtype=np.float32)


def test_bfloat16_keeps_gradients_that_float16_flushes_to_zero():
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    grad = np.full((5, 3), 1e-8, dtype=np.float32)  # below float16's smallest subnormal
    reports = {}
    for fmt in ("float16", "bfloat16"):
        layer = _layer()
        layer.forward(x)
        reports[fmt] = mixed_precision_step(layer, SGD(layer.parameters(), lr=1.0), grad, fmt=fmt)
    assert reports["float16"].zeroed_logit_gradients == 1.0
    assert reports["bfloat16"].zeroed_logit_gradients == 0.0
    assert reports["bfloat16"].zeroed_parameter_gradients == 0.0


def test_a_loss_scale_changes_nothing_in_bfloat16():
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    grad = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32) * np.float32(1e-6)
    weights = []
    for scaler in (None, StaticLossScaler(2.0**12), StaticLossScaler(2.0**40)):
        layer = _layer()
        layer.forward(x)
        mixed_precision_step(layer, SGD(layer.parameters(), lr=1.0), grad, scaler, fmt="bfloat16")
        weights.append(layer.weight.value.copy())
    np.testing.assert_array_equal(weights[0], weights[1])  # bit for bit
    np.testing.assert_array_equal(weights[0], weights[2])


def test_bfloat16_step_is_the_float32_step_to_bfloat16_rounding():
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    grad = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
    moved = {}
    for half in (False, True):
        layer = _layer()
        before = layer.weight.value.copy()
        layer.forward(x)
        mixed_precision_step(
            layer, SGD(layer.parameters(), lr=1.0), grad, half=half, fmt="bfloat16"
        )
        moved[half] = layer.weight.value - before
    error = np.linalg.norm(moved[True] - moved[False]) / np.linalg.norm(moved[False])
    assert 0 < error < 2 * format_limits("bfloat16")["eps"]


def test_an_update_below_half_the_gap_is_lost_on_bfloat16_weights():
    weights = np.ones(4, dtype=np.float32)
    update = np.array([1e-3, 1e-3, 0.1, 0.0], dtype=np.float32)  # gap at 1: 2^-7 = 0.0078
    result = rounded_update(weights, update, "bfloat16")
    assert result.realized[0] == 0
    assert result.realized[1] == 0
    assert abs(result.realized[2] - 0.1) <= 2.0**-8  # kept, rounded
    assert result.lost == pytest.approx(2 / 3)
    kept = rounded_update(weights, update, "float16")  # gap at 1: 2^-10
    assert kept.lost == 0
    assert kept.relative_error < result.relative_error


def test_float32_master_weights_keep_an_update_that_bfloat16_weights_lose():
    weights = np.ones(4, dtype=np.float32)
    update = np.array([1e-3, 1e-3, 0.1, 0.0], dtype=np.float32)
    master = rounded_update(weights, update, "float32")
    assert master.lost == 0
    np.testing.assert_allclose(master.realized, update, rtol=2.0**-23 / 1e-3)  # ulp(1) / update
    assert master.relative_error < 1e-4 < rounded_update(weights, update, "bfloat16").lost
    tiny = np.array([2.0**-25], dtype=np.float32)  # below half of float32's gap at 1
    assert rounded_update(np.ones(1, np.float32), tiny, "float32").lost == 1


def test_float64_goes_to_bfloat16_through_float32():
    x = np.array([1 + 2.0**-8 + 2.0**-30])  # just above halfway between 1 and 1 + 2^-7
    assert round_to(x, "bfloat16")[0] == 1.0  # double rounding: the farther neighbour
    assert round_to(x.astype(np.float32), "bfloat16")[0] == 1.0
    assert round_to(np.array([2.0**-134], np.float32), "bfloat16")[0] == 0  # half: ties to even
    assert round_to(np.array([1 + 2.0**-11 + 2.0**-30]), "float16")[0] == 1 + 2.0**-10  # direct


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="fmt"):
        round_to(np.ones(2, dtype=np.float32), "float8")
    with pytest.raises(TypeError, match="x must be"):
        round_to(np.ones(2, dtype=int), "bfloat16")
    with pytest.raises(ValueError, match="fmt"):
        rounded_update(np.ones(2, dtype=np.float32), np.ones(2, dtype=np.float32), "int8")
    with pytest.raises(TypeError, match="weights must be"):
        rounded_update(np.ones(2, dtype=int), np.ones(2, dtype=int), "float32")
    with pytest.raises(ValueError, match="update must have"):
        rounded_update(np.ones(2, dtype=np.float32), np.ones(3, dtype=np.float32), "bfloat16")
    layer = _layer()
    layer.forward(np.ones((1, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="fmt"):
        mixed_precision_step(
            layer, SGD(layer.parameters(), lr=1.0), np.ones((1, 3), np.float32), fmt="fp8"
        )
