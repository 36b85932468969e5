"""Parameter and Module: parameter discovery, tying, modes, state dicts and no_grad."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tinyformer import cost
from tinyformer.blocks import TransformerBlock
from tinyformer.feedforward import ACTIVATIONS, FeedForward
from tinyformer.gradcheck import check_module_gradients, check_parameter_gradients
from tinyformer.layers import Dropout, Embedding, Linear, TiedOutputProjection
from tinyformer.masks import causal_mask
from tinyformer.module import Module, Parameter, grad_enabled, no_grad
from tinyformer.multihead import MultiHeadAttention
from tinyformer.norm import BatchNorm, LayerNorm, RMSNorm
from tinyformer.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
)


class Scale(Module):
    """y = x * w, for testing the base class."""

    def __init__(self, w: Parameter | None = None):
        super().__init__()
        self.w = w or Parameter(np.ones(3))

    def forward(self, x):
        self._save(x)
        return x * self.w.value

    def backward(self, grad_out):
        (x,) = self._saved()
        self.w.grad += (grad_out * x).reshape(-1, 3).sum(0)
        return grad_out * self.w.value


class Pair(Module):
    def __init__(self):
        super().__init__()
        self.first = Scale()
        self.layers = [Scale(), Scale(self.first.w)]  # the last one is tied to `first`


def test_named_parameters_walks_lists_and_counts_tied_weights_once():
    pair = Pair()
    assert [name for name, _ in pair.named_parameters()] == ["first.w", "layers.0.w"]
    assert pair.num_parameters() == 6


def test_gradients_accumulate_across_uses_of_a_tied_parameter():
    pair = Pair()
    x = np.arange(3.0)
    pair.first.forward(x)
    pair.first.backward(np.ones(3))
    pair.layers[1].forward(2 * x)
    pair.layers[1].backward(np.ones(3))
    np.testing.assert_array_equal(pair.first.w.grad, 3 * x)
    pair.zero_grad()
    np.testing.assert_array_equal(pair.first.w.grad, 0.0)


def test_train_and_eval_reach_every_submodule():
    pair = Pair().eval()
    assert not any(m.training for m in pair.modules())
    pair.train()
    assert all(m.training for m in pair.modules())


def test_state_dict_round_trip_copies():
    a, b = Pair(), Pair()
    a.first.w.value[:] = [1.0, 2.0, 3.0]
    state = a.state_dict()
    state["first.w"][0] = 99.0  # a copy: the module is untouched
    assert a.first.w.value[0] == 1.0
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(b.first.w.value, [1.0, 2.0, 3.0])
    assert b.layers[1].w is b.first.w


@pytest.mark.parametrize(
    ("state", "error", "words"),
    [
        ({"first.w": np.ones(3)}, ValueError, "missing ['layers.0.w']"),
        (
            {"first.w": np.ones(3), "layers.0.w": np.ones(3), "x": np.ones(1)},
            ValueError,
            "extra ['x']",
        ),
        ({"first.w": np.ones(4), "layers.0.w": np.ones(3)}, ValueError, "must have shape (3,)"),
        (
            {"first.w": np.ones(3), "layers.0.w": np.array(["a", "b", "c"])},
            TypeError,
            "floating-point",
        ),
        (
            {"first.w": np.ones(3), "layers.0.w": np.array([1.0, np.nan, 1.0])},
            ValueError,
            "NaN",
        ),
        ([1, 2], TypeError, "state must be a mapping"),
    ],
)
def test_load_state_dict_rejects_bad_state_and_changes_nothing(state, error, words):
    pair = Pair()
    before = pair.state_dict()
    with pytest.raises(error) as info:
        pair.load_state_dict(state)
    assert words in str(info.value)
    for name, value in pair.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_backward_before_forward_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"Scale.backward was called before forward"):
        Scale().backward(np.ones(3))


def test_each_forward_allows_one_backward():
    layer = Scale()
    layer.forward(np.ones(3))
    layer.backward(np.ones(3))
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.ones(3))


def test_parameter_rejects_non_float_values():
    with pytest.raises(TypeError, match=r"value\.dtype must be float32 or float64"):
        Parameter(np.ones(3, dtype=np.int64))
    with pytest.raises(TypeError, match=r"value must be a numpy\.ndarray"):
        Parameter([1.0, 2.0])


def test_check_grad_names_shape_and_dtype():
    with pytest.raises(ValueError, match=r"grad_out must have the forward output's shape \(3,\)"):
        Module._check_grad(np.ones(4), (3,), np.dtype(np.float64))
    with pytest.raises(TypeError, match="forward output's dtype float64"):
        Module._check_grad(np.ones(3, np.float32), (3,), np.dtype(np.float64))


# ------------------------------------------------------------------- no_grad
def _rng():
    return np.random.default_rng(5)


def _x(*shape, dtype=np.float64):
    return np.random.default_rng(6).standard_normal(shape).astype(dtype)


def _randomized(module):
    rng = np.random.default_rng(7)
    for p in module.parameters():
        p.value[...] += 0.3 * rng.standard_normal(p.shape).astype(p.dtype)
    return module


# (module, forward arguments, forward keyword arguments): every layer that keeps state
LAYERS = {
    "Linear": lambda: (Linear(4, 3, rng=_rng()), [_x(2, 4)], {}),
    "Embedding": lambda: (Embedding(9, 4, rng=_rng()), [np.array([[1, 8, 1]])], {}),
    "TiedOutputProjection": lambda: (
        TiedOutputProjection(Embedding(9, 4, rng=_rng()), bias=True),
        [_x(2, 4)],
        {},
    ),
    "LayerNorm": lambda: (_randomized(LayerNorm(4)), [_x(2, 3, 4)], {}),
    "RMSNorm": lambda: (_randomized(RMSNorm(4)), [_x(2, 3, 4)], {}),
    "BatchNorm": lambda: (_randomized(BatchNorm(4)), [_x(2, 3, 4)], {}),
    "SinusoidalPositionalEncoding": lambda: (
        SinusoidalPositionalEncoding(4, 8),
        [_x(2, 3, 4)],
        {},
    ),
    "LearnedPositionalEmbedding": lambda: (
        LearnedPositionalEmbedding(8, 4, rng=_rng()),
        [_x(2, 3, 4)],
        {"start": 2},
    ),
    "RotaryEmbedding": lambda: (RotaryEmbedding(4), [_x(2, 3, 4)], {"start": 1}),
    **{
        f"FeedForward ({activation}, {kind})": (
            lambda activation=activation, kind=kind: (
                _randomized(
                    FeedForward(4, 6, rng=_rng(), activation=activation, gated=kind == "gated")
                ),
                [_x(2, 3, 4)],
                {},
            )
        )
        for activation in ACTIVATIONS
        for kind in ("plain", "gated")
    },
    "MultiHeadAttention": lambda: (
        _randomized(MultiHeadAttention(8, 2, rng=_rng(), rotary=True)),
        [_x(2, 5, 8)],
        {"mask": causal_mask(5)},
    ),
    "MultiHeadAttention (cross)": lambda: (
        _randomized(MultiHeadAttention(8, 2, rng=_rng())),
        [_x(2, 5, 8), _x(2, 3, 8)],
        {},
    ),
    "TransformerBlock (post-norm, cross)": lambda: (
        _randomized(TransformerBlock(8, 2, 12, rng=_rng(), cross_attention=True)),
        [_x(2, 5, 8), _x(2, 3, 8)],
        {"mask": causal_mask(5)},
    ),
    "TransformerBlock (pre-norm, float32)": lambda: (
        _randomized(
            TransformerBlock(
                8,
                2,
                12,
                rng=_rng(),
                norm_first=True,
                norm="rmsnorm",
                feed_forward="gated",
                activation="silu",
                dtype=np.float32,
            )
        ),
        [_x(2, 5, 8, dtype=np.float32)],
        {"mask": causal_mask(5)},
    ),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_no_grad_gives_the_same_bits_keeps_nothing_and_refuses_backward(name):
    module, args, kwargs = LAYERS[name]()
    if isinstance(module, BatchNorm):
        module.eval()  # its running statistics would move between the two passes
    trained = module.forward(*args, **kwargs)  # training mode first, as before cached decoding
    with no_grad():
        assert not grad_enabled()
        fast = module.forward(*args, **kwargs)
    assert np.array_equal(fast, trained)
    assert fast.dtype == trained.dtype
    assert cost.saved_bytes(module) == {}  # nothing kept for a backward pass
    with pytest.raises(RuntimeError, match=r"backward after a forward run under no_grad\(\)"):
        module.backward(np.ones_like(fast))
    module.forward(*args, **kwargs)  # outside no_grad again: training works as before
    module.backward(np.ones_like(fast))


def test_no_grad_and_grad_mode_forwards_give_the_same_gradients_afterwards(rng):
    block = _randomized(TransformerBlock(8, 2, 12, rng=_rng(), activation="gelu_tanh"))
    x, g = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    block.forward(x)
    first = block.backward(g)
    with no_grad():
        block.forward(x)
    block.zero_grad()
    block.forward(x)
    assert np.array_equal(block.backward(g), first)


def test_no_grad_nests_and_restores_the_previous_mode():
    assert grad_enabled()
    with no_grad():
        assert not grad_enabled()
        with no_grad():
            assert not grad_enabled()
        assert not grad_enabled()  # the inner block ends: still off
    assert grad_enabled()


def test_an_exception_inside_no_grad_restores_the_mode():
    with pytest.raises(ValueError, match="inside"), no_grad():
        raise ValueError("raised inside")
    assert grad_enabled()
    layer = Linear(3, 2, rng=_rng())
    with pytest.raises(ValueError, match="x must have last dimension 3"), no_grad():
        layer.forward(np.ones((1, 4)))
    assert grad_enabled()
    layer.forward(np.ones((1, 3)))
    layer.backward(np.ones((1, 2)))  # the mode is back: forward kept its input


def test_no_grad_applies_to_its_own_thread_only():
    seen = []
    with no_grad():
        worker = threading.Thread(target=lambda: seen.append(grad_enabled()))
        worker.start()
        worker.join()
        assert not grad_enabled()
    assert seen == [True]


def test_dropout_in_training_mode_still_drops_under_no_grad():
    layer = Dropout(0.5, rng=np.random.default_rng(2))
    with no_grad():
        out = layer.forward(np.ones((50, 50)))
    assert set(np.unique(out)) == {0.0, 2.0}  # no_grad skips saved state, not the mode


def test_parameters_require_a_gradient_unless_frozen_and_the_flag_is_checked():
    assert Parameter(np.zeros(2)).requires_grad is True
    assert Parameter(np.zeros(2), requires_grad=False).requires_grad is False
    with pytest.raises(TypeError, match="requires_grad must be True or False, got"):
        Parameter(np.zeros(2), requires_grad=1)


def test_gradient_checks_leave_frozen_parameters_out():
    rng = np.random.default_rng(0)
    layer = Linear(3, 2, rng=rng)
    x = rng.standard_normal((2, 3))
    assert set(check_module_gradients(layer, [x], rng=rng)) == {"input 0", "weight", "bias"}
    layer.weight.requires_grad = False  # its gradient is still computed here, but not checked
    assert set(check_module_gradients(layer, [x], rng=rng)) == {"input 0", "bias"}
    upstream = rng.standard_normal((2, 2))

    def run():
        return layer.forward(x) * upstream, upstream

    assert set(check_parameter_gradients(layer, run)) == {"bias"}


# ------------------------------------------------------------ frozen parameters
def _same(a, b):
    """Input gradients (an array, a tuple of them, or None) equal bit for bit."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a.dtype == b.dtype and np.array_equal(a, b)


