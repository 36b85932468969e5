"""The live exercise of the chapter on scaling laws: fit a power law to a sweep's losses."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.experiments.scaling import fit_power_law


def _intercept_as_n_c(n_params, excess):
    """Returns exp(intercept) as N_c, forgetting that the intercept is alpha * log N_c."""
    n = np.asarray(n_params, dtype=np.float64)
    e = np.asarray(excess, dtype=np.float64)
    x = np.broadcast_to(np.log(n), e.shape).ravel()
    slope, intercept = np.polyfit(x, np.log(e).ravel(), 1)
    return float(-slope), float(np.exp(intercept))


def _fit_to_means(n_params, excess):
    """Fits the line through the log of each size's mean loss, not through every seed's point."""
    n = np.asarray(n_params, dtype=np.float64)
    e = np.asarray(excess, dtype=np.float64)
    mean = e.mean(axis=0) if e.ndim == 2 else e
    slope, intercept = np.polyfit(np.log(n), np.log(mean), 1)
    return float(-slope), float(np.exp(intercept / -slope))


def _cases() -> list[Case]:
    n = np.array([1.2e3, 3.1e3, 8.0e3, 2.1e4, 5.5e4])  # (5,) parameter counts
    exact = (4.0e2 / n) ** 0.35  # an exact power law: alpha 0.35, N_c 400
    rng = np.random.default_rng(1)
    noisy = (9.0e1 / n) ** 0.2 * np.exp(0.08 * rng.standard_normal((3, n.size)))  # (seeds, sizes)
    widths = np.array([500.0, 2.0e3, 9.0e3, 4.0e4, 1.5e5, 6.0e5])  # (6,)
    rng = np.random.default_rng(2)
    bent = 0.05 + (2.0e3 / widths) ** 0.5  # a curve that flattens at the large end
    bent = bent * np.exp(0.05 * rng.standard_normal((4, widths.size)))  # (seeds, sizes)
    return [
        Case((n, exact), label="an exact power law with one seed (excess of shape (n,))"),
        Case((n, noisy), label="three seeds with noise (excess of shape (3, n))"),
        Case((widths, bent), label="four seeds of a curve that bends away from a power law"),
        Case((n[:2], exact[:2]), label="only two sizes, one seed"),
    ]


FIT_POWER_LAW = Exercise(
    chapter="scaling_laws",
    name="fit_power_law",
    stub='''\
def fit_power_law(n_params, excess):
    """Fit L - H = (N_c / N)**alpha by least squares on natural logarithms.

    n_params: parameter counts N, shape (n,), positive. excess: reducible losses L - H,
    positive, shape (n,) for one seed or (n_seeds, n) for several, one row per seed.
    Fit one straight line log(L - H) = a + b log N through every seed's point (each
    seed's loss at each size is one point; no averaging first), and return
    (alpha, n_c) as two floats: alpha = -b, and n_c the N_c of the formula above.
    """
    raise NotImplementedError
''',
    reference=fit_power_law,
    cases=_cases,
    rtol=1e-6,
    atol=1e-9,
    parts=("alpha", "n_c"),
    mistakes=(_intercept_as_n_c, _fit_to_means),
)
"""Fit the chapter's power law, with its N_c, through every seed's point."""
