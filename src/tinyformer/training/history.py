"""The record of a training run: one row per logged step, one per evaluation.

A :class:`~tinyformer.training.history.History` is a pair of tables kept as lists of plain dicts (so it
turns into JSON for a checkpoint as it is) with :meth:`History.column` to get
any field as a NumPy array, ready to plot::

    plt.plot(history.column("step"), history.column("loss"))
    plt.plot(history.column("step", "eval"), history.column("accuracy", "eval"))
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from tinyformer._validation import describe

__all__ = ["TRAIN_FIELDS", "History"]

#: the fields of every training row, in order
TRAIN_FIELDS = ("step", "loss", "accuracy", "lr", "grad_norm", "tokens_per_second", "time")

_TABLES = ("train", "eval")


def _number(value: object, name: str) -> float | int:
    """``value`` as a plain Python int or float (NumPy scalars included), else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {describe(value)}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


class History:
    """Training rows and evaluation rows of one run.

    Attributes
    ----------
    train : list of dict
        One row per logged step with the fields :data:`TRAIN_FIELDS`: the step
        number (counted from 1), the mean loss and the accuracy over the tokens
        of the steps since the previous row, the learning rate and the global
        gradient norm (before clipping) of the logged step, the training
        throughput in counted tokens per second and the seconds of training
        since the start (evaluation time excluded).
    eval : list of dict
        One row per evaluation: ``step`` and whatever metrics the evaluation
        returned (e.g. ``loss``, ``accuracy``).
    """

    def __init__(self) -> None:
        self.train: list[dict[str, float | int]] = []
        self.eval: list[dict[str, float | int]] = []

    def log_train(self, **fields: float) -> None:
        """Append a training row; it must have exactly the fields :data:`TRAIN_FIELDS`."""
        if set(fields) != set(TRAIN_FIELDS):
            raise ValueError(
                f"a training row needs the fields {list(TRAIN_FIELDS)}, got {sorted(fields)}"
            )
        self.train.append({k: _number(fields[k], k) for k in TRAIN_FIELDS})

    def log_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append an evaluation row: ``step`` and the ``metrics`` (a mapping of numbers)."""
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"metrics must be a mapping of names to numbers, got {describe(metrics)}"
            )
        if "step" in metrics:
            raise ValueError("metrics must not have a field named 'step': the history adds it")
        row = {"step": _number(step, "step")}
        row.update({str(k): _number(v, f"metrics[{k!r}]") for k, v in metrics.items()})
        self.eval.append(row)

    def column(self, name: str, table: str = "train") -> np.ndarray:
        """One field of every row of ``table`` (``"train"`` or ``"eval"``) as an array.

        Rows without the field (an evaluation that did not report it) give NaN.
        """
        rows = self._table(table)
        if not any(name in row for row in rows) and rows:
            fields = sorted({k for row in rows for k in row})
            raise KeyError(f"no field {name!r} in the {table} rows; fields: {fields}")
        values = [row.get(name, math.nan) for row in rows]
        if name == "step":
            return np.array(values, dtype=np.int64)
        return np.array(values, dtype=np.float64)

    def columns(self, table: str = "train") -> dict[str, np.ndarray]:
        """Every field of ``table`` as a dict of arrays."""
        names = dict.fromkeys(k for row in self._table(table) for k in row)
        return {name: self.column(name, table) for name in names}

    @property
    def last_eval(self) -> dict[str, float | int] | None:
        """The most recent evaluation row, or None before the first evaluation."""
        return dict(self.eval[-1]) if self.eval else None

    def _table(self, table: str) -> list[dict[str, float | int]]:
        if table not in _TABLES:
            raise ValueError(f"table must be 'train' or 'eval', got {table!r}")
        return self.train if table == "train" else self.eval

    # ------------------------------------------------------------------- state
    def to_dict(self) -> dict[str, Any]:
        """The history as plain lists of dicts (JSON-able)."""
        return {"train": [dict(r) for r in self.train], "eval": [dict(r) for r in self.eval]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> History:
        """Rebuild a history from :meth:`to_dict`; raises on a malformed mapping."""
        if not isinstance(data, Mapping) or set(data) != set(_TABLES):
            raise ValueError(
                f"a history must be a mapping with keys 'train' and 'eval', got {data!r}"[:200]
            )
        history = cls()
        for row in data["train"]:
            history.log_train(**row)
        for row in data["eval"]:
            if not isinstance(row, Mapping) or "step" not in row:
                raise ValueError(f"an evaluation row must be a mapping with a 'step', got {row!r}")
            history.log_eval(row["step"], {k: v for k, v in row.items() if k != "step"})
        return history

    def __len__(self) -> int:
        return len(self.train)

    def __repr__(self) -> str:
        return f"History({len(self.train)} training rows, {len(self.eval)} evaluation rows)"
