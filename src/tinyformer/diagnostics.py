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
- :func:`target_alignment`: which shift of the inputs a batch's targets are; a
  language model's must be the inputs moved left by one.
- :func:`restart_positions`, :func:`cached_logits` and :func:`cached_logit_gap`:
  a key/value cache whose new tokens get positions counted from 0 again, on
  purpose, and the equality of cached and uncached logits that catches it.
- :func:`decay_exempt_parameters`, :func:`wrongly_decayed` and
  :func:`decay_only_factor`: the normalization parameters, biases and embedding
  tables of a model, those of them an optimizer decays, and how far decay alone
  shrinks a parameter over a run.

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
from tinyformer.layers import Embedding
from tinyformer.module import Module, Parameter
from tinyformer.norm import NORMS, BatchNorm
from tinyformer.optim import AdamW, Optimizer
from tinyformer.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = [
    "CausalLeak",
    "TargetAlignment",
    "cached_logit_gap",
    "cached_logits",
    "causal_leak",
    "decay_exempt_parameters",
    "decay_only_factor",
    "parameter_fingerprint",
    "peak_traced_bytes",
    "permutation_equivariance_error",
    "remove_causal_mask",
    "restart_positions",
    "score_matrix_bytes",
    "target_alignment",
    "wrongly_decayed",
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


@dataclass(frozen=True)
class TargetAlignment:
    """What :func:`target_alignment` found: how often the targets equal the shifted inputs.

    Attributes
    ----------
    agreement : dict
        Keyed by the offset ``k`` (an int): ``agreement[k]`` is the fraction of positions ``t`` (among those where
        ``t + k`` lies inside the window) with ``targets[:, t] == inputs[:, t + k]``.
    """

    agreement: dict[int, float]

    @property
    def offset(self) -> int | None:
        """The offset at which every target equals its shifted input; None if there is none."""
        exact = [k for k, share in self.agreement.items() if share == 1.0]
        return exact[0] if len(exact) == 1 else None

    @property
    def is_next_token(self) -> bool:
        """True if ``targets[:, t] == inputs[:, t + 1]`` wherever both exist, and no other offset fits."""
        return self.offset == 1


def target_alignment(
    inputs: np.ndarray, targets: np.ndarray, max_offset: int = 2
) -> TargetAlignment:
    r"""Compare a batch's targets with its inputs moved by every offset up to ``max_offset``.

    For each offset :math:`k \in \{-K, \dots, K\}` it measures

    .. math::
        a_k = \frac{1}{|S_k|} \sum_{(b, t) \in S_k}
        \mathbf{1}\bigl[y_{b,t} = x_{b,t+k}\bigr], \qquad
        S_k = \{(b, t) : 0 \le t + k < T\}.

    A language model's targets are the next tokens, so :math:`a_1 = 1` and
    every other :math:`a_k` is near the chance that two tokens agree. Targets
    equal to the inputs give :math:`a_0 = 1`; inputs and targets swapped give
    :math:`a_{-1} = 1`. The check needs no model: run it on one batch before
    training.

    Parameters
    ----------
    inputs, targets : numpy.ndarray of int
        One shape ``(B, T)``, non-empty, with ``T > max_offset``. Every position
        counts: run the check before padding or ``-100`` (ignored) labels are
        added.
    max_offset : int
        :math:`K \ge 1`.

    Returns
    -------
    TargetAlignment
    """
    inputs = token_ids(inputs, "inputs")
    targets = token_ids(targets, "targets")
    if inputs.ndim != 2 or inputs.shape != targets.shape or inputs.size == 0:
        raise ValueError(
            "inputs and targets must be non-empty arrays of one shape (B, T),"
            f" got shapes {inputs.shape} and {targets.shape}"
        )
    k_max = positive_int(max_offset, "max_offset")
    t = inputs.shape[1]
    if t <= k_max:
        raise ValueError(f"inputs must be longer than max_offset={k_max} tokens, got T = {t}")
    agreement = {}
    # target-alignment-begin
    for k in range(-k_max, k_max + 1):
        y = targets[:, max(0, -k) : t - max(0, k)]  # (B, T - |k|): the targets at t
        x = inputs[:, max(0, k) : t + min(0, k)]  # (B, T - |k|): the inputs at t + k
        agreement[k] = float(np.mean(y == x))
    # target-alignment-end
    return TargetAlignment(agreement=agreement)


def restart_positions(model: Module) -> Module:
    """Make a model's absolute positions restart at 0 at every call: the cache-offset bug, on purpose.

    A cached decoding step feeds the new tokens with ``start`` equal to the
    number of positions already cached. This replaces, in place, the forward
    pass of the model's position table by one that ignores ``start``, so every
    token fed after the prompt is placed at position 0 again (and a prompt fed
    in one call gets positions ``0 .. n - 1``, as it should). A full forward pass,
    and so training, is unchanged: only :func:`cached_logit_gap` sees it.

    Parameters
    ----------
    model : Module
        A :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` with learned or
        sinusoidal positions (rotary positions are computed inside attention
        from the cache's length and are not affected).

    Returns
    -------
    Module
        The same ``model``, now with positions that restart.
    """
    positions = getattr(getattr(model, "decoder", None), "positions", None)
    if not isinstance(model, Module) or not isinstance(
        positions, LearnedPositionalEmbedding | SinusoidalPositionalEncoding
    ):
        raise TypeError(
            "model must be a decoder-only model with learned or sinusoidal positions"
            f" (model.decoder.positions), got {describe(model)} with positions {describe(positions)}"
        )
    correct_forward = positions.forward

    def from_zero(x: np.ndarray, start: int = 0) -> np.ndarray:  # noqa: ARG001
        return correct_forward(x, 0)  # the bug: the offset `start` is dropped

    positions.forward = from_zero  # type: ignore[method-assign]
    return model


def cached_logits(model: object, ids: np.ndarray, prompt_length: int = 1) -> np.ndarray:
    """The logits of ``ids`` computed through a key/value cache, as generation computes them.

    The first ``prompt_length`` tokens go to ``model.step`` in one call, then
    one token per call, each step extending one cache.

    Parameters
    ----------
    model : object
        A decoder-only model with ``start`` and ``step``
        (:class:`~tinyformer.models.decoder_only.DecoderOnlyLM`), in evaluation mode.
    ids : numpy.ndarray of int
        ``(B, T)`` token ids.
    prompt_length : int
        Tokens fed in the first call, ``1 <= prompt_length <= T``.

    Returns
    -------
    numpy.ndarray
        ``(B, T, V)``, the model's dtype.
    """
    start, step = getattr(model, "start", None), getattr(model, "step", None)
    if not (callable(start) and callable(step)):
        raise TypeError(f"model must have start and step methods, got {describe(model)}")
    if getattr(model, "training", False):
        raise ValueError(
            "model must be in evaluation mode (call .eval()), got a model in training mode"
        )
    ids = token_ids(ids, "ids")
    if ids.ndim != 2 or ids.size == 0:
        raise ValueError(f"ids must be a non-empty array of shape (B, T), got shape {ids.shape}")
    p = positive_int(prompt_length, "prompt_length")
    if p > ids.shape[1]:
        raise ValueError(f"prompt_length must be at most T = {ids.shape[1]}, got {p}")
    state = start(ids.shape[0])
    # cached-logits-begin
    pieces = [step(ids[:, :p], state)]  # (B, p, V): the prompt in one call
    pieces += [step(ids[:, t : t + 1], state) for t in range(p, ids.shape[1])]  # (B, 1, V) each
    # cached-logits-end
    return np.concatenate(pieces, axis=1)  # (B, T, V)


def cached_logit_gap(model: object, ids: np.ndarray, prompt_length: int = 1) -> np.ndarray:
    r"""Per position, the largest gap between cached and uncached logits.

    The logits of :func:`cached_logits` (a prompt of ``prompt_length`` tokens,
    then one token per step) are compared with those of one
    ``model.forward(ids)``:

    .. math::
        \text{gap}_t = \max_{b,\,v}
        \bigl| z^\text{cached}_{b,t,v} - z^\text{full}_{b,t,v} \bigr| .

    A correct cache gives rounding error only (the two paths multiply matrices
    of different shapes); a wrong position offset, a cache that drops or
    repeats a position, or a mask that differs between the paths gives gaps
    of the size of the logits themselves.

    Parameters
    ----------
    model : object
        A decoder-only model with ``forward``, ``start`` and ``step``, in
        evaluation mode.
    ids : numpy.ndarray of int
        ``(B, T)`` token ids.
    prompt_length : int
        Tokens fed in the first call, ``1 <= prompt_length <= T``.

    Returns
    -------
    numpy.ndarray
        ``(T,)``, float64.
    """
    cached = cached_logits(model, ids, prompt_length).astype(np.float64)  # (B, T, V)
    full = _logits(_forward_of(model), np.asarray(ids))  # (B, T, V)
    return np.abs(cached - full).max(axis=(0, 2))  # (T,)


def _parameter_kinds(module: Module) -> dict[int, str]:
    """``id(parameter) -> kind`` for the parameters that weight decay should leave alone."""
    kinds: dict[int, str] = {}
    norms = (*NORMS.values(), BatchNorm)
    for m in module.modules():
        for attribute, value in vars(m).items():
            if not isinstance(value, Parameter):
                continue
            if isinstance(m, norms):
                kinds[id(value)] = "norm"
            elif isinstance(m, Embedding | LearnedPositionalEmbedding):
                kinds[id(value)] = "embedding"
            elif attribute == "bias":
                kinds[id(value)] = "bias"
    return kinds


def decay_exempt_parameters(model: Module) -> dict[str, str]:
    """The parameters that weight decay should not touch, by name, with their kind.

    Three kinds: ``"norm"`` (the gain and bias of a LayerNorm or RMSNorm,
    which decay pulls toward zero although 1 means "keep the normalized
    scale"), ``"bias"`` (of any other layer: an offset, which decay has no
    reason to shrink) and ``"embedding"`` (token and learned position tables,
    whose rows for rare tokens or positions get little gradient to resist the
    decay). This is minGPT's rule; nanoGPT's decays every tensor of two or more
    dimensions, embeddings included. A token table tied to the output layer
    (``tie_output``, the default of
    :class:`~tinyformer.models.config.DecoderOnlyConfig`) is also the output
    matrix, so this rule leaves the output matrix undecayed too, which minGPT,
    whose output layer is separate, does not.

    Parameters
    ----------
    model : Module

    Returns
    -------
    dict of str to str
        ``{name: kind}`` in the order of ``model.named_parameters()``.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    kinds = _parameter_kinds(model)
    return {name: kinds[id(p)] for name, p in model.named_parameters() if id(p) in kinds}


def wrongly_decayed(model: Module, optimizer: Optimizer) -> list[str]:
    """Names of the ``model``'s norm, bias and embedding parameters that ``optimizer`` decays.

    A parameter is decayed when the optimizer holds it, its weight decay is
    above zero and it is not in the optimizer's ``no_decay`` list. An empty
    list means the optimizer leaves all of :func:`decay_exempt_parameters` alone.

    Parameters
    ----------
    model : Module
    optimizer : Optimizer
        Any optimizer of :mod:`tinyformer.optim`.

    Returns
    -------
    list of str
    """
    exempt = decay_exempt_parameters(model)
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a tinyformer Optimizer, got {describe(optimizer)}")
    if not getattr(optimizer, "weight_decay", 0.0):
        return []
    # The optimizers keep their per-parameter decay flags in the private ``_decays``
    # (Adam and AdamW); those without it decay every parameter they hold.
    flags = getattr(optimizer, "_decays", [True] * len(optimizer.parameters))
    decayed = {id(p) for p, flag in zip(optimizer.parameters, flags, strict=True) if flag}
    names = dict(model.named_parameters())
    return [name for name in exempt if id(names[name]) in decayed]


def decay_only_factor(optimizer: Optimizer, n_steps: int) -> float:
    r"""What AdamW's weight decay alone multiplies a decayed parameter by over ``n_steps`` steps.

    With decoupled decay (:class:`~tinyformer.optim.AdamW`) each step multiplies
    a decayed parameter by :math:`1 - \eta_t \lambda` before the gradient's
    update (:math:`\eta_t` the learning rate: PyTorch's convention), so a
    parameter that the gradient does not push back ends at

    .. math::
        \prod_{t=1}^{n} (1 - \eta_t \lambda)

    of its value, with :math:`\eta_t` the optimizer's learning rate (or
    schedule) at step :math:`t`, counted from its first step. Coupled decay
    (:class:`~tinyformer.optim.Adam` or :class:`~tinyformer.optim.SGD` with
    ``weight_decay``) adds :math:`\lambda\theta` to the gradient instead, where
    moments and Adam's scaling change its effect, so it is refused.

    Parameters
    ----------
    optimizer : AdamW
        A :class:`~tinyformer.optim.AdamW`, with :math:`\eta_t \lambda \le 1`
        at every step.
    n_steps : int
        Steps :math:`n \ge 1`.

    Returns
    -------
    float
        In ``[0, 1]``; 1.0 without weight decay.
    """
    if not isinstance(optimizer, AdamW):
        raise TypeError(
            "optimizer must be a tinyformer AdamW (decoupled weight decay),"
            f" got {describe(optimizer)}"
        )
    n = positive_int(n_steps, "n_steps")
    decay = float(optimizer.weight_decay)
    schedule = optimizer.schedule
    rates = np.array([schedule(t) if schedule else optimizer.lr for t in range(1, n + 1)])  # (n,)
    shrink = rates * decay  # (n,): eta_t * lambda
    if shrink.max() > 1.0:
        step = int(np.argmax(shrink)) + 1
        raise ValueError(
            "optimizer must have lr * weight_decay <= 1 at every step (a larger product"
            f" flips the parameter's sign), got {shrink.max()} at step {step}"
        )
    return float(np.prod(1.0 - shrink))
