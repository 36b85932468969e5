r"""The scratchpad run: a small decoder learns the parity of 16 bits, directly or step by step.

The same two-layer model is trained on rows of :func:`~tinyformer.data.scratchpad.parity_rows`,
either answering at once (``scratchpad=False``) or after writing the running
parities (``scratchpad=True``), with the loss on the tokens it must write and
nowhere else. It is scored on held-out strings that no training row contains,
*generating* its own continuation greedily from the prompt (no teacher
forcing): the final answer counts only where the format puts it
(:func:`~tinyformer.data.scratchpad.final_answers`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int, token_ids
from tinyformer.data.scratchpad import VOCAB_SIZE, bit_strings, final_answers, parity_rows
from tinyformer.experiments.recipe import Recipe, initial_model
from tinyformer.experiments.result import ExperimentResult
from tinyformer.generation import greedy
from tinyformer.losses import cross_entropy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.training import Trainer
from tinyformer.training.objectives import StepResult

__all__ = ["ProducedTokens", "answer_correct", "book_runs", "parity", "produced_loss"]

IGNORED = -1
"""The target of a position whose token the model is not trained to produce."""


class ProducedTokens:
    """Language-model windows whose targets are ``IGNORED`` (-1) outside the produced tokens.

    Parameters
    ----------
    rows : numpy.ndarray of int
        ``(N, T + 1)`` token rows.
    produced : numpy.ndarray of bool
        ``(N, T + 1)``: which tokens of each row the model must write.
    """

    def __init__(self, rows: np.ndarray, produced: np.ndarray) -> None:
        rows = token_ids(rows, "rows")
        produced = np.asarray(produced)
        if rows.ndim != 2 or rows.shape[1] < 2 or produced.shape != rows.shape:
            raise ValueError(
                "rows and produced must be 2-D of one shape (N, T + 1) with T >= 1, got"
                f" {rows.shape} and {produced.shape}"
            )
        if produced.dtype != bool:
            raise TypeError(f"produced must be a bool array, got {describe(produced)}")
        self.inputs = rows[:, :-1]  # (N, T)
        self.targets = np.where(produced[:, 1:], rows[:, 1:], IGNORED)  # (N, T)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The windows at ``indices``: ``(inputs, targets)``, each ``(len(indices), T)``."""
        return self.inputs[indices], self.targets[indices]


def produced_loss(
    model: Any, batch: tuple[np.ndarray, np.ndarray], *, backward: bool = True
) -> StepResult:
    r"""Next-token cross-entropy over the produced tokens only (targets not ``IGNORED`` (-1)).

    .. math::
        L = \frac{1}{|P|} \sum_{(i, t) \in P} -\log p_\theta(y_{i t} \mid x_{i, \le t})

    with :math:`P` the positions whose target is a token the model writes; the
    random input bits, which no model can predict, add nothing to the loss or its gradient.
    """
    inputs, targets = batch
    logits = model.forward(inputs)  # (B, T, V)
    loss, grad_logits = cross_entropy(logits, targets, ignore_index=IGNORED)
    counted = targets != IGNORED  # (B, T)
    n_correct = int(((logits.argmax(axis=-1) == targets) & counted).sum())
    if backward:
        model.backward(grad_logits)
    return StepResult(loss, int(counted.sum()), n_correct)


def answer_correct(model: Any, bits: object, *, scratchpad: bool) -> np.ndarray:
    """Whether the model, generating greedily from each prompt, ends with the right parity.

    The prompt is the bits and the separator; the model writes the whole
    continuation itself (:func:`~tinyformer.generation.search.greedy`), and
    :func:`~tinyformer.data.scratchpad.final_answers` reads its answer.

    Parameters
    ----------
    model : DecoderOnlyLM
        A model trained on :func:`~tinyformer.data.scratchpad.parity_rows`.
    bits : array_like of int
        ``(N, n)`` zeros and ones; all rows have the same :math:`n`.
    scratchpad : bool
        Whether the model writes the running parities before its answer.

    Returns
    -------
    numpy.ndarray of bool
        ``(N,)``; a continuation that breaks the format counts as wrong.
    """
    rows, produced = parity_rows(bits, scratchpad=scratchpad)
    n = rows.shape[1] - int(produced[0].sum()) - 1  # the number of bits
    written = greedy(model, rows[:, : n + 1], max_new_tokens=int(produced[0].sum()))
    continuations = np.stack(written.tokens)  # (N, n + 2) or (N, 1)
    return final_answers(continuations, n, scratchpad=scratchpad) == rows[:, -1]


