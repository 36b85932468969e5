"""The experiment store: each run computed once, shared, verified, never stale or half-written."""

from __future__ import annotations

import functools
import json
import multiprocessing
import threading

import numpy as np
import pytest

from tinyformer.experiments import ExperimentStore, markov_lm, reversal
from tinyformer.experiments import store as store_module
from tinyformer.experiments.cli import main

TINY_REVERSAL = {
    "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "batch_size": 8,
    "max_steps": 4, "warmup_steps": 1, "n_train": 60, "n_validation": 8, "eval_every": 2,
}  # fmt: skip
TINY_MARKOV = {
    "vocab_size": 5, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1,
    "context_length": 8, "batch_size": 4, "max_steps": 4, "warmup_steps": 1,
    "n_train_windows": 16, "n_validation_windows": 4, "n_heldout_windows": 8, "eval_every": 2,
}  # fmt: skip


class Counting:
    """A tiny experiment that counts how often it really trains."""

    def __init__(self, function, **fixed):
        self.function = functools.partial(function, **fixed)
        self.__signature__ = __import__("inspect").signature(self.function)
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, **params):
        with self.lock:
            self.calls += 1
        return self.function(**params)


@pytest.fixture
def experiments():
    return {"rev": Counting(reversal, **TINY_REVERSAL), "lm": Counting(markov_lm, **TINY_MARKOV)}


@pytest.fixture
def store(tmp_path, experiments):
    return ExperimentStore(tmp_path / "store", experiments)


def log_actions(store):
    lines = (store.root / "log.txt").read_text().splitlines()
    return [line.split()[3] for line in lines]


TIMINGS = {"time", "tokens_per_second", "train_seconds"}


def timeless(metrics):
    return {k: v for k, v in metrics.items() if k != "train_seconds"}


def assert_same_result(a, b, *, same_run=False):
    """Equal in everything; in timings too when both come from the same stored run."""
    assert (a.name, a.seed, a.config, timeless(a.metrics)) == (
        b.name, b.seed, b.config, timeless(b.metrics),
    )  # fmt: skip
    rows = [{k: v for k, v in row.items() if k not in TIMINGS} for row in a.history.train]
    assert rows == [{k: v for k, v in row.items() if k not in TIMINGS} for row in b.history.train]
    assert a.history.eval == b.history.eval
    if same_run:
        assert (a.metrics, a.wall_time) == (b.metrics, b.wall_time)
        assert a.history.to_dict() == b.history.to_dict()
    for (name, x), (_, y) in zip(
        sorted(a.model.state_dict().items()), sorted(b.model.state_dict().items()), strict=True
    ):
        np.testing.assert_array_equal(x, y, err_msg=name)


def test_a_run_is_computed_once_then_loaded(store, experiments):
    first = store.run("rev", seed=1)
    second = store.run("rev", seed=1)
    assert experiments["rev"].calls == 1
    assert log_actions(store) == ["computed", "loaded"]
    assert_same_result(first, second, same_run=True)
    assert not first.model.training  # results come back in evaluation mode


def test_the_stored_model_is_the_trained_model(store, experiments):
    stored = store.run("lm", seed=2)
    fresh = experiments["lm"].function(seed=2)
    assert timeless(stored.metrics) == timeless(fresh.metrics)
    for name, value in fresh.model.state_dict().items():
        np.testing.assert_array_equal(stored.model.state_dict()[name], value)


def test_defaults_are_part_of_the_key_and_other_arguments_are_other_runs(store, experiments):
    assert store.key("rev") == store.key("rev", seed=0)
    assert store.key("rev", seed=0) != store.key("rev", seed=1)
    assert store.key("rev", seed=0) != store.key("lm", seed=0)
    assert store.key("rev", peak_lr=1e-3) != store.key("rev")
    assert store.key("rev", progress=True) == store.key("rev")  # progress does not change a result
    store.run("rev")
    store.run("rev", seed=0)
    assert experiments["rev"].calls == 1


def test_a_change_to_the_package_makes_every_result_unreachable(store, experiments, monkeypatch):
    store.run("rev")
    old_folder = store.folder
    monkeypatch.setattr(store_module, "source_digest", lambda: "0123456789abcdef")
    assert store.folder != old_folder
    assert not store.contains("rev")
    store.run("rev")
    assert experiments["rev"].calls == 2
    lock = next(old_folder.glob("*.lock"))
    with lock.open("a") as handle:  # another build is computing a run in the old folder
        store_module.fcntl.flock(handle, store_module.fcntl.LOCK_EX)
        assert store.prune() == []
    assert store.prune() == [old_folder]
    assert not old_folder.exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "manifest"])
