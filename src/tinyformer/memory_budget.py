r"""The memory a training step holds, part by part: model states and activations.

For each of its :math:`\Psi` parameters, training holds the weight and its gradient, and
the optimizer's state: Adam keeps two moments per parameter (:class:`~tinyformer.optim.Adam`'s
``exp_avg`` and ``exp_avg_sq``), SGD with momentum one buffer. In float32 that is

.. math:: 4\Psi + 4\Psi + (4 + 4)\Psi = 16\Psi \text{ bytes (Adam).}

Under mixed precision the weights and gradients are 16-bit (float16 or bfloat16) and the
optimizer keeps a float32 master copy of the weights beside its float32 moments;
:cite:t:`rajbhandari2020zero` (Section 3.1) write it :math:`2\Psi + 2\Psi + K\Psi` with
:math:`K = 12`, again 16 bytes per parameter. These are the *model states*; the
*activations* kept for the backward pass come on top and grow with the batch and the
length (:func:`tinyformer.cost.activation_bytes`).

:func:`bytes_per_parameter` and :func:`model_state_bytes` give the formula,
:func:`training_memory` adds the activations for a configuration, and :func:`held_bytes`
measures what a model and its optimizer actually hold, array by array.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import describe, non_negative_int, one_of, positive_int
from tinyformer.cost import activation_bytes
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.counting import parameter_count
from tinyformer.models.encoder_only import EncoderOnlyConfig
from tinyformer.module import Module
from tinyformer.optim import Optimizer

__all__ = [
    "OPTIMIZER_STATES",
    "PRECISIONS",
    "bytes_per_parameter",
    "held_bytes",
    "model_state_bytes",
    "training_memory",
]

PRECISIONS = ("float32", "float64", "mixed")
"""Number formats of a training run, either one float format throughout or 16-bit weights and
gradients with float32 master weights and optimizer state (``"mixed"``)."""

OPTIMIZER_STATES = {
    "adam": ("first moment", "second moment"),
    "momentum": ("momentum",),
    "sgd": (),
}
"""The arrays an optimizer keeps per parameter, by name of the part."""

_BUFFER_PARTS = {"exp_avg": "first moment", "exp_avg_sq": "second moment"}
_BUFFER_PARTS["momentum_buffer"] = "momentum"


def bytes_per_parameter(precision: str = "float32", optimizer: str = "adam") -> dict[str, int]:
    r"""Bytes each part of the model states takes per parameter.

    .. math::
        \text{float32 Adam: } 4 + 4 + 4 + 4, \qquad
        \text{mixed-precision Adam: } \underbrace{2 + 2}_{\text{weights, gradients}}
        + \underbrace{4 + 4 + 4}_{K = 12}

    Parameters
    ----------
    precision : str
        ``"float32"``, ``"float64"`` or ``"mixed"`` (16-bit weights and gradients; a
        float32 master copy and float32 optimizer state).
    optimizer : str
        ``"adam"`` (two moments; Adam and AdamW), ``"momentum"`` (one buffer) or
        ``"sgd"`` (none).

    Returns
    -------
    dict of str to int
        Part (``"weights"``, ``"gradients"``, ``"master weights"`` under mixed
        precision, then the optimizer's buffers) to bytes per parameter.
    """
    precision = one_of(precision, PRECISIONS, "precision")
    optimizer = one_of(optimizer, tuple(OPTIMIZER_STATES), "optimizer")
    mixed = precision == "mixed"
    state = 4 if mixed else np.dtype(precision).itemsize  # master weights and moments
    compute = 2 if mixed else state  # weights and gradients
    parts = {"weights": compute, "gradients": compute}
    if mixed:
        parts["master weights"] = state
    parts.update(dict.fromkeys(OPTIMIZER_STATES[optimizer], state))
    return parts


def model_state_bytes(
    n_parameters: int, precision: str = "float32", optimizer: str = "adam"
) -> dict[str, int]:
    r"""Bytes of each part of the model states for :math:`\Psi` = ``n_parameters``.

    :func:`bytes_per_parameter` times :math:`\Psi`, part by part.
    """
    n = non_negative_int(n_parameters, "n_parameters")
    return {part: n * b for part, b in bytes_per_parameter(precision, optimizer).items()}


def training_memory(
    config: DecoderOnlyConfig | EncoderOnlyConfig,
    seq_len: int,
    batch_size: int,
    *,
    precision: str = "float32",
    optimizer: str = "adam",
) -> dict[str, int]:
    r"""The memory of a training step of a single-stack model, by part, in bytes.

    The model states of :func:`model_state_bytes` for :math:`\Psi` =
    :func:`~tinyformer.models.counting.parameter_count`, plus ``"activations"``:
    :func:`~tinyformer.cost.activation_bytes` for ``batch_size`` sequences of
    ``seq_len`` tokens, every kept array in the compute format (the configuration's
    dtype; 2 bytes under mixed precision), the token ids in int64.
    """
    if not isinstance(config, DecoderOnlyConfig | EncoderOnlyConfig):
        raise TypeError(
            f"config must be a DecoderOnlyConfig or an EncoderOnlyConfig, got {describe(config)}"
        )
    t, b = positive_int(seq_len, "seq_len"), positive_int(batch_size, "batch_size")
    states = model_state_bytes(parameter_count(config), precision, optimizer)
    kept = activation_bytes(config, t, b)
    ids = kept.pop("token ids")
    itemsize = np.dtype(config.dtype).itemsize
    compute = 2 if precision == "mixed" else itemsize  # bytes of one kept number
    return {**states, "activations": ids + sum(kept.values()) // itemsize * compute}


def held_bytes(model: Module, optimizer: Optimizer | None = None) -> dict[str, int]:
    """Bytes the model's parameters, their gradients and the optimizer's buffers hold, measured.

    Adds up ``nbytes`` of every distinct array (a parameter shared by two layers, such
    as a tied output table, counts once), grouped by the parts of
    :func:`bytes_per_parameter`: ``"weights"`` (``p.value``), ``"gradients"``
    (``p.grad``) and each optimizer buffer (``"first moment"`` and ``"second moment"``
    for Adam, ``"momentum"`` for SGD).
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"optimizer must be a tinyformer Optimizer or None, got {describe(optimizer)}"
        )
    params = model.parameters()
    parts = {
        "weights": sum(p.value.nbytes for p in params),
        "gradients": sum(p.grad.nbytes for p in params),
    }
    if optimizer is not None:
        for name, arrays in optimizer.buffers.items():
            parts[_BUFFER_PARTS.get(name, name)] = sum(a.nbytes for a in arrays)
    return parts