def parity(
    *,
    seed: int = 0,
    n_bits: int = 16,
    scratchpad: bool = False,
    d_model: int = 64,
    n_heads: int = 2,
    d_ff: int = 128,
    n_layers: int = 2,
    context_length: int = 64,
    batch_size: int = 32,
    max_steps: int = 1500,
    peak_lr: float = 3e-3,
    warmup_steps: int = 50,
    n_validation: int = 256,
    n_heldout: int = 2000,
    eval_every: int = 100,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train a decoder-only model on parity, with or without a scratchpad; score its answers.

    Held-out strings (stream ``[seed, 3]``) are drawn first; the validation
    strings (``[seed, 2]``) exclude every one of them, and the training strings
    (``[seed, 1]``, ``max_steps * batch_size`` of them) exclude both sets. The model
    has sinusoidal positions and pre-norm blocks, and is trained by the book's
    recipe (:class:`~tinyformer.experiments.recipe.Recipe`) with clipping at 1, on
    the loss of :func:`produced_loss`.

    Parameters
    ----------
    seed : int
        Seeds the three string streams, the initialization and the batch order.
    n_bits : int
        :math:`n`, the length of every bit string.
    scratchpad : bool
        Train on rows ``b | p | a`` (True) or ``b | a`` (False).
    d_model, n_heads, d_ff, n_layers, context_length : int
        Model size (pre-norm blocks with a final LayerNorm); ``context_length``
        must hold :math:`2n + 2` tokens for the scratchpad rows.
    batch_size, max_steps, peak_lr, warmup_steps : int, int, float, int
        AdamW with warm-up and cosine decay, clipping at 1.
    n_validation, n_heldout, eval_every : int
        Strings scored every ``eval_every`` steps, and at the end.
    dtype : str
    progress : bool

    Returns
    -------
    ExperimentResult
        ``metrics``: ``answer_accuracy`` (held-out strings, greedy generation),
        ``n_heldout``, and ``steps``, ``train_seconds``, ``cpu_seconds``; the
        history's evaluation rows hold ``answer_accuracy`` on the validation strings.
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    n_bits = positive_int(n_bits, "n_bits")
    if not isinstance(scratchpad, bool):
        raise TypeError(f"scratchpad must be True or False, got {describe(scratchpad)}")
    needed = 2 * n_bits + 2 if scratchpad else n_bits + 1  # model inputs: the row but its last
    if positive_int(context_length, "context_length") < needed:
        raise ValueError(
            f"context_length must be at least {needed} for n_bits={n_bits}"
            f" (scratchpad={scratchpad}), got {context_length}"
        )
    heldout = bit_strings(n_heldout, n_bits, rng=np.random.default_rng([seed, 3]))
    validation = bit_strings(
        n_validation, n_bits, rng=np.random.default_rng([seed, 2]), exclude=heldout
    )
    train = bit_strings(
        recipe.max_steps * recipe.batch_size,
        n_bits,
        rng=np.random.default_rng([seed, 1]),
        exclude=np.concatenate([heldout, validation]),
    )
    config = DecoderOnlyConfig(
        vocab_size=VOCAB_SIZE,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        positional="sinusoidal",
        dtype=dtype,
    )
    model = initial_model(DecoderOnlyLM, config, np.random.default_rng([seed, 4]))
    trainer = Trainer(
        model,
        recipe.optimizer(model),
        produced_loss,
        ProducedTokens(*parity_rows(train, scratchpad=scratchpad)),
        batch_size=recipe.batch_size,
        rng=np.random.default_rng([seed, 5]),
        clip_norm=1.0,
        evaluate=lambda m: {
            "answer_accuracy": float(answer_correct(m, validation, scratchpad=scratchpad).mean())
        },
        eval_every=eval_every,
        log_every=10,
        progress=progress,
    )
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()
    metrics = {
        "answer_accuracy": float(answer_correct(model, heldout, scratchpad=scratchpad).mean()),
        "n_heldout": float(n_heldout),
    }
    settings = {"task": {"n_bits": n_bits, "scratchpad": scratchpad}, "n_heldout": n_heldout}
    return recipe.result("parity", trainer, metrics, settings)


PARITY_SEEDS = (0, 1, 2)
"""Seeds of each of the two parity runs (direct and scratchpad)."""


def book_runs() -> list[tuple[str, dict[str, Any]]]:
    """The parity runs of chapter "What transformers can and cannot do": 2 ways x 3 seeds."""
    return [
        ("parity", {"seed": s, "scratchpad": way}) for way in (False, True) for s in PARITY_SEEDS
    ]
