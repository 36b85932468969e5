"""Loss scaling: the dynamic scaler's rules and float16 gradients simulated."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.layers import Linear
from tinyformer.moe import MixtureOfExperts
from tinyformer.optim import SGD
from tinyformer.training.mixed_precision import (
    DynamicLossScaler,
    StaticLossScaler,
    mixed_precision_step,
)


def test_dynamic_scaler_halves_on_overflow_and_grows_after_good_steps():
    scaler = DynamicLossScaler(2.0**10, growth_interval=3)
    assert scaler.update(False) is False
    assert scaler.scale == 2.0**9
    assert [scaler.update(True) for _ in range(2)] == [True, True]
    assert scaler.scale == 2.0**9
    assert scaler.update(True)
    assert scaler.scale == 2.0**10
    scaler.update(True)
    scaler.update(False)  # an overflow resets the run of good steps
    assert scaler.scale == 2.0**9
    scaler.update(True)
    scaler.update(True)
    assert scaler.scale == 2.0**9


def _layer(scale_of_weights=1.0):
    layer = Linear(4, 3, rng=np.random.default_rng(0), dtype=np.float32)
    layer.weight.value *= np.float32(scale_of_weights)
    return layer


def test_unscaled_float16_gradients_underflow_and_scaled_ones_do_not():
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    grad = np.full((5, 3), 1e-8, dtype=np.float32)  # below float16's smallest subnormal
    reports = {}
    for name, scaler in {"none": None, "static": StaticLossScaler(2.0**12)}.items():
        layer = _layer()
        layer.forward(x)
        reports[name] = mixed_precision_step(layer, SGD(layer.parameters(), lr=1.0), grad, scaler)
    assert reports["none"].zeroed_logit_gradients == 1.0
    assert reports["static"].zeroed_logit_gradients == 0.0
    assert reports["static"].stepped
    assert not reports["static"].overflow


def test_scaled_step_matches_full_precision_and_overflow_skips_the_step():
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    grad = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32) * np.float32(1e-3)
    full, scaled = _layer(), _layer()
    for layer, scaler, half in [(full, None, False), (scaled, StaticLossScaler(2.0**8), True)]:
        layer.forward(x)
        mixed_precision_step(layer, SGD(layer.parameters(), lr=1.0), grad, scaler, half=half)
    np.testing.assert_allclose(scaled.weight.value, full.weight.value, rtol=0, atol=1e-5)
    layer = _layer()
    before = layer.weight.value.copy()
    scaler = DynamicLossScaler(2.0**30, growth_interval=5)
    layer.forward(x)
    report = mixed_precision_step(layer, SGD(layer.parameters(), lr=1.0), grad, scaler)
    assert report.overflow
    assert not report.stepped
    assert scaler.scale == 2.0**29
    np.testing.assert_array_equal(layer.weight.value, before)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: StaticLossScaler(0.0), "scale must be a finite positive number, got 0.0"),
        (lambda: DynamicLossScaler(growth_interval=0), "growth_interval must be a positive"),
        (lambda: DynamicLossScaler(growth_factor=0.5), "growth_factor must be > 1 .* got 0.5"),
        (lambda: DynamicLossScaler(backoff_factor=2.0), "backoff_factor < 1, got .* and 2.0"),
    ],
)
def test_bad_scaler_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_bad_step_arguments():
    layer = _layer()
    opt = SGD(layer.parameters(), lr=0.1)
    grad = np.zeros((1, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="model must be"):
        mixed_precision_step("m", opt, grad)
    with pytest.raises(TypeError, match="optimizer must be"):
        mixed_precision_step(layer, "adam", grad)
    with pytest.raises(TypeError, match="scaler must be"):
        mixed_precision_step(layer, opt, grad, 1024)


def test_the_load_balancing_gradient_is_scaled_with_the_loss():
    # with no task gradient, what reaches the router is the load-balancing term alone: the
    # loss scale must not shrink it (it did by the factor S before the layer was scaled too)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4))
    router = {}
    for scaler in (None, StaticLossScaler(1024.0)):
        layer = MixtureOfExperts(
            4, 5, 4, top_k=2, rng=np.random.default_rng(0), aux_loss_weight=1.0
        )
        layer.forward(x)
        optimizer = SGD(layer.parameters(), lr=0.0)
        mixed_precision_step(layer, optimizer, np.zeros((6, 4)), scaler, half=False)
        router[scaler is None] = layer.router.weight.grad.copy()
        assert layer.aux_loss_weight == 1.0  # restored after the backward pass
    assert np.abs(router[True]).max() > 0
    np.testing.assert_allclose(router[False], router[True], rtol=1e-12, atol=0)
