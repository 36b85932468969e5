r"""Serving many requests: a paged key/value cache and continuous batching.

A server holds the key/value caches of many sequences at once, and their lengths
are not known in advance. Two ideas from serving systems, both simulated here on
the model's own decoding path:

- **Paged cache** :cite:p:`kwon2023efficient`. Cache memory is a pool of fixed-size
  blocks of ``block_size`` positions. A sequence owns a :class:`BlockTable`, the
  list of its blocks in position order; position :math:`p` lives in block
  ``table[p // block_size]`` at offset ``p % block_size``. A block is taken from the
  free list only when a sequence reaches it, and returned when the sequence ends,
  so a sequence of :math:`n` positions holds :math:`\lceil n / b \rceil` blocks and
  wastes fewer than :math:`b` positions. :class:`PagedKVCache` is a
  :class:`~tinyformer.multihead.KVCache` that stores its positions in the pool, so
  the model's own attention layers decode with it (:func:`start_paged`).
- **Continuous batching** :cite:p:`yu2022orca`. :func:`serve` runs a queue of
  requests step by step. ``"static"`` forms a batch and runs it until its longest
  request finishes; ``"continuous"`` (iteration-level scheduling) refills a
  finished request's slot at the next step.

Every cache position is the key and value of :math:`h_{kv} d_k` numbers in each of
:math:`L` layers, so a block holds :math:`2 L b\, h_{kv} d_k` numbers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tinyformer._validation import (
    describe,
    generator,
    non_negative_int,
    positive_int,
    token_ids,
)
from tinyformer.multihead import KVCache

__all__ = [
    "BlockPool",
    "BlockTable",
    "PagedKVCache",
    "Request",
    "Reservation",
    "ServingTrace",
    "doubling_capacity",
    "kv_reservation",
    "random_requests",
    "serve",
    "start_paged",
]


def _blocks_for(n_positions: int, block_size: int) -> int:
    r""":math:`\lceil n / b \rceil`: blocks that hold ``n_positions`` positions."""
    return -(-n_positions // block_size)


class BlockPool:
    """``n_blocks`` cache blocks of ``block_size`` positions each, and a free list.

    Without ``layers`` the pool only counts blocks (for scheduling simulations);
    :meth:`for_model` also allocates their storage, for every layer of a model:
    ``keys`` and ``values`` of shape ``(L, n_blocks, h_kv, block_size, d_k)``. A block id
    names the same slot in every layer, so one :class:`BlockTable` serves them all.

    Parameters
    ----------
    n_blocks : int
        Blocks in the pool.
    block_size : int
        Positions per block :math:`b`.
    """

    def __init__(self, n_blocks: int, block_size: int) -> None:
        self.n_blocks = positive_int(n_blocks, "n_blocks")
        self.block_size = positive_int(block_size, "block_size")
        self._free = list(range(self.n_blocks - 1, -1, -1))  # pop() gives block 0 first
        self.keys: np.ndarray | None = None
        self.values: np.ndarray | None = None

    @classmethod
    def for_model(cls, model: Any, n_blocks: int, block_size: int) -> BlockPool:
        """A pool with storage for every self-attention layer of a decoder-only ``model``."""
        if getattr(model, "family", None) != "decoder-only":
            raise TypeError(f"model must be a DecoderOnlyLM, got {describe(model)}")
        pool = cls(n_blocks, block_size)
        c = model.config
        shape = (c.n_layers, pool.n_blocks, c.kv_heads, pool.block_size, c.d_k)
        pool.keys = np.zeros(shape, dtype=model.dtype)  # (L, n_blocks, h_kv, b, d_k)
        pool.values = np.zeros(shape, dtype=model.dtype)
        return pool

    @property
    def n_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def n_used(self) -> int:
        """Blocks some sequence holds."""
        return self.n_blocks - len(self._free)

    def allocate(self) -> int:
        """Take a block off the free list; ``MemoryError`` if none is left."""
        if not self._free:
            raise MemoryError(f"the pool's {self.n_blocks} blocks are all in use")
        return self._free.pop()

    def release(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` back on the free list."""
        for block in blocks:
            if not 0 <= block < self.n_blocks or block in self._free:
                raise ValueError(f"blocks must be ids in use in [0, {self.n_blocks}), got {block}")
            self._free.append(block)


