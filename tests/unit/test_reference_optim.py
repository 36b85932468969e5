"""Optimizers, clipping and schedules agree with PyTorch's (run with ``nox -s reference``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer.module import Parameter
from tinyformer.optim import SGD, Adam, AdamW, clip_grad_norm
from tinyformer.schedules import InverseSqrtSchedule, WarmupCosineSchedule

pytestmark = pytest.mark.reference
torch = pytest.importorskip("torch")

N_STEPS = 8
SHAPES = [(5, 3), (3,), (2, 2, 4)]

CASES = {
    "sgd": (
        lambda ps: SGD(ps, 0.1),
        lambda ts: torch.optim.SGD(ts, lr=0.1),
    ),
    "sgd-momentum-decay": (
        lambda ps: SGD(ps, 0.05, momentum=0.9, weight_decay=0.01),
        lambda ts: torch.optim.SGD(ts, lr=0.05, momentum=0.9, weight_decay=0.01),
    ),
    "sgd-nesterov-decay": (
        lambda ps: SGD(ps, 0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
        lambda ts: torch.optim.SGD(ts, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
    ),
    "sgd-dampening": (
        lambda ps: SGD(ps, 0.05, momentum=0.7, dampening=0.25),
        lambda ts: torch.optim.SGD(ts, lr=0.05, momentum=0.7, dampening=0.25),
    ),
    "adam": (
        lambda ps: Adam(ps, 0.01),
        lambda ts: torch.optim.Adam(ts, lr=0.01),
    ),
    "adam-l2": (
        lambda ps: Adam(ps, 0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05),
        lambda ts: torch.optim.Adam(ts, lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05),
    ),
    "adamw": (
        lambda ps: AdamW(ps, 0.01),
        lambda ts: torch.optim.AdamW(ts, lr=0.01),
    ),
    "adamw-decay": (
        lambda ps: AdamW(ps, 0.03, betas=(0.85, 0.99), weight_decay=0.1),
        lambda ts: torch.optim.AdamW(ts, lr=0.03, betas=(0.85, 0.99), weight_decay=0.1),
    ),
}


def _gradient(value: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """A gradient that depends on where the parameter is, so the two runs must stay together."""
    return noise + 0.5 * value**3 - value


@pytest.mark.parametrize("case", CASES)
def test_updates_agree_with_torch_over_several_steps(case, rng):
    ours, theirs = CASES[case]
    start = [rng.standard_normal(shape) for shape in SHAPES]
    params = [Parameter(x.copy()) for x in start]
    tensors = [torch.tensor(x.copy(), dtype=torch.float64, requires_grad=True) for x in start]
    opt, ref = ours(params), theirs(tensors)
    for _ in range(N_STEPS):
        noise = [rng.standard_normal(shape) for shape in SHAPES]
        for p, t, n in zip(params, tensors, noise, strict=True):
            p.grad[...] = _gradient(p.value, n)
            t.grad = torch.from_numpy(_gradient(t.detach().numpy(), n))
        opt.step()
        ref.step()
        for p, t in zip(params, tensors, strict=True):
            np.testing.assert_allclose(p.value, t.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert max(abs(p.value - x).max() for p, x in zip(params, start, strict=True)) > 1e-3


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e3])
def test_clip_grad_norm_agrees_with_torch(max_norm, rng):
    grads = [rng.standard_normal(shape) for shape in SHAPES]
    params = [Parameter(np.zeros(shape)) for shape in SHAPES]
    tensors = [torch.zeros(shape, dtype=torch.float64, requires_grad=True) for shape in SHAPES]
    for p, t, g in zip(params, tensors, grads, strict=True):
        p.grad[...] = g
        t.grad = torch.from_numpy(g.copy())
    ours = clip_grad_norm(params, max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(tensors, max_norm)
    assert math.isclose(ours, float(theirs), rel_tol=1e-14)
    for p, t in zip(params, tensors, strict=True):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-14, atol=0)


def _torch_rates(schedule, peak: float, n_steps: int) -> list[float]:
    """The rate torch uses at each step under LambdaLR with our schedule, divided by ``peak``."""
    tensor = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([tensor], lr=peak)
    # LambdaLR's epoch e is the (e + 1)-th update: our schedules count updates from 1
    lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: schedule(e + 1) / peak)
    rates = []
    for _ in range(n_steps):
        rates.append(opt.param_groups[0]["lr"])
        tensor.grad = torch.ones(1, dtype=torch.float64)
        opt.step()
        lam.step()
    return rates


def _our_rates(schedule, n_steps: int) -> list[float]:
    param = Parameter(np.zeros(1))
    opt = SGD([param], schedule)
    rates = []
    for _ in range(n_steps):
        rates.append(opt.lr)
        param.grad[...] = 1.0
        opt.step()
    return rates


def test_warmup_cosine_agrees_with_torch_schedulers():
    peak, warmup, total, floor = 3e-3, 20, 120, 1e-4
    schedule = WarmupCosineSchedule(peak, warmup, total, min_lr=floor)
    ours = _our_rates(schedule, 150)
    np.testing.assert_allclose(ours, _torch_rates(schedule, peak, 150), rtol=1e-13)
    # against torch's own LinearLR for the warm-up, and the cosine formula torch documents
    tensor = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([tensor], lr=peak)
    linear = torch.optim.lr_scheduler.LinearLR(
        opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1
    )
    for t in range(1, warmup + 1):
        assert math.isclose(opt.param_groups[0]["lr"], ours[t - 1], rel_tol=1e-12)
        tensor.grad = torch.ones(1)
        opt.step()
        linear.step()
    for t in range(warmup, total + 1):
        cosine = (
            floor + (peak - floor) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2
        )
        assert math.isclose(ours[t - 1], cosine, rel_tol=1e-13)


def test_inverse_sqrt_agrees_with_the_formula_under_torch():
    d_model, warmup = 256, 40
    schedule = InverseSqrtSchedule(d_model, warmup)
    peak = schedule.peak_lr
    ours = _our_rates(schedule, 200)
    np.testing.assert_allclose(ours, _torch_rates(schedule, peak, 200), rtol=1e-13)
    formula = [d_model**-0.5 * min(t**-0.5, t * warmup**-1.5) for t in range(1, 201)]
    np.testing.assert_allclose(ours, formula, rtol=1e-15)


@pytest.mark.parametrize("case", ["sgd-nesterov-decay", "adamw-decay"])
def test_float32_updates_agree_with_torch(case, rng):
    ours, theirs = CASES[case]
    start = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    params = [Parameter(x.copy()) for x in start]
    tensors = [torch.tensor(x.copy(), requires_grad=True) for x in start]
    opt, ref = ours(params), theirs(tensors)
    for _ in range(N_STEPS):
        grads = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
        for p, t, g in zip(params, tensors, grads, strict=True):
            p.grad[...] = g
            t.grad = torch.from_numpy(g.copy())
        opt.step()
        ref.step()
    for p, t in zip(params, tensors, strict=True):
        assert p.value.dtype == np.float32
        np.testing.assert_allclose(p.value, t.detach().numpy(), rtol=1e-5, atol=1e-6)
