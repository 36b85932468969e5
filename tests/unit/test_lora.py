"""Low-rank adapters: exact gradients, a frozen base, merging, saving the adapters alone."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import small_models

from tinyformer.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from tinyformer.gradcheck import check_module_gradients, max_relative_error, numerical_gradient
from tinyformer.layers import Linear
from tinyformer.lora import (
    LoRALinear,
    apply_lora,
    load_lora_state_dict,
    lora_layers,
    lora_state_dict,
    merge_lora,
    remove_lora,
    unmerge_lora,
)
from tinyformer.losses import cross_entropy
from tinyformer.models.loading import load_model
from tinyformer.module import no_grad
from tinyformer.optim import Adam
from tinyformer.training import Trainer, lm_loss


def _layer(rng, d_in=5, d_out=4, rank=2, *, bias=True, dropout=0.0, dtype=np.float64):
    """A LoRALinear over a random Linear, with B made nonzero (else A's gradient is zero)."""
    base = Linear(d_in, d_out, rng=rng, bias=bias, dtype=dtype)
    if bias:
        base.bias.value[...] = rng.standard_normal(d_out)
    layer = LoRALinear(base, rank, alpha=3.0, rng=rng, dropout=dropout)
    layer.lora_B.value[...] = rng.standard_normal(layer.lora_B.shape)
    return layer


def _check_layer_gradients(layer, x, rng, before_forward=lambda: None):
    """Relative errors of the gradients of x, A and B against finite differences."""
    upstream = rng.standard_normal((*x.shape[:-1], layer.d_out))

    def loss():
        before_forward()
        return layer.forward(x) * upstream

    layer.zero_grad()
    before_forward()
    layer.forward(x)
    grad_x = layer.backward(upstream)
    pairs = {
        "x": (grad_x, numerical_gradient(loss, x)),
        "A": (layer.lora_A.grad.copy(), numerical_gradient(loss, layer.lora_A.value)),
        "B": (layer.lora_B.grad.copy(), numerical_gradient(loss, layer.lora_B.value)),
    }
    magnitude = max(float(np.abs(n).max()) for _, n in pairs.values())
    return {k: max_relative_error(a, n, magnitude=magnitude) for k, (a, n) in pairs.items()}


# ---------------------------------------------------------------- the layer
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_gradients_match_finite_differences(seed, bias):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, bias=bias, rank=1 + seed)
    x = rng.standard_normal((2, 3, layer.d_in))
    errors = _check_layer_gradients(layer, x, rng)
    assert max(errors.values()) < 1e-8, errors
    # the base is frozen: its gradients are never touched
    assert not layer.base.weight.grad.any()
    assert not bias or not layer.base.bias.grad.any()


def test_layer_gradients_with_adapter_dropout():
    rng = np.random.default_rng(3)
    layer = _layer(rng, d_in=6, d_out=5, rank=3, dropout=0.4)
    state = copy.deepcopy(layer.dropout.rng.bit_generator.state)

    def same_mask():
        layer.dropout.rng.bit_generator.state = state

    x = rng.standard_normal((4, layer.d_in))
    errors = _check_layer_gradients(layer, x, rng, same_mask)
    assert max(errors.values()) < 1e-8, errors
    # dropout acts on the adapter's path only: with B = 0 the output is the base's
    layer.lora_B.value[...] = 0.0
    assert np.array_equal(layer.forward(x), layer.base.forward(x))


def test_dropout_draws_only_in_training_mode():
    rng = np.random.default_rng(4)
    layer = _layer(rng, dropout=0.5)
    x = rng.standard_normal((6, layer.d_in))
    train = [layer.forward(x) for _ in range(2)]
    assert not np.array_equal(*train)
    layer.eval()
    evaluate = [layer.forward(x) for _ in range(2)]
    assert np.array_equal(*evaluate)
    expected = layer.base.forward(x) + layer.scale * (x @ layer.lora_A.value) @ layer.lora_B.value
    np.testing.assert_allclose(evaluate[0], expected, rtol=1e-13, atol=1e-13)


def test_layer_computes_the_low_rank_update():
    rng = np.random.default_rng(5)
    layer = _layer(rng, rank=3)
    x = rng.standard_normal((2, 3, layer.d_in))
    w, b = layer.base.weight.value, layer.base.bias.value
    a, bb = layer.lora_A.value, layer.lora_B.value
    expected = x @ w + b + (3.0 / 3) * (x @ a) @ bb
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-13, atol=1e-13)
    assert layer.scale == 1.0


