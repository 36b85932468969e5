"""Parameter and Module: parameter discovery, tying, modes and state dicts."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.module import Module, Parameter


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
