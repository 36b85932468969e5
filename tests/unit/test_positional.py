"""Sinusoidal, learned and rotary position information."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.gradcheck import check_module_gradients
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.optim import AdamW
from tinyformer.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    apply_rotary,
    binary_encoding,
    distance_to_seen,
    fit_shift_matrix,
    halves_permutation,
    ntk_rotary_base,
    rotary_frequencies,
    sinusoidal_encoding,
    sinusoidal_encoding_at,
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


def _rotate_half_reference(x, positions, base=10000.0):
    """RoPE as LLaMA / GPT-NeoX code writes it: x cos + rotate_half(x) sin."""
    d = x.shape[-1]
    freqs = base ** (-np.arange(0, d, 2) / d)
    angles = np.concatenate([positions[:, None] * freqs] * 2, axis=1)  # (T, d)
    rotated_half = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)
    return x * np.cos(angles) + rotated_half * np.sin(angles)


def test_halves_layout_matches_the_rotate_half_formula(rng):
    x = rng.standard_normal((2, 7, 10))
    positions = np.arange(3, 10)
    np.testing.assert_allclose(
        apply_rotary(x, positions, layout="halves"),
        _rotate_half_reference(x, positions),
        atol=1e-12,
    )


@given(st.integers(1, 16), st.integers(0, 2**16), st.integers(0, 2**31 - 1))
def test_layouts_are_one_rotation_up_to_a_permutation(pairs, offset, seed):
    rng = np.random.default_rng(seed)
    d = 2 * pairs
    x = rng.standard_normal((3, 4, d))
    positions = np.arange(offset, offset + 4)
    perm = halves_permutation(d)
    np.testing.assert_allclose(
        apply_rotary(x[..., perm], positions, layout="halves"),
        apply_rotary(x, positions)[..., perm],
        atol=1e-12,
    )


def test_permuted_queries_and_keys_give_the_same_scores(rng):
    q, k = rng.standard_normal((2, 9, 12))
    perm = halves_permutation(12)
    adjacent = apply_rotary(q) @ apply_rotary(k).T
    halves = (
        apply_rotary(q[:, perm], layout="halves") @ apply_rotary(k[:, perm], layout="halves").T
    )
    np.testing.assert_allclose(halves, adjacent, atol=1e-12)
    mixed = apply_rotary(q, layout="halves") @ apply_rotary(k, layout="halves").T
    assert np.abs(mixed - adjacent).max() > 0.1  # unpermuted weights: different scores


def test_halves_permutation_orders_even_then_odd():
    np.testing.assert_array_equal(halves_permutation(6), [0, 2, 4, 1, 3, 5])


@pytest.mark.parametrize("layout", ["adjacent", "halves"])
def test_each_layout_is_relative_and_inverts(rng, layout):
    q, k = rng.standard_normal((2, 1, 8))

    def score(m, n):
        return float(
            apply_rotary(q, np.array([m]), layout=layout)[0]
            @ apply_rotary(k, np.array([n]), layout=layout)[0]
        )

    assert score(3, 10) == pytest.approx(score(103, 110), abs=1e-9)
    x = rng.standard_normal((4, 8))
    back = apply_rotary(apply_rotary(x, layout=layout), inverse=True, layout=layout)
    np.testing.assert_allclose(back, x, atol=1e-12)


def test_rotary_layer_gradients_in_the_halves_layout(rng):
    layer = RotaryEmbedding(6, layout="halves")
    errors = check_module_gradients(
        layer, [rng.standard_normal((2, 5, 6))], rng=rng, kwargs={"start": 2}
    )
    assert max(errors.values()) < 1e-6, errors


def test_adamw_shrinks_unused_learned_rows_by_the_decay_factor(rng):
    layer = LearnedPositionalEmbedding(8, 3, rng=rng)
    start = layer.weight.value.copy()
    lr, decay, steps = 0.01, 0.1, 5
    opt = AdamW(layer.parameters(), lr=lr, weight_decay=decay)
    for _ in range(steps):
        opt.zero_grad()
        layer.forward(rng.standard_normal((2, 4, 3)))
        layer.backward(rng.standard_normal((2, 4, 3)))
        opt.step()
    np.testing.assert_allclose(layer.weight.value[4:], start[4:] * (1 - lr * decay) ** steps)
    assert not np.allclose(layer.weight.value[:4], start[:4] * (1 - lr * decay) ** steps)


def test_learned_embedding_gradients(rng):
    layer = LearnedPositionalEmbedding(6, 4, rng=rng)
    x = rng.standard_normal((2, 3, 4))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"start": 2})
    assert max(errors.values()) < 1e-6, errors


def test_position_layers_add_their_table_rows_from_start(rng):
    x = rng.standard_normal((2, 3, 4))
    sinusoidal = SinusoidalPositionalEncoding(4, context_length=10)
    np.testing.assert_array_equal(sinusoidal.forward(x, 5), x + sinusoidal_encoding(10, 4)[5:8])
    assert sinusoidal.context_length == 10
    learned = LearnedPositionalEmbedding(10, 4, rng=rng)
    np.testing.assert_array_equal(learned.forward(x, 7), x + learned.weight.value[7:10])
    rotary = RotaryEmbedding(4)
    np.testing.assert_array_equal(rotary.forward(x, 2), apply_rotary(x, np.arange(2, 5)))


def test_sinusoidal_layer_gradients(rng):
    layer = SinusoidalPositionalEncoding(4, context_length=10)
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


def test_encoding_at_integer_positions_is_the_table():
    table = sinusoidal_encoding(50, 12)
    np.testing.assert_array_equal(sinusoidal_encoding_at(np.arange(50), 12), table)
    np.testing.assert_array_equal(sinusoidal_encoding_at([3, 7, 3], 12), table[[3, 7, 3]])


@given(st.floats(-1e4, 1e4), st.sampled_from([2, 6, 32]))
def test_encoding_at_any_position_is_a_point_on_each_circle(p, d):
    row = sinusoidal_encoding_at(np.array([p]), d)[0]
    np.testing.assert_allclose(row[0::2] ** 2 + row[1::2] ** 2, 1.0, atol=1e-12)
    angles = p * rotary_frequencies(d)
    np.testing.assert_allclose(row[0::2], np.sin(angles), atol=1e-12)
    np.testing.assert_allclose(row[1::2], np.cos(angles), atol=1e-12)


def test_half_way_positions_lie_between_their_neighbours():
    halves = sinusoidal_encoding_at(np.arange(10) + 0.5, 16)
    table = sinusoidal_encoding(11, 16)
    step = np.linalg.norm(table[1] - table[0])
    np.testing.assert_allclose(
        np.linalg.norm(halves - table[:-1], axis=1), np.linalg.norm(halves - table[1:], axis=1)
    )
    assert np.all(np.linalg.norm(halves - table[:-1], axis=1) < step)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encoding_at_dtype(dtype):
    assert sinusoidal_encoding_at(np.array([0.5, 2.0]), 4, dtype=dtype).dtype == dtype


def test_binary_code_writes_each_position_in_base_two():
    code = binary_encoding(13)
    assert code.shape == (13, 4)
    weights = 2 ** np.arange(4)
    np.testing.assert_array_equal(code @ weights, np.arange(13))
    np.testing.assert_array_equal(code[6], [0, 1, 1, 0])  # 6 = 0b110, least significant first


@pytest.mark.parametrize(("n", "bits"), [(1, 1), (2, 1), (3, 2), (64, 6), (65, 7)])
def test_binary_code_default_width_is_the_fewest_bits(n, bits):
    assert binary_encoding(n).shape == (n, bits)


@given(st.integers(1, 1000))
def test_binary_neighbours_differ_in_one_bit_more_than_trailing_zeros(p):
    code = binary_encoding(p + 1, 10)
    trailing_zeros = (p & -p).bit_length() - 1  # p = ...1000 has three
    assert int(np.sum(code[p] != code[p - 1])) == trailing_zeros + 1


def test_binary_code_dtype_and_width():
    code = binary_encoding(4, 8, dtype=np.float32)
    assert code.shape == (4, 8)
    assert code.dtype == np.float32


def test_fit_recovers_the_sinusoidal_shift_matrix():
    table = sinusoidal_encoding(400, 8)
    for k in (1, 3, 10):
        m = fit_shift_matrix(table, k)
        np.testing.assert_allclose(m, sinusoidal_shift_matrix(k, 8), atol=1e-8)
        np.testing.assert_allclose(table[:-k] @ m.T, table[k:], atol=1e-10)


def test_no_linear_map_shifts_the_binary_code():
    code = binary_encoding(64)
    m = fit_shift_matrix(code, 1)
    residual = np.abs(code[:-1] @ m.T - code[1:]).max()
    assert residual > 0.4, residual


def test_fit_is_exact_for_a_cyclic_permutation_code():
    one_hot = np.eye(5)[np.arange(12) % 5]  # position p -> one-hot of p mod 5
    m = fit_shift_matrix(one_hot, 2)
    np.testing.assert_allclose(m, np.roll(np.eye(5), 2, axis=0), atol=1e-12)


def test_distance_to_seen_matches_brute_force(rng):
    e, s = rng.standard_normal((7, 3)), rng.standard_normal((4, 3))
    brute = [min(np.linalg.norm(a - b) for b in s) for a in e]
    np.testing.assert_allclose(distance_to_seen(e, s), brute, rtol=1e-12)


def test_distance_to_seen_is_zero_for_seen_rows():
    table = sinusoidal_encoding(20, 8)
    np.testing.assert_array_equal(distance_to_seen(table[5:15], table), 0.0)
    assert np.all(distance_to_seen(sinusoidal_encoding(40, 8)[20:], table) > 0)


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
        (lambda: apply_rotary(np.ones((3, 4)), layout="split"), ValueError, "layout must be one"),
        (lambda: RotaryEmbedding(4, layout="pairs"), ValueError, "layout must be one of"),
        (lambda: halves_permutation(5), ValueError, "d_k must be even"),
        (
            lambda: LearnedPositionalEmbedding(4, 2, rng=np.random.default_rng(0)).forward(
                np.ones((1, 5, 2))
            ),
            ValueError,
            "positions 0..3",
        ),
        (
            lambda: LearnedPositionalEmbedding(4, 2, rng=np.random.default_rng(0)).forward(
                np.ones((1, 3, 2), np.float32)
            ),
            TypeError,
            "x must have dtype float64",
        ),
        (
            lambda: LearnedPositionalEmbedding(4, 2, rng=0),
            TypeError,
            "rng must be a numpy.random.Generator",
        ),
        (
            lambda: SinusoidalPositionalEncoding(4, context_length=3).forward(np.ones((5, 4))),
            ValueError,
            "the sinusoidal table covers positions 0..2",
        ),
        (
            lambda: SinusoidalPositionalEncoding(4, context_length=0),
            ValueError,
            "context_length must be a positive integer",
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
        (lambda: sinusoidal_encoding_at(np.ones((2, 2)), 4), ValueError, "positions must have 1"),
        (lambda: sinusoidal_encoding_at([0.0, np.nan], 4), ValueError, "positions must be finite"),
        (lambda: sinusoidal_encoding_at(["a"], 4), TypeError, "positions must be a real"),
        (lambda: sinusoidal_encoding_at([1.0], 3), ValueError, "d_model must be even"),
        (lambda: binary_encoding(9, 3), ValueError, "writes positions 0..7 only"),
        (lambda: binary_encoding(4, 63), ValueError, "n_bits must be at most 62"),
        (lambda: binary_encoding(4, 0), ValueError, "n_bits must be a positive"),
        (lambda: binary_encoding(4, dtype=int), TypeError, "dtype must be"),
        (lambda: fit_shift_matrix(np.ones(5), 1), ValueError, "table must have 2"),
        (lambda: fit_shift_matrix(np.ones((5, 2)), 5), ValueError, "offset must be smaller"),
        (lambda: fit_shift_matrix(np.ones((5, 2)), 0), ValueError, "offset must be a positive"),
        (
            lambda: distance_to_seen(np.ones((2, 3)), np.ones((2, 4))),
            ValueError,
            "last dimension 3",
        ),
        (lambda: distance_to_seen(np.ones((2, 3)), np.ones((0, 3))), ValueError, "at least one"),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


# ------------------------------------------------------------ rotary scaling for longer contexts
@pytest.mark.parametrize("factor", [2.0, 4.0, 2.5])
@pytest.mark.parametrize("layout", ["adjacent", "halves"])
def test_position_interpolation_rotates_position_t_as_t_over_s(factor, layout):
    """Chen et al.: at factor s, position t gets the unscaled rotation of position t / s."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 8))
    u = np.array([0, 2, 4, 8, 100, 2048])  # unscaled positions, even: u * 2.5 is whole
    t = (u * factor).astype(np.int64)  # the stretched context's positions, t / s = u exactly
    scaled = apply_rotary(x, t, scaling="linear", scaling_factor=factor, layout=layout)
    np.testing.assert_array_equal(scaled, apply_rotary(x, u, layout=layout))
    # in between: the frequencies are divided by s, so position 1 turns by omega / s
    freqs = rotary_frequencies(8)
    np.testing.assert_allclose(
        rotary_frequencies(8, scaling="linear", scaling_factor=factor), freqs / factor, rtol=1e-15
    )
    assert not np.array_equal(scaled, apply_rotary(x, t, layout=layout))  # it did change


