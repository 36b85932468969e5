"""Two settings of the process that matter as much as the code: BLAS threads and freed memory.

**Threads.** NumPy's matrix products run in a BLAS library (OpenBLAS in NumPy's
wheels) that starts as many threads as the machine has cores. Splitting a
product across threads pays from small sizes up while the cores are free, and
costs several times over when another process holds one of them, since the
threads then wait for each other. :func:`threads_for` says how many to use for a
model and batch, by a rule measured with ``benchmarks/bench_threads.py``, and
:func:`blas_threads` applies it for the duration of a ``with`` block (through
``threadpoolctl``, which finds the BLAS that NumPy loaded).

**Memory.** A training step allocates arrays of a few megabytes and frees them a
moment later. glibc's allocator hands large freed blocks back to the operating
system, so the next step's arrays arrive as fresh pages, and the first touch of
every 4 KB page costs a page fault: about two thousand per step of the book's
decoder-only model. :func:`retain_freed_memory` tells glibc to keep freed memory
for reuse instead (:manpage:`mallopt(3)`); elsewhere it does nothing.

The :class:`~tinyformer.training.loop.Trainer` applies both while it trains, unless
the user has chosen: an environment variable that sets BLAS threads
(``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``) or glibc's
allocator (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TOP_PAD_``) wins, and so does ``Trainer(threads=n)``.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # a Python without it, such as the book's in-browser one (single-threaded)
    threadpool_limits = None

from tinyformer._validation import describe, positive_int

__all__ = [
    "MULTI_THREAD_MIN_FLOPS",
    "blas_threads",
    "retain_freed_memory",
    "threads_for",
    "user_thread_setting",
]

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
MALLOC_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")

MULTI_THREAD_MIN_FLOPS = 4.0e6
"""Below this many floating-point operations in a step's largest matrix product, one BLAS
thread is as fast as several (measured: see :func:`threads_for`)."""

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_applied: dict[str, bool] = {}  # what retain_freed_memory has done in this process


def user_thread_setting() -> int | None:
    """The BLAS thread count the user set in the environment, or None if they set none."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def threads_for(
    largest_matmul_flops: float, cores: int | None = None, load: float | None = None
) -> int:
    """BLAS threads for a training step whose largest matrix product costs ``largest_matmul_flops``.

    One thread below :data:`MULTI_THREAD_MIN_FLOPS`; above it, every core that other
    processes leave free (at least one). Both conditions are measured, on a 2-core
    machine with ``benchmarks/bench_threads.py``: with nothing else running, a second
    thread made a decoder-only training step 1.02x as fast at 1e6 FLOPs in its largest
    product, 1.14x at 8e6 and 1.3x to 1.7x from 3e7 up (with bit-identical results);
    with another process busy on the second core, the same steps took 1.3x to 25x as
    long with two threads as with one (the threads wait for each other's turn).

    Parameters
    ----------
    largest_matmul_flops : float
        ``2 N d_model d_ff`` for a transformer with ``N`` tokens per batch.
    cores : int, optional
        Defaults to ``os.cpu_count()``.
    load : float, optional
        How many processes compete for the cores: by default the one-minute load average
        (``os.getloadavg``), which counts the caller's own process once while it runs, so
        ``load - 1`` cores (rounded) are taken to be busy with others.
    """
    if not isinstance(largest_matmul_flops, int | float) or not largest_matmul_flops >= 0:
        raise ValueError(
            f"largest_matmul_flops must be a number >= 0, got {describe(largest_matmul_flops)}"
        )
    cores = (os.cpu_count() or 1) if cores is None else positive_int(cores, "cores")
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    elif not isinstance(load, int | float) or not load >= 0:
        raise ValueError(f"load must be a number >= 0, got {describe(load)}")
    if largest_matmul_flops < MULTI_THREAD_MIN_FLOPS:
        return 1
    others = max(0.0, float(load) - 1.0)
    return max(1, min(cores, round(cores - others)))


@contextmanager
def blas_threads(n: int | None) -> Iterator[int | None]:
    """Limit the BLAS libraries NumPy loaded to ``n`` threads inside the block (None: unchanged).

    Yields the limit (None when ``n`` is None). Without ``threadpoolctl`` (an optional
    dependency where it cannot work, such as the in-browser Python of the book's live pages)
    the block runs with the BLAS's own setting.
    """
    if n is None:
        yield None
        return
    n = positive_int(n, "n")
    if threadpool_limits is None:  # without threadpoolctl the BLAS keeps its own setting
        yield n
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield n


def retain_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse rather than return it to the system.

    Sets the trim threshold to 1 GiB, the top pad to 64 MiB and the size from which blocks
    are mapped on their own to 256 MiB, so arrays freed by one training step are
    reused by the next without page faults. Returns True if the settings were
    applied (on glibc, once per process, and only if the user set none of
    ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_``), else False.
    """
    if _applied.get("malloc"):
        return True
    if any(name in os.environ for name in MALLOC_VARIABLES):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    import ctypes  # noqa: PLC0415  (only here: not every Python has it, e.g. WebAssembly builds)

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has it
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    settings = ((_M_MMAP_THRESHOLD, 1 << 28), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 1 << 26))
    _applied["malloc"] = all(mallopt(option, value) == 1 for option, value in settings)
    return _applied["malloc"]
