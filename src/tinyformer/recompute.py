r"""Gradient checkpointing: keep a segment's input, recompute its activations in backward.

A stack of :math:`L` blocks normally keeps every block's activations from the forward pass
until the backward pass reaches it. :class:`Checkpointed` runs a segment of consecutive
blocks, then throws their saved state away and keeps only the segment's input (and the
random-generator states of its dropout layers). Its backward pass runs the segment's forward
again from that input, which rebuilds exactly the saved state, and then runs the ordinary
backward :cite:p:`chen2016training`. Memory falls from :math:`L` blocks' activations to
:math:`L/k` segment inputs plus one segment's activations; compute rises by one extra
forward pass of the blocks. Segments of :math:`k \approx \sqrt{L}` blocks make the memory
:math:`O(\sqrt{L})`.

(Not to be confused with :mod:`tinyformer.checkpoint`, which saves a training run to disk.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tinyformer._validation import describe, non_negative_int, positive_int
from tinyformer.layers import Dropout
from tinyformer.module import Module

__all__ = ["Checkpointed", "checkpoint_blocks", "uncheckpoint_blocks"]


def _stacks(model: Module) -> list[Module]:
    """The modules of ``model`` that hold their blocks in a ``layers`` list (its stacks)."""
    return [m for m in model.modules() if isinstance(vars(m).get("layers"), list)]


class Checkpointed(Module):
    """A segment of blocks run with gradient checkpointing.

    Parameters
    ----------
    blocks : sequence of Module
        Consecutive blocks, each taking the previous one's output; every block is called
        with the same extra arguments (masks, encoder memory).
    first : int
        Index of the first block in its stack (for the parameters' names).

    Notes
    -----
    The wrapper adds no parameters and no names:
    :meth:`~tinyformer.module.Module.named_parameters` and
    :meth:`~tinyformer.module.Module.state_dict` list the blocks' parameters as if the
    blocks stood in the stack directly (``decoder.layers.0...``). With a
    key/value ``cache`` (step-by-step decoding, no backward) the blocks run normally.
    """

    def __init__(self, blocks: Sequence[Module], *, first: int = 0) -> None:
        super().__init__()
        self.first = non_negative_int(first, "first")
        blocks = list(blocks) if isinstance(blocks, list | tuple) else blocks
        if not isinstance(blocks, list) or not blocks:
            raise TypeError(f"blocks must be a non-empty list of Modules, got {describe(blocks)}")
        for i, block in enumerate(blocks):
            if not isinstance(block, Module) or isinstance(block, Checkpointed):
                raise TypeError(f"blocks[{i}] must be a block (a Module), got {describe(block)}")
        self.blocks = blocks
        self._dropout_rngs = list(
            {
                id(m.rng): m.rng for b in blocks for m in b.modules() if isinstance(m, Dropout)
            }.values()
        )

    def _children(self):  # the blocks' own names, as if no wrapper were there
        for i, block in enumerate(self.blocks):
            yield str(i), block

    def _named_parameters(self, prefix: str, seen: set[int]):
        stack = prefix[: prefix.rstrip(".").rfind(".") + 1]  # "layers.3." -> "layers."
        for i, block in enumerate(self.blocks):
            yield from block._named_parameters(f"{stack}{self.first + i}.", seen)

    def _run(self, x: np.ndarray, args: tuple, kwargs: dict) -> np.ndarray:
        for block in self.blocks:
            x = block.forward(x, *args, **kwargs)
        return x

    def forward(self, x: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        """Run the blocks; keep only ``x``, the arguments and the dropout generators' states."""
        if kwargs.get("cache") is not None:  # inference with a key/value cache: nothing to save
            return self._run(x, args, kwargs)
        states = [rng.bit_generator.state for rng in self._dropout_rngs]
        out = self._run(x, args, kwargs)
        for block in self.blocks:  # drop every activation the blocks saved
            for m in block.modules():
                m._cache = None
                if hasattr(m, "attention_weights"):
                    m.attention_weights = None
        self._save(x, args, kwargs, states)
        return out

    def backward(self, grad_out: np.ndarray) -> Any:
        """Recompute the blocks' forward from the kept input, then back through them."""
        x, args, kwargs, states = self._saved()
        after = [rng.bit_generator.state for rng in self._dropout_rngs]
        for rng, state in zip(self._dropout_rngs, states, strict=True):
            rng.bit_generator.state = state  # the same dropout masks as the first time
        self._run(x, args, kwargs)
        for rng, state in zip(self._dropout_rngs, after, strict=True):
            rng.bit_generator.state = state
        grad, other = grad_out, None
        for block in reversed(self.blocks):
            grads = block.backward(grad)
            if isinstance(grads, tuple):  # (grad_x, grad_memory): memory feeds every block
                grad = grads[0]
                other = grads[1] if other is None else other + grads[1]
            else:
                grad = grads
        return grad if other is None else (grad, other)


def checkpoint_blocks(model: Module, segment: int = 1) -> Module:
    r"""Wrap the model's stacks of blocks in :class:`Checkpointed` segments, in place.

    Parameters
    ----------
    model : Module
        A model whose stacks (:class:`~tinyformer.models.stack.TransformerStack`, one or
        two) hold their blocks in a ``layers`` list, or such a stack itself.
    segment : int
        Blocks per segment: 1 keeps every block's input, :math:`\sqrt{L}` is the choice
        of :cite:t:`chen2016training`. The encoder-decoder's decoder stack needs 1 if the
        model is also used for step-by-step decoding (one cache per block).

    Returns
    -------
    Module
        ``model`` itself; :func:`uncheckpoint_blocks` undoes the wrapping.
    """
    segment = positive_int(segment, "segment")
    stacks = _stacks(model)
    if not stacks:
        raise TypeError(
            f"model must hold its blocks in a list named layers (a stack), got {describe(model)}"
        )
    uncheckpoint_blocks(model)
    for stack in stacks:
        blocks = stack.layers  # type: ignore[attr-defined]
        stack.layers = [  # type: ignore[attr-defined]
            Checkpointed(blocks[i : i + segment], first=i) for i in range(0, len(blocks), segment)
        ]
    return model


def uncheckpoint_blocks(model: Module) -> Module:
    """Put the blocks of :func:`checkpoint_blocks` back in place; return ``model``."""
    for stack in _stacks(model):
        blocks = []
        for item in stack.layers:  # type: ignore[attr-defined]
            blocks.extend(item.blocks if isinstance(item, Checkpointed) else [item])
        stack.layers = blocks  # type: ignore[attr-defined]
    return model
