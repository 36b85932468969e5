"""What every experiment returns: :class:`ExperimentResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tinyformer.training import History

__all__ = ["ExperimentResult"]


@dataclass
class ExperimentResult:
    """What an experiment returns.

    Attributes
    ----------
    name : str
    seed : int
    config : dict
        The model configuration (``config.to_dict()``) and the training settings.
    history : History
    metrics : dict
        The final results (see each experiment).
    wall_time : float
        Seconds for the whole run: data, training, evaluation (for a result
        loaded from an :class:`~tinyformer.experiments.store.ExperimentStore`, the
        time of the run that computed it).
    model : Module
        The trained model (in evaluation mode).
    """

    name: str
    seed: int
    config: dict[str, Any]
    history: History
    metrics: dict[str, float]
    wall_time: float
    model: Any = field(repr=False)

    def summary(self) -> str:
        """The metrics, seed and wall time as a few readable lines."""
        lines = [f"{self.name} (seed {self.seed}): {self.wall_time:.1f} s"]
        lines += [
            f"  {k}: {v:.6g}" if isinstance(v, float) else f"  {k}: {v}"
            for k, v in self.metrics.items()
        ]
        return "\n".join(lines)
