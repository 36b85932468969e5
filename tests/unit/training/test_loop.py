"""The training loop: budgets, logging, evaluation, early stopping, NaN stops, exact resume."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from small_models import (
    LLAMA,
    BigramConfig,
    BigramLM,
    bigram_windows,
    decoder_only,
    encoder_decoder,
)

import tinyformer.runtime
import tinyformer.training.loop
from tinyformer.checkpoint import save_checkpoint
from tinyformer.data import PairDataset, SequenceTask
from tinyformer.module import Module
from tinyformer.optim import SGD, Adam
from tinyformer.schedules import WarmupCosineSchedule
from tinyformer.training import (
    DivergenceError,
    EarlyStopping,
    LossEvaluator,
    Trainer,
    lm_loss,
    seq2seq_loss,
)


def make_trainer(
    seed: int = 0, *, dropout: float = 0.0, n: int = 64, optimizer=None, **options
) -> Trainer:
    """A BigramLM trainer; ``optimizer(parameters)`` builds the optimizer (Adam, lr 0.05, by default)."""
    rng = np.random.default_rng(seed)
    data = bigram_windows(n, 6, np.random.default_rng(99))
    model = BigramLM(BigramConfig(dropout=dropout), rng=rng)
    build = optimizer or (lambda params: Adam(params, 0.05))
    batch_size = options.pop("batch_size", 8)
    return Trainer(
        model, build(model.parameters()), lm_loss, data, batch_size=batch_size, rng=rng, **options
    )


def weights(model: Module) -> dict[str, np.ndarray]:
    return model.state_dict()


class ScriptedEvaluation:
    """An evaluation that returns the next of a list of accuracies and records the model's mode."""

    def __init__(self, accuracies):
        self.accuracies = list(accuracies)
        self.calls = 0
        self.modes: list[set[bool]] = []

    def __call__(self, model):
        self.modes.append({m.training for m in model.modules()})
        value = self.accuracies[min(self.calls, len(self.accuracies) - 1)]
        self.calls += 1
        return {"accuracy": value}


# ------------------------------------------------------------------------ the loop
def test_history_lengths_and_eval_cadence():
    evaluation = ScriptedEvaluation([0.5])
    trainer = make_trainer(log_every=3, evaluate=evaluation, eval_every=4)
    history = trainer.fit(10)
    assert trainer.step == 10
    assert trainer.stop_reason == "budget"
    assert history.column("step").tolist() == [3, 6, 9, 10]
    assert history.column("step", "eval").tolist() == [4, 8, 10]
    assert evaluation.modes == [{False}] * 3  # every module in evaluation mode
    assert all(m.training for m in trainer.model.modules())  # and back to training
    assert (history.column("tokens_per_second") > 0).all()
    assert np.all(np.diff(history.column("time")) > 0)
    assert trainer.optimizer.step_count == 10


def test_logged_loss_averages_the_steps_since_the_last_row():
    one = make_trainer(log_every=1)
    one.fit(6)
    three = make_trainer(log_every=3)
    three.fit(6)
    losses = one.history.column("loss")  # every batch has the same number of tokens
    np.testing.assert_allclose(
        three.history.column("loss"), [losses[:3].mean(), losses[3:].mean()]
    )


def test_epoch_budget_counts_full_batches():
    trainer = make_trainer(n=20, batch_size=6)  # 3 full batches per epoch
    trainer.fit(max_epochs=2)
    assert trainer.step == 6
    assert trainer.stream.epoch == 2
    trainer.fit(max_steps=100, max_epochs=3)  # budgets are totals: 3 more steps
    assert trainer.step == 9


def test_learning_rate_follows_the_schedule():
    schedule = WarmupCosineSchedule(0.05, 3, 12, min_lr=0.001)
    trainer = make_trainer(optimizer=lambda params: Adam(params, schedule))
    trainer.fit(15)
    np.testing.assert_allclose(
        trainer.history.column("lr"), [schedule(t) for t in range(1, 16)], rtol=0, atol=0
    )


def test_trainer_rejects_an_optimizer_of_another_model():
    model = BigramLM(BigramConfig(), rng=np.random.default_rng(0))
    other = BigramLM(BigramConfig(), rng=np.random.default_rng(1))
    with pytest.raises(ValueError, match="foreign"):
        Trainer(
            model, SGD(other.parameters(), 0.1), lm_loss, bigram_windows(8, 3, np.random.default_rng(0)),
            batch_size=2, rng=np.random.default_rng(0),
        )  # fmt: skip


