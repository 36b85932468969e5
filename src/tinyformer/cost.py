r"""What a model costs: floating-point operations and the activations kept for backward.

Two counts, each made twice so that one checks the other:

- **FLOPs.** :func:`forward_flops` counts, term by term from a configuration, the
  multiplications and additions of one forward pass (a multiply-add is two operations):
  per block :math:`8Td^2` for the four projections, :math:`4T^2d` for the scores and the
  weighted sum of the values, :math:`4Td\,d_\text{ff}` for the feed-forward network, and
  :math:`2TdV` once for the output layer. :func:`count_matmuls` counts, independently, the
  products a model *actually performs*: it tags the model's parameter arrays so that every
  ``@`` or ``numpy.matmul`` touching them, or anything computed from them, is recorded
  with its shapes.
- **Activation memory.** :func:`activation_bytes` predicts from a configuration the bytes a
  forward pass leaves behind for the backward pass; :func:`saved_bytes` measures them by
  walking every module's saved state (what ``forward`` passed to ``_save``) and adding up the
  distinct buffers it holds.

Both counts cover the single-stack models (:class:`~tinyformer.models.decoder_only.DecoderOnlyLM`
and :class:`~tinyformer.models.encoder_only.EncoderOnlyMLM`) with learned or sinusoidal
positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.counting import block_forward_flops, parameter_terms
from tinyformer.models.encoder_only import EncoderOnlyConfig
from tinyformer.module import Module

__all__ = [
    "MatmulCount",
    "activation_bytes",
    "block_activation_elements",
    "count_matmuls",
    "forward_flops",
    "kaplan_flops",
    "non_embedding_parameters",
    "saved_bytes",
    "training_flops",
]

StackConfig = DecoderOnlyConfig | EncoderOnlyConfig


def _stack_config(config: object) -> StackConfig:
    if not isinstance(config, DecoderOnlyConfig | EncoderOnlyConfig):
        raise TypeError(
            f"config must be a DecoderOnlyConfig or an EncoderOnlyConfig, got {describe(config)}"
        )
    return config


# ------------------------------------------------------------------ FLOPs by formula
def forward_flops(config: StackConfig, seq_len: int, batch_size: int = 1) -> dict[str, int]:
    r"""FLOPs of one forward pass of a single-stack model, term by term.

    With :math:`L` blocks, :math:`B` sequences of :math:`T` tokens, width :math:`d`,
    feed-forward width :math:`d_\text{ff}` and vocabulary :math:`V`:

    .. math::
        C_\text{fwd} = \underbrace{0}_\text{embeddings}
        + L B\bigl(\underbrace{8Td^2}_\text{projections}
        + \underbrace{4T^2d}_\text{scores, mixing}
        + \underbrace{4Td\,d_\text{ff}}_\text{feed-forward}\bigr)
        + \underbrace{2BTdV}_\text{output layer}

    An embedding lookup copies rows and multiplies nothing. Biases, softmax,
    normalization and activations are left out (:math:`O(BTd)` or :math:`O(BhT^2)`
    element-wise work, not products).

    A gated feed-forward network has three :math:`d \times d_\text{ff}` products,
    :math:`6Td\,d_\text{ff}`. A mixture of :math:`E` experts routing each token to
    :math:`k` of them costs the router's :math:`2TdE` and :math:`k` experts' products per
    token, :math:`2TdE + k \cdot 4Td\,d_\text{ff}` (:math:`6Td\,d_\text{ff}` per
    gated expert): the cost of :math:`k` dense networks, not :math:`E`. With a capacity
    factor some assignments may be dropped, so this is then an upper bound.
    """
    c = _stack_config(config)
    t, b = positive_int(seq_len, "seq_len"), positive_int(batch_size, "batch_size")
    d_kv = None if c.n_kv_heads is None else c.n_kv_heads * c.d_k  # grouped-query attention
    block = block_forward_flops(c.d_model, c.d_ff, t, d_kv=d_kv)
    block["feed-forward"] = _feed_forward_flops(c, t)
    terms = {"embeddings": 0}
    terms.update({name: c.n_layers * b * value for name, value in block.items()})
    terms["output layer"] = 2 * b * t * c.d_model * c.vocab_size
    return terms


def _feed_forward_flops(c: StackConfig, t: int) -> int:
    """FLOPs of one block's feed-forward sub-layer over ``t`` tokens (see :func:`forward_flops`)."""
    if c.feed_forward == "moe":
        expert = (6 if c.expert_feed_forward == "gated" else 4) * t * c.d_model * c.d_ff
        return 2 * t * c.d_model * c.n_experts + c.experts_per_token * expert
    return (6 if c.feed_forward == "gated" else 4) * t * c.d_model * c.d_ff


