r"""Optimizers that update :class:`~tinyformer.module.Parameter` values from their gradients.

Each optimizer holds a list of parameters, a learning rate (a number, or a
schedule: a function of the step number, see :mod:`tinyformer.schedules`), a
step count and per-parameter buffers (momentum, moment estimates). One call of
:meth:`Optimizer.step` makes one update from the gradients accumulated in
``parameter.grad``; :meth:`Optimizer.zero_grad` clears them for the next batch.

The update rules are those of ``torch.optim`` (and agree with it to rounding,
see the reference tests). Step :math:`t` counts from 1, :math:`g_t` is the
gradient, :math:`\eta_t` the learning rate and :math:`\lambda` the weight decay.
Parameters keep their dtype: float32 stays float32.

:meth:`Optimizer.state_dict` returns a flat mapping of plain numbers and arrays
(hyperparameters, step count, buffers); loading it into an optimizer over the
same parameters resumes exactly where the saved one stopped.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tinyformer._validation import (
    describe,
    non_negative_float,
    non_negative_int,
    positive_float,
    unit_interval,
)
from tinyformer.module import Parameter
from tinyformer.schedules import Schedule

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Optimizer",
    "clip_grad_norm",
    "grad_norm",
    "one_dimensional",
]


def _check_parameters(parameters: object) -> list[Parameter]:
    if isinstance(parameters, Parameter) or not isinstance(parameters, Iterable):
        raise TypeError(f"parameters must be an iterable of Parameter, got {describe(parameters)}")
    params = list(parameters)
    if not params:
        raise ValueError("parameters must hold at least one Parameter, got none")
    for i, p in enumerate(params):
        if not isinstance(p, Parameter):
            raise TypeError(f"parameters[{i}] must be a Parameter, got {describe(p)}")
    if len({id(p) for p in params}) != len(params):
        raise ValueError("parameters must not list the same Parameter twice")
    return params


def _check_trainable(params: list[Parameter], when: str) -> None:
    """Raise if a parameter is frozen, naming it by its index and shape and saying what to pass."""
    frozen = [i for i, p in enumerate(params) if not p.requires_grad]
    if frozen:
        i = frozen[0]
        raise ValueError(
            f"parameters[{i}] (shape {params[i].shape}) is frozen (requires_grad=False){when};"
            f" {len(frozen)} of the {len(params)} parameters are: an optimizer updates trainable"
            " parameters only, so pass model.trainable_parameters() rather than"
            " model.parameters() (after apply_lora or Module.freeze), or unfreeze them"
        )


def _check_lr(lr: object, name: str = "lr") -> float:
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise TypeError(f"{name} must be a non-negative number or a schedule, got {describe(lr)}")
    return non_negative_float(lr, name)


def _scalar(value: object) -> object:
    """A 0-d array (as a saved scalar comes back from ``np.savez``) as a Python scalar."""
    return value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value


class Optimizer:
    r"""The machinery every optimizer shares; subclasses implement ``_update``.

    Parameters
    ----------
    parameters : list of Parameter
        The parameters to update (e.g. ``model.parameters()``, or
        ``model.trainable_parameters()`` when part of the model is frozen),
        each once. None may be frozen.
    lr : float or Schedule
        A learning rate :math:`\ge 0`, or a schedule ``step -> lr`` called
        with the number (from 1) of the step about to be made.

    Raises
    ------
    ValueError
        If a parameter is frozen (``requires_grad`` False), here or at a
        :meth:`step`. A frozen parameter is refused rather than skipped: an
        optimizer that kept it would keep moment buffers for it (for Adam,
        twice its size: after :func:`~tinyformer.lora.apply_lora`, twice the
        base model, which is what low-rank adapters exist to avoid) and could
        still move it (momentum, decoupled weight decay), while one that
        skipped it silently would hide the mistake of passing
        ``model.parameters()``. Refusing says so at once.
    """

    #: names of the per-parameter buffers, each a list of arrays shaped like the parameters
    buffer_names: tuple[str, ...] = ()

    def __init__(self, parameters: Iterable[Parameter], lr: float | Schedule) -> None:
        self.parameters = _check_parameters(parameters)
        _check_trainable(self.parameters, "")
        self.lr = lr
        self.step_count = 0
        self.buffers = {
            name: [np.zeros_like(p.value) for p in self.parameters] for name in self.buffer_names
        }

    # ------------------------------------------------------------ learning rate
    @property
    def lr(self) -> float:
        """The learning rate the next :meth:`step` will use."""
        return self._lr_at(self.step_count + 1)

    @lr.setter
    def lr(self, value: float | Schedule) -> None:
        self._lr: float | Schedule = value if callable(value) else _check_lr(value)

    @property
    def schedule(self) -> Schedule | None:
        """The learning-rate schedule, or None for a constant rate."""
        return self._lr if callable(self._lr) else None

    def _lr_at(self, step: int) -> float:
        if not callable(self._lr):
            return self._lr
        value = self._lr(step)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"the schedule must return a number, got {describe(value)} at step {step}"
            )
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"the schedule must return a finite lr >= 0, got {value} at step {step}"
            )
        return float(value)

    # ------------------------------------------------------------------ update
    def hyperparameters(self) -> dict[str, Any]:
        """The settings of the update rule (without the learning rate)."""
        return {}

    def _configure(self, **settings: Any) -> None:
        """Check and set the settings that :meth:`hyperparameters` reports."""

    def _update(self, i: int, p: Parameter, lr: float) -> None:
        """Update parameter ``i`` from ``p.grad`` at step ``self.step_count``."""
        raise NotImplementedError

    def _check_grads(self) -> None:
        """Raise before touching any parameter if one was frozen, or a gradient is wrong or not finite."""
        _check_trainable(
            self.parameters, " since the optimizer was made; no parameter was updated"
        )
        for i, p in enumerate(self.parameters):
            if not isinstance(p.grad, np.ndarray) or p.grad.shape != p.value.shape:
                raise ValueError(
                    f"parameters[{i}].grad must be an array of the parameter's shape {p.shape},"
                    f" got {describe(p.grad)}"
                )
            if not np.isfinite(p.grad).all():
                raise ValueError(
                    f"parameters[{i}].grad contains NaN or infinite values at step"
                    f" {self.step_count + 1}; no parameter was updated"
                )

    def step(self) -> None:
        """Make one update of every parameter from its accumulated gradient."""
        lr = self._lr_at(self.step_count + 1)
        self._check_grads()
        self.step_count += 1
        for i, p in enumerate(self.parameters):
            self._update(i, p, lr)

    def zero_grad(self) -> None:
        """Set every parameter's gradient to zero."""
        for p in self.parameters:
            p.zero_grad()

    # ------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: name, step count, settings, lr and buffer copies.

        Keys: ``"optimizer"`` (the class name), ``"step"``, the
        :meth:`hyperparameters`, ``"lr"`` (only for a constant rate: a schedule
        is a function of the step and belongs to the configuration) and
        ``"<buffer>.<i>"`` for each buffer of parameter ``i``.
        """
        state: dict[str, Any] = {"optimizer": type(self).__name__, "step": self.step_count}
        state.update(self.hyperparameters())
        if not callable(self._lr):
            state["lr"] = self._lr
        for name, arrays in self.buffers.items():
            for i, a in enumerate(arrays):
                state[f"{name}.{i}"] = a.copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`, all or nothing.

        Every entry is checked (names, step, settings, buffer shapes, dtypes and
        values) before anything is set, so a bad state raises and leaves the
        optimizer unchanged.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping, got {describe(state)}")
        kind = _scalar(state.get("optimizer"))
        if kind != type(self).__name__:
            raise ValueError(f"state is for optimizer {kind!r}, not {type(self).__name__!r}")
        expected = {"optimizer", "step", *self.hyperparameters()}
        expected |= {f"{n}.{i}" for n in self.buffer_names for i in range(len(self.parameters))}
        if not callable(self._lr):
            expected.add("lr")
        missing, extra = sorted(expected - state.keys()), sorted(state.keys() - expected)
        if missing or extra:
            raise ValueError(
                f"state does not match this optimizer: missing {missing}, extra {extra}"
                " (a constant lr is saved, a schedule is not: both sides must agree)"
            )
        step = non_negative_int(_scalar(state["step"]), "state['step']")
        lr = _check_lr(_scalar(state["lr"]), "state['lr']") if "lr" in state else self._lr
        buffers = {
            name: [self._checked_buffer(state, name, i) for i in range(len(self.parameters))]
            for name in self.buffer_names
        }
        self._configure(**{k: _scalar(state[k]) for k in self.hyperparameters()})
        self.step_count, self._lr = step, lr
        for name, arrays in buffers.items():
            for target, source in zip(self.buffers[name], arrays, strict=True):
                target[...] = source

    def _checked_buffer(self, state: Mapping[str, Any], name: str, i: int) -> np.ndarray:
        key = f"{name}.{i}"
        value = np.asarray(state[key])
        p = self.parameters[i]
        if value.shape != p.shape or value.dtype != p.dtype:
            raise ValueError(
                f"state[{key!r}] must have shape {p.shape} and dtype {p.dtype} like its"
                f" parameter, got {describe(value)}"
            )
        if not np.isfinite(value).all():
            raise ValueError(f"state[{key!r}] contains NaN or infinite values")
        return value

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.hyperparameters().items())
        lr = "schedule" if callable(self._lr) else repr(self._lr)
        return f"{type(self).__name__}(lr={lr}, {settings}, step={self.step_count})"


class SGD(Optimizer):
    r"""Stochastic gradient descent with momentum, as ``torch.optim.SGD``.

    .. math::
        g_t &\leftarrow g_t + \lambda\,\theta_{t-1} \\
        b_t &= \mu\, b_{t-1} + (1 - \tau)\, g_t \quad (b_1 = g_1) \\
        \theta_t &= \theta_{t-1} - \eta_t \,
            \begin{cases} g_t + \mu\, b_t & \text{Nesterov} \\ b_t & \text{otherwise}\end{cases}

    With momentum :math:`\mu = 0` this is plain gradient descent
    :math:`\theta_t = \theta_{t-1} - \eta_t g_t`.

    Parameters
    ----------
    parameters : list of Parameter
    lr : float or Schedule
    momentum : float
        :math:`\mu \in [0, 1)`.
    dampening : float
        :math:`\tau \in [0, 1]`, the share of the gradient left out of the buffer.
    nesterov : bool
        Look ahead along the momentum (needs momentum > 0 and no dampening).
    weight_decay : float
        :math:`\lambda \ge 0`, an L2 penalty added to the gradient.
    """

    buffer_names = ("momentum_buffer",)

    def __init__(
        self,
        parameters: Iterable[Parameter],
        lr: float | Schedule,
        *,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(parameters, lr)
        self._configure(
            momentum=momentum, dampening=dampening, nesterov=nesterov, weight_decay=weight_decay
        )

    def hyperparameters(self) -> dict[str, Any]:
        """``momentum``, ``dampening``, ``nesterov`` and ``weight_decay``."""
        return {
            "momentum": self.momentum,
            "dampening": self.dampening,
            "nesterov": self.nesterov,
            "weight_decay": self.weight_decay,
        }

    def _configure(
        self, *, momentum: float, dampening: float, nesterov: bool, weight_decay: float
    ) -> None:
        momentum = unit_interval(momentum, "momentum")
        dampening = unit_interval(dampening, "dampening", include_one=True)
        weight_decay = non_negative_float(weight_decay, "weight_decay")
        if not isinstance(nesterov, bool | np.bool_):
            raise TypeError(f"nesterov must be a bool, got {describe(nesterov)}")
        if nesterov and (momentum == 0 or dampening != 0):
            raise ValueError(
                f"nesterov needs momentum > 0 and dampening = 0, got momentum={momentum},"
                f" dampening={dampening}"
            )
        self.momentum, self.dampening = momentum, dampening
        self.nesterov, self.weight_decay = bool(nesterov), weight_decay

    def _update(self, i: int, p: Parameter, lr: float) -> None:
        g = p.grad + self.weight_decay * p.value if self.weight_decay else p.grad
        if self.momentum:
            b = self.buffers["momentum_buffer"][i]
            if self.step_count == 1:
                b[...] = g
            else:
                b *= self.momentum
                b += (1.0 - self.dampening) * g
            g = g + self.momentum * b if self.nesterov else b
        p.value -= lr * g


class Adam(Optimizer):
    r"""Adam, as ``torch.optim.Adam``.

    The update of :cite:t:`kingma2015adam`, with L2 weight decay :math:`\lambda`:

    .. math::
        g_t &\leftarrow g_t + \lambda\,\theta_{t-1} \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t, \qquad
        v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2 \\
        \hat m_t &= \frac{m_t}{1 - \beta_1^t}, \qquad \hat v_t = \frac{v_t}{1 - \beta_2^t} \\
        \theta_t &= \theta_{t-1} - \eta_t\, \frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}

    The weight decay :math:`\lambda` here is an L2 penalty added to the
    gradient, which Adam then rescales; :class:`AdamW` decouples it.

    Parameters
    ----------
    parameters : list of Parameter
    lr : float or Schedule
    betas : (float, float)
        :math:`(\beta_1, \beta_2)`, each in :math:`[0, 1)`.
    eps : float
        :math:`\epsilon > 0`.
    weight_decay : float
        :math:`\lambda \ge 0`.
    no_decay : list of Parameter, optional
        Parameters (among ``parameters``) that are never decayed. The usual
        choice is biases and normalization gains, the parameters with fewer
        than two dimensions: ``no_decay=one_dimensional(model.parameters())``
        (:func:`one_dimensional`). The default decays every parameter, as the
        book's runs do.
    """

    buffer_names = ("exp_avg", "exp_avg_sq")
    _decoupled = False

    def __init__(
        self,
        parameters: Iterable[Parameter],
        lr: float | Schedule = 1e-3,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        no_decay: Iterable[Parameter] = (),
    ) -> None:
        super().__init__(parameters, lr)
        self._configure(betas=betas, eps=eps, weight_decay=weight_decay)
        self._decays = _decay_flags(self.parameters, no_decay)

    def hyperparameters(self) -> dict[str, Any]:
        """``betas``, ``eps`` and ``weight_decay``."""
        return {"betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay}

    def _configure(self, *, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
        if isinstance(betas, np.ndarray):
            betas = tuple(betas.tolist())
        if not isinstance(betas, tuple | list) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2), got {describe(betas)}")
        checked = (unit_interval(betas[0], "betas[0]"), unit_interval(betas[1], "betas[1]"))
        eps = positive_float(eps, "eps")
        weight_decay = non_negative_float(weight_decay, "weight_decay")
        self.betas, self.eps, self.weight_decay = checked, eps, weight_decay

    def _update(self, i: int, p: Parameter, lr: float) -> None:
        beta1, beta2 = self.betas
        t = self.step_count
        g = p.grad
        decay = self.weight_decay if self._decays[i] else 0.0
        if self._decoupled:
            p.value *= 1.0 - lr * decay
        elif decay:
            g = g + decay * p.value
        m, v = self.buffers["exp_avg"][i], self.buffers["exp_avg_sq"][i]
        m *= beta1
        m += (1.0 - beta1) * g
        v *= beta2
        v += (1.0 - beta2) * g * g
        m_hat = m / (1.0 - beta1**t)
        v_hat = v / (1.0 - beta2**t)
        p.value -= lr * m_hat / (np.sqrt(v_hat) + self.eps)


class AdamW(Adam):
    r"""Adam with decoupled weight decay, as ``torch.optim.AdamW``.

    The decay of :cite:t:`loshchilov2019decoupled` shrinks the weights directly instead of entering the gradient,
    so Adam's per-coordinate rescaling does not weaken it where gradients are
    large:

    .. math::
        \theta_{t-1} \leftarrow (1 - \eta_t \lambda)\, \theta_{t-1}

    then the update of :class:`Adam` with :math:`\lambda = 0`. The default
    :math:`\lambda = 0.01` is PyTorch's.
    """

    _decoupled = True

    def __init__(
        self,
        parameters: Iterable[Parameter],
        lr: float | Schedule = 1e-3,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        no_decay: Iterable[Parameter] = (),
    ) -> None:
        super().__init__(
            parameters, lr, betas=betas, eps=eps, weight_decay=weight_decay, no_decay=no_decay
        )


def one_dimensional(parameters: Iterable[Parameter]) -> list[Parameter]:
    """The parameters with fewer than two dimensions: biases and normalization gains.

    What weight decay usually leaves alone (``AdamW(..., no_decay=one_dimensional(ps))``):
    they set offsets and scales rather than mixing features, and shrinking
    them toward zero has no regularizing reason.
    """
    return [p for p in _check_parameters(parameters) if p.value.ndim < 2]


def _decay_flags(parameters: list[Parameter], no_decay: object) -> list[bool]:
    """For each parameter, whether weight decay applies to it (False for those in ``no_decay``)."""
    if isinstance(no_decay, Parameter) or not isinstance(no_decay, Iterable):
        raise TypeError(f"no_decay must be an iterable of Parameter, got {describe(no_decay)}")
    exempt = list(no_decay)
    known = {id(p) for p in parameters}
    for i, p in enumerate(exempt):
        if not isinstance(p, Parameter):
            raise TypeError(f"no_decay[{i}] must be a Parameter, got {describe(p)}")
        if id(p) not in known:
            raise ValueError(
                f"no_decay[{i}] is not one of the optimizer's parameters (of shape {p.shape})"
            )
    exempt_ids = {id(p) for p in exempt}
    return [id(p) not in exempt_ids for p in parameters]


def grad_norm(parameters: Iterable[Parameter]) -> float:
    r"""The global gradient norm :math:`\sqrt{\sum_p \lVert g_p \rVert^2}` over all parameters.

    Summed in float64 whatever the parameters' dtype.
    """
    params = _check_parameters(parameters)
    return math.sqrt(sum(float(np.sum(np.square(p.grad, dtype=np.float64))) for p in params))


def clip_grad_norm(
    parameters: Iterable[Parameter], max_norm: float, *, error_if_nonfinite: bool = True
) -> float:
    r"""Rescale all gradients together so that their global norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: with :math:`N` the global norm,
    every gradient is multiplied by :math:`\min(1, \text{max\_norm} / (N + 10^{-6}))`.
    Clipping by the global norm keeps the direction of the whole update.

    Parameters
    ----------
    parameters : list of Parameter
    max_norm : float
        Largest allowed global norm, > 0.
    error_if_nonfinite : bool
        Raise :class:`ValueError` if the norm is NaN or infinite (the
        default); otherwise leave the gradients untouched and return it.

    Returns
    -------
    float
        The global norm *before* clipping.
    """
    params = _check_parameters(parameters)
    max_norm = positive_float(max_norm, "max_norm")
    total = grad_norm(params)
    if not math.isfinite(total):
        if error_if_nonfinite:
            raise ValueError(f"the global gradient norm is {total}: a gradient has NaN or inf")
        return total
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for p in params:
            p.grad *= coef
    return total
