"""The post-norm against pre-norm run, at a tiny size: its result, its data, divergence, the store."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.experiments import ExperimentStore
from tinyformer.experiments.norm_placement import (
    block_gradient_norms,
    norm_placement,
    stream_rms,
)
from tinyformer.experiments.registry import BOOK_RUNS, EXPERIMENTS
from tinyformer.models import DecoderOnlyLM
from tinyformer.training import DivergenceError, Trainer

TINY = {
    "vocab_size": 6, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 3,
    "context_length": 8, "batch_size": 4, "max_steps": 12, "warmup_steps": 3,
    "n_train_windows": 32, "n_heldout_windows": 16, "log_every": 4, "dtype": "float64",
}  # fmt: skip


@pytest.fixture(scope="module")
def post_and_pre():
    return (
        norm_placement(seed=2, norm_first=False, **TINY),
        norm_placement(seed=2, norm_first=True, **TINY),
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
        assert all(np.isfinite(norms))
        assert min(norms) > 0
        assert m["init_grad_norm_ratio"] == pytest.approx(norms[-1] / norms[0])
        assert 0 < m["entropy_rate"] < m["unigram_loss"] <= np.log(6) + 1e-9
        assert np.isfinite(m["heldout_loss"])
        assert np.isfinite(m["init_loss"])
        assert result.history.column("step").tolist() == [4, 8, 12]
        assert all(isinstance(v, float) for v in m.values())


def test_both_placements_see_the_same_data_and_initial_weights(post_and_pre):
    post, pre = post_and_pre
    for key in ("entropy_rate", "unigram_loss"):
        assert post.metrics[key] == pre.metrics[key]
    # same seed, same draws: the blocks start from identical weights (only the wiring differs)
    fresh = [
        norm_placement(seed=2, norm_first=flag, **{**TINY, "max_steps": 1, "warmup_steps": 0})
        for flag in (False, True)
    ]
    assert post.metrics["init_grad_norm_0"] == fresh[0].metrics["init_grad_norm_0"]
    assert pre.metrics["init_grad_norm_0"] == fresh[1].metrics["init_grad_norm_0"]


def test_training_lowers_the_loss(post_and_pre):
    for result in post_and_pre:
        assert result.metrics["heldout_loss"] < result.metrics["init_loss"]


def test_block_gradient_norms_match_the_gradients_they_leave(post_and_pre):
    model = post_and_pre[1].model
    batch = (np.zeros((2, 8), dtype=np.int64), np.ones((2, 8), dtype=np.int64))
    norms = block_gradient_norms(model, batch)
    assert norms.shape == (3,)
    by_hand = np.sqrt(sum(np.sum(p.grad**2) for p in model.layers[1].parameters()))
    assert norms[1] == pytest.approx(by_hand)


def test_stream_rms_of_post_norm_is_one_after_every_block(post_and_pre):
    for result in post_and_pre:
        m = result.metrics
        recorded = [m[f"init_stream_rms_{i}"] for i in range(4)]
        assert all(r > 0 for r in recorded)
        if not result.config["model"][
            "norm_first"
        ]:  # every block ends in LayerNorm(gain 1, bias 0)
            np.testing.assert_allclose(recorded[1:], 1.0, rtol=1e-4)
    trained_post = post_and_pre[0].model  # trained gains and biases: no longer exactly one
    assert stream_rms(trained_post, np.zeros((2, 8), dtype=np.int64)).shape == (4,)


def test_divergence_is_a_result_not_a_crash(monkeypatch):
    real_step = Trainer.train_step

    def failing_step(self):
        if self.step == 4:
            raise DivergenceError(5, "loss", float("nan"))
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", failing_step)
    result = norm_placement(seed=0, **TINY)
    assert result.metrics["diverged"] == 1.0
    assert result.metrics["diverged_at_step"] == 5.0
    assert result.metrics["steps"] == 4
    assert np.isfinite(result.metrics["heldout_loss"])


def test_registered_and_round_trips_through_the_store(tmp_path, post_and_pre):
    assert EXPERIMENTS["norm_placement"] is norm_placement
    book = [args for name, args in BOOK_RUNS if name == "norm_placement"]
    assert {a["norm_first"] for a in book} == {False, True}
    assert len({a["seed"] for a in book}) >= 2
    store = ExperimentStore(tmp_path, {"norm_placement": norm_placement})
    stored = store.run("norm_placement", seed=2, norm_first=True, **TINY)
    again = store.run("norm_placement", seed=2, norm_first=True, **TINY)
    assert stored.metrics == post_and_pre[1].metrics == again.metrics
    np.testing.assert_array_equal(
        stored.history.column("loss"), post_and_pre[1].history.column("loss")
    )
    ids = np.arange(8)[None] % 6
    np.testing.assert_allclose(stored.model.forward(ids), post_and_pre[1].model.forward(ids))
