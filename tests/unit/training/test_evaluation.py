"""Evaluation: the held-out loss weighted by tokens, early stopping and a metric's direction."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import BigramConfig, BigramLM, bigram_windows

from tinyformer.training import EarlyStopping, LossEvaluator, lm_loss, metric_direction


def test_loss_evaluator_weights_by_tokens():
    rng = np.random.default_rng(0)
    model = BigramLM(BigramConfig(), rng=rng)
    data = bigram_windows(10, 4, rng)
    whole = lm_loss(model, data.batch(np.arange(10)), backward=False)
    metrics = LossEvaluator(lm_loss, data, batch_size=3)(model)  # batches of 3, 3, 3 and 1
    assert metrics["loss"] == pytest.approx(whole.loss, rel=1e-12)
    assert metrics["accuracy"] == pytest.approx(whole.accuracy, rel=1e-15)
    assert metrics["tokens"] == 40


def test_early_stopping_on_a_target_and_on_patience():
    stopper = EarlyStopping("loss", target=0.1, mode="min")
    assert stopper.update({"loss": 0.5}) is None
    assert stopper.update({"loss": 0.1}) == "target"
    with pytest.raises(KeyError, match="watches 'loss'"):
        stopper.update({"accuracy": 1.0})
    patient = EarlyStopping("accuracy", patience=2)
    assert [patient.update({"accuracy": a}) for a in (0.5, 0.6, 0.6)] == [None, None, None]
    assert patient.update({"accuracy": 0.55}) == "patience"  # two evaluations without a gain


def test_early_stopping_reads_the_direction_from_the_metric_name():
    # A falling loss is an improvement: patience must not run out while it falls.
    stopper = EarlyStopping("loss", patience=2)
    assert stopper.mode == "min"
    assert [stopper.update({"loss": value}) for value in (3.0, 2.0, 1.5, 1.2)] == [None] * 4
    assert stopper.update({"loss": 1.3}) is None
    assert stopper.update({"loss": 1.25}) == "patience"
    assert EarlyStopping("val_perplexity", target=2.0).mode == "min"
    assert EarlyStopping("exact_match", target=0.99).mode == "max"
    assert EarlyStopping("loss", target=0.1, mode="max").mode == "max"  # the caller's word wins
    assert [metric_direction(m) for m in ("accuracy", "Loss", "excess_over_entropy_rate")] == [
        "max",
        "min",
        "min",
    ]
    with pytest.raises(ValueError, match=r"cannot tell from the name 'reward'.*mode='max'"):
        EarlyStopping("reward", patience=3)
    with pytest.raises(ValueError, match="it says both"):
        metric_direction("accuracy_loss")


def test_early_stopping_rejects_bad_arguments():
    with pytest.raises(ValueError, match="target, a patience"):
        EarlyStopping("accuracy")
    with pytest.raises(ValueError, match="mode must be"):
        EarlyStopping("accuracy", target=1.0, mode="up")
    with pytest.raises(ValueError, match="patience must be a positive integer"):
        EarlyStopping("accuracy", patience=0)
