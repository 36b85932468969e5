r"""The in-context-learning run: a two-layer decoder learns to continue a repeated random segment.

Every training row is a fresh random segment written out again and again
(:func:`~tinyformer.data.icl.repeated_segments`), so the only way to predict a
token is to find its earlier copy in the same row. On held-out rows whose
second half repeats the first, the loss on the repeated half must fall far
below the first half's, which stays near :math:`\log V`. The heads that do it
are scored here: a *previous-token* head (query :math:`t` attends to key
:math:`t - 1`) and an *induction* head (query :math:`t` attends to the key
right after the earlier occurrence of its own token, :math:`t - L + 1` for
period :math:`L`) :cite:p:`olsson2022context`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer._validation import positive_int, token_ids
from tinyformer.data.icl import repeated_halves, repeated_segments
from tinyformer.experiments.recipe import Recipe, token_losses
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import DecoderOnlyConfig
from tinyformer.training import WindowDataset

__all__ = ["copy_accuracy_by_length", "head_scores", "in_context"]


def _rows(tokens: object, model: Any) -> np.ndarray:
    """Token rows ``(N, T)`` with ``2 <= T <= context_length + 1`` for ``model``."""
    tokens = token_ids(tokens, "tokens", model.vocab_size)
    if tokens.ndim != 2 or not 2 <= tokens.shape[1] <= model.context_length + 1:
        raise ValueError(
            f"tokens must have shape (N, T) with 2 <= T <= context_length + 1"
            f" = {model.context_length + 1}, got shape {tokens.shape}"
        )
    return tokens


def head_scores(model: Any, tokens: np.ndarray, period: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Previous-token and induction score of every head, on rows of period ``period``.

    With :math:`a^{(\ell, h)}_{t s}` the weight query :math:`t` gives key
    :math:`s` in head :math:`h` of layer :math:`\ell`, averaged over rows:

    .. math::
        \text{prev}_{\ell h} = \operatorname{mean}_{t \ge 1}\, a_{t,\, t-1}, \qquad
        \text{induction}_{\ell h} = \operatorname{mean}_{t \ge L}\, a_{t,\, t-L+1}

    (the induction score looks at queries whose token occurred :math:`L`
    places earlier, and at the key just after that occurrence). A head that
    always attends to that one key scores 1.

    Returns
    -------
    prev, induction : numpy.ndarray
        ``(n_layers, n_heads)`` each.
    """
    tokens = _rows(tokens, model)
    period = positive_int(period, "period")
    if not 1 <= period < tokens.shape[1] - 1:
        raise ValueError(
            f"period must be below T - 1 = {tokens.shape[1] - 1} for rows of T tokens,"
            f" got {period}"
        )
    model.forward(tokens[:, :-1])
    prev, induction = [], []
    for block in model.decoder.layers:
        a = block.self_attention.layer.attention_weights  # (B, h, T, T)
        prev.append(np.diagonal(a, offset=-1, axis1=-2, axis2=-1).mean(axis=(0, 2)))
        after_copy = np.diagonal(a, offset=-(period - 1), axis1=-2, axis2=-1)[..., 1:]
        induction.append(after_copy.mean(axis=(0, 2)))  # queries t = L .. T-1
    return np.array(prev, dtype=np.float64), np.array(induction, dtype=np.float64)


def copy_accuracy_by_length(
    model: Any,
    half_lengths: list[int] | np.ndarray,
    *,
    n_sequences: int = 256,
    rng: np.random.Generator,
) -> np.ndarray:
    """Greedy accuracy on the repeated half of rows of ``2 L`` tokens, for each ``L``.

    The first token of the repeat is left out (nothing before it says the
    segment has ended); the rest, ``L - 1`` tokens per row, are scored.
    """
    accuracies = []
    for length in half_lengths:
        half = positive_int(int(length), "half_lengths")
        tokens = repeated_halves(n_sequences, half, model.vocab_size, rng=rng)
        _, correct = token_losses(model, tokens[:, :-1], tokens[:, 1:])  # (N, 2L-1)
        accuracies.append(correct[:, half:].mean())
    return np.array(accuracies, dtype=np.float64)


