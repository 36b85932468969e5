"""What the benchmarks share: one child process per BLAS setting, and alternating timings.

BLAS reads its thread count (and OpenBLAS its kernel choice) when NumPy loads, so
each setting runs the benchmark script again as a child with ``--child`` and the
environment fixed. The child prints one JSON line of settings
(:func:`blas_settings`: NumPy's BLAS, the kernels it chose, its threads), then
one JSON line per timed row; :func:`run_setting` collects them. Inside a child,
:func:`time_side_by_side` times two contenders: in alternation at one thread, so
slow phases of a shared machine fall on both, and one after the other at more
threads, so that neither runs while the other's idle threads still hold a core.
Nothing here imports PyTorch or tinyformer, so a child may run any version of
tinyformer (``bench_versions.py`` puts a source tree on ``PYTHONPATH``).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

try:
    from threadpoolctl import threadpool_info
except ImportError:  # optional: without it the settings come from OpenBLAS itself
    threadpool_info = None


def cpuinfo(field: str) -> str:
    """The first value of ``field`` in /proc/cpuinfo (Linux), or an empty string."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return ""


def _openblas_library() -> ctypes.CDLL | None:
    """NumPy's OpenBLAS, found among the loaded libraries (Linux), or None."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    paths = sorted({ln.split()[-1] for ln in maps if "openblas" in ln.lower() and "/" in ln})
    return ctypes.CDLL(paths[0]) if paths else None


def _openblas_call(lib: ctypes.CDLL | None, stem: str) -> str:
    """Call ``openblas_<stem>`` under any of its exported spellings."""
    if lib is None:
        return "unknown"
    for name in (f"scipy_openblas_{stem}64_", f"openblas_{stem}64_", f"openblas_{stem}"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p if "thread" not in stem else ctypes.c_int
            value = fn()
            return value.decode() if isinstance(value, bytes) else str(value)
    return "unknown"


def blas_settings() -> dict[str, str]:
    """What this process runs on: NumPy, its BLAS, the kernels that BLAS chose and its threads."""
    info: dict[str, str] = {"python": platform.python_version(), "numpy": np.__version__}
    if threadpool_info is not None:
        for pool in threadpool_info():
            key = f"threadpoolctl {pool.get('internal_api')} ({Path(pool['filepath']).name})"
            info[key] = (
                f"version {pool.get('version')}, threads {pool.get('num_threads')},"
                f" architecture {pool.get('architecture')}"
            )
    else:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        lib = _openblas_library()
        info["numpy BLAS (np.show_config)"] = f"{blas['name']} {blas['version']}"
        info["OpenBLAS config"] = _openblas_call(lib, "get_config")
        info["OpenBLAS kernels in use (core name)"] = _openblas_call(lib, "get_corename")
        info["OpenBLAS threads"] = _openblas_call(lib, "get_num_threads")
    for var in ("OPENBLAS_CORETYPE", *THREAD_VARIABLES):
        info[var] = os.environ.get(var, "(unset)")
    return info


def time_alternately(
    first: Callable[[], object],
    second: Callable[[], object],
    repeats: int,
    *,
    collect_each: bool = False,
) -> tuple[list[float], list[float]]:
    """Seconds of ``repeats`` calls of each, swapping which runs first every repeat.

    With ``collect_each`` the garbage collector runs before every call, otherwise
    once before the loop.
    """
    gc.collect()
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(repeats):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            if collect_each:
                gc.collect()
            start = time.perf_counter()
            (first, second)[i]()
            times[i].append(time.perf_counter() - start)
    return times


# Seconds to wait between two contenders' blocks of calls at more than one thread: long
# enough for the idle worker threads of the first (OpenMP's and OpenBLAS's spin before
# they sleep) to have gone to sleep.
PAUSE_BETWEEN_BLOCKS = 0.5


def time_side_by_side(
    first: Callable[[], object],
    second: Callable[[], object],
    repeats: int,
    *,
    threads: int,
    collect_each: bool = False,
) -> tuple[list[float], list[float]]:
    """Seconds of ``repeats`` calls of each, as fairly as ``threads`` allows.

    At one thread the calls alternate (:func:`time_alternately`). With more,
    each library's worker threads keep spinning for a while after its last
    parallel call, and alternating calls would time the two thread pools
    fighting over the cores: on a 2-core machine that made each library up to
    twice as slow as it is alone (PyTorch's OpenMP pool against OpenBLAS's
    threads, measured both ways). So each contender then runs all its calls
    in one block, after a warm-up call and a pause in which the other's
    threads go to sleep.
    """
    if threads == 1:
        return time_alternately(first, second, repeats, collect_each=collect_each)
    times: tuple[list[float], list[float]] = ([], [])
    for function, seconds in zip((first, second), times, strict=True):
        time.sleep(PAUSE_BETWEEN_BLOCKS)
        function()  # warm-up: wakes this contender's threads
        gc.collect()
        for _ in range(repeats):
            if collect_each:
                gc.collect()
            start = time.perf_counter()
            function()
            seconds.append(time.perf_counter() - start)
    return times


def run_setting(
    script: str,
    child_args: Sequence[str],
    *,
    threads: int,
    coretype: str | None = None,
    label: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    show_settings: bool = True,
) -> list[dict]:
    """Run ``script --child *child_args`` with ``threads`` BLAS threads; return its rows.

    ``OPENBLAS_CORETYPE`` is set to ``coretype``, or removed so that OpenBLAS
    chooses its kernels itself; ``extra_env`` adds or replaces variables (such
    as ``PYTHONPATH``). The child's settings are printed under ``label``
    (unless ``show_settings`` is false); a child that fails is reported (with
    its signal or last line of error output) and gives no rows.
    """
    label = label or f"threads={threads}"
    env = child_env(threads, coretype)
    env.update(extra_env or {})
    command = [sys.executable, script, "--child", *child_args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if done.returncode < 0:
            reason = f"stopped by {signal.Signals(-done.returncode).name}"
        else:
            reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        print(f"\nSetting failed ({label}): {reason}")
        return []
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if show_settings:
        print(f"\nSettings: {label}")
        for key, value in lines[0]["settings"].items():
            print(f"  {key}: {value}")
    return lines[1:]


def child_env(threads: int, coretype: str | None = None) -> dict[str, str]:
    """The environment of a child: ``threads`` BLAS threads, ``OPENBLAS_CORETYPE`` set or removed."""
    env = dict(os.environ, **dict.fromkeys(THREAD_VARIABLES, str(threads)))
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def matmul_peak(dtype_name: str, repeats: int = 9) -> float:
    """GFLOP/s of NumPy's 1024 x 1024 x 1024 matrix product: this machine's practical peak."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1024, 1024)).astype(dtype_name) for _ in range(2))
    a @ b  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    return 2 * 1024**3 / float(np.median(seconds)) / 1e9


def run_or_profile(
    script: str, child_args: Sequence[str], *, threads: int, profile: str | None
) -> list[dict]:
    """:func:`run_setting`, or with ``profile`` the child's profile printed straight to the terminal."""
    if not profile:
        return run_setting(script, child_args, threads=threads)
    command = [sys.executable, script, "--child", *child_args, "--profile", profile]
    subprocess.run(command, env=child_env(threads), check=True)
    return []
