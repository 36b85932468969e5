"""Rows that repeat a random segment: the data of the in-context-learning run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyformer.data.icl import repeated_halves, repeated_segments


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 5),
    length=st.integers(2, 20),
    vocab=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_every_row_repeats_its_segment_with_its_period(n, length, vocab, seed, data):
    low = data.draw(st.integers(1, length))
    high = data.draw(st.integers(low, length))
    tokens, periods = repeated_segments(
        n, length, vocab, min_period=low, max_period=high, rng=np.random.default_rng(seed)
    )
    assert tokens.shape == (n, length)
    assert periods.shape == (n,)
    assert ((low <= periods) & (periods <= high)).all()
    assert tokens.min() >= 0
    assert tokens.max() < vocab
    for row, period in zip(tokens, periods, strict=True):
        np.testing.assert_array_equal(row[period:], row[:-period])


def test_periods_and_tokens_are_uniform():
    tokens, periods = repeated_segments(
        6000, 12, 5, min_period=2, max_period=5, rng=np.random.default_rng(3)
    )
    np.testing.assert_allclose(np.bincount(periods)[2:] / 6000, 0.25, atol=0.02)
    assert np.bincount(periods, minlength=6)[:2].sum() == 0
    first = tokens[:, :2]  # inside every row's first segment
    np.testing.assert_allclose(np.bincount(first.ravel()) / first.size, 0.2, atol=0.01)


def test_repeated_halves_repeat_the_first_half_and_are_reproducible():
    a = repeated_halves(50, 6, 10, rng=np.random.default_rng(1))
    b = repeated_halves(50, 6, 10, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (50, 12)
    np.testing.assert_array_equal(a[:, 6:], a[:, :6])
    assert len({tuple(row) for row in a}) == 50  # fresh tokens in every row


def test_first_halves_are_uniform_tokens():
    a = repeated_halves(4000, 8, 4, rng=np.random.default_rng(0))
    counts = np.bincount(a[:, :8].ravel(), minlength=4) / a[:, :8].size
    np.testing.assert_allclose(counts, 0.25, atol=0.01)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_period": 0, "max_period": 2}, "min_period must be a positive integer"),
        ({"min_period": 3, "max_period": 2}, "min_period <= max_period <= length"),
        ({"min_period": 1, "max_period": 9}, "max_period=9, length=8"),
    ],
)
def test_bad_periods_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        repeated_segments(2, 8, 5, rng=np.random.default_rng(0), **kwargs)


def test_bad_rng_and_sizes_are_named():
    with pytest.raises(TypeError, match="rng"):
        repeated_halves(2, 4, 5, rng=0)
    with pytest.raises(ValueError, match="half_length"):
        repeated_halves(2, 0, 5, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="vocab_size"):
        repeated_halves(2, 3, 0, rng=np.random.default_rng(0))
