"""The post-norm against pre-norm run, at a tiny size: its result, its measures, divergence, the store."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer.experiments import ExperimentStore
from tinyformer.experiments.markov import markov_task, per_position_loss
from tinyformer.experiments.norm_placement import (
    block_gradient_norms,
    norm_placement,
    stream_rms,
)
from tinyformer.masks import causal_mask
from tinyformer.models import DecoderOnlyLM
from tinyformer.training import DivergenceError, Trainer


@pytest.fixture
def post_and_pre(tiny_run):
    return (
        tiny_run("norm_placement", seed=2, norm_first=False),
        tiny_run("norm_placement", seed=2, norm_first=True),
    )


def test_result_has_every_reported_number(post_and_pre):
    for result, norm_first in zip(post_and_pre, (False, True), strict=True):
        assert result.name == "norm_placement"
        assert result.seed == 2
        assert result.config["model"]["norm_first"] is norm_first
        assert result.config["model"]["n_layers"] == 3
        assert isinstance(result.model, DecoderOnlyLM)
        m = result.metrics
        assert m["diverged"] == 0.0
        assert m["diverged_at_step"] == 0.0
        assert m["steps"] == 12
        norms = [m[f"init_grad_norm_{i}"] for i in range(3)]
        assert min(norms) > 0
        assert m["init_grad_norm_ratio"] == norms[-1] / norms[0]
        assert 0 < m["entropy_rate"] < m["unigram_loss"] <= np.log(6) + 1e-9
        assert result.history.column("step").tolist() == [4, 8, 12]
        assert all(isinstance(v, float) for v in m.values())


def test_the_heldout_losses_are_those_of_the_model_on_the_heldout_stream(tiny, post_and_pre):
    settings = tiny["norm_placement"]
    source, windows = markov_task(2, settings["vocab_size"], 2, 4)
    heldout = windows(settings["n_heldout_windows"], settings["context_length"], 3)
    for result in post_and_pre:
        full_context = per_position_loss(result.model, heldout)[source.order - 1 :]
        assert result.metrics["heldout_loss"] == full_context.mean()
        assert result.metrics["entropy_rate"] == source.entropy_rate


def test_both_placements_see_the_same_data_and_initial_weights(tiny, post_and_pre):
    post, pre = post_and_pre
    for key in ("entropy_rate", "unigram_loss"):
        assert post.metrics[key] == pre.metrics[key]
    # same seed, same draws: the blocks start from identical weights (only the wiring differs)
    fresh = [
        norm_placement(
            seed=2,
            norm_first=flag,
            **{**tiny["norm_placement"], "max_steps": 1, "warmup_steps": 0},
        )
        for flag in (False, True)
    ]
    assert post.metrics["init_grad_norm_0"] == fresh[0].metrics["init_grad_norm_0"]
    assert pre.metrics["init_grad_norm_0"] == fresh[1].metrics["init_grad_norm_0"]
    assert post.metrics["init_loss"] == fresh[0].metrics["init_loss"]


def test_training_lowers_the_loss(post_and_pre):
    for result in post_and_pre:
        assert result.metrics["heldout_loss"] < result.metrics["init_loss"]


def test_block_gradient_norms_match_the_gradients_they_leave(tiny, post_and_pre):
    settings = tiny["norm_placement"]
    fresh = norm_placement(
        seed=2, norm_first=True, **{**settings, "max_steps": 1, "warmup_steps": 0}
    )
    model = fresh.model  # a model of its own: this test leaves gradients in it
    batch = (np.zeros((2, 8), dtype=np.int64), np.ones((2, 8), dtype=np.int64))
    norms = block_gradient_norms(model, batch)
    assert norms.shape == (3,)
    for i, block in enumerate(model.decoder.layers):
        by_hand = math.sqrt(sum(float(np.sum(p.grad**2)) for p in block.parameters()))
        assert norms[i] == pytest.approx(by_hand, rel=1e-14)
    assert norms[1] > 0


@pytest.mark.parametrize("norm_first", [False, True])
def test_stream_rms_follows_the_residual_stream_of_the_stack(
    monkeypatch, post_and_pre, norm_first
):
    model = post_and_pre[int(norm_first)].model
    ids = np.arange(16).reshape(2, 8) % 6
    rms = stream_rms(model, ids)
    assert rms.shape == (4,)
    stack = model.decoder
    monkeypatch.setattr(stack, "final_norm", None)  # the stream as it leaves the last block
    out = stack.forward(ids, causal_mask(8))
    assert rms[-1] == math.sqrt(float(np.mean(out**2)))
    embedded = stack.positions.forward(stack.embedding.forward(ids), 0)
    assert rms[0] == math.sqrt(float(np.mean(embedded**2)))


def test_stream_rms_of_post_norm_is_one_after_every_block_at_initialization(post_and_pre):
    for result in post_and_pre:
        m = result.metrics
        recorded = [m[f"init_stream_rms_{i}"] for i in range(4)]
        assert all(r > 0 for r in recorded)
        if not result.config["model"]["norm_first"]:  # every block ends in LayerNorm(1, 0)
            np.testing.assert_allclose(recorded[1:], 1.0, rtol=1e-4)
        else:  # pre-norm: the stream grows block by block
            assert recorded[1] < recorded[2] < recorded[3]


def test_divergence_is_a_result_not_a_crash(monkeypatch, tiny):
    real_step = Trainer.train_step

    def failing_step(self):
        if self.step == 4:
            raise DivergenceError(5, "loss", float("nan"))
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", failing_step)
    result = norm_placement(seed=0, **tiny["norm_placement"])
    assert result.metrics["diverged"] == 1.0
    assert result.metrics["diverged_at_step"] == 5.0
    assert result.metrics["steps"] == 4
    assert result.history.column("step").tolist() == [4]  # the last row before the failure
    assert np.isfinite(result.metrics["heldout_loss"])


def test_a_run_that_really_diverges_reports_the_step(tiny):
    """A learning rate of 10^4 blows the post-norm model up within a few steps."""
    with np.errstate(over="ignore", invalid="ignore"):
        result = norm_placement(
            seed=1, norm_first=False, **{**tiny["norm_placement"], "peak_lr": 1e4}
        )
    m = result.metrics
    assert m["diverged"] == 1.0
    assert m["steps"] == m["diverged_at_step"] - 1  # the failed step was not applied
    assert 1 <= m["diverged_at_step"] <= 12


def test_round_trips_through_the_store(tmp_path, tiny, post_and_pre):
    store = ExperimentStore(tmp_path, {"norm_placement": norm_placement})
    stored = store.run("norm_placement", seed=2, norm_first=True, **tiny["norm_placement"])
    again = store.run("norm_placement", seed=2, norm_first=True, **tiny["norm_placement"])
    timings = {"train_seconds", "cpu_seconds"}

    def untimed(m):
        return {k: v for k, v in m.items() if k not in timings}

    assert untimed(stored.metrics) == untimed(post_and_pre[1].metrics) == untimed(again.metrics)
    np.testing.assert_array_equal(
        stored.history.column("loss"), post_and_pre[1].history.column("loss")
    )
    ids = np.arange(8)[None] % 6
    np.testing.assert_array_equal(stored.model.forward(ids), post_and_pre[1].model.forward(ids))
