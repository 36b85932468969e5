"""The training loop: objectives, batches, history, evaluation, early stopping, NaN stop, resume."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import numpy as np
import pytest

from tinyformer.data import PairDataset, SequenceTask, make_batch
from tinyformer.layers import Dropout, Embedding, Linear
from tinyformer.losses import cross_entropy
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
)
from tinyformer.module import Module
from tinyformer.optim import SGD, Adam
from tinyformer.schedules import WarmupCosineSchedule
from tinyformer.training import (
    TRAIN_FIELDS,
    BatchStream,
    DivergenceError,
    EarlyStopping,
    History,
    LossEvaluator,
    StepResult,
    Trainer,
    WindowDataset,
    lm_loss,
    metric_direction,
    seq2seq_loss,
)


# ---------------------------------------------------------------- a stand-in model
@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 12
    d_model: int = 8
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class TinyLM(Module):
    """Embedding -> dropout -> linear: a bigram language model with the LM interface."""

    def __init__(self, config: TinyConfig, *, rng: np.random.Generator) -> None:
        super().__init__()
        self.config = config
        self.embedding = Embedding(config.vocab_size, config.d_model, rng=rng)
        self.dropout = Dropout(config.dropout, rng=rng)
        self.head = Linear(config.d_model, config.vocab_size, rng=rng)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        return self.head(self.dropout(self.embedding(ids)))  # (B, T, V)

    def backward(self, grad_logits: np.ndarray) -> None:
        self.embedding.backward(self.dropout.backward(self.head.backward(grad_logits)))


def bigram_windows(n: int, seq_len: int, rng: np.random.Generator, vocab: int = 12):
    """Windows of a deterministic next-token rule (x -> 3x + 1 mod V) with 10% noise."""
    streams = np.empty((n, seq_len + 1), dtype=np.int64)
    streams[:, 0] = rng.integers(0, vocab, n)
    for t in range(seq_len):
        nxt = (3 * streams[:, t] + 1) % vocab
        noise = rng.random(n) < 0.1
        streams[:, t + 1] = np.where(noise, rng.integers(0, vocab, n), nxt)
    return WindowDataset(streams[:, :-1], streams[:, 1:])


def make_trainer(
    seed: int = 0, *, dropout: float = 0.0, n: int = 64, optimizer=None, **options
) -> Trainer:
    """A TinyLM trainer; ``optimizer(parameters)`` builds the optimizer (Adam, lr 0.05, by default)."""
    rng = np.random.default_rng(seed)
    data = bigram_windows(n, 6, np.random.default_rng(99))
    model = TinyLM(TinyConfig(dropout=dropout), rng=rng)
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


# ---------------------------------------------------------------------- objectives
def test_seq2seq_loss_counts_only_real_tokens_and_matches_cross_entropy(rng):
    config = EncoderDecoderConfig(
        src_vocab_size=9, tgt_vocab_size=9, d_model=16, n_heads=2, d_ff=32,
        n_encoder_layers=1, n_decoder_layers=1, context_length=10,
    )  # fmt: skip
    model = EncoderDecoder(config, rng=rng)
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
    expected, _ = cross_entropy(logits, batch.target_ids, ignore_index=0)
    assert result.loss == pytest.approx(expected, rel=1e-12)
    correct = (logits.argmax(-1) == batch.target_ids) & batch.loss_mask
    assert result.n_correct == int(correct.sum())
    assert all(np.all(p.grad == 0) for p in model.parameters())  # backward=False
    seq2seq_loss(model, batch)
    assert any(np.any(p.grad != 0) for p in model.parameters())


def test_lm_loss_and_label_smoothing(rng):
    model = TinyLM(TinyConfig(), rng=rng)
    data = bigram_windows(4, 5, rng)
    batch = data.batch(np.arange(4))
    plain = lm_loss(model, batch, backward=False)
    smooth = lm_loss(model, batch, label_smoothing=0.2, backward=False)
    logits = model.forward(batch[0])
    assert plain.loss == pytest.approx(cross_entropy(logits, batch[1])[0], rel=1e-12)
    assert smooth.loss == pytest.approx(
        cross_entropy(logits, batch[1], label_smoothing=0.2)[0], rel=1e-12
    )
    assert plain.n_tokens == 20
    assert plain.n_correct == int((logits.argmax(-1) == batch[1]).sum())
    assert plain.accuracy == pytest.approx(plain.n_correct / 20, rel=1e-15)


def test_objective_returns_nan_without_backward_when_logits_are_not_finite(rng):
    model = TinyLM(TinyConfig(), rng=rng)
    model.head.weight.value[0, 0] = np.nan
    batch = bigram_windows(2, 3, rng).batch(np.arange(2))
    result = lm_loss(model, batch)
    assert math.isnan(result.loss)
    assert all(np.all(p.grad == 0) for p in model.parameters())


def test_objectives_reject_bad_batches(rng):
    model = TinyLM(TinyConfig(), rng=rng)
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


# ------------------------------------------------------------------ data and history
def test_batch_stream_draws_a_fresh_permutation_each_epoch(rng):
    data = bigram_windows(10, 3, rng)
    stream = BatchStream(data, 3, rng=np.random.default_rng(5))
    assert stream.steps_per_epoch == 3
    epochs = [np.concatenate([stream.next_indices() for _ in range(3)]) for _ in range(2)]
    for seen in epochs:
        assert len(set(seen.tolist())) == 9  # 9 distinct of 10: the incomplete batch is dropped
    assert stream.epoch == 2
    assert not np.array_equal(epochs[0], epochs[1])
    position, order = stream.state()
    again = BatchStream(data, 3, rng=np.random.default_rng(0))
    again.rng.bit_generator.state = stream.rng.bit_generator.state
    again.set_state(position, order)
    for _ in range(5):
        np.testing.assert_array_equal(again.next_indices(), stream.next_indices())


def test_batch_stream_and_window_dataset_reject_bad_input(rng):
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


def test_history_columns_and_round_trip():
    history = History()
    for step in (1, 2, 3):
        history.log_train(
            step=step, loss=1.0 / step, accuracy=0.1 * step, lr=1e-3, grad_norm=2.0,
            tokens_per_second=100.0, time=0.5 * step,
        )  # fmt: skip
    history.log_eval(3, {"loss": 0.4, "accuracy": np.float64(0.75)})
    np.testing.assert_array_equal(history.column("step"), [1, 2, 3])
    assert history.column("step").dtype == np.int64
    np.testing.assert_allclose(history.column("loss"), [1.0, 0.5, 1 / 3])
    assert history.column("accuracy", "eval").tolist() == [0.75]
    assert set(history.columns()) == set(TRAIN_FIELDS)
    assert history.last_eval == {"step": 3, "loss": 0.4, "accuracy": 0.75}
    again = History.from_dict(history.to_dict())
    assert again.to_dict() == history.to_dict()
    with pytest.raises(KeyError, match="no field 'bleu'"):
        history.column("bleu", "eval")
    with pytest.raises(ValueError, match="table must be"):
        history.column("loss", "test")
    with pytest.raises(ValueError, match="needs the fields"):
        history.log_train(step=1, loss=0.1)
    with pytest.raises(TypeError, match="must be a number"):
        history.log_eval(1, {"loss": "low"})


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
    model = TinyLM(TinyConfig(), rng=np.random.default_rng(0))
    other = TinyLM(TinyConfig(), rng=np.random.default_rng(1))
    with pytest.raises(ValueError, match="foreign"):
        Trainer(
            model, SGD(other.parameters(), 0.1), lm_loss, bigram_windows(8, 3, np.random.default_rng(0)),
            batch_size=2, rng=np.random.default_rng(0),
        )  # fmt: skip


def test_trainer_refuses_data_longer_than_the_models_context():
    rng = np.random.default_rng(0)
    lm = DecoderOnlyLM(DecoderOnlyConfig(vocab_size=12, d_model=8, n_heads=2, d_ff=8,
                                         n_layers=1, context_length=4), rng=rng)  # fmt: skip
    windows = bigram_windows(8, 5, rng)
    with pytest.raises(ValueError, match=r"DecoderOnlyConfig\.context_length=4.*>= 5"):
        Trainer(lm, SGD(lm.parameters(), 0.1), lm_loss, windows, batch_size=2, rng=rng)
    Trainer(lm, SGD(lm.parameters(), 0.1), lm_loss, bigram_windows(8, 4, rng),
            batch_size=2, rng=rng)  # fmt: skip

    config = EncoderDecoderConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8, n_heads=2,
                                  d_ff=8, n_encoder_layers=1, n_decoder_layers=1, context_length=4)  # fmt: skip
    model = EncoderDecoder(config, rng=rng)
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


def test_early_stopping_with_patience_and_minimizing():
    evaluation = ScriptedEvaluation([0.9, 0.95, 0.94, 0.95, 0.93])
    trainer = make_trainer(
        evaluate=evaluation, eval_every=2, early_stopping=EarlyStopping("accuracy", patience=3)
    )
    trainer.fit(100)
    assert trainer.stop_reason == "patience"
    assert trainer.step == 10  # best at the 2nd evaluation, then 3 without improvement
    stopper = EarlyStopping("loss", target=0.1, mode="min")
    assert stopper.update({"loss": 0.5}) is None
    assert stopper.update({"loss": 0.1}) == "target"
    with pytest.raises(KeyError, match="watches 'loss'"):
        stopper.update({"accuracy": 1.0})


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


def test_early_stopping_reads_the_direction_from_the_metric_name():
    # A falling loss is an improvement: patience must not run out while it falls.
    stopper = EarlyStopping("loss", patience=2)
    assert stopper.mode == "min"
    assert [stopper.update({"loss": value}) for value in (3.0, 2.0, 1.5, 1.2)] == [None] * 4
    assert stopper.update({"loss": 1.3}) is None
    assert stopper.update({"loss": 1.25}) == "patience"
    assert EarlyStopping("val_perplexity", target=2.0).mode == "min"
    assert EarlyStopping("exact_match", target=0.99).mode == "max"
    assert EarlyStopping("loss", target=0.1, mode="max").mode == "max"  # the caller's word wins
    assert [metric_direction(m) for m in ("accuracy", "Loss", "excess_over_entropy_rate")] == [
        "max",
        "min",
        "min",
    ]
    with pytest.raises(ValueError, match=r"cannot tell from the name 'reward'.*mode='max'"):
        EarlyStopping("reward", patience=3)
    with pytest.raises(ValueError, match="it says both"):
        metric_direction("accuracy_loss")


def test_early_stopping_and_loop_reject_bad_arguments():
    with pytest.raises(ValueError, match="target, a patience"):
        EarlyStopping("accuracy")
    with pytest.raises(ValueError, match="mode must be"):
        EarlyStopping("accuracy", target=1.0, mode="up")
    with pytest.raises(ValueError, match="patience must be a positive integer"):
        EarlyStopping("accuracy", patience=0)
    with pytest.raises(ValueError, match="early_stopping needs evaluate"):
        make_trainer(early_stopping=EarlyStopping("accuracy", target=1.0))
    with pytest.raises(ValueError, match="clip_norm must be a finite positive number"):
        make_trainer(clip_norm=-1.0)
    with pytest.raises(TypeError, match="eval_every must be a positive integer"):
        make_trainer(eval_every=2.5)
    model = TinyLM(TinyConfig(), rng=np.random.default_rng(0))
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


def test_loss_evaluator_weights_by_tokens(rng):
    model = TinyLM(TinyConfig(), rng=rng)
    data = bigram_windows(10, 4, rng)
    whole = lm_loss(model, data.batch(np.arange(10)), backward=False)
    metrics = LossEvaluator(lm_loss, data, batch_size=3)(model)
    assert metrics["loss"] == pytest.approx(whole.loss, rel=1e-12)
    assert metrics["accuracy"] == pytest.approx(whole.accuracy)
    assert metrics["tokens"] == 40


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
        model = TinyLM(TinyConfig(dropout=0.3), rng=rng)
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


def test_resume_of_an_encoder_decoder_with_dropout_is_exact(tmp_path):
    task = SequenceTask("reverse", n_symbols=5, min_len=1, max_len=4)
    data = task.sample(48, np.random.default_rng(3))

    def build(seed: int) -> Trainer:
        rng = np.random.default_rng(seed)
        config = EncoderDecoderConfig(
            src_vocab_size=task.vocab_size, tgt_vocab_size=task.vocab_size, d_model=16,
            n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, context_length=8, dropout=0.2,
        )  # fmt: skip
        model = EncoderDecoder(config, rng=rng)
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
        np.testing.assert_array_equal(weights(resumed.model)[name], value)


def test_trainer_load_rejects_a_checkpoint_without_trainer_state(tmp_path):
    from tinyformer.checkpoint import save_checkpoint  # noqa: PLC0415

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
    config = EncoderDecoderConfig(
        src_vocab_size=task.vocab_size, tgt_vocab_size=task.vocab_size, d_model=8, n_heads=2,
        d_ff=16, n_encoder_layers=1, n_decoder_layers=1, context_length=4, dtype="float32",
    )  # fmt: skip
    model = EncoderDecoder(config, rng=np.random.default_rng(0))
    trainer = Trainer(
        model, Adam(model.parameters(), 1e-2), seq2seq_loss, task.sample(32, np.random.default_rng(1)),
        batch_size=8, rng=np.random.default_rng(2), clip_norm=1.0,
    )  # fmt: skip
    trainer.fit(5)
    assert all(p.value.dtype == np.float32 for p in model.parameters())
    assert all(isinstance(v, float) for v in trainer.history.column("loss").tolist())
    assert np.isfinite(trainer.history.column("loss")).all()