def test_float32_in_gives_float32_out_and_gradients():
    rng = np.random.default_rng(6)
    layer = _layer(rng, dtype=np.float32)
    x = rng.standard_normal((3, layer.d_in)).astype(np.float32)
    y = layer.forward(x)
    grad_x = layer.backward(np.ones_like(y))
    assert y.dtype == grad_x.dtype == layer.lora_A.grad.dtype == layer.lora_B.grad.dtype
    assert y.dtype == np.float32
    with pytest.raises(TypeError, match="x must have the layer's dtype float32"):
        layer.forward(x.astype(np.float64))


def test_initialization_b_zero_and_a_as_documented():
    rng = np.random.default_rng(7)
    d_in, d_out, rank = 400, 300, 8
    uniform = LoRALinear(Linear(d_in, d_out, rng=rng), rank, alpha=16, rng=rng)
    assert not uniform.lora_B.value.any()
    bound = 1 / np.sqrt(d_in)
    assert np.abs(uniform.lora_A.value).max() <= bound
    assert np.abs(uniform.lora_A.value).max() > 0.99 * bound
    # U(-c, c) has standard deviation c / sqrt(3); 3,200 draws give it to about 1.3%
    assert abs(uniform.lora_A.value.std() / (bound / np.sqrt(3)) - 1) < 0.05
    gaussian = LoRALinear(Linear(d_in, d_out, rng=rng), rank, alpha=16, rng=rng, init="gaussian")
    assert abs(gaussian.lora_A.value.std() * rank - 1) < 0.05
    assert not gaussian.lora_B.value.any()
    assert uniform.scale == gaussian.scale == 2.0


def test_same_seed_same_adapters():
    make = [
        LoRALinear(
            Linear(6, 6, rng=np.random.default_rng(0)), 2, alpha=1, rng=np.random.default_rng(9)
        )
        for _ in range(2)
    ]
    assert np.array_equal(make[0].lora_A.value, make[1].lora_A.value)


def test_backward_needs_a_forward_with_grad_and_an_unmerged_layer():
    rng = np.random.default_rng(8)
    layer = _layer(rng)
    x = rng.standard_normal((2, layer.d_in))
    with no_grad():
        y = layer.forward(x)
    with pytest.raises(RuntimeError, match="no_grad"):
        layer.backward(np.ones_like(y))
    layer.merge()
    y = layer.forward(x)
    with pytest.raises(RuntimeError, match="merged"):
        layer.backward(np.ones_like(y))
    with pytest.raises(RuntimeError, match="already merged"):
        layer.merge()
    layer.unmerge()
    with pytest.raises(RuntimeError, match="not merged"):
        layer.unmerge()
    y = layer.forward(x)
    with pytest.raises(ValueError, match="grad_out must have the forward output's shape"):
        layer.backward(np.ones((3, layer.d_out)))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rank": 0}, ValueError, r"rank must be in \[1, min\(d_in, d_out\)\] = \[1, 4\]"),
        ({"rank": -2}, ValueError, "rank must be in"),
        ({"rank": 5}, ValueError, "got 5"),
        ({"rank": 2.0}, TypeError, "rank must be a positive integer"),
        ({"rank": True}, TypeError, "rank must be a positive integer"),
        ({"alpha": "8"}, TypeError, "alpha must be a positive number"),
        ({"alpha": True}, TypeError, "alpha must be a positive number"),
        ({"alpha": 0}, ValueError, "alpha must be a finite positive number"),
        ({"alpha": -1.0}, ValueError, "alpha must be a finite positive number"),
        ({"alpha": float("inf")}, ValueError, "alpha must be a finite positive number"),
        ({"rng": 0}, TypeError, "rng must be a numpy.random.Generator"),
        ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
        ({"init": "kaiming"}, ValueError, "init must be one of 'uniform', 'gaussian'"),
    ],
)
def test_layer_rejects_bad_arguments(kwargs, error, match):
    settings = {"rank": 2, "alpha": 4.0, "rng": np.random.default_rng(0), **kwargs}
    base = Linear(6, 4, rng=np.random.default_rng(0))
    rank = settings.pop("rank")
    with pytest.raises(error, match=match):
        LoRALinear(base, rank, **settings)


