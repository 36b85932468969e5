r"""Checks that catch common transformer bugs by their symptoms, not by reading the code.

Each function here runs a model or a layer and measures a property the correct
code must have:

- :func:`causal_leak`: change one token and see which positions' logits move. A
  causal language model's logits at position :math:`i` depend on tokens
  :math:`0, \dots, i` only, so a change at :math:`j > i` must leave them exactly
  as they were.
- :func:`remove_causal_mask`: the bug itself, on purpose, to show that the probe
  catches it.
- :func:`permutation_equivariance_error`: self-attention without positions must
  satisfy :math:`f(PX) = P f(X)`.
- :func:`parameter_fingerprint`: a hash of every parameter, to show that a
  forward pass (in-context learning included) changes no weight.
- :func:`score_matrix_bytes` and :func:`peak_traced_bytes`: the memory of the
  attention scores, predicted and measured.

None of them takes part in training; they measure what training and inference do.
"""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer._validation import describe, float_dtype, positive_int, token_ids
from tinyformer.module import Module

__all__ = [
    "CausalLeak",
    "causal_leak",
    "parameter_fingerprint",
    "peak_traced_bytes",
    "permutation_equivariance_error",
    "remove_causal_mask",
    "score_matrix_bytes",
]


@dataclass(frozen=True)
class CausalLeak:
    """What :func:`causal_leak` found: how much each position's logits moved.

    Attributes
    ----------
    influence : numpy.ndarray
        ``(T, T)``, float64. ``influence[i, j]`` is the largest absolute change of
        the logits at position ``i`` (over the batch and the vocabulary) when the
        token at position ``j`` is replaced; NaN in the columns ``j`` that were not
        probed.
    probed : numpy.ndarray
        The positions ``j`` whose token was replaced, ascending.
    """

    influence: np.ndarray
    probed: np.ndarray

    @property
    def future_influence(self) -> np.ndarray:
        """``influence`` where ``i < j`` (a later token moved an earlier position), else 0."""
        t = self.influence.shape[0]
        later = np.triu(np.ones((t, t), dtype=bool), k=1)  # (T, T): True where j > i
        return np.where(later, np.nan_to_num(self.influence, nan=0.0), 0.0)

    @property
    def max_leak(self) -> float:
        """The largest change a later token caused at an earlier position (0 if causal)."""
        return float(self.future_influence.max())

    @property
    def leaking_positions(self) -> np.ndarray:
        """Positions ``i`` whose logits changed when some later token ``j > i`` changed."""
        return np.flatnonzero((self.future_influence > 0).any(axis=1))

    @property
    def is_causal(self) -> bool:
        """True if no later token changed any earlier position's logits, exactly."""
        return self.max_leak == 0.0


def _forward_of(model: object) -> Callable[[np.ndarray], Any]:
    """The function that maps ids to logits: ``model.forward`` or ``model`` itself."""
    forward = getattr(model, "forward", model)
    if not callable(forward):
        raise TypeError(
            f"model must be a callable or have a forward method, got {describe(model)}"
        )
    return forward  # type: ignore[no-any-return]


def _logits(forward: Callable[[np.ndarray], Any], ids: np.ndarray) -> np.ndarray:
    """``forward(ids)`` as a float64 ``(B, T, ...)`` array, checked."""
    out = np.asarray(forward(ids))
    if out.dtype.kind != "f" or out.ndim < 2 or out.shape[:2] != ids.shape:
        raise ValueError(
            f"model must return float logits of shape (B, T, ...) = {ids.shape} + (...),"
            f" got {describe(out)}"
        )
    return out.astype(np.float64)


