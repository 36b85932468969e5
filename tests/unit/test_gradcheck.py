"""The gradient checker itself must catch wrong gradients, not only pass right ones."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.gradcheck import (
    check_module_gradients,
    check_parameter_gradients,
    max_relative_error,
    numerical_gradient,
)
from tinyformer.module import Module, Parameter
from tinyformer.multihead import MultiHeadAttention


def test_numerical_gradient_of_a_known_function(rng):
    x = rng.standard_normal(5)
    numeric = numerical_gradient(lambda: float(np.sum(np.sin(x))), x)
    np.testing.assert_allclose(numeric, np.cos(x), rtol=1e-8)


def test_numerical_gradient_restores_the_input(rng):
    x = rng.standard_normal((2, 3))
    before = x.copy()
    numerical_gradient(lambda: float(x.sum()), x)
    np.testing.assert_array_equal(x, before)


def test_max_relative_error_floor_and_scale():
    assert max_relative_error(np.zeros(3), np.zeros(3)) == 0.0
    assert max_relative_error(np.zeros(0), np.zeros(0)) == 0.0
    assert max_relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.2])) == pytest.approx(
        0.2 / 2.2
    )
    # an entry near zero in both is measured against 1e-4 of the largest numerical entry
    analytic, numeric = np.array([10.0, 1e-9]), np.array([10.0, 3e-9])
    assert max_relative_error(analytic, numeric) == pytest.approx(2e-9 / 1e-3)


def test_magnitude_sets_the_floor_for_gradients_that_are_zero_in_truth():
    noise = np.array([1e-13, -3e-13, 2e-13])  # finite differences of an exactly zero gradient
    exact = np.zeros(3)
    assert max_relative_error(exact, noise) == 1.0  # against itself, noise is all there is
    assert max_relative_error(exact, noise, magnitude=2.0) == pytest.approx(3e-13 / 2e-4)
    # magnitude only lowers the bar for entries below its floor, not for large ones
    wrong = np.array([1.0, 2.0])
    assert max_relative_error(wrong, 1.1 * wrong, magnitude=100.0) == pytest.approx(0.2 / 2.2)
    with pytest.raises(ValueError, match=r"analytic \(2,\) and numeric \(3,\)"):
        max_relative_error(np.zeros(2), np.zeros(3))


def test_module_check_passes_a_key_bias_whose_gradient_is_zero_and_would_fail_alone(rng):
    # softmax ignores a shift shared by all keys, and the key bias shifts each query's
    # scores by the same q . b: its gradient is exactly zero, finite differences give noise
    layer = MultiHeadAttention(8, 2, rng=rng)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape)
    x = rng.standard_normal((2, 4, 8))
    errors = check_module_gradients(layer, [x], rng=np.random.default_rng(1))
    assert max(errors.values()) < 1e-6, errors
    # the same gradient measured against its own (noise-sized) largest entry fails
    upstream = np.random.default_rng(1).standard_normal((2, 4, 8))
    layer.zero_grad()
    layer.forward(x)
    layer.backward(upstream)
    analytic = layer.k_proj.bias.grad.copy()
    numeric = numerical_gradient(lambda: layer.forward(x) * upstream, layer.k_proj.bias.value)
    assert np.abs(analytic).max() < 1e-12
    assert np.abs(numeric).max() < 1e-8
    assert max_relative_error(analytic, numeric) > 0.1
    assert errors["k_proj.bias"] == pytest.approx(
        max_relative_error(analytic, numeric, magnitude=_largest_numeric_entry(layer, x, upstream))
    )


def _largest_numeric_entry(layer, x, upstream):
    """The largest finite-difference gradient entry of any input or parameter of ``layer``."""

    def loss():
        return layer.forward(x) * upstream

    arrays = [x] + [p.value for p in layer.parameters()]
    return max(np.abs(numerical_gradient(loss, a)).max() for a in arrays)


class BuggyLinear(Module):
    """y = x W with a backward that forgets a transpose for the input gradient."""

    def __init__(self, rng, buggy):
        super().__init__()
        self.w = Parameter(rng.standard_normal((3, 3)))
        self.buggy = buggy

    def forward(self, x):
        self._save(x)
        return x @ self.w.value

    def backward(self, grad_out):
        (x,) = self._saved()
        self.w.grad += x.T @ grad_out
        return grad_out @ (self.w.value if self.buggy else self.w.value.T)


def test_check_module_gradients_passes_correct_and_flags_buggy(rng):
    x = rng.standard_normal((4, 3))
    good = check_module_gradients(BuggyLinear(rng, buggy=False), [x], rng=rng)
    bad = check_module_gradients(BuggyLinear(rng, buggy=True), [x], rng=rng)
    assert max(good.values()) < 1e-8
    assert bad["input 0"] > 1e-2
    assert bad["w"] < 1e-8


def test_numerical_gradient_needs_float64():
    with pytest.raises(TypeError, match="float64"):
        numerical_gradient(lambda: 0.0, np.ones(3, np.float32))


class BuggyEmbedding(Module):
    """A lookup whose backward may forget that repeated ids add up."""

    def __init__(self, rng, buggy):
        super().__init__()
        self.table = Parameter(rng.standard_normal((5, 3)))
        self.buggy = buggy

    def forward(self, ids):
        self._save(ids)
        return self.table.value[ids]

    def backward(self, grad_out):
        (ids,) = self._saved()
        if self.buggy:
            self.table.grad[ids] += grad_out  # repeated ids: only one write survives
        else:
            np.add.at(self.table.grad, ids, grad_out)


def test_check_parameter_gradients_passes_correct_and_flags_buggy(rng):
    ids = np.array([0, 2, 2, 4])
    upstream = rng.standard_normal((4, 3))
    results = {}
    for buggy in (False, True):
        layer = BuggyEmbedding(rng, buggy)

        def run(layer=layer):
            return layer.forward(ids) * upstream, upstream

        results[buggy] = check_parameter_gradients(layer, run)
    assert results[False]["table"] < 1e-8
    assert results[True]["table"] > 1e-2
