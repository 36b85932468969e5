r"""The arithmetic of published scaling laws: optima, inference, repeated data and counting.

Every function here takes the constants of a law as arguments and computes what the law
implies; none of them holds a published number. The form is Hoffmann et al.'s
parametric loss :cite:p:`hoffmann2022training`,

.. math::
    \hat L(N, D) = E + \frac{A}{N^{\alpha}} + \frac{B}{D^{\beta}},

held in a :class:`LossFit`. From it:

- :func:`compute_optimal`: the :math:`N` and :math:`D` that minimize :math:`\hat L` at
  training compute :math:`C = 6ND`;
- :func:`inference_optimal`: the :math:`N` and :math:`D` that reach a target loss with
  the fewest FLOPs over a model's life, training plus serving :math:`D_\text{inf}`
  tokens (:func:`lifetime_flops`), as in :cite:t:`sardana2024beyond`;
- :func:`effective_data`: what :math:`D` tokens made of :math:`U` unique ones repeated
  are worth, in the form of :cite:t:`muennighoff2023scaling`;
- :func:`split_parameters` and :func:`non_embedding_view`: a compute-optimal frontier
  re-expressed in Kaplan et al.'s non-embedding counts :cite:p:`kaplan2020scaling`;
  :func:`kaplan_frontier`: the frontier chosen as Kaplan et al. chose it, the best model at
  each non-embedding budget; and :func:`power_law_exponent` to fit a slope.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import (
    FLOAT_DTYPES,
    float_array,
    non_negative_float,
    positive_float,
    positive_int,
)

__all__ = [
    "LossFit",
    "compute_optimal",
    "effective_data",
    "inference_optimal",
    "kaplan_frontier",
    "lifetime_flops",
    "non_embedding_view",
    "parametric_loss",
    "power_law_exponent",
    "split_parameters",
    "tokens_for_loss",
]


@dataclass(frozen=True)
class LossFit:
    r"""The constants of :math:`\hat L(N, D) = E + A / N^{\alpha} + B / D^{\beta}`.

    Attributes
    ----------
    e : float
        The loss no model can remove (nats per token).
    a, alpha : float
        Scale and exponent of the parameter term.
    b, beta : float
        Scale and exponent of the data term.
    """

    e: float
    a: float
    b: float
    alpha: float
    beta: float


def _checked(fit: object) -> LossFit:
    """``fit`` as a :class:`LossFit` with finite constants, ``E >= 0`` and the rest positive."""
    if not isinstance(fit, LossFit):
        raise TypeError(f"fit must be a LossFit, got {type(fit).__name__} {fit!r}"[:120])
    non_negative_float(fit.e, "fit.e")
    for name in ("a", "b", "alpha", "beta"):
        positive_float(getattr(fit, name), f"fit.{name}")
    return fit


def _python_number(value: object) -> bool:
    """Whether ``value`` is a plain Python number (not a NumPy scalar or array)."""
    return isinstance(value, numbers.Real) and not isinstance(value, np.generic)


def parametric_loss(n_params: object, n_tokens: object, fit: LossFit) -> np.ndarray | float:
    r"""The fitted loss :math:`E + A/N^{\alpha} + B/D^{\beta}` of ``n_params`` trained on ``n_tokens``.

    Parameters
    ----------
    n_params, n_tokens : float or array_like
        Parameters :math:`N > 0` and training tokens :math:`D > 0`; arrays broadcast.
    fit : LossFit
        The law's constants.

    Returns
    -------
    float or numpy.ndarray
        A float for two numbers; else an array of the broadcast shape in the floating dtype
        of the array inputs (float32 in, float32 out, even with a Python number beside it;
        float64 for integers).

    Raises
    ------
    TypeError
        If an array input is floating but neither float32 nor float64.
    """
    fit = _checked(fit)
    scalar = np.ndim(n_params) == 0 and np.ndim(n_tokens) == 0
    n = float_array(n_params, "n_params")
    d = float_array(n_tokens, "n_tokens")
    for arr, name in ((n, "n_params"), (d, "n_tokens")):
        if arr.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float32 or float64 (or integer), got {arr.dtype}")
    # Python numbers are weak: they take the dtype of the arrays beside them
    typed = [a.dtype for a, g in ((n, n_params), (d, n_tokens)) if not _python_number(g)]
    dtype = np.result_type(*typed) if typed else np.dtype(np.float64)
    n, d = n.astype(dtype), d.astype(dtype)
    if (n <= 0).any() or (d <= 0).any() or not (np.isfinite(n).all() and np.isfinite(d).all()):
        raise ValueError(
            f"n_params and n_tokens must be finite and positive, got minimums {n.min()!r} and"
            f" {d.min()!r}"
        )
    e, a, b, alpha, beta = (
        dtype.type(v) for v in (fit.e, fit.a, fit.b, fit.alpha, fit.beta)
    )  # constants in the inputs' dtype
    loss = e + a / n**alpha + b / d**beta  # broadcast shape of N and D
    return float(loss) if scalar else loss


def compute_optimal(compute: float, fit: LossFit) -> tuple[float, float]:
    r"""The :math:`N` and :math:`D` that minimize :math:`\hat L` at training compute :math:`C = 6ND`.

    Setting the derivative of :math:`\hat L(N, C / 6N)` to zero (Hoffmann et al.'s
    efficient frontier of their Section 3.3):

    .. math::
        N_\text{opt} = G \left(\frac{C}{6}\right)^{\beta / (\alpha + \beta)},
        \qquad
        D_\text{opt} = \frac{C}{6 N_\text{opt}},
        \qquad
        G = \left(\frac{\alpha A}{\beta B}\right)^{1 / (\alpha + \beta)}.

    At the optimum the two reducible terms stand in the ratio
    :math:`A/N^{\alpha} : B/D^{\beta} = \beta : \alpha`.
    """
    compute = positive_float(compute, "compute")
    fit = _checked(fit)
    g = (fit.alpha * fit.a / (fit.beta * fit.b)) ** (1 / (fit.alpha + fit.beta))
    n_opt = g * (compute / 6) ** (fit.beta / (fit.alpha + fit.beta))
    return n_opt, compute / (6 * n_opt)


def tokens_for_loss(loss: float, n_params: float, fit: LossFit) -> float:
    r"""Training tokens that bring a model of ``n_params`` parameters down to ``loss``.

    .. math::
        D = \left(\frac{B}{\ell - E - A / N^{\alpha}}\right)^{1/\beta}

    Raises ``ValueError`` when no amount of data reaches ``loss`` at this size
    (:math:`\ell \le E + A/N^{\alpha}`).
    """
    fit = _checked(fit)
    loss, n = positive_float(loss, "loss"), positive_float(n_params, "n_params")
    room = loss - fit.e - fit.a / n**fit.alpha  # what the data term may still cost
    if room <= 0:
        raise ValueError(
            f"loss must exceed E + A / N^alpha = {loss - room:.6g} for n_params={n:.6g}"
            f" (no amount of data reaches it), got loss={loss}"
        )
    return (fit.b / room) ** (1 / fit.beta)


def lifetime_flops(n_params: float, train_tokens: float, inference_tokens: float) -> float:
    r"""Training plus serving FLOPs of a model: :math:`6 N D_\text{train} + 2 N D_\text{inf}`.

    Training costs :math:`6N` per token (forward and backward); serving costs the
    forward pass alone, :math:`2N` per token processed.
    """
    n = positive_float(n_params, "n_params")
    d_train = positive_float(train_tokens, "train_tokens")
    d_inf = non_negative_float(inference_tokens, "inference_tokens")
    return 6 * n * d_train + 2 * n * d_inf


def inference_optimal(
    loss: float, inference_tokens: float, fit: LossFit, *, iterations: int = 200
) -> tuple[float, float]:
    r"""The model that reaches ``loss`` with the fewest lifetime FLOPs when serving ``inference_tokens``.

    Minimizes :math:`6ND + 2ND_\text{inf}` over the curve :math:`\hat L(N, D) = \ell`.
    With :math:`u = A / N^{\alpha}` and :math:`s = \ell - E`, the curve gives
    :math:`D = (B / (s - u))^{1/\beta}`, and the cost is stationary where

    .. math::
        6D\left(1 - \frac{\alpha}{\beta}\,\frac{u}{s - u}\right) + 2D_\text{inf} = 0 .

    With :math:`D_\text{inf} = 0` the root is :math:`u = \beta s / (\alpha + \beta)`: the
    compute-optimal model of that loss (:func:`compute_optimal`). Serving moves the root
    to larger :math:`u`, a smaller model trained on more tokens. The root is found by
    bisection on :math:`\log(s - u)`, on which the left side is monotone.

    Returns
    -------
    n_params, train_tokens : float
    """
    fit = _checked(fit)
    loss = positive_float(loss, "loss")
    d_inf = non_negative_float(inference_tokens, "inference_tokens")
    iterations = positive_int(iterations, "iterations")
    s = loss - fit.e
    if s <= 0:
        raise ValueError(f"loss must exceed fit.e={fit.e} (the irreducible loss), got {loss}")
    ratio = fit.alpha / fit.beta

    def slope(w: float) -> float:  # d(lifetime FLOPs)/dN times N / (2N), at s - u = w
        d = (fit.b / w) ** (1 / fit.beta)
        return 3 * d * (1 - ratio * (s - w) / w) + d_inf

    w_high = s * fit.alpha / (fit.alpha + fit.beta)  # the compute-optimal point, slope = d_inf
    if d_inf == 0:
        w = w_high
    else:
        w_low = w_high / 2
        while slope(w_low) > 0:  # walk towards smaller models until the slope turns negative
            w_low /= 2
        for _ in range(iterations):
            w_mid = math.sqrt(w_low * w_high)
            w_low, w_high = (w_mid, w_high) if slope(w_mid) < 0 else (w_low, w_mid)
        w = math.sqrt(w_low * w_high)
    n = (fit.a / (s - w)) ** (1 / fit.alpha)
    return n, (fit.b / w) ** (1 / fit.beta)


def effective_data(unique_tokens: float, total_tokens: float, r_star: float) -> float:
    r"""What ``total_tokens`` drawn from ``unique_tokens`` repeated are worth in fresh tokens.

    With :math:`U` unique tokens seen :math:`D / U` times, :math:`R = D/U - 1` repetitions,

    .. math::
        D' = U + U R^{*}\left(1 - e^{-R / R^{*}}\right),

    the form of Muennighoff et al. A token added after :math:`R` repetitions is worth
    :math:`dD'/dD = e^{-R/R^{*}}` of a fresh one, so :math:`D' \approx D` while
    :math:`R \ll R^{*}`, and :math:`D' \to U(1 + R^{*})` however long one trains.
    """
    u = positive_float(unique_tokens, "unique_tokens")
    d = positive_float(total_tokens, "total_tokens")
    r_star = positive_float(r_star, "r_star")
    if d < u:
        raise ValueError(
            f"total_tokens must be at least unique_tokens={u:.6g} (one whole epoch), got {d:.6g}"
        )
    repetitions = d / u - 1
    return u + u * r_star * -math.expm1(-repetitions / r_star)


def split_parameters(
    n_total: float, *, vocab_size: int, context_length: int, aspect_ratio: float
) -> tuple[float, float]:
    r"""Split a GPT-style model of ``n_total`` parameters into non-embedding and embedding parts.

    A model of width :math:`d` and :math:`L = d / a` blocks (``aspect_ratio`` :math:`a`)
    has :math:`12 L d^2 = 12 d^3 / a` parameters in its blocks (Kaplan et al.'s count,
    biases and norms left out) and :math:`(V + T) d` in its token and position tables.
    Solves :math:`12 d^3 / a + (V + T) d = N_\text{total}` for :math:`d` (one positive
    root: the left side increases) and returns both parts.
    """
    n_total = positive_float(n_total, "n_total")
    table = positive_float(vocab_size, "vocab_size") + positive_float(
        context_length, "context_length"
    )
    cube = 12 / positive_float(aspect_ratio, "aspect_ratio")
    roots = np.roots([cube, 0.0, table, -n_total])
    width = float(roots[np.argmin(np.abs(roots.imag))].real)  # the one real root
    return cube * width**3, table * width  # each part directly, no difference of near-equals


def non_embedding_view(
    compute: object,
    fit: LossFit,
    *,
    vocab_size: int,
    context_length: int,
    aspect_ratio: float,
) -> tuple[np.ndarray, np.ndarray]:
    r"""The compute-optimal frontier of ``fit``, relabelled in Kaplan et al.'s counts.

    For each total budget :math:`C`, :func:`compute_optimal` gives :math:`N` and
    :math:`D`; :func:`split_parameters` gives the non-embedding part
    :math:`N_\setminus`; and the non-embedding compute is :math:`6 N_\setminus D`. The
    models stay those that are optimal at total compute; :func:`kaplan_frontier` instead
    chooses the best model at each non-embedding budget, as Kaplan et al. did.

    Returns
    -------
    compute_non_embedding, n_non_embedding : numpy.ndarray
        Both of the shape of ``compute`` (float64).
    """
    budgets = float_array(compute, "compute").astype(np.float64)
    shape = {
        "vocab_size": vocab_size,
        "context_length": context_length,
        "aspect_ratio": aspect_ratio,
    }
    c_out, n_out = np.empty_like(budgets), np.empty_like(budgets)
    for i, c in np.ndenumerate(budgets):
        n, d = compute_optimal(float(c), fit)
        n_out[i] = split_parameters(n, **shape)[0]
        c_out[i] = 6 * n_out[i] * d
    return c_out, n_out


def _frontier_loss(
    log_width: np.ndarray, compute: np.ndarray, fit: LossFit, table: float, cube: float
) -> np.ndarray:
    r""":math:`\hat L` of the model of width ``exp(log_width)`` trained on ``compute / 6 N_ne``."""
    width = np.exp(log_width)
    n_ne = cube * width**3  # non-embedding parameters
    tokens = compute / (6 * n_ne)
    return fit.e + fit.a / (n_ne + table * width) ** fit.alpha + fit.b / tokens**fit.beta


def kaplan_frontier(
    compute_non_embedding: object,
    fit: LossFit,
    *,
    vocab_size: int,
    context_length: int,
    aspect_ratio: float,
    grid: int = 2001,
    iterations: int = 80,
) -> np.ndarray:
    r"""The best model at each non-embedding budget, chosen as Kaplan et al. chose it.

    Kaplan et al. scanned, at each non-embedding compute :math:`C_\setminus = 6 N_\setminus D`,
    over model sizes for the lowest loss (their Section 3.3). Here the loss is ``fit``'s,
    in total parameters. Over the width :math:`d` of models with :math:`L = d / a` blocks:

    .. math::
        N_\setminus = \frac{12 d^3}{a}, \qquad
        N = N_\setminus + (V + T) d, \qquad
        D = \frac{C_\setminus}{6 N_\setminus}, \qquad
        d^* = \arg\min_d \; E + \frac{A}{N^{\alpha}} + \frac{B}{D^{\beta}} .

    The minimum is found on a log grid of ``grid`` widths from :math:`10^{-3}` to
    :math:`10^{8}` and refined by ``iterations`` steps of golden-section search between
    the grid neighbours of the best point.

    Parameters
    ----------
    compute_non_embedding : float or array_like
        Budgets :math:`C_\setminus > 0` in FLOPs, of any shape ``S``.
    fit : LossFit
        The law, in total parameters.
    vocab_size, context_length, aspect_ratio : int, int, float
        :math:`V`, :math:`T` and :math:`a = d / L`.
    grid, iterations : int
        Size of the coarse grid (at least 3) and golden-section steps.

    Returns
    -------
    numpy.ndarray
        :math:`N_\setminus` of the best model at each budget, shape ``S`` (float64).

    Raises
    ------
    ValueError
        If a budget's best width lies at the edge of the grid (no interior minimum).
    """
    fit = _checked(fit)
    budgets = float_array(compute_non_embedding, "compute_non_embedding").astype(np.float64)
    if not (np.isfinite(budgets).all() and (budgets > 0).all()):
        raise ValueError(
            f"compute_non_embedding must be finite and positive, got minimum {budgets.min()!r}"
        )
    table = positive_float(vocab_size, "vocab_size") + positive_float(
        context_length, "context_length"
    )
    cube = 12 / positive_float(aspect_ratio, "aspect_ratio")
    grid, iterations = positive_int(grid, "grid"), positive_int(iterations, "iterations")
    if grid < 3:
        raise ValueError(f"grid must be at least 3, got {grid}")
    c = budgets.reshape(-1, 1)  # (budgets, 1)
    log_w = np.linspace(math.log(1e-3), math.log(1e8), grid)  # (grid,)
    best = np.argmin(_frontier_loss(log_w, c, fit, table, cube), axis=1)  # (budgets,)
    if (best == 0).any() or (best == grid - 1).any():
        raise ValueError(
            "compute_non_embedding has a budget whose best width lies at the edge of the"
            f" search grid [1e-3, 1e8], got budgets from {budgets.min():.3g} to {budgets.max():.3g}"
        )
    low, high = log_w[best - 1], log_w[best + 1]  # (budgets,) a bracket of the minimum
    c = c[:, 0]  # (budgets,)
    shrink = (math.sqrt(5) - 1) / 2
    for _ in range(iterations):  # golden section: keep the side holding the lower point
        left, right = high - shrink * (high - low), low + shrink * (high - low)
        lower_left = _frontier_loss(left, c, fit, table, cube) < _frontier_loss(
            right, c, fit, table, cube
        )
        low, high = np.where(lower_left, low, left), np.where(lower_left, right, high)
    width = np.exp((low + high) / 2)  # (budgets,)
    return (cube * width**3).reshape(budgets.shape)


def power_law_exponent(x: object, y: object) -> float:
    r"""The slope :math:`k` of a least-squares line through :math:`\log y` against :math:`\log x`.

    The exponent of :math:`y \propto x^{k}` fitted on logarithms; ``x`` and ``y`` of
    shape ``(n,)``, ``n >= 2``, positive.
    """
    x_arr = float_array(x, "x").astype(np.float64)
    y_arr = float_array(y, "y").astype(np.float64)
    if x_arr.ndim != 1 or x_arr.size < 2 or y_arr.shape != x_arr.shape:
        raise ValueError(
            f"x and y must have the same shape (n,) with n >= 2, got {x_arr.shape} and {y_arr.shape}"
        )
    if (x_arr <= 0).any() or (y_arr <= 0).any():
        raise ValueError(
            f"x and y must be positive, got minimums {x_arr.min()!r} and {y_arr.min()!r}"
        )
    return float(np.polyfit(np.log(x_arr), np.log(y_arr), 1)[0])
