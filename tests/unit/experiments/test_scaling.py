"""The scaling sweep at a tiny size, the power-law fit, and the scaling-law arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.cost import non_embedding_parameters
from tinyformer.data import MarkovSource
from tinyformer.experiments import ExperimentStore
from tinyformer.experiments.markov import per_position_loss
from tinyformer.experiments.scaling import (
    DECIDING_SEEDS,
    DECIDING_WIDTHS,
    ISO_COMPUTE_SEEDS,
    ISO_COMPUTE_WIDTHS,
    SWEEP_SEEDS,
    SWEEP_STEPS,
    SWEEP_WIDTHS,
    book_runs,
    bootstrap_exponent,
    compute_for_loss_reduction,
    compute_optimal_split,
    fit_power_law,
    iso_compute_steps,
    loss_reduction_from_compute,
    scaling,
    scaling_config,
)
from tinyformer.models import DecoderOnlyLM
from tinyformer.models.counting import parameter_count
from tinyformer.training import WindowDataset

TIMING = {"train_seconds", "cpu_seconds"}


@pytest.fixture
def tiny_sweep_run(tiny_run):
    return tiny_run("scaling", seed=1)


def _untimed(metrics):
    return {k: v for k, v in metrics.items() if k not in TIMING}


def test_tiny_run_reports_every_number(tiny_sweep_run):
    r = tiny_sweep_run
    assert r.name == "scaling"
    assert r.seed == 1
    assert isinstance(r.model, DecoderOnlyLM)
    assert not r.model.training
    m = r.metrics
    assert all(isinstance(v, float) for v in m.values())
    assert m["parameters"] == non_embedding_parameters(r.model.config)
    assert m["all_parameters"] == parameter_count(r.model.config) == r.model.num_parameters()
    assert m["train_tokens"] == 10 * 4 * 8
    assert m["train_flops"] == 6 * m["parameters"] * m["train_tokens"]
    assert m["train_flops_exact"] > m["train_flops"]  # 6ND leaves out attention and the output
    assert m["excess_loss"] == pytest.approx(m["heldout_loss"] - m["entropy_rate"])
    assert m["heldout_windows_in_training"] == 0.0
    assert m["cpu_seconds"] > 0
    assert abs(m["source_heldout_loss"] - m["entropy_rate"]) < 0.3  # 32 short windows
    assert r.config["model"]["n_heads"] == 2  # d_model 8 in heads of d_k = 4


def test_the_heldout_loss_is_the_models_on_the_shared_heldout_stream(tiny, tiny_sweep_run):
    settings = tiny["scaling"]
    source = MarkovSource.random(
        6, 2, 3, rng=np.random.default_rng([0, 0]), concentration=0.3
    )  # source_seed 0, whatever the run's seed
    heldout = WindowDataset(
        *source.sample_windows(32, settings["context_length"], np.random.default_rng([0, 3]))
    )
    m = tiny_sweep_run.metrics
    assert m["entropy_rate"] == source.entropy_rate
    assert m["heldout_loss"] == per_position_loss(tiny_sweep_run.model, heldout)[1:].mean()


def test_width_sets_heads_and_feed_forward():
    config = scaling_config(24)
    assert (config.n_heads, config.d_ff, config.n_layers) == (6, 96, 1)
    assert config.d_k == 4
    assert scaling_config(24, d_k=8).n_heads == 3
    with pytest.raises(ValueError, match="d_model must be a multiple of d_k=4, got d_model=10"):
        scaling_config(10)
    with pytest.raises(TypeError, match="d_model"):
        scaling_config(8.0)


def test_training_never_sees_a_heldout_window(tiny_run):
    """A source of low entropy repeats windows; the run replaces the training copies."""
    r = tiny_run("scaling", seed=0, vocab_size=3, branching=2, context_length=4)
    assert r.metrics["heldout_windows_in_training"] == 0.0
    assert r.metrics["training_windows_replaced"] > 0  # there was something to replace


def test_seeds_change_training_not_the_test(tiny_run, tiny_sweep_run):
    other = tiny_run("scaling", seed=2)
    for key in ("entropy_rate", "source_heldout_loss"):
        assert other.metrics[key] == tiny_sweep_run.metrics[key]
    assert other.metrics["heldout_loss"] != tiny_sweep_run.metrics["heldout_loss"]


@given(
    alpha=st.floats(0.05, 2.0),
    log_nc=st.floats(0.0, 12.0),
)
def test_fit_recovers_an_exact_power_law(alpha, log_nc):
    n = np.array([1e3, 3e3, 1e4, 3e4, 1e5])
    excess = (math.exp(log_nc) / n) ** alpha
    fitted_alpha, n_c = fit_power_law(n, excess)
    assert fitted_alpha == pytest.approx(alpha, rel=1e-9)
    assert math.log(n_c) == pytest.approx(log_nc, abs=1e-6)


def test_fit_pools_seeds_and_bootstrap_spreads_around_it():
    rng = np.random.default_rng(0)
    n = np.array([1e3, 3e3, 1e4, 3e4])
    excess = (2e3 / n) ** 0.5 * np.exp(rng.normal(0, 0.05, size=(3, 4)))
    alpha, _ = fit_power_law(n, excess)
    assert alpha == pytest.approx(0.5, abs=0.05)
    draws = bootstrap_exponent(n, excess, n_resamples=200, rng=np.random.default_rng(1))
    assert draws.shape == (200,)
    assert draws.min() < alpha < draws.max()
    # the first resample, by hand: per size, three of its seeds drawn with replacement
    picks = np.random.default_rng(1).integers(0, 3, size=(200, 3, 4))[0]
    assert draws[0] == fit_power_law(n, excess[picks, np.arange(4)])[0]
    same = np.tile((2e3 / n) ** 0.5, (3, 1))  # identical seeds: no spread at all
    np.testing.assert_allclose(
        bootstrap_exponent(n, same, n_resamples=5, rng=np.random.default_rng(2)), 0.5
    )


@pytest.mark.parametrize(
    ("n_params", "excess", "match"),
    [
        ([1e3], [0.5], "n >= 2"),
        ([1e3, 1e4], [0.5, 0.5, 0.5], "shape"),
        ([1e3, 1e4], [0.5, -0.1], "above H"),
        ([1e3, 0.0], [0.5, 0.1], "positive"),
        ([1e3, 1e4], [0.5, np.nan], "finite"),
    ],
)
def test_fit_rejects_bad_inputs(n_params, excess, match):
    with pytest.raises(ValueError, match=match):
        fit_power_law(n_params, excess)


def test_bootstrap_needs_seeds_and_a_generator():
    with pytest.raises(ValueError, match="n_seeds"):
        bootstrap_exponent([1e3, 1e4], [0.5, 0.2], rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        bootstrap_exponent([1e3, 1e4], [[0.5, 0.2]], rng=0)


def test_scaling_law_arithmetic():
    assert compute_for_loss_reduction(10, 0.05) == pytest.approx(1e20)
    assert loss_reduction_from_compute(100, 0.05) == pytest.approx(10**0.1)
    for k, a in ((100.0, 0.05), (7.0, 0.3)):  # the two are inverse to each other
        assert compute_for_loss_reduction(loss_reduction_from_compute(k, a), a) == pytest.approx(k)
    n, d = compute_optimal_split(5.88e23)
    assert d / n == pytest.approx(20)
    assert 6 * n * d == pytest.approx(5.88e23)
    n4, d4 = compute_optimal_split(4 * 5.88e23)  # both grow as the square root of compute
    assert (n4 / n, d4 / d) == pytest.approx((2.0, 2.0))
    with pytest.raises(ValueError, match="exponent"):
        compute_for_loss_reduction(10, 0.0)
    with pytest.raises(TypeError, match="compute"):
        compute_optimal_split("1e23")


def test_iso_compute_steps_match_the_reference_compute():
    reference = non_embedding_parameters(scaling_config(24)) * SWEEP_STEPS
    for d in ISO_COMPUTE_WIDTHS:
        steps = iso_compute_steps(d)
        assert steps * non_embedding_parameters(scaling_config(d)) == pytest.approx(
            reference, rel=0.01
        )
    assert iso_compute_steps(24) == SWEEP_STEPS


def test_book_runs_span_a_decade_and_a_half_with_seeds():
    runs = book_runs()
    sweep = [p for _, p in runs if p["max_steps"] == SWEEP_STEPS and p["seed"] in SWEEP_SEEDS]
    sizes = sorted({non_embedding_parameters(scaling_config(p["d_model"])) for p in sweep})
    assert len(sizes) >= 6
    assert math.log10(sizes[-1] / sizes[0]) >= 1.5
    assert {(p["d_model"], p["seed"]) for p in sweep} == {
        (d, s) for d in SWEEP_WIDTHS for s in SWEEP_SEEDS
    }
    iso = [p for _, p in runs if p["max_steps"] == iso_compute_steps(p["d_model"])]
    assert all(p["max_steps"] != SWEEP_STEPS or p["d_model"] == 24 for p in iso)
    seeds_of = {
        d: {p["seed"] for p in iso if p["d_model"] == d} for d in (*ISO_COMPUTE_WIDTHS, 24)
    }
    for d in ISO_COMPUTE_WIDTHS:  # every split of the budget, with the sweep's seeds at least
        assert seeds_of[d] >= set(ISO_COMPUTE_SEEDS)
    for d in DECIDING_WIDTHS:  # the two closest, with more
        assert seeds_of[d] == set(DECIDING_SEEDS)
    assert len(DECIDING_SEEDS) > len(ISO_COMPUTE_SEEDS)


def test_book_runs_are_listed_once():
    runs = [tuple(sorted(p.items())) for _, p in book_runs()]
    assert len(runs) == len(set(runs))
    assert {name for name, _ in book_runs()} == {"scaling"}


def test_round_trips_through_the_store(tmp_path, tiny, tiny_sweep_run):
    store = ExperimentStore(tmp_path, {"scaling": scaling})
    stored = store.run("scaling", seed=1, **tiny["scaling"])
    again = store.run("scaling", seed=1, **tiny["scaling"])
    assert _untimed(stored.metrics) == _untimed(tiny_sweep_run.metrics) == _untimed(again.metrics)
    ids = np.arange(8)[None] % 6
    np.testing.assert_array_equal(stored.model.forward(ids), tiny_sweep_run.model.forward(ids))
