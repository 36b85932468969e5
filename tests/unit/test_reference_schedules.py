"""Learning-rate schedules against PyTorch's own schedulers (not LambdaLR around ours).

``WarmupCosineSchedule`` is the curve of ``SequentialLR(LinearLR, CosineAnnealingLR)``:
a linear ramp to the peak over the warm-up, then a half cosine down to ``min_lr``.
Torch's cosine scheduler is periodic after ``T_max``, ours stays at ``min_lr``, so the
two are compared up to ``total_steps``. ``InverseSqrtSchedule`` has no scheduler in
torch (only through LambdaLR, which would compare our formula with itself), so it is
checked against its formula in ``test_schedules.py`` and not here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer.module import Parameter
from tinyformer.optim import SGD
from tinyformer.schedules import WarmupCosineSchedule

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.reference


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


def _torch_rates(peak: float, warmup: int, total: int, floor: float, n_steps: int) -> list[float]:
    """The rate torch's warm-up + cosine schedulers give at updates 1 .. n_steps."""
    tensor = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([tensor], lr=peak)
    # update t (from 1) is torch's epoch t - 1; the ramp reaches the peak at update `warmup`
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


@pytest.mark.parametrize(
    ("peak", "warmup", "total", "floor"),
    [(3e-3, 20, 120, 1e-4), (1e-2, 5, 400, 0.0), (5e-4, 2, 11, 5e-5)],
)
def test_warmup_cosine_agrees_with_torch_linear_then_cosine_annealing(peak, warmup, total, floor):
    ours = _our_rates(WarmupCosineSchedule(peak, warmup, total, min_lr=floor), total)
    theirs = _torch_rates(peak, warmup, total, floor, total)
    # torch's cosine is computed recursively from the previous rate, so it drifts by rounding
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-15)
    assert math.isclose(ours[warmup - 1], peak, rel_tol=1e-15)
    assert math.isclose(ours[-1], floor, rel_tol=0, abs_tol=1e-15)
