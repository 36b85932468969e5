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

The other 16-bit format, bfloat16 (studied for training by :cite:t:`kalamkar2019study`),
keeps float32's 8 exponent bits and 7 of its 23 stored mantissa bits: float32's range, with
a unit roundoff of :math:`2^{-8}` instead of float16's :math:`2^{-11}`. NumPy has no
bfloat16; the one of ``ml_dtypes`` (which JAX uses) rounds float32 to nearest, ties to even
(float64 it rounds through float32, see :func:`round_to`). ``fmt="bfloat16"`` in
:func:`mixed_precision_step` and :func:`round_to` selects it; :func:`format_limits` gives
each format's range and :func:`rounded_update` what a weight update loses when the
weights themselves are stored in a 16-bit format (no float32 master copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer._optional import ml_dtypes
from tinyformer._validation import describe, one_of, positive_float, positive_int
from tinyformer.module import Module
from tinyformer.moe import MixtureOfExperts
from tinyformer.optim import Optimizer

__all__ = [
    "HALF_FORMATS",
    "DynamicLossScaler",
    "StaticLossScaler",
    "StepReport",
    "UpdateRounding",
    "format_limits",
    "mixed_precision_step",
    "round_to",
    "rounded_update",
]

HALF_FORMATS: tuple[str, ...] = ("float16", "bfloat16")
"""The names of the 16-bit formats simulated here, IEEE float16 (NumPy's) and bfloat16 (the
``ml_dtypes`` package's, needed for bfloat16 only)."""


def _dtype(fmt: object, formats: tuple[str, ...]) -> Any:
    """The NumPy type of the format named ``fmt``, one of ``formats``."""
    name = one_of(fmt, formats, "fmt")
    if name == "bfloat16":
        return ml_dtypes().bfloat16
    return np.dtype(name).type


def _half(fmt: object) -> Any:
    return _dtype(fmt, HALF_FORMATS)


def format_limits(fmt: str) -> dict[str, float]:
    r"""The range and precision of a number format, as Python floats.

    ``"max"``, the largest finite value; ``"smallest_normal"``; ``"smallest_subnormal"``,
    at or below half of which a number rounds to zero (exactly half: ties to even); ``"eps"``, the gap between 1 and the
    next number, :math:`2^{-p}` for :math:`p` stored mantissa bits (the relative rounding
    error is at most half of it). ``fmt`` is ``"float16"``, ``"bfloat16"``, ``"float32"``
    or ``"float64"``.
    """
    dtype = _dtype(fmt, (*HALF_FORMATS, "float32", "float64"))
    info = ml_dtypes().finfo(dtype) if dtype.__name__ == "bfloat16" else np.finfo(dtype)
    names = ("max", "smallest_normal", "smallest_subnormal", "eps")
    return {name: float(getattr(info, name)) for name in names}


def round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    r"""``x`` rounded to the 16-bit format ``fmt`` (to nearest, ties to even) and back to its dtype.

    .. math:: \operatorname{fmt}(x) = x\,(1 + \delta), \qquad |\delta| \le \epsilon / 2

    for :math:`x` in the format's normal range (:func:`format_limits`); smaller numbers
    lose relative precision and, below half the smallest subnormal, become zero. ``fmt``
    is ``"float16"`` or ``"bfloat16"``; ``x`` a float32 or float64 array of any shape,
    returned with the same shape and dtype. Values beyond the format's range become
    infinite (no warning: overflow is what is studied).

    float32 input is rounded to nearest, ties to even. float64 input is rounded to bfloat16
    through float32 (``ml_dtypes``' cast), so a value within :math:`2^{-24}` (relative) of a
    halfway point can go to the farther neighbour; the bound on :math:`\delta` still holds.
    float64 to float16 is rounded directly (NumPy's cast).
    """
    half = _half(fmt)
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64):
        raise TypeError(f"x must be a float32 or float64 array, got {describe(x)}")
    with np.errstate(over="ignore"):
        return x.astype(half).astype(x.dtype)


