"""The language-model run on a Markov source: its task, the per-position loss, its result."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.experiments import markov_lm, per_position_loss, run
from tinyformer.experiments.markov import markov_task
from tinyformer.experiments.recipe import token_losses
from tinyformer.training import WindowDataset, lm_loss


def test_markov_task_draws_each_stream_on_its_own():
    source, windows = markov_task(5, 6, 2, 3)
    again_source, again = markov_task(5, 6, 2, 3)
    np.testing.assert_array_equal(source.transitions, again_source.transitions)
    train, heldout = windows(8, 10, 1), windows(8, 10, 3)
    assert train.inputs.shape == (8, 10)
    np.testing.assert_array_equal(train.inputs, again(8, 10, 1).inputs)
    assert not np.array_equal(train.inputs, heldout.inputs)
    np.testing.assert_array_equal(train.inputs[:, 1:], train.targets[:, :-1])
    table = source.transitions  # every step of a window is one the source allows
    assert (table[train.inputs[:, :-1], train.inputs[:, 1:], train.targets[:, 1:]] > 0).all()


def test_per_position_loss_is_the_mean_over_windows_of_the_token_losses(tiny_run, rng):
    model = tiny_run("markov_lm", seed=3).model
    windows = WindowDataset(rng.integers(0, 6, (10, 12)), rng.integers(0, 6, (10, 12)))
    per_position = per_position_loss(model, windows, batch_size=3)
    assert per_position.shape == (12,)
    losses, _ = token_losses(model, windows.inputs, windows.targets, batch_size=3)
    np.testing.assert_allclose(per_position, losses.mean(axis=0), rtol=1e-13)
    whole = lm_loss(model, windows.batch(np.arange(10)), backward=False)
    assert per_position.mean() == pytest.approx(whole.loss, rel=1e-10)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        per_position_loss(model, windows, batch_size=0)


def test_tiny_markov_reports_the_heldout_losses_of_its_model(tiny, tiny_run):
    result = tiny_run("markov_lm", seed=3)
    metrics = result.metrics
    settings = tiny["markov_lm"]
    source, windows = markov_task(3, settings["vocab_size"], 2, 4)
    heldout = windows(settings["n_heldout_windows"], settings["context_length"], 3)
    losses = per_position_loss(result.model, heldout)
    h = source.entropy_rate
    assert metrics["entropy_rate"] == h
    assert metrics["loss_full_context"] == losses[1:].mean()
    assert metrics["loss_all_positions"] == losses.mean()
    assert metrics["excess_over_entropy_rate"] == metrics["loss_full_context"] / h - 1
    assert metrics["optimal_all_positions"] == source.optimal_cross_entropy(12).mean()
    assert metrics["optimal_all_positions"] >= h  # the first position lacks a full context
    assert abs(metrics["source_loss_full_context"] - h) < 0.25 * h  # 32 windows: noisy
    assert metrics["steps"] == 12
    assert result.history.column("step", "eval").tolist() == [5, 10, 12]
    assert result.config["source"] == {"vocab_size": 6, "order": 2, "branching": 4}


def test_early_stopping_ends_the_run_at_the_target(tiny_run):
    """A target any model meets stops the run at its first evaluation."""
    result = tiny_run("markov_lm", seed=3, target_excess=10.0)
    assert result.metrics["steps"] == 5
    assert result.history.column("step", "eval").tolist() == [5]


def test_bad_arguments_are_named(tiny):
    with pytest.raises(ValueError, match="batch_size must be at most the number of examples"):
        markov_lm(**{**tiny["markov_lm"], "batch_size": 1000})
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        markov_lm(**{**tiny["markov_lm"], "max_steps": -3})


# -------------------------------------------------------------- slow: the book's result
@pytest.mark.slow
def test_markov_lm_comes_within_3_percent_of_the_entropy_rate():
    result = run("markov_lm", seed=0)
    assert result.metrics["excess_over_entropy_rate"] < 0.03
    assert result.metrics["loss_all_positions"] >= result.metrics["optimal_all_positions"] - 0.02
