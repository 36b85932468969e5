r"""A scaling experiment in miniature: held-out loss against model size at a fixed token budget.

Every run trains one decoder-only model (one pre-norm block, ``d_ff = 4 d_model``)
on the same random second-order Markov source
(:class:`~tinyformer.data.markov.MarkovSource`), whose entropy rate :math:`H`
is known exactly, for a fixed number of tokens, each training window used once.
Only the width ``d_model`` changes from run to run, so the parameter count
:math:`N` moves over more than a decade and a half. The sweep
(:data:`SWEEP_WIDTHS` times :data:`SWEEP_SEEDS`) and the runs at one compute
budget :math:`C \approx 6ND` with different splits between :math:`N` and
:math:`D` (:data:`ISO_COMPUTE_WIDTHS`, with more seeds for the two closest,
:data:`DECIDING_WIDTHS`) are listed by :func:`book_runs`; the page fits

.. math::
    L(N) = H + \left(\frac{N_c}{N}\right)^{\alpha}

with :math:`H` fixed at its exact value, by a straight line through
:math:`\log(L - H)` against :math:`\log N` (:func:`fit_power_law`), and gets
an uncertainty for :math:`\alpha` by resampling the seeds
(:func:`bootstrap_exponent`). The small functions at the end do the
arithmetic of published scaling laws.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyformer import cost
from tinyformer._validation import float_array, generator, positive_float, positive_int
from tinyformer.data import MarkovSource
from tinyformer.experiments.markov import per_position_loss
from tinyformer.experiments.recipe import Recipe
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import DecoderOnlyConfig
from tinyformer.models.counting import parameter_count
from tinyformer.training import WindowDataset

__all__ = [
    "DECIDING_SEEDS",
    "DECIDING_WIDTHS",
    "ISO_COMPUTE_SEEDS",
    "ISO_COMPUTE_WIDTHS",
    "SWEEP_SEEDS",
    "SWEEP_STEPS",
    "SWEEP_WIDTHS",
    "book_runs",
    "bootstrap_exponent",
    "compute_for_loss_reduction",
    "compute_optimal_split",
    "fit_power_law",
    "iso_compute_steps",
    "loss_reduction_from_compute",
    "scaling",
    "scaling_config",
]

SWEEP_WIDTHS = (8, 12, 16, 24, 32, 48, 64)
"""The model widths of the sweep, one block each, from about 0.9 to 50 thousand parameters."""
SWEEP_SEEDS = (0, 1, 2)
"""Seeds of each width, each setting the initialization, training windows and batch order."""
SWEEP_STEPS = 1000
"""Updates of every sweep run (the token budget is ``steps * batch_size * context_length``)."""
ISO_COMPUTE_WIDTHS = (12, 16, 32, 48)
"""Widths trained at the compute of the middle sweep model (width 24), with steps to match."""
ISO_COMPUTE_SEEDS = SWEEP_SEEDS
"""Seeds of every iso-compute width (the reference width's runs are the sweep's own)."""
DECIDING_WIDTHS = (16, 24)
"""The two best splits of the iso-compute budget, too close to tell apart with a few seeds."""
DECIDING_SEEDS = tuple(range(16))
"""The seeds trained at each deciding width, enough for the two mean losses to separate."""


def scaling_config(
    d_model: int,
    *,
    vocab_size: int = 16,
    n_layers: int = 1,
    d_k: int = 4,
    context_length: int = 16,
    dtype: str = "float32",
) -> DecoderOnlyConfig:
    """The configuration of a sweep model of width ``d_model``.

    Heads of size ``d_k`` each (``d_model / d_k`` of them, so wider models have
    more heads, as in published model families) and ``d_ff = 4 d_model``.
    """
    d_model = positive_int(d_model, "d_model")
    d_k = positive_int(d_k, "d_k")
    if d_model % d_k:
        raise ValueError(f"d_model must be a multiple of d_k={d_k}, got d_model={d_model}")
    return DecoderOnlyConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=d_model // d_k,
        d_ff=4 * d_model,
        n_layers=n_layers,
        context_length=context_length,
        activation="gelu_tanh",
        dtype=dtype,
    )


def iso_compute_steps(
    d_model: int, *, reference_d_model: int = 24, reference_steps: int = 1000
) -> int:
    r"""Steps that give width ``d_model`` the training compute ``6ND`` of the reference run.

    Tokens per step are the same for every width, so the steps scale as
    :math:`N_\text{ref} / N` (rounded to the nearest whole step).
    """
    reference_steps = positive_int(reference_steps, "reference_steps")
    ratio = cost.non_embedding_parameters(
        scaling_config(reference_d_model)
    ) / cost.non_embedding_parameters(scaling_config(d_model))
    return max(1, round(reference_steps * ratio))


def book_runs() -> tuple[tuple[str, dict[str, Any]], ...]:
    """The runs of chapter "Scaling laws", each once.

    The sweep; the iso-compute widths with :data:`ISO_COMPUTE_SEEDS`; and the
    :data:`DECIDING_WIDTHS` at the same compute with :data:`DECIDING_SEEDS` (the
    reference width at the same compute is the sweep's own run, so its seeds
    beyond the sweep's are the only new runs of that width).
    """
    sweep = [
        {"seed": s, "d_model": d, "max_steps": SWEEP_STEPS}
        for d in SWEEP_WIDTHS
        for s in SWEEP_SEEDS
    ]
    iso = [
        {"seed": s, "d_model": d, "max_steps": iso_compute_steps(d)}
        for seeds, widths in (
            (ISO_COMPUTE_SEEDS, ISO_COMPUTE_WIDTHS),
            (DECIDING_SEEDS, DECIDING_WIDTHS),
        )
        for d in widths
        for s in seeds
    ]
    runs: list[dict[str, Any]] = []
    for params in sweep + iso:
        if params not in runs:
            runs.append(params)
    return tuple(("scaling", params) for params in runs)


def _whole(inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The token streams behind windows: the first input, then every target, ``(n, T + 1)``."""
    return np.concatenate([inputs[:, :1], targets], axis=1)


def _rows_in(rows: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Whether each row of ``rows`` occurs, token for token, as a row of ``table``; ``(n,)``."""
    seen = {row.tobytes() for row in np.ascontiguousarray(table, dtype=np.int64)}
    return np.array([row.tobytes() in seen for row in np.ascontiguousarray(rows, dtype=np.int64)])


def _fresh_windows(
    source: MarkovSource,
    n_windows: int,
    seq_len: int,
    rng: np.random.Generator,
    heldout: WindowDataset,
    *,
    max_rounds: int = 20,
) -> tuple[WindowDataset, int]:
    """``n_windows`` windows of ``source``, none equal to a held-out one; and how many were dropped.

    Draws in rounds from ``rng`` and keeps the windows (in order of drawing)
    whose tokens differ from every held-out window's.
    """
    exclude = _whole(heldout.inputs, heldout.targets)
    kept_inputs, kept_targets, n_kept, n_dropped = [], [], 0, 0
    for _ in range(max_rounds):
        inputs, targets = source.sample_windows(n_windows - n_kept + 16, seq_len, rng)
        fresh = ~_rows_in(_whole(inputs, targets), exclude)
        take = np.flatnonzero(fresh)[: n_windows - n_kept]
        n_dropped += int((~fresh[: take[-1] + 1]).sum()) if take.size else int((~fresh).sum())
        kept_inputs.append(inputs[take])
        kept_targets.append(targets[take])
        n_kept += take.size
        if n_kept == n_windows:
            return WindowDataset(
                np.concatenate(kept_inputs), np.concatenate(kept_targets)
            ), n_dropped
    raise ValueError(  # pragma: no cover - needs a source of almost no entropy
        f"the source repeats held-out windows too often: {n_kept} of {n_windows} fresh training"
        f" windows after {max_rounds} rounds"
    )


def scaling(
    *,
    seed: int = 0,
    d_model: int = 16,
    max_steps: int = SWEEP_STEPS,
    source_seed: int = 0,
    vocab_size: int = 16,
    order: int = 2,
    branching: int = 8,
    concentration: float = 0.3,
    n_layers: int = 1,
    d_k: int = 4,
    context_length: int = 16,
    batch_size: int = 16,
    peak_lr: float = 1e-2,
    warmup_steps: int = 20,
    n_heldout_windows: int = 2048,
    log_every: int = 50,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train one model of the sweep for a fixed number of tokens; measure its held-out loss.

    The source (``source_seed``) and the held-out windows are the same for every
    run, so all sizes and seeds are measured on one test set; the training
    windows (``max_steps * batch_size`` of them, each used once), the
    initialization and the batch order come from ``seed``. A training window
    that happens to equal a held-out one (a likely stretch of the source can
    recur by chance) is replaced by the next fresh draw, so no model ever
    trains on a window it is tested on. AdamW (betas 0.9
    and 0.98, weight decay 0.01), clipping at 1, linear warm-up over
    ``warmup_steps`` and a cosine decay to ``peak_lr / 20`` at ``max_steps``.

    Parameters
    ----------
    seed : int
        Seeds the training windows, the initialization and the batch order.
    d_model : int
        Model width; the model is :func:`scaling_config` of it.
    max_steps : int
        Updates; the run sees ``max_steps * batch_size * context_length`` tokens.
    source_seed : int
        Seeds the Markov source and the held-out windows.
    vocab_size, order, branching : int
        The source (:meth:`~tinyformer.data.markov.MarkovSource.random`).
    concentration : float
        Dirichlet parameter of the source's next-token probabilities (below 1:
        peaked rows, a few likely successors and several rare ones).
    n_layers, d_k, context_length : int
        The rest of the model's shape (``d_k``: the size of each head).
    batch_size, peak_lr, warmup_steps : int, float, int
        Optimization settings.
    n_heldout_windows : int
        Windows of the independent held-out stream.
    log_every : int
        Steps between history rows.
    dtype : str
        ``"float32"`` or ``"float64"``.
    progress : bool
        Show a progress bar.

    Returns
    -------
    ExperimentResult
        ``metrics``: ``entropy_rate`` :math:`H`; ``heldout_loss`` at positions
        with a whole context (where the best possible loss is :math:`H`) and
        ``excess_loss`` = ``heldout_loss - entropy_rate``, the reducible loss;
        ``source_heldout_loss``, the source's own loss on the same tokens (how
        far the finite test set's loss of a perfect model lies from :math:`H`);
        ``parameters`` :math:`N`, the parameters outside the token and
        position tables (Kaplan et al.'s non-embedding count,
        :func:`tinyformer.cost.non_embedding_parameters`) and ``all_parameters``;
        ``train_tokens`` :math:`D`; ``train_flops`` :math:`6ND`
        (:func:`tinyformer.cost.kaplan_flops`) and ``train_flops_exact``, the
        products of every training step counted term by term
        (:func:`tinyformer.cost.training_flops`);
        ``heldout_windows_in_training``, the number of held-out windows that
        also occur in the training windows (0 by construction);
        ``training_windows_replaced``, how many draws were replaced to make it so;
        and ``steps``, ``train_seconds`` and ``cpu_seconds``, as every run
        (:meth:`~tinyformer.experiments.recipe.Recipe.result`); ``cpu_seconds``
        is the run's cost on one core, little changed by other work on the machine.
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    source = MarkovSource.random(
        vocab_size,
        order,
        branching,
        rng=np.random.default_rng([source_seed, 0]),
        concentration=concentration,
    )
    heldout = WindowDataset(
        *source.sample_windows(
            n_heldout_windows, context_length, np.random.default_rng([source_seed, 3])
        )
    )
    n_windows = recipe.max_steps * recipe.batch_size
    train, n_replaced = _fresh_windows(
        source, n_windows, context_length, np.random.default_rng([source_seed, 1, seed]), heldout
    )
    config = scaling_config(
        d_model,
        vocab_size=vocab_size,
        n_layers=n_layers,
        d_k=d_k,
        context_length=context_length,
        dtype=dtype,
    )
    trainer = recipe.trainer(config, train, clip_norm=1.0, log_every=log_every, progress=progress)
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()
    loss = float(per_position_loss(model, heldout)[order - 1 :].mean())
    n_params = cost.non_embedding_parameters(config)
    n_tokens = n_windows * context_length
    heldout_streams = _whole(heldout.inputs, heldout.targets)
    metrics = {
        "entropy_rate": source.entropy_rate,
        "heldout_loss": loss,
        "excess_loss": loss - source.entropy_rate,
        "source_heldout_loss": source.cross_entropy(heldout_streams),
        "parameters": float(n_params),
        "all_parameters": float(parameter_count(config)),
        "train_tokens": float(n_tokens),
        "train_flops": float(cost.kaplan_flops(n_params, n_tokens)),
        "train_flops_exact": float(cost.training_flops(config, context_length, n_windows)),
        "heldout_windows_in_training": float(
            _rows_in(heldout_streams, _whole(train.inputs, train.targets)).sum()
        ),
        "training_windows_replaced": float(n_replaced),
    }
    settings = {
        "source": {
            "vocab_size": vocab_size,
            "order": order,
            "branching": branching,
            "concentration": concentration,
            "source_seed": source_seed,
        },
        "n_heldout_windows": n_heldout_windows,
    }
    return recipe.result("scaling", trainer, metrics, settings)


# ----------------------------------------------------------------- the fit
def _sizes_and_excess(n_params: object, excess: object) -> tuple[np.ndarray, np.ndarray]:
    """``n_params`` (n,) and ``excess`` (n,) or (n_seeds, n) as float64, checked positive."""
    n = float_array(n_params, "n_params").astype(np.float64)
    e = float_array(excess, "excess").astype(np.float64)
    if n.ndim != 1 or n.size < 2 or e.shape[-1:] != n.shape or e.ndim > 2:
        raise ValueError(
            "n_params must have shape (n,) with n >= 2 and excess shape (n,) or (n_seeds, n),"
            f" got shapes {n.shape} and {e.shape}"
        )
    if (n <= 0).any() or (e <= 0).any() or not (np.isfinite(n).all() and np.isfinite(e).all()):
        raise ValueError(
            "n_params and excess must be finite and positive (the loss must lie above H),"
            f" got minimums {n.min()!r} and {e.min()!r}"
        )
    return n, e


def fit_power_law(n_params: object, excess: object) -> tuple[float, float]:
    r"""Fit :math:`L - H = (N_c / N)^{\alpha}` by least squares on logarithms.

    .. math::
        \log(L - H) = \alpha \log N_c - \alpha \log N,

    a straight line whose slope is :math:`-\alpha`. With ``excess`` of shape
    ``(n_seeds, n)`` every seed's point enters the fit.

    Parameters
    ----------
    n_params : array_like
        Parameter counts, shape ``(n,)``.
    excess : array_like
        Reducible losses :math:`L - H > 0`, shape ``(n,)`` or ``(n_seeds, n)``.

    Returns
    -------
    alpha, n_c : float
    """
    n, e = _sizes_and_excess(n_params, excess)
    x = np.broadcast_to(np.log(n), e.shape).ravel()
    slope, intercept = np.polyfit(x, np.log(e).ravel(), 1)
    alpha = -slope
    return float(alpha), float(np.exp(intercept / alpha))


def bootstrap_exponent(
    n_params: object, excess: object, *, n_resamples: int = 2000, rng: np.random.Generator
) -> np.ndarray:
    """Exponents refitted on seeds drawn with replacement, one draw per size and resample.

    ``excess`` has shape ``(n_seeds, n)``; each resample picks, for every size,
    ``n_seeds`` of its seeds' losses with replacement and refits
    :func:`fit_power_law`. The spread of the result is the exponent's uncertainty
    due to the seeds. Returns shape ``(n_resamples,)``.
    """
    n, e = _sizes_and_excess(n_params, excess)
    if e.ndim != 2:
        raise ValueError(f"excess must have shape (n_seeds, n), got shape {e.shape}")
    n_resamples = positive_int(n_resamples, "n_resamples")
    rng = generator(rng)
    picks = rng.integers(0, e.shape[0], size=(n_resamples, *e.shape))  # (R, S, n)
    columns = np.arange(e.shape[1])
    return np.array([fit_power_law(n, e[pick, columns])[0] for pick in picks])


# ------------------------------------------------------------ the arithmetic
def compute_for_loss_reduction(reduction: float, exponent: float) -> float:
    r"""Factor by which compute must grow to divide the reducible loss by ``reduction``.

    Under :math:`L - L_\infty \propto C^{-\alpha}`, dividing the reducible loss by
    :math:`r` needs :math:`C` to grow by :math:`r^{1/\alpha}`.
    """
    reduction = positive_float(reduction, "reduction")
    return reduction ** (1.0 / positive_float(exponent, "exponent"))


def loss_reduction_from_compute(factor: float, exponent: float) -> float:
    r"""Factor by which the reducible loss falls when compute grows by ``factor``: :math:`k^{\alpha}`."""
    return positive_float(factor, "factor") ** positive_float(exponent, "exponent")


def compute_optimal_split(
    compute: float, tokens_per_parameter: float = 20.0
) -> tuple[float, float]:
    r"""Parameters and tokens that spend ``compute`` at a fixed ratio :math:`D = rN`.

    From :math:`C = 6ND = 6rN^2`: :math:`N = \sqrt{C / (6r)}` and :math:`D = rN`.
    Both grow as :math:`C^{1/2}`.
    """
    compute = positive_float(compute, "compute")
    ratio = positive_float(tokens_per_parameter, "tokens_per_parameter")
    n_params = math.sqrt(compute / (6.0 * ratio))
    return n_params, ratio * n_params