def _probe_positions(positions: object, seq_len: int) -> np.ndarray:
    """``positions`` as sorted unique ints in ``[0, seq_len)``; all of them when None."""
    if positions is None:
        return np.arange(seq_len)
    arr = np.atleast_1d(np.asarray(positions))
    if arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.size == 0:
        raise TypeError(f"positions must be a non-empty list of integers, got {describe(arr)}")
    if arr.min() < 0 or arr.max() >= seq_len:
        raise ValueError(
            f"positions must lie in [0, {seq_len}) for ids of length {seq_len},"
            f" got {arr.min()}..{arr.max()}"
        )
    return np.unique(arr)


def causal_leak(
    model: object,
    ids: np.ndarray,
    positions: object = None,
    *,
    vocab_size: int | None = None,
) -> CausalLeak:
    r"""Replace one token at a time and measure how far every position's logits move.

    For each probed position :math:`j`, every row of ``ids`` gets the token
    :math:`(x_j + 1) \bmod V` at :math:`j`; the result records

    .. math::
        \text{influence}_{ij} = \max_{b,\,v}
        \bigl|z_{b,i,v}(x') - z_{b,i,v}(x)\bigr| .

    A causal model has :math:`\text{influence}_{ij} = 0` exactly for every
    :math:`i < j`: with masked keys given weight exactly 0, no arithmetic on an
    earlier position touches a later token. Any non-zero entry above the
    diagonal is a leak of the future.

    Parameters
    ----------
    model : object
        A model with ``forward(ids) -> logits`` (for example a
        :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` in evaluation
        mode) or such a function itself. It must be deterministic.
    ids : numpy.ndarray
        Token ids, ``(B, T)``.
    positions : sequence of int, optional
        The positions :math:`j` to probe; all of them by default.
    vocab_size : int, optional
        :math:`V`; taken from ``model.vocab_size`` when not given.

    Returns
    -------
    CausalLeak
        The ``(T, T)`` influence matrix and the positions probed.

    Raises
    ------
    ValueError
        If the model gives different logits for the same ids twice (dropout in
        training mode, say), since a change could then not be told from noise.
    """
    forward = _forward_of(model)
    if vocab_size is None:
        vocab_size = getattr(model, "vocab_size", None)
        if vocab_size is None:
            raise TypeError("vocab_size must be given when the model has no vocab_size attribute")
    vocab_size = positive_int(vocab_size, "vocab_size")
    ids = token_ids(ids, "ids", vocab_size)
    if ids.ndim != 2 or ids.size == 0:
        raise ValueError(f"ids must be a non-empty array of shape (B, T), got shape {ids.shape}")
    probed = _probe_positions(positions, ids.shape[1])
    base = _logits(forward, ids)  # (B, T, V)
    if not np.array_equal(base, _logits(forward, ids)):
        raise ValueError(
            "model must be deterministic: two forward passes on the same ids differ"
            " (switch dropout off with model.eval())"
        )
    t = ids.shape[1]
    influence = np.full((t, t), np.nan)  # (T, T): [i, j], NaN where j is not probed
    # causal-leak-begin
    for j in probed:
        changed = ids.copy()
        changed[:, j] = (changed[:, j] + 1) % vocab_size  # a different token at j
        moved = np.abs(_logits(forward, changed) - base)  # (B, T, V)
        influence[:, j] = moved.reshape(moved.shape[0], t, -1).max(axis=(0, 2))  # (T,)
    # causal-leak-end
    return CausalLeak(influence=influence, probed=probed)


def _all_allowed(n_queries: int, n_keys: int) -> np.ndarray:
    """A mask that lets every query attend to every key: no mask at all."""
    return np.ones((n_queries, n_keys), dtype=bool)


def remove_causal_mask(model: Module) -> Module:
    """Make a decoder-only model attend to every position: the missing-mask bug, on purpose.

    The model's causal masks are replaced, in place, by masks that allow every
    key, so position ``i`` also reads the tokens after it. Its forward and
    backward passes run as before, which is why the bug goes unnoticed: only
    the loss (too good) and :func:`causal_leak` give it away.

    Parameters
    ----------
    model : Module
        A :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` (anything that
        makes its causal masks with a ``_causal(n_queries, n_keys)`` member).

    Returns
    -------
    Module
        The same ``model``, now without a causal mask.
    """
    if not isinstance(model, Module) or not callable(getattr(model, "_causal", None)):
        raise TypeError(
            f"model must be a decoder-only model that builds causal masks, got {describe(model)}"
        )
    model._causal = _all_allowed  # type: ignore[attr-defined]
    return model


