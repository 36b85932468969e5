r"""Mixed precision: loss scaling, float32 master weights, float16 gradients simulated.

float16 keeps 10 bits of mantissa and 5 of exponent: the largest finite value is 65504,
the smallest normal one :math:`2^{-14} \approx 6.1 \times 10^{-5}` and the smallest
subnormal :math:`2^{-24} \approx 6.0 \times 10^{-8}`. Small gradients round to zero
(underflow) and large ones to infinity (overflow). :cite:t:`micikevicius2018mixed` keep a
float32 master copy of the weights and multiply the loss by a factor :math:`S` before the
backward pass, which multiplies every gradient by :math:`S` (the chain rule is linear) and
lifts the small ones above float16's floor; the gradients are divided by :math:`S` in
float32 before the update:

.. math:: g = \frac{1}{S}\,\operatorname{fp16}\!\left(\nabla_\theta (S\,\mathcal{L})\right)

A static scaler keeps :math:`S` fixed. A dynamic scaler halves :math:`S` and skips the
update whenever a gradient overflows, and doubles it after ``growth_interval`` steps in a
row without overflow, so :math:`S` hovers just below the largest safe value.

This library computes in float32 or float64 only; :func:`mixed_precision_step` simulates
float16 gradients by rounding to float16 (and back) the gradient of the logits, where the
backward pass starts, and each parameter's gradient. That shows their underflow and
overflow, though not the rounding of every intermediate gradient inside the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_float, positive_int
from tinyformer.module import Module
from tinyformer.moe import MixtureOfExperts
from tinyformer.optim import Optimizer

__all__ = ["DynamicLossScaler", "StaticLossScaler", "StepReport", "mixed_precision_step"]


class StaticLossScaler:
    r"""Multiply the loss by a fixed :math:`S`; skip a step whose gradients overflowed.

    Parameters
    ----------
    scale : float
        :math:`S > 0`; a power of two, so that scaling and unscaling are exact.
    """

    def __init__(self, scale: float = 2.0**10) -> None:
        self.scale = positive_float(scale, "scale")

    def update(self, finite: bool) -> bool:
        """Record one step's outcome; return whether the optimizer may step."""
        return bool(finite)


class DynamicLossScaler(StaticLossScaler):
    r"""Halve :math:`S` on overflow (and skip the step), double it after a run of good steps.

    Parameters
    ----------
    scale : float
        Initial :math:`S`.
    growth_interval : int
        Steps in a row without overflow after which :math:`S` grows.
    growth_factor, backoff_factor : float
        :math:`S \leftarrow S \cdot` growth after a good run, :math:`S \cdot` backoff
        after an overflow (2 and 1/2 by default).
    """

    def __init__(
        self,
        scale: float = 2.0**16,
        *,
        growth_interval: int = 2000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
    ) -> None:
        super().__init__(scale)
        self.growth_interval = positive_int(growth_interval, "growth_interval")
        self.growth_factor = positive_float(growth_factor, "growth_factor")
        self.backoff_factor = positive_float(backoff_factor, "backoff_factor")
        if self.growth_factor <= 1 or self.backoff_factor >= 1:
            raise ValueError(
                f"growth_factor must be > 1 and backoff_factor < 1, got {growth_factor}"
                f" and {backoff_factor}"
            )
        self.good_steps = 0

    def update(self, finite: bool) -> bool:
        """Back off and refuse the step on overflow; grow after ``growth_interval`` good steps."""
        if not finite:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0
        return True


@dataclass(frozen=True)
class StepReport:
    """What one :func:`mixed_precision_step` did.

    Attributes
    ----------
    stepped : bool
        Whether the optimizer updated the weights.
    scale : float
        The loss scale used for this step.
    zeroed_logit_gradients : float
        Fraction of the non-zero entries of the (scaled) logits' gradient that float16
        rounded to zero: the backward pass never sees them.
    zeroed_parameter_gradients : float
        The same for the parameters' gradients.
    overflow : bool
        Whether some gradient became infinite or NaN.
    """

    stepped: bool
    scale: float
    zeroed_logit_gradients: float
    zeroed_parameter_gradients: float
    overflow: bool


def _round_to_float16(grad: np.ndarray) -> tuple[np.ndarray, int, int]:
    """``grad`` rounded to float16 and back; the count of non-zeros lost and of non-zeros."""
    with np.errstate(over="ignore"):  # overflow to inf is the point
        half = grad.astype(np.float16)
    nonzero = grad != 0
    lost = int(np.count_nonzero(nonzero & (half == 0)))
    return half.astype(grad.dtype), lost, int(np.count_nonzero(nonzero))


def mixed_precision_step(
    model: Module,
    optimizer: Optimizer,
    grad_logits: np.ndarray,
    scaler: StaticLossScaler | None = None,
    *,
    half: bool = True,
) -> StepReport:
    r"""Back-propagate a scaled loss in simulated float16, unscale, and step unless it overflowed.

    Call after ``model.forward`` and the loss: ``grad_logits`` is
    :math:`\partial\mathcal{L}/\partial z`. The model's float32 (or float64) parameters
    are the master weights.

    Parameters
    ----------
    model : Module
        The model whose forward pass was just run.
    optimizer : Optimizer
        Updates the model's parameters.
    grad_logits : numpy.ndarray
        Gradient of the (unscaled) loss with respect to the logits.
    scaler : StaticLossScaler or DynamicLossScaler, optional
        None: no scaling (:math:`S = 1`).
    half : bool
        Round the gradients to float16 (False: a full-precision step, the reference).

    Returns
    -------
    StepReport
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a tinyformer Optimizer, got {describe(optimizer)}")
    if scaler is not None and not isinstance(scaler, StaticLossScaler):
        raise TypeError(f"scaler must be a loss scaler or None, got {describe(scaler)}")
    scale = 1.0 if scaler is None else scaler.scale
    model.zero_grad()
    grad = grad_logits * grad_logits.dtype.type(scale)  # the gradient of S * loss
    lost = total = 0
    if half:  # the backward pass starts from a float16 gradient of the logits
        grad, lost, total = _round_to_float16(grad)
    if not np.isfinite(grad).all():  # overflow already: no backward pass, no step
        model._cache = None
        stepped = False if scaler is None else scaler.update(False)
        return StepReport(stepped, scale, lost / total if total else 0.0, 0.0, True)
    # a mixture-of-experts layer adds its load-balancing gradient itself, so it must be
    # scaled with the loss too (it is unscaled below with every other gradient)
    routers = [m for m in model.modules() if isinstance(m, MixtureOfExperts) and m.aux_loss_weight]
    weights = [m.aux_loss_weight for m in routers]
    for m in routers:
        m.aux_loss_weight = m.aux_loss_weight * scale
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected below
            model.backward(grad)
    finally:
        for m, w in zip(routers, weights, strict=True):
            m.aux_loss_weight = w
    lost_params = total_params = 0
    for p in optimizer.parameters:
        g: Any = p.grad
        if half:
            g, n_lost, n_total = _round_to_float16(g)
            lost_params, total_params = lost_params + n_lost, total_params + n_total
        with np.errstate(invalid="ignore"):  # inf / S stays inf
            p.grad[...] = g / p.grad.dtype.type(scale)  # unscale in full precision
    finite = all(np.isfinite(p.grad).all() for p in optimizer.parameters)
    stepped = finite if scaler is None else scaler.update(finite)
    if stepped:
        optimizer.step()
    return StepReport(
        stepped,
        scale,
        lost / total if total else 0.0,
        lost_params / total_params if total_params else 0.0,
        not finite,
    )
