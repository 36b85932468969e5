"""Grouped-query and multi-query attention: shared key/value heads, their gradients and cache.

Also the options that come with the modern decoder: the rotary base and pair layout,
stored in configurations and checkpoints.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.checkpoint import read_checkpoint, save_checkpoint
from tinyformer.gradcheck import check_module_gradients, check_parameter_gradients
from tinyformer.masks import causal_mask, padding_mask
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM, EncoderDecoder, load_model
from tinyformer.models.config import EncoderDecoderConfig, EncoderOnlyConfig
from tinyformer.multihead import KVCache, MultiHeadAttention, multi_head_attention_loop
from tinyformer.positional import apply_rotary, convert_rotary_layout, halves_permutation

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
# (n_heads, n_kv_heads): groups of 1 (plain), 2 and 4, and one key/value head (multi-query)
GROUPS = [(4, 4), (4, 2), (8, 2), (4, 1)]
GROUP_IDS = ["group1", "group2", "group4", "multi-query"]


def _layer(rng, n_heads, n_kv_heads, d_k=2, dtype=np.float64, **kwargs):
    """A grouped-query layer whose every parameter is random (zero biases would hide mistakes)."""
    layer = MultiHeadAttention(
        n_heads * d_k, n_heads, n_kv_heads=n_kv_heads, rng=rng, dtype=dtype, **kwargs
    )
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.5
    return layer


def _repeated(layer):
    """The same function as ``layer`` with every key/value head copied for each query head.

    The explicit ``repeat_interleave`` of the key and value columns: a plain multi-head
    layer with ``n_heads`` key/value heads, whose copies training would untie.
    """
    plain = MultiHeadAttention(
        layer.d_model,
        layer.n_heads,
        rng=np.random.default_rng(0),
        bias=layer.q_proj.bias is not None,
        rotary=layer.rotary,
        dtype=layer.dtype,
    )
    state = layer.state_dict()
    for name in ("k_proj", "v_proj"):
        for kind in ("weight", "bias"):
            key = f"{name}.{kind}"
            if key in state:
                heads = np.split(state[key], layer.n_kv_heads, axis=-1)  # per key/value head
                state[key] = np.concatenate(
                    [h for h in heads for _ in range(layer.group)], axis=-1
                )
    plain.load_state_dict(state)
    return plain


def _group_sum(grad, layer):
    """Gradient of the copied columns of :func:`_repeated` summed back onto each shared head."""
    g = layer.group
    heads = np.split(grad, layer.n_heads, axis=-1)
    return np.concatenate(
        [sum(heads[j * g + m] for m in range(g)) for j in range(layer.n_kv_heads)], axis=-1
    )


# ------------------------------------------------------------------ structure
@pytest.mark.parametrize(("n_heads", "n_kv_heads"), GROUPS, ids=GROUP_IDS)
def test_key_and_value_projections_make_only_the_shared_heads(rng, n_heads, n_kv_heads):
    layer = MultiHeadAttention(4 * n_heads, n_heads, n_kv_heads=n_kv_heads, rng=rng)
    d, d_kv = 4 * n_heads, 4 * n_kv_heads
    assert layer.d_k == 4
    assert layer.group == n_heads // n_kv_heads
    shapes = {name: getattr(layer, name).weight.shape for name in PROJECTIONS}
    assert shapes == {
        "q_proj": (d, d),
        "k_proj": (d, d_kv),
        "v_proj": (d, d_kv),
        "out_proj": (d, d),
    }
    assert layer.num_parameters() == 2 * (d * d + d) + 2 * (d * d_kv + d_kv)


def test_n_kv_heads_equal_to_n_heads_is_bitwise_the_plain_layer(rng):
    """The same draws, the same operations: forward, weights and every gradient to the bit."""
    x = rng.standard_normal((2, 5, 8))
    grad = rng.standard_normal((2, 5, 8))
    results = []
    for n_kv_heads in (None, 4):
        layer = MultiHeadAttention(
            8, 4, n_kv_heads=n_kv_heads, rotary=True, dropout=0.2, rng=np.random.default_rng(3)
        )
        out = layer.forward(x, mask=causal_mask(5))
        grad_x = layer.backward(grad)
        results.append(
            [out, grad_x, layer.attention_weights, *(p.grad for p in layer.parameters())]
        )
    for a, b in zip(*results, strict=True):
        assert a.dtype == b.dtype
        assert a.tobytes() == b.tobytes()


@given(st.integers(0, 2**32 - 1), st.sampled_from(GROUPS), st.booleans(), st.booleans())
def test_one_head_at_a_time_agrees_with_the_grouped_layer(seed, heads, rotary, cross):
    rng = np.random.default_rng(seed)
    layer = _layer(rng, *heads, rotary=rotary and not cross)
    x = rng.standard_normal((2, 3, layer.d_model))
    context = rng.standard_normal((2, 4, layer.d_model)) if cross else None
    mask = rng.random((2, 3, 4 if cross else 3)) < 0.7
    mask[..., 0] = True
    np.testing.assert_allclose(
        layer.forward(x, context, mask=mask),
        multi_head_attention_loop(layer, x, context, mask=mask),
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("rotary", [False, True])
def test_grouped_layer_equals_explicitly_repeated_heads_and_sums_their_gradients(
    rng, n_heads, n_kv_heads, rotary
):
    """Sharing is the repeat of PyTorch's ``repeat_interleave``, and its gradient the group's sum."""
    layer = _layer(rng, n_heads, n_kv_heads, rotary=rotary)
    plain = _repeated(layer)
    x = rng.standard_normal((2, 5, layer.d_model))
    grad = rng.standard_normal(x.shape)
    out = layer.forward(x, mask=causal_mask(5))
    np.testing.assert_allclose(out, plain.forward(x, mask=causal_mask(5)), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(
        layer.attention_weights, plain.attention_weights, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(layer.backward(grad), plain.backward(grad), rtol=1e-11, atol=1e-12)
    for name in PROJECTIONS:
        for kind in ("weight", "bias"):
            ours = getattr(getattr(layer, name), kind).grad
            theirs = getattr(getattr(plain, name), kind).grad
            if name in ("k_proj", "v_proj"):
                theirs = _group_sum(theirs, layer)
            np.testing.assert_allclose(ours, theirs, rtol=1e-11, atol=1e-12)


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize(("n_heads", "n_kv_heads"), GROUPS, ids=GROUP_IDS)
def test_gradients_self_attention_with_causal_mask_and_rotary(rng, n_heads, n_kv_heads):
    layer = _layer(rng, n_heads, n_kv_heads, rotary=True)
    x = rng.standard_normal((2, 4, layer.d_model))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"mask": causal_mask(4)})
    assert set(errors) == {"input 0"} | {
        f"{n}.{k}" for n in PROJECTIONS for k in ("weight", "bias")
    }
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), GROUPS, ids=GROUP_IDS)
def test_gradients_cross_attention_with_padding(rng, n_heads, n_kv_heads):
    layer = _layer(rng, n_heads, n_kv_heads)
    ids = rng.integers(1, 9, size=(2, 5))
    ids[1, -2:] = 0
    x, context = (
        rng.standard_normal((2, 3, layer.d_model)),
        rng.standard_normal((2, 5, layer.d_model)),
    )
    errors = check_module_gradients(
        layer, [x, context], rng=rng, kwargs={"mask": padding_mask(ids, 0)}
    )
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), GROUPS[1:], ids=GROUP_IDS[1:])
def test_gradients_with_attention_dropout_and_no_bias(rng, n_heads, n_kv_heads):
    layer = _layer(rng, n_heads, n_kv_heads, dropout=0.3, bias=False)
    state = layer.dropout.rng.bit_generator.state

    def reset():
        layer.dropout.rng.bit_generator.state = state

    x = rng.standard_normal((2, 4, layer.d_model))
    errors = check_module_gradients(layer, [x], rng=rng, before_forward=reset)
    assert list(errors) == ["input 0"] + [f"{name}.weight" for name in PROJECTIONS]
    assert max(errors.values()) < 1e-6, errors


def test_float32_stays_float32_and_agrees_with_float64(rng):
    layer = _layer(rng, 4, 2, dtype=np.float64, rotary=True)
    single = MultiHeadAttention(
        8, 4, n_kv_heads=2, rotary=True, rng=np.random.default_rng(0), dtype=np.float32
    )
    single.load_state_dict(layer.state_dict())
    x = rng.standard_normal((2, 5, 8))
    grad = rng.standard_normal(x.shape)
    out32 = single.forward(x.astype(np.float32), mask=causal_mask(5))
    grad32 = single.backward(grad.astype(np.float32))
    assert out32.dtype == grad32.dtype == single.k_proj.weight.grad.dtype == np.float32
    assert single.attention_weights.dtype == np.float32
    np.testing.assert_allclose(out32, layer.forward(x, mask=causal_mask(5)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad32, layer.backward(grad), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ KV cache
@pytest.mark.parametrize(("n_heads", "n_kv_heads"), GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cache_holds_the_key_value_heads_only_and_decoding_matches(
    rng, n_heads, n_kv_heads, dtype
):
    layer = _layer(rng, n_heads, n_kv_heads, rotary=True, dtype=dtype)
    x = rng.standard_normal((3, 6, layer.d_model)).astype(dtype)
    full = layer.forward(x, mask=causal_mask(6))
    cache, pieces, start = KVCache(), [], 0
    for n in (2, 1, 3):
        pieces.append(
            layer.forward(x[:, start : start + n], mask=causal_mask(n, start + n), cache=cache)
        )
        start += n
    assert cache.keys.shape == cache.values.shape == (3, n_kv_heads, 6, layer.d_k)
    assert cache.keys.dtype == dtype
    keys = apply_rotary(
        layer.k_proj.forward(x).reshape(3, 6, n_kv_heads, layer.d_k).transpose(0, 2, 1, 3),
        np.arange(6),
    )
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(cache.keys, keys, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(
        np.concatenate(pieces, axis=1), full, rtol=tolerance, atol=tolerance
    )
    beams = cache.select(np.array([2, 2, 0]))
    assert beams.keys.shape == (3, n_kv_heads, 6, layer.d_k)
    np.testing.assert_array_equal(beams.values[0], cache.values[2])
    cache.truncate(4)
    assert cache.keys.shape == (3, n_kv_heads, 4, layer.d_k)


@pytest.mark.parametrize("n_kv_heads", [2, 1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_model_cached_decoding_equals_the_full_forward(n_kv_heads, dtype):
    config = DecoderOnlyConfig(
        13,
        d_model=16,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        d_ff=24,
        n_layers=2,
        context_length=12,
        norm="rmsnorm",
        feed_forward="gated",
        activation="silu",
        bias=False,
        positional="rotary",
        rotary_base=500.0,
        tie_output=False,
        dtype=dtype,
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(1)).eval()
    ids = np.random.default_rng(2).integers(0, 13, (2, 9))
    full = model.forward(ids)
    state = model.start(2)
    pieces = [model.step(ids[:, :4], state)] + [
        model.step(ids[:, i : i + 1], state) for i in range(4, 9)
    ]
    for cache in state.caches:
        assert cache.self_attention.keys.shape == (2, n_kv_heads, 9, 4)
    tolerance = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(
        np.concatenate(pieces, axis=1), full, rtol=tolerance, atol=tolerance
    )


def test_model_gradients_with_grouped_heads_are_the_finite_differences():
    config = DecoderOnlyConfig(
        7, d_model=8, n_heads=4, n_kv_heads=2, d_ff=6, n_layers=2, context_length=5,
        positional="rotary", rotary_base=100.0, norm="rmsnorm", feed_forward="gated",
        activation="silu", bias=False, tie_output=False,
    )  # fmt: skip
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, 7, (2, 4))
    upstream = np.random.default_rng(2).standard_normal((2, 4, 7))

    def run():
        return model.forward(ids) * upstream, upstream

    errors = check_parameter_gradients(model, run)
    assert any("k_proj" in name for name in errors)
    assert max(errors.values()) < 1e-6, errors


# ------------------------------------------------------------------ rotary base and layout
def test_rotary_base_reaches_the_rotation(rng):
    x = rng.standard_normal((1, 4, 16))
    layers = [  # d_k = 4: with d_k = 2 the one pair turns at base**0 = 1 whatever the base
        _layer(np.random.default_rng(5), 4, 2, d_k=4, rotary=True, rotary_base=base)
        for base in (10000.0, 50.0)
    ]
    a, b = (layer.forward(x) for layer in layers)
    assert not np.allclose(a, b)
    np.testing.assert_allclose(b, multi_head_attention_loop(layers[1], x), rtol=1e-12, atol=1e-13)


def test_halves_layout_with_converted_weights_computes_the_same_function(rng):
    adjacent = _layer(rng, 4, 2, d_k=4, rotary=True)
    halves = MultiHeadAttention(
        16, 4, n_kv_heads=2, rotary=True, rotary_layout="halves", rng=np.random.default_rng(0)
    )
    state = adjacent.state_dict()
    for name, heads in (("q_proj", 4), ("k_proj", 2)):
        for kind in ("weight", "bias"):
            key = f"{name}.{kind}"
            state[key] = convert_rotary_layout(
                state[key], heads, source="adjacent", target="halves"
            )
    halves.load_state_dict(state)
    x = rng.standard_normal((2, 6, 16))
    np.testing.assert_allclose(
        halves.forward(x, mask=causal_mask(6)),
        adjacent.forward(x, mask=causal_mask(6)),
        rtol=1e-12,
        atol=1e-13,
    )
    np.testing.assert_allclose(halves.forward(x), multi_head_attention_loop(halves, x), rtol=1e-12)
    errors = check_module_gradients(halves, [x[:, :3]], rng=rng, kwargs={"mask": causal_mask(3)})
    assert max(errors.values()) < 1e-6, errors


def test_convert_rotary_layout_directions_and_round_trip(rng):
    d_k, n_heads = 6, 2
    w = rng.standard_normal((5, n_heads * d_k))
    to_halves = convert_rotary_layout(w, n_heads, source="adjacent", target="halves")
    perm = halves_permutation(d_k)
    np.testing.assert_array_equal(to_halves[:, :d_k], w[:, :d_k][:, perm])
    np.testing.assert_array_equal(to_halves[:, d_k:], w[:, d_k:][:, perm])
    back = convert_rotary_layout(to_halves, n_heads, source="halves", target="adjacent")
    np.testing.assert_array_equal(back, w)
    # halves -> adjacent: new[2i] = old[i], new[2i + 1] = old[i + d_k / 2], head by head
    head = back[:, :d_k]
    np.testing.assert_array_equal(head[:, 0::2], to_halves[:, : d_k // 2])
    np.testing.assert_array_equal(head[:, 1::2], to_halves[:, d_k // 2 : d_k])
    # PyTorch's (out, in) weights: the features along axis 0
    np.testing.assert_array_equal(
        convert_rotary_layout(w.T, n_heads, source="adjacent", target="halves", axis=0),
        to_halves.T,
    )
    np.testing.assert_array_equal(convert_rotary_layout(w, 2, source="halves", target="halves"), w)
    # rotating the converted features in the other layout is the same rotation, reordered
    x = rng.standard_normal((3, d_k))
    np.testing.assert_allclose(
        apply_rotary(x[:, perm], layout="halves"), apply_rotary(x)[:, perm], rtol=1e-15
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"n_heads": 3}, ValueError, "split into n_heads=3"),
        ({"n_heads": 2, "source": "rotated"}, ValueError, "source must be one of"),
        ({"n_heads": 2, "target": "pairs"}, ValueError, "target must be one of"),
        ({"n_heads": 2, "axis": 2}, ValueError, "axis must index"),
        ({"n_heads": 4}, ValueError, "d_k must be even"),
    ],
)
def test_convert_rotary_layout_names_bad_arguments(kwargs, error, words):
    arguments = {"source": "adjacent", "target": "halves", **kwargs}
    with pytest.raises(error, match=words):
        convert_rotary_layout(np.zeros((3, 4)), **arguments)


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"n_kv_heads": 3}, ValueError, "n_kv_heads must divide n_heads=4"),
        ({"n_kv_heads": 0}, ValueError, "n_kv_heads"),
        ({"n_kv_heads": -2}, ValueError, "n_kv_heads"),
        ({"n_kv_heads": 2.0}, TypeError, "n_kv_heads"),
        ({"n_kv_heads": True}, TypeError, "n_kv_heads"),
        ({"n_kv_heads": 8}, ValueError, "n_kv_heads must divide n_heads=4"),
        ({"rotary_base": 0.0}, ValueError, "rotary_base"),
        ({"rotary_base": "big"}, TypeError, "rotary_base"),
        ({"rotary_layout": "interleaved"}, ValueError, "rotary_layout must be one of"),
    ],
)
def test_config_errors_name_the_field(options, error, words):
    with pytest.raises(error, match=words):
        DecoderOnlyConfig(11, d_model=8, n_heads=4, **options)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"n_kv_heads": 3}, ValueError, "n_kv_heads must divide n_heads=4"),
        ({"n_kv_heads": 0}, ValueError, "n_kv_heads"),
        ({"n_kv_heads": "2"}, TypeError, "n_kv_heads"),
        ({"rotary_layout": "interleaved"}, ValueError, "rotary_layout must be one of"),
    ],
)
def test_layer_errors_name_the_argument(rng, options, error, words):
    with pytest.raises(error, match=words):
        MultiHeadAttention(8, 4, rng=rng, **options)


def test_every_family_takes_grouped_heads(rng):
    ed = EncoderDecoder(
        EncoderDecoderConfig(9, 9, d_model=8, n_heads=4, n_kv_heads=1, d_ff=8), rng=rng
    )
    for name, p in ed.named_parameters():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            assert p.shape == (8, 2), name  # one head of d_k = 2, in every attention
    assert EncoderOnlyConfig(9, n_heads=4, n_kv_heads=2).kv_heads == 2
    assert DecoderOnlyConfig(9, n_heads=4).kv_heads == 4


def test_old_configuration_dicts_load_with_the_defaults():
    saved = DecoderOnlyConfig(11, d_model=8, n_heads=2).to_dict()
    for name in ("n_kv_heads", "rotary_base", "rotary_layout"):
        del saved[name]  # a dict written before these fields existed
    config = DecoderOnlyConfig.from_dict(saved)
    assert (config.n_kv_heads, config.rotary_base, config.rotary_layout) == (None, 1e4, "adjacent")


def test_checkpoint_round_trip_keeps_grouped_heads_and_rotary_options(tmp_path):
    config = DecoderOnlyConfig(
        11, d_model=16, n_heads=4, n_kv_heads=2, d_ff=12, context_length=8,
        positional="rotary", rotary_base=321.0, rotary_layout="halves", norm="rmsnorm",
        feed_forward="gated", activation="silu", bias=False, tie_output=False,
    )  # fmt: skip
    model = DecoderOnlyLM(config, rng=np.random.default_rng(4)).eval()
    path = save_checkpoint(tmp_path / "gqa.npz", model)
    stored = read_checkpoint(path).config
    assert (stored["n_kv_heads"], stored["rotary_base"], stored["rotary_layout"]) == (
        2,
        321.0,
        "halves",
    )
    loaded = load_model(path)
    assert loaded.config == config
    assert loaded.decoder.layers[0].self_attention.layer.k_proj.weight.shape == (16, 8)
    ids = np.random.default_rng(5).integers(0, 11, (2, 8))
    np.testing.assert_array_equal(loaded.forward(ids), model.forward(ids))
    other = DecoderOnlyLM(
        dataclasses.replace(config, rotary_base=10000.0), rng=np.random.default_rng(4)
    )
    with pytest.raises(ValueError, match="rotary_base"):
        read_checkpoint(path).restore(other)
