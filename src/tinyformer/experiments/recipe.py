r"""The book's training recipe, its per-token loss, and the record every run returns.

Every language-model experiment of the book (the Markov, masked, in-context,
norm-placement and scaling runs) trains the same way, and :class:`Recipe` is that
way, written once:

- the model is drawn from the generator stream ``[seed, 4]`` and the batches are
  shuffled by ``[seed, 5]``;
- AdamW with betas (0.9, 0.98) and weight decay 0.01 follows a linear warm-up over
  ``warmup_steps`` to ``peak_lr``, then a cosine decay to ``peak_lr / 20`` at
  ``max_steps`` (:meth:`Recipe.optimizer`);
- the objective is the model family's own: next-token cross-entropy
  (:func:`~tinyformer.training.objectives.lm_loss`) for a decoder-only language
  model, the masked-token loss (:func:`~tinyformer.training.mlm.mlm_loss`) for an
  encoder-only one (:meth:`Recipe.trainer`);
- the run ends with one :class:`~tinyformer.experiments.result.ExperimentResult`
  holding the configuration, the history, the metrics (with the steps made and the
  time they took) and the trained model (:meth:`Recipe.result`).

The reversal run (:mod:`tinyformer.experiments.reverse`) draws its encoder-decoder
and its batches from streams of its own and may train with plain SGD, but takes its
AdamW and its record from the same :class:`Recipe`. Each run measures its model with
one function, :func:`token_losses`: the cross-entropy of every prediction, computed
in float64 from the logits.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int, token_ids
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM, EncoderOnlyConfig, EncoderOnlyMLM
from tinyformer.module import Module
from tinyformer.optim import AdamW
from tinyformer.schedules import WarmupCosineSchedule
from tinyformer.training import Trainer, lm_loss
from tinyformer.training.mlm import mlm_loss

__all__ = ["FAMILIES", "PERTURB_ENV", "Recipe", "initial_model", "perturbed", "token_losses"]

PERTURB_ENV = "TINYFORMER_PERTURB"
"""The environment variable that, set to ``1``, moves every run's initial weights by one ulp.

