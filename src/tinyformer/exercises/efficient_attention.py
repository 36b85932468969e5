"""The live exercise of the chapter on efficient attention: attention with an online softmax."""

from __future__ import annotations

import numpy as np

from tinyformer.efficient import tiled_attention
from tinyformer.exercises import Case, Exercise


def _online_reference(q, k, v, block_size):
    """tiled_attention without a mask, as (output, log_sum_exp)."""
    return tiled_attention(q, k, v, block_size=block_size)


def _tiles(q, k, v, block_size, *, correct_acc=True, shift=True):
    scale = 1.0 / np.sqrt(q.shape[-1])
    m = np.full((*q.shape[:-1], 1), -np.inf)
    ell = np.zeros((*q.shape[:-1], 1))
    acc = np.zeros((*q.shape[:-1], v.shape[-1]))
    for start in range(0, k.shape[-2], block_size):
        scores = q @ np.swapaxes(k[..., start : start + block_size, :], -1, -2) * scale
        m_new = np.maximum(m, scores.max(axis=-1, keepdims=True)) if shift else np.zeros_like(m)
        p = np.exp(scores - m_new)
        correction = np.exp(m - m_new) if shift else np.ones_like(m)
        ell = ell * correction + p.sum(axis=-1, keepdims=True)
        acc = (acc * correction if correct_acc else acc) + p @ v[
            ..., start : start + block_size, :
        ]
        m = m_new
    return acc / ell, (m + np.log(ell))[..., 0]


def _uncorrected_output(q, k, v, block_size):
    """Rescales the running sum when the maximum grows, but not the running output."""
    return _tiles(q, k, v, block_size, correct_acc=False)


def _no_running_max(q, k, v, block_size):
    """Exponentiates the raw scores, with no running maximum: large scores overflow."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _tiles(q, k, v, block_size, shift=False)


def _lse_without_max(q, k, v, block_size):
    """Returns log(running sum) as the log-sum-exp, forgetting to add the running maximum."""
    output, lse = _tiles(q, k, v, block_size)
    m = (q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])).max(axis=-1)
    return output, lse - m


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 6, 4))
    batch_q = rng.standard_normal((2, 5, 8))
    batch_k, batch_v = rng.standard_normal((2, 2, 11, 8))
    noise = rng.standard_normal((10, 4))
    large_q, large_k = 25.0 * rng.standard_normal((2, 4, 4))
    large_v = rng.standard_normal((4, 3))
    # Keys near one positive direction, longer and longer, read by positive queries: every
    # query's largest score rises from each tile of 3 to the next, so its maximum moves 3 times.
    growing_k = np.linspace(0.5, 3.0, 10)[:, None] * (1.0 + 0.2 * noise)  # (10, 4)
    growing_q = np.abs(rng.standard_normal((7, 4))) + 0.2  # (7, 4)
    growing_v = rng.standard_normal((10, 3))
    return [
        Case((q, k, v, 2), label="6 queries and keys in tiles of 2"),
        Case(
            (batch_q, batch_k, batch_v, 4),
            label="a batch of 2 with 11 keys in tiles of 4 (the last has 3)",
        ),
        Case(
            (growing_q, growing_k, growing_v, 3),
            label="keys whose scores grow from tile to tile",
        ),
        Case((large_q, large_k, large_v, 2), label="scores in the hundreds (exp overflows)"),
        Case((q, k, v, 16), label="one tile larger than all 6 keys"),
    ]


ONLINE_ATTENTION = Exercise(
    chapter="efficient_attention",
    name="online_attention",
    stub='''\
def online_attention(q, k, v, block_size):
    """Softmax attention computed one tile of keys at a time, with an online softmax.

    q: (..., T_q, d_k), k: (..., T_k, d_k), v: (..., T_k, d_v), float64; no mask.
    Scores are q @ k^T / sqrt(d_k). Visit the keys in tiles of block_size (the last
    tile may be shorter), keeping per query a running maximum m of the scores seen,
    a running sum l of exp(score - m) and a running output a = sum of exp(score - m) * v;
    when m grows, rescale what l and a already hold by exp(m_old - m_new).
    Returns (output, log_sum_exp): output = a / l, shape (..., T_q, d_v), equal to
    softmax(scores) @ v; log_sum_exp = m + log(l), shape (..., T_q), the log of the
    sum over all keys of exp(score).
    """
    raise NotImplementedError
''',
    reference=_online_reference,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    parts=("output", "log_sum_exp"),
    mistakes=(_uncorrected_output, _no_running_max, _lse_without_max),
)
"""Write attention over tiles of keys with the online softmax, rescaling the running output too."""
