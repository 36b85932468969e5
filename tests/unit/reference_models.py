"""The three model families recomputed in PyTorch from our weights, for the reference tests.

Each function takes the ``torch`` module (the session fixture of ``conftest.py``, so
that nothing here imports PyTorch and the reference tests skip cleanly without it),
one of our models and its inputs; it returns the logits computed by PyTorch's own
layers (``multi_head_attention_forward``, ``layer_norm``, ``rms_norm``, activations)
and the pairs (name, our parameter, torch leaf tensor) whose gradients must agree.

Our weights are ``(d_in, d_out)`` (``y = x @ W + b``); PyTorch's attention takes
``(d_out, d_in)``, so the query, key, value and output projections (``q_proj``,
``k_proj``, ``v_proj``, ``out_proj``) go in transposed. Rotary positions are left
out (they have their own reference test in ``test_positional.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyformer.positional import sinusoidal_encoding


class Leaves:
    """Torch leaf tensors made from our parameters, one per parameter (shared ones stay shared)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.pairs: list[tuple[str, Any, Any]] = []
        self._made: dict[int, Any] = {}

    def __call__(self, name: str, param: Any) -> Any:
        if id(param) not in self._made:
            tensor = self.torch.tensor(param.value.copy(), requires_grad=True)
            self._made[id(param)] = tensor
            self.pairs.append((name, param, tensor))
        return self._made[id(param)]


def _linear(leaves: Leaves, name: str, linear: Any):
    weight = leaves(f"{name}.weight", linear.weight)
    bias = None if linear.bias is None else leaves(f"{name}.bias", linear.bias)
    return lambda x: x @ weight if bias is None else x @ weight + bias


def _norm(leaves: Leaves, name: str, norm: Any, kind: str, eps: float):
    f = leaves.torch.nn.functional
    gain = leaves(f"{name}.gain", norm.gain)
    if kind == "rmsnorm":
        return lambda x: f.rms_norm(x, (x.shape[-1],), gain, eps)
    bias = leaves(f"{name}.bias", norm.bias)
    return lambda x: f.layer_norm(x, (x.shape[-1],), gain, bias, eps)


