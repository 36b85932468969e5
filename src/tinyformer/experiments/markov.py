r"""The language-model run: a decoder-only model learns a random second-order Markov source.

Its held-out cross-entropy must come within 3% of the source's entropy rate
:math:`H`, the lowest loss any model can reach.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tinyformer._validation import positive_int
from tinyformer.data import MarkovSource
from tinyformer.experiments.recipe import Recipe, token_losses
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import DecoderOnlyConfig
from tinyformer.training import EarlyStopping, WindowDataset

__all__ = ["markov_lm", "markov_task", "per_position_loss"]


def per_position_loss(model: Any, data: WindowDataset, *, batch_size: int = 256) -> np.ndarray:
    """Mean cross-entropy (nats) at each position of the windows, shape ``(T,)``.

    Position ``t`` predicts ``targets[:, t]`` from ``inputs[:, :t + 1]``. The
    sum over windows is taken batch by batch: the first ``batch_size`` windows,
    plus the next ``batch_size``, and so on.
    """
    batch_size = positive_int(batch_size, "batch_size")
    losses, _ = token_losses(model, data.inputs, data.targets, batch_size=batch_size)  # (N, T)
    total = sum(losses[i : i + batch_size].sum(axis=0) for i in range(0, len(data), batch_size))
    return total / len(data)


def _markov_metrics(model: Any, data: WindowDataset, source: MarkovSource) -> dict[str, float]:
    """Full-context loss against H, and all-position loss against the optimal curve."""
    losses = per_position_loss(model, data)  # (T,)
    full = losses[source.order - 1 :].mean()
    optimal = source.optimal_cross_entropy(data.seq_len)
    return {
        "loss_full_context": float(full),
        "excess_over_entropy_rate": float(full / source.entropy_rate - 1.0),
        "loss_all_positions": float(losses.mean()),
        "optimal_all_positions": float(optimal.mean()),
    }


def markov_task(
    seed: int, vocab_size: int, order: int, branching: int
) -> tuple[MarkovSource, Callable[[int, int, int], WindowDataset]]:
    """The seeded source of the Markov runs, and a maker of its window streams.

    ``windows(n, length, stream)`` draws ``n`` windows from the independent
    random stream ``[seed, stream]``: the runs use stream 1 for training, 2 for
    validation and 3 for the held-out result (stream 0 draws the source).
    """
    source = MarkovSource.random(
        vocab_size, order, branching, rng=np.random.default_rng([seed, 0])
    )

    def windows(n: int, length: int, stream: int) -> WindowDataset:
        rng = np.random.default_rng([seed, stream])
        return WindowDataset(*source.sample_windows(n, length, rng))

    return source, windows


def markov_lm(
    *,
    seed: int = 0,
    vocab_size: int = 16,
    order: int = 2,
    branching: int = 4,
    d_model: int = 64,
    n_heads: int = 4,
    d_ff: int = 256,
    n_layers: int = 2,
    context_length: int = 64,
    activation: str = "gelu_tanh",
    batch_size: int = 32,
    max_steps: int = 800,
    peak_lr: float = 1e-2,
    warmup_steps: int = 50,
    n_train_windows: int = 8192,
    n_validation_windows: int = 256,
    n_heldout_windows: int = 1024,
    eval_every: int = 50,
    target_excess: float = 0.015,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train a decoder-only model on a random Markov source; compare its loss with the entropy rate.

    The source is :meth:`MarkovSource.random <tinyformer.data.markov.MarkovSource.random>`
    (``vocab_size`` symbols, order 2, 4 allowed successors per context). The
    training windows come from one generator stream, the validation windows
    (early stopping) from a second and the held-out windows (the result) from
    a third, independent one. Training (AdamW, warm-up then cosine decay,
    clipping at 1) stops early once the validation loss at full-context
    positions is within ``target_excess`` of :math:`H`.

    Parameters
    ----------
    seed : int
        Seeds the source, the three window streams, initialization and shuffling.
    vocab_size, order, branching : int
        The Markov source.
    d_model, n_heads, d_ff, n_layers, context_length : int
        Model size (pre-norm blocks with a final LayerNorm, learned positions).
    activation : str
        The feed-forward nonlinearity; by default GPT-2's tanh form of GELU.
    batch_size, max_steps, peak_lr, warmup_steps : int, int, float, int
        Optimization settings (the cosine decay ends at ``max_steps``).
    n_train_windows, n_validation_windows, n_heldout_windows : int
        Windows of ``context_length`` tokens in each stream.
    eval_every : int
        Steps between validation measurements.
    target_excess : float
        Stop once the validation loss is below :math:`(1 + \text{target\_excess})\,H`.
    dtype : str
        ``"float32"`` (the default: the book trains in single precision, as practice
        does) or ``"float64"``.
    progress : bool

    Returns
    -------
    ExperimentResult
        ``metrics``: ``entropy_rate`` :math:`H`; ``loss_full_context``, the
        held-out loss at positions with a whole context (:math:`t \ge k - 1`,
        where the best possible loss is :math:`H`) and
        ``excess_over_entropy_rate`` = loss / H - 1 (the result: below 0.03);
        ``source_loss_full_context``, the source's own loss on the same tokens
        (the sampling noise of the held-out set); ``loss_all_positions`` against
        ``optimal_all_positions``, the mean of
        :meth:`~tinyformer.data.markov.MarkovSource.optimal_cross_entropy`; and
        ``steps``, ``train_seconds`` and ``cpu_seconds``, as every run
        (:meth:`~tinyformer.experiments.recipe.Recipe.result`).
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    source, windows = markov_task(seed, vocab_size, order, branching)
    train = windows(n_train_windows, context_length, 1)
    validation = windows(n_validation_windows, context_length, 2)
    heldout = windows(n_heldout_windows, context_length, 3)
    config = DecoderOnlyConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        activation=activation,
        dtype=dtype,
    )
    trainer = recipe.trainer(
        config,
        train,
        clip_norm=1.0,
        evaluate=lambda m: _markov_metrics(m, validation, source),
        eval_every=eval_every,
        early_stopping=EarlyStopping("excess_over_entropy_rate", target=target_excess, mode="min"),
        log_every=10,
        progress=progress,
    )
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()
    metrics = {"entropy_rate": source.entropy_rate}
    metrics.update(_markov_metrics(model, heldout, source))
    full_context = np.concatenate([heldout.inputs[:, :1], heldout.targets], axis=1)
    metrics["source_loss_full_context"] = source.cross_entropy(full_context)
    settings = {
        "source": {"vocab_size": vocab_size, "order": order, "branching": branching},
        "n_train_windows": n_train_windows,
        "n_heldout_windows": n_heldout_windows,
        "target_excess": target_excess,
    }
    return recipe.result("markov_lm", trainer, metrics, settings)