def test_rank_equal_to_the_smaller_width_is_allowed():
    layer = LoRALinear(
        Linear(6, 4, rng=np.random.default_rng(0)), 4, alpha=1, rng=np.random.default_rng(1)
    )
    assert layer.lora_A.shape == (6, 4)
    assert layer.lora_B.shape == (4, 4)


def test_base_must_be_a_linear():
    with pytest.raises(
        TypeError, match="base must be a tinyformer Linear layer, got an array of shape"
    ):
        LoRALinear(np.zeros((3, 3)), 1, alpha=1, rng=np.random.default_rng(0))


# ---------------------------------------------------------------- whole models
IDS = np.random.default_rng(11).integers(0, 9, (3, 10))


def _loss_and_grad(model, ids=IDS):
    logits = model.forward(ids[:, :-1])
    return cross_entropy(logits, ids[:, 1:])


def _adapted(seed=0, rank=2, alpha=4.0, **options):
    model = small_models.decoder_only(seed, **options)
    base = copy.deepcopy(model)
    names = apply_lora(model, rank, alpha, rng=np.random.default_rng(100 + seed))
    return model, base, names


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_apply_lora_names_the_adapted_layers_and_starts_equal_to_the_base(dtype):
    model, base, names = _adapted(dtype=dtype)
    assert all(p.dtype == np.dtype(dtype) for p in model.trainable_parameters())
    assert names == [
        f"decoder.layers.{i}.self_attention.layer.{p}"
        for i in (0, 1)
        for p in ("q_proj", "v_proj")
    ]
    assert list(lora_layers(model)) == names
    # B = 0: the adapted model computes bitwise the base model's logits
    assert np.array_equal(model.forward(IDS), base.forward(IDS))


@pytest.mark.parametrize("rank", [1, 3])
def test_trainable_parameter_count(rank):
    model, base, names = _adapted(rank=rank)
    layers = lora_layers(model)
    expected = sum(rank * (layer.d_in + layer.d_out) for layer in layers.values())
    assert expected == 4 * rank * (8 + 8)
    assert sum(p.value.size for p in model.trainable_parameters()) == expected
    assert model.num_parameters() - base.num_parameters() == expected
    assert len(model.trainable_parameters()) == 2 * len(names)


def test_model_gradients_of_the_adapters_match_finite_differences():
    model, _, _ = _adapted(seed=1, rank=2, norm_first=True)
    small_models.perturb(model, seed=2)  # B nonzero, so that A has a gradient
    model.zero_grad()
    _, grad = _loss_and_grad(model)
    model.backward(grad)
    pairs = {}
    for name, layer in lora_layers(model).items():
        for p in ("lora_A", "lora_B"):
            param = getattr(layer, p)
            pairs[f"{name}.{p}"] = (
                param.grad.copy(),
                numerical_gradient(lambda: _loss_and_grad(model)[0], param.value),
            )
        assert not layer.base.weight.grad.any()  # frozen: no gradient computed
        assert not layer.base.bias.grad.any()
    magnitude = max(float(np.abs(n).max()) for _, n in pairs.values())
    errors = {k: max_relative_error(a, n, magnitude=magnitude) for k, (a, n) in pairs.items()}
    assert max(errors.values()) < 1e-6, errors


def test_adam_on_the_adapters_changes_only_them_and_lowers_the_loss():
    model, base, _ = _adapted(seed=2, rank=2, alpha=8.0)
    trainable = model.trainable_parameters()
    adapter_ids = {id(p) for p in trainable}
    before = {name: p.value.copy() for name, p in model.named_parameters()}
    optimizer = Adam(trainable, lr=1e-2)
    losses = []
    for _ in range(25):
        model.zero_grad()
        loss, grad = _loss_and_grad(model)
        model.backward(grad)
        optimizer.step()
        losses.append(loss)
    # optimizer state for the adapters alone
    assert len(optimizer.buffers["exp_avg"]) == len(trainable) == 8
    for name, p in model.named_parameters():
        if id(p) in adapter_ids:
            assert not np.array_equal(p.value, before[name]), name
        else:
            assert np.array_equal(p.value, before[name]), name  # bitwise unchanged
    assert losses[-1] < losses[0] - 0.2, (losses[0], losses[-1])
    # the base model's parameters are those of the frozen model, bitwise
    for name, p in base.named_parameters():
        adapted = name.replace("q_proj.", "q_proj.base.").replace("v_proj.", "v_proj.base.")
        assert np.array_equal(before[adapted], p.value), name