def test_trainer_refuses_data_longer_than_the_models_context():
    rng = np.random.default_rng(0)
    lm = decoder_only(0, vocab_size=12, n_layers=1, context_length=4)
    windows = bigram_windows(8, 5, rng)
    with pytest.raises(ValueError, match=r"DecoderOnlyConfig\.context_length=4.*>= 5"):
        Trainer(lm, SGD(lm.parameters(), 0.1), lm_loss, windows, batch_size=2, rng=rng)
    Trainer(lm, SGD(lm.parameters(), 0.1), lm_loss, bigram_windows(8, 4, rng),
            batch_size=2, rng=rng)  # fmt: skip

    model = encoder_decoder(
        0, src_vocab_size=8, tgt_vocab_size=8, n_decoder_layers=1, context_length=4
    )
    fits = PairDataset([np.array([4, 5, 6, 7])], [np.array([4, 5, 6])])  # <bos> + 3 = 4
    Trainer(model, SGD(model.parameters(), 0.1), seq2seq_loss, fits, batch_size=1, rng=rng)
    for source, target in [([4, 5, 6, 7, 4], [4]), ([4], [4, 5, 6, 7])]:
        data = PairDataset([np.array(source)], [np.array(target)])
        with pytest.raises(ValueError, match=r"EncoderDecoderConfig\.context_length=4.*>= 5"):
            Trainer(model, SGD(model.parameters(), 0.1), seq2seq_loss, data, batch_size=1,
                    rng=rng)  # fmt: skip


def test_clipping_bounds_the_applied_gradient_norm():
    # with plain SGD at lr 1 the update is minus the (clipped) gradient
    trainer = make_trainer(optimizer=lambda params: SGD(params, 1.0), clip_norm=0.01)
    model = trainer.model
    before = weights(model)
    trainer.fit(1)
    after = weights(model)
    step = math.sqrt(sum(float(np.sum((after[k] - before[k]) ** 2)) for k in before))
    assert trainer.history.column("grad_norm")[0] > 0.1  # the norm before clipping is logged
    assert step == pytest.approx(0.01, rel=1e-4)
    unclipped = make_trainer(optimizer=lambda params: SGD(params, 1.0))
    model = unclipped.model
    before = weights(model)
    unclipped.fit(1)
    after = weights(model)
    step = math.sqrt(sum(float(np.sum((after[k] - before[k]) ** 2)) for k in before))
    assert step == pytest.approx(unclipped.history.column("grad_norm")[0], rel=1e-9)


def test_training_lowers_the_loss():
    trainer = make_trainer(
        n=256, evaluate=LossEvaluator(lm_loss, bigram_windows(64, 6, np.random.default_rng(1)))
    )
    trainer.fit(150)
    losses = trainer.history.column("loss")
    assert losses[-10:].mean() < 0.6 * losses[:10].mean()
    assert trainer.history.last_eval["accuracy"] > 0.8  # the rule is right 90% + of the time


def test_early_stopping_stops_at_the_first_evaluation_that_meets_the_target():
    evaluation = ScriptedEvaluation([0.2, 0.5, 0.991, 0.995, 1.0])
    trainer = make_trainer(
        evaluate=evaluation, eval_every=5, early_stopping=EarlyStopping("accuracy", target=0.99)
    )
    trainer.fit(100)
    assert trainer.stop_reason == "target"
    assert trainer.step == 15
    assert trainer.history.column("step", "eval").tolist() == [5, 10, 15]
    assert trainer.history.column("step")[-1] == 15


def test_early_stopping_with_patience():
    evaluation = ScriptedEvaluation([0.9, 0.95, 0.94, 0.95, 0.93])
    trainer = make_trainer(
        evaluate=evaluation, eval_every=2, early_stopping=EarlyStopping("accuracy", patience=3)
    )
    trainer.fit(100)
    assert trainer.stop_reason == "patience"
    assert trainer.step == 10  # best at the 2nd evaluation, then 3 without improvement


def test_the_loop_rejects_bad_arguments():
    with pytest.raises(ValueError, match="early_stopping needs evaluate"):
        make_trainer(early_stopping=EarlyStopping("accuracy", target=1.0))
    with pytest.raises(ValueError, match="clip_norm must be a finite positive number"):
        make_trainer(clip_norm=-1.0)
    with pytest.raises(TypeError, match="eval_every must be a positive integer"):
        make_trainer(eval_every=2.5)
    model = BigramLM(BigramConfig(), rng=np.random.default_rng(0))
    data = bigram_windows(8, 3, np.random.default_rng(0))
    with pytest.raises(TypeError, match="optimizer must be a tinyformer Optimizer"):
        Trainer(model, None, lm_loss, data, batch_size=2, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="objective must be callable"):
        Trainer(
            model, SGD(model.parameters(), 0.1), "lm", data,
            batch_size=2, rng=np.random.default_rng(0),
        )  # fmt: skip
    with pytest.raises(TypeError, match="model must be a tinyformer Module"):
        Trainer(
            "model", SGD(model.parameters(), 0.1), lm_loss, data,
            batch_size=2, rng=np.random.default_rng(0),
        )  # fmt: skip
    with pytest.raises(TypeError, match="progress must be a bool"):
        make_trainer(progress="yes")
    with pytest.raises(ValueError, match="checkpoint_every needs a checkpoint_path"):
        make_trainer(checkpoint_every=5)
    trainer = make_trainer()
    with pytest.raises(ValueError, match="max_steps, max_epochs or both"):
        trainer.fit()
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        trainer.fit(0)
    with pytest.raises(ValueError, match="no evaluate function"):
        trainer.run_evaluation()
    with pytest.raises(TypeError, match="evaluate must be callable"):
        make_trainer(evaluate=3)
    with pytest.raises(TypeError, match="retain_memory must be True or False, got int 1"):
        make_trainer(retain_memory=1)


