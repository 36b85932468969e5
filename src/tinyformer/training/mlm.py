r"""The masked-language-model objective: cross-entropy at the chosen positions only.

The model reads the corrupted windows of a
:class:`~tinyformer.data.masking.MaskedTokens` batch and is scored, as in
:cite:t:`devlin2019bert` (section 3.1), only where the corruption chose a
position (replaced by ``[MASK]``, by a random token, or kept): elsewhere the
answer is in the input and there is nothing to learn.
"""

from __future__ import annotations

from typing import Any

from tinyformer._validation import describe
from tinyformer.data.masking import MaskedTokens
from tinyformer.training.objectives import StepResult, _score

__all__ = ["mlm_loss"]


def mlm_loss(
    model: Any, batch: MaskedTokens, *, label_smoothing: float = 0.0, backward: bool = True
) -> StepResult:
    r"""Mean cross-entropy of ``model`` at the chosen positions of ``batch``.

    .. math::
        L = -\frac{1}{|S|} \sum_{(b, t) \in S} \log \operatorname{softmax}(z_{b,t})_{x_{b,t}}

    with :math:`S` the chosen positions, :math:`z = \text{model}(\tilde x)` and
    :math:`x` the clean tokens. Positions outside :math:`S` get a zero gradient.

    Parameters
    ----------
    model : EncoderOnlyMLM
        Anything with ``forward(ids) -> logits (B, T, V)`` and ``backward(grad_logits)``.
    batch : MaskedTokens
    label_smoothing : float
    backward : bool
        Whether to run the backward pass (False for evaluation).

    Returns
    -------
    StepResult
        ``n_tokens`` counts the chosen positions.
    """
    if not isinstance(batch, MaskedTokens):
        raise TypeError(
            f"batch must be a tinyformer.data.masking.MaskedTokens, got {describe(batch)}"
        )
    logits = model.forward(batch.inputs)  # (B, T, V)
    return _score(
        model,
        logits,
        batch.labels,  # -1 where not chosen
        batch.chosen,
        ignore_index=-1,
        label_smoothing=label_smoothing,
        backward=backward,
    )
