"""What the training loop minimizes: the loss of one batch, its gradient, and how many tokens were right.

An *objective* is a function ``objective(model, batch, *, backward=True) -> StepResult``.
It runs the model's forward pass on the batch, measures the cross-entropy of
the predictions against the labels, and (if ``backward``) runs the backward
pass, which adds into every parameter's gradient. Two are provided, one per
model family:

- :func:`~tinyformer.training.objectives.seq2seq_loss` for an encoder-decoder on a :class:`~tinyformer.data.batching.Batch`
  (teacher forcing, padding ignored);
- :func:`~tinyformer.training.objectives.lm_loss` for a decoder-only language model on ``(inputs, targets)``
  windows (``targets[:, t]`` follows ``inputs[:, t]``).

Label smoothing is a keyword of both; bind it with ``functools.partial``.
A model with mixtures of experts whose load-balancing loss has a weight
(``router_aux_loss_weight`` > 0) adds, in training, the weighted auxiliary
losses to the reported loss: the layers' backward passes already add their
gradients, so the loss reported is the one differentiated.
If the logits are not finite (a NaN or infinite weight upstream), the
objective does not call the loss at all: it returns a NaN loss and skips the
backward pass, so that the loop can stop with a clear error before any update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tinyformer._validation import describe, token_ids
from tinyformer.data import Batch
from tinyformer.losses import cross_entropy
from tinyformer.moe import MixtureOfExperts

__all__ = ["Objective", "StepResult", "lm_loss", "seq2seq_loss"]


@dataclass(frozen=True)
class StepResult:
    r"""The outcome of one batch.

    Attributes
    ----------
    loss : float
        Mean cross-entropy (nats) over the counted tokens; NaN if the logits
        were not finite.
    n_tokens : int
        How many label positions counted (padding excluded).
    n_correct : int
        How many of them the model's argmax predicted.
    aux_loss : float
        The weighted auxiliary losses of the model's mixtures of experts,
        :math:`\sum_\ell w\, L_{\text{aux}, \ell}` over the layers with a weight
        :math:`w > 0` (0 for a model without any). A training step (``backward``)
        includes it in ``loss``; an evaluation (no backward) reports the
        cross-entropy alone in ``loss``.
    """

    loss: float
    n_tokens: int
    n_correct: int
    aux_loss: float = 0.0

    @property
    def accuracy(self) -> float:
        """``n_correct / n_tokens`` (0 for a batch with no counted token)."""
        return self.n_correct / self.n_tokens if self.n_tokens else 0.0


class Objective(Protocol):
    """A function from (model, batch) to a :class:`~tinyformer.training.objectives.StepResult`, running backward if asked."""

    def __call__(self, model: Any, batch: Any, *, backward: bool = True) -> StepResult:
        """Score ``batch`` with ``model``; with ``backward``, add the loss gradient to the parameters."""


def _auxiliary_loss(model: Any) -> float | None:
    """Sum of ``aux_loss_weight * aux_loss`` over the model's mixtures of experts, or None.

    None when the model has no mixture of experts with a positive weight (then the
    loss is left exactly as the cross-entropy computed it).
    """
    modules = getattr(model, "modules", None)
    if modules is None:
        return None
    total = None
    for m in modules():
        if isinstance(m, MixtureOfExperts) and m.aux_loss_weight and m.routing is not None:
            total = (total or 0.0) + m.aux_loss_weight * m.aux_loss
    return total


def _score(
    model: Any,
    logits: np.ndarray,
    targets: np.ndarray,
    counted: np.ndarray,
    *,
    ignore_index: int | None,
    label_smoothing: float,
    backward: bool,
) -> StepResult:
    """Cross-entropy, argmax accuracy and (optionally) the backward pass from the logits."""
    n_tokens = int(counted.sum())
    if not np.isfinite(logits).all():
        return StepResult(math.nan, n_tokens, 0)
    loss, grad_logits = cross_entropy(
        logits, targets, ignore_index=ignore_index, label_smoothing=label_smoothing
    )
    n_correct = int(((logits.argmax(axis=-1) == targets) & counted).sum())
    aux = _auxiliary_loss(model)
    if backward:
        model.backward(grad_logits)
    if aux is None:
        return StepResult(loss, n_tokens, n_correct)
    return StepResult(loss + aux if backward else loss, n_tokens, n_correct, aux)


def seq2seq_loss(
    model: Any, batch: Batch, *, label_smoothing: float = 0.0, backward: bool = True
) -> StepResult:
    r"""Teacher-forced cross-entropy of an encoder-decoder on a padded batch.

    Of a :class:`~tinyformer.data.batching.Batch`, the model reads ``batch.source_ids`` and ``batch.decoder_input_ids`` with
    the batch's masks and predicts ``batch.target_ids``; positions outside
    ``batch.loss_mask`` (padding) count neither in the loss nor in the accuracy.

    Parameters
    ----------
    model : EncoderDecoder
        Anything with ``forward(source_ids, decoder_input_ids, *, source_mask,
        decoder_mask) -> logits (B, T, V)`` and ``backward(grad_logits)``.
    batch : Batch
    label_smoothing : float
        :math:`\epsilon` of :func:`~tinyformer.losses.cross_entropy`.
    backward : bool
        Whether to run the backward pass (False for evaluation).

    Returns
    -------
    StepResult
    """
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tinyformer.data.Batch, got {describe(batch)}")
    logits = model.forward(
        batch.source_ids,
        batch.decoder_input_ids,
        source_mask=batch.source_mask,
        decoder_mask=batch.decoder_mask,
    )  # (B, T, V)
    # padded labels are set to -1, which no class id equals
    targets = np.where(batch.loss_mask, batch.target_ids, -1)  # (B, T)
    return _score(
        model,
        logits,
        targets,
        batch.loss_mask,
        ignore_index=-1,
        label_smoothing=label_smoothing,
        backward=backward,
    )


def lm_loss(
    model: Any,
    batch: tuple[np.ndarray, np.ndarray],
    *,
    label_smoothing: float = 0.0,
    backward: bool = True,
) -> StepResult:
    r"""Next-token cross-entropy of a language model on ``(inputs, targets)`` windows.

    The model reads ``inputs`` ``(B, T)`` and predicts, at every position
    ``t``, ``targets[:, t]`` (the token after ``inputs[:, t]``); every position
    counts.

    Parameters
    ----------
    model : DecoderOnlyLM
        Anything with ``forward(ids) -> logits (B, T, V)`` and ``backward(grad_logits)``.
    batch : (numpy.ndarray, numpy.ndarray)
        Integer ``inputs`` and ``targets`` of one shape ``(B, T)``.
    label_smoothing : float
    backward : bool

    Returns
    -------
    StepResult
    """
    if not isinstance(batch, tuple) or len(batch) != 2:
        raise TypeError(f"batch must be a pair (inputs, targets), got {describe(batch)}")
    inputs = token_ids(batch[0], "inputs")
    targets = token_ids(batch[1], "targets")
    if inputs.ndim != 2 or targets.shape != inputs.shape:
        raise ValueError(
            "inputs and targets must be 2-D arrays of one shape (B, T), got shapes"
            f" {inputs.shape} and {targets.shape}"
        )
    logits = model.forward(inputs)  # (B, T, V)
    counted = np.ones(targets.shape, dtype=bool)
    return _score(
        model,
        logits,
        targets,
        counted,
        ignore_index=None,
        label_smoothing=label_smoothing,
        backward=backward,
    )