def _attention(leaves: Leaves, name: str, mha: Any, unscaled: bool):
    """PyTorch's multi-head attention with our projections; True in ``mask`` = may attend."""
    torch = leaves.torch
    weights = {
        p: leaves(f"{name}.{p}.weight", getattr(mha, p).weight)
        for p in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    biases = (
        None
        if mha.q_proj.bias is None
        else {
            p: leaves(f"{name}.{p}.bias", getattr(mha, p).bias)
            for p in ("q_proj", "k_proj", "v_proj", "out_proj")
        }
    )
    # PyTorch always divides the scores by sqrt(d_k): an unscaled model's queries are
    # multiplied by sqrt(d_k) first, which gives q k^T exactly (to rounding).
    factor = math.sqrt(mha.d_k) if unscaled else 1.0

    def run(x, context, mask):
        allowed = None
        if mask is not None:
            shape = (x.shape[0], x.shape[1], context.shape[1])
            allowed = torch.from_numpy(np.broadcast_to(mask, shape).copy())
            allowed = allowed.repeat_interleave(mha.n_heads, dim=0)  # (B h, T_q, T_k)
        in_bias = (
            None
            if biases is None
            else torch.cat([biases["q_proj"] * factor, biases["k_proj"], biases["v_proj"]])
        )
        out, _ = torch.nn.functional.multi_head_attention_forward(
            x.transpose(0, 1),
            context.transpose(0, 1),
            context.transpose(0, 1),
            mha.d_model,
            mha.n_heads,
            None,
            in_bias,
            None,
            None,
            False,
            0.0,
            weights["out_proj"].T,
            None if biases is None else biases["out_proj"],
            training=False,
            need_weights=False,
            attn_mask=None if allowed is None else ~allowed,  # PyTorch: True = hidden
            use_separate_proj_weight=True,
            q_proj_weight=weights["q_proj"].T * factor,
            k_proj_weight=weights["k_proj"].T,
            v_proj_weight=weights["v_proj"].T,
        )
        return out.transpose(0, 1)

    return run


def _activation(torch: Any, name: str):
    f = torch.nn.functional
    return {
        "relu": torch.relu,
        "gelu": f.gelu,
        "gelu_tanh": lambda x: f.gelu(x, approximate="tanh"),
        "silu": f.silu,
    }[name]


def _feed_forward(leaves: Leaves, name: str, ffn: Any):
    first = _linear(leaves, f"{name}.linear_in", ffn.linear_in)
    second = _linear(leaves, f"{name}.linear_out", ffn.linear_out)
    act = _activation(leaves.torch, ffn.activation)
    if not ffn.gated:
        return lambda x: second(act(first(x)))

    def gated(x):
        pre = first(x)  # (..., 2 d_ff): the activated branch, then the gate's linear branch
        return second(act(pre[..., : ffn.d_ff]) * pre[..., ffn.d_ff :])

    return gated


def _sublayer(norm_first: bool, norm, layer):
    if norm_first:
        return lambda x, *args: x + layer(norm(x), *args)
    return lambda x, *args: norm(x + layer(x, *args))


def _block(leaves: Leaves, name: str, block: Any, config: Any):
    """A torch function of ``(x, memory, self_mask, memory_mask)`` for one of our blocks."""
    unscaled = config.attention_scale == "none"

    def norm(part: str, residual: Any):
        return _norm(leaves, f"{name}.{part}.norm", residual.norm, config.norm, config.norm_eps)

    self_attn = _attention(
        leaves, f"{name}.self_attention.layer", block.self_attention.layer, unscaled
    )
    first = _sublayer(
        config.norm_first,
        norm("self_attention", block.self_attention),
        lambda x, mask: self_attn(x, x, mask),
    )
    cross = None
    if block.cross_attention is not None:
        cross_attn = _attention(
            leaves, f"{name}.cross_attention.layer", block.cross_attention.layer, unscaled
        )
        cross = _sublayer(
            config.norm_first, norm("cross_attention", block.cross_attention), cross_attn
        )
    ffn = _sublayer(
        config.norm_first,
        norm("feed_forward", block.feed_forward),
        _feed_forward(leaves, f"{name}.feed_forward.layer", block.feed_forward.layer),
    )

    def run(x, memory, self_mask, memory_mask):
        x = first(x, self_mask)
        if cross is not None:
            x = cross(x, memory, memory_mask)
        return ffn(x)

    return run


def _stack(
    leaves: Leaves, name: str, stack: Any, config: Any, ids, mask, memory=None, memory_mask=None
):
    """Embedding (scaled), positions, blocks and final norm of one of our stacks, in torch."""
    torch = leaves.torch
    if config.positional == "rotary":
        raise NotImplementedError("rotary positions have their own reference test")
    table = leaves(f"{name}.embedding.weight", stack.embedding.weight)
    scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
    x = table[torch.from_numpy(ids)] * scale
    t = ids.shape[1]
    if config.positional == "learned":
        x = x + leaves(f"{name}.positions.weight", stack.positions.weight)[:t]
    elif config.positional == "sinusoidal":
        x = x + torch.from_numpy(sinusoidal_encoding(t, config.d_model))
    for i, block in enumerate(stack.layers):
        x = _block(leaves, f"{name}.layers.{i}", block, config)(x, memory, mask, memory_mask)
    if stack.final_norm is not None:
        x = _norm(leaves, f"{name}.final_norm", stack.final_norm, config.norm, config.norm_eps)(x)
    return x, table


def _output(leaves: Leaves, model: Any, table, h):
    if model.config.tie_output:
        return h @ table.T
    return h @ leaves("output.weight", model.output.weight)


def decoder_only_logits(torch: Any, model: Any, ids: np.ndarray):
    """``model.forward(ids)`` of a :class:`~tinyformer.models.DecoderOnlyLM`, in torch."""
    leaves = Leaves(torch)
    t = ids.shape[1]
    h, table = _stack(
        leaves, "decoder", model.decoder, model.config, ids, np.tril(np.ones((t, t), bool))
    )
    return _output(leaves, model, table, h), leaves.pairs


def encoder_only_logits(torch: Any, model: Any, ids: np.ndarray):
    """``model.forward(ids)`` of an :class:`~tinyformer.models.EncoderOnlyMLM`, in torch."""
    leaves = Leaves(torch)
    pad_id = model.config.pad_id
    mask = None if pad_id is None else (ids != pad_id)[:, None, :]  # (B, 1, T)
    h, table = _stack(leaves, "encoder", model.encoder, model.config, ids, mask)
    return _output(leaves, model, table, h), leaves.pairs


def encoder_decoder_logits(torch: Any, model: Any, source: np.ndarray, target: np.ndarray):
    """``model.forward(source, target)`` of an :class:`~tinyformer.models.EncoderDecoder`."""
    leaves = Leaves(torch)
    c = model.config
    source_mask = (source != c.pad_id)[:, None, :]  # (B, 1, S)
    t = target.shape[1]
    decoder_mask = np.tril(np.ones((t, t), bool)) & (target != c.pad_id)[:, None, :]
    memory, _ = _stack(leaves, "encoder", model.encoder, c, source, source_mask)
    h, table = _stack(
        leaves, "decoder", model.decoder, c, target, decoder_mask, memory, source_mask
    )
    return _output(leaves, model, table, h), leaves.pairs


def assert_same_logits_and_gradients(
    torch: Any, model: Any, ours: np.ndarray, theirs, pairs, rng: np.random.Generator
) -> None:
    """Logits and every parameter's gradient (of a random linear loss) agree to 1e-10."""
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=0, atol=1e-10)
    upstream = rng.standard_normal(ours.shape)
    model.zero_grad()
    model.backward(upstream)
    theirs.backward(torch.from_numpy(upstream))
    assert len(pairs) == len(model.parameters())  # every parameter was compared
    for name, param, tensor in pairs:
        np.testing.assert_allclose(
            param.grad, tensor.grad.numpy(), rtol=0, atol=1e-10, err_msg=name
        )
