"""Datasets of windows and the shuffled stream of batches whose position a checkpoint saves."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import bigram_windows

from tinyformer.training import BatchStream, WindowDataset


def test_batch_stream_draws_a_fresh_permutation_each_epoch():
    data = bigram_windows(10, 3, np.random.default_rng(0))
    stream = BatchStream(data, 3, rng=np.random.default_rng(5))
    assert stream.steps_per_epoch == 3
    epochs = [np.concatenate([stream.next_indices() for _ in range(3)]) for _ in range(2)]
    for seen in epochs:
        assert len(set(seen.tolist())) == 9  # 9 distinct of 10: the incomplete batch is dropped
    assert stream.epoch == 2
    assert not np.array_equal(epochs[0], epochs[1])


def test_batch_stream_resumes_from_its_state():
    data = bigram_windows(10, 3, np.random.default_rng(0))
    stream = BatchStream(data, 3, rng=np.random.default_rng(5))
    for _ in range(4):
        stream.next_indices()
    position, order = stream.state()
    again = BatchStream(data, 3, rng=np.random.default_rng(0))
    again.rng.bit_generator.state = stream.rng.bit_generator.state
    again.set_state(position, order)
    for _ in range(5):  # into the next epoch, which draws a permutation from the generator
        np.testing.assert_array_equal(again.next_indices(), stream.next_indices())


def test_batch_stream_and_window_dataset_reject_bad_input():
    rng = np.random.default_rng(1)
    data = bigram_windows(4, 3, rng)
    with pytest.raises(ValueError, match="batch_size must be at most the number of examples"):
        BatchStream(data, 5, rng=rng)
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        BatchStream(data, 2, rng=0)
    with pytest.raises(TypeError, match="data must have len"):
        BatchStream([1, 2, 3], 2, rng=rng)
    with pytest.raises(ValueError, match="one shape"):
        WindowDataset(np.zeros((3, 4), dtype=int), np.zeros((3, 5), dtype=int))
    with pytest.raises(ValueError, match="indices must be in"):
        data.batch(np.array([7]))
    stream = BatchStream(data, 2, rng=rng)
    with pytest.raises(ValueError, match="not a permutation"):
        stream.set_state({"epoch": 1, "offset": 2}, np.array([0, 0, 1, 2]))


def test_windows_from_a_token_stream_shift_the_targets_by_one():
    ids = np.arange(20) % 7
    data = WindowDataset.from_tokens(ids, 4)
    assert len(data) == 4  # tokens 0..16 in windows of 4 + 1, the last 3 tokens left out
    for i in range(len(data)):
        np.testing.assert_array_equal(data.inputs[i], ids[4 * i : 4 * i + 4])
        np.testing.assert_array_equal(data.targets[i], ids[4 * i + 1 : 4 * i + 5])
    overlapping = WindowDataset.from_tokens(ids, 4, stride=1)
    assert len(overlapping) == 20 - 4
    np.testing.assert_array_equal(overlapping.targets[:, :-1], overlapping.inputs[:, 1:])
    assert len(WindowDataset.from_tokens(ids[:5], 4)) == 1  # exactly seq_len + 1 tokens
    with pytest.raises(ValueError, match=r"at least seq_len \+ 1 = 5 token ids"):
        WindowDataset.from_tokens(ids[:4], 4)
    with pytest.raises(ValueError, match="ids must be a 1-D stream"):
        WindowDataset.from_tokens(ids.reshape(4, 5), 2)
    with pytest.raises(ValueError, match="stride must be a positive integer"):
        WindowDataset.from_tokens(ids, 4, stride=0)
    with pytest.raises(TypeError, match="ids must be an integer array"):
        WindowDataset.from_tokens(np.linspace(0, 1, 10), 4)
