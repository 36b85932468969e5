"""The transformer block and its residual sub-layers: parts, formulas, gradients, caches, bad input."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.blocks import BlockCache, Residual, TransformerBlock, trace_block
from tinyformer.feedforward import FeedForward
from tinyformer.gradcheck import check_module_gradients
from tinyformer.layers import Dropout, Linear
from tinyformer.masks import causal_mask, padding_mask
from tinyformer.multihead import KVCache, MultiHeadAttention
from tinyformer.norm import NORMS, LayerNorm, RMSNorm

seeds = st.integers(0, 2**32 - 1)
dtypes = st.sampled_from([np.float32, np.float64])


def _randomize(module, rng, scale=0.3):
    """Move every parameter off its initial value (zero biases, unit gains hide mistakes)."""
    for p in module.parameters():
        p.value[...] = p.value + scale * rng.standard_normal(p.shape)
    return module


def _block(rng, d_model=8, n_heads=2, d_ff=12, **options):
    return _randomize(TransformerBlock(d_model, n_heads, d_ff, rng=rng, **options), rng)


# ------------------------------------------------------------------- parts
# Each option is a choice between two parts; the full product (64 blocks) runs with the
# slow tests. By default six of them run: a covering set in which every pair of choices
# of any two options appears together in some block.
PART_CHOICES = {
    "norm": ("layernorm", "rmsnorm"),
    "feed_forward": ("plain", "gated"),
    "bias": (True, False),
    "norm_first": (False, True),
    "rotary": (False, True),
    "cross_attention": (False, True),
}
COVERING = {  # indices into each option's choices
    (0, 0, 0, 0, 0, 0),
    (1, 1, 0, 0, 1, 0),
    (1, 0, 1, 0, 1, 1),
    (1, 0, 0, 1, 0, 1),
    (0, 1, 1, 1, 1, 0),
    (0, 1, 1, 1, 0, 1),
}


def _parts(index):
    return {name: c[i] for (name, c), i in zip(PART_CHOICES.items(), index, strict=True)}


PARTS = [
    pytest.param(
        _parts(index),
        marks=() if index in COVERING else pytest.mark.slow,
        id="-".join(f"{name}={value}" for name, value in _parts(index).items()),
    )
    for index in itertools.product((0, 1), repeat=len(PART_CHOICES))
]


@pytest.mark.parametrize("options", PARTS)
def test_every_combination_of_parts_has_exact_gradients(options):
    rng = np.random.default_rng(7)
    activation = "silu" if options["feed_forward"] == "gated" else "gelu"  # no kink at zero
    block = _block(rng, 4, 2, 3, activation=activation, **options)
    inputs, kwargs = [rng.standard_normal((2, 3, 4))], {"mask": causal_mask(3)}
    if options["cross_attention"]:
        inputs.append(rng.standard_normal((2, 2, 4)))
        kwargs["memory_mask"] = padding_mask(np.array([[3, 4], [5, 0]]), 0)
    errors = check_module_gradients(block, inputs, rng=rng, kwargs=kwargs)
    names = {n for n, _ in block.named_parameters()}
    assert set(errors) == names | {f"input {i}" for i in range(len(inputs))}
    assert max(errors.values()) < 1e-6, errors


def test_the_block_is_built_from_the_named_parts(rng):
    for norm, feed_forward in itertools.product(NORMS, ("plain", "gated")):
        block = TransformerBlock(
            8, 2, 12, rng=rng, cross_attention=True, norm=norm, feed_forward=feed_forward
        )
        residuals = (block.self_attention, block.cross_attention, block.feed_forward)
        assert all(isinstance(r, Residual) for r in residuals)
        assert all(type(r.norm) is NORMS[norm] for r in residuals)
        assert isinstance(block.self_attention.layer, MultiHeadAttention)
        assert isinstance(block.cross_attention.layer, MultiHeadAttention)
        assert isinstance(block.feed_forward.layer, FeedForward)
        assert block.feed_forward.layer.gated == (feed_forward == "gated")
    assert TransformerBlock(8, 2, 12, rng=rng).cross_attention is None


def test_options_reach_every_part(rng):
    block = TransformerBlock(
        8,
        2,
        12,
        rng=rng,
        cross_attention=True,
        dropout=0.25,
        norm_eps=1e-3,
        activation="gelu_tanh",
        bias=False,
        rotary=True,
        scale=0.125,
    )
    attention, cross = block.self_attention.layer, block.cross_attention.layer
    assert attention.rotary  # rotary positions: self-attention only
    assert not cross.rotary
    assert attention.scale == cross.scale == 0.125
    assert block.feed_forward.layer.activation == "gelu_tanh"
    assert all(m.bias is None for m in block.modules() if isinstance(m, Linear))
    assert all(m.p == 0.25 for m in block.modules() if isinstance(m, Dropout))
    assert {m.eps for m in block.modules() if isinstance(m, LayerNorm)} == {1e-3}
    generators = {id(m.rng) for m in block.modules() if isinstance(m, Dropout)}
    assert len(generators) == 1  # every dropout draws from the block's generator


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"norm": "batchnorm"}, "kind must be one of ['layernorm', 'rmsnorm'], got 'batchnorm'"),
        (
            {"feed_forward": "experts"},
            "kind must be one of ['gated', 'moe', 'plain'], got 'experts'",
        ),
        ({"activation": "tanh"}, "activation must be one of"),
    ],
)
def test_unknown_part_names_are_refused(rng, options, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        TransformerBlock(8, 2, 12, rng=rng, **options)


def test_block_parameters_are_named_and_counted(rng):
    decoder = TransformerBlock(8, 2, 16, rng=rng, cross_attention=True)
    names = [n for n, _ in decoder.named_parameters()]
    assert names[:2] == ["self_attention.layer.q_proj.weight", "self_attention.layer.q_proj.bias"]
    assert "cross_attention.layer.k_proj.weight" in names
    assert "cross_attention.norm.gain" in names
    attention = 4 * 8 * 8 + 4 * 8  # W_Q, W_K, W_V, W_O and their biases
    ffn = 8 * 16 + 16 + 16 * 8 + 8
    norms = 3 * 2 * 8
    assert decoder.num_parameters() == 2 * attention + ffn + norms
    modern = TransformerBlock(8, 2, 16, rng=rng, norm="rmsnorm", feed_forward="gated", bias=False)
    assert modern.num_parameters() == 4 * 8 * 8 + (8 * 32 + 16 * 8) + 2 * 8


# ----------------------------------------------------------------- residual
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("norm_class", [LayerNorm, RMSNorm])
def test_residual_is_the_formula_and_has_exact_gradients(rng, norm_first, norm_class):
    layer = Linear(6, 6, rng=rng)
    norm = norm_class(6)
    residual = _randomize(Residual(layer, norm, Dropout(0.0, rng=rng), norm_first=norm_first), rng)
    x = rng.standard_normal((2, 3, 6))
    out = residual.forward(x)
    if norm_first:
        expected = x + layer.forward(norm.forward(x))
    else:
        expected = norm.forward(x + layer.forward(x))
    assert np.array_equal(out, expected)
    errors = check_module_gradients(residual, [x], rng=rng)
    assert max(errors.values()) < 1e-6, errors


def test_residual_passes_further_inputs_and_returns_their_gradients(rng):
    attention = MultiHeadAttention(6, 2, rng=rng)
    residual = _randomize(
        Residual(attention, RMSNorm(6), Dropout(0.0, rng=rng), norm_first=True), rng
    )
    x, memory = rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 4, 6))
    mask = padding_mask(np.array([[1, 2, 3, 0], [1, 2, 3, 4]]), 0)
    expected = x + attention.forward(residual.norm.forward(x), memory, mask=mask)
    assert np.array_equal(residual.forward(x, memory, mask=mask), expected)
    grads = residual.backward(np.ones_like(x))
    assert len(grads) == 2
    assert grads[0].shape == x.shape
    assert grads[1].shape == memory.shape
    errors = check_module_gradients(residual, [x, memory], rng=rng, kwargs={"mask": mask})
    assert max(errors.values()) < 1e-6, errors


def test_residual_dropout_acts_on_the_sub_layer_output_only(rng):
    layer = Linear(4, 4, rng=rng)
    dropout = Dropout(0.5, rng=np.random.default_rng(3))
    residual = Residual(layer, LayerNorm(4), dropout, norm_first=True)
    x = rng.standard_normal((5, 4))
    out = residual.forward(x)
    keep = Dropout(0.5, rng=np.random.default_rng(3)).mask((5, 4), np.float64)
    assert np.array_equal(out, x + layer.forward(residual.norm.forward(x)) * keep)
    residual.eval()
    assert np.array_equal(residual.forward(x), x + layer.forward(residual.norm.forward(x)))


def test_post_norm_block_is_the_formula_written_out(rng):
    block = _block(rng, 8, 2, 16, cross_attention=True)
    x, memory = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 3, 8))
    attention, cross = block.self_attention, block.cross_attention
    ffn = block.feed_forward
    a = attention.norm.forward(x + attention.layer.forward(x, mask=causal_mask(5)))
    b = cross.norm.forward(a + cross.layer.forward(a, memory))
    expected = ffn.norm.forward(b + ffn.layer.forward(b))
    assert np.array_equal(block.forward(x, memory, mask=causal_mask(5)), expected)


def test_pre_norm_block_keeps_an_identity_path(rng):
    block = _block(rng, 8, 2, 16, norm_first=True, norm="rmsnorm")
    for p in (
        block.self_attention.layer.out_proj.weight,
        block.feed_forward.layer.linear_out.weight,
    ):
        p.value[...] = 0.0  # sub-layers whose output is only a bias
    x = rng.standard_normal((2, 5, 8))
    bias = (
        block.self_attention.layer.out_proj.bias.value
        + block.feed_forward.layer.linear_out.bias.value
    )
    np.testing.assert_allclose(block.forward(x), x + bias, rtol=1e-15, atol=1e-15)
    grad = block.backward(np.ones_like(x))
    np.testing.assert_array_equal(grad, 1.0)  # all of it flows around the sub-layers


# ------------------------------------------------------- causality and batch
@given(seeds, st.integers(0, 4), dtypes, st.booleans())
def test_output_at_t_ignores_later_tokens_bitwise(seed, t, dtype, norm_first):
    rng = np.random.default_rng(seed)
    block = _block(rng, 8, 2, 8, cross_attention=True, norm_first=norm_first, dtype=dtype)
    x = rng.standard_normal((2, 5, 8)).astype(dtype)
    memory = rng.standard_normal((2, 3, 8)).astype(dtype)
    changed = x.copy()
    changed[:, t + 1 :] = (30 * rng.standard_normal(changed[:, t + 1 :].shape)).astype(dtype)
    a = block.forward(x, memory, mask=causal_mask(5))
    b = block.forward(changed, memory, mask=causal_mask(5))
    assert np.array_equal(a[:, : t + 1], b[:, : t + 1])


@given(seeds, dtypes, st.booleans(), st.booleans())
def test_each_sequence_is_bitwise_independent_of_the_rest_of_the_batch(seed, dtype, cross, rotary):
    rng = np.random.default_rng(seed)
    block = _block(rng, 8, 2, 8, cross_attention=cross, rotary=rotary, dtype=dtype)
    x = (rng.standard_normal((3, 4, 8)) * rng.choice([1, 30], size=(3, 1, 1))).astype(dtype)
    memory = rng.standard_normal((3, 2, 8)).astype(dtype) if cross else None
    out = block.forward(x, memory, mask=causal_mask(4))
    x[1] = (100 * rng.standard_normal((4, 8))).astype(dtype)
    if cross:
        memory[1] *= 50
    again = block.forward(x, memory, mask=causal_mask(4))
    assert np.array_equal(again[[0, 2]], out[[0, 2]])


# --------------------------------------------------------------------- cache
@given(seeds, st.booleans(), st.booleans(), st.booleans())
def test_cached_step_by_step_decoding_matches_full_decoding(seed, cross, norm_first, rotary):
    rng = np.random.default_rng(seed)
    block = _block(
        rng, 8, 2, 8, cross_attention=cross, norm_first=norm_first, rotary=rotary
    ).eval()
    x = rng.standard_normal((2, 6, 8))
    memory = rng.standard_normal((2, 4, 8)) if cross else None
    memory_mask = padding_mask(np.array([[1, 2, 3, 4], [5, 6, 0, 0]]), 0) if cross else None
    full = block.forward(x, memory, mask=causal_mask(6), memory_mask=memory_mask)
    cache = block.new_cache()
    steps = [
        block.forward(x[:, i : i + 1], memory, memory_mask=memory_mask, cache=cache)
        for i in range(6)
    ]
    assert len(cache) == 6
    assert len(cache.cross_attention) == (4 if cross else 0)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)
    cache.reset()
    assert len(cache) == 0
    assert len(cache.cross_attention) == 0


def test_block_cache_truncate_select_and_copy(rng):
    block = _block(rng, 8, 2, 8, cross_attention=True).eval()
    memory = rng.standard_normal((2, 3, 8))
    cache = block.new_cache()
    assert isinstance(cache, BlockCache)
    block.forward(rng.standard_normal((2, 4, 8)), memory, mask=causal_mask(4), cache=cache)
    copy = cache.copy()
    chosen = cache.select(np.array([1, 1]))
    cache.truncate(2)
    assert (len(cache), len(cache.cross_attention)) == (2, 3)  # the memory's keys stay
    assert len(copy) == 4
    np.testing.assert_array_equal(chosen.self_attention.keys[0], copy.self_attention.keys[1])
    np.testing.assert_array_equal(chosen.cross_attention.values[1], copy.cross_attention.values[1])


def test_backward_after_cached_decoding_is_refused(rng):
    block = TransformerBlock(8, 2, 8, rng=rng)
    out = block.forward(rng.standard_normal((1, 1, 8)), cache=BlockCache())
    with pytest.raises(RuntimeError, match="cache is for inference"):
        block.backward(np.ones_like(out))


@pytest.mark.parametrize("norm_first", [False, True])
def test_float32_agrees_with_float64_forward_and_backward(rng, norm_first):
    wide = _block(rng, 8, 2, 16, cross_attention=True, norm_first=norm_first, activation="gelu")
    narrow = TransformerBlock(
        8,
        2,
        16,
        rng=rng,
        cross_attention=True,
        norm_first=norm_first,
        activation="gelu",
        dtype=np.float32,
    )
    narrow.load_state_dict(wide.state_dict())
    x, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8))
    g = rng.standard_normal((2, 3, 8))
    y = narrow.forward(x.astype(np.float32), memory.astype(np.float32), mask=causal_mask(3))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, wide.forward(x, memory, mask=causal_mask(3)), atol=2e-5)
    grads = narrow.backward(g.astype(np.float32))
    for got, want in zip(grads, wide.backward(g), strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert all(p.grad.dtype == np.float32 for p in narrow.parameters())


# --------------------------------------------------------------------- trace
@pytest.mark.parametrize("norm_first", [False, True])
def test_trace_block_ends_with_the_block_output_and_shows_each_step(rng, norm_first):
    block = _block(rng, 8, 2, 12, norm_first=norm_first)
    x = rng.standard_normal((2, 5, 8))
    mask = padding_mask(np.array([[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]), 0)
    steps = trace_block(block, x, mask)
    names = [name for name, _ in steps]
    assert names[0] == "input x"
    assert steps[0][1] is x
    assert np.array_equal(steps[-1][1], block.forward(x, mask=mask))
    values = dict(steps)
    assert values["attention weights"].shape == (2, 2, 5, 5)
    np.testing.assert_array_equal(values["attention weights"][0, :, :, 3:], 0.0)
    assert values["FFN first linear"].shape == (2, 5, 12)
    assert names.index("norm 1") < names.index("norm 2")
    if norm_first:
        assert names.index("norm 1") == 1  # before attention
    else:
        assert names.index("norm 1") == names.index("residual x + attention") + 1


def test_trace_block_refuses_what_it_cannot_follow(rng):
    with pytest.raises(TypeError, match="block must be a TransformerBlock"):
        trace_block(Linear(4, 4, rng=rng), np.ones((1, 2, 4)))
    with pytest.raises(ValueError, match="block has cross-attention"):
        trace_block(TransformerBlock(4, 2, 4, rng=rng, cross_attention=True), np.ones((1, 2, 4)))
    with pytest.raises(ValueError, match=r"call block.eval\(\) first"):
        trace_block(TransformerBlock(4, 2, 4, rng=rng, dropout=0.1), np.ones((1, 2, 4)))


# ----------------------------------------------------------------- reference
def _attention_pairs(theirs, ours):
    """``(our parameter, PyTorch tensor, transposed?)``; PyTorch stacks Q, K, V in one matrix."""
    d = ours.d_model
    pairs = []
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        rows = slice(i * d, (i + 1) * d)
        projection = getattr(ours, name)
        pairs += [
            (projection.weight, theirs.in_proj_weight, True, rows),
            (projection.bias, theirs.in_proj_bias, False, rows),
        ]
    pairs += [
        (ours.out_proj.weight, theirs.out_proj.weight, True, slice(None)),
        (ours.out_proj.bias, theirs.out_proj.bias, False, slice(None)),
    ]
    return pairs


def _block_pairs(theirs, ours):
    ffn = ours.feed_forward.layer
    pairs = _attention_pairs(theirs.self_attn, ours.self_attention.layer)
    norms = [ours.self_attention.norm]
    if ours.cross_attention is not None:
        pairs += _attention_pairs(theirs.multihead_attn, ours.cross_attention.layer)
        norms.append(ours.cross_attention.norm)
    norms.append(ours.feed_forward.norm)
    every = slice(None)
    pairs += [
        (ffn.linear_in.weight, theirs.linear1.weight, True, every),
        (ffn.linear_in.bias, theirs.linear1.bias, False, every),
        (ffn.linear_out.weight, theirs.linear2.weight, True, every),
        (ffn.linear_out.bias, theirs.linear2.bias, False, every),
    ]
    for i, norm in enumerate(norms, start=1):
        torch_norm = getattr(theirs, f"norm{i}")
        pairs += [
            (norm.gain, torch_norm.weight, False, every),
            (norm.bias, torch_norm.bias, False, every),
        ]
    assert len(pairs) == len(ours.parameters())
    return pairs


def _copy_into(torch, theirs, ours):
    with torch.no_grad():
        for mine, target, transposed, rows in _block_pairs(theirs, ours):
            target[rows] = torch.tensor(mine.value.T if transposed else mine.value)


def _close(ours, theirs):
    theirs = theirs.detach().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def _check_parameter_gradients(ours, theirs):
    for mine, target, transposed, rows in _block_pairs(theirs, ours):
        grad = target.grad[rows]
        _close(mine.grad, grad.T if transposed else grad)


@pytest.mark.reference
@pytest.mark.parametrize("norm_first", [False, True])
def test_block_with_padding_mask_agrees_with_torch_encoder_layer(rng, norm_first, torch):
    ours = _block(rng, 8, 2, 16, norm_first=norm_first)
    theirs = torch.nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    )
    _copy_into(torch, theirs, ours)
    x, g = rng.standard_normal((3, 5, 8)), rng.standard_normal((3, 5, 8))
    ids = np.array([[1, 2, 3, 4, 5], [1, 2, 3, 0, 0], [1, 2, 3, 4, 0]])
    xt = torch.tensor(x, requires_grad=True)
    out_t = theirs(xt, src_key_padding_mask=torch.tensor(ids == 0))
    out_t.backward(torch.tensor(g))
    _close(ours.forward(x, mask=padding_mask(ids, 0)), out_t)
    _close(ours.backward(g), xt.grad)
    _check_parameter_gradients(ours, theirs)


@pytest.mark.reference
@pytest.mark.parametrize("norm_first", [False, True])
def test_block_with_cross_attention_agrees_with_torch_decoder_layer(rng, norm_first, torch):
    ours = _block(rng, 8, 2, 16, cross_attention=True, norm_first=norm_first)
    theirs = torch.nn.TransformerDecoderLayer(
        8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    )
    _copy_into(torch, theirs, ours)
    x, memory = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 6, 8))
    g = rng.standard_normal((2, 4, 8))
    src = np.array([[1, 2, 3, 4, 5, 6], [1, 2, 3, 0, 0, 0]])
    xt, mt = torch.tensor(x, requires_grad=True), torch.tensor(memory, requires_grad=True)
    out_t = theirs(
        xt,
        mt,
        tgt_mask=torch.tensor(~causal_mask(4)),
        memory_key_padding_mask=torch.tensor(src == 0),
    )
    out_t.backward(torch.tensor(g))
    out = ours.forward(x, memory, mask=causal_mask(4), memory_mask=padding_mask(src, 0))
    _close(out, out_t)
    grad_x, grad_memory = ours.backward(g)
    _close(grad_x, xt.grad)
    _close(grad_memory, mt.grad)
    _check_parameter_gradients(ours, theirs)


# ----------------------------------------------------------------- bad input
def _x(*shape, dtype=np.float64):
    return np.ones(shape, dtype=dtype)


def _new(**options):
    return TransformerBlock(8, 2, 8, rng=np.random.default_rng(0), **options)


# fmt: off
BAD = [
    ("d_model vs heads", lambda: TransformerBlock(8, 3, 16, rng=np.random.default_rng(0)), ValueError, "d_model must be divisible by n_heads"),
    ("d_ff negative", lambda: TransformerBlock(8, 2, -1, rng=np.random.default_rng(0)), ValueError, "d_ff must be a positive integer"),
    ("rng a seed", lambda: TransformerBlock(8, 2, 8, rng=1), TypeError, "rng must be a numpy.random.Generator"),
    ("integer dtype", lambda: _new(dtype=np.int32), TypeError, "dtype must be float32 or float64"),
    ("dropout 1", lambda: _new(dropout=1.0), ValueError, "p must be"),
    ("memory missing", lambda: _new(cross_attention=True).forward(_x(1, 2, 8)), ValueError, "memory (the encoder output, (B, T_src, d_model)) is required"),
    ("memory refused", lambda: _new().forward(_x(1, 2, 8), _x(1, 2, 8)), ValueError, "memory must be None: this block has no cross-attention"),
    ("memory last dim", lambda: _new(cross_attention=True).forward(_x(1, 2, 8), _x(1, 2, 4)), ValueError, "memory must have last dimension 8"),
    ("memory dtype", lambda: _new(cross_attention=True).forward(_x(1, 2, 8), _x(1, 2, 8, dtype=np.float32)), TypeError, "memory must have the layer's dtype float64"),
    ("x last dim", lambda: _new().forward(_x(1, 2, 4)), ValueError, "x must have last dimension 8"),
    ("cache type", lambda: _new().forward(_x(1, 2, 8), cache=KVCache()), TypeError, "cache must be a BlockCache or None"),
    ("mask shape", lambda: _new().forward(_x(1, 2, 8), mask=np.ones((3, 3), bool)), ValueError, "mask"),
    ("backward first", lambda: _new().backward(_x(1, 2, 8)), RuntimeError, "TransformerBlock.backward was called before forward"),
]
# fmt: on


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_raises_an_error_that_says_what_is_wrong(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value), str(info.value)


def test_wrong_gradient_is_refused_and_a_right_one_still_accepted(rng):
    block = _new()
    out = block.forward(rng.standard_normal((1, 3, 8)))
    with pytest.raises(
        ValueError, match=r"grad_out must have the forward output's shape \(1, 3, 8\)"
    ):
        block.backward(np.ones((1, 2, 8)))
    block.forward(rng.standard_normal((1, 3, 8)))
    assert block.backward(np.ones_like(out)).shape == (1, 3, 8)
