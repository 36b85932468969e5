"""The shared recipe: optimizer and schedule, seeded model and batches, the record, token losses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer.data.masking import MaskingScheme, MLMDataset
from tinyformer.diagnostics import parameter_fingerprint
from tinyformer.experiments.recipe import (
    FAMILIES,
    Recipe,
    initial_model,
    perturbed,
    token_losses,
)
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    EncoderOnlyMLM,
)
from tinyformer.optim import AdamW
from tinyformer.training import WindowDataset, lm_loss
from tinyformer.training.batches import BatchStream
from tinyformer.training.mlm import mlm_loss

SIZE = {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "context_length": 6}


def _windows(seed=0, n=12, vocab=7):
    rng = np.random.default_rng(seed)
    return WindowDataset(rng.integers(0, vocab, (n, 6)), rng.integers(0, vocab, (n, 6)))


def _recipe(**changes):
    settings = {"seed": 3, "peak_lr": 0.1, "warmup_steps": 4, "max_steps": 20, "batch_size": 4}
    return Recipe(**{**settings, **changes})


def _decoder(**changes):
    return DecoderOnlyLM(
        DecoderOnlyConfig(vocab_size=7, **SIZE, **{"dtype": "float64", **changes}),
        rng=np.random.default_rng(1),
    )


# ------------------------------------------------------------------ optimizer
@pytest.mark.parametrize("warmup", [0, 4])
def test_the_optimizer_is_adamw_warming_up_then_decaying_to_a_twentieth(warmup):
    optimizer = _recipe(warmup_steps=warmup).optimizer(_decoder())
    assert isinstance(optimizer, AdamW)
    assert optimizer.hyperparameters()["betas"] == (0.9, 0.98)
    assert optimizer.hyperparameters()["weight_decay"] == 0.01
    steps = np.arange(1, 21)
    rates = np.array([optimizer.schedule(t) for t in steps])
    cosine = 0.005 + 0.095 * 0.5 * (1 + np.cos(np.pi * (steps - warmup) / (20 - warmup)))
    want = np.where(steps < warmup, 0.1 * steps / max(warmup, 1), cosine)
    np.testing.assert_allclose(rates, want, rtol=1e-14)
    assert rates.max() == pytest.approx(0.1 if warmup else cosine[0], rel=1e-14)
    assert rates[-1] == pytest.approx(0.1 / 20, rel=1e-14)  # peak_lr / 20 at max_steps


# ------------------------------------------------------------------- trainer
def _mlm_windows():
    return MLMDataset(_windows().inputs, MaskingScheme(7, 7), rng=np.random.default_rng(0))


@pytest.mark.parametrize(
    ("config", "model_class", "objective", "make_data"),
    [
        (DecoderOnlyConfig(vocab_size=7, **SIZE, dtype="float64"), DecoderOnlyLM, lm_loss,
         _windows),
        (EncoderOnlyConfig(vocab_size=8, **SIZE, dtype="float64"), EncoderOnlyMLM, mlm_loss,
         _mlm_windows),
    ],
)  # fmt: skip
def test_the_trainer_draws_the_family_model_from_seed_4_and_batches_from_seed_5(
    config, model_class, objective, make_data
):
    trainer = _recipe().trainer(config, make_data(), clip_norm=0.5, log_every=3)
    assert FAMILIES[type(config)] == (model_class, objective)
    assert type(trainer.model) is model_class
    assert trainer.objective is objective
    assert (trainer.clip_norm, trainer.log_every) == (0.5, 3)  # the options reach the Trainer
    by_hand = model_class(config, rng=np.random.default_rng([3, 4]))
    assert parameter_fingerprint(trainer.model) == parameter_fingerprint(by_hand)
    assert [id(p) for p in trainer.optimizer.parameters] == [
        id(p) for p in trainer.model.parameters()
    ]
    order = BatchStream(make_data(), 4, rng=np.random.default_rng([3, 5]))
    for _ in range(4):  # more than one epoch of 12 windows
        np.testing.assert_array_equal(trainer.stream.next_indices(), order.next_indices())


def test_the_trainer_fine_tunes_a_given_model_optimizing_only_its_trainable_parameters():
    config = DecoderOnlyConfig(vocab_size=7, **SIZE, dtype="float64")
    model = DecoderOnlyLM(config, rng=np.random.default_rng(11))
    model.output.freeze()
    before = parameter_fingerprint(model)
    trainer = _recipe().trainer(config, _windows(), model=model)
    assert trainer.model is model
    assert parameter_fingerprint(trainer.model) == before  # not re-initialized
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert [id(p) for p in trainer.optimizer.parameters] == trainable
    assert len(trainable) < len(model.parameters())
    with pytest.raises(TypeError, match="model must be a DecoderOnlyLM for DecoderOnlyConfig"):
        _recipe().trainer(config, _windows(), model=object())


def test_the_trainer_refuses_a_family_it_has_no_objective_for():
    config = EncoderDecoderConfig(
        7, 7, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, n_decoder_layers=1
    )
    with pytest.raises(TypeError, match=r"config must be one of .*DecoderOnlyConfig"):
        _recipe().trainer(config, _windows())


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"max_steps": 0}, ValueError, "max_steps must be a positive integer, got 0"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be a positive integer"),
        ({"max_steps": True}, TypeError, "max_steps must be a positive integer"),
    ],
)
def test_the_recipe_checks_its_step_and_batch_numbers(changes, error, match):
    with pytest.raises(error, match=match):
        _recipe(**changes)


# -------------------------------------------------------------------- record
def test_the_result_adds_what_every_run_reports():
    recipe = _recipe(max_steps=5)
    config = DecoderOnlyConfig(vocab_size=7, **SIZE, dtype="float64")
    trainer = recipe.trainer(config, _windows(), log_every=2)
    trainer.fit(recipe.max_steps)
    result = recipe.result("probe", trainer, {"score": 0.5}, {"task": {"n": 12}})
    assert (result.name, result.seed) == ("probe", 3)
    assert result.model is trainer.model
    assert result.history is trainer.history
    m = result.metrics
    assert list(m) == ["score", "steps", "train_seconds", "cpu_seconds"]
    assert m["score"] == 0.5
    assert m["steps"] == 5.0
    assert isinstance(m["steps"], float)
    assert m["train_seconds"] == trainer.history.train[-1]["time"] > 0
    assert m["cpu_seconds"] > 0
    assert result.wall_time >= m["train_seconds"]
    assert result.config == {
        "model": config.to_dict(),
        "batch_size": 4,
        "max_steps": 5,
        "peak_lr": 0.1,
        "warmup_steps": 4,
        "task": {"n": 12},
    }
    assert list(result.config)[:5] == [
        "model",
        "batch_size",
        "max_steps",
        "peak_lr",
        "warmup_steps",
    ]


def test_a_run_stopped_before_its_first_history_row_has_no_train_seconds():
    recipe = _recipe()
    trainer = recipe.trainer(DecoderOnlyConfig(vocab_size=7, **SIZE), _windows(), log_every=10)
    trainer.train_step()  # one update, not logged
    result = recipe.result("probe", trainer, {}, {})
    assert result.metrics["steps"] == 1.0
    assert math.isnan(result.metrics["train_seconds"])


# -------------------------------------------------------------- token losses
def _direct(model, inputs, targets):
    """Cross-entropy from an explicit softmax of one forward pass over all rows."""
    logits = model.forward(inputs).astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    losses = -np.log(np.take_along_axis(p, targets[..., None], -1)[..., 0])
    return losses, logits.argmax(-1) == targets


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_token_losses_match_an_explicit_softmax_for_both_families(dtype):
    rng = np.random.default_rng(2)
    inputs, targets = rng.integers(0, 7, (5, 6)), rng.integers(0, 7, (5, 6))
    models = [
        _decoder(dtype=dtype),
        EncoderOnlyMLM(EncoderOnlyConfig(vocab_size=7, **SIZE, dtype=dtype),
                       rng=np.random.default_rng(1)),
    ]  # fmt: skip
    for model in models:
        losses, correct = token_losses(model, inputs, targets, batch_size=2)  # three batches
        assert losses.dtype == np.float64
        want, want_correct = _direct(model, inputs, targets)
        np.testing.assert_allclose(losses, want, rtol=1e-12 if dtype == "float64" else 1e-6)
        np.testing.assert_array_equal(correct, want_correct)
        assert correct.any()  # the check above compares something


def test_token_losses_read_each_row_on_its_own():
    """A row's losses do not depend on the other rows of its batch (same batch shape)."""
    model = _decoder()
    rng = np.random.default_rng(4)
    inputs, targets = rng.integers(0, 7, (4, 6)), rng.integers(0, 7, (4, 6))
    other = inputs.copy()
    other[1:] = rng.integers(0, 7, (3, 6))
    first, _ = token_losses(model, inputs, targets)
    again, _ = token_losses(model, other, targets)
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.array_equal(first[1:], again[1:])


