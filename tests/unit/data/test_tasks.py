"""Toy sequence tasks: their rules, vocabulary, sampling and held-out splits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.data.tasks import SequenceTask
from tinyformer.data.tokenizers import N_SPECIAL


@pytest.fixture(scope="module")
def reversal_split():
    task = SequenceTask("reverse", n_symbols=10, min_len=1, max_len=8)
    return task.split(1000, rng=np.random.default_rng(4))


@pytest.mark.parametrize(
    ("name", "source", "target"),
    [("copy", "30712", "30712"), ("reverse", "30712", "21703"), ("sort", "30712", "01237")],
)
def test_rules(name, source, target):
    task = SequenceTask(name)
    tok = task.tokenizer
    assert tok.decode(task.target(tok.encode(source))) == target


def test_vocabulary_is_specials_then_symbols():
    task = SequenceTask(n_symbols=12)
    assert task.vocab_size == N_SPECIAL + 12
    assert "".join(task.tokenizer.tokens[N_SPECIAL:]) == "0123456789AB"


def test_random_sources_cover_every_length_and_symbol(rng):
    task = SequenceTask("copy", n_symbols=10, min_len=2, max_len=6)
    sources = task.random_sources(2000, rng)
    assert {len(s) for s in sources} == set(range(2, 7))
    ids = np.concatenate(sources)
    assert set(ids.tolist()) == set(range(N_SPECIAL, N_SPECIAL + 10))
    counts = np.bincount([len(s) for s in sources])[2:]
    assert counts.min() > 300  # lengths are uniform: about 400 each


def test_sampling_is_reproducible():
    task = SequenceTask("sort")
    a = task.sample(50, np.random.default_rng(7))
    b = task.sample(50, np.random.default_rng(7))
    for (sa, ta), (sb, tb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(sa, sb)
        np.testing.assert_array_equal(ta, tb)


def test_count_of_distinct_sources():
    task = SequenceTask(n_symbols=10, min_len=1, max_len=8)
    assert task.n_sources() == sum(10**n for n in range(1, 9))
    assert task.n_sources(3) == 1000


def test_heldout_set_has_1000_distinct_sources_over_lengths_1_to_8(reversal_split):
    heldout = reversal_split.heldout
    sources = {tuple(s.tolist()) for s, _ in heldout}
    assert len(heldout) == len(sources) == 1000
    per_length = reversal_split.per_length
    assert sum(per_length.values()) == 1000
    assert set(per_length) == set(range(1, 9))
    for length, count in per_length.items():
        assert count == sum(len(s) == length for s in sources)
        assert count <= 0.1 * 10**length  # no length gives up more than a tenth
    assert per_length[1] >= 1
    for s, t in heldout:
        np.testing.assert_array_equal(t, s[::-1])


def test_training_pairs_never_contain_a_heldout_source(reversal_split):
    held = {tuple(s.tolist()) for s, _ in reversal_split.heldout}
    train = reversal_split.sample_train(20000, np.random.default_rng(5))
    assert len(train) == 20000
    seen = {tuple(s.tolist()) for s, _ in train}
    assert not seen & held
    # the short lengths are exhausted: every non-held-out source of length 1 and 2 occurs
    for length in (1, 2):
        everything = set(itertools.product(range(N_SPECIAL, N_SPECIAL + 10), repeat=length))
        assert {s for s in seen if len(s) == length} == everything - held


@given(st.integers(0, 2**32 - 1), st.integers(2, 4), st.integers(1, 15))
def test_split_partitions_a_small_space(seed, n_symbols, n_heldout):
    task = SequenceTask("copy", n_symbols=n_symbols, min_len=1, max_len=4)
    rng = np.random.default_rng(seed)
    split = task.split(n_heldout, rng=rng, max_fraction=0.5)
    held = {tuple(s.tolist()) for s, _ in split.heldout}
    assert len(held) == n_heldout
    train = {tuple(s.tolist()) for s in split.train_sources(300, rng)}
    assert not train & held
    assert all(split.is_heldout(np.array(s)) for s in held)
    assert not any(split.is_heldout(np.array(s)) for s in train)


def test_split_is_reproducible():
    task = SequenceTask("reverse")
    a = task.split(100, rng=np.random.default_rng(1))
    b = task.split(100, rng=np.random.default_rng(1))
    assert [s.tolist() for s, _ in a.heldout] == [s.tolist() for s, _ in b.heldout]


def _task_split():
    return SequenceTask("copy", n_symbols=3, max_len=2).split(
        1, rng=np.random.default_rng(0), max_fraction=0.5
    )


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: SequenceTask("rotate"), ValueError, "name must be one of"),
        (lambda: SequenceTask(n_symbols=0), ValueError, "n_symbols must be a positive"),
        (lambda: SequenceTask(n_symbols=63), ValueError, "n_symbols must be at most 62"),
        (lambda: SequenceTask(min_len=5, max_len=3), ValueError, "max_len must be at least"),
        (lambda: SequenceTask(max_len=2.5), TypeError, "max_len"),
        (
            lambda: SequenceTask(max_len=3).split(200, rng=np.random.default_rng(0)),
            ValueError,
            "n_heldout must be at most 111",
        ),
        (
            lambda: SequenceTask().split(10, rng=np.random.default_rng(0), max_fraction=0.7),
            ValueError,
            "max_fraction must be in (0, 0.5]",
        ),
        (
            lambda: SequenceTask().split(10, rng=0),
            TypeError,
            "rng must be a numpy.random.Generator",
        ),
        (lambda: SequenceTask().random_sources(0, np.random.default_rng(0)), ValueError, "n must"),
        (lambda: SequenceTask().target(np.array([4, 14])), ValueError, "symbol ids in [4, 14)"),
        (
            lambda: SequenceTask(max_len=3).target(np.array([4] * 4)),
            ValueError,
            "length in [1, 3]",
        ),
        (lambda: SequenceTask().target(np.array([4.0])), TypeError, "source must be an integer"),
        (lambda: _task_split().is_heldout(np.array([9])), ValueError, "symbol ids in [4, 7)"),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
