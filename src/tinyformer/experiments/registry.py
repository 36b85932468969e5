"""The book's experiments by name, and the runs the book reports.

:data:`EXPERIMENTS` maps a name to the function that runs it;
:class:`~tinyformer.experiments.store.ExperimentStore` runs and stores them by
name. :data:`BOOK_RUNS` lists the runs (name and arguments) whose results the
book shows: ``python -m tinyformer.experiments --book`` computes all of them,
in parallel, before a build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tinyformer.experiments.markov import markov_lm
from tinyformer.experiments.mlm import masked_lm
from tinyformer.experiments.norm_placement import norm_placement
from tinyformer.experiments.result import ExperimentResult
from tinyformer.experiments.reverse import reversal

__all__ = ["BOOK_RUNS", "EXPERIMENTS"]

EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "reversal": reversal,
    "markov_lm": markov_lm,
    "norm_placement": norm_placement,
    "masked_lm": masked_lm,
}
"""Every experiment by name, mapped to the function that runs it from keyword arguments."""

BOOK_RUNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("reversal", {"seed": 0}),
    # the masked language model of chapter "The encoder"
    ("masked_lm", {"seed": 0}),
    ("markov_lm", {"seed": 0}),
    # the draft model of speculative decoding (chapter "Fast inference"): small and weaker
    ("markov_lm", {"seed": 0, "d_model": 16, "n_heads": 2, "d_ff": 64, "n_layers": 1}),
    # post-norm against pre-norm at depth (chapter "Residual connections and normalization")
    *(
        ("norm_placement", {"seed": s, "n_layers": n, "norm_first": f, "warmup_steps": w})
        for s in (0, 1)
        for n in (6, 12)
        for f in (False, True)
        for w in (0, 75)
    ),
)
"""The runs whose results the book shows, as ``(name, arguments)``; computed before a build."""
