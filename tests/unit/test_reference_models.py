"""Whole models against PyTorch: our weights copied into torch.nn transformer layers.

Logits and every parameter gradient must agree to 1e-10 in float64, with
padding in the source and in the decoder input.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
)
from tinyformer.positional import sinusoidal_encoding

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.reference
SIZES = {"d_model": 8, "n_heads": 2, "d_ff": 12, "dtype": "float64"}


def _tensor(value: np.ndarray, transpose: bool):
    return torch.tensor(np.ascontiguousarray(value.T if transpose else value), requires_grad=True)


class Pairs:
    """Our parameters and the torch tensors made from them, for comparing gradients."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, object, object, bool]] = []
        self.made: dict[int, object] = {}

    def __call__(self, name: str, param, transpose: bool = False):
        """A leaf tensor holding ``param`` (one per parameter, so shared ones stay shared)."""
        if id(param) not in self.made:
            self.made[id(param)] = _tensor(param.value, transpose)
            self.pairs.append((name, param, self.made[id(param)], transpose))
        return self.made[id(param)]


def _attention(pairs: Pairs, name: str, residual):
    layer = residual.layer
    w_qkv = pairs(f"{name}.w_qkv", layer.w_qkv, True)  # (3d, d): rows q, k, v
    b_qkv = pairs(f"{name}.b_qkv", layer.b_qkv)
    w_out = pairs(f"{name}.w_out", layer.w_out, True)
    b_out = pairs(f"{name}.b_out", layer.b_out)
    n_heads = layer.n_heads

    def run(x, context, mask):
        """``mask`` True where attention is allowed (ours), broadcast to (B, T_q, T_k)."""
        allowed = None
        if mask is not None:
            allowed = torch.from_numpy(
                np.broadcast_to(mask, (x.shape[0], x.shape[1], context.shape[1])).copy()
            )
            allowed = allowed.repeat_interleave(n_heads, dim=0)  # (B h, T_q, T_k)
        out, _ = torch.nn.functional.multi_head_attention_forward(
            x.transpose(0, 1),
            context.transpose(0, 1),
            context.transpose(0, 1),
            x.shape[-1],
            n_heads,
            w_qkv,
            b_qkv,
            None,
            None,
            False,
            0.0,
            w_out,
            b_out,
            training=False,
            need_weights=False,
            attn_mask=None if allowed is None else ~allowed,
        )
        return out.transpose(0, 1)

    return run


def _norm(pairs: Pairs, name: str, norm):
    gain, bias = pairs(f"{name}.gain", norm.gain), pairs(f"{name}.bias", norm.bias)
    return lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],), gain, bias, 1e-5)


def _feed_forward(pairs: Pairs, name: str, residual, activation: str):
    ffn = residual.layer
    w1 = pairs(f"{name}.w1", ffn.linear_in.weight)
    b1 = pairs(f"{name}.b1", ffn.linear_in.bias)
    w2 = pairs(f"{name}.w2", ffn.linear_out.weight)
    b2 = pairs(f"{name}.b2", ffn.linear_out.bias)
    act = torch.relu if activation == "relu" else torch.nn.functional.gelu
    return lambda x: act(x @ w1 + b1) @ w2 + b2


def _sublayer(norm_first: bool, norm, layer):
    if norm_first:
        return lambda x, *args: x + layer(norm(x), *args)
    return lambda x, *args: norm(x + layer(x, *args))


def _block(pairs: Pairs, name: str, block, norm_first: bool, activation: str):
    """A torch function of (x, memory, self_mask, memory_mask) for one of our blocks."""
    self_attn = _attention(pairs, f"{name}.self", block.self_attention)
    first = _sublayer(
        norm_first,
        _norm(pairs, f"{name}.norm1", block.self_attention.norm),
        lambda x, mask: self_attn(x, x, mask),
    )
    cross = None
    if getattr(block, "cross_attention", None) is not None:
        cross_attn = _attention(pairs, f"{name}.cross", block.cross_attention)
        cross = _sublayer(
            norm_first, _norm(pairs, f"{name}.norm2", block.cross_attention.norm), cross_attn
        )
    ffn = _sublayer(
        norm_first,
        _norm(pairs, f"{name}.norm3", block.feed_forward.norm),
        _feed_forward(pairs, f"{name}.ffn", block.feed_forward, activation),
    )

    def run(x, memory, self_mask, memory_mask):
        x = first(x, self_mask)
        if cross is not None:
            x = cross(x, memory, memory_mask)
        return ffn(x)

    return run


def _positions(pairs: Pairs, name: str, layer, length: int, d_model: int):
    if layer is None:
        return 0
    if hasattr(layer, "weight"):
        return pairs(name, layer.weight)[:length]
    return torch.from_numpy(sinusoidal_encoding(length, d_model))


