"""Learning-rate schedules: the formulas, their shape, bad input, and PyTorch's schedulers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.module import Parameter
from tinyformer.optim import SGD
from tinyformer.schedules import InverseSqrtSchedule, WarmupCosineSchedule


def test_inverse_sqrt_values_from_the_paper_setting():
    schedule = InverseSqrtSchedule(d_model=512, warmup_steps=4000)
    assert schedule(0) == 0.0
    assert schedule(1) == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-15)
    assert schedule(4000) == pytest.approx(1 / math.sqrt(512 * 4000), rel=1e-15)
    assert schedule(16384) == pytest.approx(512**-0.5 / 128, rel=1e-15)
    assert schedule.peak_lr == schedule(4000)


def test_inverse_sqrt_rises_linearly_then_decays(rng):
    schedule = InverseSqrtSchedule(64, warmup_steps=100, scale=2.0)
    rates = np.array([schedule(t) for t in range(1, 1001)])
    assert np.argmax(rates) == 99
    np.testing.assert_allclose(rates[:100], rates[0] * np.arange(1, 101), rtol=1e-12)
    assert (np.diff(rates[99:]) < 0).all()
    assert rates[399] == pytest.approx(rates[99] / 2, rel=1e-12)  # 4x the steps, half the rate


def test_scale_multiplies_the_whole_schedule():
    a, b = InverseSqrtSchedule(128, 50), InverseSqrtSchedule(128, 50, scale=3.0)
    for t in (1, 10, 50, 500):
        assert b(t) == pytest.approx(3 * a(t), rel=1e-15)


def test_warmup_cosine_landmarks():
    schedule = WarmupCosineSchedule(1e-3, warmup_steps=10, total_steps=110, min_lr=1e-5)
    assert schedule(0) == 0.0
    assert schedule(5) == pytest.approx(5e-4, rel=1e-15)
    assert schedule(10) == pytest.approx(1e-3, rel=1e-15)
    assert schedule(60) == pytest.approx((1e-3 + 1e-5) / 2, rel=1e-12)  # half way down
    assert schedule(110) == pytest.approx(1e-5, rel=1e-12)
    assert schedule(10_000) == 1e-5


def test_warmup_cosine_without_warmup_starts_at_the_peak():
    schedule = WarmupCosineSchedule(0.1, warmup_steps=0, total_steps=10)
    assert schedule(0) == 0.1
    assert schedule(10) == 0.0


@given(st.integers(0, 50), st.integers(1, 200), st.floats(0.0, 1.0))
def test_warmup_cosine_shape(warmup, decay, floor):
    peak = 0.5
    schedule = WarmupCosineSchedule(peak, warmup, warmup + decay, min_lr=peak * floor)
    rates = np.array([schedule(t) for t in range(warmup + decay + 5)])
    assert (np.diff(rates[: warmup + 1]) >= 0).all()
    assert (np.diff(rates[warmup:]) <= 1e-15).all()
    assert rates.max() == pytest.approx(peak, rel=1e-15)
    assert rates[warmup + decay :].min() == pytest.approx(peak * floor, rel=1e-12, abs=1e-15)


def test_step_may_be_a_numpy_integer():
    assert InverseSqrtSchedule(16, 4)(np.int64(4)) == InverseSqrtSchedule(16, 4)(4)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: InverseSqrtSchedule(0), ValueError, "d_model must be a positive"),
        (lambda: InverseSqrtSchedule(512, 0), ValueError, "warmup_steps must be a positive"),
        (lambda: InverseSqrtSchedule(512, -10), ValueError, "warmup_steps must be a positive"),
        (lambda: InverseSqrtSchedule(512, 4000.0), TypeError, "warmup_steps"),
        (
            lambda: InverseSqrtSchedule(512, scale=0.0),
            ValueError,
            "scale must be a finite positive",
        ),
        (lambda: InverseSqrtSchedule(512)(-1), ValueError, "step must be a non-negative"),
        (lambda: InverseSqrtSchedule(512)(1.5), TypeError, "step must be a non-negative"),
        (
            lambda: WarmupCosineSchedule(0.0, 10, 100),
            ValueError,
            "peak_lr must be a finite positive",
        ),
        (lambda: WarmupCosineSchedule(-1e-3, 10, 100), ValueError, "peak_lr"),
        (
            lambda: WarmupCosineSchedule(1e-3, -1, 100),
            ValueError,
            "warmup_steps must be a non-negative",
        ),
        (
            lambda: WarmupCosineSchedule(1e-3, 100, 100),
            ValueError,
            "total_steps must exceed warmup_steps=100",
        ),
        (lambda: WarmupCosineSchedule(1e-3, 10, 0), ValueError, "total_steps must be a positive"),
        (
            lambda: WarmupCosineSchedule(1e-3, 10, 100, min_lr=1e-2),
            ValueError,
            "min_lr must be at most",
        ),
        (
            lambda: WarmupCosineSchedule(1e-3, 10, 100, min_lr=-1.0),
            ValueError,
            "min_lr must be a finite",
        ),
        (lambda: WarmupCosineSchedule(1e-3, 10, 100)(True), TypeError, "step"),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


# ----------------------------------------------------------------- reference
def _our_rates(schedule, n_steps: int) -> list[float]:
    """The rate our optimizer uses at updates 1 .. n_steps."""
    param = Parameter(np.zeros(1))
    opt = SGD([param], schedule)
    rates = []
    for _ in range(n_steps):
        rates.append(opt.lr)
        param.grad[...] = 1.0
        opt.step()
    return rates


def _torch_rates(torch, peak, warmup, total, floor, n_steps):
    """The rates of torch's own warm-up then cosine schedulers at updates 1 .. n_steps.

    ``WarmupCosineSchedule`` is the curve of ``SequentialLR(LinearLR, CosineAnnealingLR)``:
    update t (from 1) is torch's epoch t - 1, and the ramp reaches the peak at update
    ``warmup``. Torch's cosine is periodic after ``T_max`` and ours stays at ``min_lr``,
    so they are compared up to ``total``. (``InverseSqrtSchedule`` has no scheduler in
    torch, only LambdaLR around our own function, which would compare it with itself:
    it is checked against its formula above.)
    """
    tensor = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([tensor], lr=peak)
    ramp = torch.optim.lr_scheduler.LinearLR(
        opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1
    )
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=floor)
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        opt, schedulers=[ramp, cosine], milestones=[warmup - 1]
    )
    rates = []
    for _ in range(n_steps):
        rates.append(opt.param_groups[0]["lr"])
        tensor.grad = torch.ones(1, dtype=torch.float64)
        opt.step()
        scheduler.step()
    return rates


@pytest.mark.reference
@pytest.mark.parametrize(
    ("peak", "warmup", "total", "floor"),
    [(3e-3, 20, 120, 1e-4), (1e-2, 5, 400, 0.0), (5e-4, 2, 11, 5e-5)],
)
def test_warmup_cosine_agrees_with_torch_linear_then_cosine_annealing(
    peak, warmup, total, floor, torch
):
    ours = _our_rates(WarmupCosineSchedule(peak, warmup, total, min_lr=floor), total)
    theirs = _torch_rates(torch, peak, warmup, total, floor, total)
    # torch's cosine is computed recursively from the previous rate, so it drifts by rounding
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-15)
    assert math.isclose(ours[warmup - 1], peak, rel_tol=1e-15)
    assert math.isclose(ours[-1], floor, rel_tol=0, abs_tol=1e-15)
