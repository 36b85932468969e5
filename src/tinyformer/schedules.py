r"""Learning-rate schedules: functions from the step number to the learning rate.

A schedule is called with the number :math:`t = 1, 2, \dots` of the update about
to be made (``t = 0``, before training, is allowed and gives 0 during warm-up).
Pass one as the ``lr`` of an optimizer of :mod:`tinyformer.optim` and the
optimizer asks it before every step, so a resumed run follows the schedule
from where it stopped.

Both schedules start with a warm-up: the first updates, made while Adam's
moment estimates are still poor, are kept small.
"""

from __future__ import annotations

import math
import numbers
from typing import Protocol

from tinyformer._validation import (
    describe,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

__all__ = ["InverseSqrtSchedule", "Schedule", "WarmupCosineSchedule"]


class Schedule(Protocol):
    r"""What an optimizer takes as ``lr`` besides a number: a callable ``step -> lr``.

    Any callable that maps the step number to a learning rate :math:`\ge 0`
    will do, a plain function included; the two classes below are schedules.
    """

    def __call__(self, step: int) -> float:
        """The learning rate of step ``step``."""


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be a non-negative integer, got {describe(step)}")
    if step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step}")
    return int(step)


class InverseSqrtSchedule:
    r"""The original Transformer's schedule: linear warm-up, then decay as one over root t.

    The rate of :cite:t:`vaswani2017attention`:

    .. math::
        \eta_t = s \cdot d_\text{model}^{-1/2} \cdot
                 \min\bigl(t^{-1/2},\; t \cdot w^{-3/2}\bigr)

    The two terms meet at :math:`t = w`, where the rate peaks at
    :math:`s\,(d_\text{model}\, w)^{-1/2}`.

    Parameters
    ----------
    d_model : int
        Model width :math:`d_\text{model}`.
    warmup_steps : int
        :math:`w > 0`; the paper used 4000.
    scale : float
        :math:`s > 0`, a factor on the whole schedule (1 in the paper).
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, *, scale: float = 1.0) -> None:
        self.d_model = positive_int(d_model, "d_model")
        self.warmup_steps = positive_int(warmup_steps, "warmup_steps")
        self.scale = positive_float(scale, "scale")

    @property
    def peak_lr(self) -> float:
        """The largest rate, reached at step ``warmup_steps``."""
        return self(self.warmup_steps)

    def __call__(self, step: int) -> float:
        """The learning rate of step ``step``."""
        t = _check_step(step)
        if t == 0:
            return 0.0
        return self.scale * self.d_model**-0.5 * min(t**-0.5, t * self.warmup_steps**-1.5)

    def __repr__(self) -> str:
        return (
            f"InverseSqrtSchedule(d_model={self.d_model}, warmup_steps={self.warmup_steps},"
            f" scale={self.scale})"
        )


class WarmupCosineSchedule:
    r"""Linear warm-up to ``peak_lr``, then a half cosine down to ``min_lr``.

    The cosine is the annealing of :cite:t:`loshchilov2017sgdr`, run once:

    .. math::
        \eta_t = \begin{cases}
            \eta_\text{max}\, t / w & t < w \\
            \eta_\text{min} + \tfrac12 (\eta_\text{max} - \eta_\text{min})
                \bigl(1 + \cos(\pi\, \tfrac{t - w}{T - w})\bigr) & w \le t \le T \\
            \eta_\text{min} & t > T
        \end{cases}

    Parameters
    ----------
    peak_lr : float
        :math:`\eta_\text{max} > 0`, reached at step :math:`w`.
    warmup_steps : int
        :math:`w \ge 0` (0: no warm-up, the cosine starts from the peak at step 0).
    total_steps : int
        :math:`T > w`, where the rate reaches ``min_lr`` and stays.
    min_lr : float
        :math:`0 \le \eta_\text{min} \le \eta_\text{max}`.
    """

    def __init__(
        self, peak_lr: float, warmup_steps: int, total_steps: int, *, min_lr: float = 0.0
    ) -> None:
        self.peak_lr = positive_float(peak_lr, "peak_lr")
        self.warmup_steps = non_negative_int(warmup_steps, "warmup_steps")
        self.total_steps = positive_int(total_steps, "total_steps")
        if self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"total_steps must exceed warmup_steps={warmup_steps}, got {total_steps}"
            )
        self.min_lr = non_negative_float(min_lr, "min_lr")
        if self.min_lr > self.peak_lr:
            raise ValueError(f"min_lr must be at most peak_lr={peak_lr}, got {min_lr}")

    def __call__(self, step: int) -> float:
        """The learning rate of step ``step``."""
        t = _check_step(step)
        if t < self.warmup_steps:
            return self.peak_lr * t / self.warmup_steps
        if t >= self.total_steps:
            return self.min_lr
        progress = (t - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + (self.peak_lr - self.min_lr) * cosine

    def __repr__(self) -> str:
        return (
            f"WarmupCosineSchedule(peak_lr={self.peak_lr}, warmup_steps={self.warmup_steps},"
            f" total_steps={self.total_steps}, min_lr={self.min_lr})"
        )
