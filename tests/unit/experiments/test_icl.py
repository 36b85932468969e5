"""The in-context-learning run: head scores, copying accuracy, and the run's result."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.data.icl import repeated_halves
from tinyformer.diagnostics import parameter_fingerprint
from tinyformer.experiments.icl import copy_accuracy_by_length, head_scores, in_context
from tinyformer.experiments.recipe import token_losses
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM


def _model(**changes):
    config = {"vocab_size": 8, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 2}
    config.update(changes)
    return DecoderOnlyLM(
        DecoderOnlyConfig(context_length=16, **config), rng=np.random.default_rng(0)
    )


# --------------------------------------------------------------- measures
def test_head_scores_average_the_stored_attention_diagonals():
    model = _model(dtype="float64")
    tokens = repeated_halves(3, 5, 8, rng=np.random.default_rng(4))
    prev, induction = head_scores(model, tokens, 5)
    assert prev.shape == induction.shape == (2, 2)
    for layer, block in enumerate(model.decoder.layers):
        a = block.self_attention.layer.attention_weights  # (B, h, T, T), T = 9
        for head in range(2):
            below = [a[:, head, t, t - 1] for t in range(1, 9)]
            after_copy = [a[:, head, t, t - 4] for t in range(5, 9)]  # t - L + 1, t >= L
            assert prev[layer, head] == pytest.approx(np.mean(below), rel=1e-12)
            assert induction[layer, head] == pytest.approx(np.mean(after_copy), rel=1e-12)


def test_head_scores_find_a_known_pattern(monkeypatch):
    """Replace the weights a head stored by a known pattern; the scores must find it."""
    model = _model(dtype="float64")
    tokens = repeated_halves(3, 5, 8, rng=np.random.default_rng(4))
    t = tokens.shape[1] - 1
    shift = np.eye(t, k=-1)  # query i attends to key i - 1
    shift[0, 0] = 1
    after_copy = np.eye(t, k=-4)  # query i attends to key i - L + 1
    after_copy[:4, 0] = 1
    a = np.stack([shift, after_copy])[None]  # (1, h, T, T)
    model.forward(tokens[:, :-1])  # every layer stores its weights; the first is then replaced
    layer = model.decoder.layers[0].self_attention.layer
    monkeypatch.setattr(model, "forward", lambda ids: setattr(layer, "attention_weights", a))
    prev, induction = head_scores(model, tokens, 5)
    assert prev[0, 0] == 1
    assert induction[0, 1] == 1
    assert prev[0, 1] < 1
    assert induction[0, 0] < 1


def test_head_scores_refuse_a_period_the_rows_cannot_hold():
    model = _model()
    tokens = repeated_halves(2, 4, 8, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="period must be below T - 1 = 7"):
        head_scores(model, tokens, 7)


def test_rows_longer_than_the_context_are_refused():
    model = _model()
    with pytest.raises(ValueError, match="context_length \\+ 1 = 17"):
        head_scores(model, np.zeros((2, 18), dtype=np.int64), 4)
    with pytest.raises(ValueError, match="below the vocabulary size 8"):
        head_scores(model, np.full((2, 4), 8), 1)


def test_copy_accuracy_by_length_is_the_greedy_accuracy_on_each_repeat():
    model = _model()
    accuracy = copy_accuracy_by_length(
        model, [2, 4, 8], n_sequences=8, rng=np.random.default_rng(0)
    )
    rng = np.random.default_rng(0)  # the same rows, drawn again in the same order
    for half, got in zip([2, 4, 8], accuracy, strict=True):
        rows = repeated_halves(8, half, 8, rng=rng)
        logits = model.forward(rows[:, :-1])  # (N, 2L-1, V)
        right = logits.argmax(-1) == rows[:, 1:]
        assert got == right[:, half:].mean()  # tokens L+1 .. 2L-1


# ------------------------------------------------------------------- run
def test_tiny_run_reports_the_heldout_measures_of_its_model(tiny_run):
    r = tiny_run("in_context", seed=2)
    assert r.name == "in_context"
    assert r.seed == 2
    assert not r.model.training
    assert r.config["model"]["positional"] == "sinusoidal"
    assert r.config["model"]["context_length"] == 16
    assert r.config["task"] == {"vocab_size": 8, "seq_len": 8, "min_period": 2}
    assert [row["step"] for row in r.history.eval] == [3, 6]
    m = r.metrics
    assert m["steps"] == 6
    assert m["log_vocab"] == np.log(8)
    heldout = repeated_halves(16, 4, 8, rng=np.random.default_rng([2, 3]))  # the run's stream
    losses, correct = token_losses(r.model, heldout[:, :-1], heldout[:, 1:])
    assert m["loss_first_half"] == losses[:, :3].mean()
    assert m["loss_repeated_half"] == losses[:, 4:].mean()
    assert m["accuracy_repeated_half"] == correct[:, 4:].mean()
    prev, induction = head_scores(r.model, heldout, 4)
    assert m["prev_token_score"] == prev[0].max()
    assert m["induction_score"] == induction[-1].max()


def test_training_rows_never_pass_the_trained_length(tiny, tiny_run):
    """The learned-position variant: rows of seq_len tokens leave later positions untrained."""
    learned = tiny_run("in_context", seed=2, positional="learned")
    table = learned.model.decoder.positions.weight.value  # (context_length, d_model)
    untrained = DecoderOnlyLM(
        DecoderOnlyConfig(**learned.config["model"]), rng=np.random.default_rng([2, 4])
    ).decoder.positions.weight.value
    seq_len = tiny["in_context"]["seq_len"]
    assert not np.allclose(table[:seq_len], untrained[:seq_len])
    # AdamW's weight decay shrinks every row; the unread rows change by nothing else
    ratio = table[seq_len:] / untrained[seq_len:]
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-12)


def test_the_run_is_reproducible(tiny, tiny_run):
    again = in_context(seed=2, **tiny["in_context"])
    first = tiny_run("in_context", seed=2)
    assert parameter_fingerprint(again.model) == parameter_fingerprint(first.model)
    timings = ("train_seconds", "cpu_seconds")
    untimed = {k: v for k, v in again.metrics.items() if k not in timings}
    assert untimed == {k: v for k, v in first.metrics.items() if k not in timings}
