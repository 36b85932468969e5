r"""From GPT-2 to a modern decoder: each architectural change as an ablation on the Markov source.

Every run trains one small decoder-only model on the random second-order Markov
source of :func:`~tinyformer.experiments.markov.markov_task` for a fixed number of
steps (no early stopping, so every variant gets the same budget and the losses
are comparable) and measures its held-out loss against the source's entropy rate
:math:`H`. The baseline is GPT-2's decoder (pre-norm LayerNorm, a plain feed-forward
network with tanh GELU, learned positions, multi-head attention, biases); each entry
of :data:`VARIANTS` changes it in one respect (RMSNorm, SwiGLU at equal parameters,
rotary positions, grouped-query or multi-query attention, no biases) or in all of
them at once. :func:`book_runs` lists the runs of chapter "From GPT-2 to a modern
decoder": every variant with :data:`SEEDS`. The rotary runs are also the models of
the length-extrapolation test, which :func:`stretched` and :func:`extrapolation_losses`
evaluate on windows longer than any they saw.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int
from tinyformer.experiments.markov import markov_task, per_position_loss
from tinyformer.experiments.recipe import Recipe
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.models.counting import gated_d_ff, kv_cache_bytes_per_token, parameter_count
from tinyformer.training import WindowDataset

__all__ = [
    "BUDGET_STEPS",
    "SEEDS",
    "VARIANTS",
    "book_runs",
    "extrapolation_losses",
    "modern_lm",
    "stretched",
]

D_MODEL = 32
"""Width of every ablation model (:func:`modern_lm`'s default)."""

VARIANTS: dict[str, dict[str, Any]] = {
    "GPT-2": {},
    "RMSNorm": {"norm": "rmsnorm"},
    "SwiGLU": {"feed_forward": "gated", "activation": "silu", "d_ff": gated_d_ff(D_MODEL)},
    "RoPE": {"positional": "rotary"},
    "GQA": {"n_kv_heads": 2},
    "MQA": {"n_kv_heads": 1},
    "no biases": {"bias": False},
    "modern": {
        "norm": "rmsnorm",
        "feed_forward": "gated",
        "activation": "silu",
        "d_ff": gated_d_ff(D_MODEL),
        "positional": "rotary",
        "n_kv_heads": 2,
        "bias": False,
    },
}
r"""Each variant's change to the GPT-2 baseline, as arguments of :func:`modern_lm`.

SwiGLU's hidden width is :func:`~tinyformer.models.counting.gated_d_ff` of the
width (:math:`\lfloor 8d/3 \rfloor`), which gives its three matrices about the
weights of the plain network's two of width :math:`4d`. ``"modern"`` makes every
change at once, with grouped-query attention in groups of two query heads per
key/value head. It keeps the output projection tied to the embedding, which
Llama does not: that sixth difference is left out of the ablation.
"""

SEEDS = (0, 1, 2, 3, 4)
"""Seeds of every variant; each sets the source, the data, the initial weights and the batches."""

BUDGET_STEPS = 500
"""Updates of every ablation run (after them the baseline is still clearly above :math:`H`)."""


def book_runs() -> tuple[tuple[str, dict[str, Any]], ...]:
    """The runs of chapter "From GPT-2 to a modern decoder": every variant with every seed.

    The ``"RoPE"`` runs, trained on windows of ``context_length`` tokens, are also the
    models of the length-extrapolation test (:func:`stretched`, :func:`extrapolation_losses`).
    """
    runs = [
        ("modern_lm", {"seed": s, "max_steps": BUDGET_STEPS, **change})
        for change in VARIANTS.values()
        for s in SEEDS
    ]
    return tuple(runs)


def modern_lm(
    *,
    seed: int = 0,
    norm: str = "layernorm",
    feed_forward: str = "plain",
    activation: str = "gelu_tanh",
    d_ff: int | None = None,
    positional: str = "learned",
    n_kv_heads: int | None = None,
    bias: bool = True,
    vocab_size: int = 16,
    order: int = 2,
    branching: int = 4,
    d_model: int = D_MODEL,
    n_heads: int = 4,
    n_layers: int = 1,
    context_length: int = 32,
    batch_size: int = 32,
    max_steps: int = BUDGET_STEPS,
    peak_lr: float = 1e-2,
    warmup_steps: int = 30,
    n_train_windows: int = 4096,
    n_heldout_windows: int = 512,
    log_every: int = 25,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train one variant of the decoder for a fixed budget; measure its held-out loss against :math:`H`.

    The source and the window streams are those of
    :func:`~tinyformer.experiments.markov.markov_task` (``seed``): training
    windows from stream 1, held-out windows from stream 3, which no run trains
    on. The model is a pre-norm :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` with
    the output tied to the embedding; the arguments from ``norm`` to ``bias``
    are the :class:`~tinyformer.models.config.DecoderOnlyConfig` fields an
    ablation changes. Training (the book's :class:`~tinyformer.experiments.recipe.Recipe`:
    AdamW, warm-up then cosine decay to ``max_steps``, clipping at 1) always
    makes ``max_steps`` updates: there is no early stopping.

    Parameters
    ----------
    seed : int
        Seeds the source, the windows, the initialization and the batch order.
    norm, feed_forward, activation : str
        The norm (``"layernorm"`` or ``"rmsnorm"``), the feed-forward kind
        (``"plain"`` or ``"gated"``) and its nonlinearity.
    d_ff : int, optional
        Feed-forward width; ``None`` means ``4 * d_model``.
    positional : str
        ``"learned"`` or ``"rotary"`` (or any position of the configuration).
    n_kv_heads : int, optional
        Key/value heads (``None``: one per query head).
    bias : bool
        Biases in the attention projections and feed-forward layers.
    vocab_size, order, branching : int
        The Markov source.
    d_model, n_heads, n_layers, context_length : int
        The rest of the model's shape; ``context_length`` is also the windows' length.
    batch_size, max_steps, peak_lr, warmup_steps : int, int, float, int
        Optimization settings.
    n_train_windows, n_heldout_windows : int
        Windows in the training and held-out streams.
    log_every : int
        Steps between history rows.
    dtype : str
        ``"float32"`` or ``"float64"``.
    progress : bool
        Show a progress bar.

    Returns
    -------
    ExperimentResult
        ``metrics``: ``entropy_rate`` :math:`H`; ``heldout_loss``, the mean
        cross-entropy (nats) at held-out positions with a whole context
        (:math:`t \ge k - 1`, where the best possible loss is :math:`H`);
        ``excess_loss`` = ``heldout_loss - entropy_rate``;
        ``source_heldout_loss``, the source's own loss on the same tokens;
        ``parameters``, the model's parameter count
        (:func:`~tinyformer.models.counting.parameter_count`, equal to the
        built model's); ``kv_cache_bytes_per_token``
        (:func:`~tinyformer.models.counting.kv_cache_bytes_per_token` in the
        model's dtype); and ``steps``, ``train_seconds`` and ``cpu_seconds``.
    """
    n_train_windows = positive_int(n_train_windows, "n_train_windows")
    n_heldout_windows = positive_int(n_heldout_windows, "n_heldout_windows")
    if d_ff is None:
        d_ff = 4 * positive_int(d_model, "d_model")
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    source, windows = markov_task(seed, vocab_size, order, branching)
    config = DecoderOnlyConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        norm=norm,
        feed_forward=feed_forward,
        activation=activation,
        positional=positional,
        n_kv_heads=n_kv_heads,
        bias=bias,
        dtype=dtype,
    )
    train = windows(n_train_windows, context_length, 1)
    heldout = windows(n_heldout_windows, context_length, 3)
    trainer = recipe.trainer(config, train, clip_norm=1.0, log_every=log_every, progress=progress)
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()
    loss = float(per_position_loss(model, heldout)[order - 1 :].mean())
    streams = np.concatenate([heldout.inputs[:, :1], heldout.targets], axis=1)
    metrics = {
        "entropy_rate": source.entropy_rate,
        "heldout_loss": loss,
        "excess_loss": loss - source.entropy_rate,
        "source_heldout_loss": source.cross_entropy(streams),
        "parameters": float(parameter_count(config)),
        "kv_cache_bytes_per_token": float(kv_cache_bytes_per_token(config)),
    }
    settings = {
        "source": {"vocab_size": vocab_size, "order": order, "branching": branching},
        "n_train_windows": n_train_windows,
        "n_heldout_windows": n_heldout_windows,
    }
    return recipe.result("modern_lm", trainer, metrics, settings)


def stretched(
    model: DecoderOnlyLM,
    context_length: int,
    *,
    scaling: str | None = None,
    factor: float = 1.0,
) -> DecoderOnlyLM:
    """A copy of a trained model that reads ``context_length`` positions, its rotary positions scaled.

    The new model's configuration is ``model.config`` with ``context_length``,
    ``rotary_scaling=scaling`` and ``rotary_scaling_factor=factor`` replaced; the
    trained weights are loaded into it unchanged
    (:meth:`~tinyformer.module.Module.load_state_dict`). A rotary model's
    weights do not depend on its context length, so this works for any length; a
    model with a learned position table does not fit (the table has one row per
    trained position) and the load raises :class:`ValueError`.

    Parameters
    ----------
    model : DecoderOnlyLM
        The trained model.
    context_length : int
        The longest sequence the copy reads.
    scaling : str, optional
        ``"linear"`` (position interpolation) or ``"ntk"`` (NTK-aware), or
        ``None`` (the positions as trained).
    factor : float
        The stretch :math:`s` of the scaling (1.0 without one).
    """
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a DecoderOnlyLM, got {describe(model)}")
    config = dataclasses.replace(
        model.config,
        context_length=positive_int(context_length, "context_length"),
        rotary_scaling=scaling,
        rotary_scaling_factor=factor,
    )
    longer = DecoderOnlyLM(config, rng=np.random.default_rng(0))  # every weight replaced below
    longer.load_state_dict(model.state_dict())
    return longer.eval()


def extrapolation_losses(
    model: DecoderOnlyLM,
    *,
    seed: int,
    length: int,
    n_windows: int = 256,
    vocab_size: int = 16,
    order: int = 2,
    branching: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Held-out loss at every position of windows of ``length`` tokens, and the best possible.

    The windows come from the source of ``seed`` (the one the model was trained
    on, :func:`~tinyformer.experiments.markov.markov_task`) through stream 6,
    which no run trains on. ``model`` must read ``length`` positions (see
    :func:`stretched`).

    Returns
    -------
    losses : numpy.ndarray
        ``(length,)``: the mean cross-entropy (nats) of the prediction at each position.
    optimal : numpy.ndarray
        ``(length,)``: the source's own expected loss at each position
        (:meth:`~tinyformer.data.markov.MarkovSource.optimal_cross_entropy`),
        :math:`H` from position ``order - 1`` on.
    """
    length = positive_int(length, "length")
    n_windows = positive_int(n_windows, "n_windows")
    if length > model.context_length:
        raise ValueError(
            f"length must be at most the model's context_length={model.context_length},"
            f" got {length}: stretch the model first"
        )
    source, windows = markov_task(seed, vocab_size, order, branching)
    data: WindowDataset = windows(n_windows, length, 6)
    return per_position_loss(model, data), source.optimal_cross_entropy(length)
