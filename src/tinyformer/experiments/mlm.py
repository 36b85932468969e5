r"""The masked-language-model run: an encoder-only model restores corrupted tokens of a Markov source.

The source is known exactly, so the best possible prediction of each chosen
token from the corrupted window is computable
(:func:`~tinyformer.data.masking.optimal_predictions`). On held-out windows the
model's loss must fall below the best loss of a reader that sees only the left
context, and come within a stated margin of the best bidirectional loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer.data import MarkovSource
from tinyformer.data.masking import (
    KEPT,
    MASKED,
    RANDOM,
    MaskedTokens,
    MaskingScheme,
    MLMDataset,
    optimal_predictions,
)
from tinyformer.experiments.recipe import Recipe, token_losses
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import EncoderOnlyConfig

__all__ = ["MLMData", "masked_lm", "mlm_data"]


@dataclass(frozen=True)
class MLMData:
    """The source, the scheme and the three sets of windows of one seed.

    ``validation`` and ``heldout`` are corrupted once, with their own
    generators, so every evaluation scores the same corruption.
    """

    source: MarkovSource
    scheme: MaskingScheme
    train: np.ndarray
    validation: MaskedTokens
    heldout: MaskedTokens


def mlm_data(
    seed: int,
    *,
    vocab_size: int = 16,
    order: int = 1,
    branching: int = 4,
    context_length: int = 16,
    n_train_windows: int = 8192,
    n_validation_windows: int = 256,
    n_heldout_windows: int = 4096,
) -> MLMData:
    """The data of :func:`masked_lm` for ``seed``: each part from its own generator stream."""
    source = MarkovSource.random(
        vocab_size, order, branching, rng=np.random.default_rng([seed, 0])
    )
    scheme = MaskingScheme(vocab_size, mask_id=vocab_size)

    def windows(n: int, stream: int) -> np.ndarray:
        return source.sample(context_length, np.random.default_rng([seed, stream]), n_streams=n)

    train = windows(n_train_windows, 1)
    validation = scheme.corrupt(windows(n_validation_windows, 2), np.random.default_rng([seed, 6]))
    heldout = scheme.corrupt(windows(n_heldout_windows, 3), np.random.default_rng([seed, 7]))
    return MLMData(source, scheme, train, validation, heldout)


def _optimal_losses(data: MLMData, batch: MaskedTokens) -> dict[str, np.ndarray]:
    """Cross-entropy of the two exact optima at every position, ``(B, T)`` each."""
    out = {}
    for name, left_only in (("bidirectional", False), ("left_only", True)):
        q = optimal_predictions(data.source, data.scheme, batch.inputs, left_only=left_only)
        picked = np.take_along_axis(q, batch.tokens[..., None], axis=-1)[..., 0]
        out[name] = -np.log(picked)
    return out


def _metrics(model: Any, batch: MaskedTokens, optimal: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean losses at the chosen positions, overall and by what the corruption did."""
    losses, _ = token_losses(model, batch.inputs, batch.tokens, batch_size=512)  # (B, T)
    chosen = batch.chosen
    out = {
        "loss": float(losses[chosen].mean()),
        "optimal_bidirectional": float(optimal["bidirectional"][chosen].mean()),
        "optimal_left_only": float(optimal["left_only"][chosen].mean()),
    }
    out["excess_over_optimum"] = out["loss"] / out["optimal_bidirectional"] - 1.0
    return out


