"""Linear, Embedding with its tied output projection, and Dropout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.gradcheck import check_module_gradients, max_relative_error, numerical_gradient
from tinyformer.layers import (
    Dropout,
    Embedding,
    Linear,
    TiedOutputProjection,
    _add_rows,
    sum_rows,
)


def _randomize(module, rng):
    """Give every parameter random values, so that zero biases hide nothing."""
    for p in module.parameters():
        p.value[...] = rng.standard_normal(p.shape)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradients_on_random_shapes(seed, bias):
    rng = np.random.default_rng(seed)
    d_in, d_out = rng.integers(1, 6, size=2)
    batch = tuple(rng.integers(1, 4, size=rng.integers(0, 3)))
    layer = Linear(int(d_in), int(d_out), rng=rng, bias=bias)
    _randomize(layer, rng)
    errors = check_module_gradients(layer, [rng.standard_normal((*batch, d_in))], rng=rng)
    assert max(errors.values()) < 1e-6, errors


def test_linear_computes_x_w_plus_b(rng):
    layer = Linear(3, 2, rng=rng)
    _randomize(layer, rng)
    x = rng.standard_normal((4, 5, 3))
    expected = np.einsum("btd,de->bte", x, layer.weight.value) + layer.bias.value
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12)


def test_linear_glorot_initialization_is_reproducible_and_bounded():
    a = Linear(50, 30, rng=np.random.default_rng(3))
    b = Linear(50, 30, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(a.weight.value, b.weight.value)
    assert np.abs(a.weight.value).max() <= np.sqrt(6 / 80)
    np.testing.assert_array_equal(a.bias.value, 0.0)


def test_gradients_accumulate_over_two_backward_passes(rng):
    layer = Linear(3, 2, rng=rng)
    x, g = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    layer.forward(x)
    layer.backward(g)
    once = layer.weight.grad.copy()
    layer.forward(x)
    layer.backward(g)
    np.testing.assert_allclose(layer.weight.grad, 2 * once)


def test_sum_rows_matches_sum(rng):
    x = rng.standard_normal((7, 3))
    np.testing.assert_allclose(sum_rows(x), x.sum(axis=0), rtol=1e-13)


@pytest.mark.parametrize("scale", [False, True])
def test_embedding_looks_up_rows_and_scales(rng, scale):
    emb = Embedding(10, 4, rng=rng, scale_by_sqrt_d=scale)
    ids = np.array([[1, 7, 1], [0, 9, 3]])
    out = emb.forward(ids)
    assert out.shape == (2, 3, 4)
    np.testing.assert_allclose(out, emb.weight.value[ids] * (2.0 if scale else 1.0))


@pytest.mark.parametrize("scale", [False, True])
def test_embedding_gradient_adds_repeated_ids(rng, scale):
    emb = Embedding(6, 3, rng=rng, scale_by_sqrt_d=scale)
    ids = np.array([[2, 5, 2], [2, 0, 5]])
    g = rng.standard_normal((2, 3, 3))

    def loss():
        return emb.forward(ids) * g

    emb.forward(ids)
    assert emb.backward(g) is None  # token ids have no gradient
    numeric = numerical_gradient(loss, emb.weight.value)
    assert max_relative_error(emb.weight.grad, numeric) < 1e-6
    np.testing.assert_array_equal(emb.weight.grad[[1, 3, 4]], 0.0)


def test_embedding_default_std_makes_scaled_vectors_unit_variance():
    emb = Embedding(4000, 64, rng=np.random.default_rng(0), scale_by_sqrt_d=True)
    out = emb.forward(np.arange(4000))
    assert out.std() == pytest.approx(1.0, rel=0.02)


def test_tied_projection_shares_the_parameter_and_sums_both_gradients(rng):
    emb = Embedding(7, 4, rng=rng, scale_by_sqrt_d=True)
    head = TiedOutputProjection(emb, bias=True)
    _randomize(head, rng)
    assert head.weight is emb.weight
    ids = rng.integers(0, 7, size=(2, 5))
    g = rng.standard_normal((2, 5, 7))

    def loss():
        return head.forward(emb.forward(ids)) * g

    emb.zero_grad()
    head.zero_grad()
    head.forward(emb.forward(ids))
    emb.backward(head.backward(g))
    assert max_relative_error(emb.weight.grad, numerical_gradient(loss, emb.weight.value)) < 1e-6
    assert max_relative_error(head.bias.grad, numerical_gradient(loss, head.bias.value)) < 1e-6


def test_tied_projection_gradient_equals_sum_of_separate_uses(rng):
    emb = Embedding(5, 3, rng=rng)
    head = TiedOutputProjection(emb)
    ids = rng.integers(0, 5, size=(2, 4))
    g = rng.standard_normal((2, 4, 5))
    x = emb.forward(ids)
    head.forward(x)
    grad_x = head.backward(g)
    from_head = emb.weight.grad.copy()
    emb.zero_grad()
    emb.forward(ids)
    emb.backward(grad_x)
    from_embedding = emb.weight.grad.copy()
    emb.zero_grad()
    emb.forward(ids)
    head.forward(x)
    emb.backward(head.backward(g))
    assert np.array_equal(emb.weight.grad, from_head + from_embedding)  # added, in this order


def test_tied_projection_gradient_for_its_input(rng):
    emb = Embedding(6, 4, rng=rng)
    errors = check_module_gradients(
        TiedOutputProjection(emb), [rng.standard_normal((2, 3, 4))], rng=rng
    )
    assert max(errors.values()) < 1e-6, errors


def test_dropout_gradient_with_a_fixed_mask(rng):
    layer = Dropout(0.4, rng=np.random.default_rng(5))
    state = layer.rng.bit_generator.state

    def reset():
        layer.rng.bit_generator.state = state

    errors = check_module_gradients(
        layer, [rng.standard_normal((3, 4, 5))], rng=rng, before_forward=reset
    )
    assert max(errors.values()) < 1e-6, errors


def test_dropout_scales_kept_units_and_is_reproducible():
    x = np.ones((200, 100))
    a = Dropout(0.25, rng=np.random.default_rng(1)).forward(x)
    b = Dropout(0.25, rng=np.random.default_rng(1)).forward(x)
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) == {0.0, 1 / 0.75}
    assert (a == 0).mean() == pytest.approx(0.25, abs=0.01)
    assert a.mean() == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_mask_is_what_forward_multiplies_by(dtype):
    layer = Dropout(0.3, rng=np.random.default_rng(4))
    state = layer.rng.bit_generator.state
    mask = layer.mask((40, 50), dtype)
    assert mask.dtype == dtype
    assert mask.shape == (40, 50)
    assert set(np.unique(mask)) == {dtype(0.0), dtype(1 / 0.7)}
    assert (mask == 0).mean() == pytest.approx(0.3, abs=0.03)
    layer.rng.bit_generator.state = state
    x = np.random.default_rng(5).standard_normal((40, 50)).astype(dtype)
    assert np.array_equal(layer.forward(x), x * mask)  # the same draw, the same multiplier


def test_dropout_mask_is_none_and_draws_nothing_when_nothing_is_dropped():
    for layer in (
        Dropout(0.5, rng=np.random.default_rng(1)).eval(),
        Dropout(0.0, rng=np.random.default_rng(1)),
    ):
        state = layer.rng.bit_generator.state
        assert layer.mask((3, 4), np.float64) is None
        assert layer.rng.bit_generator.state == state


def test_dropout_is_identity_in_eval_mode_and_with_p_zero(rng):
    x = rng.standard_normal((4, 5))
    layer = Dropout(0.5, rng=rng).eval()
    assert layer.forward(x) is x
    np.testing.assert_array_equal(layer.backward(x), x)
    assert Dropout(0.0, rng=rng).forward(x) is x


@given(st.floats(0.0, 0.9), st.integers(0, 2**32 - 1))
def test_dropout_backward_zeroes_exactly_the_dropped_units(p, seed):
    layer = Dropout(p, rng=np.random.default_rng(seed))
    x = np.ones((8, 8))
    y = layer.forward(x)
    g = layer.backward(np.ones((8, 8)))
    np.testing.assert_array_equal(g == 0, y == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layers_keep_float32_float32(rng, dtype):
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    linear = Linear(4, 5, rng=rng, dtype=dtype)
    y = linear.forward(x)
    assert y.dtype == dtype
    assert linear.backward(np.ones_like(y)).dtype == dtype
    assert linear.weight.grad.dtype == dtype
    emb = Embedding(9, 4, rng=rng, scale_by_sqrt_d=True, dtype=dtype)
    e = emb.forward(np.array([[1, 2]]))
    assert e.dtype == dtype
    emb.backward(np.ones_like(e))
    assert emb.weight.grad.dtype == dtype
    head = TiedOutputProjection(emb)
    z = head.forward(x)
    assert z.dtype == dtype
    assert head.backward(np.ones_like(z)).dtype == dtype
    drop = Dropout(0.5, rng=rng)
    assert drop.forward(x).dtype == dtype
    assert drop.backward(x).dtype == dtype


def test_parameters_are_listed_and_state_round_trips(rng):
    emb = Embedding(5, 3, rng=rng)
    head = TiedOutputProjection(emb, bias=True)
    assert [n for n, _ in head.named_parameters()] == ["weight", "bias"]
    other = TiedOutputProjection(Embedding(5, 3, rng=rng), bias=True)
    other.load_state_dict(head.state_dict())
    np.testing.assert_array_equal(other.weight.value, emb.weight.value)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_rows_agrees_with_numpy_add_at(rng, dtype):
    # repeated ids add up, ids absent from the batch stay untouched; each id's rows are summed
    # first and then added, so the rounding differs from add.at's one-by-one additions
    for vocab, n in [(1, 5), (7, 300), (500, 64)]:
        ids = rng.integers(0, vocab, n)
        rows = rng.standard_normal((n, 3)).astype(dtype)
        start = rng.standard_normal((vocab, 3)).astype(dtype)
        expected, got = start.copy(), start.copy()
        np.add.at(expected, ids, rows)
        _add_rows(got, ids, rows)
        tolerance = 1e-5 if dtype == np.float32 else 1e-12  # sums of up to ~50 rows, rounded
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
        assert got.dtype == dtype
    table = np.ones((3, 2))
    _add_rows(table, np.zeros(0, dtype=int), np.zeros((0, 2)))
    np.testing.assert_array_equal(table, np.ones((3, 2)))


# ----------------------------------------------------------------- reference
@pytest.mark.reference
def test_linear_agrees_with_torch(rng, torch):
    layer = Linear(5, 3, rng=rng)
    _randomize(layer, rng)
    x, g = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 3))
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(layer.weight.value.T, requires_grad=True)  # PyTorch keeps (out, in)
    bt = torch.tensor(layer.bias.value, requires_grad=True)
    yt = torch.nn.functional.linear(xt, wt, bt)
    yt.backward(torch.tensor(g))

    def close(ours, theirs):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-10, atol=1e-12)

    close(layer.forward(x), yt)
    close(layer.backward(g), xt.grad)
    close(layer.weight.grad, wt.grad.T)
    close(layer.bias.grad, bt.grad)


@pytest.mark.reference
def test_embedding_gradient_agrees_with_torch(rng, torch):
    emb = Embedding(7, 3, rng=rng)
    ids = np.array([[1, 6, 1, 1], [0, 6, 2, 1]])
    g = rng.standard_normal((2, 4, 3))
    table = torch.tensor(emb.weight.value, requires_grad=True)
    torch.nn.functional.embedding(torch.tensor(ids), table).backward(torch.tensor(g))
    emb.forward(ids)
    emb.backward(g)
    np.testing.assert_allclose(emb.weight.grad, table.grad.numpy(), rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------- bad input
def _x(*shape, dtype=np.float64):
    return np.ones(shape, dtype=dtype)


def _seeded():
    return np.random.default_rng(0)


# fmt: off
BAD = [
    ("Linear d_in zero", lambda: Linear(0, 3, rng=_seeded()), ValueError, "d_in must be a positive integer"),
    ("Linear d_out float", lambda: Linear(3, 2.5, rng=_seeded()), TypeError, "d_out must be a positive integer"),
    ("rng is a seed", lambda: Linear(3, 2, rng=0), TypeError, "rng must be a numpy.random.Generator"),
    ("Linear dtype", lambda: Linear(3, 2, rng=_seeded(), dtype=np.float16), TypeError, "dtype must be float32 or float64"),
    ("Linear last dim", lambda: Linear(3, 2, rng=_seeded()).forward(_x(4, 5)), ValueError, "x must have last dimension 3"),
    ("Linear input dtype", lambda: Linear(3, 2, rng=_seeded()).forward(_x(4, 3, dtype=np.float32)), TypeError, "x must have the layer's dtype float64"),
    ("backward before forward", lambda: Linear(3, 2, rng=_seeded()).backward(_x(1, 2)), RuntimeError, "Linear.backward was called before forward"),
    ("dropout p = 1", lambda: Dropout(1.0, rng=_seeded()), ValueError, "p must be"),
    ("dropout p string", lambda: Dropout("0.1", rng=_seeded()), TypeError, "p must be"),
    ("float16 into dropout", lambda: Dropout(0.1, rng=_seeded()).forward(_x(2, dtype=np.float16)), TypeError, "x must be float32 or float64"),
    ("vocab_size zero", lambda: Embedding(0, 4, rng=_seeded()), ValueError, "vocab_size must be a positive integer"),
    ("init_std negative", lambda: Embedding(4, 4, rng=_seeded(), init_std=-1.0), ValueError, "init_std must be a finite positive"),
    ("negative token id", lambda: Embedding(5, 2, rng=_seeded()).forward(np.array([[1, -1]])), ValueError, "ids must be non-negative"),
    ("float token ids", lambda: Embedding(5, 2, rng=_seeded()).forward(np.array([1.0, 2.0])), TypeError, "ids must be an integer array"),
    ("token id = vocab", lambda: Embedding(5, 2, rng=_seeded()).forward(np.array([0, 5])), ValueError, "ids"),
    ("tie to a Linear", lambda: TiedOutputProjection(Linear(2, 3, rng=_seeded())), TypeError, "embedding must be an Embedding layer"),
    ("tied last dim", lambda: TiedOutputProjection(Embedding(5, 2, rng=_seeded())).forward(_x(1, 3)), ValueError, "x must have last dimension 2"),
]
# fmt: on


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_raises_an_error_that_says_what_is_wrong(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value), str(info.value)
