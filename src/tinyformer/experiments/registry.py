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

from tinyformer.experiments.finetune import book_runs as finetune_runs
from tinyformer.experiments.finetune import finetune
from tinyformer.experiments.icl import in_context
from tinyformer.experiments.markov import markov_lm
from tinyformer.experiments.mlm import masked_lm
from tinyformer.experiments.modern import book_runs as modern_runs
from tinyformer.experiments.modern import modern_lm
from tinyformer.experiments.moe_lm import book_runs as moe_runs
from tinyformer.experiments.moe_lm import moe_lm
from tinyformer.experiments.norm_placement import norm_placement
from tinyformer.experiments.real_text import book_runs as real_text_runs
from tinyformer.experiments.real_text import real_text
from tinyformer.experiments.result import ExperimentResult
from tinyformer.experiments.reverse import reversal
from tinyformer.experiments.scaling import book_runs as scaling_runs
from tinyformer.experiments.scaling import scaling
from tinyformer.experiments.scratchpad import book_runs as parity_runs
from tinyformer.experiments.scratchpad import parity

__all__ = [
    "BOOK_RUNS",
    "EXPERIMENTS",
    "REVERSAL_ABLATIONS",
    "REVERSAL_SEEDS",
    "REVERSAL_SGD_CLAIM",
    "TYPICAL_SECONDS",
]

EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "reversal": reversal,
    "markov_lm": markov_lm,
    "norm_placement": norm_placement,
    "masked_lm": masked_lm,
    "in_context": in_context,
    "scaling": scaling,
    "modern_lm": modern_lm,
    "moe_lm": moe_lm,
    "finetune": finetune,
    "real_text": real_text,
    "parity": parity,
}
"""Every experiment by name, mapped to the function that runs it from keyword arguments."""

REVERSAL_SEEDS = (0, 1, 2, 3, 4)
"""Seeds of the reversal run; each must reach the requirement on its own held-out set."""

REVERSAL_ABLATIONS: tuple[dict[str, Any], ...] = tuple(
    {"seed": s, "train_steps": 500, "target": None, **change}
    for change in ({"positional": "none"}, {"attention_scale": "none"})
    for s in (0, 1, 2)
)
"""The ablations of chapter "Training" (no positions; no 1/sqrt(d_k)), three seeds, 500 steps."""

REVERSAL_SGD_CLAIM: dict[str, Any] = {
    "seed": 0, "optimizer": "sgd", "peak_lr": 1e-3, "batch_size": 1, "clip_norm": None,
    "max_steps": 4000, "target": None, "eval_every": 1000,
}  # fmt: skip
"""Plain SGD at lr 1e-3 with one pair per step (a claim the chapter "Training" measures)."""

BOOK_RUNS: tuple[tuple[str, dict[str, Any]], ...] = (
    *(("reversal", {"seed": s}) for s in REVERSAL_SEEDS),
    *(("reversal", dict(params)) for params in REVERSAL_ABLATIONS),
    ("reversal", dict(REVERSAL_SGD_CLAIM)),
    # the masked language model of chapter "The encoder"
    ("masked_lm", {"seed": 0}),
    ("masked_lm", {"seed": 1}),
    ("masked_lm", {"seed": 2}),
    ("markov_lm", {"seed": 0}),
    # in-context learning and its length limit (chapter "What transformers can and cannot do")
    ("in_context", {"seed": 0}),
    ("in_context", {"seed": 1}),
    ("in_context", {"seed": 2}),
    ("in_context", {"seed": 0, "positional": "learned"}),
    ("in_context", {"seed": 0, "positional": "rotary"}),
    # parity of 16 bits answered directly and after a scratchpad of running parities,
    # three seeds each (chapter "What transformers can and cannot do")
    *parity_runs(),
    # the draft model of speculative decoding (chapter "Fast inference"): small and weaker
    ("markov_lm", {"seed": 0, "d_model": 16, "n_heads": 2, "d_ff": 64, "n_layers": 1}),
    # post-norm against pre-norm at depth (chapter "Residual connections and normalization"),
    # five seeds: each conclusion must clear the spread between them
    *(
        ("norm_placement", {"seed": s, "n_layers": n, "norm_first": f, "warmup_steps": w})
        for s in (0, 1, 2, 3, 4)
        for n in (6, 12)
        for f in (False, True)
        for w in (0, 75)
    ),
    # loss against model size at a fixed token budget, and one compute budget split
    # several ways, the two closest splits with more seeds (chapter "Scaling laws")
    *scaling_runs(),
    # each change from GPT-2 to a modern decoder, five seeds at a fixed budget
    # (chapter "From GPT-2 to a modern decoder")
    *modern_runs(),
    # a mixture of experts against dense models, its routing and capacity, three seeds
    # (chapter "Mixture of experts")
    *moe_runs(),
    # the language model fine-tuned on a shifted source, fully and with LoRA at several
    # ranks, three seeds (chapter "Fine-tuning with LoRA")
    *finetune_runs(),
    # a GPT trained on the standard library's docstrings against n-gram baselines, on the
    # running interpreter's own text (chapter "A GPT on real text")
    *real_text_runs(),
)
"""The runs whose results the book shows, as ``(name, arguments)``; computed before a build."""

TYPICAL_SECONDS: dict[str, float] = {
    "real_text": 820.0,
    "in_context": 110.0,
    "parity": 40.0,
    "reversal": 62.0,
    "markov_lm": 34.0,
    "masked_lm": 32.0,
    "norm_placement": 14.0,
    "moe_lm": 12.0,
    "scaling": 11.0,
    "finetune": 10.0,
    "modern_lm": 9.0,
}
"""Typical wall time of one book run of each experiment, in seconds (mean over its book runs).

Measured on the book's two-core machine, two runs at a time with one BLAS thread each
(the stored runs' ``wall_time``, 2026-11-27). Only the order of the precompute rests on
it: ``python -m tinyformer.experiments --book --jobs 2`` starts the longest runs first, so
that no long run is left to finish alone on one core while the other idles (in book order
the single ``real_text`` run came last: 43 minutes for the 211 runs against 36 with the
longest first, by these times).
"""
