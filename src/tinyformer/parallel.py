r"""Data, tensor and pipeline parallelism, simulated on one machine.

Each "device" here is a slice of an array or a step of a loop, and each collective
operation is a sum of arrays whose size is logged, so the arithmetic of each scheme (what is
split, what is exchanged, how much) can be run and checked without a cluster.

- **Data parallelism**: every replica holds the whole model and a slice of the batch; after
  the backward pass the replicas average their gradients (one all-reduce of every gradient).
  PyTorch's ``nn.DataParallel`` and ``DistributedDataParallel`` do this.
- **Tensor parallelism** :cite:p:`shoeybi2019megatron`: the weight matrices of one layer are
  split across devices. The feed-forward network's first matrix by columns and its second by
  rows, attention's projections by heads, so each sub-layer needs a single all-reduce of its
  output in the forward pass.
- **Pipeline parallelism** :cite:p:`huang2019gpipe`: consecutive blocks live on consecutive
  devices and the batch is cut into micro-batches that flow through them;
  :func:`gpipe_schedule` simulates the schedule and its idle time (the bubble).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tinyformer._validation import describe, positive_int
from tinyformer.attention import _attention
from tinyformer.feedforward import _FUNCTIONS, FeedForward
from tinyformer.layers import Linear
from tinyformer.module import Module
from tinyformer.multihead import MultiHeadAttention, _layer_mask

__all__ = [
    "Communication",
    "PipelineSchedule",
    "all_reduce",
    "data_parallel_gradients",
    "gpipe_schedule",
    "tensor_parallel_attention",
    "tensor_parallel_feed_forward",
]


@dataclass
class Communication:
    """A log of simulated all-reduce operations.

    Attributes
    ----------
    payload_bytes : list of int
        Size of the array each device contributes, one entry per all-reduce.
    """

    payload_bytes: list[int] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """Sum of the payloads."""
        return sum(self.payload_bytes)


def all_reduce(parts: list[np.ndarray], log: Communication | None = None) -> np.ndarray:
    """Sum one array from each device; every device receives the sum (returned once here).

    A ring all-reduce over :math:`p` devices sends and receives :math:`2(p-1)/p` times
    the payload per device; the log records the payload.
    """
    if not parts:
        raise ValueError("parts must hold one array per device, got none")
    if log is not None:
        log.payload_bytes.append(int(parts[0].nbytes))
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def _devices(n_devices: object, divides: int, what: str) -> int:
    n = positive_int(n_devices, "n_devices")
    if divides % n:
        raise ValueError(f"n_devices must divide {what}={divides}, got n_devices={n}")
    return n


# ------------------------------------------------------------------ data parallel
def data_parallel_gradients(
    model: Module,
    loss_and_grad: Callable[[Module, np.ndarray], np.ndarray],
    batch: np.ndarray,
    n_replicas: int,
    log: Communication | None = None,
) -> dict[str, np.ndarray]:
    r"""Gradients averaged over ``n_replicas`` equal slices of ``batch``.

    Each replica runs ``loss_and_grad(model, slice)``, which must run the forward and
    backward pass of a loss that is a *mean* over its slice (and may return anything).
    With equal slices the mean of the slices' mean gradients is the whole batch's mean
    gradient:

    .. math:: \frac{1}{R}\sum_{r=1}^{R} \frac{1}{n}\sum_{i \in S_r} \nabla \ell_i
              = \frac{1}{Rn}\sum_{i=1}^{Rn} \nabla \ell_i

    The model's own gradients are left zeroed; the averaged ones are returned by name.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    n = _devices(n_replicas, len(batch), "the batch size")
    replicas = []
    for shard in np.split(batch, n):  # one replica's slice of the batch
        model.zero_grad()
        loss_and_grad(model, shard)
        replicas.append({name: p.grad.copy() for name, p in model.named_parameters()})
    model.zero_grad()
    return {
        name: all_reduce([r[name] for r in replicas], log) / n  # the all-reduce of gradients
        for name in replicas[0]
    }


# ---------------------------------------------------------------- tensor parallel
def tensor_parallel_feed_forward(
    ffn: FeedForward, x: np.ndarray, n_devices: int, log: Communication | None = None
) -> np.ndarray:
    r"""The feed-forward network with :math:`W_1` split by columns and :math:`W_2` by rows.

    Device :math:`j` holds columns :math:`W_1^{(j)}` (and their biases) and the matching
    rows :math:`W_2^{(j)}`; the activation acts entry by entry, so no exchange is needed
    between the two products, and one all-reduce adds the partial outputs:

    .. math:: \operatorname{FFN}(x) = \sum_j \phi\bigl(x W_1^{(j)} + b_1^{(j)}\bigr) W_2^{(j)} + b_2
    """
    if not isinstance(ffn, FeedForward) or ffn.gated:
        raise TypeError(f"ffn must be a FeedForward that is not gated, got {describe(ffn)}")
    n = _devices(n_devices, ffn.d_ff, "d_ff")
    phi = _FUNCTIONS[ffn.activation][0]
    w1, w2 = ffn.linear_in.weight.value, ffn.linear_out.weight.value
    b1 = ffn.linear_in.bias.value if ffn.linear_in.bias is not None else np.zeros(ffn.d_ff)
    partial = []
    for cols in np.split(np.arange(ffn.d_ff), n):  # the hidden units of device j
        hidden = phi(x @ w1[:, cols] + b1[cols])  # (..., d_ff / n), on device j only
        partial.append(hidden @ w2[cols])  # (..., d_model), a partial sum
    out = all_reduce(partial, log)
    if ffn.linear_out.bias is not None:
        out += ffn.linear_out.bias.value
    return out


