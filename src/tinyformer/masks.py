"""Boolean attention masks: True where a query may attend to a key.

Every builder returns an array that broadcasts against scores of shape
``(B, T_q, T_k)``; the functions of :mod:`tinyformer.attention` and the layers
take it as it is. Combine masks with :func:`combine_masks` (a key must be allowed by
all of them).
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import describe, positive_int, token_ids

__all__ = [
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "sliding_window_mask",
    "strided_mask",
]


def _offsets(n_queries: int, n_keys: int) -> np.ndarray:
    """``i - j`` for query ``i`` and key ``j``, with queries aligned to the last keys."""
    rows = np.arange(n_queries)[:, None] + (n_keys - n_queries)
    return rows - np.arange(n_keys)[None, :]  # (T_q, T_k)


def causal_mask(n_queries: int, n_keys: int | None = None) -> np.ndarray:
    """Mask that lets each position attend to itself and to earlier positions only.

    With ``n_keys > n_queries`` the queries are the *last* ``n_queries``
    positions (as when decoding with a key/value cache): query ``i`` sits at
    position ``i + n_keys - n_queries``.

    Returns
    -------
    numpy.ndarray of bool
        Shape ``(n_queries, n_keys)``, lower triangular when the two are equal.
    """
    t_q = positive_int(n_queries, "n_queries")
    t_k = t_q if n_keys is None else positive_int(n_keys, "n_keys")
    if t_k < t_q:
        raise ValueError(
            f"n_keys must be at least n_queries (queries are the last positions), got"
            f" n_queries={t_q} and n_keys={t_k}"
        )
    return _offsets(t_q, t_k) >= 0


def padding_mask(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """Mask that hides padding keys from every query.

    Parameters
    ----------
    ids : numpy.ndarray of int
        Token ids of the keys' sequence, shape ``(B, T_k)``.
    pad_id : int
        The id used for padding.

    Returns
    -------
    numpy.ndarray of bool
        Shape ``(B, 1, T_k)``: True for real tokens, broadcasting over queries.
        Scores already split into heads, ``(B, h, T_q, T_k)``, need a head axis as well:
        ``mask[:, None]`` (shape ``(B, 1, 1, T_k)``). Without it NumPy aligns the
        sequence axis with the head axis; :class:`~tinyformer.multihead.MultiHeadAttention`
        inserts that axis itself.
    """
    ids = token_ids(ids, "ids")
    if ids.ndim != 2:
        raise ValueError(f"ids must have shape (B, T), got shape {ids.shape}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int | np.integer):
        raise TypeError(f"pad_id must be an integer, got {describe(pad_id)}")
    return (ids != pad_id)[:, None, :]


def sliding_window_mask(seq_len: int, window: int, *, causal: bool = True) -> np.ndarray:
    """Local attention: each query sees only keys within ``window`` positions.

    Causal: query ``i`` sees keys ``i - window + 1 .. i`` (the ``window`` most
    recent positions, itself included). Bidirectional: keys with
    ``|i - j| < window``.

    Returns
    -------
    numpy.ndarray of bool
        Shape ``(seq_len, seq_len)``.
    """
    n = positive_int(seq_len, "seq_len")
    w = positive_int(window, "window")
    offset = _offsets(n, n)
    near = np.abs(offset) < w
    return near & (offset >= 0) if causal else near


def strided_mask(seq_len: int, stride: int, *, causal: bool = True) -> np.ndarray:
    r"""The strided sparse pattern of :cite:t:`child2019sparse`.

    Every query attends; what is thinned out is the set of *keys* each one
    sees. Query ``i`` sees the keys within ``stride`` positions of it (local
    part) and every key at a distance that is a multiple of ``stride`` (strided
    part). With ``stride`` near :math:`\sqrt{n}`, each query sees about
    :math:`2\sqrt{n}` keys instead of :math:`n`, and two layers of the pattern
    connect every position to every later one.

    Returns
    -------
    numpy.ndarray of bool
        Shape ``(seq_len, seq_len)``.
    """
    n = positive_int(seq_len, "seq_len")
    s = positive_int(stride, "stride")
    offset = _offsets(n, n)
    allowed = (np.abs(offset) < s) | (offset % s == 0)
    return allowed & (offset >= 0) if causal else allowed


def combine_masks(*masks: np.ndarray | None) -> np.ndarray | None:
    """Intersect masks: a key is allowed only where every mask allows it.

    ``None`` entries (no mask) are skipped; with no masks left the result is
    ``None``. Shapes must broadcast together, e.g. a ``(T, T)`` causal mask
    with a ``(B, 1, T)`` padding mask gives ``(B, T, T)``.
    """
    present = [np.asarray(m) for m in masks if m is not None]
    for i, m in enumerate(present):
        if m.dtype != np.bool_:
            raise TypeError(f"masks[{i}] must be a boolean array, got dtype {m.dtype}")
    if not present:
        return None
    try:
        np.broadcast_shapes(*(m.shape for m in present))
    except ValueError:
        shapes = [m.shape for m in present]
        raise ValueError(f"masks must broadcast together, got shapes {shapes}") from None
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out
