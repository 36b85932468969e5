"""Padded batches of (source, target) pairs for an encoder-decoder model.

Teacher forcing: the decoder reads the target shifted one step to the right
(``<bos>`` in front) and learns to predict the target followed by ``<eos>``.
For a target ``y_1 .. y_n``::

    decoder input   <bos>  y_1  y_2  ...  y_n
    decoder target   y_1   y_2  y_3  ...  <eos>

so the prediction at position ``t`` sees only ``y_1 .. y_{t}`` (plus the
source) and must produce ``y_{t+1}``. Sequences of different lengths are
padded with ``<pad>`` to the longest one in the batch; the masks keep padding
out of attention and out of the loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tinyformer._validation import describe, generator, non_negative_int, positive_int
from tinyformer.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from tinyformer.masks import causal_mask, combine_masks, padding_mask

__all__ = ["Batch", "PairDataset", "make_batch", "pad_sequences", "teacher_forcing"]


def _sequence(seq: object, name: str, pad_id: int | None) -> np.ndarray:
    """``seq`` as a non-empty 1-D int64 array of non-negative ids, none equal to ``pad_id``."""
    arr = np.asarray(seq)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be a sequence of integer token ids, got {describe(arr)}")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of ids, got shape {arr.shape}")
    if arr.min() < 0:
        raise ValueError(f"{name} must hold non-negative token ids, got minimum {arr.min()}")
    if pad_id is not None and (arr == pad_id).any():
        raise ValueError(f"{name} contains the padding id {pad_id}, which would be masked out")
    return arr.astype(np.int64)


def _sequences(seqs: Sequence[object], name: str, pad_id: int | None) -> list[np.ndarray]:
    """Check many sequences at once; on a problem, name the first bad one as ``name[i]``."""
    arrays = [np.asarray(s) for s in seqs]
    shapes_ok = all(a.dtype.kind in "iu" and a.ndim == 1 and a.size for a in arrays)
    if shapes_ok and arrays:
        flat = np.concatenate(arrays)
        if flat.min() >= 0 and (pad_id is None or not (flat == pad_id).any()):
            return [a.astype(np.int64, copy=False) for a in arrays]
    return [_sequence(a, f"{name}[{i}]", pad_id) for i, a in enumerate(arrays)]


def pad_sequences(
    sequences: Sequence[np.ndarray], *, pad_id: int = PAD_ID, length: int | None = None
) -> np.ndarray:
    """Stack sequences of ids into one array, padding each on the right with ``pad_id``.

    Parameters
    ----------
    sequences : list of numpy.ndarray
        1-D integer id sequences; at least one, none empty.
    pad_id : int
        The padding id (must not occur inside the sequences).
    length : int, optional
        Width of the result; defaults to the longest sequence.

    Returns
    -------
    numpy.ndarray of int
        Shape ``(B, length)``.
    """
    pad_id = non_negative_int(pad_id, "pad_id")
    if isinstance(sequences, np.ndarray | str) or not isinstance(sequences, Sequence):
        raise TypeError(f"sequences must be a list of 1-D id arrays, got {describe(sequences)}")
    if not sequences:
        raise ValueError("sequences must hold at least one sequence, got none")
    seqs = _sequences(sequences, "sequences", pad_id)
    longest = max(len(s) for s in seqs)
    width = longest if length is None else positive_int(length, "length")
    if width < longest:
        raise ValueError(f"length must be at least the longest sequence ({longest}), got {width}")
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)  # (B, L)
    for row, s in zip(out, seqs, strict=True):
        row[: len(s)] = s
    return out


def teacher_forcing(
    target: np.ndarray, *, bos_id: int = BOS_ID, eos_id: int = EOS_ID
) -> tuple[np.ndarray, np.ndarray]:
    """The decoder's input ``<bos> + target`` and its labels ``target + <eos>``.

    Both have length ``len(target) + 1``: label ``t`` is the token that must
    follow input tokens ``0 .. t``.
    """
    target = _sequence(target, "target", pad_id=None)
    bos = np.array([non_negative_int(bos_id, "bos_id")], dtype=np.int64)
    eos = np.array([non_negative_int(eos_id, "eos_id")], dtype=np.int64)
    return np.concatenate([bos, target]), np.concatenate([target, eos])


@dataclass(frozen=True)
class Batch:
    """A padded batch for an encoder-decoder model, with the masks it needs.

    The attention masks follow the book's convention: boolean, True where a
    query may attend to a key, broadcasting against scores ``(B, T_q, T_k)``.

    Attributes
    ----------
    source_ids : numpy.ndarray of int
        ``(B, S)``, the encoder's input, padded.
    decoder_input_ids : numpy.ndarray of int
        ``(B, T)``, ``<bos>`` + target, padded.
    target_ids : numpy.ndarray of int
        ``(B, T)``, target + ``<eos>``, padded: the labels.
    source_mask : numpy.ndarray of bool
        ``(B, 1, S)``, hides padded source positions; used by the encoder's
        self-attention and by the decoder's cross-attention.
    decoder_mask : numpy.ndarray of bool
        ``(B, T, T)``, causal and hiding padded decoder positions.
    loss_mask : numpy.ndarray of bool
        ``(B, T)``, True at the labels that count in the loss (not padding).
    """

    source_ids: np.ndarray
    decoder_input_ids: np.ndarray
    target_ids: np.ndarray
    source_mask: np.ndarray
    decoder_mask: np.ndarray
    loss_mask: np.ndarray

    @property
    def batch_size(self) -> int:
        """Number of pairs ``B``."""
        return self.source_ids.shape[0]

    @property
    def n_target_tokens(self) -> int:
        """Number of labels that count in the loss (``<eos>`` included, padding not)."""
        return int(self.loss_mask.sum())


def make_batch(
    sources: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    *,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> Batch:
    """Pad ``sources`` and ``targets``, shift the targets for teacher forcing, build the masks.

    Parameters
    ----------
    sources, targets : list of numpy.ndarray
        1-D integer id sequences; pair ``i`` is ``(sources[i], targets[i])``; lengths may differ.
    pad_id, bos_id, eos_id : int
        The special ids (by default those of :mod:`tinyformer.data.tokenizers`).

    Returns
    -------
    Batch
    """
    if len(sources) != len(targets):
        raise ValueError(
            f"sources and targets must pair up, got {len(sources)} sources and"
            f" {len(targets)} targets"
        )
    pad_id = non_negative_int(pad_id, "pad_id")
    if pad_id in (bos_id, eos_id):
        raise ValueError(
            f"pad_id must differ from bos_id and eos_id, got pad_id={pad_id},"
            f" bos_id={bos_id}, eos_id={eos_id}"
        )
    sources = _sequences(sources, "sources", pad_id)
    targets = _sequences(targets, "targets", pad_id)
    source_ids = pad_sequences(sources, pad_id=pad_id)  # (B, S)
    shifted = [teacher_forcing(t, bos_id=bos_id, eos_id=eos_id) for t in targets]
    decoder_input_ids = pad_sequences([i for i, _ in shifted], pad_id=pad_id)  # (B, T)
    target_ids = pad_sequences([t for _, t in shifted], pad_id=pad_id)  # (B, T)
    n_steps = decoder_input_ids.shape[1]
    return Batch(
        source_ids=source_ids,
        decoder_input_ids=decoder_input_ids,
        target_ids=target_ids,
        source_mask=padding_mask(source_ids, pad_id),  # (B, 1, S)
        decoder_mask=combine_masks(
            causal_mask(n_steps), padding_mask(decoder_input_ids, pad_id)
        ),  # (B, T, T)
        loss_mask=target_ids != pad_id,  # (B, T)
    )


class PairDataset:
    """A list of (source, target) id sequences that hands out padded batches.

    Parameters
    ----------
    sources, targets : list of numpy.ndarray
        1-D integer id sequences, the pairs; ``len(sources) == len(targets) >= 1``.
    """

    def __init__(self, sources: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> None:
        if len(sources) != len(targets):
            raise ValueError(
                f"sources and targets must pair up, got {len(sources)} sources and"
                f" {len(targets)} targets"
            )
        if not sources:
            raise ValueError("a PairDataset needs at least one pair, got none")
        self.sources = _sequences(sources, "sources", PAD_ID)
        self.targets = _sequences(targets, "targets", PAD_ID)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.sources[i], self.targets[i]

    def batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """The pairs at ``indices`` as one padded :class:`~tinyformer.data.batching.Batch`."""
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" or idx.ndim != 1 or idx.size == 0:
            raise ValueError(f"indices must be a non-empty 1-D integer array, got {describe(idx)}")
        if idx.min() < 0 or idx.max() >= len(self):
            raise ValueError(f"indices must be in [0, {len(self)}), got {idx.min()}..{idx.max()}")
        return make_batch([self.sources[i] for i in idx], [self.targets[i] for i in idx])

    def batches(
        self, batch_size: int, *, rng: np.random.Generator | None = None, drop_last: bool = False
    ) -> Iterator[Batch]:
        """One pass over the data in batches of ``batch_size`` pairs.

        With ``rng`` the order is a fresh permutation drawn from it (the
        shuffled mini-batches of training); without, the stored order. The last
        batch may be smaller unless ``drop_last``.
        """
        batch_size = positive_int(batch_size, "batch_size")
        order = np.arange(len(self)) if rng is None else generator(rng).permutation(len(self))
        stop = len(self) - len(self) % batch_size if drop_last else len(self)
        for start in range(0, stop, batch_size):
            yield self.batch(order[start : start + batch_size])
