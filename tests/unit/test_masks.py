"""Mask builders: the True-means-attend convention and its combinations."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    sliding_window_mask,
    strided_mask,
)


def test_causal_mask_is_lower_triangular():
    np.testing.assert_array_equal(causal_mask(4), np.tril(np.ones((4, 4), bool)))


def test_causal_mask_with_more_keys_aligns_queries_to_the_end():
    mask = causal_mask(2, 5)
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_padding_mask_hides_pad_keys():
    ids = np.array([[5, 6, 0, 0], [7, 0, 0, 0]])
    mask = padding_mask(ids, pad_id=0)
    assert mask.shape == (2, 1, 4)
    np.testing.assert_array_equal(mask[:, 0], [[1, 1, 0, 0], [1, 0, 0, 0]])


def test_sliding_window_keeps_the_most_recent_positions():
    mask = sliding_window_mask(5, 2)
    assert mask.sum(axis=1).tolist() == [1, 2, 2, 2, 2]
    assert mask[4, 3]
    assert mask[4, 4]
    assert not mask[4, 2]
    both = sliding_window_mask(5, 2, causal=False)
    np.testing.assert_array_equal(both, both.T)
    assert both[2].tolist() == [False, True, True, True, False]


def test_strided_mask_is_local_plus_every_stride_th_key():
    mask = strided_mask(9, 3)
    assert np.flatnonzero(mask[8]).tolist() == [2, 5, 6, 7, 8]
    assert not np.triu(mask, 1).any()
    assert (strided_mask(64, 8).sum(axis=1) <= 2 * 8).all()


def test_combine_is_intersection_with_broadcasting():
    ids = np.array([[1, 2, 0]])
    mask = combine_masks(causal_mask(3), padding_mask(ids, 0), None)
    assert mask.shape == (1, 3, 3)
    np.testing.assert_array_equal(mask[0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert combine_masks() is None
    assert combine_masks(None) is None


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: causal_mask(0), ValueError, "n_queries must be a positive"),
        (lambda: causal_mask(3, 2), ValueError, "n_keys must be at least n_queries"),
        (lambda: causal_mask(True), TypeError, "n_queries"),
        (lambda: padding_mask(np.array([[1.0, 0.0]]), 0), TypeError, "ids must be an integer"),
        (lambda: padding_mask(np.array([1, 0]), 0), ValueError, "ids must have shape (B, T)"),
        (lambda: padding_mask(np.array([[1, -1]]), 0), ValueError, "non-negative"),
        (lambda: padding_mask(np.array([[1, 0]]), "0"), TypeError, "pad_id must be an integer"),
        (lambda: sliding_window_mask(4, 0), ValueError, "window must be a positive"),
        (lambda: strided_mask(4, -2), ValueError, "stride must be a positive"),
        (lambda: combine_masks(np.ones((2, 2))), TypeError, "masks[0] must be a boolean"),
        (
            lambda: combine_masks(np.ones((2, 3), bool), np.ones((4, 3), bool)),
            ValueError,
            "must broadcast together",
        ),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


@pytest.mark.parametrize(("seq_len", "stride"), [(9, 3), (16, 4), (17, 4), (30, 7), (5, 1)])
def test_two_strided_layers_connect_every_earlier_position(seq_len, stride):
    mask = strided_mask(seq_len, stride).astype(int)
    assert mask.any(axis=1).all()  # every query attends to something
    two_layers = (mask @ mask) > 0
    np.testing.assert_array_equal(two_layers, causal_mask(seq_len))


def test_two_sliding_window_layers_reach_only_twice_the_window():
    mask = sliding_window_mask(12, 3).astype(int)
    two_layers = (mask @ mask) > 0
    np.testing.assert_array_equal(two_layers, sliding_window_mask(12, 5))