A conclusion that a last-bit change in the initial weights can flip rests on a knife edge;
``nox -s docs-perturbed`` builds the book this way to show that none does. The store keeps
perturbed results apart from the others.
"""


def perturbed() -> bool:
    """Whether runs start from perturbed weights (``TINYFORMER_PERTURB=1``)."""
    value = os.environ.get(PERTURB_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{PERTURB_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def initial_model(model_class: type[Module], config: Any, rng: np.random.Generator) -> Module:
    """A fresh model of ``config`` drawn from ``rng``, its weights moved one ulp up if :func:`perturbed`.

    One ulp (``numpy.nextafter`` towards +inf) of every parameter: the smallest change
    the weights' dtype can express.
    """
    model = model_class(config, rng=rng)
    if perturbed():
        for parameter in model.parameters():
            np.nextafter(parameter.value, np.inf, out=parameter.value)
    return model


FAMILIES: dict[type, tuple[type[Module], Any]] = {
    DecoderOnlyConfig: (DecoderOnlyLM, lm_loss),
    EncoderOnlyConfig: (EncoderOnlyMLM, mlm_loss),
}
"""The model class and the training objective of each configuration the recipe trains."""


@dataclass
class Recipe:
    """How the book trains one model from one seed; made when the run starts, it also times it.

    Parameters
    ----------
    seed : int
        Seeds the initialization (stream ``[seed, 4]``) and the batch order (``[seed, 5]``).
    peak_lr : float
        The learning rate at the end of the warm-up.
    warmup_steps : int
        Steps of linear warm-up (0: none, the cosine starts at once).
    max_steps : int
        Where the cosine decay ends: the run's step budget.
    batch_size : int
        Training examples per step.
    """

    seed: int
    peak_lr: float
    warmup_steps: int
    max_steps: int
    batch_size: int
    _started: tuple[float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.max_steps = positive_int(self.max_steps, "max_steps")
        self.batch_size = positive_int(self.batch_size, "batch_size")
        self._started = (time.perf_counter(), time.process_time())

    def optimizer(self, model: Module) -> AdamW:
        """AdamW over ``model``'s trainable parameters on the warm-up + cosine schedule.

        Frozen parameters (:meth:`~tinyformer.module.Module.freeze`, LoRA) are left out;
        for a model with none, the list is :meth:`~tinyformer.module.Module.parameters`.
        """
        schedule = WarmupCosineSchedule(
            self.peak_lr, self.warmup_steps, self.max_steps, min_lr=self.peak_lr / 20
        )
        return AdamW(model.trainable_parameters(), schedule, betas=(0.9, 0.98), weight_decay=0.01)

    def trainer(
        self, config: Any, data: Any, *, model: Module | None = None, **options: Any
    ) -> Trainer:
        """A fresh model of ``config``, its optimizer and objective, in a Trainer ready to ``fit``.

        ``config`` is a :class:`~tinyformer.models.config.DecoderOnlyConfig` or an
        :class:`~tinyformer.models.config.EncoderOnlyConfig` (see :data:`~tinyformer.experiments.recipe.FAMILIES`);
        ``data`` is what its objective reads (windows, or an
        :class:`~tinyformer.data.masking.MLMDataset`). ``options`` go to the
        :class:`~tinyformer.training.loop.Trainer`: clipping, evaluation, early
        stopping, logging, progress. ``model`` (of ``config``'s family) starts
        from given weights instead of a fresh initialization: fine-tuning, with
        only its trainable parameters optimized.
        """
        if type(config) not in FAMILIES:
            raise TypeError(
                f"config must be one of {[c.__name__ for c in FAMILIES]}, got {describe(config)}"
            )
        model_class, objective = FAMILIES[type(config)]
        if model is None:
            model = initial_model(model_class, config, np.random.default_rng([self.seed, 4]))
        elif not isinstance(model, model_class):
            raise TypeError(
                f"model must be a {model_class.__name__} for {type(config).__name__},"
                f" got {describe(model)}"
            )
        return Trainer(
            model,
            self.optimizer(model),
            objective,
            data,
            batch_size=self.batch_size,
            rng=np.random.default_rng([self.seed, 5]),
            **options,
        )

    def result(
        self, name: str, trainer: Trainer, metrics: dict[str, float], settings: dict[str, Any]
    ) -> ExperimentResult:
        """The run's record: ``metrics`` and ``settings`` completed with what every run reports.

        The metrics gain ``steps`` (updates made), ``train_seconds`` (wall time of
        the updates alone; NaN if training stopped before its first history row) and
        ``cpu_seconds`` (processor time of the whole run, which a busy machine does
        not inflate as it does wall time). The settings gain the model's
        configuration (as ``"model"``) and this recipe's four numbers, first.
        """
        wall, cpu = self._started
        rows = trainer.history.train
        metrics = {
            **metrics,
            "steps": float(trainer.step),
            "train_seconds": float(rows[-1]["time"]) if rows else float("nan"),
            "cpu_seconds": time.process_time() - cpu,  # every thread of the process
        }
        settings = {
            "model": trainer.model.config.to_dict(),
            "batch_size": self.batch_size,
            "max_steps": self.max_steps,
            "peak_lr": self.peak_lr,
            "warmup_steps": self.warmup_steps,
            **settings,
        }
        return ExperimentResult(
            name,
            self.seed,
            settings,
            trainer.history,
            metrics,
            time.perf_counter() - wall,
            trainer.model,
        )


def token_losses(
    model: Any, inputs: object, targets: object, *, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    r"""Cross-entropy (nats) and greedy correctness of the model's prediction of every target.

    .. math::
        \ell_{i t} = \log \sum_v e^{z_{i t v}} - z_{i t y_{i t}},
        \qquad z = \text{model}(\text{inputs}) \text{ in float64}

    Entry ``[i, t]`` scores the logits the model computes at position ``t`` of row
    ``i`` of ``inputs`` against ``targets[i, t]``: the next token for a language
    model (``inputs = tokens[:, :-1]``, ``targets = tokens[:, 1:]``), the clean
    token for a masked one (``inputs`` the corrupted rows, ``targets`` the clean
    ones). Rows go through the model ``batch_size`` at a time.

    Parameters
    ----------
    model : Module
        Anything with ``forward(ids) -> logits (B, T, V)``, ``vocab_size`` and
        ``context_length``.
    inputs, targets : array_like of int
        ``(N, T)`` each, ``N >= 1``, ``1 <= T <= model.context_length``, ids below
        ``model.vocab_size``.
    batch_size : int

    Returns
    -------
    losses : numpy.ndarray
        ``(N, T)`` float64.
    correct : numpy.ndarray
        ``(N, T)`` bool: whether the largest logit is the target's.
    """
    inputs = token_ids(inputs, "inputs", model.vocab_size)
    targets = token_ids(targets, "targets", model.vocab_size)
    if inputs.ndim != 2 or targets.shape != inputs.shape:
        raise ValueError(
            "inputs and targets must be 2-D arrays of one shape (N, T), got shapes"
            f" {inputs.shape} and {targets.shape}"
        )
    if inputs.shape[0] < 1 or not 1 <= inputs.shape[1] <= model.context_length:
        raise ValueError(
            f"inputs must have shape (N, T) with N >= 1 and 1 <= T <= context_length"
            f" = {model.context_length}, got shape {inputs.shape}"
        )
    batch_size = positive_int(batch_size, "batch_size")
    losses, correct = [], []
    for start in range(0, len(inputs), batch_size):
        rows = slice(start, start + batch_size)
        logits = model.forward(inputs[rows]).astype(np.float64)  # (B, T, V)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_z = np.log(np.exp(shifted).sum(axis=-1))  # (B, T)
        picked = np.take_along_axis(shifted, targets[rows][..., None], axis=-1)[..., 0]  # (B, T)
        losses.append(log_z - picked)
        correct.append(logits.argmax(axis=-1) == targets[rows])
    return np.concatenate(losses), np.concatenate(correct)
