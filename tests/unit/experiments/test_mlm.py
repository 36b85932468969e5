"""The masked-language-model run: its data, its optima, its result, the store round trip."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.data.masking import KEPT, MASKED, RANDOM, optimal_predictions
from tinyformer.diagnostics import parameter_fingerprint
from tinyformer.experiments import ExperimentStore
from tinyformer.experiments.mlm import masked_lm, mlm_data
from tinyformer.experiments.recipe import token_losses
from tinyformer.models import EncoderOnlyMLM

DATA = {"vocab_size": 6, "context_length": 10, "n_train_windows": 64,
        "n_validation_windows": 16, "n_heldout_windows": 32}  # fmt: skip


def test_tiny_run_returns_a_complete_result(tiny_run):
    r = tiny_run("masked_lm", seed=3)
    assert r.name == "masked_lm"
    assert r.seed == 3
    assert isinstance(r.model, EncoderOnlyMLM)
    assert not r.model.training
    assert r.model.config.vocab_size == 7  # six symbols and [MASK]
    assert r.config["model"]["context_length"] == r.config["context_length"] == 10
    assert r.config["max_steps"] == 12
    assert [row["step"] for row in r.history.eval] == [5, 10, 12]
    m = r.metrics
    assert m["n_masked"] + m["n_random"] + m["n_kept"] == m["n_chosen"] > 0
    assert m["excess_over_optimum"] == m["loss"] / m["optimal_bidirectional"] - 1.0
    assert all(isinstance(v, float) for v in m.values())


def test_the_exact_optimum_is_below_the_left_only_one(tiny_run):
    """On average over many chosen positions, seeing both sides cannot hurt."""
    m = tiny_run("masked_lm", seed=3).metrics
    assert m["optimal_bidirectional"] < m["optimal_left_only"]


def test_stored_metrics_are_recomputed_from_the_model_and_the_data(tiny_run):
    r = tiny_run("masked_lm", seed=3)
    data = mlm_data(3, **DATA)
    heldout = data.heldout
    losses, _ = token_losses(r.model, heldout.inputs, heldout.tokens, batch_size=512)
    m = r.metrics
    assert m["loss"] == losses[heldout.chosen].mean()  # the run's own batch size: exact
    for name, code in (("masked", MASKED), ("random", RANDOM), ("kept", KEPT)):
        where = heldout.action == code
        assert m[f"loss_{name}"] == losses[where].mean()
        assert m[f"n_{name}"] == where.sum()
    q = optimal_predictions(data.source, data.scheme, heldout.inputs)  # (B, T, V)
    best = -np.log(np.take_along_axis(q, heldout.tokens[..., None], axis=-1)[..., 0])
    assert m["optimal_bidirectional"] == best[heldout.chosen].mean()
    assert m["entropy_rate"] == data.source.entropy_rate
    smaller, _ = token_losses(r.model, heldout.inputs, heldout.tokens, batch_size=7)
    np.testing.assert_allclose(smaller, losses, rtol=1e-12)  # other batches: the last bits


def test_data_streams_are_independent_and_reproducible():
    a, b = (
        mlm_data(1, n_train_windows=40, n_validation_windows=8, n_heldout_windows=8),
        mlm_data(1, n_train_windows=40, n_validation_windows=8, n_heldout_windows=8),
    )
    assert np.array_equal(a.train, b.train)
    assert np.array_equal(a.heldout.inputs, b.heldout.inputs)
    assert np.array_equal(a.heldout.action, b.heldout.action)
    assert not np.array_equal(a.train[:8], a.heldout.tokens)
    assert not np.array_equal(a.validation.tokens, a.heldout.tokens)
    assert a.train.shape == (40, 16)  # context_length 16 by default
    assert a.scheme.mask_id == a.source.vocab_size == 16


def test_a_stored_run_loads_back_with_identical_weights(tmp_path, tiny):
    store = ExperimentStore(tmp_path, {"masked_lm": masked_lm})
    first = store.run("masked_lm", seed=2, **tiny["masked_lm"])  # computed, saved, read back
    again = store.run("masked_lm", seed=2, **tiny["masked_lm"])  # loaded
    fresh = masked_lm(seed=2, **tiny["masked_lm"])
    assert parameter_fingerprint(first.model) == parameter_fingerprint(fresh.model)
    assert parameter_fingerprint(again.model) == parameter_fingerprint(fresh.model)
    assert isinstance(again.model, EncoderOnlyMLM)
    assert again.metrics == first.metrics


def test_bad_arguments_are_named(tiny):
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        masked_lm(**{**tiny["masked_lm"], "max_steps": 0})
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        masked_lm(**{**tiny["masked_lm"], "batch_size": -1})
