r"""Post-norm against pre-norm at depth: one training run of a deep, narrow language model.

The model is a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` with
``norm_first`` False (post-norm, :math:`x \leftarrow \operatorname{LN}(x + F(x))`, as
in :cite:t:`vaswani2017attention`) or True (pre-norm,
:math:`x \leftarrow x + F(\operatorname{LN}(x))` and a final LayerNorm, as in
GPT-2), trained on the Markov language-model task of
:mod:`tinyformer.experiments.markov` with or without learning-rate warm-up.
Before the first update it records the gradient norm of every block's
parameters, the quantity :cite:t:`xiong2020layer` analyse. A run whose loss or
gradient becomes NaN or infinite is a result, not a failure: training stops and
the step at which it diverged is reported.
"""

from __future__ import annotations

import math

import numpy as np

from tinyformer._validation import NonFiniteError, positive_int
from tinyformer.data import MarkovSource
from tinyformer.experiments.markov import markov_task, per_position_loss
from tinyformer.experiments.recipe import Recipe
from tinyformer.experiments.result import ExperimentResult
from tinyformer.masks import causal_mask
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.training import DivergenceError, WindowDataset, lm_loss

__all__ = ["block_gradient_norms", "norm_placement", "stream_rms"]


def block_gradient_norms(model: DecoderOnlyLM, batch: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Norm of the gradient of each block's parameters on one batch, shape ``(n_layers,)``.

    The model's gradients are zeroed first and hold this batch's afterwards.
    """
    model.zero_grad()
    lm_loss(model, batch, backward=True)
    return np.array(
        [
            math.sqrt(sum(float(np.sum(p.grad.astype(np.float64) ** 2)) for p in b.parameters()))
            for b in model.decoder.layers
        ]
    )


def stream_rms(model: DecoderOnlyLM, ids: np.ndarray) -> np.ndarray:
    """Root mean square of the residual stream entering each block and leaving the last one.

    Shape ``(n_layers + 1,)``: entry ``i`` is the input of block ``i``, the last
    entry the output of the stack (before the final LayerNorm of a pre-norm model).
    """
    stack = model.decoder
    x = stack.embedding.forward(ids)  # (B, T, d_model)
    if stack.positions is not None:
        x = stack.positions.forward(x, 0)
    mask = causal_mask(ids.shape[1])
    found = [math.sqrt(float(np.mean(x.astype(np.float64) ** 2)))]
    for block in stack.layers:
        x = block.forward(x, mask=mask)
        found.append(math.sqrt(float(np.mean(x.astype(np.float64) ** 2))))
    return np.array(found)


def norm_placement(
    *,
    seed: int = 0,
    norm_first: bool = False,
    n_layers: int = 6,
    warmup_steps: int = 0,
    peak_lr: float = 5e-3,
    vocab_size: int = 16,
    order: int = 2,
    branching: int = 4,
    d_model: int = 32,
    n_heads: int = 4,
    d_ff: int = 128,
    context_length: int = 16,
    batch_size: int = 16,
    max_steps: int = 300,
    n_train_windows: int = 2048,
    n_heldout_windows: int = 256,
    log_every: int = 5,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train one post-norm or pre-norm model; record its gradients at initialization.

    The data, the initialization and the batch order depend only on ``seed``,
    so a post-norm and a pre-norm run with the same seed see the same source,
    the same batches and (block by block) the same initial weights. AdamW
    (betas 0.9 and 0.98, weight decay 0.01), no gradient clipping, a learning
    rate that rises linearly over ``warmup_steps`` (none if 0) to ``peak_lr``
    and decays along a cosine to ``peak_lr / 20`` at ``max_steps``.

    Parameters
    ----------
    seed : int
        Seeds the source, the data streams, the initialization and the batch order.
    norm_first : bool
        Pre-norm (True) or post-norm (False) blocks.
    n_layers : int
        Number of decoder blocks.
    warmup_steps : int
        Steps of linear warm-up (0: start at ``peak_lr``).
    peak_lr : float
        The largest learning rate.
    vocab_size, order, branching : int
        The Markov source (:meth:`~tinyformer.data.markov.MarkovSource.random`).
    d_model, n_heads, d_ff, context_length : int
        Model width, heads, feed-forward width and window length.
    batch_size, max_steps : int
        Windows per step and the number of steps.
    n_train_windows, n_heldout_windows : int
        Windows of the training stream and of the independent held-out stream.
    log_every : int
        Steps between history rows.
    dtype : str
        ``"float32"`` or ``"float64"``.
    progress : bool
        Show a progress bar.

    Returns
    -------
    ExperimentResult
        ``metrics``: ``entropy_rate`` :math:`H` of the source (the best loss
        any model can reach); ``unigram_loss``, the held-out loss of predicting
        every token from the training set's token frequencies alone (what a
        model that ignores its context can reach); ``init_loss``, the held-out loss before training;
        ``heldout_loss``, after training (at positions with a full context,
        as in :func:`~tinyformer.experiments.markov.markov_lm`; NaN if it is not
        finite); ``diverged`` (1.0 or 0.0) and ``diverged_at_step`` (0 if
        not); ``init_grad_norm_<i>`` for each block ``i``
        (counted from 0 at the input) on the first ``batch_size`` training
        windows, before any update, and
        ``init_grad_norm_ratio``, the last block's over the first's;
        ``init_stream_rms_<i>`` for ``i`` from 0 to ``n_layers``, the root mean
        square of the residual stream entering block ``i`` (the last: leaving
        the stack) on the same windows, from :func:`stream_rms`; and
        ``steps``, ``train_seconds`` and ``cpu_seconds``, as every run
        (:meth:`~tinyformer.experiments.recipe.Recipe.result`).
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    n_layers = positive_int(n_layers, "n_layers")
    source, windows = markov_task(seed, vocab_size, order, branching)
    train = windows(n_train_windows, context_length, 1)
    heldout = windows(n_heldout_windows, context_length, 3)
    config = DecoderOnlyConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        norm_first=bool(norm_first),
        activation="gelu_tanh",
        dtype=dtype,
    )
    trainer = recipe.trainer(config, train, log_every=log_every, progress=progress)
    model = trainer.model
    first_batch = train.batch(np.arange(recipe.batch_size))
    init_norms = block_gradient_norms(model, first_batch)
    init_rms = stream_rms(model, first_batch[0])
    model.zero_grad()
    metrics: dict[str, float] = {
        "entropy_rate": source.entropy_rate,
        "unigram_loss": _unigram_loss(train, heldout, source),
        "init_loss": _heldout_loss(model, heldout, source),
    }
    diverged_at = 0
    try:
        trainer.fit(recipe.max_steps)
    except DivergenceError as err:
        diverged_at = err.step
    model.eval()
    metrics["heldout_loss"] = _heldout_loss(model, heldout, source)
    metrics["diverged"] = float(diverged_at > 0)
    metrics["diverged_at_step"] = float(diverged_at)
    for i, norm in enumerate(init_norms):
        metrics[f"init_grad_norm_{i}"] = float(norm)
    metrics["init_grad_norm_ratio"] = float(init_norms[-1] / init_norms[0])
    for i, rms in enumerate(init_rms):
        metrics[f"init_stream_rms_{i}"] = float(rms)
    settings = {
        "source": {"vocab_size": vocab_size, "order": order, "branching": branching},
        "n_train_windows": n_train_windows,
        "n_heldout_windows": n_heldout_windows,
        "log_every": log_every,
    }
    return recipe.result("norm_placement", trainer, metrics, settings)


def _heldout_loss(model: DecoderOnlyLM, data: WindowDataset, source: MarkovSource) -> float:
    """Mean held-out cross-entropy at full-context positions; NaN if not finite.

    A diverged model's weights can overflow inside the forward pass, where a layer
    refuses the NaN or inf it meets: that loss is NaN too.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        try:
            loss = float(per_position_loss(model, data)[source.order - 1 :].mean())
        except NonFiniteError:
            return math.nan
    return loss if math.isfinite(loss) else math.nan


def _unigram_loss(train: WindowDataset, heldout: WindowDataset, source: MarkovSource) -> float:
    """Held-out cross-entropy (full-context positions) of the training token frequencies."""
    counts = np.bincount(train.targets.ravel(), minlength=source.vocab_size) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[heldout.targets[:, source.order - 1 :]].mean())
