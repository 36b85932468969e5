"""The training history: rows of the training and evaluation tables, and their round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tinyformer.training import TRAIN_FIELDS, History


def test_history_columns_and_round_trip():
    history = History()
    for step in (1, 2, 3):
        history.log_train(
            step=step, loss=1.0 / step, accuracy=0.1 * step, lr=1e-3, grad_norm=2.0,
            tokens_per_second=100.0, time=0.5 * step,
        )  # fmt: skip
    history.log_eval(3, {"loss": 0.4, "accuracy": np.float64(0.75)})
    np.testing.assert_array_equal(history.column("step"), [1, 2, 3])
    assert history.column("step").dtype == np.int64
    np.testing.assert_allclose(history.column("loss"), [1.0, 0.5, 1 / 3], rtol=1e-15)
    assert history.column("accuracy", "eval").tolist() == [0.75]
    assert set(history.columns()) == set(TRAIN_FIELDS)
    assert history.last_eval == {"step": 3, "loss": 0.4, "accuracy": 0.75}
    again = History.from_dict(json.loads(json.dumps(history.to_dict())))  # through JSON
    assert again.to_dict() == history.to_dict()
    np.testing.assert_array_equal(again.column("loss"), history.column("loss"))


def test_bad_rows_and_columns_are_refused_by_name():
    history = History()
    with pytest.raises(ValueError, match="needs the fields"):
        history.log_train(step=1, loss=0.1)
    with pytest.raises(TypeError, match="must be a number"):
        history.log_eval(1, {"loss": "low"})
    history.log_eval(1, {"loss": 0.5})
    with pytest.raises(KeyError, match="no field 'bleu'"):
        history.column("bleu", "eval")
    with pytest.raises(ValueError, match="table must be"):
        history.column("loss", "test")
