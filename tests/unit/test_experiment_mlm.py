"""The masked-language-model run: plumbing at a tiny size, the store round trip, the optima."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.experiments import ExperimentStore, registry
from tinyformer.experiments.mlm import masked_lm, mlm_data, token_losses
from tinyformer.models import EncoderOnlyMLM

TINY = {
    "vocab_size": 6, "seq_len": 10, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
    "batch_size": 16, "max_steps": 12, "warmup_steps": 3, "n_train_windows": 64,
    "n_validation_windows": 16, "n_heldout_windows": 32, "eval_every": 5, "dtype": "float64",
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run():
    return masked_lm(seed=3, **TINY)


def test_tiny_run_returns_a_complete_result(tiny_run):
    r = tiny_run
    assert r.name == "masked_lm"
    assert r.seed == 3
    assert isinstance(r.model, EncoderOnlyMLM)
    assert not r.model.training
    assert r.model.config.vocab_size == 7  # six symbols and [MASK]
    assert r.config["model"]["context_length"] == 10
    assert r.config["max_steps"] == 12
    assert [row["step"] for row in r.history.eval] == [5, 10, 12]
    m = r.metrics
    for key in ("loss", "optimal_bidirectional", "optimal_left_only", "excess_over_optimum"):
        assert np.isfinite(m[key]), key
    assert m["n_masked"] + m["n_random"] + m["n_kept"] == m["n_chosen"] > 0
    assert all(isinstance(v, float) for v in m.values())


def test_the_exact_optimum_is_below_the_left_only_one(tiny_run):
    """On average over many chosen positions, seeing both sides cannot hurt."""
    m = tiny_run.metrics
    assert m["optimal_bidirectional"] < m["optimal_left_only"]


def test_stored_metrics_are_recomputed_from_the_model(tiny_run):
    data = mlm_data(
        3,
        vocab_size=6,
        seq_len=10,
        n_train_windows=64,
        n_validation_windows=16,
        n_heldout_windows=32,
    )
    losses = token_losses(tiny_run.model, data.heldout, batch_size=7)
    np.testing.assert_allclose(losses[data.heldout.chosen].mean(), tiny_run.metrics["loss"])


def test_data_streams_are_independent_and_reproducible():
    a, b = (
        mlm_data(1, n_train_windows=40, n_validation_windows=8, n_heldout_windows=8),
        mlm_data(1, n_train_windows=40, n_validation_windows=8, n_heldout_windows=8),
    )
    assert np.array_equal(a.train, b.train)
    assert np.array_equal(a.heldout.inputs, b.heldout.inputs)
    assert not np.array_equal(a.train[:8], a.heldout.tokens)


def test_a_stored_run_loads_back_with_identical_weights(tmp_path):
    store = ExperimentStore(tmp_path, {"masked_lm": masked_lm})
    first = store.run("masked_lm", seed=2, **TINY)  # computed, saved, read back
    again = store.run("masked_lm", seed=2, **TINY)  # loaded
    fresh = masked_lm(seed=2, **TINY)
    for (name, p), (_, q), (_, r) in zip(
        first.model.named_parameters(),
        again.model.named_parameters(),
        fresh.model.named_parameters(),
        strict=True,
    ):
        assert np.array_equal(p.value, q.value), name
        assert np.array_equal(p.value, r.value), name
    assert isinstance(again.model, EncoderOnlyMLM)
    assert again.metrics == first.metrics


def test_the_run_is_registered_for_the_book():
    assert registry.EXPERIMENTS["masked_lm"] is masked_lm
    (params,) = [p for name, p in registry.BOOK_RUNS if name == "masked_lm"]
    store = ExperimentStore("unused", registry.EXPERIMENTS)
    assert store.key("masked_lm", **params) == store.key("masked_lm", seed=0)  # the page's run
