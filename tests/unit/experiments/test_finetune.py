"""Fine-tuning on a shifted source: the shift, the metrics on held-out data, LoRA's adapters merged."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.data import MarkovSource
from tinyformer.experiments.finetune import (
    ALL_LINEAR,
    BOOK_FULL_LRS,
    BOOK_RANKS,
    BOOK_SEEDS,
    STREAMS,
    book_runs,
    context_losses,
    finetune,
    shift_source,
)
from tinyformer.experiments.markov import markov_task
from tinyformer.experiments.recipe import token_losses
from tinyformer.experiments.registry import BOOK_RUNS, EXPERIMENTS
from tinyformer.experiments.store import STORE_ENV, default_store
from tinyformer.training import WindowDataset

BASE = {  # a tiny base model (markov_lm's arguments), trained in a fraction of a second
    "vocab_size": 6, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
    "context_length": 12, "batch_size": 8, "max_steps": 12, "warmup_steps": 3,
    "n_train_windows": 64, "n_validation_windows": 16, "n_heldout_windows": 32,
    "eval_every": 5, "dtype": "float64",
}  # fmt: skip
SMALL = {
    "base": BASE,
    "steps": 6,
    "warmup_steps": 1,
    "batch_size": 8,
    "n_train_windows": 32,
    "n_heldout_windows": 24,
}


@pytest.fixture(scope="module")
def store_env(tmp_path_factory):
    """A store of this module's own, so the tiny base model is trained there once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STORE_ENV, str(tmp_path_factory.mktemp("store")))
        yield


@pytest.fixture(scope="module")
def runs(store_env):
    """Full fine-tuning and LoRA (rank 2 everywhere; rank 1 on queries only), seed 1."""
    return {
        "full": finetune(seed=1, **SMALL),
        "lora": finetune(seed=1, rank=2, **SMALL),
        "queries": finetune(seed=1, rank=1, targets=["q_proj"], **SMALL),
    }


def _base(store_env):
    return default_store().run("markov_lm", **BASE)


def test_shift_changes_the_chosen_contexts_only_and_keeps_their_number_of_successors():
    source = MarkovSource.random(6, 2, 3, rng=np.random.default_rng(0))
    shifted, changed = shift_source(source, 0.25, rng=np.random.default_rng(1))
    again, changed_again = shift_source(source, 0.25, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(changed, changed_again)
    np.testing.assert_array_equal(shifted.transitions, again.transitions)
    old = source.transitions.reshape(36, 6)
    new = shifted.transitions.reshape(36, 6)
    assert len(changed) == 9
    assert np.all(np.diff(changed) > 0)
    kept = np.setdiff1d(np.arange(36), changed)
    np.testing.assert_array_equal(new[kept], old[kept])
    assert ((new[changed] > 0).sum(axis=1) == 3).all()
    assert not np.array_equal(new[changed], old[changed])
    assert shifted.entropy_rate != source.entropy_rate


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fraction": 0.0}, ValueError, "fraction must be in"),
        ({"fraction": 1.5}, ValueError, "fraction must be in"),
        ({"fraction": 0.5, "rng": 3}, TypeError, "rng must be a numpy.random.Generator"),
    ],
)
def test_shift_refuses_bad_arguments(kwargs, error, match):
    source = MarkovSource.random(4, 2, 2, rng=np.random.default_rng(0))
    arguments = {"rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(error, match=match):
        shift_source(source, **arguments)
    with pytest.raises(TypeError, match="source must be a MarkovSource"):
        shift_source("source", 0.5, rng=np.random.default_rng(0))


def test_context_losses_split_the_full_context_positions_by_their_context():
    class Uniform:  # every next token equally likely: loss log V everywhere
        vocab_size, context_length = 4, 6

        def forward(self, ids):
            logits = np.zeros((*ids.shape, 4))
            logits[..., 0] = ids  # the token itself gets a larger logit: losses differ
            return logits

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 4, (5, 7))
    data = WindowDataset(tokens[:, :-1], tokens[:, 1:])  # windows of token streams
    losses, _ = token_losses(Uniform(), data.inputs, data.targets)
    # the context of target t >= 1 is (inputs[t - 1], inputs[t])
    contexts = data.inputs[:, :-1] * 4 + data.inputs[:, 1:]  # (5, 5)
    changed = np.array([0, 5, 6, 9, 15])
    every, in_changed, in_kept = context_losses(Uniform(), data, 2, changed)
    mask = np.isin(contexts, changed)
    assert every == pytest.approx(losses[:, 1:].mean(), rel=1e-14)
    assert in_changed == pytest.approx(losses[:, 1:][mask].mean(), rel=1e-14)
    assert in_kept == pytest.approx(losses[:, 1:][~mask].mean(), rel=1e-14)
    assert np.isnan(context_losses(Uniform(), data, 2, np.arange(16))[2])  # no kept position


def _heldout(result):
    """Regenerate the two held-out sets of a run from its documented streams."""
    base = result.config["base"]
    source, _ = markov_task(result.config["base_seed"], base["vocab_size"], 2, 4)
    shifted, changed = shift_source(
        source, 0.25, rng=np.random.default_rng([result.seed, STREAMS["shift"]])
    )
    n, length = SMALL["n_heldout_windows"], base["context_length"]
    new = WindowDataset(
        *shifted.sample_windows(
            n, length, np.random.default_rng([result.seed, STREAMS["heldout_shifted"]])
        )
    )
    old = WindowDataset(
        *source.sample_windows(
            n, length, np.random.default_rng([result.seed, STREAMS["heldout_original"]])
        )
    )
    return source, shifted, changed, new, old


