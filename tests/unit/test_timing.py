"""Tests of tinyformer.timing: what is measured, in which order, and the margin."""

import itertools

import numpy as np
import pytest

from tinyformer.timing import per_call, spread, timed_rounds


def busy(n=2000):
    """A little work that uses processor time."""
    return sum(i * i for i in range(n))


def test_per_call_repeats_until_the_minimum_is_reached():
    calls = []

    def f():
        calls.append(1)
        busy()

    cpu, wall = per_call(f, min_seconds=5e-3)
    n = len(calls)
    # 1 + 2 + 4 + ... calls: the batch sizes double, so the total is one less than a power of two
    assert n >= 1
    assert (n + 1) & n == 0
    assert cpu > 0
    assert wall > 0
    # the last batch (of (n + 1) / 2 calls) used at least min_seconds of processor time
    assert cpu * (n + 1) / 2 >= 5e-3 * (1 - 1e-9)


def test_a_longer_call_takes_longer():
    (cpu_short, cpu_long), _ = (
        np.median(a, axis=0)
        for a in timed_rounds(lambda: busy(1000), lambda: busy(20000), repeats=3)
    )
    assert cpu_long > 5 * cpu_short  # twenty times the work


def test_timed_rounds_takes_turns_and_has_the_documented_shape():
    order = []
    functions = [lambda j=j: (order.append(j), busy())[1] for j in range(3)]
    cpu, wall = timed_rounds(*functions, repeats=2, min_seconds=1e-4)
    assert cpu.shape == wall.shape == (2, 3)
    # each per_call sample is a contiguous run of one function; the runs go 0, 1, 2, 0, 1, 2
    runs = [order[0]] + [b for a, b in itertools.pairwise(order) if a != b]
    assert runs == [0, 1, 2, 0, 1, 2]


def test_spread_is_the_interquartile_range():
    values = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [100.0, 50.0]])
    np.testing.assert_allclose(spread(values), [2.0, 20.0])
    np.testing.assert_allclose(spread(values.T, axis=1), [2.0, 20.0])


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: per_call(3), TypeError, "f must be a function"),
        (lambda: per_call(busy, min_seconds=0), ValueError, "min_seconds"),
        (timed_rounds, ValueError, "at least one function"),
        (lambda: timed_rounds(busy, None), TypeError, r"functions\[1\]"),
        (lambda: timed_rounds(busy, repeats=0), ValueError, "repeats"),
        (lambda: spread(np.ones(1)), ValueError, "at least two rounds"),
        (lambda: spread(np.array([1.0, np.nan])), ValueError, "finite"),
    ],
)
def test_bad_input_is_named(call, error, text):
    with pytest.raises(error, match=text):
        call()