WITH_PARAMETERS = [name for name, make in LAYERS.items() if make()[0].parameters()]


@pytest.mark.parametrize("name", WITH_PARAMETERS)
def test_a_frozen_parameter_gets_no_gradient_and_changes_no_other_bit(name):
    module, args, kwargs = LAYERS[name]()
    rng = np.random.default_rng(8)
    out = module.forward(*args, **kwargs)
    upstream = rng.standard_normal(out.shape).astype(out.dtype)
    module.backward(upstream)

    def run():
        module.forward(*args, **kwargs)
        return module.backward(upstream)

    module.zero_grad()
    reference_input = run()
    reference = {n: p.grad.copy() for n, p in module.named_parameters()}
    sentinel = 7.0  # what a frozen parameter's grad holds before, and must hold after
    for frozen_name, frozen in module.named_parameters():
        frozen.requires_grad = False
        module.zero_grad()
        frozen.grad.fill(sentinel)
        assert _same(run(), reference_input), frozen_name  # the input gradient is unchanged
        assert (frozen.grad == sentinel).all(), frozen_name  # no work done for it
        for n, p in module.named_parameters():
            if p is not frozen:
                assert np.array_equal(p.grad, reference[n]), (frozen_name, n)
        frozen.requires_grad = True
    module.freeze()
    for p in module.parameters():
        p.grad.fill(sentinel)
    assert _same(run(), reference_input)
    assert all((p.grad == sentinel).all() for p in module.parameters())
    module.unfreeze()
    module.zero_grad()
    assert _same(run(), reference_input)
    assert all(np.array_equal(p.grad, reference[n]) for n, p in module.named_parameters())


def test_freeze_unfreeze_and_trainable_parameters():
    pair = Pair()
    assert pair.trainable_parameters() == pair.parameters()
    assert pair.layers[0].freeze() is pair.layers[0]
    assert pair.trainable_parameters() == [pair.first.w]
    assert "frozen" in repr(pair.layers[0].w)
    assert "frozen" not in repr(pair.first.w)
    pair.layers[1].freeze()  # tied to first: a shared parameter is frozen for both users
    assert pair.trainable_parameters() == []
    assert pair.num_parameters() == 6  # frozen parameters still count
    assert pair.unfreeze() is pair
    assert all(p.requires_grad for p in pair.parameters())
