r"""Fine-tuning the book's language model on a shifted source: whole, or through LoRA adapters.

The base model is the stored language-model run (:func:`~tinyformer.experiments.markov.markov_lm`,
seed 0 by default): a decoder-only model that learned a random second-order
Markov source. :func:`shift_source` changes the next-token distributions of a
fraction of that source's contexts (new successors, new probabilities) and keeps
the others, so the base model is badly wrong on the shifted source exactly where
it changed. :func:`finetune` adapts a copy of the base model to the shifted
source, either every weight (full fine-tuning) or through low-rank adapters
(:func:`~tinyformer.lora.apply_lora`), and measures it on held-out windows of
both sources: how close it comes to the shifted source's entropy rate, and what
it lost on the original one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tinyformer._validation import (
    describe,
    generator,
    non_negative_int,
    positive_float,
    positive_int,
    unit_interval,
)
from tinyformer.data import MarkovSource
from tinyformer.data.markov import _ngrams
from tinyformer.experiments.markov import markov_task
from tinyformer.experiments.recipe import Recipe, token_losses
from tinyformer.experiments.result import ExperimentResult
from tinyformer.experiments.store import default_store
from tinyformer.lora import apply_lora, remove_lora
from tinyformer.module import no_grad
from tinyformer.training import WindowDataset

__all__ = [
    "ALL_LINEAR",
    "BOOK_FULL_LRS",
    "BOOK_RANKS",
    "BOOK_SEEDS",
    "STREAMS",
    "book_runs",
    "context_losses",
    "finetune",
    "seeded_shift",
    "shift_source",
    "stream_windows",
]

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "out_proj", "linear_in", "linear_out")
"""Every ``Linear`` layer of a block (the four attention projections and the two of the FFN)."""
BOOK_RANKS = (1, 2, 4, 8, 16)
"""The LoRA ranks of the chapter's comparison."""
BOOK_SEEDS = (0, 1, 2)
"""Seeds of every setting of the chapter (the shift, the adapters' A, the data, the batches)."""
BOOK_FULL_LRS = (5e-3, 3e-3)
"""Lower peak learning rates of full fine-tuning in the chapter (besides the default 1e-2)."""

STREAMS = {"shift": 6, "train": 7, "heldout_shifted": 8, "heldout_original": 9, "adapters": 10}
"""The generator stream ``[seed, i]`` of each random draw of a run (the recipe's are 4 and 5)."""
_MAX_DRAWS = 1000


def shift_source(
    source: MarkovSource, fraction: float, *, rng: np.random.Generator
) -> tuple[MarkovSource, np.ndarray]:
    r"""A copy of ``source`` with a random ``fraction`` of its contexts given new transitions.

    Each chosen context keeps its number of allowed successors but draws which
    symbols they are (uniformly, without replacement) and their probabilities
    (a flat Dirichlet distribution); every other context keeps its row of the
    table exactly. A draw whose chain is not irreducible and aperiodic
    (:class:`~tinyformer.data.markov.MarkovSource` checks) is thrown away and the
    next one is taken from the same generator, so the result is deterministic.

    Parameters
    ----------
    source : MarkovSource
    fraction : float
        In ``(0, 1]``: the share of the :math:`V^k` contexts that change,
        rounded to a whole number of contexts (at least one).
    rng : numpy.random.Generator

    Returns
    -------
    shifted : MarkovSource
    changed : numpy.ndarray of int
        The indices of the changed contexts (:meth:`~tinyformer.data.markov.MarkovSource.context_index`), sorted.
    """
    if not isinstance(source, MarkovSource):
        raise TypeError(f"source must be a MarkovSource, got {describe(source)}")
    fraction = unit_interval(fraction, "fraction", include_one=True)
    if fraction == 0.0:
        raise ValueError("fraction must be in (0, 1], got 0.0")
    rng = generator(rng)
    table = source.transitions.reshape(source.n_contexts, source.vocab_size)  # (C, V)
    n_changed = max(1, round(fraction * source.n_contexts))
    for _ in range(_MAX_DRAWS):
        changed = np.sort(rng.choice(source.n_contexts, n_changed, replace=False))
        new = table.copy()
        for c in changed:
            successors = rng.choice(source.vocab_size, int((table[c] > 0).sum()), replace=False)
            new[c] = 0.0
            new[c, successors] = rng.dirichlet(np.ones(len(successors)))
        try:
            shifted = MarkovSource(new.reshape(source.transitions.shape))
        except ValueError:  # not irreducible or not aperiodic: draw again
            continue
        return shifted, changed
    raise RuntimeError(f"no ergodic shift of {n_changed} contexts in {_MAX_DRAWS} draws")


