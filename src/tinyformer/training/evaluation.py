"""Evaluation during training: held-out loss and accuracy, and when to stop early."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int
from tinyformer.module import Module
from tinyformer.training.batches import Dataset
from tinyformer.training.objectives import Objective

__all__ = ["EarlyStopping", "LossEvaluator", "metric_direction"]

# Words in a metric's name that say which way is better (see metric_direction).
_LOWER_IS_BETTER = ("loss", "perplexity", "error", "excess", "nll", "entropy", "distance")
_HIGHER_IS_BETTER = ("accuracy", "exact_match", "f1", "bleu", "precision", "recall", "auc")


def metric_direction(metric: str) -> str:
    """``"min"`` if a smaller value of ``metric`` is better, ``"max"`` if a larger one is.

    Read from the metric's name: ``loss``, ``perplexity``, ``error``, ``excess``,
    ``nll``, ``entropy`` or ``distance`` in it mean smaller is better;
    ``accuracy``, ``exact_match``, ``f1``, ``bleu``, ``precision``, ``recall``
    or ``auc`` mean larger is.

    Raises
    ------
    ValueError
        If the name says neither, or says both.
    """
    name = metric.lower()
    lower = [word for word in _LOWER_IS_BETTER if word in name]
    higher = [word for word in _HIGHER_IS_BETTER if word in name]
    if bool(lower) == bool(higher):
        said = "both" if lower else "neither"
        raise ValueError(
            f"cannot tell from the name {metric!r} whether larger or smaller is better (it says"
            f" {said}): pass mode='max' or mode='min'"
        )
    return "min" if lower else "max"


class EarlyStopping:
    """When to stop at an evaluation: a target reached, or no improvement for a while.

    Parameters
    ----------
    metric : str
        The evaluation metric to watch, e.g. ``"accuracy"`` or ``"loss"``.
    target : float, optional
        Stop at the first evaluation where the metric reaches it (``>=`` in
        mode ``"max"``, ``<=`` in mode ``"min"``).
    mode : str, optional
        ``"max"`` if larger is better, ``"min"`` if smaller is. By default read
        from the metric's name by :func:`metric_direction` (``"loss"`` is
        minimized, ``"accuracy"`` maximized); a name that says neither must be
        given a mode.
    patience : int, optional
        Stop after this many evaluations in a row without an improvement of
        more than ``min_delta`` over the best so far.
    min_delta : float
    """

    def __init__(
        self,
        metric: str,
        *,
        target: float | None = None,
        mode: str | None = None,
        patience: int | None = None,
        min_delta: float = 0.0,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise TypeError(f"metric must be a metric name, got {describe(metric)}")
        if mode is None:
            mode = metric_direction(metric)
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if target is None and patience is None:
            raise ValueError("give a target, a patience or both; got neither")
        self.metric, self.mode = metric, mode
        self.target = None if target is None else float(target)
        if self.target is not None and not math.isfinite(self.target):
            raise ValueError(f"target must be a finite number, got {target}")
        self.patience = None if patience is None else positive_int(patience, "patience")
        if isinstance(min_delta, bool) or not isinstance(min_delta, int | float) or min_delta < 0:
            raise ValueError(f"min_delta must be a number >= 0, got {min_delta!r}")
        self.min_delta = float(min_delta)
        self.best: float | None = None
        self.bad_evals = 0

    def _better(self, value: float, than: float) -> bool:
        return value > than if self.mode == "max" else value < than

    def update(self, metrics: Mapping[str, float]) -> str | None:
        """Take one evaluation's metrics; return ``"target"`` or ``"patience"`` to stop, else None."""
        if self.metric not in metrics:
            raise KeyError(
                f"early stopping watches {self.metric!r}, but the evaluation returned"
                f" {sorted(metrics)}"
            )
        value = float(metrics[self.metric])
        shift = self.min_delta if self.mode == "max" else -self.min_delta
        if self.best is None or self._better(value, self.best + shift):
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
        if self.target is not None and (value == self.target or self._better(value, self.target)):
            return "target"
        if self.patience is not None and self.bad_evals >= self.patience:
            return "patience"
        return None

    def state(self) -> dict[str, Any]:
        """The best value so far and the evaluations without improvement."""
        return {"best": self.best, "bad_evals": self.bad_evals}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.best = None if state["best"] is None else float(state["best"])
        self.bad_evals = int(state["bad_evals"])

    def __repr__(self) -> str:
        return (
            f"EarlyStopping({self.metric!r}, target={self.target}, mode={self.mode!r},"
            f" patience={self.patience})"
        )


class LossEvaluator:
    """Held-out loss and accuracy: an objective averaged over a whole dataset.

    Called with a model, it runs ``objective(model, batch, backward=False)``
    on the data in order, in batches of ``batch_size``, and returns
    ``{"loss": ..., "accuracy": ..., "tokens": ...}`` with the loss and the
    accuracy averaged over all counted tokens (not over batches).

    Parameters
    ----------
    objective : Objective
    data : Dataset
    batch_size : int
    """

    def __init__(self, objective: Objective, data: Dataset, *, batch_size: int = 256) -> None:
        if not callable(objective):
            raise TypeError(f"objective must be callable, got {describe(objective)}")
        if not hasattr(data, "batch") or not hasattr(data, "__len__") or len(data) == 0:
            raise TypeError(
                f"data must be a non-empty dataset with batch(indices), got {describe(data)}"
            )
        self.objective, self.data = objective, data
        self.batch_size = positive_int(batch_size, "batch_size")

    def __call__(self, model: Module) -> dict[str, float]:
        """The token-weighted mean loss and accuracy of ``model`` on the data."""
        total_loss, tokens, correct = 0.0, 0, 0
        for start in range(0, len(self.data), self.batch_size):
            indices = np.arange(start, min(start + self.batch_size, len(self.data)))
            result = self.objective(model, self.data.batch(indices), backward=False)
            total_loss += result.loss * result.n_tokens
            tokens += result.n_tokens
            correct += result.n_correct
        return {
            "loss": total_loss / tokens if tokens else math.nan,
            "accuracy": correct / tokens if tokens else math.nan,
            "tokens": tokens,
        }