def _trained(seed=3, steps=10, **options):
    model, base, names = _adapted(seed=seed, rank=2, alpha=8.0, **options)
    optimizer = Adam(model.trainable_parameters(), lr=3e-2)
    for _ in range(steps):
        model.zero_grad()
        model.backward(_loss_and_grad(model)[1])
        optimizer.step()
    return model, base, names


def test_merge_gives_the_same_logits_and_unmerge_restores_the_weights():
    model, _, names = _trained()
    logits = model.forward(IDS)
    layers = lora_layers(model)
    weights = {name: layer.base.weight.value.copy() for name, layer in layers.items()}
    deltas = {name: layer.delta() for name, layer in layers.items()}
    assert min(np.abs(d).max() for d in deltas.values()) > 1e-2  # the adapters did learn
    assert merge_lora(model) == names
    merged = model.forward(IDS)
    assert np.abs(merged - logits).max() < 1e-12
    for name, layer in layers.items():  # the merged weight is W + (alpha / r) A B
        np.testing.assert_allclose(
            layer.base.weight.value, weights[name] + deltas[name], rtol=0, atol=1e-15
        )
    with pytest.raises(RuntimeError, match="already merged"):
        merge_lora(model)
    assert unmerge_lora(model) == names
    for name, layer in layers.items():
        error = np.abs(layer.base.weight.value - weights[name])
        # (W + D) - D is W to within one unit in the last place of |W| + |D|
        assert (error <= np.spacing(np.abs(weights[name]) + np.abs(deltas[name]))).all()
    assert np.abs(model.forward(IDS) - logits).max() < 1e-13
    with pytest.raises(RuntimeError, match="not merged"):
        unmerge_lora(model)


def test_cached_decoding_runs_the_adapters():
    model, _, _ = _trained(seed=4, steps=5)
    model.eval()
    full = model.forward(IDS)
    state = model.start(IDS.shape[0])
    steps = np.concatenate(
        [model.step(IDS[:, :4], state)]
        + [model.step(IDS[:, t : t + 1], state) for t in range(4, 10)],
        axis=1,
    )
    np.testing.assert_allclose(steps, full, rtol=0, atol=1e-12)


def test_adapter_state_round_trip_through_npz(tmp_path):
    model, base, names = _trained(seed=5)
    state = lora_state_dict(model)
    assert sorted(state) == sorted(f"{n}.{p}" for n in names for p in ("lora_A", "lora_B"))
    path = tmp_path / "adapters.npz"
    np.savez(path, **state)
    fresh = copy.deepcopy(base)
    apply_lora(fresh, 2, 8.0, rng=np.random.default_rng(999))  # another A, B = 0
    assert not np.array_equal(fresh.forward(IDS), model.forward(IDS))
    with np.load(path) as saved:
        load_lora_state_dict(fresh, saved)
    assert np.array_equal(fresh.forward(IDS), model.forward(IDS))
    # the copies are copies
    state[names[0] + ".lora_B"][...] = 0.0
    assert lora_layers(model)[names[0]].lora_B.value.any()


def test_load_refuses_bad_states_and_changes_nothing():
    model, _, names = _trained(seed=6, steps=2)
    good = lora_state_dict(model)
    first, last = names[0], names[-1]
    # every bad state also holds a changed good entry (first), so a partial load would show
    changed = {**good, f"{first}.lora_A": good[f"{first}.lora_A"] + 1.0}
    extra = "decoder.layers.0.self_attention.layer.k_proj.lora_A"
    bad_states = [
        (
            {k: v for k, v in changed.items() if k != f"{last}.lora_A"},
            ValueError,
            re.escape(f"missing ['{last}.lora_A'], unexpected []"),
        ),
        (
            {**changed, extra: good[f"{first}.lora_A"]},
            ValueError,
            re.escape(f"unexpected ['{extra}']"),
        ),
        ({**changed, f"{last}.lora_B": np.zeros((3, 8))}, ValueError, r"must have shape \(2, 8\)"),
        ({**changed, f"{last}.lora_B": np.zeros((2, 8), dtype=np.int64)}, TypeError, "floating"),
        ({**changed, f"{last}.lora_B": np.full((2, 8), np.nan)}, ValueError, "NaN"),
        ([1, 2], TypeError, "state must be a mapping"),
    ]
    for state, error, match in bad_states:
        with pytest.raises(error, match=match):
            load_lora_state_dict(model, state)
        for k, v in lora_state_dict(model).items():
            assert np.array_equal(v, good[k]), k
    merge_lora(model)
    with pytest.raises(RuntimeError, match="merged: unmerge_lora"):
        load_lora_state_dict(model, good)


