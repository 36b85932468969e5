"""The experiment store: each run computed once, shared, verified, never stale or half-written."""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import threading

import numpy as np
import pytest

from tinyformer.experiments import ExperimentStore, markov_lm, reversal
from tinyformer.experiments import store as store_module

# smaller still than the shared tiny runs: these are trained many times over
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
        self.__module__, self.__qualname__ = function.__module__, function.__qualname__
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


TIMINGS = {"time", "tokens_per_second", "train_seconds", "cpu_seconds"}


def timeless(metrics):
    return {k: v for k, v in metrics.items() if k not in TIMINGS}


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


def test_a_change_to_the_code_a_run_executes_makes_it_unreachable(store, experiments, monkeypatch):
    store.run("rev")
    store.run("lm")
    old_key = store.key("rev")
    real = store_module.code_digest
    monkeypatch.setattr(
        store_module,
        "code_digest",
        lambda module: "0123456789abcdef" if module.endswith("reverse") else real(module),
    )
    fresh = ExperimentStore(store.root, experiments)  # digests are computed once per store
    assert fresh.key("rev") != old_key
    assert not fresh.contains("rev")
    assert fresh.contains("lm")  # its code did not change
    lock = next(store.folder.glob("*.lock"))
    with lock.open("a") as handle:  # another build is computing a run right now
        store_module.fcntl.flock(handle, store_module.fcntl.LOCK_EX)
        assert fresh.prune() == []
    removed = fresh.prune()
    assert {path.suffix for path in removed} == {".npz", ".json", ".lock"}
    assert all(path.name.startswith("rev-") for path in removed)
    assert fresh.contains("lm")
    fresh.run("rev")
    assert experiments["rev"].calls == 2


def test_folders_of_an_older_layout_or_numpy_are_pruned(store):
    old = store.root / "tinyformer-0123456789abcdef-numpy-1.26.0"
    old.mkdir(parents=True)
    (old / "reversal-00.json").write_text("{}")
    assert store.prune() == [old / "reversal-00.json"]
    assert not old.exists()


def test_perturbed_results_are_kept_apart(store, experiments, monkeypatch):
    monkeypatch.delenv("TINYFORMER_PERTURB", raising=False)
    store.run("rev")
    plain_folder = store.folder
    monkeypatch.setenv("TINYFORMER_PERTURB", "1")
    assert store.folder == plain_folder.with_name(plain_folder.name + "-perturbed")
    assert not store.contains("rev")
    store.run("rev")
    assert experiments["rev"].calls == 2
    assert store.prune() == []  # both are current
    monkeypatch.delenv("TINYFORMER_PERTURB")
    assert store.contains("rev")


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
    # The code digest is computed first: CPython 3.11's parser is not safe in threads at
    # once ("AST constructor recursion depth mismatch"); what this test checks is the lock.
    store.key("lm", seed=4)
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
    assert record["experiment"] == "rev"  # the store's name for it
    assert record["arguments"]["seed"] == 5
    assert record["arguments"]["d_model"] == 8
    assert record["code"] == store_module.code_digest("tinyformer.experiments.reverse")
    checkpoint = store.paths("rev", seed=5)[0]
    assert record["sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert record["numpy"] == np.__version__


def test_default_store_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYFORMER_STORE", str(tmp_path / "here"))
    assert store_module.default_store().root == tmp_path / "here"


def test_bad_requests_are_refused_with_their_names(store):
    with pytest.raises(ValueError, match=r"name must be one of the experiments \['lm', 'rev'\]"):
        store.run("nope")
    with pytest.raises(TypeError, match="experiment 'rev': got an unexpected keyword"):
        store.run("rev", colour="red")
    with pytest.raises(TypeError, match="arguments must be plain numbers"):
        store.run("rev", peak_lr=np.array([1e-3]))
    with pytest.raises(TypeError, match="root must be a str or path-like, got int"):
        ExperimentStore(3)


def test_a_run_key_names_the_function_that_computes_it(store, experiments):
    key = store.key("rev")
    store.experiments["rev"] = lambda seed=0, peak_lr=1e-3: None
    assert store.key("rev") != key


def test_the_digest_reads_the_code_a_run_imports_not_docstrings(tmp_path, monkeypatch):
    package = tmp_path / "tinyformer"
    (package / "experiments").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The package."""\n')
    (package / "experiments" / "__init__.py").write_text(
        "from tinyformer.experiments import registry\n"
    )
    layer = package / "layer.py"
    layer.write_text(
        '"""A module."""\n\n\ndef f(x):\n    """Double."""\n    return 2 * x  # twice\n'
    )
    (package / "unused.py").write_text("X = 1\n")
    (package / "experiments" / "run.py").write_text(
        "def go():\n    from tinyformer.layer import f\n\n    return f(1)\n"
    )
    (package / "experiments" / "registry.py").write_text("BOOK_RUNS = ()\n")
    monkeypatch.setattr(store_module, "_PACKAGE", package)

    def digest():
        return store_module.code_digest("tinyformer.experiments.run")

    first, whole = digest(), store_module.package_digest()
    closure = {
        p.relative_to(package).as_posix()
        for p in store_module._closure("tinyformer.experiments.run")
    }
    assert closure == {"__init__.py", "experiments/__init__.py", "experiments/run.py", "layer.py"}
    layer.write_text('"""A module, said otherwise."""\n\n\ndef f(x):\n    return 2 * x\n')
    assert digest() == first  # docstrings and comments do not count
    layer.write_text(
        '"""A module."""\n\nK = 2\n"""The factor, documented."""\n\n\ndef f(x):\n    return 2 * x\n'
    )
    with_name = digest()
    layer.write_text(
        '"""A module."""\n\nK = 2\n"""The factor, said otherwise."""\n\n\ndef f(x):\n    return 2 * x\n'
    )
    assert digest() == with_name  # nor does the docstring of a module-level name
    layer.write_text('"""A module, said otherwise."""\n\n\ndef f(x):\n    return 2 * x\n')
    (package / "unused.py").write_text("X = 2\n")
    (package / "experiments" / "registry.py").write_text("BOOK_RUNS = (('a', {}),)\n")
    assert digest() == first  # modules the run does not import do not count
    assert store_module.package_digest() != whole  # but a page that reads them runs again
    layer.write_text('"""A module."""\n\n\ndef f(x):\n    return 3 * x\n')
    assert digest() != first  # the code the run executes does
    changed = digest()
    (package / "experiments" / "run.py").write_text(
        "def go():\n    from tinyformer.unused import X\n\n    return X\n"
    )
    assert "unused.py" in {p.name for p in store_module._closure("tinyformer.experiments.run")}
    assert digest() != changed  # an edited file's imports are read again too


def test_a_file_is_parsed_once_for_each_text_it_has(tmp_path, monkeypatch):
    module = tmp_path / "module.py"
    module.write_text("import tinyformer.layers\n\nX = 1\n")
    parsed = []
    real = store_module._parse
    monkeypatch.setattr(store_module, "_parse", lambda *a: parsed.append(a[0]) or real(*a))
    first = store_module._read(module)
    assert store_module._read(module) == first  # the same text: not parsed again
    assert parsed == [module]
    module.write_text("import tinyformer.layers\n\nX = 2\n")
    assert store_module._read(module)[0] != first[0]
    assert parsed == [module, module]
    assert first[1] == {"tinyformer.layers"}
