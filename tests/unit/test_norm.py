"""LayerNorm, RMSNorm and BatchNorm: what they normalize, their gradients, dtypes, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.gradcheck import check_module_gradients
from tinyformer.norm import NORMS, BatchNorm, LayerNorm, RMSNorm, make_norm


def _random_shape(rng, d):
    return (*rng.integers(1, 4, size=rng.integers(1, 3)), d)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm, BatchNorm])
def test_gradients_on_random_shapes(cls, seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 7))
    layer = cls(d)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape)
    x = rng.standard_normal((2, *_random_shape(rng, d))) * 3 + 1
    errors = check_module_gradients(layer, [x], rng=rng)
    assert max(errors.values()) < 1e-6, errors


@given(st.integers(0, 2**32 - 1), st.floats(-1e3, 1e3), st.floats(1e-2, 1e3))
def test_layer_norm_output_has_zero_mean_and_unit_variance(seed, shift, spread):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 16)) * spread + shift
    y = LayerNorm(16, eps=1e-12).forward(x)
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(y.var(axis=-1), 1.0, rtol=1e-6)


def test_layer_norm_matches_the_formula(rng):
    layer = LayerNorm(5, eps=1e-3)
    layer.gain.value[:] = rng.standard_normal(5)
    layer.bias.value[:] = rng.standard_normal(5)
    x = rng.standard_normal((2, 3, 5))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    expected = (x - mu) / np.sqrt(var + 1e-3) * layer.gain.value + layer.bias.value
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12, atol=1e-12)


def test_rms_norm_matches_the_formula_and_keeps_direction(rng):
    layer = RMSNorm(6, eps=1e-6)
    x = rng.standard_normal((4, 6))
    y = layer.forward(x)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    np.testing.assert_allclose(np.sqrt((y**2).mean(-1)), 1.0, rtol=1e-5)


def test_constant_rows_do_not_give_nan():
    y = LayerNorm(4).forward(np.full((2, 4), 3.0))
    np.testing.assert_array_equal(y, 0.0)
    assert not np.isnan(RMSNorm(4).forward(np.zeros((2, 4)))).any()


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm, BatchNorm])
def test_float32_agrees_with_float64_forward_and_backward(rng, cls):
    wide, narrow = cls(8), cls(8, dtype=np.float32)
    for p in wide.parameters():
        p.value[...] = rng.standard_normal(p.shape)
    narrow.load_state_dict(wide.state_dict())
    x, g = rng.standard_normal((2, 3, 8)) * 10 + 3, rng.standard_normal((2, 3, 8))
    y = narrow.forward(x.astype(np.float32))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, wide.forward(x), atol=2e-5)
    grad = narrow.backward(g.astype(np.float32))
    assert grad.dtype == np.float32
    np.testing.assert_allclose(grad, wide.backward(g), atol=1e-5)
    for p, q in zip(narrow.parameters(), wide.parameters(), strict=True):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-5, atol=1e-4)


def test_each_position_is_normalized_on_its_own_bitwise(rng):
    x = rng.standard_normal((3, 4, 8)) * rng.choice([1.0, 1e3], size=(3, 4, 1))
    for layer in (LayerNorm(8), RMSNorm(8)):
        before = layer.forward(x)
        changed = x.copy()
        changed[1, 2] = 1e6 * rng.standard_normal(8)
        after = layer.forward(changed)
        others = np.ones((3, 4), bool)
        others[1, 2] = False
        assert np.array_equal(after[others], before[others])


# ------------------------------------------------------------------- registry
def test_the_norm_registry_names_layer_norm_and_rms_norm():
    assert set(NORMS) == {"layernorm", "rmsnorm"}
    assert NORMS["layernorm"] is LayerNorm
    assert NORMS["rmsnorm"] is RMSNorm
    for kind, cls in NORMS.items():
        layer = make_norm(kind, 6, eps=1e-3, dtype=np.float32)
        assert type(layer) is cls
        assert (layer.d_model, layer.eps, layer.dtype) == (6, 1e-3, np.float32)


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("batchnorm", "kind must be one of ['layernorm', 'rmsnorm'], got 'batchnorm'"),
        ("LayerNorm", "got 'LayerNorm'"),
        (None, "kind must be one of"),
    ],
)
def test_make_norm_refuses_unknown_kinds(kind, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        make_norm(kind, 4, eps=1e-5, dtype=np.float64)


# ------------------------------------------------------------------ reference
@pytest.mark.reference
@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_layer_norm_and_rms_norm_agree_with_torch(rng, cls, torch):
    layer = cls(6, eps=1e-5)
    for p in layer.parameters():
        p.value[...] += 0.3 * rng.standard_normal(p.shape)
    x, g = rng.standard_normal((3, 4, 6)) * 2 + 1, rng.standard_normal((3, 4, 6))
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(layer.gain.value, requires_grad=True)
    if cls is LayerNorm:
        bt = torch.tensor(layer.bias.value, requires_grad=True)
        yt = torch.nn.functional.layer_norm(xt, (6,), wt, bt, eps=1e-5)
    else:
        yt = torch.nn.functional.rms_norm(xt, (6,), wt, eps=1e-5)
    yt.backward(torch.tensor(g))

    def close(ours, theirs):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-10, atol=1e-12)

    close(layer.forward(x), yt)
    close(layer.backward(g), xt.grad)
    close(layer.gain.grad, wt.grad)
    if cls is LayerNorm:
        close(layer.bias.grad, bt.grad)


@pytest.mark.reference
def test_batch_norm_agrees_with_torch_in_both_modes(rng, torch):
    layer = BatchNorm(5, momentum=0.3)
    theirs = torch.nn.BatchNorm1d(5, momentum=0.3, dtype=torch.float64)
    x = rng.standard_normal((12, 5)) * 3 + 1
    g = rng.standard_normal((12, 5))
    xt = torch.tensor(x, requires_grad=True)
    yt = theirs(xt)
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(layer.forward(x), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.backward(g), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.gain.grad, theirs.weight.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(layer.running_mean, theirs.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(layer.running_var, theirs.running_var.numpy(), rtol=1e-12)
    layer.eval()
    theirs.eval()
    evaluated = theirs(torch.tensor(x[:3])).detach().numpy()
    np.testing.assert_allclose(layer.forward(x[:3]), evaluated, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------- bad input
def _after_forward(layer, x):
    layer.forward(x)
    return layer


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: LayerNorm(4, eps=-1.0), ValueError, "eps must be a finite positive"),
        (lambda: LayerNorm(4, dtype=np.int32), TypeError, "dtype must be float32 or float64"),
        (lambda: RMSNorm(True), TypeError, "d_model must be a positive integer"),
        (lambda: RMSNorm(0), ValueError, "d_model must be a positive integer"),
        (
            lambda: LayerNorm(8, dtype=np.float32).forward(np.ones((2, 8))),
            TypeError,
            "x must have the layer's dtype float32",
        ),
        (lambda: LayerNorm(2).forward(np.array([["a", "b"]])), TypeError, "x must be a real"),
        (lambda: RMSNorm(4).forward(np.ones((2, 3))), ValueError, "x must have last dimension 4"),
        (lambda: LayerNorm(4).backward(np.ones((2, 4))), RuntimeError, "before forward"),
        (
            lambda: _after_forward(LayerNorm(4), np.ones((2, 4))).backward(np.ones((2, 3))),
            ValueError,
            "grad_out must have the forward output's shape (2, 4)",
        ),
        (
            lambda: _after_forward(RMSNorm(2), np.ones((1, 2))).backward([[1.0, 1.0]]),
            TypeError,
            "grad_out must be a numpy.ndarray",
        ),
    ],
)
def test_layer_and_rms_norm_bad_input_is_named(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


# ------------------------------------------------------------------ BatchNorm


def test_batch_norm_matches_the_formula_over_batch_and_time(rng):
    layer = BatchNorm(5, eps=1e-3)
    layer.gain.value[:] = rng.standard_normal(5)
    layer.bias.value[:] = rng.standard_normal(5)
    x = rng.standard_normal((3, 4, 5)) * 2 + 1
    mu, var = x.mean(axis=(0, 1)), x.var(axis=(0, 1))
    expected = (x - mu) / np.sqrt(var + 1e-3) * layer.gain.value + layer.bias.value
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12, atol=1e-12)


def test_batch_norm_output_depends_on_the_rest_of_the_batch_and_layer_norm_does_not(rng):
    x = rng.standard_normal((4, 3, 8))
    other = x.copy()
    other[1:] = rng.standard_normal((3, 3, 8)) * 5 + 2  # change every sequence but the first
    batch, layer = BatchNorm(8), LayerNorm(8)
    assert np.abs(batch.forward(x)[0] - batch.forward(other)[0]).max() > 0.1
    np.testing.assert_array_equal(layer.forward(x)[0], layer.forward(other)[0])


def test_batch_norm_running_statistics_and_eval_mode(rng):
    layer = BatchNorm(3, momentum=0.5)
    x = rng.standard_normal((50, 3)) * np.array([1.0, 2.0, 3.0]) + np.array([-1.0, 0.0, 4.0])
    for _ in range(40):  # the same batch: the running values converge to its statistics
        layer.forward(x)
    np.testing.assert_allclose(layer.running_mean, x.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(layer.running_var, x.var(axis=0, ddof=1), rtol=1e-10)
    layer.eval()
    single = layer.forward(x[:1])  # one position is fine in evaluation mode
    expected = (x[:1] - layer.running_mean) / np.sqrt(layer.running_var + layer.eps)
    np.testing.assert_allclose(single, expected, rtol=1e-12)
    before = layer.running_mean.copy()
    layer.forward(x * 10)
    np.testing.assert_array_equal(layer.running_mean, before)  # eval never updates them


@pytest.mark.parametrize("seed", [0, 1])
def test_batch_norm_gradients_in_evaluation_mode(seed):
    rng = np.random.default_rng(seed)
    layer = BatchNorm(4)
    layer.running_mean[:] = rng.standard_normal(4)
    layer.running_var[:] = rng.uniform(0.5, 2.0, 4)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape)
    layer.eval()
    errors = check_module_gradients(layer, [rng.standard_normal((2, 3, 4))], rng=rng)
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize(
    ("make", "error", "name"),
    [
        (lambda: BatchNorm(0), ValueError, "d_model"),
        (lambda: BatchNorm(4, eps=0.0), ValueError, "eps"),
        (lambda: BatchNorm(4, momentum=0.0), ValueError, "momentum"),
        (lambda: BatchNorm(4, momentum=1.5), ValueError, "momentum"),
        (lambda: BatchNorm(4, momentum="0.1"), TypeError, "momentum"),
        (lambda: BatchNorm(4, dtype=np.int64), TypeError, "dtype"),
        (lambda: BatchNorm(4).forward(np.ones((1, 1, 4))), ValueError, "x"),
        (lambda: BatchNorm(4).forward(np.ones((3, 5))), ValueError, "x"),
        (lambda: BatchNorm(4, dtype=np.float32).forward(np.ones((3, 4))), TypeError, "x"),
        (lambda: BatchNorm(4).backward(np.ones((3, 4))), RuntimeError, "forward"),
    ],
)
def test_batch_norm_bad_input_names_the_argument(make, error, name):
    with pytest.raises(error, match=name):
        make()


def test_batch_norm_wrong_gradient_shape_is_refused():
    layer = BatchNorm(4)
    layer.forward(np.ones((3, 4)))
    with pytest.raises(ValueError, match="grad_out"):
        layer.backward(np.ones((3, 5)))