def masked_lm(
    *,
    seed: int = 0,
    vocab_size: int = 16,
    order: int = 1,
    branching: int = 4,
    context_length: int = 16,
    d_model: int = 32,
    n_heads: int = 4,
    d_ff: int = 128,
    n_layers: int = 2,
    activation: str = "gelu_tanh",
    batch_size: int = 128,
    max_steps: int = 600,
    peak_lr: float = 2e-2,
    warmup_steps: int = 50,
    n_train_windows: int = 8192,
    n_validation_windows: int = 256,
    n_heldout_windows: int = 4096,
    eval_every: int = 50,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train an encoder-only model with BERT's masked-language-model objective on a Markov source.

    The source is :meth:`MarkovSource.random <tinyformer.data.markov.MarkovSource.random>`
    (``vocab_size`` symbols, order 1, 4 successors per symbol); the model's
    vocabulary has one more id, ``[MASK]`` = ``vocab_size``. Training windows
    are corrupted afresh at every step (:class:`~tinyformer.data.masking.MLMDataset`);
    validation and held-out windows come from independent generator streams
    and are corrupted once. Optimization: AdamW, warm-up then cosine decay,
    clipping at 1.

    Parameters
    ----------
    seed : int
        Seeds the source, the windows, the corruptions, initialization and shuffling.
    vocab_size, order, branching : int
        The Markov source.
    context_length : int
        Window length, and the model's context length.
    d_model, n_heads, d_ff, n_layers : int
        Model size (pre-norm blocks with a final LayerNorm, learned positions, tied output).
    activation : str
    batch_size, max_steps, peak_lr, warmup_steps : int, int, float, int
    n_train_windows, n_validation_windows, n_heldout_windows : int
    eval_every : int
        Steps between validation measurements (logged with both optima).
    dtype : str
    progress : bool

    Returns
    -------
    ExperimentResult
        ``metrics`` (held-out, chosen positions only): ``loss``;
        ``optimal_bidirectional``, the exact optimum's loss on the same tokens;
        ``optimal_left_only``, the best loss from the left context alone;
        ``excess_over_optimum`` = loss / optimal_bidirectional - 1; and, with a
        suffix ``_masked``, ``_random`` or ``_kept``, the model's loss and the
        bidirectional optimum at the positions the corruption treated that way;
        and ``steps``, ``train_seconds`` and ``cpu_seconds``, as every run
        (:meth:`~tinyformer.experiments.recipe.Recipe.result`).
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    data = mlm_data(
        seed,
        vocab_size=vocab_size,
        order=order,
        branching=branching,
        context_length=context_length,
        n_train_windows=n_train_windows,
        n_validation_windows=n_validation_windows,
        n_heldout_windows=n_heldout_windows,
    )
    config = EncoderOnlyConfig(
        vocab_size=vocab_size + 1,  # the ordinary tokens and [MASK]
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        activation=activation,
        dtype=dtype,
    )
    validation_optimal = _optimal_losses(data, data.validation)
    trainer = recipe.trainer(
        config,
        MLMDataset(data.train, data.scheme, rng=np.random.default_rng([seed, 8])),
        clip_norm=1.0,
        evaluate=lambda m: _metrics(m, data.validation, validation_optimal),
        eval_every=eval_every,
        log_every=10,
        progress=progress,
    )
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()
    heldout_optimal = _optimal_losses(data, data.heldout)
    metrics = _metrics(model, data.heldout, heldout_optimal)
    losses, _ = token_losses(model, data.heldout.inputs, data.heldout.tokens, batch_size=512)
    for name, code in (("masked", MASKED), ("random", RANDOM), ("kept", KEPT)):
        where = data.heldout.action == code
        metrics[f"loss_{name}"] = float(losses[where].mean())
        metrics[f"optimal_bidirectional_{name}"] = float(
            heldout_optimal["bidirectional"][where].mean()
        )
        metrics[f"optimal_left_only_{name}"] = float(heldout_optimal["left_only"][where].mean())
        metrics[f"n_{name}"] = float(where.sum())
    metrics["n_chosen"] = float(data.heldout.chosen.sum())
    metrics["entropy_rate"] = data.source.entropy_rate
    settings = {
        "source": {"vocab_size": vocab_size, "order": order, "branching": branching},
        "context_length": context_length,
        "n_train_windows": n_train_windows,
        "n_validation_windows": n_validation_windows,
        "n_heldout_windows": n_heldout_windows,
    }
    return recipe.result("masked_lm", trainer, metrics, settings)