def test_token_losses_leave_the_weights_unchanged():
    model = _decoder()
    before = parameter_fingerprint(model)
    rng = np.random.default_rng(5)
    token_losses(model, rng.integers(0, 7, (9, 6)), rng.integers(0, 7, (9, 6)), batch_size=4)
    assert parameter_fingerprint(model) == before
    model.parameters()[0].value[0, 0] += 1e-7  # the fingerprint does see a change
    assert parameter_fingerprint(model) != before


@pytest.mark.parametrize(
    ("inputs", "targets", "error", "match"),
    [
        (np.zeros((2, 7), int), np.zeros((2, 7), int), ValueError, "context_length = 6"),
        (np.zeros((0, 3), int), np.zeros((0, 3), int), ValueError, "N >= 1"),
        (np.zeros((2, 0), int), np.zeros((2, 0), int), ValueError, "1 <= T"),
        (np.zeros((2, 3), int), np.zeros((2, 4), int), ValueError, r"\(2, 3\) and \(2, 4\)"),
        (np.zeros(3, int), np.zeros(3, int), ValueError, "2-D arrays"),
        (np.full((2, 3), 7), np.zeros((2, 3), int), ValueError, "below the vocabulary size 7"),
        (np.zeros((2, 3), int), np.full((2, 3), -1), ValueError, "targets must be non-negative"),
        (np.zeros((2, 3)), np.zeros((2, 3), int), TypeError, "inputs must be an integer array"),
    ],
)
def test_token_losses_refuse_bad_rows_by_name(inputs, targets, error, match):
    with pytest.raises(error, match=match):
        token_losses(_decoder(), inputs, targets)