def test_metrics_are_the_stored_models_losses_on_heldout_windows(runs, store_env):
    for result in runs.values():
        _source, shifted, changed, new, old = _heldout(result)
        metrics, model = result.metrics, result.model
        losses, _ = token_losses(model, new.inputs, new.targets)
        assert metrics["loss_shifted"] == pytest.approx(losses[:, 1:].mean(), rel=1e-12)
        assert metrics["entropy_rate_shifted"] == shifted.entropy_rate
        assert metrics["excess_shifted"] == pytest.approx(
            metrics["loss_shifted"] / shifted.entropy_rate - 1, rel=1e-12
        )
        old_losses, _ = token_losses(model, old.inputs, old.targets)
        assert metrics["loss_original"] == pytest.approx(old_losses[:, 1:].mean(), rel=1e-12)
        assert metrics["changed_contexts"] == len(changed)
        # the base model before fine-tuning, on the same windows
        base_losses, _ = token_losses(_base(store_env).model, new.inputs, new.targets)
        assert metrics["base_loss_shifted"] == pytest.approx(base_losses[:, 1:].mean(), rel=1e-12)
        assert metrics["loss_shifted"] != metrics["base_loss_shifted"]  # training did something
        assert metrics["steps"] == SMALL["steps"]


def test_full_finetuning_trains_every_parameter_and_lora_only_its_adapters(runs, store_env):
    base = _base(store_env).model
    d, d_ff = BASE["d_model"], BASE["d_ff"]
    full, lora, queries = runs["full"].metrics, runs["lora"].metrics, runs["queries"].metrics
    assert full["trainable_parameters"] == full["total_parameters"] == base.num_parameters()
    # one block: four (d, d) projections and the (d, d_ff), (d_ff, d) layers, rank 2
    assert lora["trainable_parameters"] == 2 * (4 * 2 * d + 2 * (d + d_ff))
    assert queries["trainable_parameters"] == 1 * 2 * d
    assert lora["total_parameters"] == base.num_parameters()  # the adapters are merged away
    assert full["merge_max_logit_difference"] == 0.0
    assert 0.0 < lora["merge_max_logit_difference"] < 1e-12  # float64 base model


def test_a_merged_adapter_changes_only_its_layers_by_a_low_rank_update(runs, store_env):
    before = _base(store_env).model.state_dict()
    after = runs["queries"].model.state_dict()
    assert before.keys() == after.keys()
    changed = [name for name in before if not np.array_equal(before[name], after[name])]
    assert changed == ["decoder.layers.0.self_attention.layer.q_proj.weight"]
    delta = after[changed[0]] - before[changed[0]]
    singular = np.linalg.svd(delta, compute_uv=False)
    assert singular[0] > 0
    assert singular[1] < 1e-12 * singular[0]
    full = runs["full"].model.state_dict()
    assert all(not np.array_equal(before[name], full[name]) for name in before)


def test_a_run_is_deterministic_from_its_seed(runs, store_env):
    again = finetune(seed=1, rank=1, targets=["q_proj"], **SMALL)
    assert {k: v for k, v in again.metrics.items() if "seconds" not in k} == {
        k: v for k, v in runs["queries"].metrics.items() if "seconds" not in k
    }
    other = finetune(seed=2, rank=1, targets=["q_proj"], **SMALL)
    assert other.metrics["entropy_rate_shifted"] != again.metrics["entropy_rate_shifted"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rank": 0}, ValueError, "rank must be a positive integer"),
        ({"rank": 1.5}, TypeError, "rank must be a positive integer"),
        ({"seed": -1}, ValueError, "seed must be"),
        ({"targets": "q_proj"}, TypeError, "targets must be a sequence"),
        ({"targets": []}, ValueError, "targets must be non-empty"),
        ({"lr": -1.0}, ValueError, "lr must be"),
        ({"steps": 0}, ValueError, "steps must be a positive integer"),
        ({"alpha": 0.0}, ValueError, "alpha must be"),
        ({"base": "markov_lm"}, TypeError, "base must be a dict"),
    ],
)
def test_finetune_refuses_bad_arguments_before_training(kwargs, error, match):
    with pytest.raises(error, match=match):
        finetune(**{**SMALL, **kwargs})


def test_lora_refuses_a_target_the_model_lacks(store_env):
    with pytest.raises(ValueError, match="match no Linear layer"):
        finetune(rank=1, targets=["w_qkv"], **SMALL)


def test_the_book_runs_cover_full_finetuning_and_every_rank_on_every_seed():
    runs = book_runs()
    assert EXPERIMENTS["finetune"] is finetune
    assert all(run in BOOK_RUNS for run in runs)
    assert len(set(map(repr, runs))) == len(runs)  # no run twice
    assert {(p["rank"], p["seed"], p.get("lr")) for _, p in runs} == {
        (r, s, None) for r in (None, *BOOK_RANKS) for s in BOOK_SEEDS
    } | {(None, s, lr) for lr in BOOK_FULL_LRS for s in BOOK_SEEDS}
    assert all(lr < 1e-2 for lr in BOOK_FULL_LRS)  # below the default rate of full fine-tuning
    assert set(ALL_LINEAR) == {"q_proj", "k_proj", "v_proj", "out_proj", "linear_in", "linear_out"}
