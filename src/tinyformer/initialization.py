r"""GPT-2's initialization of a decoder-only model, and the residual stream it starts with.

GPT-1 :cite:p:`radford2018improving` drew every weight from :math:`\mathcal{N}(0, 0.02^2)`;
GPT-2 :cite:p:`radford2019language` (its section 2.3) kept that and scaled "the weights
of residual layers at initialization by a factor of :math:`1/\sqrt{N}` where :math:`N`
is the number of residual layers". nanoGPT and Hugging Face's ``GPT2Model`` read
:math:`N` as the number of residual *additions*, two per block (attention and
feed-forward), and draw the two output projections that write into the stream
(``c_proj``) with standard deviation :math:`0.02/\sqrt{2 n_\text{layer}}`.

:func:`gpt2_init` re-initializes a :class:`~tinyformer.models.decoder_only.DecoderOnlyLM`
that way, in place; :func:`residual_projections` names the weights it scales; and
:func:`stream_growth` measures, at initialization, how the mean square of the
residual stream grows with each addition of a pre-norm stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import describe, generator, positive_float, token_ids
from tinyformer.masks import causal_mask
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.module import Parameter, no_grad

__all__ = ["StreamGrowth", "gpt2_init", "residual_projections", "stream_growth"]


def _check_model(model: object) -> DecoderOnlyLM:
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a DecoderOnlyLM, got {describe(model)}")
    if model.config.feed_forward == "moe":
        raise ValueError(
            "model must have a plain or gated feed-forward network, got feed_forward='moe'"
            " (a mixture of experts has one output projection per expert)"
        )
    return model


def residual_projections(model: DecoderOnlyLM) -> list[Parameter]:
    r"""The weights whose layer's output is added to the residual stream, two per block.

    For every block, in order: the attention's output projection
    (``self_attention.layer.out_proj.weight``, GPT-2's ``attn.c_proj``) and the
    feed-forward network's second layer (``feed_forward.layer.linear_out.weight``,
    GPT-2's ``mlp.c_proj``). Their number is :math:`N = 2\,n_\text{layers}`.

    Parameters
    ----------
    model : DecoderOnlyLM
        With a plain or gated feed-forward network.

    Returns
    -------
    list of Parameter
    """
    model = _check_model(model)
    weights = []
    for block in model.decoder.layers:
        weights.append(block.self_attention.layer.out_proj.weight)  # (d, d)
        weights.append(block.feed_forward.layer.linear_out.weight)  # (d_ff, d)
    return weights


def gpt2_init(
    model: DecoderOnlyLM,
    *,
    rng: np.random.Generator,
    std: float = 0.02,
    scale_residual: bool = True,
) -> DecoderOnlyLM:
    r"""Re-initialize ``model`` in place with GPT-2's scheme; return it.

    Every parameter with two or more axes (linear weights, the token table, which
    a tied output shares, and a learned position table) is drawn from
    :math:`\mathcal{N}(0, \sigma^2)`, every norm gain set to one and every bias to
    zero. With ``scale_residual`` the :math:`N` weights of
    :func:`residual_projections` are then multiplied by :math:`1/\sqrt{N}`:

    .. math::
        W \sim \mathcal{N}(0, \sigma^2), \qquad
        W_\text{proj} \sim \mathcal{N}\!\left(0, \frac{\sigma^2}{N}\right), \qquad
        N = 2\, n_\text{layers}.

    The draws are the same with and without ``scale_residual`` for the same
    generator state, so the two models differ only by that factor.

    Parameters
    ----------
    model : DecoderOnlyLM
        With a plain or gated feed-forward network; its dtype is kept.
    rng : numpy.random.Generator
        Draws every weight, in the order of ``model.named_parameters()``.
    std : float
        :math:`\sigma > 0`; GPT-2's is 0.02.
    scale_residual : bool
        Scale the residual projections by :math:`1/\sqrt{N}`.

    Returns
    -------
    DecoderOnlyLM
        ``model`` itself.
    """
    model = _check_model(model)
    rng = generator(rng)
    std = positive_float(std, "std")
    if not isinstance(scale_residual, bool):
        raise TypeError(f"scale_residual must be a bool, got {describe(scale_residual)}")
    unknown = [
        name
        for name, p in model.named_parameters()
        if p.value.ndim < 2 and not name.endswith((".gain", ".bias"))
    ]
    if unknown:  # refuse before drawing anything: never leave a half-initialized model
        raise ValueError(f"model has parameters gpt2_init does not know: {unknown}")
    projections = {id(p) for p in residual_projections(model)}
    factor = 1.0 / math.sqrt(len(projections)) if scale_residual else 1.0
    for name, p in model.named_parameters():
        if p.value.ndim >= 2:
            draw = rng.normal(0.0, std, p.shape)  # float64, then cast once
            if id(p) in projections:
                draw *= factor
            p.value[...] = draw
        elif name.endswith(".gain"):
            p.value[...] = 1.0
        else:  # a ".bias": the names were checked above
            p.value[...] = 0.0
    return model


@dataclass(frozen=True)
class StreamGrowth:
    r"""Mean squares of a pre-norm residual stream, addition by addition.

    With :math:`x_0` the embedded input and :math:`x_{i+1} = x_i + a_i` after the
    :math:`i`-th residual addition (attention, then feed-forward, block by block),
    and :math:`\langle\cdot\rangle` the mean over every entry:

    .. math::
        \langle x_{i+1}^2\rangle = \langle x_i^2\rangle + \langle a_i^2\rangle
        + 2\langle x_i a_i\rangle.

    Attributes
    ----------
    stream : numpy.ndarray
        ``(N + 1,)``: :math:`\langle x_i^2\rangle`, the input first.
    added : numpy.ndarray
        ``(N,)``: :math:`\langle a_i^2\rangle`.
    cross : numpy.ndarray
        ``(N,)``: :math:`2\langle x_i a_i\rangle`, zero in expectation when
        each addition is independent of the stream it joins.
    shared : numpy.ndarray
        ``(N + 1,)``: the share of :math:`\langle x_i^2\rangle` common to every
        position, :math:`\langle \bar x_i^2\rangle / \langle x_i^2\rangle` with
        :math:`\bar x_i` the mean of :math:`x_i` over the positions of each
        sequence; in ``[0, 1]``, 1 when every position holds the same vector.
    """

    stream: np.ndarray
    added: np.ndarray
    cross: np.ndarray
    shared: np.ndarray


def stream_growth(model: DecoderOnlyLM, ids: object) -> StreamGrowth:
    """Run a pre-norm ``model``'s stack on ``ids`` ``(B, T)``; measure every residual addition.

    Dropout must be off (evaluation mode). Everything is accumulated in float64.
    The final norm is not applied: ``stream[-1]`` is the mean square of the sum
    it would normalize.

    Parameters
    ----------
    model : DecoderOnlyLM
        Pre-norm (``norm_first``), with a plain or gated feed-forward network.
    ids : array_like of int
        ``(B, T)``, ``1 <= T <= context_length``.

    Returns
    -------
    StreamGrowth
    """
    model = _check_model(model)
    if model.training and model.config.dropout > 0:
        raise ValueError(
            "model must be in evaluation mode (call model.eval()): dropout would scale the"
            f" additions, got training mode with dropout={model.config.dropout}"
        )
    if not model.config.norm_first:
        raise ValueError("model must be pre-norm (norm_first=True), got a post-norm model")
    ids = token_ids(ids, "ids", model.vocab_size)
    if ids.ndim != 2 or not 1 <= ids.shape[1] <= model.context_length:
        raise ValueError(
            f"ids must have shape (B, T) with 1 <= T <= {model.context_length},"
            f" got shape {ids.shape}"
        )
    stack = model.decoder
    mask = causal_mask(ids.shape[1])  # (T, T)
    with no_grad():
        x = stack.embedding.forward(ids)  # (B, T, d)
        if stack.positions is not None:
            x = stack.positions.forward(x, 0)
        stream, added, cross, shared = [_mean_square(x)], [], [], [_shared_share(x)]
        for block in stack.layers:
            for residual, options in (
                (block.self_attention, {"mask": mask}),
                (block.feed_forward, {}),
            ):
                y = residual.forward(x, **options)  # (B, T, d): x + F(N(x))
                a = y.astype(np.float64) - x  # the addition
                added.append(_mean_square(a))
                cross.append(2.0 * float(np.mean(x * a)))
                stream.append(_mean_square(y))
                shared.append(_shared_share(y))
                x = y
    return StreamGrowth(np.array(stream), np.array(added), np.array(cross), np.array(shared))


def _shared_share(x: np.ndarray) -> float:
    """<mean over positions of x, squared> / <x^2> for x (B, T, d)."""
    common = np.mean(x, axis=1, dtype=np.float64)  # (B, d)
    return float(np.mean(np.square(common)) / _mean_square(x))


def _mean_square(x: np.ndarray) -> float:
    return float(np.mean(np.square(x, dtype=np.float64)))
