"""Padded batches of (source, target) pairs, their masks, and datasets of pairs."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.attention import scaled_dot_product_attention
from tinyformer.data.batching import PairDataset, make_batch, pad_sequences, teacher_forcing
from tinyformer.data.tasks import SequenceTask
from tinyformer.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from tinyformer.masks import causal_mask, padding_mask


@pytest.fixture(scope="module")
def reversal_split():
    task = SequenceTask("reverse", n_symbols=10, min_len=1, max_len=8)
    return task.split(1000, rng=np.random.default_rng(4))


def test_teacher_forcing_shifts_by_one():
    decoder_input, labels = teacher_forcing(np.array([7, 8, 9]))
    assert decoder_input.tolist() == [BOS_ID, 7, 8, 9]
    assert labels.tolist() == [7, 8, 9, EOS_ID]


def test_batch_arrays_and_masks():
    sources = [np.array([5, 6, 7]), np.array([8])]
    targets = [np.array([7, 6, 5]), np.array([8])]
    batch = make_batch(sources, targets)
    assert batch.source_ids.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert batch.decoder_input_ids.tolist() == [[BOS_ID, 7, 6, 5], [BOS_ID, 8, PAD_ID, PAD_ID]]
    assert batch.target_ids.tolist() == [[7, 6, 5, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.loss_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert batch.n_target_tokens == 6
    assert batch.batch_size == 2
    assert batch.source_mask.shape == (2, 1, 3)
    np.testing.assert_array_equal(batch.source_mask, padding_mask(batch.source_ids, PAD_ID))
    assert batch.decoder_mask.shape == (2, 4, 4)
    np.testing.assert_array_equal(batch.decoder_mask[0], causal_mask(4))
    expected = causal_mask(4) & np.array([True, True, False, False])
    np.testing.assert_array_equal(batch.decoder_mask[1], expected)
    # teacher forcing: the input at t + 1 is the label at t, wherever both are real tokens
    real = batch.loss_mask[:, :-1] & (batch.decoder_input_ids[:, 1:] != PAD_ID)
    assert (batch.decoder_input_ids[:, 1:][real] == batch.target_ids[:, :-1][real]).all()


def test_masks_broadcast_in_attention_and_hide_padding(rng, reversal_split):
    batch = reversal_split.heldout.batch(np.arange(0, 1000, 97))
    b, s = batch.source_ids.shape
    t = batch.decoder_input_ids.shape[1]
    enc = rng.standard_normal((b, s, 4))
    dec = rng.standard_normal((b, t, 4))
    _, w_self = scaled_dot_product_attention(enc, enc, enc, batch.source_mask)
    _, w_cross = scaled_dot_product_attention(dec, enc, enc, batch.source_mask)
    _, w_dec = scaled_dot_product_attention(dec, dec, dec, batch.decoder_mask)
    pad_keys = batch.source_ids == PAD_ID  # (B, S)
    assert (w_self.transpose(0, 2, 1)[pad_keys] == 0).all()
    assert (w_cross.transpose(0, 2, 1)[pad_keys] == 0).all()
    assert (np.triu(w_dec, 1) == 0).all()
    np.testing.assert_allclose(w_dec.sum(-1), 1.0)  # no query row is fully masked


def test_batches_visit_every_pair_once(rng):
    data = SequenceTask("copy").sample(53, rng)
    seen = []
    for batch in data.batches(10, rng=rng):
        seen += [tuple(row[row != PAD_ID].tolist()) for row in batch.source_ids]
    assert sorted(seen) == sorted(tuple(s.tolist()) for s, _ in data)
    assert [b.batch_size for b in data.batches(10)] == [10] * 5 + [3]
    assert [b.batch_size for b in data.batches(10, drop_last=True)] == [10] * 5
    first = next(data.batches(10)).source_ids
    np.testing.assert_array_equal(first, data.batch(np.arange(10)).source_ids)


def test_shuffled_order_depends_only_on_the_seed():
    data = SequenceTask("copy").sample(40, np.random.default_rng(0))
    runs = [
        [b.source_ids.tolist() for b in data.batches(8, rng=np.random.default_rng(9))]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != [b.source_ids.tolist() for b in data.batches(8)]


def test_pad_sequences_to_a_fixed_length():
    out = pad_sequences([np.array([4, 5]), np.array([6])], length=4)
    assert out.tolist() == [[4, 5, 0, 0], [6, 0, 0, 0]]
    assert out.dtype == np.int64


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: make_batch([np.array([4])], []), ValueError, "1 sources and 0 targets"),
        (
            lambda: make_batch([np.array([4, 0])], [np.array([4])]),
            ValueError,
            "sources[0] contains the padding id",
        ),
        (
            lambda: make_batch([np.array([4])], [np.array([], int)]),
            ValueError,
            "targets[0] must be a non-empty",
        ),
        (lambda: pad_sequences([]), ValueError, "at least one sequence"),
        (
            lambda: pad_sequences([np.array([4, 5])], length=1),
            ValueError,
            "length must be at least",
        ),
        (lambda: pad_sequences(np.array([[4]])), TypeError, "sequences must be a list"),
        (lambda: PairDataset([], []), ValueError, "at least one pair"),
        (
            lambda: SequenceTask().sample(3, np.random.default_rng(0)).batch([5]),
            ValueError,
            "indices must be in [0, 3)",
        ),
        (
            lambda: SequenceTask().sample(3, np.random.default_rng(0)).batch([]),
            ValueError,
            "non-empty",
        ),
        (
            lambda: next(SequenceTask().sample(3, np.random.default_rng(0)).batches(0)),
            ValueError,
            "batch_size",
        ),
        (lambda: teacher_forcing(np.array([4]), bos_id=-1), ValueError, "bos_id"),
        (
            lambda: make_batch([np.array([4])], [np.array([4])], bos_id=0),
            ValueError,
            "pad_id must differ",
        ),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
