"""Process settings for training: BLAS threads chosen for the work, and freed memory kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from tinyformer import runtime
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.optim import SGD
from tinyformer.runtime import MULTI_THREAD_MIN_FLOPS, blas_threads, threads_for
from tinyformer.training import Trainer, WindowDataset, lm_loss


def _blas_threads_now() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_threads_for_uses_one_thread_below_the_measured_threshold_and_free_cores_above():
    assert threads_for(0.0, 8, load=0.0) == 1
    assert threads_for(MULTI_THREAD_MIN_FLOPS * 0.99, 8, load=0.0) == 1
    assert threads_for(MULTI_THREAD_MIN_FLOPS, 8, load=0.0) == 8
    assert threads_for(1e15, 2, load=1.0) == 2  # the load of the caller's own process
    assert threads_for(1e15, 2, load=2.1) == 1  # another process holds the second core
    assert threads_for(1e15, 8, load=4.0) == 5
    assert threads_for(1e15, 8, load=30.0) == 1
    assert threads_for(1e15, 3) in {1, 2, 3}  # with the machine's own load average
    with pytest.raises(ValueError, match="largest_matmul_flops must be a number >= 0"):
        threads_for(-1.0)
    with pytest.raises(ValueError, match="largest_matmul_flops"):
        threads_for(float("nan"))
    with pytest.raises(ValueError, match="cores"):
        threads_for(1.0, 0)
    with pytest.raises(ValueError, match="load must be a number >= 0"):
        threads_for(1.0, 2, load=-1.0)


def test_blas_threads_limits_blas_inside_the_block_and_restores_it():
    before = _blas_threads_now()
    with blas_threads(1) as n:
        assert n == 1
        assert _blas_threads_now() == {1}
    assert _blas_threads_now() == before
    with blas_threads(None) as n:
        assert n is None
        assert _blas_threads_now() == before
    with pytest.raises(ValueError, match="n must be a positive integer"), blas_threads(0):
        pass


def test_user_thread_setting_reads_the_environment(monkeypatch):
    for name in runtime.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert runtime.user_thread_setting() is None
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert runtime.user_thread_setting() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the first variable set wins, in a fixed order
    assert runtime.user_thread_setting() == 2


def _lm_trainer(d_model: int, d_ff: int, context: int, batch: int, **options) -> Trainer:
    rng = np.random.default_rng(0)
    config = DecoderOnlyConfig(
        vocab_size=8, d_model=d_model, n_heads=2, d_ff=d_ff, n_layers=1, context_length=context
    )
    model = DecoderOnlyLM(config, rng=rng)
    tokens = rng.integers(0, 8, (batch, context + 1))
    data = WindowDataset(tokens[:, :-1], tokens[:, 1:])
    optimizer = SGD(model.parameters(), 0.1)
    return Trainer(model, optimizer, lm_loss, data, batch_size=batch, rng=rng, **options)


def test_trainer_chooses_threads_by_the_rule_unless_told(monkeypatch):
    for name in runtime.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    small = _lm_trainer(8, 16, 4, 2)
    assert small.blas_thread_count() == 1  # 2 * 2 * 4 * 8 * 16 FLOPs: far below the threshold
    wide = _lm_trainer(64, 256, 32, 8)  # 2 * 8 * 32 * 64 * 256 = 8.4e6
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert wide.blas_thread_count() == threads_for(8.4e6, load=0.2) == (os.cpu_count() or 1)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert wide.blas_thread_count() == 1
    assert _lm_trainer(8, 16, 4, 2, threads=3).blas_thread_count() == 3
    assert _lm_trainer(8, 16, 4, 2, threads=None).blas_thread_count() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert small.blas_thread_count() is None  # the user's own setting wins
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        _lm_trainer(8, 16, 4, 2, threads=0)


def test_fit_runs_under_the_chosen_thread_count_and_restores_it(monkeypatch):
    for name in runtime.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    trainer = _lm_trainer(8, 16, 4, 2)
    seen = []
    step = trainer.train_step

    def watched_step():
        seen.append(_blas_threads_now())
        return step()

    monkeypatch.setattr(trainer, "train_step", watched_step)
    before = _blas_threads_now()
    trainer.fit(max_steps=2)
    assert seen == [{1}, {1}]
    assert _blas_threads_now() == before


_FAULTS = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from tinyformer.runtime import retain_freed_memory
    if sys.argv[1] == "retain":
        assert retain_freed_memory() and retain_freed_memory()  # applied, then already applied
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    def one_step():  # arrays of 1 to 8 MB alive together, then all freed, as in a training step
        kept = [np.ones(1 << k) for k in (17, 18, 19, 20, 19, 18)]
        del kept
    for _ in range(3):
        one_step()
    start = faults()
    for _ in range(20):
        one_step()
    print((faults() - start) / 20)
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")
def test_retain_freed_memory_stops_the_page_faults_of_reallocated_arrays():
    def faults_per_round(mode: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
        )
        return float(done.stdout.strip())

    returned, kept = faults_per_round("default"), faults_per_round("retain")
    assert returned > 1000  # 4 KB pages: 24 MB arrive fresh every round
    assert kept < returned / 50


def test_retain_freed_memory_leaves_a_users_allocator_settings_alone(monkeypatch):
    monkeypatch.setattr(runtime, "_applied", {})
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert runtime.retain_freed_memory() is False
    assert runtime._applied == {}