def seeded_shift(
    source: MarkovSource, fraction: float, seed: int
) -> tuple[MarkovSource, np.ndarray]:
    """The shifted source of run ``seed``: :func:`shift_source` drawn from ``[seed, STREAMS["shift"]]``."""
    return shift_source(source, fraction, rng=np.random.default_rng([seed, STREAMS["shift"]]))


def stream_windows(
    source: MarkovSource, n: int, length: int, *, seed: int, stream: str
) -> WindowDataset:
    """``n`` windows of ``length`` tokens of ``source`` drawn from ``[seed, STREAMS[stream]]``.

    The windows a run of ``seed`` trains on (``stream="train"``) or is measured on
    (``"heldout_shifted"``, ``"heldout_original"``).
    """
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {sorted(STREAMS)}, got {stream!r}")
    rng = np.random.default_rng([seed, STREAMS[stream]])
    return WindowDataset(*source.sample_windows(n, length, rng))


def context_losses(
    model: Any, data: WindowDataset, order: int, changed: np.ndarray
) -> tuple[float, float, float]:
    """Mean held-out loss at full-context positions: all of them, those in changed contexts, the rest.

    Position ``t >= order - 1`` of a window predicts ``targets[:, t]`` from a
    whole context, the ``order`` tokens ending at ``t``; it is in a changed
    context when that context's index is in ``changed``. A group with no
    position has the mean NaN.
    """
    losses, _ = token_losses(model, data.inputs, data.targets)  # (N, T)
    tokens = np.concatenate([data.inputs[:, :1], data.targets], axis=1)  # (N, T + 1)
    start = order - 1
    index = _ngrams(tokens[:, :-1], model.vocab_size, order)  # the context before each target
    in_changed = np.isin(index, changed)  # (N, T - order + 1)
    full = losses[:, start:]
    changed_mean, kept_mean = (
        float(full[group].mean()) if group.any() else float("nan")
        for group in (in_changed, ~in_changed)
    )
    return float(full.mean()), changed_mean, kept_mean


def _conditional_entropy(source: MarkovSource, contexts: np.ndarray) -> float:
    """The source's entropy rate restricted to ``contexts``: the best loss there."""
    pi = source.stationary.ravel()[contexts]
    if not pi.sum() > 0:  # no contexts (fraction 1 keeps none)
        return float("nan")
    return float(pi @ source.context_entropies[contexts] / pi.sum())


def _measure(
    model: Any,
    shifted: tuple[MarkovSource, WindowDataset],
    original: tuple[MarkovSource, WindowDataset],
    changed: np.ndarray,
    prefix: str,
) -> dict[str, float]:
    """Held-out losses of ``model`` on both sources, keyed with ``prefix``."""
    (new_source, new_data), (old_source, old_data) = shifted, original
    order = new_source.order
    loss, loss_changed, loss_kept = context_losses(model, new_data, order, changed)
    old_loss, old_changed, old_kept = context_losses(model, old_data, order, changed)
    return {
        f"{prefix}loss_shifted": loss,
        f"{prefix}excess_shifted": loss / new_source.entropy_rate - 1.0,
        f"{prefix}loss_shifted_changed": loss_changed,
        f"{prefix}loss_shifted_kept": loss_kept,
        f"{prefix}loss_original": old_loss,
        f"{prefix}excess_original": old_loss / old_source.entropy_rate - 1.0,
        f"{prefix}loss_original_changed": old_changed,
        f"{prefix}loss_original_kept": old_kept,
    }


def _targets(targets: object) -> tuple[str, ...]:
    if isinstance(targets, str) or not isinstance(targets, Iterable):
        raise TypeError(f"targets must be a sequence of layer names, got {describe(targets)}")
    names = tuple(targets)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ValueError(f"targets must be non-empty layer names such as 'q_proj', got {names}")
    return names


