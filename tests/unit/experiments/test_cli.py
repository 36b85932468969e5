"""``python -m tinyformer.experiments``: what it runs, what it prints, the requirements it holds."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from tinyformer.experiments import cli
from tinyformer.experiments.cli import headline, longest_first, main, requirement
from tinyformer.experiments.registry import EXPERIMENTS, TYPICAL_SECONDS


@pytest.fixture
def tiny_registry(monkeypatch, tiny):
    """Every experiment of the registry at its tiny size."""
    for name in tiny:
        monkeypatch.setitem(EXPERIMENTS, name, functools.partial(EXPERIMENTS[name], **tiny[name]))


def test_the_entry_point_prints_each_result_and_its_requirement(tiny_registry, tiny_run, capsys):
    code = main(["reversal", "markov_lm", "--seed", "2", "--no-store"])
    out = capsys.readouterr().out
    assert "reversal (seed 2)" in out
    assert "heldout_exact_match" in out
    assert "markov_lm (seed 2)" in out
    assert "excess_over_entropy_rate" in out
    assert out.count("required:") == 2
    met = [requirement(tiny_run(name, seed=2))[1] for name in ("reversal", "markov_lm")]
    assert code == int(not all(met))  # 1 if a run misses the book's requirement
    assert out.count(": met") == sum(met)
    assert out.count("NOT met") == 2 - sum(met)


def test_the_command_line_uses_the_store(tmp_path, capsys, tiny_registry):
    args = ["reversal", "--seed", "2", "--store", str(tmp_path)]
    first = main(args)
    assert main(args) == first
    out = capsys.readouterr().out
    assert out.count("reversal (seed 2)") == 2
    # The first call says what it trains before the wait; the second trains nothing.
    assert out.count("training reversal(seed=2) ...") == 1
    assert out.index("0 run(s) stored; training 1") < out.index("training reversal(seed=2) ...")
    assert out.index("training reversal(seed=2) ...") < out.index("reversal (seed 2)")
    log = (tmp_path / "log.txt").read_text()
    assert log.count("computed reversal") == 1
    assert log.count("loaded reversal") == 1  # the second call


def test_missing_trains_only_what_is_not_stored_and_loads_nothing(tmp_path, capsys, tiny_registry):
    args = ["reversal", "markov_lm", "--seed", "2", "--store", str(tmp_path)]
    main(["reversal", "--seed", "2", "--store", str(tmp_path)])  # one of the two is stored
    capsys.readouterr()
    main([*args, "--missing"])
    out = capsys.readouterr().out
    assert "1 run(s) stored; training 1" in out
    assert "markov_lm (seed 2)" in out
    assert "reversal (seed 2)" not in out  # stored: neither loaded nor printed
    main([*args, "--missing"])
    assert capsys.readouterr().out == "all 2 run(s) stored (not loaded: --missing)\n"
    log = (tmp_path / "log.txt").read_text()
    assert log.count("computed reversal") == log.count("computed markov_lm") == 1
    assert "loaded" not in log


def test_book_runs_are_held_to_their_requirement_but_not_variants(
    tmp_path, monkeypatch, capsys, tiny_registry
):
    monkeypatch.setattr(cli, "BOOK_RUNS", (("reversal", {"seed": 1, "d_ff": 8}),))
    assert main(["--book", "--store", str(tmp_path)]) == 0  # a tiny variant: no requirement
    assert "a variant of the book's reversal run: no requirement" in capsys.readouterr().out
    monkeypatch.setattr(cli, "BOOK_RUNS", (("reversal", {"seed": 1}),))
    assert main(["--book", "--store", str(tmp_path)]) == 1  # the book's run must reach 0.99
    assert "exact match >= 0.99" in capsys.readouterr().out


def test_unknown_names_and_bad_job_counts_are_refused(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["nonsense", "--store", str(tmp_path)])
    assert "unknown experiment" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reversal", "--jobs", "0", "--store", str(tmp_path)])
    assert "--jobs must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "changes", "need", "line"),
    [
        ("reversal", {}, "held-out greedy exact match >= 0.99", "greedy exact match"),
        ("markov_lm", {}, "held-out loss within 3% of H", "against the entropy rate"),
        ("in_context", {}, "below a fifth of the first half's", "induction score"),
        ("masked_lm", {}, "within 35% of the exact optimum", "masked-token loss"),
        ("scaling", {}, "no held-out window among the training windows", "above H"),
        ("norm_placement", {}, None, "held-out loss"),
        ("norm_placement", {"seed": 1, "peak_lr": 1e4}, None, "diverged at step"),
    ],
)
def test_each_experiment_has_its_requirement_and_headline(tiny_run, name, changes, need, line):
    with np.errstate(over="ignore", invalid="ignore"):  # the diverging run overflows
        result = tiny_run(name, **{"seed": 2, **changes})
    rule = requirement(result)
    if need is None:
        assert rule is None  # the book reports what this run shows, whatever it is
    else:
        text, ok = rule
        assert need in text
        assert isinstance(ok, bool)
    assert line in headline(result)


def test_the_requirements_judge_the_numbers(tiny_run):
    result = tiny_run("markov_lm", seed=2)

    def judged(excess):
        changed = {**result.metrics, "excess_over_entropy_rate": excess}
        return requirement(dataclasses.replace(result, metrics=changed))

    assert judged(0.029)[1] is True
    assert judged(0.031) == ("held-out loss within 3% of H, got +3.10%", False)


def test_the_pool_starts_the_longest_runs_first_and_keeps_each_experiments_order():
    runs = [("scaling", {"seed": 0}), ("real_text", {"seed": 0}), ("scaling", {"seed": 1}),
            ("in_context", {"seed": 0}), ("unheard_of", {})]  # fmt: skip
    assert longest_first(runs) == [
        ("unheard_of", {}),  # no typical time known: counted as long
        ("real_text", {"seed": 0}),
        ("in_context", {"seed": 0}),
        ("scaling", {"seed": 0}),
        ("scaling", {"seed": 1}),
    ]


def test_every_experiment_has_a_typical_time():
    assert set(TYPICAL_SECONDS) == set(EXPERIMENTS)
    assert all(seconds > 0 for seconds in TYPICAL_SECONDS.values())
