"""Sinusoidal, learned and rotary position information."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.gradcheck import check_module_gradients
from tinyformer.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    apply_rotary,
    rotary_frequencies,
    sinusoidal_encoding,
    sinusoidal_shift_matrix,
)


def test_sinusoidal_table_matches_the_formula_entry_by_entry():
    n, d = 7, 6
    table = sinusoidal_encoding(n, d)
    assert table.shape == (n, d)
    for p in range(n):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert table[p, 2 * i] == pytest.approx(np.sin(angle), abs=1e-15)
            assert table[p, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-15)


def test_sinusoidal_first_row_is_zeros_and_ones():
    row = sinusoidal_encoding(1, 8)[0]
    np.testing.assert_array_equal(row[0::2], 0.0)
    np.testing.assert_array_equal(row[1::2], 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sinusoidal_dtype(dtype):
    assert sinusoidal_encoding(4, 4, dtype=dtype).dtype == dtype


@given(st.integers(0, 200), st.integers(-50, 50), st.sampled_from([2, 8, 64]))
def test_shift_matrix_moves_every_position_by_the_offset(p, k, d):
    table = sinusoidal_encoding(300, d)
    m = sinusoidal_shift_matrix(k, d)
    if 0 <= p + k < 300:
        np.testing.assert_allclose(m @ table[p], table[p + k], atol=1e-9)


def test_shift_matrix_is_orthogonal_and_composes():
    a, b = sinusoidal_shift_matrix(3, 16), sinusoidal_shift_matrix(5, 16)
    np.testing.assert_allclose(a @ a.T, np.eye(16), atol=1e-12)
    np.testing.assert_allclose(a @ b, sinusoidal_shift_matrix(8, 16), atol=1e-12)


def test_dot_products_depend_only_on_the_offset():
    table = sinusoidal_encoding(100, 32)
    for k in (1, 5, 17):
        dots = np.einsum("pd,pd->p", table[:-k], table[k:])
        np.testing.assert_allclose(dots, dots[0], atol=1e-9)


def test_rotary_frequencies_fall_geometrically():
    w = rotary_frequencies(8)
    np.testing.assert_allclose(w, [1.0, 1e-1, 1e-2, 1e-3])


@given(st.integers(0, 100), st.integers(0, 100), st.integers(0, 40))
def test_rope_scores_depend_only_on_the_offset(m, n, shift):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 16))

    def score(pm, pn):
        qr = apply_rotary(q, np.array([pm]))
        kr = apply_rotary(k, np.array([pn]))
        return float(qr[0] @ kr[0])

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-9)


def test_rope_preserves_norms_and_inverts(rng):
    x = rng.standard_normal((2, 5, 8))
    y = apply_rotary(x)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
    np.testing.assert_allclose(apply_rotary(y, inverse=True), x, atol=1e-12)


def test_rope_at_position_zero_is_identity(rng):
    x = rng.standard_normal((1, 8))
    np.testing.assert_allclose(apply_rotary(x), x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_keeps_dtype(rng, dtype):
    assert apply_rotary(rng.standard_normal((3, 4)).astype(dtype)).dtype == dtype


def test_learned_embedding_gradients(rng):
    layer = LearnedPositionalEmbedding(6, 4, rng=rng)
    x = rng.standard_normal((2, 3, 4))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"start": 2})
    assert max(errors.values()) < 1e-6, errors


def test_sinusoidal_layer_gradients(rng):
    layer = SinusoidalPositionalEncoding(4, max_len=10)
    errors = check_module_gradients(layer, [rng.standard_normal((2, 3, 4))], rng=rng)
    assert max(errors.values()) < 1e-6, errors


def test_rotary_layer_gradients(rng):
    layer = RotaryEmbedding(6)
    errors = check_module_gradients(
        layer, [rng.standard_normal((2, 2, 5, 6))], rng=rng, kwargs={"start": 3}
    )
    assert max(errors.values()) < 1e-6, errors


def test_learned_table_only_receives_gradient_on_used_rows(rng):
    layer = LearnedPositionalEmbedding(8, 2, rng=rng)
    layer.forward(np.zeros((3, 2, 2)), start=4)
    layer.backward(np.ones((3, 2, 2)))
    np.testing.assert_array_equal(layer.weight.grad[[4, 5]], 3.0)
    np.testing.assert_array_equal(np.delete(layer.weight.grad, [4, 5], axis=0), 0.0)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: sinusoidal_encoding(0, 4), ValueError, "n_positions must be a positive"),
        (lambda: sinusoidal_encoding(4, 5), ValueError, "d_model must be even"),
        (lambda: sinusoidal_encoding(4.0, 4), TypeError, "n_positions must be a positive"),
        (lambda: sinusoidal_encoding(4, 4, dtype=np.int32), TypeError, "dtype must be"),
        (lambda: sinusoidal_encoding(4, 4, base=-1.0), ValueError, "base must be"),
        (lambda: sinusoidal_shift_matrix(1.5, 4), TypeError, "offset must be an integer"),
        (lambda: apply_rotary(np.ones((3, 5))), ValueError, "x.shape[-1] must be even"),
        (lambda: apply_rotary(np.ones((3, 4)), np.ones(3)), ValueError, "positions must be"),
        (
            lambda: LearnedPositionalEmbedding(4, 2, rng=np.random.default_rng(0)).forward(
                np.ones((1, 5, 2))
            ),
            ValueError,
            "positions 0..3",
        ),
        (
            lambda: LearnedPositionalEmbedding(4, 2, rng=0),
            TypeError,
            "rng must be a numpy.random.Generator",
        ),
        (
            lambda: SinusoidalPositionalEncoding(4).forward(np.ones((2, 3))),
            ValueError,
            "last dimension 4",
        ),
        (
            lambda: SinusoidalPositionalEncoding(4).forward(np.ones((2, 4), np.float32)),
            TypeError,
            "x must have dtype float64",
        ),
        (lambda: RotaryEmbedding(4).forward(np.ones((2, 4)), start=-1), ValueError, "start"),
        (lambda: RotaryEmbedding(4).backward(np.ones((2, 4))), RuntimeError, "before forward"),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
