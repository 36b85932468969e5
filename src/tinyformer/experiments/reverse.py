"""The reversal run: an encoder-decoder learns to reverse strings of 1 to 8 symbols.

Greedy decoding must reproduce at least 99% of 1,000 held-out sources exactly.
Early stopping watches a second set of 1,000 unseen sources, drawn and spread
over the lengths like the held-out set, so that the number it stops on
estimates the held-out result instead of the easiest, most repeated pairs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer._validation import one_of, positive_int, unit_interval
from tinyformer.data import BOS_ID, EOS_ID, PAD_ID, PairDataset, SequenceTask
from tinyformer.data.tasks import TaskSplit, _quotas
from tinyformer.data.tokenizers import N_SPECIAL
from tinyformer.experiments.recipe import Recipe, initial_model
from tinyformer.experiments.result import ExperimentResult
from tinyformer.generation import greedy
from tinyformer.models import EncoderDecoder, EncoderDecoderConfig
from tinyformer.optim import SGD
from tinyformer.training import EarlyStopping, Trainer, seq2seq_loss

__all__ = ["exact_match", "reversal", "reversal_data"]

OPTIMIZERS = ("adamw", "sgd")


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


def _validation_sources(
    task: SequenceTask, split: TaskSplit, n: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``n`` distinct sources, none held out, spread over the lengths as the held-out set is.

    Each length gives at most a fifth of its sources to the held-out and the
    validation sets together (the held-out set takes at most a tenth); what a
    short length cannot give goes to the longer ones (the same water filling
    as :meth:`SequenceTask.split`).
    """
    capacity = {m: task.n_sources(m) // 5 - split.per_length[m] for m in task.lengths}
    if sum(capacity.values()) < n:
        raise ValueError(f"n_validation must be at most {sum(capacity.values())}, got {n}")
    chosen: list[tuple[int, ...]] = []
    for length, count in _quotas(capacity, n).items():
        picked: set[tuple[int, ...]] = set()
        while len(picked) < count:
            rows = rng.integers(N_SPECIAL, task.vocab_size, size=(count, length))  # (count, L)
            for row in map(tuple, rows.tolist()):
                if len(picked) < count and not split.is_heldout(np.array(row)):
                    picked.add(row)
        chosen += sorted(picked)
    return [np.array(s, dtype=np.int64) for s in chosen]


def reversal_data(
    *, seed: int = 0, n_train: int = 40_000, n_validation: int = 1000, n_heldout: int = 1000
) -> tuple[SequenceTask, TaskSplit, PairDataset, PairDataset]:
    """The reversal task, its held-out split, training pairs and validation pairs.

    The held-out sources (``split.heldout``) are set aside first. The
    validation sources are then drawn the same way: distinct, spread over the
    lengths like the held-out ones, none held out. Training pairs are drawn
    last, from the sources that are neither held out nor validation: both sets
    measure the reversal of strings the model never saw.
    """
    rng = np.random.default_rng([seed, 0])
    task = SequenceTask("reverse", n_symbols=10, min_len=1, max_len=8)
    split = task.split(positive_int(n_heldout, "n_heldout"), rng=rng)
    sources = _validation_sources(task, split, positive_int(n_validation, "n_validation"), rng)
    unseen = {tuple(s.tolist()) for s in sources}
    n_train = positive_int(n_train, "n_train")
    kept: list[np.ndarray] = []
    while len(kept) < n_train:
        drawn = split.train_sources(n_train - len(kept), rng)
        kept += [s for s in drawn if tuple(s.tolist()) not in unseen]
    return task, split, task.dataset(kept), task.dataset(sources)


def reversal(
    *,
    seed: int = 0,
    d_model: int = 64,
    n_heads: int = 4,
    d_ff: int = 256,
    n_layers: int = 2,
    positional: str = "sinusoidal",
    attention_scale: str = "sqrt",
    batch_size: int = 64,
    max_steps: int = 1500,
    train_steps: int | None = None,
    optimizer: str = "adamw",
    peak_lr: float = 3e-3,
    warmup_steps: int = 100,
    clip_norm: float | None = 1.0,
    label_smoothing: float = 0.0,
    dropout: float = 0.0,
    n_train: int = 40_000,
    n_validation: int = 1000,
    eval_every: int = 100,
    target: float | None = 0.998,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    """Train an encoder-decoder to reverse strings; report greedy exact match on held-out sources.

    The task is :class:`~tinyformer.data.tasks.SequenceTask` ``"reverse"`` over 10
    symbols, lengths 1 to 8 (vocabulary 14 with the special tokens). 1,000
    held-out sources are set aside before anything else, then 1,000 validation
    sources drawn the same way (see :func:`reversal_data`); no training pair
    has either kind of source. Training (AdamW, linear warm-up then cosine
    decay, gradient clipping at 1) stops early at the first evaluation where
    greedy decoding reproduces at least ``target`` of the validation sources;
    the held-out set is decoded once, at the end.

    Parameters
    ----------
    seed : int
        Seeds every generator of the run (data, split, initialization, shuffling).
    d_model, n_heads, d_ff, n_layers : int
        Model size; ``n_layers`` blocks in the encoder and in the decoder (post-norm).
    positional, attention_scale : str
        The model's position information (``"sinusoidal"``, ``"learned"`` or
        ``"none"``) and score scale (``"sqrt"`` or ``"none"``): the ablations.
    batch_size, max_steps : int
        Pairs per step, and the step budget (the cosine decay ends there).
    train_steps : int, optional
        Stop after this many steps of the ``max_steps`` schedule, whatever the
        validation says (a fixed budget for comparisons); default: ``max_steps``.
    optimizer : str
        ``"adamw"`` (betas 0.9 and 0.98, weight decay 0.01) or ``"sgd"`` (plain
        gradient descent at a constant ``peak_lr``: no momentum, warm-up or decay).
    peak_lr, warmup_steps, clip_norm, label_smoothing, dropout : float, int, float, float, float
        Optimization settings; ``clip_norm=None`` does not clip.
    n_train, n_validation : int
        Training pairs, and distinct validation sources for early stopping.
    eval_every : int
        Steps between validation decodes.
    target : float, optional
        Stop once greedy decoding gets at least this share of the validation
        sources exactly right; ``None``: never stop early.
    dtype : str
        ``"float32"`` (the default: the book trains in single precision, as practice
        does, at about half the time of float64) or ``"float64"``.
    progress : bool
        Show a progress bar.

    Returns
    -------
    ExperimentResult
        ``metrics``: ``heldout_exact_match`` (the result), ``validation_exact_match``,
        ``heldout_token_accuracy`` (teacher-forced), ``heldout_loss``,
        ``heldout_in_training`` (must be 0), ``heldout_size``; and
        ``steps``, ``train_seconds`` and ``cpu_seconds``, as every run
        (:meth:`~tinyformer.experiments.recipe.Recipe.result`).
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
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
        context_length=task.max_len + 1,
        dropout=dropout,
        positional=positional,
        attention_scale=attention_scale,
        dtype=dtype,
    )
    model = initial_model(EncoderDecoder, config, np.random.default_rng([seed, 1]))
    train_steps = (
        recipe.max_steps if train_steps is None else positive_int(train_steps, "train_steps")
    )
    if one_of(optimizer, OPTIMIZERS, "optimizer") == "sgd":
        opt = SGD(model.parameters(), peak_lr)  # constant rate: no momentum, warm-up or decay
    else:
        opt = recipe.optimizer(model)
    smoothing = unit_interval(label_smoothing, "label_smoothing")

    def objective(model: Any, batch: Any, *, backward: bool = True) -> Any:
        return seq2seq_loss(model, batch, label_smoothing=smoothing, backward=backward)

    trainer = Trainer(
        model,
        opt,
        objective,
        train,
        batch_size=recipe.batch_size,
        rng=np.random.default_rng([seed, 2]),
        clip_norm=clip_norm,
        evaluate=lambda m: {"exact_match": exact_match(m, validation)},
        eval_every=eval_every,
        early_stopping=None if target is None else EarlyStopping("exact_match", target=target),
        log_every=10,
        progress=progress,
    )
    trainer.fit(min(train_steps, recipe.max_steps))
    model.eval()
    heldout_in_training = sum(split.is_heldout(s) for s in train.sources)
    heldout = seq2seq_loss(model, split.heldout.batch(np.arange(len(split.heldout))),
                           backward=False)  # fmt: skip
    metrics = {
        "heldout_exact_match": exact_match(model, split.heldout),
        "heldout_token_accuracy": heldout.accuracy,
        "heldout_loss": heldout.loss,
        "validation_exact_match": float(trainer.history.eval[-1]["exact_match"]),
        "heldout_size": len(split.heldout),
        "heldout_in_training": int(heldout_in_training),
    }
    settings = {
        "train_steps": train_steps,
        "optimizer": optimizer,
        "clip_norm": clip_norm,
        "label_smoothing": smoothing,
        "n_train": n_train,
        "n_validation": n_validation,
        "target": target,
    }
    return recipe.result("reversal", trainer, metrics, settings)
