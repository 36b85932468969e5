"""The per-batch objectives: loss, gradient and accuracy of each model family's batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from small_models import BigramConfig, BigramLM, bigram_windows, encoder_decoder

from tinyformer.data import make_batch
from tinyformer.losses import cross_entropy
from tinyformer.training import StepResult, lm_loss, seq2seq_loss


def test_seq2seq_loss_counts_only_real_tokens_and_matches_cross_entropy():
    model = encoder_decoder(0, n_decoder_layers=1)
    sources = [np.array([4, 5, 6]), np.array([7]), np.array([8, 4])]
    targets = [np.array([6, 5, 4]), np.array([7]), np.array([4, 8])]
    batch = make_batch(sources, targets)
    result = seq2seq_loss(model, batch, backward=False)
    assert result.n_tokens == batch.n_target_tokens == 4 + 2 + 3
    logits = model.forward(
        batch.source_ids,
        batch.decoder_input_ids,
        source_mask=batch.source_mask,
        decoder_mask=batch.decoder_mask,
    )
    expected, grad = cross_entropy(logits, batch.target_ids, ignore_index=0)
    assert result.loss == pytest.approx(expected, rel=1e-12)
    correct = (logits.argmax(-1) == batch.target_ids) & batch.loss_mask
    assert result.n_correct == int(correct.sum())
    assert all(np.all(p.grad == 0) for p in model.parameters())  # backward=False
    seq2seq_loss(model, batch)
    with_objective = {name: p.grad.copy() for name, p in model.named_parameters()}
    model.zero_grad()
    model.forward(
        batch.source_ids,
        batch.decoder_input_ids,
        source_mask=batch.source_mask,
        decoder_mask=batch.decoder_mask,
    )
    model.backward(grad)  # the objective's gradient is the cross-entropy's
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(with_objective[name], p.grad, err_msg=name)


def test_lm_loss_and_label_smoothing():
    rng = np.random.default_rng(0)
    model = BigramLM(BigramConfig(), rng=rng)
    batch = bigram_windows(4, 5, rng).batch(np.arange(4))
    plain = lm_loss(model, batch, backward=False)
    smooth = lm_loss(model, batch, label_smoothing=0.2, backward=False)
    logits = model.forward(batch[0])
    assert plain.loss == pytest.approx(cross_entropy(logits, batch[1])[0], rel=1e-12)
    assert smooth.loss == pytest.approx(
        cross_entropy(logits, batch[1], label_smoothing=0.2)[0], rel=1e-12
    )
    assert smooth.loss != plain.loss
    assert plain.n_tokens == 20
    assert plain.n_correct == int((logits.argmax(-1) == batch[1]).sum())
    assert plain.accuracy == plain.n_correct / 20


def test_objective_returns_nan_without_backward_when_logits_are_not_finite():
    rng = np.random.default_rng(1)
    model = BigramLM(BigramConfig(), rng=rng)
    model.head.weight.value[0, 0] = np.nan
    batch = bigram_windows(2, 3, rng).batch(np.arange(2))
    result = lm_loss(model, batch)
    assert math.isnan(result.loss)
    assert all(np.all(p.grad == 0) for p in model.parameters())


def test_objectives_reject_bad_batches():
    model = BigramLM(BigramConfig(), rng=np.random.default_rng(2))
    with pytest.raises(TypeError, match="batch must be a pair"):
        lm_loss(model, np.zeros((2, 3), dtype=int))
    with pytest.raises(ValueError, match="one shape"):
        lm_loss(model, (np.zeros((2, 3), dtype=int), np.zeros((2, 4), dtype=int)))
    with pytest.raises(TypeError, match="integer array"):
        lm_loss(model, (np.zeros((2, 3)), np.zeros((2, 3), dtype=int)))
    with pytest.raises(TypeError, match=r"tinyformer\.data\.Batch"):
        seq2seq_loss(model, (np.zeros((2, 3), dtype=int),) * 2)


def test_step_result_accuracy_of_an_empty_batch_is_zero():
    assert StepResult(0.0, 0, 0).accuracy == 0.0
    assert StepResult(1.0, 4, 3).accuracy == 0.75
