"""The parity run: the produced-token loss, greedy answers, and a short run that learns."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.data.scratchpad import bit_strings, final_answers, parity_rows
from tinyformer.experiments.registry import BOOK_RUNS
from tinyformer.experiments.scratchpad import (
    IGNORED,
    ProducedTokens,
    answer_correct,
    book_runs,
    parity,
    produced_loss,
)
from tinyformer.losses import cross_entropy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM


def _model(**changes):
    config = {"vocab_size": 3, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2}
    config.update(changes)
    return DecoderOnlyLM(
        DecoderOnlyConfig(context_length=32, dtype="float64", **config),
        rng=np.random.default_rng(0),
    )


def test_produced_tokens_ignore_every_target_before_the_answer():
    rows, produced = parity_rows(np.array([[1, 0, 1]]), scratchpad=True)
    data = ProducedTokens(rows, produced)
    inputs, targets = data.batch(np.array([0]))
    assert inputs.tolist() == [rows[0, :-1].tolist()]
    assert targets.tolist() == [[IGNORED] * 3 + rows[0, 4:].tolist()]


def test_produced_loss_is_the_cross_entropy_of_the_produced_tokens_alone():
    model = _model()
    rows, produced = parity_rows(bit_strings(8, 5, rng=np.random.default_rng(1)), scratchpad=True)
    inputs, targets = ProducedTokens(rows, produced).batch(np.arange(8))
    logits = model.forward(inputs)
    counted = targets != IGNORED
    expected = cross_entropy(logits[counted], targets[counted])[0]
    result = produced_loss(model, (inputs, targets), backward=False)
    assert result.loss == pytest.approx(expected, rel=1e-12)
    assert result.n_tokens == counted.sum() == 8 * 7
    changed = targets.copy()
    changed[~counted] = 0  # another target at an ignored position changes nothing
    assert (
        produced_loss(model, (inputs, np.where(counted, targets, IGNORED)), backward=False).loss
        == result.loss
    )
    assert produced_loss(model, (inputs, changed), backward=False).loss != result.loss


def test_produced_loss_gradient_is_that_of_the_produced_tokens_alone():
    """Reference: the cross-entropy gradient of the counted logits, zero at every other one."""
    model = _model()
    rows, produced = parity_rows(bit_strings(8, 5, rng=np.random.default_rng(1)), scratchpad=True)
    inputs, targets = ProducedTokens(rows, produced).batch(np.arange(8))
    counted = targets != IGNORED

    def gradients(loss_and_backward):
        model.zero_grad()
        loss_and_backward()
        return [p.grad.copy() for p in model.parameters()]

    def reference():
        logits = model.forward(inputs)  # (B, T, V)
        grad = np.zeros_like(logits)
        grad[counted] = cross_entropy(logits[counted], targets[counted])[1]
        model.backward(grad)

    produced_grads = gradients(lambda: produced_loss(model, (inputs, targets)))
    for got, expected in zip(produced_grads, gradients(reference), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)
    counted_too = np.where(counted, targets, 0)  # the ignored positions counted, with target 0
    other = gradients(lambda: produced_loss(model, (inputs, counted_too)))
    assert any(not np.allclose(a, b) for a, b in zip(produced_grads, other, strict=True))


def test_parity_refuses_a_context_too_short_for_its_rows_before_drawing_anything():
    with pytest.raises(ValueError, match="context_length must be at least 82"):
        parity(n_bits=40, scratchpad=True, context_length=64)
    with pytest.raises(ValueError, match="context_length must be at least 41"):
        parity(n_bits=40, scratchpad=False, context_length=40)


def test_answer_correct_scores_the_same_continuation_as_a_plain_argmax_loop():
    """Greedy generation (cached) against re-running the whole prefix and taking the argmax."""
    bits = bit_strings(40, 4, rng=np.random.default_rng(2))
    for scratchpad in (False, True):
        model = _model(n_layers=1)
        rows, produced = parity_rows(bits, scratchpad=scratchpad)
        written = rows[:, :5]  # bits and separator: the prompt
        for _ in range(int(produced[0].sum())):
            step = model.forward(written)[:, -1].argmax(axis=-1)  # (N,)
            written = np.concatenate([written, step[:, None]], axis=1)
        answers = final_answers(written[:, 5:], 4, scratchpad=scratchpad)
        expected = answers == rows[:, -1]
        assert np.array_equal(answer_correct(model, bits, scratchpad=scratchpad), expected)
        assert not expected.all()  # an untrained model gets no free pass


def test_a_short_scratchpad_run_learns_parity_of_eight_bits_on_held_out_strings():
    """The whole pipeline, small: answers generated on strings never trained on, near perfect."""
    result = parity(
        seed=1,
        n_bits=8,
        scratchpad=True,
        context_length=20,
        max_steps=1000,  # at 600 steps one run scored 0.86: mid-way through its jump
        warmup_steps=20,
        n_heldout=64,
        n_validation=16,
        eval_every=500,
    )
    assert result.metrics["answer_accuracy"] >= 0.9  # chance is 0.5
    assert result.config["task"] == {"n_bits": 8, "scratchpad": True}
    assert len(result.history.column("answer_accuracy", "eval")) == 2


def test_the_book_runs_pair_each_direct_run_with_a_scratchpad_run():
    runs = book_runs()
    assert len(runs) <= 6
    direct = {p["seed"] for _, p in runs if not p["scratchpad"]}
    assert direct == {p["seed"] for _, p in runs if p["scratchpad"]}
    assert all(run in BOOK_RUNS for run in runs)
