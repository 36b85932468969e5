"""Input checks shared by the three model families: token ids, masks and decode states."""

from __future__ import annotations

import numpy as np

from tinyformer._validation import as_array, broadcasts_to, describe
from tinyformer.masks import causal_mask
from tinyformer.models.state import DecodeState


def check_ids(
    ids: object, name: str, vocab_size: int, context_length: int | None, limit: str
) -> np.ndarray:
    """``ids`` as a non-empty ``(B, T)`` integer array of ids below ``vocab_size``.

    ``T`` must not exceed ``context_length`` (the config field named by ``limit``).
    """
    arr = as_array(ids, name)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array of token ids, got {describe(arr)}")
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(
            f"{name} must be a non-empty array of shape (batch, length), got shape {arr.shape}"
        )
    if context_length is not None and arr.shape[1] > context_length:
        raise ValueError(
            f"{name} has length {arr.shape[1]}, longer than the model's {limit}={context_length}"
        )
    low, high = int(arr.min()), int(arr.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} must be token ids in [0, {vocab_size}), got {low if low < 0 else high}"
        )
    return arr


def check_mask(mask: object, name: str, shape: tuple[int, int, int]) -> np.ndarray:
    """A boolean ``mask`` that broadcasts to ``shape`` without changing it."""
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be a boolean array (True = may attend), got {describe(arr)}")
    return broadcasts_to(arr, name, shape, "the shape")


def check_state(state: object, owner: object, n_tokens: int, batch: int) -> DecodeState:
    """``state`` if it was made by ``owner.start`` and fits ``batch`` rows of ``n_tokens``."""
    if not isinstance(state, DecodeState):
        raise TypeError(f"state must be a DecodeState from start(), got {describe(state)}")
    if state._owner is not owner:
        raise ValueError(
            f"state was made by another model ({type(state._owner).__name__} at"
            f" {id(state._owner):#x}): pass a state from this model's start()"
        )
    if batch != state.batch_size:
        raise ValueError(
            f"tokens has {batch} rows but the state decodes {state.batch_size} sequences"
        )
    limit = owner.context_length  # type: ignore[attr-defined]
    if state.length + n_tokens > limit:
        raise ValueError(
            f"tokens would take the decoder to {state.length + n_tokens} positions (the state"
            f" holds {state.length}, tokens adds {n_tokens}), beyond the model's limit of"
            f" {limit} (context_length)"
        )
    return state


class CausalMasks:
    """Causal masks by size, made once and reused (they never change)."""

    def __init__(self) -> None:
        self._masks: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, n_queries: int, n_keys: int) -> np.ndarray:
        """``causal_mask(n_queries, n_keys)``, read-only."""
        key = (n_queries, n_keys)
        mask = self._masks.get(key)
        if mask is None:
            mask = causal_mask(n_queries, n_keys)
            mask.flags.writeable = False
            self._masks[key] = mask
        return mask