def permutation_equivariance_error(layer: object, x: np.ndarray, permutation: np.ndarray) -> float:
    r"""Largest entry of :math:`|f(PX) - P f(X)|` for a sequence layer :math:`f`.

    ``f`` maps ``(B, T, d)`` to ``(B, T, d')`` and :math:`P` reorders the
    positions. Self-attention without positional information gives rounding
    error only (it is equivariant); a layer that uses positions does not.

    Parameters
    ----------
    layer : object
        A module with ``forward(x)`` or a function of ``x``.
    x : numpy.ndarray
        Inputs ``(B, T, d)``.
    permutation : numpy.ndarray
        A permutation of ``range(T)``.

    Returns
    -------
    float
    """
    forward = _forward_of(layer)
    x = np.asarray(x)
    if x.ndim != 3 or x.dtype.kind != "f":
        raise ValueError(f"x must be a float array of shape (B, T, d), got {describe(x)}")
    perm = np.asarray(permutation)
    if perm.dtype.kind not in "iu" or not np.array_equal(np.sort(perm), np.arange(x.shape[1])):
        raise ValueError(
            f"permutation must reorder range({x.shape[1]}) (the positions of x),"
            f" got {describe(perm)}"
        )
    # equivariance-begin
    shuffled_then_layer = np.asarray(forward(x[:, perm]))  # f(PX)
    layer_then_shuffled = np.asarray(forward(x))[:, perm]  # P f(X)
    return float(np.abs(shuffled_then_layer - layer_then_shuffled).max())
    # equivariance-end


def parameter_fingerprint(module: Module) -> str:
    """A SHA-256 digest of every parameter's name, shape, dtype and bytes.

    Two calls give the same string if and only if (up to hash collisions) no
    parameter changed in between, bit for bit.

    Parameters
    ----------
    module : Module

    Returns
    -------
    str
        64 hexadecimal digits.
    """
    if not isinstance(module, Module):
        raise TypeError(f"module must be a tinyformer Module, got {describe(module)}")
    digest = hashlib.sha256()
    for name, parameter in module.named_parameters():
        value = np.ascontiguousarray(parameter.value)
        digest.update(f"{name}:{value.shape}:{value.dtype}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def score_matrix_bytes(
    batch_size: int, n_heads: int, seq_len: int, dtype: object = np.float32
) -> int:
    r"""Bytes of the attention scores of one layer: :math:`B\,h\,T^2` numbers.

    Parameters
    ----------
    batch_size, n_heads, seq_len : int
        :math:`B`, :math:`h` and :math:`T` (self-attention: :math:`T_q = T_k = T`).
    dtype : float32 or float64

    Returns
    -------
    int
    """
    b = positive_int(batch_size, "batch_size")
    h = positive_int(n_heads, "n_heads")
    t = positive_int(seq_len, "seq_len")
    return b * h * t * t * float_dtype(dtype).itemsize


def peak_traced_bytes(function: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Call ``function(*args, **kwargs)``; return its result and its peak new memory in bytes.

    Memory is measured with ``tracemalloc``, which sees NumPy's array
    buffers: the peak of the memory traced during the call, above what was
    traced when it started. Arrays the result keeps count; memory freed before
    the call returns counts only while it was held.

    Returns
    -------
    tuple
        ``(result, peak_bytes)``.
    """
    if not callable(function):
        raise TypeError(f"function must be callable, got {describe(function)}")
    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = function(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        if started_here:
            tracemalloc.stop()
    return result, int(peak)
