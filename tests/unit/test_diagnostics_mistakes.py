"""The checks of three more mistakes: misaligned targets, a cache offset, decayed norms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyformer.diagnostics import (
    TargetAlignment,
    cached_logit_gap,
    cached_logits,
    decay_exempt_parameters,
    decay_only_factor,
    restart_positions,
    target_alignment,
    wrongly_decayed,
)
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.optim import SGD, Adam, AdamW, one_dimensional
from tinyformer.training.batches import WindowDataset

VOCAB = 11


def small_model(seed: int = 0, **overrides) -> DecoderOnlyLM:
    settings_ = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2, "context_length": 12}
    settings_.update(overrides)
    config = DecoderOnlyConfig(vocab_size=VOCAB, **settings_)
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed)).eval()


def some_ids(seed: int = 1, shape: tuple[int, int] = (3, 9)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape)


# ------------------------------------------------------------------ targets
def windows(seed: int = 0) -> WindowDataset:
    stream = np.random.default_rng(seed).integers(0, 50, 2000)
    return WindowDataset.from_tokens(stream, 10)


def test_next_token_targets_pass_and_only_offset_one_fits():
    data = windows()
    report = target_alignment(data.inputs, data.targets)
    assert report.is_next_token
    assert report.offset == 1
    assert report.agreement[1] == 1.0
    assert all(report.agreement[k] < 0.1 for k in (-2, -1, 0, 2))  # chance is 1/50


def test_targets_equal_to_inputs_are_caught():
    data = windows()
    report = target_alignment(data.inputs, data.inputs)
    assert not report.is_next_token
    assert report.offset == 0


def test_swapped_inputs_and_targets_are_caught():
    data = windows()
    report = target_alignment(data.targets, data.inputs)
    assert not report.is_next_token
    assert report.offset == -1


def test_targets_two_ahead_are_caught():
    stream = np.random.default_rng(3).integers(0, 50, 200)
    inputs = np.stack([stream[s : s + 10] for s in range(0, 180, 10)])
    targets = np.stack([stream[s + 2 : s + 12] for s in range(0, 180, 10)])
    report = target_alignment(inputs, targets)
    assert report.offset == 2
    assert not report.is_next_token


def test_a_single_token_vocabulary_has_no_unique_offset():
    ones = np.zeros((2, 6), dtype=int)
    report = target_alignment(ones, ones)
    assert report.offset is None
    assert not report.is_next_token


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(4, 12), st.integers(1, 3))
def test_agreement_counts_the_overlap_exactly(seed, t, k_max):
    if t <= k_max:
        return
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 3, (4, t)), rng.integers(0, 3, (4, t))
    report = target_alignment(x, y, max_offset=k_max)
    assert sorted(report.agreement) == list(range(-k_max, k_max + 1))
    for k, share in report.agreement.items():
        pairs = [(y[b, s], x[b, s + k]) for b in range(4) for s in range(t) if 0 <= s + k < t]
        assert share == pytest.approx(np.mean([a == c for a, c in pairs]))


def test_target_alignment_validates_its_inputs():
    with pytest.raises(ValueError, match="one shape"):
        target_alignment(np.zeros((2, 5), int), np.zeros((2, 4), int))
    with pytest.raises(ValueError, match="longer than max_offset=2"):
        target_alignment(np.zeros((2, 2), int), np.zeros((2, 2), int))
    with pytest.raises(TypeError, match="max_offset"):
        target_alignment(np.zeros((2, 5), int), np.zeros((2, 5), int), max_offset=1.5)
    assert isinstance(
        target_alignment(np.zeros((1, 4), int), np.ones((1, 4), int)), TargetAlignment
    )


# ------------------------------------------------------------------ cache offset
@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("prompt_length", [1, 4])
def test_a_correct_cache_matches_the_full_pass(positional, prompt_length):
    gap = cached_logit_gap(small_model(positional=positional), some_ids(), prompt_length)
    assert gap.shape == (9,)
    assert gap.max() < 1e-10  # float64 model: rounding only


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_restarted_positions_break_every_step_after_the_prompt(positional):
    model = restart_positions(small_model(positional=positional))
    gap = cached_logit_gap(model, some_ids(), prompt_length=3)
    assert gap[:3].max() < 1e-10  # the prompt is fed at its right positions
    assert (gap[3:] > 1e-3).all()  # every later token is at position 0 instead


def test_restarted_positions_leave_the_full_pass_alone():
    ids = some_ids()
    right = small_model().forward(ids)
    wrong = restart_positions(small_model()).forward(ids)
    np.testing.assert_array_equal(right, wrong)


def test_cached_logits_have_the_model_dtype_and_shape():
    model = small_model(dtype="float32")
    out = cached_logits(model, some_ids(), 2)
    assert out.shape == (3, 9, VOCAB)
    assert out.dtype == np.float32


def test_restart_positions_refuses_models_without_absolute_positions():
    with pytest.raises(TypeError, match="learned or sinusoidal positions"):
        restart_positions(small_model(positional="rotary"))
    with pytest.raises(TypeError, match="learned or sinusoidal positions"):
        restart_positions(object())


def test_cached_logit_gap_validates_its_inputs():
    with pytest.raises(TypeError, match="start and step"):
        cached_logit_gap(lambda ids: ids, some_ids())
    with pytest.raises(ValueError, match="prompt_length must be at most T = 9"):
        cached_logit_gap(small_model(), some_ids(), prompt_length=10)
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        cached_logit_gap(small_model(), np.array([1, 2, 3]))


# ------------------------------------------------------------------ weight decay
def test_exempt_parameters_are_norms_biases_and_embeddings():
    model = small_model(n_layers=1)
    exempt = decay_exempt_parameters(model)
    assert exempt["decoder.embedding.weight"] == "embedding"
    assert exempt["decoder.positions.weight"] == "embedding"
    assert exempt["decoder.final_norm.gain"] == "norm"
    assert exempt["decoder.layers.0.self_attention.layer.q_proj.bias"] == "bias"
    names = dict(model.named_parameters())
    decayed = [n for n in names if n not in exempt]
    assert decayed
    assert all(n.endswith(".weight") and names[n].value.ndim == 2 for n in decayed)
    assert all(names[n].value.ndim < 2 for n, kind in exempt.items() if kind != "embedding")


def test_rmsnorm_gains_are_exempt_and_sinusoidal_tables_hold_no_parameter():
    model = small_model(norm="rmsnorm", positional="sinusoidal", bias=False)
    exempt = decay_exempt_parameters(model)
    gains = [
        *(
            f"decoder.layers.{i}.{block}.norm.gain"
            for i in (0, 1)
            for block in ("self_attention", "feed_forward")
        ),
        "decoder.final_norm.gain",
    ]
    assert exempt == {"decoder.embedding.weight": "embedding", **dict.fromkeys(gains, "norm")}
    assert list(exempt) == [n for n, _ in model.named_parameters() if n in exempt]


def test_decaying_everything_is_reported_and_groups_fix_it():
    model = small_model()
    params = model.parameters()
    exempt = decay_exempt_parameters(model)
    wrong = AdamW(params, 1e-3, weight_decay=0.1)
    assert wrongly_decayed(model, wrong) == list(exempt)
    named = dict(model.named_parameters())
    right = AdamW(params, 1e-3, weight_decay=0.1, no_decay=[named[n] for n in exempt])
    assert wrongly_decayed(model, right) == []
    two_d = AdamW(params, 1e-3, weight_decay=0.1, no_decay=one_dimensional(params))
    assert wrongly_decayed(model, two_d) == [
        "decoder.embedding.weight",
        "decoder.positions.weight",
    ]


def test_no_decay_at_all_and_coupled_decay():
    model = small_model()
    assert wrongly_decayed(model, AdamW(model.parameters(), 1e-3, weight_decay=0.0)) == []
    assert wrongly_decayed(model, SGD(model.parameters(), 1e-3, weight_decay=0.1))
    assert wrongly_decayed(model, Adam(model.parameters(), 1e-3, weight_decay=0.1))


def test_a_decayed_step_with_no_gradient_pulls_gains_toward_zero():
    model = small_model(dtype="float32")
    optimizer = AdamW(model.parameters(), 1e-2, weight_decay=0.1)
    model.zero_grad()
    optimizer.step()
    gain = dict(model.named_parameters())["decoder.final_norm.gain"].value
    assert gain.dtype == np.float32
    np.testing.assert_array_equal(gain, np.float32(1.0) * np.float32(1.0 - 1e-3))


def test_wrongly_decayed_validates_its_inputs():
    with pytest.raises(TypeError, match="optimizer must be a tinyformer Optimizer"):
        wrongly_decayed(small_model(), object())
    with pytest.raises(TypeError, match="model must be a tinyformer Module"):
        decay_exempt_parameters(object())


def test_decay_only_factor_is_the_product_of_the_per_step_factors():
    model = small_model(dtype="float32")
    optimizer = AdamW(model.parameters(), 1e-2, weight_decay=0.1)
    assert decay_only_factor(optimizer, 300) == pytest.approx((1 - 1e-3) ** 300, rel=1e-12)
    assert decay_only_factor(AdamW(model.parameters(), 1e-2, weight_decay=0.0), 10) == 1.0
    scheduled = AdamW(model.parameters(), lambda t: 1e-2 / t, weight_decay=0.5)
    expected = np.prod([1 - 0.5e-2 / t for t in range(1, 6)])
    assert decay_only_factor(scheduled, 5) == pytest.approx(expected, rel=1e-12)


def test_decay_only_factor_matches_a_run_with_zero_gradients():
    model = small_model()
    optimizer = AdamW(model.parameters(), lambda t: 0.05 * (1 + np.cos(t)), weight_decay=0.3)
    for _ in range(7):
        model.zero_grad()
        optimizer.step()
    gain = dict(model.named_parameters())["decoder.final_norm.gain"].value
    fresh = AdamW(small_model().parameters(), lambda t: 0.05 * (1 + np.cos(t)), weight_decay=0.3)
    np.testing.assert_allclose(gain, decay_only_factor(fresh, 7), rtol=1e-12)


def test_decay_only_factor_validates_its_inputs():
    with pytest.raises(TypeError, match="optimizer must be a tinyformer AdamW"):
        decay_only_factor(object(), 3)
    with pytest.raises(ValueError, match="n_steps"):
        decay_only_factor(AdamW(small_model().parameters()), 0)


@pytest.mark.parametrize(
    ("optimizer_class", "settings_"), [(Adam, {}), (SGD, {"momentum": 0.9}), (SGD, {})]
)
def test_decay_only_factor_refuses_coupled_decay(optimizer_class, settings_):
    optimizer = optimizer_class(small_model().parameters(), 1e-2, weight_decay=0.1, **settings_)
    with pytest.raises(TypeError, match="optimizer must be a tinyformer AdamW"):
        decay_only_factor(optimizer, 50)


def test_decay_only_factor_refuses_a_step_that_flips_the_sign():
    too_big = AdamW(small_model().parameters(), 1.0, weight_decay=3.0)
    with pytest.raises(ValueError, match="lr \\* weight_decay <= 1 at every step"):
        decay_only_factor(too_big, 2)
    schedule = AdamW(small_model().parameters(), lambda t: 0.1 * t, weight_decay=2.0)
    assert decay_only_factor(schedule, 5) == pytest.approx(0.8 * 0.6 * 0.4 * 0.2 * 0.0)
    with pytest.raises(ValueError, match="at step 6"):
        decay_only_factor(schedule, 6)
    exact = AdamW(small_model().parameters(), 0.5, weight_decay=2.0)
    assert decay_only_factor(exact, 3) == 0.0  # eta * lambda = 1: allowed, the value is gone


def test_cached_logits_refuse_a_model_in_training_mode():
    model = small_model(dropout=0.5).train()
    with pytest.raises(ValueError, match=r"evaluation mode \(call \.eval\(\)\)"):
        cached_logit_gap(model, some_ids())
    with pytest.raises(ValueError, match="evaluation mode"):
        cached_logits(model, some_ids())
    assert cached_logit_gap(model.eval(), some_ids()).max() < 1e-9


def test_target_alignment_refuses_an_empty_batch():
    empty = np.zeros((0, 5), dtype=np.int64)
    with pytest.raises(ValueError, match="non-empty"):
        target_alignment(empty, empty)
