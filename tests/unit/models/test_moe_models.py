"""A mixture of experts inside whole models: configuration, training, gradients, decoding, files."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tinyformer import cost
from tinyformer.checkpoint import read_checkpoint, save_checkpoint
from tinyformer.gradcheck import check_parameter_gradients
from tinyformer.losses import cross_entropy
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    EncoderOnlyMLM,
)
from tinyformer.models.counting import (
    active_parameter_count,
    modern_sizes,
    parameter_count,
    parameter_terms,
)
from tinyformer.models.loading import model_from_checkpoint
from tinyformer.moe import MixtureOfExperts
from tinyformer.optim import Adam
from tinyformer.training import Trainer, WindowDataset, lm_loss

MOE = {"feed_forward": "moe", "n_experts": 3, "experts_per_token": 2, "activation": "silu"}


def lm(seed: int = 0, **options) -> DecoderOnlyLM:
    sizes = {"d_model": 8, "n_heads": 2, "d_ff": 6, "context_length": 10, "n_layers": 2}
    return DecoderOnlyLM(
        DecoderOnlyConfig(11, **{**sizes, **MOE, **options}), rng=np.random.default_rng(seed)
    )


def moe_layers(model) -> list[MixtureOfExperts]:
    return [m for m in model.modules() if isinstance(m, MixtureOfExperts)]


def windows(n: int, length: int, seed: int = 0) -> WindowDataset:
    """Windows of a repeating sequence with a little noise: a pattern to learn."""
    rng = np.random.default_rng(seed)
    tokens = np.tile(np.arange(11), 40)
    tokens = np.where(rng.random(tokens.size) < 0.05, rng.integers(0, 11, tokens.size), tokens)
    starts = rng.integers(0, tokens.size - length - 1, n)
    inputs = np.stack([tokens[s : s + length] for s in starts])
    targets = np.stack([tokens[s + 1 : s + length + 1] for s in starts])
    return WindowDataset(inputs, targets)


# ------------------------------------------------------------------ building
def test_every_family_builds_its_blocks_with_experts():
    experts = {**MOE, "expert_capacity_factor": 1.5, "router_aux_loss_weight": 0.01}
    sizes = {"d_model": 8, "n_heads": 2, "d_ff": 6, "context_length": 10}
    models = [
        DecoderOnlyLM(DecoderOnlyConfig(11, **sizes, **experts), rng=np.random.default_rng(0)),
        EncoderOnlyMLM(EncoderOnlyConfig(11, **sizes, **experts), rng=np.random.default_rng(0)),
        EncoderDecoder(
            EncoderDecoderConfig(11, 12, **sizes, **experts), rng=np.random.default_rng(0)
        ),
    ]
    for model, n_blocks in zip(models, (2, 2, 4), strict=True):
        layers = moe_layers(model)
        assert len(layers) == n_blocks  # one in every block (of both stacks)
        for layer in layers:
            assert (layer.n_experts, layer.top_k, layer.feed_forward) == (3, 2, "gated")
            assert (layer.capacity_factor, layer.aux_loss_weight) == (1.5, 0.01)
            assert layer.experts[0].activation == "silu"
        assert parameter_count(model.config) == model.num_parameters()


@pytest.mark.parametrize("expert_feed_forward", ["gated", "plain"])
@pytest.mark.parametrize("bias", [True, False])
def test_closed_form_counts_equal_the_built_model(expert_feed_forward, bias):
    model = lm(expert_feed_forward=expert_feed_forward, bias=bias, tie_output=False)
    config = model.config
    assert parameter_count(config) == model.num_parameters()
    # active: everything but the experts a token does not use, counted from the model itself
    idle = sum(
        sum(e.num_parameters() for e in layer.experts[layer.top_k :])
        for layer in moe_layers(model)
    )
    assert active_parameter_count(config) == model.num_parameters() - idle
    assert active_parameter_count(config) == model.num_parameters() - sum(
        layer.total_parameters() - layer.active_parameters_per_token()
        for layer in moe_layers(model)
    )
    terms, active = parameter_terms(config), parameter_terms(config, active=True)
    assert {k for k in terms if terms[k] != active[k]} == {"blocks"}
    dense = dataclasses.replace(
        config, feed_forward=expert_feed_forward, n_experts=None, experts_per_token=2
    )
    assert active_parameter_count(dense) == parameter_count(dense)  # a dense model uses all
    with pytest.raises(TypeError, match="active must be True or False"):
        parameter_terms(config, active=1)


def test_mixtral_preset_counts_the_released_weights_and_its_active_share():
    row = {r.name: r for r in modern_sizes()}["Mixtral 8x7B"]
    config = row.config
    assert parameter_count(config) == row.released == 46_702_792_704
    d, d_kv, d_ff, layers, v = 4096, 1024, 14336, 32, 32000
    attention, expert, router, norms = 2 * d * d + 2 * d * d_kv, 3 * d * d_ff, d * 8, 2 * d
    assert parameter_count(config) == 2 * v * d + d + layers * (
        attention + 8 * expert + router + norms
    )
    active = 2 * v * d + d + layers * (attention + 2 * expert + router + norms)
    assert active_parameter_count(config) == active == 12_879_925_248  # "13B active"
    assert (config.n_experts, config.experts_per_token, config.rotary_base) == (8, 2, 1e6)


def test_old_configuration_dicts_load_without_experts():
    saved = DecoderOnlyConfig(11).to_dict()
    for name in (
        "n_experts",
        "experts_per_token",
        "expert_feed_forward",
        "expert_capacity_factor",
        "router_aux_loss_weight",
    ):
        del saved[name]
    config = DecoderOnlyConfig.from_dict(saved)
    assert (config.feed_forward, config.n_experts, config.router_aux_loss_weight) == (
        "plain",
        None,
        0.0,
    )


def test_configuration_combinations_are_refused_by_name():
    with pytest.raises(ValueError, match="experts_per_token must be at most n_experts=3, got 4"):
        DecoderOnlyConfig(11, **{**MOE, "experts_per_token": 4})
    with pytest.raises(ValueError, match="n_experts must be a positive integer"):
        DecoderOnlyConfig(11, **{**MOE, "n_experts": 0})
    with pytest.raises(TypeError, match="n_experts must be a positive integer"):
        DecoderOnlyConfig(11, **{**MOE, "n_experts": 2.0})
    with pytest.raises(ValueError, match="n_experts must be None unless feed_forward='moe'"):
        DecoderOnlyConfig(11, feed_forward="gated", n_experts=4)
    config = DecoderOnlyConfig(11, **MOE, expert_capacity_factor=2, router_aux_loss_weight=1)
    assert type(config.expert_capacity_factor) is type(config.router_aux_loss_weight) is float


# ------------------------------------------------------------------ training
def test_a_model_with_experts_trains_and_reports_its_auxiliary_loss():
    model = lm(seed=3, router_aux_loss_weight=0.05)
    data = windows(64, 8)
    trainer = Trainer(
        model,
        Adam(model.parameters(), 0.02),
        lm_loss,
        data,
        batch_size=8,
        rng=np.random.default_rng(1),
    )
    losses = []
    for _ in range(30):
        result, _, _ = trainer.train_step()
        # the reported loss is cross-entropy plus the weighted auxiliary losses of both layers
        aux = sum(0.05 * layer.aux_loss for layer in moe_layers(model))
        assert result.aux_loss == pytest.approx(aux, rel=1e-12)
        assert 0 < result.aux_loss <= 2 * 0.05 * 3  # each L_aux = E sum f_i P_i <= E max P_i
        losses.append(result.loss)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    # evaluation reports the cross-entropy alone, beside the auxiliary term
    inputs, targets = data.batch(np.arange(8))
    model.eval()
    result = lm_loss(model, (inputs, targets), backward=False)
    expected, _ = cross_entropy(model.forward(inputs), targets)
    assert result.loss == expected
    assert result.aux_loss > 0


def test_the_reported_training_loss_is_the_differentiated_one():
    """Cross-entropy plus weighted auxiliary losses, exactly; without a weight, untouched."""
    data = windows(4, 6)
    batch = data.batch(np.arange(4))
    for weight in (0.0, 0.3):
        model = lm(seed=1, router_aux_loss_weight=weight)
        result = lm_loss(model, batch)
        cross, _ = cross_entropy(model.forward(batch[0]), batch[1])
        aux = sum(weight * layer.aux_loss for layer in moe_layers(model))
        assert result.loss == cross + aux if weight else result.loss == cross
        assert result.aux_loss == aux


# ------------------------------------------------------------------ gradients
def _assert_routing_never_changed(model, run):
    """Record every layer's routing in every forward pass ``run`` makes; all must agree.

    A finite-difference step that flipped a top-k choice (a near tie) would break the
    comparison, so the check asserts that none did.
    """
    seen: dict[int, list] = {}
    for i, layer in enumerate(moe_layers(model)):
        forward = layer.forward

        def recording(x, _forward=forward, _layer=layer, _i=i):
            y = _forward(x)
            routing = _layer.routing
            seen.setdefault(_i, []).append((routing.choices.copy(), routing.kept.copy()))
            return y

        layer.forward = recording
    try:
        errors = run()
    finally:
        for layer in moe_layers(model):
            del layer.forward
    for records in seen.values():
        assert len(records) > 100  # the check did run many forward passes
        choices, kept = records[0]
        for c, k in records[1:]:
            np.testing.assert_array_equal(c, choices)
            np.testing.assert_array_equal(k, kept)
    return errors


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"router_aux_loss_weight": 0.3}, id="load-balancing loss"),
        pytest.param(
            {"expert_capacity_factor": 0.7, "expert_feed_forward": "plain", "activation": "gelu"},
            id="capacity dropping, plain experts",
        ),
    ],
)
def test_whole_model_gradients_match_finite_differences(options):
    model = lm(
        seed=4, d_model=4, d_ff=3, context_length=6, tie_output=False, norm="rmsnorm", **options
    )
    rng = np.random.default_rng(5)
    for p in model.parameters():  # away from the initial values: every parameter matters
        p.value += 0.1 * rng.standard_normal(p.shape)
    for layer in moe_layers(model):
        layer.router.weight.value *= 4  # wide gaps between the router's logits
    ids = rng.integers(0, 11, (2, 5))
    upstream = rng.standard_normal((2, 5, 11))

    def run():
        logits = model.forward(ids)
        aux = sum(layer.aux_loss_weight * layer.aux_loss for layer in moe_layers(model))
        return float(np.sum(logits * upstream)) + aux, upstream

    errors = _assert_routing_never_changed(model, lambda: check_parameter_gradients(model, run))
    assert len(errors) == len(model.parameters())
    assert max(errors.values()) < 1e-6, {k: v for k, v in errors.items() if v >= 1e-6}
    model.forward(ids)
    layers = moe_layers(model)
    if "expert_capacity_factor" in options:
        assert sum(layer.n_dropped for layer in layers) > 0  # dropping was active
    for layer in layers:
        assert np.abs(layer.router.weight.grad).max() > 1e-4  # the router learned something
        assert len(set(layer.routing.choices.ravel().tolist())) > 1


# ------------------------------------------------------------------ decoding and files
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cached_decoding_equals_the_full_forward_pass(dtype):
    model = lm(seed=2, dtype=dtype)
    model.eval()
    ids = np.random.default_rng(3).integers(0, 11, (3, 7))
    full = model.forward(ids)
    assert full.dtype == np.dtype(dtype)
    state = model.start(3)
    steps = [model.step(ids[:, :3], state)]  # a prompt, then one token at a time
    steps += [model.step(ids[:, t : t + 1], state) for t in range(3, 7)]
    tolerance = {"float64": 1e-12, "float32": 1e-5}[dtype]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=tolerance)


def test_checkpoint_round_trip(tmp_path):
    model = lm(seed=5, expert_capacity_factor=1.25, router_aux_loss_weight=0.01)
    optimizer = Adam(model.parameters(), 0.01)
    batch = windows(4, 6).batch(np.arange(4))
    lm_loss(model, batch)
    optimizer.step()
    path = save_checkpoint(tmp_path / "moe.npz", model, optimizer, step=1)
    checkpoint = read_checkpoint(path)
    assert checkpoint.config["n_experts"] == 3
    loaded = model_from_checkpoint(checkpoint)
    assert loaded.config == model.config
    for (name, p), (other, q) in zip(
        model.named_parameters(), loaded.named_parameters(), strict=True
    ):
        assert name == other
        np.testing.assert_array_equal(p.value, q.value, err_msg=name)
    assert "decoder.layers.1.feed_forward.layer.experts.2.linear_out.weight" in loaded.state_dict()
    np.testing.assert_array_equal(loaded.forward(batch[0]), model.forward(batch[0]))


# ------------------------------------------------------------------ cost
@pytest.mark.parametrize("expert_feed_forward", ["gated", "plain"])
def test_counted_matmuls_equal_the_flop_formula(expert_feed_forward):
    model = lm(expert_feed_forward=expert_feed_forward, d_model=16, n_heads=4, d_ff=24)
    config = model.config
    ids = np.random.default_rng(1).integers(0, 11, (3, 10))
    with cost.count_matmuls(model) as forward:
        logits = model.forward(ids)
    _, grad = cross_entropy(logits, ids)
    with cost.count_matmuls(model) as backward:
        model.backward(grad)
    terms = cost.forward_flops(config, 10, 3)
    assert forward.matrix == sum(terms.values())
    assert backward.matrix == 2 * forward.matrix
    n, d, width = 30, 16, 24
    per_expert = (6 if expert_feed_forward == "gated" else 4) * d * width
    assert terms["feed-forward"] == 2 * (2 * n * d * 3 + 2 * n * per_expert)  # 2 of 3 experts
    with pytest.raises(ValueError, match="feed_forward='moe'"):
        cost.activation_bytes(config, 10)
    dense = dataclasses.replace(config, feed_forward="gated", n_experts=None)
    assert cost.forward_flops(dense, 10, 3)["feed-forward"] == 2 * 3 * 6 * 10 * d * width


def test_auxiliary_loss_is_one_for_a_uniform_router():
    """A zero router gives every expert probability 1/E: L_aux = E sum_i f_i / E = 1."""
    model = lm(router_aux_loss_weight=0.5)
    for layer in moe_layers(model):
        layer.router.weight.value[...] = 0
    result = lm_loss(model, windows(2, 5).batch(np.arange(2)))
    assert result.aux_loss == pytest.approx(2 * 0.5, rel=1e-12)
    assert math.isfinite(result.loss)