def test_load_converts_to_the_model_dtype():
    model, _, _ = _trained(seed=7, steps=2)
    state = {k: v.astype(np.float32) for k, v in lora_state_dict(model).items()}
    load_lora_state_dict(model, state)
    for k, v in lora_state_dict(model).items():
        assert v.dtype == np.float64
        assert np.array_equal(v, state[k].astype(np.float64))


def test_targets_by_attribute_or_dotted_name_across_families():
    model = small_models.encoder_decoder(0)
    names = apply_lora(
        model,
        1,
        2.0,
        targets=("out_proj", "decoder.layers.1.feed_forward.layer.linear_in"),
        rng=np.random.default_rng(0),
    )
    assert "decoder.layers.1.feed_forward.layer.linear_in" in names
    # self- and cross-attention of the decoder, self-attention of the encoder
    assert sum(n.endswith("out_proj") for n in names) == 1 + 2 * 2
    assert any("cross_attention" in n for n in names)
    assert len(model.trainable_parameters()) == 2 * len(names)


def test_apply_lora_errors_change_nothing():
    model = small_models.decoder_only(0)
    before = [n for n, _ in model.named_parameters()]
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"targets \['query'\] match no Linear layer.*'q_proj'"):
        apply_lora(model, 2, 4.0, targets=("q_proj", "query"), rng=rng)
    with pytest.raises(TypeError, match="targets must be a sequence of layer names"):
        apply_lora(model, 2, 4.0, targets="q_proj", rng=rng)
    with pytest.raises(ValueError, match="targets must name at least one layer"):
        apply_lora(model, 2, 4.0, targets=(), rng=rng)
    with pytest.raises(TypeError, match=r"targets\[0\] must be a non-empty str"):
        apply_lora(model, 2, 4.0, targets=(3,), rng=rng)
    with pytest.raises(
        ValueError, match=re.escape("layer 'decoder.layers.0.self_attention.layer.q_proj'")
    ):
        apply_lora(model, 9, 4.0, rng=rng)
    with pytest.raises(TypeError, match="alpha must be a positive number"):
        apply_lora(model, 2, "4", rng=rng)
    with pytest.raises(TypeError, match=re.escape("rng must be a numpy.random.Generator")):
        apply_lora(model, 2, 4.0, rng=None)
    with pytest.raises(TypeError, match="model must be a tinyformer Module"):
        apply_lora("model", 2, 4.0, rng=rng)
    assert [n for n, _ in model.named_parameters()] == before
    apply_lora(model, 2, 4.0, rng=rng)
    with pytest.raises(ValueError, match="already has a LoRA adapter"):
        apply_lora(model, 2, 4.0, targets=("v_proj",), rng=rng)
    apply_lora(model, 2, 4.0, targets=("k_proj",), rng=rng)  # other layers may still be adapted
    assert len(lora_layers(model)) == 6
    # the earlier adapters stay trainable; the new bases are frozen
    expected = [p for layer in lora_layers(model).values() for p in (layer.lora_A, layer.lora_B)]
    assert model.trainable_parameters() == expected


def test_functions_need_adapters():
    model = small_models.decoder_only(0)
    for function in (merge_lora, unmerge_lora, lora_state_dict, remove_lora):
        with pytest.raises(ValueError, match="model has no LoRA layers"):
            function(model)


def test_apply_lora_keeps_the_model_mode():
    model = small_models.decoder_only(0, dropout=0.1)
    model.eval()
    apply_lora(model, 2, 4.0, rng=np.random.default_rng(0), dropout=0.5)
    assert not any(m.training for m in model.modules())
    first = model.forward(IDS)
    assert np.array_equal(first, model.forward(IDS))