# ------------------------------------------------------------ the C allocator
@pytest.fixture
def allocator_calls(monkeypatch):
    """Replace ``retain_freed_memory`` (where the loop finds it) by a recorder."""
    calls = []

    def record() -> bool:
        calls.append(True)
        return True

    monkeypatch.setattr(tinyformer.runtime, "retain_freed_memory", record)
    monkeypatch.setattr(tinyformer.training.loop, "retain_freed_memory", record)
    return calls


def test_fit_leaves_the_processs_allocator_alone_unless_asked(allocator_calls):
    trainer = make_trainer()
    assert trainer.retain_memory is False
    trainer.fit(2)
    trainer.fit(3)
    assert allocator_calls == []


def test_fit_asks_the_allocator_to_retain_freed_memory_when_told(allocator_calls):
    trainer = make_trainer(retain_memory=True)
    assert allocator_calls == []  # not when the trainer is made: when it trains
    trainer.fit(2)
    assert allocator_calls == [True]
    assert trainer.step == 2


# ----------------------------------------------------------------- progress output
def test_no_output_without_progress(capfd):
    trainer = make_trainer(evaluate=ScriptedEvaluation([0.5]), eval_every=3)
    trainer.fit(6)
    out, err = capfd.readouterr()
    assert out == ""
    assert err == ""


def test_progress_bar_on_stderr(capfd):
    pytest.importorskip("tqdm")
    trainer = make_trainer(progress=True, evaluate=ScriptedEvaluation([0.5]), eval_every=3)
    trainer.fit(6)
    out, err = capfd.readouterr()
    assert out == ""
    assert "6/6" in err


