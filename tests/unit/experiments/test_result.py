"""What every experiment returns: its summary."""

from __future__ import annotations

from tinyformer.experiments import ExperimentResult
from tinyformer.training import History


def test_summary_shows_each_metric_the_seed_and_the_time():
    result = ExperimentResult(
        "probe", 4, {}, History(), {"loss": 0.123456789, "steps": 12.0, "size": 1000}, 2.25, None
    )
    assert result.summary().splitlines() == [
        "probe (seed 4): 2.2 s",
        "  loss: 0.123457",
        "  steps: 12",
        "  size: 1000",
    ]
    assert "model" not in repr(result)  # the model is left out of the repr