def test_a_damaged_result_is_discarded_and_computed_again(store, experiments, damage):
    first = store.run("rev", seed=3)
    checkpoint, manifest = store.paths("rev", seed=3)
    data = bytearray(checkpoint.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        checkpoint.write_bytes(bytes(data))
    elif damage == "truncate":
        checkpoint.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "empty":
        checkpoint.write_bytes(b"")
    else:
        manifest.write_text("{not json")
    again = store.run("rev", seed=3)
    assert experiments["rev"].calls == 2
    assert log_actions(store) == ["computed", "discarded", "computed"]
    assert "corrupted" in (store.root / "log.txt").read_text()
    assert_same_result(first, again)  # the run is deterministic: recomputing gives it back
    store.run("rev", seed=3)
    assert log_actions(store)[-1] == "loaded"


def test_an_interrupted_run_leaves_nothing_behind(tmp_path):
    def broken(seed=0, progress=False):
        raise KeyboardInterrupt

    store = ExperimentStore(tmp_path, {"broken": broken})
    with pytest.raises(KeyboardInterrupt):
        store.run("broken")
    assert sorted(p.suffix for p in store.folder.iterdir()) == [".lock"]
    assert not store.contains("broken")


def test_a_checkpoint_without_its_manifest_is_computed_again(store, experiments):
    store.run("rev")
    store.paths("rev")[1].unlink()  # as if the process died between the two files
    store.run("rev")
    assert experiments["rev"].calls == 2
    assert log_actions(store) == ["computed", "discarded", "computed"]


def test_two_workers_asking_at_once_train_the_run_once(store, experiments):
    results = []
    workers = [
        threading.Thread(target=lambda: results.append(store.run("lm", seed=4))) for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert experiments["lm"].calls == 1
    assert sorted(log_actions(store)) == ["computed", "loaded", "loaded"]
    assert_same_result(results[0], results[2], same_run=True)


def test_two_processes_asking_at_once_train_the_run_once(tmp_path):
    # spawned processes (as Sphinx's parallel workers are separate processes): the store and
    # its experiment travel by pickling, so the experiment is a plain partial here
    store = ExperimentStore(tmp_path, {"lm": functools.partial(markov_lm, **TINY_MARKOV)})
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=store.run, args=("lm",), kwargs={"seed": 6}) for _ in "ab"]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert sorted(log_actions(store)) == ["computed", "loaded"]


def test_the_manifest_records_what_was_run(store):
    store.run("rev", seed=5)
    record = json.loads(store.paths("rev", seed=5)[1].read_text())
    assert record["experiment"] == "reversal"
    assert record["arguments"]["seed"] == 5
    assert record["arguments"]["d_model"] == 8
    assert record["package"] == store_module.source_digest()
    assert len(record["sha256"]) == 64


def test_default_store_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYFORMER_STORE", str(tmp_path / "here"))
    assert store_module.default_store().root == tmp_path / "here"


def test_the_command_line_uses_the_store(tmp_path, monkeypatch, capsys, experiments):
    from tinyformer.experiments import registry  # noqa: PLC0415

    for name, function in experiments.items():
        monkeypatch.setitem(registry.EXPERIMENTS, name, function)
    args = ["rev", "--seed", "2", "--store", str(tmp_path)]
    assert main(args) in (0, 1)  # a tiny model need not meet the book's requirement
    assert main(args) in (0, 1)
    out = capsys.readouterr().out
    assert out.count("reversal (seed 2)") == 2
    assert experiments["rev"].calls == 1
    # The first call says what it trains before the wait; the second trains nothing.
    assert out.count("training rev(seed=2) ...") == 1
    assert out.index("0 run(s) stored; training 1") < out.index("training rev(seed=2) ...")
    assert out.index("training rev(seed=2) ...") < out.index("reversal (seed 2)")
    with pytest.raises(SystemExit):
        main(["nonsense", "--store", str(tmp_path)])
    assert "unknown experiment" in capsys.readouterr().err


def test_the_command_line_holds_book_runs_to_their_requirement_but_not_variants(
    tmp_path, monkeypatch, capsys, experiments
):
    from tinyformer.experiments import cli, registry  # noqa: PLC0415

    monkeypatch.setitem(registry.EXPERIMENTS, "reversal", experiments["rev"])
    monkeypatch.setattr(cli, "BOOK_RUNS", (("reversal", {"seed": 1, "d_ff": 8}),))
    assert main(["--book", "--store", str(tmp_path)]) == 0  # a tiny variant: no requirement
    assert "a variant of the book's reversal run: no requirement" in capsys.readouterr().out
    monkeypatch.setattr(cli, "BOOK_RUNS", (("reversal", {"seed": 1}),))
    assert main(["--book", "--store", str(tmp_path)]) == 1  # the book's run must reach 0.99
    assert "exact match >= 0.99" in capsys.readouterr().out


def test_bad_requests_are_refused_with_their_names(store):
    with pytest.raises(ValueError, match=r"name must be one of the experiments \['lm', 'rev'\]"):
        store.run("nope")
    with pytest.raises(TypeError, match="experiment 'rev': got an unexpected keyword"):
        store.run("rev", colour="red")
    with pytest.raises(TypeError, match="arguments must be plain numbers"):
        store.run("rev", peak_lr=np.array([1e-3]))
    with pytest.raises(TypeError, match="root must be a str or path-like, got int"):
        ExperimentStore(3)
