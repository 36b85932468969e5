"""Training: objectives, shuffled batches, the loop, its history and early stopping.

- :mod:`tinyformer.training.objectives`: :func:`~tinyformer.training.objectives.seq2seq_loss` and :func:`~tinyformer.training.objectives.lm_loss`
  (and :func:`~tinyformer.training.mlm.mlm_loss` in :mod:`tinyformer.training.mlm`),
  the per-batch loss, gradient and accuracy of each model family
- :mod:`tinyformer.training.batches`: :class:`~tinyformer.training.batches.WindowDataset` and the shuffled
  :class:`~tinyformer.training.batches.BatchStream` whose position a checkpoint saves
- :mod:`tinyformer.training.history`: :class:`~tinyformer.training.history.History`, the rows to plot
- :mod:`tinyformer.training.evaluation`: :class:`~tinyformer.training.evaluation.LossEvaluator` (held-out loss and
  accuracy) and :class:`~tinyformer.training.evaluation.EarlyStopping`
- :mod:`tinyformer.training.loop`: :class:`~tinyformer.training.loop.Trainer` and :class:`~tinyformer.training.loop.DivergenceError`

Checkpoints are in :mod:`tinyformer.checkpoint`.
"""

from __future__ import annotations

from tinyformer.training.batches import BatchStream, WindowDataset
from tinyformer.training.evaluation import EarlyStopping, LossEvaluator, metric_direction
from tinyformer.training.history import TRAIN_FIELDS, History
from tinyformer.training.loop import DivergenceError, Trainer
from tinyformer.training.mlm import mlm_loss
from tinyformer.training.objectives import Objective, StepResult, lm_loss, seq2seq_loss

__all__ = [
    "TRAIN_FIELDS",
    "BatchStream",
    "DivergenceError",
    "EarlyStopping",
    "History",
    "LossEvaluator",
    "Objective",
    "StepResult",
    "Trainer",
    "WindowDataset",
    "lm_loss",
    "metric_direction",
    "mlm_loss",
    "seq2seq_loss",
]