def finetune(
    *,
    seed: int = 0,
    rank: int | None = None,
    alpha: float = 8.0,
    targets: Iterable[str] = ALL_LINEAR,
    steps: int = 120,
    lr: float | None = None,
    warmup_steps: int = 12,
    batch_size: int = 32,
    fraction: float = 0.25,
    n_train_windows: int = 1024,
    n_heldout_windows: int = 512,
    base: dict[str, Any] | None = None,
    progress: bool = False,
) -> ExperimentResult:
    r"""Fine-tune the stored language model on a shifted source, fully or with LoRA.

    The base model is ``markov_lm(**base)`` from the default store
    (:func:`~tinyformer.experiments.store.default_store`; trained there once).
    Its source is changed by :func:`shift_source` (``fraction`` of its contexts,
    drawn from the generator stream ``[seed, 6]``). A fresh copy of the base
    model is then trained on ``n_train_windows`` windows of the shifted source
    (stream ``[seed, 7]``) for ``steps`` updates with the book's
    :class:`~tinyformer.experiments.recipe.Recipe` (AdamW, warm-up then cosine,
    clipping at 1): every parameter when ``rank`` is None, else only the LoRA
    adapters that :func:`~tinyformer.lora.apply_lora` puts on the ``targets``
    layers of every block (their :math:`A` drawn from stream ``[seed, 10]``;
    everything else frozen).

    The stored model is a plain model. The store keeps models it can rebuild
    from their configuration (:func:`~tinyformer.models.loading.model_from_checkpoint`),
    which has no adapters, so after training the adapters are merged into their
    base weights for good (:func:`~tinyformer.lora.remove_lora`): the stored
    weights are :math:`W + \frac{\alpha}{r} A B` and the factors :math:`A` and
    :math:`B` themselves are not kept (:math:`\frac{\alpha}{r} A B` is the
    difference between the stored and the base weights, of rank at most
    :math:`r`). Before merging, the largest difference between the logits of the
    adapted model with its adapters apart and merged is measured on held-out windows.

    Parameters
    ----------
    seed : int
        Seeds the shift, the training windows, the held-out windows, the
        adapters and the batch order; not the base model (see ``base``).
    rank : int or None
        None: full fine-tuning. Else the LoRA rank :math:`r`.
    alpha : float
        LoRA's :math:`\alpha` (the update is scaled by :math:`\alpha / r`); unused
        in full fine-tuning.
    targets : sequence of str
        The layers that get adapters (names of ``Linear`` layers, every block's);
        by default all six of each block (:data:`ALL_LINEAR`).
    steps, warmup_steps, batch_size : int
        Optimization: updates, warm-up updates, windows per update.
    lr : float or None
        Peak learning rate; None takes 1e-2 for full fine-tuning and 3e-2 for LoRA
        (the settings of the chapter, chosen by trying a few).
    fraction : float
        Share of the source's contexts that the shift changes.
    n_train_windows, n_heldout_windows : int
        Windows of the base model's ``context_length`` tokens: the fine-tuning
        set, and each of the two held-out sets (shifted source, stream
        ``[seed, 8]``; original source, stream ``[seed, 9]``).
    base : dict or None
        The arguments of the base run ``markov_lm``; None means ``{"seed": 0}``,
        the book's language model.
    progress : bool

    Returns
    -------
    ExperimentResult
        ``model``: the fine-tuned model, adapters merged. ``metrics`` (losses in
        nats, held out, at positions with a whole context):
        ``entropy_rate_shifted`` and ``entropy_rate_original`` (:math:`H'` and
        :math:`H`); ``loss_shifted`` and ``excess_shifted`` = loss / :math:`H'`
        - 1; ``loss_original`` and ``excess_original`` = loss / :math:`H` - 1
        (forgetting); each loss also split into the positions whose context the
        shift ``_changed`` and those it ``_kept``, with the sources' own best
        losses there (``optimal_shifted_changed``, ``optimal_original_kept``,
        ...); the same for the base model before fine-tuning, prefixed
        ``base_``; ``changed_contexts`` and ``changed_mass`` (their stationary
        probability under the shifted source); ``trainable_parameters`` (what the
        optimizer updated) and ``total_parameters``;
        ``merge_max_logit_difference`` (LoRA only, else 0); and ``steps``,
        ``train_seconds`` and ``cpu_seconds``, as every run.
    """
    seed = non_negative_int(seed, "seed")
    if rank is not None:
        rank = positive_int(rank, "rank")
    alpha = positive_float(alpha, "alpha")
    targets = _targets(targets)
    steps = positive_int(steps, "steps")
    lr = positive_float(lr, "lr") if lr is not None else (1e-2 if rank is None else 3e-2)
    if base is not None and not isinstance(base, dict):
        raise TypeError(
            f"base must be a dict of markov_lm arguments or None, got {describe(base)}"
        )
    base = {"seed": 0} if base is None else dict(base)
    n_train_windows = positive_int(n_train_windows, "n_train_windows")
    n_heldout_windows = positive_int(n_heldout_windows, "n_heldout_windows")

    base_run = default_store().run("markov_lm", **base)
    model = base_run.model  # a fresh copy: the store builds a new model on every load
    source, _ = markov_task(base_run.seed, **base_run.config["source"])
    shifted, changed = seeded_shift(source, fraction, seed)
    length = model.context_length
    train = stream_windows(shifted, n_train_windows, length, seed=seed, stream="train")
    heldout = (
        (shifted, stream_windows(shifted, n_heldout_windows, length, seed=seed,
                                 stream="heldout_shifted")),
        (source, stream_windows(source, n_heldout_windows, length, seed=seed,
                                stream="heldout_original")),
    )  # fmt: skip
    kept = np.setdiff1d(np.arange(source.n_contexts), changed)
    metrics: dict[str, float] = {
        "entropy_rate_shifted": shifted.entropy_rate,
        "entropy_rate_original": source.entropy_rate,
        "optimal_shifted_changed": _conditional_entropy(shifted, changed),
        "optimal_shifted_kept": _conditional_entropy(shifted, kept),
        "optimal_original_changed": _conditional_entropy(source, changed),
        "optimal_original_kept": _conditional_entropy(source, kept),
        "changed_contexts": float(len(changed)),
        "changed_mass": float(shifted.stationary.ravel()[changed].sum()),
    }
    metrics.update(_measure(model, *heldout, changed, "base_"))

    if rank is not None:
        apply_lora(
            model,
            rank,
            alpha,
            targets=targets,
            rng=np.random.default_rng([seed, STREAMS["adapters"]]),
        )
    recipe = Recipe(seed, lr, warmup_steps, steps, batch_size)
    trainer = recipe.trainer(
        model.config, train, model=model.train(), clip_norm=1.0, log_every=10, progress=progress
    )
    trainable = sum(p.value.size for p in model.trainable_parameters())
    trainer.fit(steps)
    model = trainer.model.eval()
    difference = 0.0
    if rank is not None:
        probe = heldout[0][1].inputs[:64]
        with no_grad():
            apart = model.forward(probe).copy()  # (B, T, V)
            remove_lora(model)  # merged into the base weights; plain Linear layers again
            difference = float(np.abs(model.forward(probe) - apart).max())
    metrics.update(_measure(model, *heldout, changed, ""))
    metrics.update(
        {
            "trainable_parameters": float(trainable),
            "total_parameters": float(model.num_parameters()),
            "merge_max_logit_difference": difference,
        }
    )
    settings = {
        "base": base,
        "base_seed": base_run.seed,
        "rank": rank,
        "alpha": alpha,
        "targets": list(targets),
        "fraction": fraction,
        "n_train_windows": n_train_windows,
        "n_heldout_windows": n_heldout_windows,
    }
    return recipe.result("finetune", trainer, metrics, settings)


def book_runs() -> tuple[tuple[str, dict[str, Any]], ...]:
    """The runs of chapter "Fine-tuning with LoRA", each seed.

    Full fine-tuning and every rank at their default learning rates, then full
    fine-tuning at each of the lower rates :data:`BOOK_FULL_LRS`.
    """
    return tuple(
        ("finetune", {"seed": s, "rank": r}) for r in (None, *BOOK_RANKS) for s in BOOK_SEEDS
    ) + tuple(
        ("finetune", {"seed": s, "rank": None, "lr": lr})
        for lr in BOOK_FULL_LRS
        for s in BOOK_SEEDS
    )