@dataclass(frozen=True)
class UpdateRounding:
    r"""What :func:`rounded_update` found.

    Attributes
    ----------
    realized : numpy.ndarray
        The change of the stored weights, :math:`\tilde w - \operatorname{fmt}(\tilde w - \Delta)`.
    lost : float
        Share of the non-zero entries of the update that left their weight unchanged.
    relative_error : float
        :math:`\lVert \text{realized} - \Delta \rVert / \lVert \Delta \rVert`.
    """

    realized: np.ndarray
    lost: float
    relative_error: float


def _store(x: np.ndarray, fmt: str) -> np.ndarray:
    """``x`` stored in ``fmt`` and read back in its dtype: a 16-bit format, or float32."""
    if fmt == "float32":
        return x.astype(np.float32).astype(x.dtype)
    return round_to(x, fmt)


def rounded_update(weights: np.ndarray, update: np.ndarray, fmt: str) -> UpdateRounding:
    r"""The update :math:`\Delta` as it lands on weights stored in the format ``fmt``.

    The weights :math:`\tilde w = \operatorname{fmt}(w)` are already in the format (a model
    kept in 16 bits, without a float32 master copy); the new weights are rounded to it
    again, so the step that is actually taken is

    .. math:: \tilde w - \operatorname{fmt}(\tilde w - \Delta),

    and an entry of :math:`\Delta` smaller than half the gap between neighbouring numbers
    at :math:`\tilde w` is lost entirely. ``fmt`` is ``"float16"``, ``"bfloat16"`` or
    ``"float32"`` (float32 master weights, the reference). ``weights`` and ``update`` have
    the same shape and dtype, float32 or float64; the realized step is computed in that
    dtype (exactly: the difference of two nearby numbers of the format is exact in it).
    """
    if not isinstance(weights, np.ndarray) or not isinstance(update, np.ndarray):
        raise TypeError(
            f"weights and update must be arrays, got {describe(weights)} and {describe(update)}"
        )
    if weights.shape != update.shape or weights.dtype != update.dtype:
        raise ValueError(
            f"update must have the shape and dtype of weights {weights.shape} {weights.dtype},"
            f" got {update.shape} {update.dtype}"
        )
    if weights.dtype not in (np.float32, np.float64):
        raise TypeError(f"weights must be float32 or float64, got {weights.dtype}")
    one_of(fmt, (*HALF_FORMATS, "float32"), "fmt")
    stored = _store(weights, fmt)
    realized = stored - _store(stored - update, fmt)  # what the weights actually moved
    moved = update != 0
    lost = np.count_nonzero(moved & (realized == 0)) / max(np.count_nonzero(moved), 1)
    norm = np.linalg.norm(update)
    error = float(np.linalg.norm(realized - update) / norm) if norm else 0.0
    return UpdateRounding(realized, float(lost), error)


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
        Fraction of the non-zero entries of the (scaled) logits' gradient that the 16-bit
        format rounded to zero: the backward pass never sees them.
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


def _round_counted(grad: np.ndarray, fmt: str) -> tuple[np.ndarray, int, int]:
    """``grad`` rounded to ``fmt`` and back; the count of non-zeros lost and of non-zeros."""
    rounded = round_to(grad, fmt)
    nonzero = grad != 0
    lost = int(np.count_nonzero(nonzero & (rounded == 0)))
    return rounded, lost, int(np.count_nonzero(nonzero))


def mixed_precision_step(
    model: Module,
    optimizer: Optimizer,
    grad_logits: np.ndarray,
    scaler: StaticLossScaler | None = None,
    *,
    half: bool = True,
    fmt: str = "float16",
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
        Round the gradients to a 16-bit format (False: a full-precision step, the reference).
    fmt : str
        That format: ``"float16"`` (the default) or ``"bfloat16"``.

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
    _half(fmt)
    scale = 1.0 if scaler is None else scaler.scale
    model.zero_grad()
    grad = grad_logits * grad_logits.dtype.type(scale)  # the gradient of S * loss
    lost = total = 0
    if half:  # the backward pass starts from a float16 gradient of the logits
        grad, lost, total = _round_counted(grad, fmt)
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
            g, n_lost, n_total = _round_counted(g, fmt)
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
