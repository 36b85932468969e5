"""The experiments by name and the runs the book shows: every one can run as listed."""

from __future__ import annotations

import inspect

import pytest

from tinyformer.experiments import ExperimentStore, registry
from tinyformer.experiments.registry import BOOK_RUNS, EXPERIMENTS
from tinyformer.experiments.scaling import book_runs as scaling_runs


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_experiment_takes_a_seed_and_a_progress_switch_by_keyword(name):
    parameters = inspect.signature(EXPERIMENTS[name]).parameters
    assert parameters["seed"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["progress"].default is False  # the store leaves it out of the key


@pytest.mark.parametrize(("name", "params"), BOOK_RUNS)
def test_every_book_run_names_an_experiment_and_arguments_it_accepts(name, params):
    inspect.signature(EXPERIMENTS[name]).bind(**params)  # raises TypeError on a stale name
    arguments = ExperimentStore("unused").arguments(name, **params)  # defaults filled in
    assert params.items() <= arguments.items()


def test_the_book_runs_are_distinct():
    store = ExperimentStore("unused")  # computes each experiment's code digest once
    keys = [store.key(name, **params) for name, params in BOOK_RUNS]
    assert len(set(keys)) == len(keys)


def test_the_pages_runs_are_the_default_runs():
    store = ExperimentStore("unused")
    for name in ("masked_lm", "markov_lm", "in_context"):
        assert store.key(name, seed=0) in {store.key(n, **p) for n, p in BOOK_RUNS if n == name}
    assert ("in_context", {"seed": 0, "positional": "learned"}) in BOOK_RUNS


def test_the_reversal_runs_cover_every_seed_and_both_ablations():
    reversal = [p for name, p in BOOK_RUNS if name == "reversal"]
    assert {p["seed"] for p in reversal if set(p) == {"seed"}} == set(registry.REVERSAL_SEEDS)
    for change in ({"positional": "none"}, {"attention_scale": "none"}):
        ablated = [p for p in registry.REVERSAL_ABLATIONS if change.items() <= p.items()]
        assert {p["seed"] for p in ablated} == {0, 1, 2}
        assert all(p in reversal for p in ablated)
    assert registry.REVERSAL_SGD_CLAIM in reversal


def test_norm_placement_runs_pair_each_post_norm_run_with_its_pre_norm_twin():
    runs = [p for name, p in BOOK_RUNS if name == "norm_placement"]
    post = [{**p, "norm_first": True} for p in runs if not p["norm_first"]]
    pre = [p for p in runs if p["norm_first"]]
    assert sorted(map(repr, post)) == sorted(map(repr, pre))
    assert len({p["seed"] for p in runs}) >= 2


def test_the_scaling_runs_are_all_in_the_book():
    for run in scaling_runs():
        assert run in BOOK_RUNS