def training_flops(config: StackConfig, seq_len: int, batch_size: int = 1) -> int:
    r"""FLOPs of one forward and one backward pass: :math:`3\,C_\text{fwd}`.

    Every product :math:`Y = XW` of the forward pass costs two of the same size in the
    backward pass, :math:`\partial L/\partial X = G W^\top` and
    :math:`\partial L/\partial W = X^\top G`, so the backward pass costs twice the forward.
    """
    return 3 * sum(forward_flops(config, seq_len, batch_size).values())


def non_embedding_parameters(config: StackConfig) -> int:
    r"""Kaplan et al.'s :math:`N`: every parameter except the token and position tables.

    About :math:`L(4d^2 + 2d\,d_\text{ff})`, the weights each token is multiplied by once
    in each block :cite:p:`kaplan2020scaling`.
    """
    terms = parameter_terms(_stack_config(config))
    return terms["blocks"] + terms["final norm"]


def kaplan_flops(n_parameters: int, n_tokens: int) -> int:
    r"""The training-compute estimate :math:`C \approx 6ND` :cite:p:`kaplan2020scaling`.

    Forward :math:`2N` per token (one multiply-add per weight), backward :math:`4N`.
    """
    return 6 * positive_int(n_parameters, "n_parameters") * positive_int(n_tokens, "n_tokens")


