"""Cross-entropy from logits, with padding ignored and optional label smoothing."""

from __future__ import annotations

import numbers

import numpy as np

from tinyformer._validation import NonFiniteError, describe, float_array
from tinyformer.functional import log_softmax

__all__ = ["cross_entropy"]


def _check_targets(
    targets: object, logits: np.ndarray, ignore_index: object
) -> tuple[np.ndarray, np.ndarray]:
    """Integer targets of shape ``logits.shape[:-1]`` and the mask of those that count."""
    targets = np.asarray(targets)
    if targets.dtype.kind not in "iu":
        raise TypeError(f"targets must be an integer array of class ids, got {describe(targets)}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets must have shape {logits.shape[:-1]} (the logits' shape without the"
            f" class axis), got {targets.shape}"
        )
    if ignore_index is not None and (
        isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral)
    ):
        raise TypeError(f"ignore_index must be an integer or None, got {describe(ignore_index)}")
    counted = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
    used = targets[counted]
    n_classes = logits.shape[-1]
    if used.size and (used.min() < 0 or used.max() >= n_classes):
        bad = used.min() if used.min() < 0 else used.max()
        raise ValueError(
            f"targets must be class ids in [0, {n_classes}) (or ignore_index), got {bad}"
        )
    return targets, counted


def _check_smoothing(label_smoothing: object) -> float:
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real):
        raise TypeError(
            f"label_smoothing must be a number in [0, 1], got {describe(label_smoothing)}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    return float(label_smoothing)


def cross_entropy(
    logits: np.ndarray,
    targets: np.ndarray,
    *,
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> tuple[float, np.ndarray]:
    r"""Mean cross-entropy of softmax(logits) against integer targets, and its gradient.

    With :math:`\epsilon` = ``label_smoothing`` and :math:`V` classes, the
    target distribution puts :math:`1 - \epsilon + \epsilon/V` on the true
    class and :math:`\epsilon/V` on every other :cite:p:`szegedy2016rethinking`
    (PyTorch's convention). For each counted position,

    .. math::
        \ell = -\sum_c q_c \log \operatorname{softmax}(z)_c, \qquad
        \frac{\partial \ell}{\partial z} = \operatorname{softmax}(z) - q,

    with the log-softmax computed stably. The loss is the mean of :math:`\ell`
    over positions whose target is not ``ignore_index``, and the gradient is
    divided by the same count; ignored positions get a zero gradient. If every
    target is ignored there is nothing to average: the loss is 0 and the
    gradient all zeros (not NaN).

    Parameters
    ----------
    logits : numpy.ndarray
        Unnormalized scores, ``(..., V)``.
    targets : numpy.ndarray of int
        Class ids, ``logits.shape[:-1]``.
    ignore_index : int, optional
        Target value that marks padding (it may lie outside ``[0, V)``).
    label_smoothing : float
        :math:`\epsilon` in ``[0, 1]``.

    Returns
    -------
    loss : float
        The mean loss.
    grad_logits : numpy.ndarray
        :math:`\partial\,\text{loss} / \partial\,\text{logits}`, shape and dtype of ``logits``.
    """
    logits = float_array(logits, "logits", min_ndim=1)
    if not np.isfinite(logits).all():
        raise NonFiniteError(f"logits must be finite, got NaN or inf in {describe(logits)}")
    targets, counted = _check_targets(targets, logits, ignore_index)
    eps = _check_smoothing(label_smoothing)
    n_classes = logits.shape[-1]
    z = logits.reshape(-1, n_classes)  # (N, V)
    rows = np.arange(z.shape[0])
    ids = np.where(counted, targets, 0).reshape(-1)  # ignored rows point at class 0, then vanish
    weight = counted.reshape(-1)
    n = int(weight.sum())
    if n == 0:
        return 0.0, np.zeros_like(logits)
    log_p = log_softmax(z)  # (N, V)
    per_row = -(1.0 - eps) * log_p[rows, ids] - eps * log_p.mean(axis=-1)  # (N,)
    loss = float(per_row[weight].sum()) / n
    grad = np.exp(log_p)  # softmax, (N, V)
    grad -= eps / n_classes
    grad[rows, ids] -= 1.0 - eps
    grad *= (weight / n).astype(logits.dtype)[:, None]
    return loss, grad.reshape(logits.shape)