def test_progress_without_tqdm_is_silent(capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # makes `import tqdm` raise ImportError
    trainer = make_trainer(progress=True)
    trainer.fit(4)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert trainer.step == 4


# ------------------------------------------------------------------------ NaN stop
def test_nan_weight_stops_before_the_update_and_keeps_the_checkpoint(tmp_path):
    path = tmp_path / "run.npz"
    trainer = make_trainer(checkpoint_path=path, checkpoint_every=5)
    trainer.fit(5)
    saved = path.read_bytes()
    trainer.model.head.weight.value[3, 2] = np.nan
    poisoned = weights(trainer.model)
    state = trainer.optimizer.state_dict()
    with pytest.raises(DivergenceError, match="step 6") as info:
        trainer.fit(10)
    assert isinstance(info.value, FloatingPointError)
    assert info.value.step == 6
    assert info.value.quantity == "loss"
    for name, value in weights(trainer.model).items():
        np.testing.assert_array_equal(value, poisoned[name])
    assert trainer.step == 5
    assert trainer.optimizer.step_count == 5
    for key, value in trainer.optimizer.state_dict().items():
        np.testing.assert_array_equal(value, state[key])
    assert path.read_bytes() == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.npz"]


def test_huge_learning_rate_stops_with_the_weights_of_the_last_good_step():
    trainer = make_trainer(optimizer=lambda params: SGD(params, 1e12))
    good = weights(trainer.model)
    error = None
    for _ in range(50):
        try:
            trainer.fit(trainer.step + 1)
        except FloatingPointError as err:
            error = err
            break
        good = weights(trainer.model)
    assert isinstance(error, DivergenceError)
    assert "training diverged at step" in str(error)
    assert error.step == trainer.step + 1
    for name, value in weights(trainer.model).items():
        np.testing.assert_array_equal(value, good[name])


# --------------------------------------------------------------------- exact resume
def test_resume_gives_bitwise_the_uninterrupted_run_with_dropout(tmp_path):
    def build(seed: int) -> Trainer:
        rng = np.random.default_rng(seed)
        model = BigramLM(BigramConfig(dropout=0.3), rng=rng)
        schedule = WarmupCosineSchedule(0.05, 4, 30, min_lr=0.001)
        return Trainer(
            model, Adam(model.parameters(), schedule), lm_loss,
            bigram_windows(40, 6, np.random.default_rng(7)),
            batch_size=8, rng=np.random.default_rng(seed + 1), clip_norm=0.5, log_every=3,
            evaluate=LossEvaluator(lm_loss, bigram_windows(8, 6, np.random.default_rng(8))),
            eval_every=4, early_stopping=EarlyStopping("loss", mode="min", patience=50),
        )  # fmt: skip

    straight = build(0)
    straight.fit(25)
    first = build(0)
    # stop mid-epoch (5 batches per epoch) where the straight run logs and evaluates too (a fit
    # ending elsewhere adds a final row and evaluation that the straight run does not have)
    first.fit(12)
    first.save(tmp_path / "ckpt.npz")
    resumed = build(123)  # fresh objects, other seeds: everything must come from the file
    resumed.load(tmp_path / "ckpt.npz")
    assert resumed.step == 12
    assert resumed.stream.epoch == 3
    resumed.fit(25)
    for name, value in weights(straight.model).items():
        np.testing.assert_array_equal(weights(resumed.model)[name], value)
    for key, value in straight.optimizer.state_dict().items():
        np.testing.assert_array_equal(resumed.optimizer.state_dict()[key], value)
    for column in ("step", "loss", "accuracy", "lr", "grad_norm"):
        np.testing.assert_array_equal(
            resumed.history.column(column), straight.history.column(column)
        )
    assert (
        resumed.history.column("loss", "eval").tolist()
        == straight.history.column("loss", "eval").tolist()
    )
    assert resumed.early_stopping.state() == straight.early_stopping.state()


@pytest.mark.parametrize("options", [{}, LLAMA], ids=["post-norm", "llama"])
def test_resume_of_an_encoder_decoder_with_dropout_is_exact(tmp_path, options):
    task = SequenceTask("reverse", n_symbols=5, min_len=1, max_len=4)
    data = task.sample(48, np.random.default_rng(3))

    def build(seed: int) -> Trainer:
        model = encoder_decoder(
            seed,
            src_vocab_size=task.vocab_size,
            tgt_vocab_size=task.vocab_size,
            d_model=16,
            d_ff=32,
            n_decoder_layers=1,
            context_length=8,
            dropout=0.2,
            **options,
        )
        return Trainer(
            model, Adam(model.parameters(), 3e-3), seq2seq_loss, data,
            batch_size=16, rng=np.random.default_rng(seed + 1), clip_norm=1.0,
        )  # fmt: skip

    straight = build(0)
    straight.fit(9)
    first = build(0)
    first.fit(4)
    first.save(tmp_path / "ed.npz")
    resumed = build(5)
    resumed.load(tmp_path / "ed.npz")
    resumed.fit(9)
    for name, value in weights(straight.model).items():
        np.testing.assert_array_equal(weights(resumed.model)[name], value, err_msg=name)


def test_trainer_load_rejects_a_checkpoint_without_trainer_state(tmp_path):
    trainer = make_trainer()
    save_checkpoint(tmp_path / "bare.npz", trainer.model, trainer.optimizer, step=3)
    before = weights(trainer.model)
    with pytest.raises(ValueError, match="no usable trainer state"):
        trainer.load(tmp_path / "bare.npz")
    assert trainer.step == 0
    for name, value in weights(trainer.model).items():
        np.testing.assert_array_equal(value, before[name])


def test_infinite_gradient_norm_stops_before_the_update():
    def poisoned(model, batch, *, backward=True):
        result = lm_loss(model, batch, backward=backward)
        model.head.bias.grad[0] = np.inf
        return result

    trainer = make_trainer()
    trainer.objective = poisoned
    before = weights(trainer.model)
    with pytest.raises(DivergenceError, match=r"step 1: the gradient norm is inf") as info:
        trainer.fit(3)
    assert info.value.quantity == "gradient norm"
    for name, value in weights(trainer.model).items():
        np.testing.assert_array_equal(value, before[name])
    assert trainer.optimizer.step_count == 0


def test_float32_model_trains_in_float32():
    task = SequenceTask("copy", n_symbols=4, min_len=1, max_len=3)
    model = encoder_decoder(
        0,
        src_vocab_size=task.vocab_size,
        tgt_vocab_size=task.vocab_size,
        d_ff=16,
        n_decoder_layers=1,
        context_length=4,
        dtype="float32",
    )
    trainer = Trainer(
        model, Adam(model.parameters(), 1e-2), seq2seq_loss, task.sample(32, np.random.default_rng(1)),
        batch_size=8, rng=np.random.default_rng(2), clip_norm=1.0,
    )  # fmt: skip
    trainer.fit(5)
    assert all(p.value.dtype == np.float32 for p in model.parameters())
    assert all(isinstance(v, float) for v in trainer.history.column("loss").tolist())
    assert np.isfinite(trainer.history.column("loss")).all()