@pytest.mark.parametrize("factor", [2.0, 8.0, 0.5])
@pytest.mark.parametrize("d", [4, 8, 128])
def test_ntk_scaling_keeps_the_fastest_pair_and_slows_the_slowest_by_s(factor, d):
    plain = rotary_frequencies(d, 500.0)
    ntk = rotary_frequencies(d, 500.0, scaling="ntk", scaling_factor=factor)
    assert ntk[0] == plain[0] == 1.0  # the fastest pair: unchanged
    np.testing.assert_allclose(ntk[-1], plain[-1] / factor, rtol=1e-12)  # the slowest: / s
    # in between, pair i is slowed by s^(2i/(d-2)): monotone from 1 to s
    i = np.arange(d // 2)
    np.testing.assert_allclose(plain / ntk, factor ** (2 * i / (d - 2)), rtol=1e-12)
    assert ntk_rotary_base(500.0, d, factor) == pytest.approx(500.0 * factor ** (d / (d - 2)))
    x = np.random.default_rng(1).standard_normal((3, d))
    np.testing.assert_array_equal(
        apply_rotary(x, scaling="ntk", scaling_factor=factor, base=500.0),
        apply_rotary(x, base=ntk_rotary_base(500.0, d, factor)),
    )


@pytest.mark.parametrize("scaling", ["linear", "ntk"])
def test_scaled_rotary_layer_rotates_back_in_backward(rng, scaling):
    layer = RotaryEmbedding(6, base=100.0, scaling=scaling, scaling_factor=3.0)
    x = rng.standard_normal((2, 5, 6))
    y = layer.forward(x, start=4)
    np.testing.assert_array_equal(
        y, apply_rotary(x, np.arange(4, 9), base=100.0, scaling=scaling, scaling_factor=3.0)
    )
    np.testing.assert_allclose(layer.backward(y), x, rtol=0, atol=1e-14)  # orthogonal
    errors = check_module_gradients(
        RotaryEmbedding(6, scaling=scaling, scaling_factor=3.0), [x], rng=rng
    )
    assert max(errors.values()) < 1e-8, errors
    assert RotaryEmbedding(6, scaling=scaling, scaling_factor=1.0).forward(x).dtype == x.dtype
    x32 = x.astype(np.float32)
    assert apply_rotary(x32, scaling=scaling, scaling_factor=2.0).dtype == np.float32


def test_unscaled_calls_are_unchanged():
    x = np.random.default_rng(2).standard_normal((4, 8))
    np.testing.assert_array_equal(
        apply_rotary(x, scaling="linear", scaling_factor=1.0), apply_rotary(x)
    )
    np.testing.assert_array_equal(
        apply_rotary(x, scaling="ntk", scaling_factor=1.0), apply_rotary(x)
    )


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: rotary_frequencies(8, scaling="yarn"), ValueError, "scaling must be None or one"),
        (lambda: apply_rotary(np.zeros((2, 4)), scaling="ntk", scaling_factor=0), ValueError,
         "scaling_factor must be a finite positive number"),
        (lambda: RotaryEmbedding(4, scaling="linear", scaling_factor="2"), TypeError,
         "scaling_factor must be a positive number"),
        (lambda: RotaryEmbedding(2, scaling="ntk", scaling_factor=2.0), ValueError,
         "d must be at least 4 for NTK scaling"),
        (lambda: ntk_rotary_base(-1.0, 8, 2.0), ValueError, "base must be a finite positive"),
    ],
)  # fmt: skip
def test_rotary_scaling_errors_name_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_ntk_scaling_in_a_model_changes_the_base_of_every_attention_layer():
    sizes = {"d_model": 16, "n_heads": 2, "d_ff": 8, "context_length": 12, "positional": "rotary"}
    scaled_config = DecoderOnlyConfig(9, **sizes, rotary_scaling="ntk", rotary_scaling_factor=4)
    expected = ntk_rotary_base(10000.0, 8, 4.0)
    assert scaled_config.rotary_frequency_base == expected
    scaled = DecoderOnlyLM(scaled_config, rng=np.random.default_rng(0))
    same = DecoderOnlyLM(
        DecoderOnlyConfig(9, **sizes, rotary_base=expected), rng=np.random.default_rng(0)
    )
    plain = DecoderOnlyLM(DecoderOnlyConfig(9, **sizes), rng=np.random.default_rng(0))
    for block in scaled.decoder.layers:
        assert block.self_attention.layer.rotary_base == expected
    ids = np.random.default_rng(1).integers(0, 9, (2, 12))
    np.testing.assert_array_equal(scaled.forward(ids), same.forward(ids))
    assert not np.allclose(scaled.forward(ids), plain.forward(ids))
    assert DecoderOnlyConfig(9, **sizes).rotary_frequency_base == 10000.0


def test_a_scaling_factor_without_a_scaling_is_refused():
    x = np.random.default_rng(0).standard_normal((1, 3, 8))
    for call in (
        lambda: apply_rotary(x, scaling=None, scaling_factor=4.0),
        lambda: rotary_frequencies(8, scaling_factor=4.0),
        lambda: RotaryEmbedding(8, scaling_factor=4.0),
    ):
        with pytest.raises(
            ValueError, match=r"scaling_factor=4\.0 has no effect without a scaling"
        ):
            call()
    with pytest.raises(TypeError, match="scaling_factor"):
        apply_rotary(x, scaling_factor="abc")
