"""The modern-decoder ablations at a tiny size, and the stretched models of the extrapolation test."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.experiments import ExperimentStore
from tinyformer.experiments.markov import markov_task, per_position_loss
from tinyformer.experiments.modern import (
    BUDGET_STEPS,
    SEEDS,
    VARIANTS,
    book_runs,
    extrapolation_losses,
    modern_lm,
    stretched,
)
from tinyformer.experiments.registry import BOOK_RUNS
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.models.counting import parameter_count

TINY = {
    "vocab_size": 6, "d_model": 16, "n_heads": 4, "context_length": 8, "batch_size": 8,
    "max_steps": 10, "warmup_steps": 2, "n_train_windows": 64, "n_heldout_windows": 32,
    "log_every": 5, "dtype": "float64",
}  # fmt: skip
TIMING = {"train_seconds", "cpu_seconds"}
_RUNS: dict[str, object] = {}


def tiny(variant: str = "GPT-2", **changes):
    """The tiny run of a variant (d_ff of SwiGLU scaled to the tiny width), trained once."""
    change = dict(VARIANTS[variant])
    if "d_ff" in change:
        change["d_ff"] = 2 * 4 * TINY["d_model"] // 3
    key = variant + repr(sorted(changes.items()))
    if key not in _RUNS:
        _RUNS[key] = modern_lm(seed=1, **{**TINY, **change, **changes})
    return _RUNS[key]


def test_a_run_makes_every_step_and_reports_its_held_out_loss_against_h():
    r = tiny()
    m = r.metrics
    assert r.name == "modern_lm"
    assert isinstance(r.model, DecoderOnlyLM)
    assert not r.model.training
    assert int(m["steps"]) == TINY["max_steps"]  # no early stopping
    assert m["excess_loss"] == pytest.approx(m["heldout_loss"] - m["entropy_rate"], abs=1e-12)
    assert m["parameters"] == parameter_count(r.model.config) == r.model.num_parameters()
    c = r.model.config
    assert m["kv_cache_bytes_per_token"] == 2 * c.n_layers * c.n_heads * c.d_k * 8  # float64
    source, windows = markov_task(1, TINY["vocab_size"], 2, 4)
    assert m["entropy_rate"] == source.entropy_rate
    heldout = windows(TINY["n_heldout_windows"], TINY["context_length"], 3)
    loss = per_position_loss(r.model, heldout)[1:].mean()  # positions with a whole context
    assert m["heldout_loss"] == pytest.approx(loss, rel=1e-12)
    train = windows(TINY["n_train_windows"], TINY["context_length"], 1)
    assert not np.array_equal(train.inputs[:32], heldout.inputs)  # another stream


def test_the_same_seed_gives_the_same_run():
    first, again = tiny(), modern_lm(seed=1, **TINY)
    untimed = {k: v for k, v in first.metrics.items() if k not in TIMING}
    assert untimed == {k: v for k, v in again.metrics.items() if k not in TIMING}
    for (name, a), (_, b) in zip(
        first.model.named_parameters(), again.model.named_parameters(), strict=True
    ):
        assert np.array_equal(a.value, b.value), name
    other = modern_lm(seed=2, **TINY)
    assert other.metrics["heldout_loss"] != first.metrics["heldout_loss"]


@pytest.mark.parametrize("variant", ["RMSNorm", "SwiGLU", "RoPE", "MQA", "no biases"])
def test_each_variant_builds_the_model_it_names(variant):
    c = tiny(variant).model.config
    base = tiny().model.config
    changed = {k for k, v in c.to_dict().items() if base.to_dict()[k] != v}
    expected = {
        "RMSNorm": {"norm"},
        "SwiGLU": {"feed_forward", "activation", "d_ff"},
        "RoPE": {"positional"},
        "MQA": {"n_kv_heads"},
        "no biases": {"bias"},
    }[variant]
    assert changed == expected


def test_key_value_heads_divide_the_cache():
    full = tiny().metrics["kv_cache_bytes_per_token"]
    assert tiny("MQA").metrics["kv_cache_bytes_per_token"] == full / TINY["n_heads"]


def test_the_book_variants_have_equal_parameters_where_promised():
    runs = {repr(p): p for _, p in book_runs()}
    assert len(runs) == len(VARIANTS) * len(SEEDS)
    assert len(SEEDS) >= 5  # the chapter reads five seeds of every variant
    assert all(p["max_steps"] == BUDGET_STEPS for p in runs.values())
    for run in book_runs():
        assert run in BOOK_RUNS
    store = ExperimentStore("unused")
    defaults = store.arguments("modern_lm", seed=0)
    d = defaults["d_model"]

    def count(change):
        a = {**defaults, **change}
        config = DecoderOnlyConfig(
            vocab_size=a["vocab_size"], d_model=d, n_heads=a["n_heads"],
            d_ff=a["d_ff"] or 4 * d, n_layers=a["n_layers"], context_length=a["context_length"],
            norm=a["norm"], feed_forward=a["feed_forward"], activation=a["activation"],
            positional=a["positional"], n_kv_heads=a["n_kv_heads"], bias=a["bias"],
        )  # fmt: skip
        return parameter_count(config)

    base, swiglu = count({}), count(VARIANTS["SwiGLU"])
    assert abs(swiglu - base) <= 3 * d  # SwiGLU at equal parameters, within one hidden unit
    assert count(VARIANTS["no biases"]) < base


def test_stretching_a_rotary_model_keeps_what_it_computed_on_the_trained_positions():
    model = tiny("RoPE").model
    n = model.context_length
    longer = stretched(model, 4 * n)
    assert longer.context_length == 4 * n
    assert not longer.training
    ids = np.random.default_rng(0).integers(0, TINY["vocab_size"], (3, 4 * n))
    short, long = model.forward(ids[:, :n]), longer.forward(ids)
    np.testing.assert_allclose(long[:, :n], short, rtol=1e-12, atol=1e-12)  # causal: the same
    interpolated = stretched(model, 4 * n, scaling="linear", factor=4.0)
    assert interpolated.config.rotary_interpolation == 4.0
    assert not np.allclose(interpolated.forward(ids)[:, :n], short)  # positions read as p / 4
    ntk = stretched(model, 4 * n, scaling="ntk", factor=4.0)
    assert ntk.config.rotary_frequency_base > model.config.rotary_frequency_base


def test_a_learned_position_table_cannot_be_stretched():
    model = tiny().model
    with pytest.raises(ValueError, match="positions"):
        stretched(model, 2 * model.context_length)


def test_extrapolation_losses_measure_every_position_of_longer_windows():
    model = tiny("RoPE").model
    length = 2 * model.context_length
    losses, optimal = extrapolation_losses(
        stretched(model, length), seed=1, length=length, n_windows=16, vocab_size=6
    )
    assert losses.shape == optimal.shape == (length,)
    assert (losses > 0).all()
    source, windows = markov_task(1, 6, 2, 4)
    np.testing.assert_allclose(optimal[1:], source.entropy_rate, rtol=1e-12)
    data = windows(16, length, 6)
    np.testing.assert_allclose(losses, per_position_loss(stretched(model, length), data))
    with pytest.raises(ValueError, match="length"):
        extrapolation_losses(model, seed=1, length=length, vocab_size=6)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="n_train_windows"):
        modern_lm(**{**TINY, "n_train_windows": 0})
    with pytest.raises(ValueError, match="norm"):
        modern_lm(**{**TINY, "norm": "batchnorm"})
    with pytest.raises(ValueError, match="n_kv_heads"):
        modern_lm(**{**TINY, "n_kv_heads": 3})
    with pytest.raises(TypeError, match="model"):
        stretched("not a model", 16)
    with pytest.raises(ValueError, match="context_length"):
        stretched(tiny("RoPE").model, 0)