def test_token_losses_refuse_a_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        token_losses(_decoder(), np.zeros((2, 3), int), np.zeros((2, 3), int), batch_size=0)


# ------------------------------------------------------------------ perturbed runs
def test_perturbed_runs_start_one_ulp_above_the_usual_weights(monkeypatch):
    config = DecoderOnlyConfig(7, d_model=8, n_heads=2, d_ff=12, n_layers=1, context_length=6)
    monkeypatch.delenv("TINYFORMER_PERTURB", raising=False)
    plain = initial_model(DecoderOnlyLM, config, np.random.default_rng([3, 4]))
    monkeypatch.setenv("TINYFORMER_PERTURB", "1")
    assert perturbed()
    moved = initial_model(DecoderOnlyLM, config, np.random.default_rng([3, 4]))
    for (name, a), (_, b) in zip(plain.named_parameters(), moved.named_parameters(), strict=True):
        assert np.array_equal(b.value, np.nextafter(a.value, np.inf)), name
        assert not np.array_equal(b.value, a.value), name
    monkeypatch.setenv("TINYFORMER_PERTURB", "0")
    again = initial_model(DecoderOnlyLM, config, np.random.default_rng([3, 4]))
    assert parameter_fingerprint(again) == parameter_fingerprint(plain)


def test_the_recipe_trains_from_perturbed_weights_when_asked(monkeypatch):
    config = DecoderOnlyConfig(7, d_model=8, n_heads=2, d_ff=12, n_layers=1, context_length=6)
    data = WindowDataset.from_tokens(np.arange(40) % 7, 6)
    recipe = Recipe(seed=2, peak_lr=1e-3, warmup_steps=1, max_steps=3, batch_size=2)
    monkeypatch.setenv("TINYFORMER_PERTURB", "1")
    moved = recipe.trainer(config, data).model
    monkeypatch.delenv("TINYFORMER_PERTURB")
    plain = recipe.trainer(config, data).model
    first = next(iter(plain.parameters()))
    assert np.array_equal(next(iter(moved.parameters())).value, np.nextafter(first.value, np.inf))


def test_a_bad_perturbation_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("TINYFORMER_PERTURB", "yes")
    with pytest.raises(ValueError, match="TINYFORMER_PERTURB must be 0 or 1, got 'yes'"):
        perturbed()
