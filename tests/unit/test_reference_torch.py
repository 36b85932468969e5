"""Agreement with PyTorch's CPU build: forward values and gradients in float64, to 1e-10.

Run with ``nox -s reference``; without torch installed every test here is skipped.
Where PyTorch keeps a weight as ``(out, in)`` and tinyformer as ``(in, out)``,
the weight is transposed on the way in and its gradient on the way back.
"""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer import functional as F
from tinyformer.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
)
from tinyformer.blocks import DecoderBlock, EncoderBlock
from tinyformer.efficient import tiled_attention, tiled_attention_backward
from tinyformer.layers import Linear
from tinyformer.losses import cross_entropy
from tinyformer.masks import causal_mask, padding_mask
from tinyformer.multihead import MultiHeadAttention
from tinyformer.norm import LayerNorm, RMSNorm

pytestmark = pytest.mark.reference
torch = pytest.importorskip("torch")
TF = torch.nn.functional

RTOL, ATOL = 1e-10, 1e-12


def close(ours, theirs):
    """Assert agreement to 1e-10 (relative, with a tiny absolute floor near zero)."""
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)


def leaf(array):
    return torch.tensor(array, dtype=torch.float64, requires_grad=True)


def randomize(module, rng):
    for p in module.parameters():
        p.value[...] = p.value + 0.3 * rng.standard_normal(p.shape)
    return module


# ------------------------------------------------------------------ functional
@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_and_log_softmax(rng, kind):
    x = rng.standard_normal((3, 4, 7)) * 4
    g = rng.standard_normal(x.shape)
    ours_fn, ours_back = getattr(F, kind), getattr(F, f"{kind}_backward")
    xt = leaf(x)
    yt = getattr(torch, kind)(xt, dim=-1)
    yt.backward(torch.tensor(g))
    y = ours_fn(x)
    close(y, yt)
    close(ours_back(g, y), xt.grad)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(rng, approximate):
    x = rng.standard_normal(500) * 3
    g = rng.standard_normal(500)
    xt = leaf(x)
    TF.gelu(xt, approximate=approximate).backward(torch.tensor(g))
    close(F.gelu(x, approximate), TF.gelu(xt, approximate=approximate))
    close(g * F.gelu_grad(x, approximate), xt.grad)


@pytest.mark.parametrize("name", ["relu", "silu"])
def test_relu_and_silu(rng, name):
    x = rng.standard_normal(300) * 3
    g = rng.standard_normal(300)
    xt = leaf(x)
    getattr(TF, name)(xt).backward(torch.tensor(g))
    close(getattr(F, name)(x), getattr(TF, name)(xt))
    close(g * getattr(F, f"{name}_grad")(x), xt.grad)


# ---------------------------------------------------------------------- layers
def test_linear(rng):
    layer = randomize(Linear(5, 3, rng=rng), rng)
    x, g = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 3))
    xt, wt, bt = leaf(x), leaf(layer.weight.value.T), leaf(layer.bias.value)
    yt = TF.linear(xt, wt, bt)
    yt.backward(torch.tensor(g))
    close(layer.forward(x), yt)
    close(layer.backward(g), xt.grad)
    close(layer.weight.grad, wt.grad.T)
    close(layer.bias.grad, bt.grad)


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_layer_norm_and_rms_norm(rng, cls):
    layer = randomize(cls(6, eps=1e-5), rng)
    x, g = rng.standard_normal((3, 4, 6)) * 2 + 1, rng.standard_normal((3, 4, 6))
    xt, wt = leaf(x), leaf(layer.gain.value)
    if cls is LayerNorm:
        bt = leaf(layer.bias.value)
        yt = TF.layer_norm(xt, (6,), wt, bt, eps=1e-5)
    else:
        yt = TF.rms_norm(xt, (6,), wt, eps=1e-5)
    yt.backward(torch.tensor(g))
    close(layer.forward(x), yt)
    close(layer.backward(g), xt.grad)
    close(layer.gain.grad, wt.grad)
    if cls is LayerNorm:
        close(layer.bias.grad, bt.grad)


