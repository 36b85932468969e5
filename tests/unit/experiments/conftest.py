"""Tiny versions of the book's runs, shared by the experiment tests (a fraction of a second each).

``tiny`` holds each experiment's tiny arguments; ``tiny_run(name, seed=..., **changes)``
trains a tiny run once per test process and hands the same result to every test
that asks for it again (tests must not change the weights of a shared model).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tinyformer.experiments.registry import EXPERIMENTS
from tinyformer.experiments.result import ExperimentResult

_FUNCTIONS = dict(EXPERIMENTS)  # the real experiments, whatever a test puts in the registry

TINY: dict[str, dict[str, Any]] = {
    "reversal": {
        "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1, "batch_size": 16,
        "max_steps": 12, "warmup_steps": 3, "n_train": 300, "n_validation": 40, "eval_every": 5,
    },
    "markov_lm": {
        "vocab_size": 6, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
        "context_length": 12, "batch_size": 8, "max_steps": 12, "warmup_steps": 3,
        "n_train_windows": 64, "n_validation_windows": 16, "n_heldout_windows": 32,
        "eval_every": 5, "dtype": "float64",
    },
    "in_context": {
        "vocab_size": 8, "seq_len": 8, "min_period": 2, "d_model": 8, "n_heads": 2, "d_ff": 16,
        "n_layers": 2, "context_length": 16, "batch_size": 4, "max_steps": 6, "warmup_steps": 2,
        "n_validation": 8, "n_heldout": 16, "eval_every": 3, "dtype": "float64",
    },
    "masked_lm": {
        "vocab_size": 6, "context_length": 10, "d_model": 16, "n_heads": 2, "d_ff": 32,
        "n_layers": 1, "batch_size": 16, "max_steps": 12, "warmup_steps": 3,
        "n_train_windows": 64, "n_validation_windows": 16, "n_heldout_windows": 32,
        "eval_every": 5, "dtype": "float64",
    },
    "norm_placement": {
        "vocab_size": 6, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 3,
        "context_length": 8, "batch_size": 4, "max_steps": 12, "warmup_steps": 3,
        "n_train_windows": 32, "n_heldout_windows": 16, "log_every": 4, "dtype": "float64",
    },
    "scaling": {
        "d_model": 8, "vocab_size": 6, "branching": 3, "context_length": 8, "batch_size": 4,
        "max_steps": 10, "warmup_steps": 2, "n_heldout_windows": 32, "log_every": 5,
        "dtype": "float64",
    },
}  # fmt: skip


class TinyRuns:
    """Each tiny run trained once, by experiment name and arguments."""

    def __init__(self) -> None:
        self._results: dict[tuple[str, str], ExperimentResult] = {}

    def __call__(self, name: str, **changes: Any) -> ExperimentResult:
        arguments = {**TINY[name], **changes}
        key = (name, repr(sorted(arguments.items())))
        if key not in self._results:
            self._results[key] = _FUNCTIONS[name](**arguments)
        return self._results[key]


@pytest.fixture
def tiny() -> dict[str, dict[str, Any]]:
    """The tiny arguments of every experiment (a fresh copy for each test)."""
    return copy.deepcopy(TINY)


@pytest.fixture(scope="session")
def tiny_run() -> TinyRuns:
    """Tiny runs, each trained once per test process."""
    return TinyRuns()