class BlockTable:
    """One sequence's blocks, in position order; shared by all layers of the sequence."""

    def __init__(self, pool: BlockPool) -> None:
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {describe(pool)}")
        self.pool = pool
        self.blocks: list[int] = []

    def reserve(self, n_positions: int) -> None:
        """Take blocks from the pool until the table holds ``n_positions`` positions."""
        needed = _blocks_for(non_negative_int(n_positions, "n_positions"), self.pool.block_size)
        while len(self.blocks) < needed:
            self.blocks.append(self.pool.allocate())

    def shrink(self, n_positions: int) -> None:
        """Return the blocks past the first ``n_positions`` positions to the pool."""
        keep = _blocks_for(non_negative_int(n_positions, "n_positions"), self.pool.block_size)
        self.pool.release(self.blocks[keep:])
        del self.blocks[keep:]

    def release(self) -> None:
        """Return every block to the pool: the sequence has ended."""
        self.shrink(0)

    def slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Block ids and offsets of ``positions``: ``table[p // b]`` and ``p % b``."""
        b = self.pool.block_size
        return np.asarray(self.blocks)[positions // b], positions % b


class PagedKVCache(KVCache):
    r"""One layer's cache for a batch of sequences, stored in a :class:`BlockPool`'s blocks.

    The attention layer uses it as any :class:`~tinyformer.multihead.KVCache`:
    :meth:`append` writes the new keys and values into the sequences' blocks and
    returns all of them, gathered through the block tables in position order,
    ``(B, h_kv, T, d_k)``. A real kernel (vLLM's PagedAttention) reads the blocks
    in place instead of gathering a copy. Every row must have the same length, as
    in one call of the model's ``step``.

    Parameters
    ----------
    pool : BlockPool
        A pool with storage (:meth:`BlockPool.for_model`).
    layer : int
        Which layer's slots of the pool this cache uses.
    tables : sequence of BlockTable
        One per row of the batch.
    """

    def __init__(self, pool: BlockPool, layer: int, tables: Sequence[BlockTable]) -> None:
        super().__init__()
        if not isinstance(pool, BlockPool) or pool.keys is None:
            raise TypeError(
                f"pool must be a BlockPool with storage (for_model), got {describe(pool)}"
            )
        self.layer = non_negative_int(layer, "layer")
        if self.layer >= pool.keys.shape[0]:
            raise ValueError(
                f"layer must be below the pool's {pool.keys.shape[0]} layers, got {layer}"
            )
        self.tables = list(tables)
        if not self.tables or not all(
            isinstance(t, BlockTable) and t.pool is pool for t in self.tables
        ):
            raise ValueError("tables must be a non-empty sequence of BlockTables of this pool")
        self.pool = pool

    def _gather(self, store: np.ndarray, length: int) -> np.ndarray:
        """Positions ``0 .. length - 1`` of every row, from the blocks: ``(B, h_kv, length, d)``."""
        n = _blocks_for(length, self.pool.block_size)
        ids = np.array([table.blocks[:n] for table in self.tables])  # (B, n)
        blocks = store[self.layer][ids]  # (B, n, h_kv, b, d)
        b, _, h, size, d = blocks.shape
        return blocks.transpose(0, 2, 1, 3, 4).reshape(b, h, n * size, d)[:, :, :length]

    @property
    def keys(self) -> np.ndarray | None:
        """Cached keys, ``(B, h_kv, len(self), d_k)`` (a gathered copy), or ``None`` when empty."""
        return None if not self._length else self._gather(self.pool.keys, self._length)

    @property
    def values(self) -> np.ndarray | None:
        """Cached values, ``(B, h_kv, len(self), d_v)`` (a gathered copy), or ``None`` when empty."""
        return None if not self._length else self._gather(self.pool.values, self._length)

    def append(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write ``keys``/``values`` ``(B, h_kv, T, d_k)`` into the blocks; return all positions."""
        expected = (len(self.tables), *self.pool.keys.shape[2:3])
        if keys.ndim != 4 or keys.shape[:2] != expected or values.shape != keys.shape:
            raise ValueError(
                f"keys and values must have shape (B, h_kv, T, d_k) with (B, h_kv) = {expected},"
                f" got {keys.shape} and {values.shape}"
            )
        start, stop = self._length, self._length + keys.shape[2]
        positions = np.arange(start, stop)
        for row, table in enumerate(self.tables):
            table.reserve(stop)  # a no-op once an earlier layer has reserved the blocks
            ids, offsets = table.slots(positions)  # (T,), (T,)
            self.pool.keys[self.layer, ids, :, offsets] = keys[row].transpose(1, 0, 2)  # (T, h, d)
            self.pool.values[self.layer, ids, :, offsets] = values[row].transpose(1, 0, 2)
        self._length = stop
        return self.keys, self.values

    def reset(self) -> None:
        """Forget every position and return the rows' blocks to the pool."""
        self.truncate(0)

    def truncate(self, length: int) -> None:
        """Forget positions ``length`` and later; blocks no longer needed go back to the pool."""
        super().truncate(length)
        for table in self.tables:
            table.shrink(self._length)

    def select(self, indices: np.ndarray) -> KVCache:
        """Not supported: sharing blocks between rows needs reference counts (copy on write)."""
        raise NotImplementedError("a PagedKVCache cannot copy rows (vLLM shares blocks instead)")

    def copy(self) -> KVCache:
        """Not supported, as :meth:`select`."""
        raise NotImplementedError("a PagedKVCache cannot be copied")


def start_paged(model: Any, pool: BlockPool, batch_size: int = 1) -> tuple[Any, list[BlockTable]]:
    """``model.start(batch_size)`` with every self-attention cache replaced by a :class:`PagedKVCache`.

    Returns the decode state, which ``model.step`` extends as usual, and the rows'
    block tables; call ``table.release()`` when a row's sequence ends.
    """
    if pool.keys is None or pool.keys.shape[0] != model.config.n_layers:
        raise ValueError("pool must have storage for this model: BlockPool.for_model(model, ...)")
    expected = (model.config.kv_heads, model.config.d_k, model.dtype)
    if (pool.keys.shape[2], pool.keys.shape[4], pool.keys.dtype) != expected:
        raise ValueError(f"pool's (h_kv, d_k, dtype) must be {expected} for this model")
    state = model.start(batch_size)
    tables = [BlockTable(pool) for _ in range(batch_size)]
    for layer, cache in enumerate(state.caches):
        cache.self_attention = PagedKVCache(pool, layer, tables)
    return state, tables


@dataclass(frozen=True, eq=False)
class Request:
    """A prompt of token ids and the number of tokens to generate for it (no early stop)."""

    prompt: np.ndarray
    max_new_tokens: int

    def __post_init__(self) -> None:
        prompt = token_ids(self.prompt, "prompt")
        if prompt.ndim != 1 or prompt.size == 0:
            raise ValueError(
                f"prompt must be a non-empty 1-D array of ids, got shape {prompt.shape}"
            )
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(
            self, "max_new_tokens", positive_int(self.max_new_tokens, "max_new_tokens")
        )

    @property
    def positions(self) -> int:
        """The cache positions at the end (the prompt and every generated token but the last)."""
        return len(self.prompt) + self.max_new_tokens - 1


def random_requests(
    n: int,
    rng: np.random.Generator,
    *,
    prompt_lengths: tuple[int, int],
    output_lengths: tuple[int, int],
    vocab_size: int,
) -> list[Request]:
    """``n`` requests with prompt and output lengths uniform in the closed ranges given.

    The prompts' tokens are uniform over ``vocab_size`` ids; everything is drawn from ``rng``.
    """
    vocab_size = positive_int(vocab_size, "vocab_size")
    rng = generator(rng)
    for name, (low, high) in (
        ("prompt_lengths", prompt_lengths),
        ("output_lengths", output_lengths),
    ):
        if not 1 <= low <= high:
            raise ValueError(
                f"{name} must be (low, high) with 1 <= low <= high, got {(low, high)}"
            )
    prompts = rng.integers(prompt_lengths[0], prompt_lengths[1] + 1, positive_int(n, "n"))
    outputs = rng.integers(output_lengths[0], output_lengths[1] + 1, n)
    return [
        Request(rng.integers(0, vocab_size, p), int(m))
        for p, m in zip(prompts, outputs, strict=True)
    ]


@dataclass(frozen=True)
class Reservation:
    """Cache positions used and reserved by a set of sequences (see :func:`kv_reservation`)."""

    used: int
    contiguous: int
    paged: int


def kv_reservation(lengths: Sequence[int], *, max_length: int, block_size: int) -> Reservation:
    r"""Positions a set of sequences uses, and reserves under two allocation schemes.

    .. math::
        \text{used} = \sum_i n_i, \qquad
        \text{contiguous} = N\, n_\text{max}, \qquad
        \text{paged} = \sum_i b \lceil n_i / b \rceil < \text{used} + N b

    for :math:`N` sequences of lengths :math:`n_i \le n_\text{max}`: a static
    engine reserves the maximum length for every sequence; a paged cache holds
    whole blocks. Multiply by the bytes per position for bytes.
    """
    n = np.asarray(lengths)
    if n.ndim != 1 or n.size == 0 or n.dtype.kind not in "iu" or n.min() < 1:
        raise ValueError(
            f"lengths must be a non-empty 1-D array of positive integers, got {describe(n)}"
        )
    max_length, b = positive_int(max_length, "max_length"), positive_int(block_size, "block_size")
    if n.max() > max_length:
        raise ValueError(f"lengths must be at most max_length={max_length}, got {n.max()}")
    paged = int(sum(b * _blocks_for(int(x), b) for x in n))
    return Reservation(int(n.sum()), int(n.size * max_length), paged)


def doubling_capacity(prompt_length: int, length: int) -> int:
    r"""Positions a growing contiguous cache holds at the end (the rule of :class:`~tinyformer.multihead.KVCache`).

    A :class:`~tinyformer.multihead.KVCache` fed a prompt of :math:`p` positions and
    then one position per step starts with room for :math:`c_0 = \max(p, 16)` and
    doubles whenever it is full, so for a sequence that ends with :math:`n \ge p`
    positions it holds

    .. math::
        c = c_0\, 2^{k}, \qquad k = \min\{k \ge 0 : c_0\, 2^k \ge n\}.

    Each doubling copies the sequence's whole cache.
    """
    p, n = positive_int(prompt_length, "prompt_length"), positive_int(length, "length")
    if n < p:
        raise ValueError(f"length must be at least prompt_length={p}, got {n}")
    capacity = max(p, 16)
    while capacity < n:
        capacity *= 2
    return capacity


@dataclass
class ServingTrace:
    """What :func:`serve` did, step by step.

    Attributes
    ----------
    tokens : list of numpy.ndarray
        Each request's generated tokens (empty without a model).
    batch : numpy.ndarray
        Sequences in the batch at each step, ``(n_steps,)``; each produced one token.
    blocks : numpy.ndarray
        Blocks in use after each step, ``(n_steps,)``.
    finished : numpy.ndarray
        The step at which each request produced its last token, ``(n_requests,)``.
    positions : numpy.ndarray
        Cache positions held after each step, summed over the batch, ``(n_steps,)``.
    """

    tokens: list[np.ndarray]
    batch: np.ndarray
    blocks: np.ndarray
    finished: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))

    @property
    def n_steps(self) -> int:
        """Steps to finish every request."""
        return len(self.batch)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens produced per step (throughput in steps)."""
        return float(self.batch.sum() / len(self.batch))


def _admit(
    queue: deque[int],
    running: dict[int, Any],
    requests: Sequence[Request],
    pool: BlockPool,
    max_batch: int,
) -> list[int]:
    """Take requests from the front of the queue while a slot and their blocks are free.

    A request is admitted only if the blocks of its whole length fit beside what the
    running ones may still take, so no sequence ever waits for a block (no preemption).
    """
    committed = sum(_blocks_for(requests[i].positions, pool.block_size) for i in running)
    admitted = []
    while queue and len(running) + len(admitted) < max_batch:
        need = _blocks_for(requests[queue[0]].positions, pool.block_size)
        if committed + need > pool.n_blocks:
            break
        committed += need
        admitted.append(queue.popleft())
    return admitted


def serve(
    requests: Sequence[Request],
    *,
    policy: str,
    max_batch: int,
    pool: BlockPool,
    model: Any = None,
) -> ServingTrace:
    """Run ``requests`` (first come, first served) to the end; one step = one token per running request.

    ``policy="static"`` admits a new batch only when the whole batch has finished;
    ``"continuous"`` admits at every step. A request's first step feeds its prompt
    (prefill) and yields its first token; each later step feeds the last token. With a
    ``model`` (decoder-only, ``pool`` from :meth:`BlockPool.for_model`) the tokens are
    greedy and computed through :func:`start_paged`, one request at a time (a real
    engine runs the step's requests as one ragged batch); without one, only the
    schedule and the blocks are simulated, with the same bookkeeping.

    Parameters
    ----------
    requests : sequence of Request
        The queue, in order of arrival.
    policy : str
        When waiting requests may join the batch: ``"static"`` (once the whole batch has
        finished) or ``"continuous"`` (at every step, into any free place).
    max_batch : int
        Most requests in a step.
    pool : BlockPool
        The cache blocks; with a ``model``, from :meth:`BlockPool.for_model`.
    model : DecoderOnlyLM, optional
        Decode for real (greedy), through the model's own ``step``.

    Returns
    -------
    ServingTrace
        Tokens; batch size, blocks and cache positions in use per step; and when each
        request finished.
    """
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    if not isinstance(pool, BlockPool):
        raise TypeError(f"pool must be a BlockPool, got {describe(pool)}")
    max_batch = positive_int(max_batch, "max_batch")
    if len(requests) == 0:
        raise ValueError("requests must be a non-empty sequence of Request, got none")
    queue = deque(range(len(requests)))
    running: dict[int, Any] = {}  # request -> (decode state or None, [its block table])
    tokens: list[list[int]] = [[] for _ in requests]
    batch, blocks, positions = [], [], []
    finished = np.zeros(len(requests), dtype=int)
    while queue or running:
        if policy == "continuous" or not running:
            for i in _admit(queue, running, requests, pool, max_batch):
                running[i] = (
                    start_paged(model, pool) if model is not None else (None, [BlockTable(pool)])
                )
        if not running:
            raise ValueError(
                f"request {queue[0]} needs more blocks than the pool's {pool.n_blocks}"
            )
        for i, (state, (table,)) in running.items():
            request, done = requests[i], len(tokens[i])
            new = request.prompt if done == 0 else np.array(tokens[i][-1:])  # (n,)
            # the positions this step leaves in the cache
            table.reserve(len(request.prompt) + done)
            if model is None:
                tokens[i].append(-1)
            else:
                logits = model.step(new[None, :], state)  # (1, n, V)
                tokens[i].append(int(np.argmax(logits[0, -1])))
        batch.append(len(running))
        blocks.append(pool.n_used)
        positions.append(sum(len(requests[i].prompt) + len(tokens[i]) - 1 for i in running))
        for i in [i for i in running if len(tokens[i]) == requests[i].max_new_tokens]:
            running.pop(i)[1][0].release()
            finished[i] = len(batch) - 1
    out = [np.array(t if model is not None else [], dtype=np.int64) for t in tokens]
    return ServingTrace(out, np.array(batch), np.array(blocks), finished, np.array(positions))
