"""The live exercise of the chapter on common mistakes: check a batch's targets against its inputs."""

from __future__ import annotations

import numpy as np

from tinyformer.diagnostics import target_alignment
from tinyformer.exercises import Case, Exercise


def target_agreement(inputs, targets, max_offset=2):
    """:func:`~tinyformer.diagnostics.target_alignment`'s shares as an array, offset -K first."""
    agreement = target_alignment(inputs, targets, max_offset).agreement
    return np.array([agreement[k] for k in range(-max_offset, max_offset + 1)])


def _rolled(inputs, targets, max_offset=2):
    """Shifts the inputs with np.roll, so positions past the window's end wrap around to its start."""
    return np.array(
        [
            np.mean(targets == np.roll(inputs, -k, axis=1))
            for k in range(-max_offset, max_offset + 1)
        ]
    )


def _shift_reversed(inputs, targets, max_offset=2):
    """Compares targets[:, t + k] with inputs[:, t]: the offset's sign is flipped."""
    t = inputs.shape[1]
    shares = []
    for k in range(-max_offset, max_offset + 1):
        y = targets[:, max(0, k) : t + min(0, k)]
        x = inputs[:, max(0, -k) : t - max(0, k)]
        shares.append(np.mean(y == x))
    return np.array(shares)


def _over_whole_window(inputs, targets, max_offset=2):
    """Counts matches correctly but divides by B * T, not by the pairs that exist at that offset."""
    t = inputs.shape[1]
    shares = []
    for k in range(-max_offset, max_offset + 1):
        y = targets[:, max(0, -k) : t - max(0, k)]
        x = inputs[:, max(0, k) : t + min(0, k)]
        shares.append(np.sum(y == x) / inputs.size)
    return np.array(shares)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 50, size=(4, 13))  # (B, T + 1): four windows of a token stream
    inputs, targets = stream[:, :-1], stream[:, 1:]  # (4, 12) each
    few = np.random.default_rng(1).integers(
        0, 3, size=(3, 9)
    )  # a vocabulary of 3: many chance matches
    return [
        Case((inputs, targets), label="a batch shifted by one, as a language model's should be"),
        Case((inputs, inputs.copy()), label="targets equal to the inputs (the shift forgotten)"),
        Case((targets, inputs), label="inputs and targets swapped"),
        Case((few[:, :-1], few[:, 1:], 3), label="three symbols only, offsets up to 3"),
    ]


TARGET_AGREEMENT = Exercise(
    chapter="mistakes",
    name="target_agreement",
    stub='''\
def target_agreement(inputs, targets, max_offset=2):
    """How often a batch's targets equal its inputs moved by each offset.

    inputs, targets: integer token ids, both of shape (B, T), with T > max_offset.
    For each offset k = -max_offset, ..., max_offset, the share of the pairs (b, t)
    with 0 <= t + k < T (the positions whose shifted input lies inside the window;
    nothing wraps around) where targets[b, t] == inputs[b, t + k].
    Returns a float array of shape (2 * max_offset + 1,), entry i for k = i - max_offset.
    A language model's batch gives 1.0 at k = +1.
    """
    raise NotImplementedError
''',
    reference=target_agreement,
    cases=_cases,
    rtol=1e-12,
    atol=1e-12,
    mistakes=(_rolled, _shift_reversed, _over_whole_window),
)
"""Measure the offset at which the targets follow the inputs (the chapter's targets section)."""