# ---------------------------------------------------------------- reference
@pytest.mark.reference
def test_layer_agrees_with_torch_autograd(torch):
    rng = np.random.default_rng(12)
    layer = _layer(rng, d_in=7, d_out=5, rank=3)
    x = rng.standard_normal((2, 4, 7))
    upstream = rng.standard_normal((2, 4, 5))
    layer.zero_grad()
    y = layer.forward(x)
    grad_x = layer.backward(upstream)
    t = {
        "x": torch.tensor(x, requires_grad=True),
        "A": torch.tensor(layer.lora_A.value, requires_grad=True),
        "B": torch.tensor(layer.lora_B.value, requires_grad=True),
    }
    w = torch.tensor(layer.base.weight.value)
    b = torch.tensor(layer.base.bias.value)
    out = t["x"] @ w + b + layer.scale * (t["x"] @ t["A"]) @ t["B"]
    out.backward(torch.tensor(upstream))
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=1e-13, atol=1e-13)
    for mine, name in ((grad_x, "x"), (layer.lora_A.grad, "A"), (layer.lora_B.grad, "B")):
        np.testing.assert_allclose(mine, t[name].grad.numpy(), rtol=1e-12, atol=1e-12)


def test_trainer_with_clipping_trains_the_adapters_alone():
    model = small_models.decoder_only(0, vocab_size=12)
    apply_lora(
        model, 2, 8.0, targets=("q_proj", "v_proj", "out_proj"), rng=np.random.default_rng(1)
    )
    trainable = model.trainable_parameters()
    adapter_ids = {id(p) for p in trainable}
    before = {name: p.value.copy() for name, p in model.named_parameters()}
    rng = np.random.default_rng(2)
    data = small_models.bigram_windows(64, 8, rng)
    trainer = Trainer(
        model, Adam(trainable, lr=1e-2), lm_loss, data, batch_size=16, rng=rng, clip_norm=0.5
    )
    losses = trainer.fit(max_steps=40).column("loss")
    for name, p in model.named_parameters():  # adapters changed, everything else bitwise not
        assert np.array_equal(p.value, before[name]) != (id(p) in adapter_ids), name
    assert losses[-5:].mean() < losses[:5].mean() - 0.1, losses


# ---------------------------------------------------------------- freezing
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_apply_lora_freezes_all_but_the_adapters_and_their_gradients_cost_nothing(positional):
    model, _, _ = _adapted(seed=8, norm_first=True, tie_output=True, positional=positional)
    adapters = [p for layer in lora_layers(model).values() for p in (layer.lora_A, layer.lora_B)]
    assert model.trainable_parameters() == adapters
    small_models.perturb(model, seed=3)
    model.zero_grad()
    model.backward(_loss_and_grad(model)[1])
    adapter_ids = {id(p) for p in adapters}
    for name, p in model.named_parameters():  # no frozen layer added anything to its grad
        assert p.grad.any() == (id(p) in adapter_ids), name
    with pytest.raises(ValueError, match=r"is frozen .*pass model.trainable_parameters\(\)"):
        Adam(model.parameters(), lr=1e-3)


def test_layer_trains_an_unfrozen_base_and_skips_frozen_adapters():
    rng = np.random.default_rng(13)
    layer = _layer(rng, d_in=4, d_out=3, rank=2)
    x = rng.standard_normal((2, 3, 4))
    layer.base.unfreeze()  # full fine-tuning and an adapter at once: every gradient is exact
    errors = check_module_gradients(layer, [x], rng=rng)
    assert set(errors) == {"input 0", "base.weight", "base.bias", "lora_A", "lora_B"}
    assert max(errors.values()) < 1e-8, errors
    upstream = rng.standard_normal((2, 3, 3))
    layer.forward(x)
    reference = layer.backward(upstream)
    layer.freeze()
    layer.zero_grad()
    layer.forward(x)
    assert np.array_equal(layer.backward(upstream), reference)
    assert not any(p.grad.any() for p in layer.parameters())


def _module_at(model, name):
    """The sub-module at a dotted name such as ``decoder.layers.0.self_attention.layer.q_proj``."""
    module = model
    for part in name.split("."):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


@pytest.mark.parametrize("merge_first", [False, True])
def test_remove_lora_merges_restores_the_structure_and_unfreezes_what_apply_lora_froze(
    merge_first,
):
    model = small_models.decoder_only(9)
    model.decoder.embedding.freeze()  # frozen before apply_lora: stays frozen
    base = copy.deepcopy(model)
    names = apply_lora(model, 2, 8.0, rng=np.random.default_rng(109))
    optimizer = Adam(model.trainable_parameters(), lr=3e-2)
    for _ in range(5):
        model.zero_grad()
        model.backward(_loss_and_grad(model)[1])
        optimizer.step()
    logits = model.forward(IDS)
    layers = lora_layers(model)
    merged = {name: layer.base.weight.value + layer.delta() for name, layer in layers.items()}
    if merge_first:
        merge_lora(model)  # not added a second time
    assert remove_lora(model) == names
    assert not lora_layers(model)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in base.named_parameters()]
    for name, weight in merged.items():
        layer = _module_at(model, name)
        assert layer is layers[name].base
        assert type(layer) is Linear
        assert np.array_equal(layer.weight.value, weight)
    assert np.abs(model.forward(IDS) - logits).max() < 1e-12
    for (name, p), (_, q) in zip(model.named_parameters(), base.named_parameters(), strict=True):
        assert p.requires_grad == q.requires_grad, name
    assert not model.decoder.embedding.weight.requires_grad
    assert not hasattr(model, "_lora_frozen")
    with pytest.raises(ValueError, match="model has no LoRA layers"):
        remove_lora(model)