def tensor_parallel_attention(
    attention: MultiHeadAttention,
    x: np.ndarray,
    n_devices: int,
    mask: np.ndarray | None = None,
    log: Communication | None = None,
) -> np.ndarray:
    r"""Self-attention with the heads split across devices.

    Device :math:`j` holds the columns of :math:`W_Q, W_K, W_V` of its heads and the
    matching rows of :math:`W_O`; each head needs only its own queries, keys and values,
    and one all-reduce adds the devices' shares of the output projection:

    .. math:: \operatorname{MHA}(x) = \sum_j \operatorname{concat}_{i \in H_j}
              (\text{head}_i)\, W_O^{(j)} + b_O
    """
    if not isinstance(attention, MultiHeadAttention) or attention.rotary:
        raise TypeError(
            f"attention must be a MultiHeadAttention without rotary positions,"
            f" got {describe(attention)}"
        )
    if attention.n_kv_heads != attention.n_heads:
        raise ValueError(
            "attention must have one key/value head per query head (this split gives each"
            f" device whole heads), got n_kv_heads={attention.n_kv_heads} for"
            f" n_heads={attention.n_heads}"
        )
    h, d_k = attention.n_heads, attention.d_k
    n = _devices(n_devices, h, "n_heads")
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    b, t = x.shape[:2]
    allowed = None if mask is None else _layer_mask(mask, (b, t, t))  # (B, 1, T, T) or less
    partial = []
    for heads in np.split(np.arange(h), n):  # device j's heads
        cols = np.concatenate([np.arange(i * d_k, (i + 1) * d_k) for i in heads])
        q, k, v = (_columns(x, linear, cols) for linear in projections)
        q, k, v = (a.reshape(b, t, len(heads), d_k).swapaxes(1, 2) for a in (q, k, v))
        mixed, _ = _attention(q, k, v, allowed, attention.scale, None)  # (B, h/n, T, d_k)
        merged = mixed.swapaxes(1, 2).reshape(b, t, len(cols))  # (B, T, d/n)
        partial.append(merged @ attention.out_proj.weight.value[cols])  # device j's share
    out = all_reduce(partial, log)  # (B, T, d)
    if attention.out_proj.bias is not None:
        out += attention.out_proj.bias.value
    return out


def _columns(x: np.ndarray, linear: Linear, cols: np.ndarray) -> np.ndarray:
    """The columns ``cols`` of ``linear``'s output: what a device holding them computes."""
    out = x @ linear.weight.value[:, cols]
    return out if linear.bias is None else out + linear.bias.value[cols]


# -------------------------------------------------------------- pipeline parallel
@dataclass(frozen=True)
class PipelineSchedule:
    """A simulated GPipe schedule.

    Attributes
    ----------
    grid : numpy.ndarray of int
        ``(n_stages, n_slots)``: at each time slot, the micro-batch a stage works on,
        as ``j + 1`` for its forward pass, ``-(j + 1)`` for its backward pass, 0 when idle.
    bubble_fraction : float
        Share of the stage-slots spent idle.
    """

    grid: np.ndarray
    bubble_fraction: float


def gpipe_schedule(n_stages: int, n_microbatches: int, backward_cost: int = 2) -> PipelineSchedule:
    r"""Simulate GPipe: all forward passes, then all backward passes, stage by stage.

    A stage starts a micro-batch's forward pass once it is free and the previous stage has
    finished that micro-batch; backward passes run in reverse order of stages after the last
    forward pass. A forward pass takes one slot and a backward pass ``backward_cost`` slots.
    Every stage is busy :math:`m(1 + c)` slots of :math:`(m + p - 1)(1 + c)`, so the idle
    fraction is

    .. math:: \frac{p - 1}{m + p - 1}

    for :math:`p` stages and :math:`m` micro-batches, whatever the backward cost.
    """
    p = positive_int(n_stages, "n_stages")
    m = positive_int(n_microbatches, "n_microbatches")
    c = positive_int(backward_cost, "backward_cost")
    done = np.zeros((p, m), dtype=int)  # slot at which stage s finished the forward of j
    free = np.zeros(p, dtype=int)
    events = []
    for j in range(m):
        for s in range(p):
            start = max(free[s], done[s - 1, j] if s else 0)
            done[s, j] = free[s] = start + 1
            events.append((s, start, 1, j + 1))
    back = np.zeros((p, m), dtype=int)
    flush = free.max()  # GPipe waits for every forward pass before the first backward pass
    free[:] = flush
    for j in range(m):
        for s in reversed(range(p)):
            start = max(free[s], back[s + 1, j] if s < p - 1 else 0)
            back[s, j] = free[s] = start + c
            events.append((s, start, c, -(j + 1)))
    grid = np.zeros((p, int(free.max())), dtype=int)
    for s, start, length, label in events:
        grid[s, start : start + length] = label
    return PipelineSchedule(grid, float(np.mean(grid == 0)))