# ------------------------------------------------------------------- attention
def _torch_mha(layer, x, context, mask, need_weights=True):
    """Run ``torch.nn.functional.multi_head_attention_forward`` with ``layer``'s weights."""
    source = x if context is None else context
    xt, st = leaf(x), (None if context is None else leaf(context))
    in_w, in_b = leaf(layer.w_qkv.value.T), leaf(layer.b_qkv.value)
    out_w, out_b = leaf(layer.w_out.value.T), leaf(layer.b_out.value)
    key = xt if st is None else st
    attn_mask = None
    if mask is not None:  # ours: True = may attend, (B, T_q, T_k); torch: True = blocked
        full = np.broadcast_to(mask, (x.shape[0], x.shape[1], source.shape[1]))
        attn_mask = torch.tensor(np.repeat(~full, layer.n_heads, axis=0))  # (B h, T_q, T_k)
    out, weights = TF.multi_head_attention_forward(
        xt.transpose(0, 1),
        key.transpose(0, 1),
        key.transpose(0, 1),
        layer.d_model,
        layer.n_heads,
        in_w,
        in_b,
        None,
        None,
        False,
        0.0,
        out_w,
        out_b,
        training=True,
        need_weights=need_weights,
        attn_mask=attn_mask,
        average_attn_weights=False,
    )
    return out.transpose(0, 1), weights, (xt, st, in_w, in_b, out_w, out_b)


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_multi_head_attention_self_and_cross(rng, cross, masked):
    layer = randomize(MultiHeadAttention(12, 3, rng=rng), rng)
    x = rng.standard_normal((2, 5, 12))
    context = rng.standard_normal((2, 7, 12)) if cross else None
    mask = None
    if masked and cross:
        mask = padding_mask(np.array([[1, 2, 3, 4, 5, 0, 0], [1, 2, 3, 4, 5, 6, 7]]), 0)
    elif masked:
        mask = causal_mask(5) & (rng.random((2, 5, 5)) < 0.7)
        mask[..., 0] = True  # PyTorch turns a query with no key into NaN; we give zeros
    out_t, weights_t, (xt, st, in_w, in_b, out_w, out_b) = _torch_mha(layer, x, context, mask)
    g = rng.standard_normal(out_t.shape)
    out_t.backward(torch.tensor(g))
    close(layer.forward(x, context, mask=mask), out_t)
    close(layer.attention_weights, weights_t)
    grads = layer.backward(g)
    grad_x, grad_context = grads if cross else (grads, None)
    close(grad_x, xt.grad)
    if cross:
        close(grad_context, st.grad)
    close(layer.w_qkv.grad, in_w.grad.T)
    close(layer.b_qkv.grad, in_b.grad)
    close(layer.w_out.grad, out_w.grad.T)
    close(layer.b_out.grad, out_b.grad)


@pytest.mark.parametrize("tiled", [False, True])
def test_scaled_dot_product_attention_with_mask(rng, tiled):
    q, k, v = (rng.standard_normal((2, 3, n, 4)) for n in (5, 6, 6))
    v = v[..., :3]
    mask = causal_mask(5, 6) & (rng.random((2, 1, 5, 6)) < 0.8)
    mask[..., 0] = True
    g = rng.standard_normal((2, 3, 5, 3))
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    out_t = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=torch.tensor(mask))
    out_t.backward(torch.tensor(g))
    if tiled:
        out, lse = tiled_attention(q, k, v, mask, block_size=4)
        grads = tiled_attention_backward(g, q, k, v, out, lse, mask, block_size=4)
    else:
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        grads = scaled_dot_product_attention_backward(g, q, k, v, weights)
    close(out, out_t)
    for ours, theirs in zip(grads, (qt, kt, vt), strict=True):
        close(ours, theirs.grad)


# ---------------------------------------------------------------------- blocks
def _attention_pairs(target, layer):
    return [
        (layer.w_qkv, target.in_proj_weight, True),
        (layer.b_qkv, target.in_proj_bias, False),
        (layer.w_out, target.out_proj.weight, True),
        (layer.b_out, target.out_proj.bias, False),
    ]


