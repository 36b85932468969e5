"""The in-context-learning run and its data: repeated random segments, head scores, digests."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyformer.data.icl import repeated_halves, repeated_segments
from tinyformer.experiments import registry
from tinyformer.experiments.cli import headline, requirement
from tinyformer.experiments.icl import (
    copy_accuracy_by_length,
    head_scores,
    in_context,
    token_losses,
    weights_digest,
)
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM

TINY = {
    "vocab_size": 8, "seq_len": 8, "min_period": 2, "d_model": 8, "n_heads": 2, "d_ff": 16,
    "n_layers": 2, "context_length": 16, "batch_size": 4, "max_steps": 6, "warmup_steps": 2,
    "n_validation": 8, "n_heldout": 16, "eval_every": 3, "dtype": "float64",
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run():
    return in_context(seed=2, **TINY)


def _model(**changes):
    config = {"vocab_size": 8, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 2}
    config.update(changes)
    return DecoderOnlyLM(
        DecoderOnlyConfig(context_length=16, **config), rng=np.random.default_rng(0)
    )


# ------------------------------------------------------------------ data
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


# --------------------------------------------------------------- measures
def test_token_losses_match_a_direct_softmax():
    model = _model(dtype="float64")
    tokens = repeated_halves(5, 4, 8, rng=np.random.default_rng(3))
    losses, correct = token_losses(model, tokens, batch_size=2)
    assert losses.shape == correct.shape == (5, 7)
    logits = model.forward(tokens[:, :-1])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = -np.log(np.take_along_axis(p, tokens[:, 1:, None], -1)[..., 0])
    np.testing.assert_allclose(losses, expected, rtol=1e-10)
    np.testing.assert_array_equal(correct, logits.argmax(-1) == tokens[:, 1:])


def test_head_scores_read_the_right_diagonals():
    """Replace the weights a head stored by a known pattern; the scores must find it."""
    model = _model(dtype="float64")
    tokens = repeated_halves(3, 5, 8, rng=np.random.default_rng(4))
    prev, induction = head_scores(model, tokens, 5)
    assert prev.shape == induction.shape == (2, 2)
    assert ((prev >= 0) & (prev <= 1)).all()
    assert ((induction >= 0) & (induction <= 1)).all()
    t = tokens.shape[1] - 1
    shift = np.eye(t, k=-1)  # query i attends to key i - 1
    shift[0, 0] = 1
    after_copy = np.eye(t, k=-4)  # query i attends to key i - L + 1
    after_copy[:4, 0] = 1
    a = np.stack([shift, after_copy])[None]  # (1, h, T, T)
    layer = model.layers[0].self_attention.layer
    original = type(model).forward
    try:
        type(model).forward = lambda self, ids: setattr(layer, "attention_weights", a)
        prev, induction = head_scores(model, tokens, 5)
    finally:
        type(model).forward = original
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
        token_losses(model, np.zeros((2, 18), dtype=np.int64))
    with pytest.raises(ValueError, match="below the vocabulary size 8"):
        token_losses(model, np.full((2, 4), 8))


def test_a_forward_pass_leaves_the_weights_digest_unchanged():
    model = _model()
    before = weights_digest(model)
    token_losses(model, repeated_halves(64, 8, 8, rng=np.random.default_rng(0)))
    assert weights_digest(model) == before
    model.parameters()[0].value[0, 0] += 1e-7
    assert weights_digest(model) != before


def test_copy_accuracy_by_length_scores_each_length():
    model = _model()
    acc = copy_accuracy_by_length(model, [2, 4, 8], n_sequences=8, rng=np.random.default_rng(0))
    assert acc.shape == (3,)
    assert ((acc >= 0) & (acc <= 1)).all()


# ------------------------------------------------------------------- run
def test_tiny_run_returns_a_complete_result(tiny_run):
    r = tiny_run
    assert r.name == "in_context"
    assert r.seed == 2
    assert not r.model.training
    assert r.config["model"]["positional"] == "sinusoidal"
    assert [row["step"] for row in r.history.eval] == [3, 6]
    m = r.metrics
    for key in ("loss_first_half", "loss_repeated_half", "induction_score", "prev_token_score"):
        assert np.isfinite(m[key]), key
    np.testing.assert_allclose(m["log_vocab"], np.log(8))
    assert m["steps"] == 6


def test_the_run_is_registered_with_a_requirement_and_a_headline(tiny_run):
    assert registry.EXPERIMENTS["in_context"] is in_context
    assert ("in_context", {"seed": 0}) in registry.BOOK_RUNS
    need, _ = requirement(tiny_run)
    assert "induction head" in need
    assert "repeat" in headline(tiny_run)


def test_the_run_is_reproducible(tiny_run):
    again = in_context(seed=2, **TINY)
    assert weights_digest(again.model) == weights_digest(tiny_run.model)
    timings = ("train_seconds", "cpu_seconds")
    untimed = {k: v for k, v in again.metrics.items() if k not in timings}
    assert untimed == {k: v for k, v in tiny_run.metrics.items() if k not in timings}