def torch_encoder_decoder(model: EncoderDecoder, source, target):
    """Logits of ``model`` recomputed in torch, and the (name, ours, theirs) pairs."""
    c, pairs = model.config, Pairs()
    scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
    source_table = pairs("source_embedding", model.source_embedding.weight)
    target_table = pairs("target_embedding", model.target_embedding.weight)
    source_mask = (source != c.pad_id)[:, None, :]  # (B, 1, S)
    t = target.shape[1]
    decoder_mask = np.tril(np.ones((t, t), bool)) & (target != c.pad_id)[:, None, :]
    x = source_table[torch.from_numpy(source)] * scale
    x = x + _positions(
        pairs, "source_positions", model.source_positions, source.shape[1], c.d_model
    )
    for i, block in enumerate(model.encoder_layers):
        x = _block(pairs, f"encoder.{i}", block, c.norm_first, c.activation)(
            x, None, source_mask, None
        )
    if model.encoder_norm is not None:
        x = _norm(pairs, "encoder_norm", model.encoder_norm)(x)
    y = target_table[torch.from_numpy(target)] * scale
    y = y + _positions(pairs, "target_positions", model.target_positions, t, c.d_model)
    for i, block in enumerate(model.decoder_layers):
        run = _block(pairs, f"decoder.{i}", block, c.norm_first, c.activation)
        y = run(y, x, decoder_mask, source_mask)
    if model.decoder_norm is not None:
        y = _norm(pairs, "decoder_norm", model.decoder_norm)(y)
    out = target_table if c.tie_output else pairs("output", model.output.weight, True)
    return y @ out.T, pairs.pairs


def torch_decoder_only(model: DecoderOnlyLM, ids):
    c, pairs = model.config, Pairs()
    scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
    table = pairs("embedding", model.embedding.weight)
    t = ids.shape[1]
    causal = np.tril(np.ones((t, t), bool))
    x = table[torch.from_numpy(ids)] * scale
    x = x + _positions(pairs, "positions", model.positions, t, c.d_model)
    for i, block in enumerate(model.layers):
        x = _block(pairs, f"layers.{i}", block, c.norm_first, c.activation)(x, None, causal, None)
    if model.final_norm is not None:
        x = _norm(pairs, "final_norm", model.final_norm)(x)
    out = table if c.tie_output else pairs("output", model.output.weight, True)
    return x @ out.T, pairs.pairs


def _perturb(model, rng) -> None:
    """Non-trivial norms and biases, so that every parameter matters."""
    for p in model.parameters():
        p.value[...] += 0.1 * rng.standard_normal(p.shape)


def _compare(ours_logits, model, theirs_logits, pairs, rng) -> None:
    np.testing.assert_allclose(ours_logits, theirs_logits.detach().numpy(), rtol=0, atol=1e-10)
    upstream = rng.standard_normal(ours_logits.shape)
    model.zero_grad()
    model.backward(upstream)
    theirs_logits.backward(torch.from_numpy(upstream))
    assert len(pairs) == len(model.parameters())
    for name, param, tensor, transpose in pairs:
        grad = tensor.grad.numpy()
        np.testing.assert_allclose(
            param.grad, grad.T if transpose else grad, rtol=0, atol=1e-10, err_msg=name
        )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"norm_first": True, "positional": "learned", "tie_output": False, "activation": "gelu"},
        {"share_embeddings": True, "scale_embeddings": False},
    ],
    ids=["post-norm tied", "pre-norm learned untied", "shared"],
)
def test_encoder_decoder_matches_torch(options, rng):
    config = EncoderDecoderConfig(
        src_vocab_size=11, tgt_vocab_size=11, context_length=8, **SIZES, **options
    )
    model = EncoderDecoder(config, rng=rng)
    _perturb(model, rng)
    source = rng.integers(1, 11, (3, 7))
    source[1, 4:] = 0
    target = rng.integers(1, 11, (3, 6))
    target[2, 3:] = 0
    ours = model.forward(source, target)
    theirs, pairs = torch_encoder_decoder(model, source, target)
    _compare(ours, model, theirs, pairs, rng)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "norm_first": False,
            "positional": "sinusoidal",
            "tie_output": False,
            "activation": "relu",
        },
    ],
    ids=["pre-norm learned tied", "post-norm sinusoidal untied"],
)
def test_decoder_only_matches_torch(options, rng):
    config = DecoderOnlyConfig(vocab_size=11, context_length=8, **SIZES, **options)
    model = DecoderOnlyLM(config, rng=rng)
    _perturb(model, rng)
    ids = rng.integers(0, 11, (3, 8))
    ours = model.forward(ids)
    theirs, pairs = torch_decoder_only(model, ids)
    _compare(ours, model, theirs, pairs, rng)
