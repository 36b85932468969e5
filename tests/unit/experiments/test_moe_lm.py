"""The mixture-of-experts experiment: its task, its Bayes optimum, its routing counts, its runs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tinyformer.experiments.moe_lm import (
    bayes_losses,
    book_runs,
    conditional_mutual_information_bits,
    mixture_task,
    moe_layers,
    moe_lm,
    mutual_information_bits,
    routing_counts,
)
from tinyformer.experiments.registry import BOOK_RUNS, EXPERIMENTS
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM

TINY = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 8,
    "n_layers": 1,
    "context_length": 12,
    "batch_size": 8,
    "max_steps": 6,
    "warmup_steps": 2,
    "n_heldout_windows": 24,
    "from_position": 4,
    "log_every": 3,
}


def test_windows_come_whole_from_one_source_and_are_deterministic():
    sources, windows = mixture_task(0, 3, 6, 1, 2)
    data, which = windows(60, 10, 3)
    again, which_again = windows(60, 10, 3)
    assert np.array_equal(data.inputs, again.inputs)
    assert np.array_equal(which, which_again)
    assert set(which.tolist()) == {0, 1, 2}
    for row in range(60):
        stream = np.concatenate([data.inputs[row, :1], data.targets[row]])
        table = sources[which[row]].transitions
        assert (table[stream[:-1], stream[1:]] > 0).all()  # every step allowed by its source
    other, _ = windows(60, 10, (1, 0))
    assert not np.array_equal(other.inputs, data.inputs)


def _brute_force_bayes(sources, stream):
    """Predictive losses by summing over sources with explicit window probabilities."""
    losses = []
    for t in range(1, len(stream)):

        def prob(prefix, source):
            p = source.stationary[prefix[0]] if source.order == 1 else None
            for a, b in itertools.pairwise(prefix):
                p *= source.transitions[a, b]
            return p

        joint = sum(prob(stream[: t + 1], s) for s in sources)
        marginal = sum(prob(stream[:t], s) for s in sources)
        losses.append(-np.log(joint / marginal))
    return np.array(losses)


def test_bayes_losses_equal_a_sum_over_sources_by_brute_force():
    sources, windows = mixture_task(2, 3, 5, 1, 3)
    data, _ = windows(4, 7, 3)
    losses, posterior = bayes_losses(sources, data.inputs, data.targets)
    for row in range(4):
        stream = np.concatenate([data.inputs[row, :1], data.targets[row]])
        assert np.allclose(losses[row], _brute_force_bayes(sources, stream), rtol=1e-10)
    assert np.allclose(posterior.sum(axis=-1), 1.0)


def test_bayes_loss_with_one_source_is_that_sources_cross_entropy():
    sources, windows = mixture_task(1, 1, 6, 2, 3)
    data, _ = windows(50, 9, 3)
    losses, posterior = bayes_losses(sources, data.inputs, data.targets)
    stream = np.concatenate([data.inputs[:, :1], data.targets], axis=1)
    # from a whole context on (target 1 on, order 2) it is the source's own cross-entropy
    assert losses[:, 1:].mean() == pytest.approx(sources[0].cross_entropy(stream), rel=1e-12)
    # before it, the stationary marginals: p(x1 | x0) = pi(x0, x1) / pi(x0)
    pi = sources[0].stationary
    expected = -np.log(pi[stream[:, 0], stream[:, 1]] / pi.sum(axis=1)[stream[:, 0]])
    assert np.allclose(losses[:, 0], expected)
    assert np.array_equal(posterior, np.ones_like(posterior))


def test_bayes_posterior_settles_on_the_true_source():
    sources, windows = mixture_task(0, 4, 16, 1, 4)
    data, which = windows(200, 32, 3)
    _, posterior = bayes_losses(sources, data.inputs, data.targets)
    assert (posterior[np.arange(200), -1].argmax(axis=-1) == which).mean() > 0.95


def test_mutual_information_of_independent_and_identical_tables():
    assert mutual_information_bits(np.outer([1, 2, 3], [4, 5])) == pytest.approx(0, abs=1e-12)
    assert mutual_information_bits(np.eye(4) * 7) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="joint"):
        mutual_information_bits(np.zeros((2, 2)))


def test_conditional_mutual_information_averages_the_slices():
    # given c, a and b are identical in slice 0 (1 bit) and independent in slice 1 (0 bits)
    joint = np.stack([np.eye(2) * 3, np.outer([1, 1], [2, 1])])  # weights 6/12 and 6/12
    assert conditional_mutual_information_bits(joint) == pytest.approx(0.5)
    # a and b both copy c: dependent overall, independent once c is known
    copies = np.zeros((2, 2, 2))
    copies[0, 0, 0] = copies[1, 1, 1] = 5
    assert mutual_information_bits(copies.sum(axis=0)) == pytest.approx(1.0)
    assert conditional_mutual_information_bits(copies) == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="joint"):
        conditional_mutual_information_bits(np.ones((2, 2)))


def _moe_model(capacity_factor=None):
    config = DecoderOnlyConfig(
        vocab_size=6, d_model=8, n_heads=2, d_ff=8, n_layers=2, context_length=10,
        norm_first=True, feed_forward="moe", n_experts=3, experts_per_token=2,
        expert_capacity_factor=capacity_factor,
    )  # fmt: skip
    return DecoderOnlyLM(config, rng=np.random.default_rng(0))


def test_routing_counts_match_the_layers_own_routing():
    model = _moe_model()
    ids = np.random.default_rng(1).integers(0, 6, (5, 10))
    labels = np.array([0, 1, 1, 0, 1])
    counts, dropped = routing_counts(model, ids, labels, n_labels=2, from_position=3, batch_size=5)
    assert counts.shape == (2, 2, 2, 3)
    assert not dropped.any()
    model.forward(ids)
    for li, layer in enumerate(moe_layers(model)):
        choices = layer.routing.choices[:, 3:]  # (5, 7, 2)
        for c in range(2):
            mine = choices[labels == c]
            for r in range(2):
                assert np.array_equal(
                    counts[li, c, r], np.bincount(mine[..., r].ravel(), minlength=3)
                )
    assert counts.sum() == 2 * 2 * 5 * 7  # layers, ranks, tokens counted


def test_routing_counts_see_dropped_assignments_per_pass():
    model = _moe_model(capacity_factor=0.5)
    ids = np.random.default_rng(2).integers(0, 6, (6, 10))
    _counts, dropped = routing_counts(model, ids, np.zeros(6, int), n_labels=1, batch_size=2)
    assert dropped.sum() > 0
    model.forward(ids[:2])
    first_pass = sum(layer.n_dropped for layer in moe_layers(model))
    _, dropped_first = routing_counts(model, ids[:2], np.zeros(2, int), n_labels=1, batch_size=2)
    assert dropped_first.sum() == first_pass


def test_routing_counts_refuse_bad_arguments():
    model = _moe_model()
    ids = np.zeros((2, 10), dtype=int)
    with pytest.raises(ValueError, match="labels"):
        routing_counts(model, ids, np.array([0, 5]), n_labels=2)
    with pytest.raises(ValueError, match="from_position"):
        routing_counts(model, ids, np.array([0, 1]), n_labels=2, from_position=10)
    dense = DecoderOnlyLM(
        DecoderOnlyConfig(vocab_size=6, d_model=8, n_heads=2, d_ff=8, n_layers=1,
                          context_length=10),
        rng=np.random.default_rng(0),
    )  # fmt: skip
    with pytest.raises(ValueError, match="MixtureOfExperts"):
        routing_counts(dense, ids, np.array([0, 1]), n_labels=2)


def test_run_is_deterministic_and_its_metrics_are_as_documented():
    a = moe_lm(seed=3, aux_loss_weight=0.01, capacity_factor=1.0, **TINY)
    b = moe_lm(seed=3, aux_loss_weight=0.01, capacity_factor=1.0, **TINY)
    assert a.metrics.keys() == b.metrics.keys()
    for key in a.metrics:
        if key not in ("train_seconds", "cpu_seconds"):
            assert a.metrics[key] == b.metrics[key], key
    m = a.metrics
    assert m["excess_loss"] == pytest.approx(m["heldout_loss"] - m["bayes_loss"])
    assert m["active_parameters"] < m["parameters"]
    assert 0 <= m["source_information_bits_0"] <= 2
    assert 0 <= m["token_information_bits_0"] <= 2
    assert 0 <= m["conditional_source_information_bits_0"] <= 2
    assert 0 < m["source_token_information_bits"] <= 2
    assert m["min_load_0"] <= 1 <= m["max_load_0"]
    assert 0 < m["dropped_fraction_0"] < 1  # capacity 1.0 with an untrained router drops some
    # the held-out loss is measured on the documented windows
    sources, windows = mixture_task(0, 4, 16, 1, 4)
    heldout, _ = windows(TINY["n_heldout_windows"], TINY["context_length"], 3)
    optimum, _ = bayes_losses(sources, heldout.inputs, heldout.targets)
    assert m["bayes_loss"] == pytest.approx(optimum.mean())
    # what the current token says about the source, from position from_position on
    _, which = windows(TINY["n_heldout_windows"], TINY["context_length"], 3)
    late = heldout.inputs[:, TINY["from_position"] :]
    table = np.zeros((16, 4))
    np.add.at(table, (late, np.broadcast_to(which[:, None], late.shape)), 1)
    assert m["source_token_information_bits"] == pytest.approx(mutual_information_bits(table))


def test_dense_run_has_all_parameters_active_and_no_routing_metrics():
    result = moe_lm(seed=0, feed_forward="gated", **TINY)
    assert result.metrics["parameters"] == result.metrics["active_parameters"]
    assert "max_load_0" not in result.metrics


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"feed_forward": "plain"}, "feed_forward"),
        ({"feed_forward": "gated", "aux_loss_weight": 0.1}, "moe"),
        ({"capacity_factor": 0.0}, "capacity_factor"),
        ({"aux_loss_weight": -1.0}, "aux_loss_weight"),
        ({"from_position": 12}, "from_position"),
    ],
)
def test_bad_arguments_are_refused_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        moe_lm(**{**TINY, **change})


def test_book_runs_are_registered_and_compare_like_with_like():
    runs = book_runs()
    assert EXPERIMENTS["moe_lm"] is moe_lm
    assert all(r in BOOK_RUNS for r in runs)
    assert len({repr(r) for r in runs}) == len(runs)
    dense = sorted({p["d_ff"] for _, p in runs if p.get("feed_forward") == "gated"})
    assert dense == [2 * 32, 4 * 32]  # k and E times the expert width