def test_remove_lora_refuses_a_bare_layer():
    layer = _layer(np.random.default_rng(0))
    with pytest.raises(ValueError, match="model is itself a LoRALinear"):
        remove_lora(layer)


def test_apply_lora_with_a_bad_setting_freezes_nothing():
    model = small_models.decoder_only(0)
    for settings in ({"alpha": 0.0}, {"alpha": 1.0, "dropout": 1.0}, {"alpha": 1.0, "init": "x"}):
        with pytest.raises((TypeError, ValueError)):
            apply_lora(model, 2, rng=np.random.default_rng(0), **settings)
        assert model.trainable_parameters() == model.parameters()
        assert not lora_layers(model)


# ---------------------------------------------------------------- checkpoints
def test_an_adapted_model_checkpoints_whole_and_resumes_bit_for_bit(tmp_path):
    model, base, _ = _adapted(seed=10, rank=2, alpha=8.0)
    optimizer = Adam(model.trainable_parameters(), lr=3e-2)

    def train(model, optimizer, steps):
        for _ in range(steps):
            model.zero_grad()
            model.backward(_loss_and_grad(model)[1])
            optimizer.step()

    train(model, optimizer, 3)
    path = save_checkpoint(tmp_path / "adapted.npz", model, optimizer, step=3)
    saved = read_checkpoint(path)
    assert any(name.endswith(".lora_A") for name in saved.group("model"))
    assert saved.metadata["model"]["lora"] == {
        name: {"rank": 2, "alpha": 8.0, "merged": False} for name in lora_layers(model)
    }
    # the same base, adapted the same way (other A's): loading makes it the saved model
    other = copy.deepcopy(base)
    apply_lora(other, 2, 8.0, rng=np.random.default_rng(55))
    other_optimizer = Adam(other.trainable_parameters(), lr=3e-2)
    load_checkpoint(path, other, other_optimizer)
    train(model, optimizer, 2)
    train(other, other_optimizer, 2)
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert np.array_equal(p.value, q.value), name
    # a plain model (what load_model builds) is refused, saying what to do instead
    with pytest.raises(
        ValueError,
        match=r"it holds a model with LoRA adapters \(4 layers.*lora_state_dict.*remove_lora",
    ):
        load_model(path)
    with pytest.raises(ValueError, match="LoRA adapters"):
        load_checkpoint(path, copy.deepcopy(base))
    # adapters of another alpha, or merged, are refused too: the weights would mean another model
    for alpha, merge in ((4.0, False), (8.0, True)):
        mismatched = copy.deepcopy(base)
        apply_lora(mismatched, 2, alpha, rng=np.random.default_rng(0))
        if merge:
            merge_lora(mismatched)
        with pytest.raises(ValueError, match="its LoRA adapters do not match the model's"):
            load_checkpoint(path, mismatched)
    # an ordinary checkpoint into an adapted model
    plain = save_checkpoint(tmp_path / "plain.npz", base)
    with pytest.raises(
        ValueError, match=r"the model has LoRA adapters .* and the checkpoint has none"
    ):
        load_checkpoint(plain, other)


def test_remove_lora_gives_a_model_that_load_model_loads(tmp_path):
    model, _, _ = _trained(seed=11, steps=4)
    model.eval()
    logits = model.forward(IDS)
    remove_lora(model)
    path = save_checkpoint(tmp_path / "merged.npz", model)
    assert "lora" not in read_checkpoint(path).metadata["model"]
    loaded = load_model(path)
    assert np.array_equal(loaded.forward(IDS), model.forward(IDS))
    assert np.abs(loaded.forward(IDS) - logits).max() < 1e-12
