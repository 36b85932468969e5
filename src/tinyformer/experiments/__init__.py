r"""The book's training runs, small enough for a laptop core, and a store that runs each once.

Each experiment builds its data, model and optimizer from one seed, trains with
:class:`~tinyformer.training.loop.Trainer` and returns an
:class:`~tinyformer.experiments.result.ExperimentResult` (configuration, history,
final metrics, wall time, the trained model). Same seed, same numbers. They all
train the same way, :class:`~tinyformer.experiments.recipe.Recipe` (AdamW on a
warm-up + cosine schedule, seeded initialization and batches), and measure their
models with one function, :func:`~tinyformer.experiments.recipe.token_losses`.

- :func:`~tinyformer.experiments.reverse.reversal`: an encoder-decoder learns to
  reverse strings of 1 to 8 symbols; greedy decoding must reproduce at least 99%
  of 1,000 held-out sources exactly.
- :func:`~tinyformer.experiments.markov.markov_lm`: a decoder-only model learns
  a random second-order Markov source; its held-out cross-entropy must come within
  3% of the source's entropy rate :math:`H`, the lowest loss any model can reach.
- :func:`~tinyformer.experiments.mlm.masked_lm`,
  :func:`~tinyformer.experiments.icl.in_context`,
  :func:`~tinyformer.experiments.norm_placement.norm_placement` and
  :func:`~tinyformer.experiments.scaling.scaling`: the masked language model, in-context
  copying, post-norm against pre-norm, and loss against model size.
- :func:`~tinyformer.experiments.modern.modern_lm`,
  :func:`~tinyformer.experiments.moe_lm.moe_lm` and
  :func:`~tinyformer.experiments.finetune.finetune`: the modern transformer of Part VII,
  each change from GPT-2's decoder as an ablation, a mixture of experts against dense
  models, and fine-tuning the language model, fully or with low-rank adapters
  (:data:`~tinyformer.experiments.registry.EXPERIMENTS` lists them all).

:class:`~tinyformer.experiments.store.ExperimentStore` keeps results on disk keyed
by the package's source and the run's arguments, so a chapter, a figure script and
a test asking for the same run share one training: :func:`run` is the short way
to ask the default store (``$TINYFORMER_STORE``).

Run ``python -m tinyformer.experiments`` to print every experiment's result.
"""

from __future__ import annotations

from typing import Any

from tinyformer.experiments.markov import markov_lm, per_position_loss
from tinyformer.experiments.recipe import Recipe, token_losses
from tinyformer.experiments.registry import BOOK_RUNS, EXPERIMENTS
from tinyformer.experiments.result import ExperimentResult
from tinyformer.experiments.reverse import exact_match, reversal, reversal_data
from tinyformer.experiments.store import (
    STORE_ENV,
    ExperimentStore,
    code_digest,
    default_store,
    package_digest,
)

__all__ = [
    "BOOK_RUNS",
    "EXPERIMENTS",
    "STORE_ENV",
    "ExperimentResult",
    "ExperimentStore",
    "Recipe",
    "code_digest",
    "default_store",
    "exact_match",
    "markov_lm",
    "package_digest",
    "per_position_loss",
    "reversal",
    "reversal_data",
    "run",
    "token_losses",
]


def run(name: str, **params: Any) -> ExperimentResult:
    """The result of experiment ``name`` with ``params`` from the default store (trained once).

    ``run("reversal", seed=0)`` is ``default_store().run("reversal", seed=0)``:
    loaded if this version of the package has stored it, else trained and stored.
    """
    return default_store().run(name, **params)
