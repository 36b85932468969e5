"""The reversal run: an encoder-decoder learns to reverse strings of 1 to 8 symbols.

Greedy decoding must reproduce at least 99% of 1,000 held-out sources exactly.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from tinyformer._validation import positive_int, unit_interval
from tinyformer.data import BOS_ID, EOS_ID, PAD_ID, PairDataset, SequenceTask
from tinyformer.data.tasks import TaskSplit
from tinyformer.experiments.result import ExperimentResult
from tinyformer.generation import greedy
from tinyformer.models import EncoderDecoder, EncoderDecoderConfig
from tinyformer.optim import AdamW
from tinyformer.schedules import WarmupCosineSchedule
from tinyformer.training import EarlyStopping, Trainer, seq2seq_loss

__all__ = ["exact_match", "reversal", "reversal_data"]


def exact_match(model: Any, data: PairDataset, *, batch_size: int = 500) -> float:
    """Share of the pairs whose target greedy decoding reproduces exactly (``<eos>`` included).

    Sources are decoded in padded batches; decoding a row stops at ``<eos>``
    or after ``len(target) + 1`` tokens, so a longer output is wrong too.
    """
    batch_size = positive_int(batch_size, "batch_size")
    correct = 0
    for start in range(0, len(data), batch_size):
        pairs = [data[i] for i in range(start, min(start + batch_size, len(data)))]
        width = max(len(s) for s, _ in pairs)
        sources = np.full((len(pairs), width), PAD_ID, dtype=np.int64)  # (B, S)
        for row, (source, _) in zip(sources, pairs, strict=True):
            row[: len(source)] = source
        longest = max(len(t) for _, t in pairs) + 1
        result = greedy(model, sources, max_new_tokens=longest, bos_id=BOS_ID, eos_id=EOS_ID)
        for tokens, (_, target) in zip(result.tokens, pairs, strict=True):
            correct += bool(np.array_equal(tokens, np.append(target, EOS_ID)))
    return correct / len(data)


def reversal_data(
    *, seed: int = 0, n_train: int = 40_000, n_validation: int = 500, n_heldout: int = 1000
) -> tuple[SequenceTask, TaskSplit, PairDataset, PairDataset]:
    """The reversal task, its held-out split, training pairs and a validation subset.

    The held-out sources (``split.heldout``) are set aside first; the training
    pairs and the validation pairs (used for early stopping) are then drawn,
    independently, from the remaining sources only.
    """
    rng = np.random.default_rng([seed, 0])
    task = SequenceTask("reverse", n_symbols=10, min_len=1, max_len=8)
    split = task.split(positive_int(n_heldout, "n_heldout"), rng=rng)
    train = split.sample_train(positive_int(n_train, "n_train"), rng)
    validation = split.sample_train(positive_int(n_validation, "n_validation"), rng)
    return task, split, train, validation


def reversal(
    *,
    seed: int = 0,
    d_model: int = 64,
    n_heads: int = 4,
    d_ff: int = 256,
    n_layers: int = 2,
    batch_size: int = 64,
    max_steps: int = 1500,
    peak_lr: float = 3e-3,
    warmup_steps: int = 100,
    label_smoothing: float = 0.0,
    dropout: float = 0.0,
    n_train: int = 40_000,
    n_validation: int = 500,
    eval_every: int = 100,
    target: float = 1.0,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    """Train an encoder-decoder to reverse strings; report greedy exact match on held-out sources.

    The task is :class:`~tinyformer.data.tasks.SequenceTask` ``"reverse"`` over 10
    symbols, lengths 1 to 8 (vocabulary 14 with the special tokens). 1,000
    held-out sources are set aside before any training pair is drawn. Training
    (AdamW, linear warm-up then cosine decay, gradient clipping at 1) stops
    early once greedy decoding reproduces at least ``target`` of a validation
    subset drawn from the training side; the held-out set is decoded once, at
    the end.

    Parameters
    ----------
    seed : int
        Seeds every generator of the run (data, split, initialization, shuffling).
    d_model, n_heads, d_ff, n_layers : int
        Model size; ``n_layers`` blocks in the encoder and in the decoder (post-norm).
    batch_size, max_steps : int
        Pairs per step, and the step budget (the cosine decay ends there).
    peak_lr, warmup_steps, label_smoothing, dropout : float, int, float, float
        Optimization settings.
    n_train, n_validation : int
        Training pairs, and validation pairs for early stopping (both from the training side).
    eval_every : int
        Steps between validation decodes.
    target : float
        Stop once greedy decoding gets at least this share of the validation pairs exactly right.
    dtype : str
        ``"float32"`` (the default: the book trains in single precision, as practice
        does, at about half the time of float64) or ``"float64"``.
    progress : bool
        Show a progress bar.

    Returns
    -------
    ExperimentResult
        ``metrics``: ``heldout_exact_match`` (the result), ``validation_exact_match``,
        ``heldout_token_accuracy`` (teacher-forced), ``heldout_in_training`` (must be 0),
        ``steps``, ``train_seconds``.
    """
    started = time.perf_counter()
    task, split, train, validation = reversal_data(
        seed=seed, n_train=n_train, n_validation=n_validation
    )
    config = EncoderDecoderConfig(
        src_vocab_size=task.vocab_size,
        tgt_vocab_size=task.vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_encoder_layers=n_layers,
        n_decoder_layers=n_layers,
        max_len=task.max_len + 1,
        dropout=dropout,
        dtype=dtype,
    )
    model = EncoderDecoder(config, rng=np.random.default_rng([seed, 1]))
    max_steps = positive_int(max_steps, "max_steps")
    schedule = WarmupCosineSchedule(peak_lr, warmup_steps, max_steps, min_lr=peak_lr / 20)
    optimizer = AdamW(model.parameters(), schedule, betas=(0.9, 0.98), weight_decay=0.01)
    smoothing = unit_interval(label_smoothing, "label_smoothing")

    def objective(model: Any, batch: Any, *, backward: bool = True) -> Any:
        return seq2seq_loss(model, batch, label_smoothing=smoothing, backward=backward)

    trainer = Trainer(
        model,
        optimizer,
        objective,
        train,
        batch_size=batch_size,
        rng=np.random.default_rng([seed, 2]),
        clip_norm=1.0,
        evaluate=lambda m: {"exact_match": exact_match(m, validation)},
        eval_every=eval_every,
        early_stopping=EarlyStopping("exact_match", target=target),
        log_every=10,
        progress=progress,
    )
    trainer.fit(max_steps)
    model.eval()
    heldout_in_training = sum(split.is_heldout(s) for s in train.sources)
    token_accuracy = _token_accuracy(model, split.heldout)
    metrics = {
        "heldout_exact_match": exact_match(model, split.heldout),
        "heldout_token_accuracy": token_accuracy,
        "validation_exact_match": float(trainer.history.eval[-1]["exact_match"]),
        "heldout_size": len(split.heldout),
        "heldout_in_training": int(heldout_in_training),
        "steps": trainer.step,
        "train_seconds": float(trainer.history.train[-1]["time"]),
    }
    settings = {
        "model": config.to_dict(),
        "batch_size": batch_size,
        "max_steps": max_steps,
        "peak_lr": peak_lr,
        "warmup_steps": warmup_steps,
        "label_smoothing": smoothing,
        "n_train": n_train,
        "n_validation": n_validation,
        "target": target,
    }
    return ExperimentResult(
        "reversal", seed, settings, trainer.history, metrics, time.perf_counter() - started, model
    )


def _token_accuracy(model: Any, data: PairDataset) -> float:
    """Teacher-forced next-token accuracy over all counted target tokens."""
    result = seq2seq_loss(model, data.batch(np.arange(len(data))), backward=False)
    return result.accuracy