# ------------------------------------------------------------ FLOPs by instrumentation
@dataclass
class MatmulCount:
    """The matrix products recorded by :func:`count_matmuls`.

    Attributes
    ----------
    matrix : int
        FLOPs of products of two matrices (or stacks of matrices): :math:`2mnk` each.
    vector : int
        FLOPs of matrix-vector products (row sums and means written as products with a
        vector of ones, which the library uses for speed).
    shapes : list of tuple
        ``(a.shape, b.shape)`` of every matrix-matrix product, in order.
    """

    matrix: int = 0
    vector: int = 0
    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    def _record(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        flops = 2 * out.size * a.shape[-1]  # one multiply-add per output entry and inner index
        if a.ndim == 1 or b.ndim == 1:
            self.vector += flops
        else:
            self.matrix += flops
            self.shapes.append((a.shape, b.shape))


_ACTIVE: list[MatmulCount] = []


class _Tagged(np.ndarray):
    """An array whose ufuncs (``@`` is ``numpy.matmul``, a ufunc) are recorded.

    Results of ufuncs on tagged arrays are tagged again, so the tag spreads from the
    parameters to everything computed from them.
    """

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        plain = [x.view(np.ndarray) if isinstance(x, _Tagged) else x for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, _Tagged) else o for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if ufunc is np.matmul and method == "__call__" and _ACTIVE:
            _ACTIVE[-1]._record(np.asarray(plain[0]), np.asarray(plain[1]), np.asarray(result))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return result.view(_Tagged) if type(result) is np.ndarray else result


def _tag(value: Any) -> Any:
    if type(value) is np.ndarray and value.dtype.kind == "f":
        return value.view(_Tagged)
    if isinstance(value, tuple):
        return tuple(_tag(v) for v in value)
    return value


def _tagging(method: Any) -> Any:
    """``method`` with its float array results tagged."""

    def tagged(*args: Any, **kwargs: Any) -> Any:
        return _tag(method(*args, **kwargs))

    return tagged


@contextmanager
def count_matmuls(model: Module) -> Iterator[MatmulCount]:
    """Record every matrix product computed from ``model``'s parameters inside the block.

    Examples
    --------
    >>> with count_matmuls(model) as count:  # doctest: +SKIP
    ...     logits = model.forward(ids)
    >>> count.matrix  # doctest: +SKIP

    The parameters' arrays are replaced by tagged views of the same memory for the
    duration (and every module's outputs are tagged too, since a layer may convert its
    input with ``numpy.asarray``, which drops the tag); all is restored afterwards,
    and updates made inside the block are kept.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    originals = [(p, p.value) for p in model.parameters()]
    modules = list(model.modules())
    count = MatmulCount()
    for p, value in originals:
        p.value = value.view(_Tagged)
    for m in modules:  # a layer may hand on a plain array (np.asarray drops the tag): re-tag
        m.forward, m.backward = _tagging(m.forward), _tagging(m.backward)
    _ACTIVE.append(count)
    try:
        yield count
    finally:
        _ACTIVE.remove(count)
        for p, value in originals:
            p.value = value
        for m in modules:
            del m.forward, m.backward  # back to the class's methods


# ------------------------------------------------------------- activation memory
def block_activation_elements(config: StackConfig, seq_len: int) -> dict[str, int]:
    r"""Numbers kept by one block for its backward pass, per sequence of ``seq_len`` tokens.

    With dropout off: each norm keeps :math:`\hat x` (:math:`Td`) and :math:`1/\sigma`
    (:math:`T`); attention keeps its input (one array for the three projections),
    :math:`Q, K, V` and the merged heads (the output projection's input: :math:`5Td`;
    with grouped-query attention :math:`K` and :math:`V` have :math:`d_{kv} = h_{kv} d_k`
    features, so :math:`3Td + 2Td_{kv}`) and the weights (:math:`hT^2`); the feed-forward network keeps its input
    (:math:`Td`) and :math:`k\,T d_\text{ff}`, where :math:`k` = 1 for ReLU (its output
    says where the input was positive) and 2 otherwise (the activation's output, and its
    derivative, computed in the forward pass). Dropout with :math:`p > 0` adds a mask for
    the attention weights (the backward pass multiplies the weights by it again rather
    than keeping the dropped copy), for the hidden layer and for each residual branch,
    and the dropped copy of the hidden layer (which takes the place of the activation's
    output, except with ReLU, whose output is kept anyway).
    """
    c = _stack_config(config)
    if c.feed_forward == "moe":
        raise ValueError(
            "block_activation_elements models a plain or gated feed-forward network, got"
            " feed_forward='moe' (what a mixture of experts keeps depends on the routing:"
            " measure it with saved_bytes)"
        )
    t, d, h, d_ff = positive_int(seq_len, "seq_len"), c.d_model, c.n_heads, c.d_ff
    k = 1 if c.activation == "relu" else 2
    qkv = 5 * t * d if c.n_kv_heads is None else 3 * t * d + 2 * t * c.n_kv_heads * c.d_k
    terms = {
        "layer norms": 2 * (t * d + t),
        "attention (input, Q, K, V, heads)": qkv,
        "attention weights": h * t * t,
        "feed-forward": t * d + k * t * d_ff,
    }
    if c.dropout > 0:  # masks and dropped copies; the dropped hidden layer replaces the
        # activation's output, which only ReLU keeps anyway
        hidden = (2 if c.activation == "relu" else 1) * t * d_ff
        terms["dropout"] = h * t * t + hidden + 2 * t * d
    return terms


def activation_bytes(
    config: StackConfig, seq_len: int, batch_size: int = 1, *, id_itemsize: int = 8
) -> dict[str, int]:
    r"""Bytes a forward pass of a single-stack model keeps for its backward pass.

    :math:`L` blocks of :func:`block_activation_elements`, plus the token ids (kept by
    the embedding), the output layer's input (:math:`Td`), the final LayerNorm's
    :math:`Td + T` when the blocks are pre-norm, and the dropout mask after the embedding.
    Everything times :math:`B` and the item size of the configuration's dtype.
    """
    c = _stack_config(config)
    t, b = positive_int(seq_len, "seq_len"), positive_int(batch_size, "batch_size")
    size = np.dtype(c.dtype).itemsize
    block = sum(block_activation_elements(c, t).values())
    d = c.d_model
    rest = t * d + (t * d + t if c.norm_first else 0) + (t * d if c.dropout > 0 else 0)
    return {
        "token ids": b * t * positive_int(id_itemsize, "id_itemsize"),
        "blocks": c.n_layers * b * block * size,
        "output layer and final norm": b * rest * size,
    }


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory ``array`` views."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _arrays(value: Any) -> Iterator[np.ndarray]:
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _arrays(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _arrays(item)


def _named_modules(module: Module, prefix: str) -> Iterator[tuple[str, Module]]:
    yield prefix or "(model)", module
    for name, child in module._children():
        if isinstance(child, Module):
            yield from _named_modules(child, f"{prefix}{name}.")


def saved_bytes(module: Module) -> dict[str, int]:
    """Bytes of the arrays each sub-module keeps for its backward pass, measured.

    Walks every module's saved state and counts each buffer once, at the first module
    holding it: a view (``Q`` split into heads) counts the whole buffer it keeps
    alive, and an array saved by two modules (the input of the three projections of
    self-attention) is not counted twice.

    Returns
    -------
    dict of str to int
        Module name (dotted, ``"(model)"`` for ``module`` itself) to bytes, for the
        modules that hold something.
    """
    if not isinstance(module, Module):
        raise TypeError(f"module must be a tinyformer Module, got {describe(module)}")
    seen: set[int] = set()
    result: dict[str, int] = {}
    for name, m in _named_modules(module, ""):
        total = 0
        for array in _arrays(m._cache):
            root = _root(array)
            if id(root) not in seen:
                seen.add(id(root))
                total += root.nbytes
        if total:
            result[name.rstrip(".")] = total
    return result