def _block_pairs(theirs, ours):
    """``(our parameter, PyTorch parameter, transposed?)`` for every weight of a block."""
    ffn = ours.feed_forward.layer
    pairs = _attention_pairs(theirs.self_attn, ours.self_attention.layer)
    norms = [ours.self_attention.norm]
    if getattr(ours, "cross_attention", None) is not None:
        pairs += _attention_pairs(theirs.multihead_attn, ours.cross_attention.layer)
        norms.append(ours.cross_attention.norm)
    norms.append(ours.feed_forward.norm)
    pairs += [
        (ffn.linear_in.weight, theirs.linear1.weight, True),
        (ffn.linear_in.bias, theirs.linear1.bias, False),
        (ffn.linear_out.weight, theirs.linear2.weight, True),
        (ffn.linear_out.bias, theirs.linear2.bias, False),
    ]
    for i, norm in enumerate(norms, start=1):
        torch_norm = getattr(theirs, f"norm{i}")
        pairs += [(norm.gain, torch_norm.weight, False), (norm.bias, torch_norm.bias, False)]
    assert len(pairs) == len(list(ours.parameters())) == len(list(theirs.parameters()))
    return pairs


def _copy_block(theirs, ours):
    with torch.no_grad():
        for mine, target, transposed in _block_pairs(theirs, ours):
            target.copy_(torch.tensor(mine.value.T if transposed else mine.value))


def _check_block_gradients(ours, theirs):
    for mine, target, transposed in _block_pairs(theirs, ours):
        close(mine.grad, target.grad.T if transposed else target.grad)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_matches_transformer_encoder_layer(rng, norm_first):
    ours = randomize(EncoderBlock(8, 2, 16, rng=rng, norm_first=norm_first), rng)
    theirs = torch.nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    )
    _copy_block(theirs, ours)
    x, g = rng.standard_normal((3, 5, 8)), rng.standard_normal((3, 5, 8))
    ids = np.array([[1, 2, 3, 4, 5], [1, 2, 3, 0, 0], [1, 2, 3, 4, 0]])
    xt = leaf(x)
    out_t = theirs(xt, src_key_padding_mask=torch.tensor(ids == 0))
    out_t.backward(torch.tensor(g))
    close(ours.forward(x, mask=padding_mask(ids, 0)), out_t)
    close(ours.backward(g), xt.grad)
    _check_block_gradients(ours, theirs)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_matches_transformer_decoder_layer(rng, norm_first):
    ours = randomize(DecoderBlock(8, 2, 16, rng=rng, norm_first=norm_first), rng)
    theirs = torch.nn.TransformerDecoderLayer(
        8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    )
    _copy_block(theirs, ours)
    x, memory = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 6, 8))
    g = rng.standard_normal((2, 4, 8))
    src = np.array([[1, 2, 3, 4, 5, 6], [1, 2, 3, 0, 0, 0]])
    xt, mt = leaf(x), leaf(memory)
    out_t = theirs(
        xt,
        mt,
        tgt_mask=torch.tensor(~causal_mask(4)),
        memory_key_padding_mask=torch.tensor(src == 0),
    )
    out_t.backward(torch.tensor(g))
    out = ours.forward(x, memory, self_mask=causal_mask(4), memory_mask=padding_mask(src, 0))
    close(out, out_t)
    grad_x, grad_memory = ours.backward(g)
    close(grad_x, xt.grad)
    close(grad_memory, mt.grad)
    _check_block_gradients(ours, theirs)


# ------------------------------------------------------------------------ loss
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [None, -100, 0])
def test_cross_entropy_with_label_smoothing_and_ignore_index(rng, smoothing, ignore_index):
    logits = rng.standard_normal((3, 5, 11)) * 3
    targets = rng.integers(0, 11, size=(3, 5))
    if ignore_index is not None:
        targets[0, 3:] = ignore_index
        targets[2, 0] = ignore_index
    zt = leaf(logits.reshape(-1, 11))
    loss_t = TF.cross_entropy(
        zt,
        torch.tensor(targets.reshape(-1)),
        ignore_index=-100 if ignore_index is None else ignore_index,
        label_smoothing=smoothing,
    )
    loss_t.backward()
    loss, grad = cross_entropy(
        logits, targets, ignore_index=ignore_index, label_smoothing=smoothing
    )
    assert loss == pytest.approx(loss_t.item(), rel=RTOL)
    close(grad.reshape(-1, 11), zt.grad)
