"""Timing on a shared machine: processor time, calls taking turns, medians and their spread.

A wall clock counts the moments another program held the processor; on a machine
shared with other work it can read several times what the computation used.
:func:`per_call` therefore measures *processor time* (``time.process_time``)
and, beside it, the wall clock, so that a page can say how far the two parted.
:func:`timed_rounds` lets the calls being compared take turns, one sample each per
round: a disturbance then spoils one sample of each call instead of every sample
of one. A conclusion about time is drawn from the median over the rounds and must
clear their :func:`spread`, the interquartile range.

Processor time adds up the time of every thread of the process, so a call that
runs its matrix products on several BLAS threads reads as more than its wall-clock
time. The book's timings that compare one layer with another set one BLAS thread
first (``OPENBLAS_NUM_THREADS=1`` before NumPy is imported, or
:func:`tinyformer.runtime.blas_threads`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tinyformer._validation import describe, positive_float, positive_int

__all__ = ["per_call", "spread", "timed_rounds"]


def per_call(f: Callable[[], object], min_seconds: float = 2e-3) -> tuple[float, float]:
    """Processor and wall-clock seconds per call of ``f()``.

    ``f`` is called 1, 2, 4, ... times in a row until the batch of calls used at
    least ``min_seconds`` of processor time; the batch's times are divided by its
    number of calls. Short calls are thereby timed over many repetitions, where the
    clock's resolution and the cost of reading it no longer matter.

    Returns
    -------
    (float, float)
        Processor seconds and wall-clock seconds per call.
    """
    if not callable(f):
        raise TypeError(f"f must be a function of no arguments, got {describe(f)}")
    min_seconds = positive_float(min_seconds, "min_seconds")
    calls = 1
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            f()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if cpu >= min_seconds:
            return cpu / calls, wall / calls
        calls *= 2


def timed_rounds(
    *functions: Callable[[], object], repeats: int = 9, min_seconds: float = 2e-3
) -> tuple[np.ndarray, np.ndarray]:
    """Time several calls taking turns: one :func:`per_call` sample of each per round.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Processor and wall-clock seconds per call, each of shape
        ``(repeats, len(functions))``: row ``r`` holds round ``r``, column ``j``
        the ``j``-th function.
    """
    if not functions:
        raise ValueError("timed_rounds needs at least one function to time, got none")
    for j, f in enumerate(functions):
        if not callable(f):
            raise TypeError(
                f"functions[{j}] must be a function of no arguments, got {describe(f)}"
            )
    repeats = positive_int(repeats, "repeats")
    samples = np.array(
        [[per_call(f, min_seconds) for f in functions] for _ in range(repeats)], dtype=np.float64
    )  # (repeats, n_functions, 2)
    return samples[..., 0], samples[..., 1]


def spread(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Interquartile range of ``values`` along ``axis`` (the rounds): a timing's margin.

    Wider than the uncertainty of a median of the rounds, and not inflated by the one
    round in which another program took the processor, as the full range would be.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or values.shape[axis] < 2:
        raise ValueError(
            f"values must hold at least two rounds along axis {axis}, got shape {values.shape}"
        )
    if not np.all(np.isfinite(values)):
        raise ValueError("values must be finite, got NaN or infinity")
    low, high = np.percentile(values, [25, 75], axis=axis)
    return high - low
