r"""Check hand-written gradients against central finite differences.

The five-point central difference

.. math:: \frac{\partial f}{\partial x_i} \approx
          \frac{f(x - 2h e_i) - 8 f(x - h e_i) + 8 f(x + h e_i) - f(x + 2h e_i)}{12 h}

has a truncation error of order :math:`h^4`, so with :math:`h = 10^{-4}` in
float64 both it and the rounding error (of order :math:`10^{-16}/h`) stay near
:math:`10^{-12}`: a correct gradient agrees to ten digits or so, a wrong one is
usually off in the first. A module is checked through :math:`L = \sum_i y_i g_i`
for a fixed random :math:`g`, whose gradient with respect to the output is
exactly :math:`g`. The differences :math:`f(x + h e_i) - f(x - h e_i)` are taken
entry by entry before summing, so outputs that :math:`x_i` does not touch
cancel exactly and add no rounding noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tinyformer._validation import positive_float
from tinyformer.module import Module

__all__ = [
    "check_module_gradients",
    "check_parameter_gradients",
    "max_relative_error",
    "numerical_gradient",
]


def numerical_gradient(
    f: Callable[[], float | np.ndarray], x: np.ndarray, eps: float = 1e-4
) -> np.ndarray:
    """Five-point central-difference gradient of ``sum(f())`` with respect to ``x``.

    ``f`` returns a scalar or an array (whose sum is the function); it must read
    ``x`` each time it is called. ``x`` is perturbed in place, one element at a
    time, and restored exactly.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float64:
        raise TypeError("x must be a float64 numpy.ndarray (finite differences need float64)")
    eps = positive_float(eps, "eps")
    grad = np.zeros_like(x)
    flat, flat_grad = x.reshape(-1), grad.reshape(-1)
    if not np.shares_memory(flat, x):
        raise ValueError("x must be contiguous so that it can be perturbed in place")

    def at(i: int, value: float) -> np.ndarray:
        flat[i] = value
        return np.asarray(f(), dtype=np.float64)

    for i in range(flat.size):
        x0 = flat[i]
        near = at(i, x0 + eps) - at(i, x0 - eps)
        far = at(i, x0 + 2 * eps) - at(i, x0 - 2 * eps)
        flat[i] = x0
        flat_grad[i] = np.sum(8 * near - far) / (12 * eps)
    return grad


def max_relative_error(
    analytic: np.ndarray, numeric: np.ndarray, *, magnitude: float | None = None
) -> float:
    r"""Largest elementwise relative error between two gradients.

    .. math:: \max_i \frac{|a_i - n_i|}{\max(|a_i|,\ |n_i|,\ 10^{-4} m)}

    with :math:`m` the ``magnitude`` of the gradients being checked: by default
    the largest :math:`|n_j|` of this gradient. The floor keeps entries that are
    (nearly) zero in both from dividing rounding noise by zero: for them it
    bounds the absolute error instead. A gradient that is exactly zero
    everywhere (a key bias: softmax ignores a shift shared by all keys) has only
    rounding noise to compare, so checking a whole module passes the module's
    largest gradient entry as ``magnitude``.
    """
    a, n = np.asarray(analytic, dtype=np.float64), np.asarray(numeric, dtype=np.float64)
    if a.shape != n.shape:
        raise ValueError(f"analytic {a.shape} and numeric {n.shape} must have the same shape")
    if a.size == 0:
        return 0.0
    scale = float(np.abs(n).max()) if magnitude is None else float(magnitude)
    floor = max(1e-4 * scale, np.finfo(np.float64).tiny)
    denominator = np.maximum(np.maximum(np.abs(a), np.abs(n)), floor)
    return float((np.abs(a - n) / denominator).max())


def _relative_errors(pairs: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """The :func:`max_relative_error` of each ``(analytic, numeric)`` pair, against one scale.

    The scale is the largest numerical entry of any of them.
    """
    magnitude = max((float(np.abs(n).max()) for _, n in pairs.values() if n.size), default=0.0)
    return {name: max_relative_error(a, n, magnitude=magnitude) for name, (a, n) in pairs.items()}


def check_module_gradients(
    module: Module,
    inputs: Sequence[np.ndarray],
    *,
    rng: np.random.Generator,
    kwargs: Mapping[str, Any] | None = None,
    eps: float = 1e-4,
    before_forward: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Compare ``module.backward`` with finite differences for every input and parameter.

    Frozen parameters (``requires_grad=False``) are left out: nothing computes their gradient.

    Parameters
    ----------
    module : Module
        A float64 module.
    inputs : sequence of numpy.ndarray
        The floating-point positional inputs of ``forward``; ``backward`` must
        return their gradients (one array, or a tuple in the same order).
    rng : numpy.random.Generator
        Draws the fixed upstream gradient.
    kwargs : mapping, optional
        Further arguments of ``forward`` that are not differentiated (masks, ids).
    eps : float
        Finite-difference step.
    before_forward : callable, optional
        Called before every forward, e.g. to reset a dropout generator so that
        each evaluation draws the same mask.

    Returns
    -------
    dict
        ``{"input 0": err, ..., "<parameter name>": err}`` with the
        :func:`max_relative_error` of each gradient, each measured against the
        module's largest gradient entry.
    """
    kwargs = dict(kwargs or {})
    inputs = [np.array(x, dtype=np.float64) for x in inputs]

    def run() -> np.ndarray:
        if before_forward is not None:
            before_forward()
        return module.forward(*inputs, **kwargs)

    upstream = rng.standard_normal(np.shape(run()))

    def loss() -> np.ndarray:
        return run() * upstream  # summed, after differencing, by numerical_gradient

    module.zero_grad()
    run()
    grads = module.backward(upstream)
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) != len(inputs):
        raise ValueError(f"backward returned {len(grads)} gradients for {len(inputs)} inputs")
    pairs = {
        f"input {i}": (g, numerical_gradient(loss, x, eps))
        for i, (g, x) in enumerate(zip(grads, inputs, strict=True))
    }
    for name, p in module.named_parameters():
        if p.requires_grad:  # a frozen parameter gets no gradient to check
            pairs[name] = (p.grad, numerical_gradient(loss, p.value, eps))
    return _relative_errors(pairs)


def check_parameter_gradients(
    module: Module,
    run: Callable[[], tuple[float | np.ndarray, np.ndarray]],
    *,
    eps: float = 1e-4,
) -> dict[str, float]:
    """Compare ``module.backward`` with finite differences for every parameter only.

    For modules whose inputs cannot be differentiated (token ids) and for whole
    models checked through a loss on their output.

    Parameters
    ----------
    module : Module
        A float64 module.
    run : callable
        Runs ``module.forward`` on fixed inputs and returns ``(value, grad_output)``:
        the loss (a scalar, or an array whose sum is the loss) and its gradient with
        respect to the module's output, which is passed to ``module.backward``.
    eps : float
        Finite-difference step.

    Returns
    -------
    dict
        ``{"<parameter name>": err}`` with the :func:`max_relative_error` of each
        gradient, each measured against the module's largest gradient entry.
    """
    module.zero_grad()
    _, grad_output = run()
    module.backward(grad_output)
    analytic = {name: p.grad.copy() for name, p in module.named_parameters() if p.requires_grad}

    def loss() -> float | np.ndarray:
        return run()[0]

    return _relative_errors(
        {
            name: (analytic[name], numerical_gradient(loss, p.value, eps))
            for name, p in module.named_parameters()
            if p.requires_grad
        }
    )
