r"""Parity of a bit string, answered directly or after a scratchpad of running parities.

A row starts with :math:`n` random bits :math:`b_1 \dots b_n` and a separator.
Answered *directly*, the next token is the parity
:math:`a = b_1 \oplus \dots \oplus b_n`. With a *scratchpad*, the model first
writes the running parities, then a second separator, then the answer:

.. math::
    p_i = p_{i-1} \oplus b_i \quad (p_0 = 0), \qquad
    \text{direct: } b_1 \dots b_n \,\texttt{|}\, a, \qquad
    \text{scratchpad: } b_1 \dots b_n \,\texttt{|}\, p_1 \dots p_n \,\texttt{|}\, a,

and :math:`a = p_n`. Each scratchpad token is the XOR of two tokens the row
already holds (the previous running parity and one input bit), so every step
is a fixed, local computation; the direct answer depends on all :math:`n`
bits at once. Tokens: 0 and 1 for bits and parities, :data:`SEPARATOR` (2)
for the separator.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import as_array, describe, generator, positive_int

__all__ = [
    "SEPARATOR",
    "VOCAB_SIZE",
    "bit_strings",
    "final_answers",
    "parity_rows",
]

SEPARATOR = 2
"""The token between the bits and what follows them, and before the scratchpad's answer."""

VOCAB_SIZE = 3
"""Tokens 0 and 1 (bits, parities) and :data:`SEPARATOR`."""


def _bits(bits: object, name: str = "bits") -> np.ndarray:
    """``bits`` as a non-empty ``(N, n)`` int64 array of zeros and ones, else raise."""
    arr = as_array(bits, name)
    if arr.dtype.kind not in "iub":
        raise TypeError(f"{name} must be an integer array of 0s and 1s, got {describe(arr)}")
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must have shape (N, n) with N, n >= 1, got shape {arr.shape}")
    if not np.isin(arr, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0 and 1, got values {np.unique(arr)}")
    return arr.astype(np.int64)


def bit_strings(
    n_strings: int,
    n_bits: int,
    *,
    rng: np.random.Generator,
    exclude: object = None,
) -> np.ndarray:
    """Uniform random bit strings, none equal to a row of ``exclude``.

    Parameters
    ----------
    n_strings, n_bits : int
        How many strings, of how many bits (at most 62).
    rng : numpy.random.Generator
    exclude : array_like of int, optional
        ``(M, n_bits)`` strings never to return (a held-out set); strings that
        match one are drawn again.

    Returns
    -------
    numpy.ndarray of int64
        ``(n_strings, n_bits)``, entries 0 or 1.
    """
    n_strings = positive_int(n_strings, "n_strings")
    n_bits = positive_int(n_bits, "n_bits")
    if n_bits > 62:
        raise ValueError(f"n_bits must be at most 62 (strings are drawn as int64), got {n_bits}")
    rng = generator(rng)
    weights = 2 ** np.arange(n_bits, dtype=np.int64)  # (n,)
    banned = np.empty(0, np.int64)
    if exclude is not None:
        excluded = _bits(exclude, "exclude")
        if excluded.shape[1] != n_bits:
            raise ValueError(
                f"exclude must have n_bits = {n_bits} columns, got shape {excluded.shape}"
            )
        banned = excluded @ weights  # (M,)
        if np.unique(banned).size >= 2**n_bits:
            raise ValueError(f"exclude holds every one of the 2**{n_bits} strings")
    codes = rng.integers(0, 2**n_bits, size=n_strings, dtype=np.int64)  # (N,)
    while (clash := np.isin(codes, banned)).any():
        codes[clash] = rng.integers(0, 2**n_bits, size=int(clash.sum()), dtype=np.int64)
    return (codes[:, None] >> np.arange(n_bits)) & 1  # (N, n)


def parity_rows(bits: object, *, scratchpad: bool) -> tuple[np.ndarray, np.ndarray]:
    r"""Token rows for ``bits`` and which of their tokens a model is trained to produce.

    Parameters
    ----------
    bits : array_like of int
        ``(N, n)`` zeros and ones.
    scratchpad : bool
        ``False``: rows ``b | a`` of :math:`n + 2` tokens; ``True``: rows
        ``b | p | a`` of :math:`2n + 3` tokens (see the module).

    Returns
    -------
    rows : numpy.ndarray of int64
        ``(N, n + 2)`` or ``(N, 2n + 3)``; the prompt is the first :math:`n + 1`
        tokens (bits and separator).
    produced : numpy.ndarray of bool
        Same shape: True for the tokens after the prompt, the ones a model writes.
    """
    bits = _bits(bits)
    if not isinstance(scratchpad, bool):
        raise TypeError(f"scratchpad must be True or False, got {describe(scratchpad)}")
    n = bits.shape[1]
    running = np.cumsum(bits, axis=1) % 2  # (N, n): p_1 .. p_n
    separator = np.full((len(bits), 1), SEPARATOR, dtype=np.int64)
    answer = running[:, -1:]  # (N, 1): a = p_n
    parts = (
        [bits, separator, running, separator, answer] if scratchpad else [bits, separator, answer]
    )
    rows = np.concatenate(parts, axis=1)  # (N, n + 2) or (N, 2n + 3)
    produced = np.zeros(rows.shape, dtype=bool)
    produced[:, n + 1 :] = True
    return rows, produced


def final_answers(continuations: object, n_bits: int, *, scratchpad: bool) -> np.ndarray:
    """The answer each continuation gives, or -1 where it breaks the format.

    A direct continuation's answer is its first token. A scratchpad
    continuation must hold :math:`n` bits (0 or 1), the separator, then the
    answer; a continuation whose separator is missing, misplaced or repeated
    among the first :math:`n` tokens gives -1. An answer that is not a bit
    also gives -1. Whether the :math:`n` scratchpad bits are the right running
    parities is not checked: only the answer is scored.

    Parameters
    ----------
    continuations : array_like of int
        ``(N, m)``: the tokens a model wrote after the prompt.
    n_bits : int
        :math:`n`, the number of bits of the prompt.
    scratchpad : bool

    Returns
    -------
    numpy.ndarray of int64
        ``(N,)``: 0, 1 or -1.
    """
    tokens = as_array(continuations, "continuations")
    if tokens.dtype.kind not in "iu" or tokens.ndim != 2:
        raise TypeError(f"continuations must be a 2-D integer array, got {describe(tokens)}")
    n = positive_int(n_bits, "n_bits")
    if not isinstance(scratchpad, bool):
        raise TypeError(f"scratchpad must be True or False, got {describe(scratchpad)}")
    where = n + 1 if scratchpad else 0  # index of the answer in the continuation
    if tokens.shape[1] <= where:
        raise ValueError(
            f"continuations must have at least {where + 1} tokens for n_bits={n}"
            f" (scratchpad={scratchpad}), got shape {tokens.shape}"
        )
    answer = tokens[:, where].astype(np.int64)  # (N,)
    valid = np.isin(answer, (0, 1))
    if scratchpad:
        valid &= tokens[:, n] == SEPARATOR
        valid &= np.isin(tokens[:, :n], (0, 1)).all(axis=1)  # n bits before the separator
    return np.where(valid, answer, -1)