def _halves_metrics(model: Any, tokens: np.ndarray, half: int) -> dict[str, float]:
    """Loss on each half of rows ``(N, 2 * half)``, accuracy on the repeat, best head scores."""
    # (N, 2L-1) each: entry t scores the prediction of token t+1
    losses, correct = token_losses(model, tokens[:, :-1], tokens[:, 1:])
    prev, induction = head_scores(model, tokens, half)
    return {
        "loss_first_half": float(losses[:, : half - 1].mean()),  # tokens 1 .. L-1
        "loss_repeated_half": float(losses[:, half:].mean()),  # tokens L+1 .. 2L-1
        "accuracy_repeated_half": float(correct[:, half:].mean()),
        "prev_token_score": float(prev[0].max()),  # best head of the first layer
        "induction_score": float(induction[-1].max()),  # best head of the last layer
    }


def in_context(
    *,
    seed: int = 0,
    vocab_size: int = 64,
    seq_len: int = 32,
    min_period: int = 4,
    d_model: int = 64,
    n_heads: int = 2,
    d_ff: int = 128,
    n_layers: int = 2,
    context_length: int = 64,
    positional: str = "sinusoidal",
    batch_size: int = 32,
    max_steps: int = 2000,
    peak_lr: float = 3e-3,
    warmup_steps: int = 50,
    n_validation: int = 256,
    n_heldout: int = 1024,
    eval_every: int = 100,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train a decoder-only model on repeated random segments; measure its in-context copying.

    Training windows hold ``seq_len`` tokens and the one after each: a fresh random segment of period
    :math:`L \in [\text{min\_period}, \text{seq\_len}/2]` repeated to the end
    (one stream of rows, each seen once). Validation rows (every
    ``eval_every`` steps) and held-out rows (the result) come from two other,
    independent streams and repeat a random first half of
    ``seq_len / 2`` tokens once. Only positions ``0 .. seq_len - 1`` are ever
    read in training, although the model accepts ``context_length``.

    Parameters
    ----------
    seed : int
        Seeds the three data streams, initialization and shuffling.
    vocab_size, seq_len, min_period : int
        The task.
    d_model, n_heads, d_ff, n_layers, context_length : int
        Model size (pre-norm blocks with a final LayerNorm).
    positional : str
        ``"sinusoidal"`` (the book's run) or ``"learned"`` (its variant for
        length generalization: rows of the position table past the trained
        length never receive a gradient).
    batch_size, max_steps, peak_lr, warmup_steps : int, int, float, int
        AdamW with warm-up and cosine decay, clipping at 1.
    n_validation, n_heldout, eval_every : int
    dtype : str
    progress : bool

    Returns
    -------
    ExperimentResult
        ``metrics`` on the held-out rows: ``log_vocab`` (:math:`\log V`),
        ``loss_first_half`` (tokens :math:`1 .. L-1`), ``loss_repeated_half``
        (tokens :math:`L+1 .. 2L-1`), ``accuracy_repeated_half``,
        ``prev_token_score`` (best head of the first layer) and
        ``induction_score`` (best head of the last layer), see
        :func:`head_scores`; and ``steps``, ``train_seconds`` and ``cpu_seconds``, as every run
        (:meth:`~tinyformer.experiments.recipe.Recipe.result`). The history's evaluation rows
        hold the same quantities on the validation rows.
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    seq_len = positive_int(seq_len, "seq_len")
    half = seq_len // 2
    rows, _ = repeated_segments(
        recipe.max_steps * recipe.batch_size,
        seq_len + 1,
        vocab_size,
        min_period=min_period,
        max_period=half,
        rng=np.random.default_rng([seed, 1]),
    )
    train = WindowDataset(rows[:, :-1], rows[:, 1:])
    validation = repeated_halves(
        n_validation, half, vocab_size, rng=np.random.default_rng([seed, 2])
    )
    heldout = repeated_halves(n_heldout, half, vocab_size, rng=np.random.default_rng([seed, 3]))
    config = DecoderOnlyConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        positional=positional,
        dtype=dtype,
    )
    trainer = recipe.trainer(
        config,
        train,
        clip_norm=1.0,
        evaluate=lambda m: _halves_metrics(m, validation, half),
        eval_every=eval_every,
        log_every=10,
        progress=progress,
    )
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()
    metrics = {"log_vocab": float(np.log(vocab_size))}
    metrics.update(_halves_metrics(model, heldout, half))
    settings = {
        "task": {"vocab_size": vocab_size, "seq_len": seq_len, "min_period": min_period},
        "n_heldout": n_heldout,
    }
    return recipe.result("in_context", trainer, metrics, settings)
