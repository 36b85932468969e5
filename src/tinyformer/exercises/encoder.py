"""The live exercise of the chapter on the encoder: what a corrupted token says about the clean one."""

from __future__ import annotations

import numpy as np

from tinyformer.data.masking import MaskingScheme
from tinyformer.exercises import Case, Exercise


def _emissions(seen, vocab_size, mask_id, select_prob, chosen):
    """The package's emission probabilities, BERT's 80/10/10 split."""
    scheme = MaskingScheme(vocab_size, mask_id=mask_id, select_prob=select_prob)
    return scheme.likelihoods(seen, chosen=chosen)


def _parts(seen, vocab_size, mask_id, select_prob, chosen):
    rho = 1.0 if chosen else select_prob
    same = np.arange(vocab_size) == seen[..., None]  # (B, T, V)
    is_mask = (seen == mask_id)[..., None]  # (B, T, 1)
    return rho, same, is_mask


def _random_never_original(seen, vocab_size, mask_id, select_prob, chosen):
    """Lets a random replacement land only on the other tokens, never on the original."""
    rho, same, is_mask = _parts(seen, vocab_size, mask_id, select_prob, chosen)
    other = ~same * rho * 0.1 / (vocab_size - 1)
    return np.where(is_mask, rho * 0.8, (1 - rho + rho * 0.1) * same + other)


def _mask_certain(seen, vocab_size, mask_id, select_prob, chosen):
    """Gives [MASK] the probability 0.8, forgetting that the position had to be chosen first."""
    rho, same, is_mask = _parts(seen, vocab_size, mask_id, select_prob, chosen)
    return np.where(is_mask, 0.8, (1 - rho + rho * 0.1) * same + rho * 0.1 / vocab_size)


def _ignores_chosen(seen, vocab_size, mask_id, select_prob, chosen):  # noqa: ARG001 - the point
    """Uses select_prob even when the position is known to be chosen."""
    return _emissions(seen, vocab_size, mask_id, select_prob, chosen=False)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    tiny = np.array([[0, 3, 2, 1], [1, 1, 3, 3]])  # the chapter's brute-force windows
    windows = rng.integers(0, 17, (3, 12))  # 16 symbols and [MASK] = 16
    return [
        Case((tiny, 3, 3, 0.3, False), label="3 symbols with select_prob 0.3 and chosen=False"),
        Case((tiny.copy(), 3, 3, 0.3, True), label="the same windows with chosen=True"),
        Case((windows, 16, 16, 0.15, False), label="16 symbols with BERT's select_prob 0.15"),
        Case((np.array([[0, 7, 1, 7]]), 2, 7, 0.5, True),
             label="2 symbols, [MASK] = 7 and chosen=True"),
    ]  # fmt: skip


EMISSIONS = Exercise(
    chapter="encoder",
    name="emissions",
    stub='''\
def emissions(seen, vocab_size, mask_id, select_prob, chosen):
    """How likely each clean token is to show up as what we see, under BERT's corruption.

    Corruption: each position is chosen with probability select_prob; a chosen token is
    replaced by [MASK] (id mask_id) with probability 0.8, by a token drawn uniformly from
    the vocab_size ordinary ids 0 .. vocab_size - 1 with probability 0.1, and kept with
    probability 0.1. seen: (B, T) integer array of corrupted ids (ordinary ids or mask_id).
    chosen: False if the position may or may not have been chosen; True if it was.
    Returns e of shape (B, T, vocab_size) with e[b, t, v] = P(seen[b, t] | clean token v).
    """
    raise NotImplementedError
''',
    reference=_emissions,
    cases=_cases,
    rtol=1e-12,
    atol=1e-15,
    mistakes=(_random_never_original, _mask_certain, _ignores_chosen),
)
"""Write BERT's corruption as a likelihood: the chance of each reading given each clean token."""
