r"""The roofline: what limits a computation, arithmetic or memory traffic.

A computation that performs :math:`F` floating-point operations and moves :math:`Q`
bytes between memory and the processor has the *arithmetic intensity*
:math:`I = F / Q` (FLOPs per byte). On a machine that computes at most :math:`P`
FLOP/s and moves at most :math:`\beta` bytes/s it can attain at most
:cite:p:`williams2009roofline`

.. math::
    \text{attainable}(I) = \min(P,\; I \beta),

a sloped roof for small :math:`I` (memory-bound) that meets the flat one (compute-bound)
at the *machine balance* :math:`I^* = P / \beta` (McCalpin's term
:cite:p:`mccalpin1995stream`; Williams et al. call this corner the ridge point).
Williams et al. call :math:`I` the *operational* intensity and count the bytes that
actually reach memory past the caches; the functions here count the least traffic a
computation needs, so their intensities are upper bounds on it.

- :class:`Work`: FLOPs and bytes of one computation; its intensity.
- :func:`matmul_work`, :func:`attention_work`, :func:`layernorm_work`,
  :func:`prefill_work`, :func:`decode_step_work`: both counted from shapes.
- :func:`attainable`: the roof at a given intensity.
- :class:`Kernel`, :func:`matmul_kernel`, :func:`copy_kernel`, :func:`read_kernel`:
  computations that measure the machine's peak FLOP/s and bandwidth when timed
  (with :func:`~tinyformer.timing.timed_rounds`).
- :func:`cache_sizes`: the processor's cache sizes, where the system reports them.

Bytes are those the computation must read and write at least once (its inputs and
outputs); caches can only add traffic to that, never remove it, once the data are far
larger than the caches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyformer._validation import describe, positive_int
from tinyformer.cost import forward_flops
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.counting import parameter_terms

__all__ = [
    "LAYERNORM_FLOPS_PER_ELEMENT",
    "Kernel",
    "Work",
    "attainable",
    "attention_work",
    "cache_sizes",
    "copy_kernel",
    "decode_step_work",
    "layernorm_work",
    "matmul_kernel",
    "matmul_work",
    "prefill_work",
    "read_kernel",
    "weight_bytes",
]


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes of one computation.

    Attributes
    ----------
    flops : int
        Floating-point operations (a multiply-add counts two).
    nbytes : int
        Bytes read from and written to memory.
    """

    flops: int
    nbytes: int

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte."""
        return self.flops / self.nbytes


def _itemsize(itemsize: object) -> int:
    return positive_int(itemsize, "itemsize")


def matmul_work(m: int, k: int, n: int, *, itemsize: int = 4) -> Work:
    r"""A product of an ``(m, k)`` and a ``(k, n)`` matrix.

    .. math:: F = 2mkn, \qquad Q = s\,(mk + kn + mn)

    with :math:`s` bytes per number: both inputs read once, the output written once.
    A square product of size :math:`n` has :math:`I = 2n / (3s)`, growing with
    :math:`n`: large products are compute-bound.
    """
    m, k, n = (positive_int(v, name) for v, name in ((m, "m"), (k, "k"), (n, "n")))
    return Work(2 * m * k * n, _itemsize(itemsize) * (m * k + k * n + m * n))


def attention_work(
    seq_len: int,
    d_model: int,
    n_heads: int,
    *,
    batch_size: int = 1,
    itemsize: int = 4,
    materialized: bool = True,
) -> Work:
    r"""Scaled dot-product attention of ``n_heads`` heads over ``seq_len`` positions.

    .. math::
        F = B\,(\underbrace{2T^2 d}_{QK^\top} + \underbrace{2T^2 d}_{AV}), \qquad
        Q = s\,B\,(\underbrace{4Td}_{Q,K,V \text{ in}, O \text{ out}}
        + \underbrace{4hT^2}_{\text{scores, weights}})

    :math:`d = h d_k`. With ``materialized=True`` (the standard implementation, the
    book's) the scores are written, read by the softmax, its weights written and read
    again by the product with :math:`V`: :math:`4hT^2` numbers, and the intensity
    :math:`Td / (s(d + hT))` stays below :math:`d_k / s` at any length. With ``False``
    (a fused, tiled kernel such as FlashAttention) only :math:`Q, K, V` and the output
    move, and the intensity :math:`T / s` grows with the length. The softmax's few
    operations per score and the causal mask's saving are left out.
    """
    t, d = positive_int(seq_len, "seq_len"), positive_int(d_model, "d_model")
    h, b = positive_int(n_heads, "n_heads"), positive_int(batch_size, "batch_size")
    if d % h:
        raise ValueError(f"d_model must be divisible by n_heads, got {d} and {h}")
    if not isinstance(materialized, bool):
        raise TypeError(f"materialized must be True or False, got {describe(materialized)}")
    numbers = 4 * t * d + (4 * h * t * t if materialized else 0)
    return Work(b * 4 * t * t * d, _itemsize(itemsize) * b * numbers)


LAYERNORM_FLOPS_PER_ELEMENT = 7
"""Mean (1 add), centring (1 subtract), variance (1 multiply, 1 add), scaling by
:math:`1/\\sigma` (1 multiply), gain (1 multiply) and bias (1 add) per element."""


def layernorm_work(rows: int, d_model: int, *, itemsize: int = 4) -> Work:
    r"""LayerNorm over ``rows`` vectors of width ``d_model``.

    .. math:: F = 7Nd, \qquad Q = s\,(2Nd + 2d)

    (:data:`LAYERNORM_FLOPS_PER_ELEMENT`; the square root and division once per row
    are left out): the input read, the output written, the gain and bias read.
    Its intensity stays below :math:`7/(2s)` whatever the size: always memory-bound.
    """
    n, d = positive_int(rows, "rows"), positive_int(d_model, "d_model")
    return Work(LAYERNORM_FLOPS_PER_ELEMENT * n * d, _itemsize(itemsize) * (2 * n * d + 2 * d))


def _decoder_config(config: object) -> DecoderOnlyConfig:
    if not isinstance(config, DecoderOnlyConfig):
        raise TypeError(f"config must be a DecoderOnlyConfig, got {describe(config)}")
    return config


def weight_bytes(config: DecoderOnlyConfig, positions: int = 1) -> int:
    r"""Bytes of weights a forward pass over ``positions`` positions reads.

    Every parameter once, except the learned position table, of which only the
    ``positions`` rows in use are read (the token table is read whole by the output
    layer it is tied to, or by the separate output projection). A decode step reads one
    position's row, whatever the batch size.
    """
    c = _decoder_config(config)
    n = positive_int(positions, "positions")
    if n > c.context_length:
        raise ValueError(f"positions must be at most context_length={c.context_length}, got {n}")
    terms = parameter_terms(c)
    rows = n * c.d_model if terms["positions"] else 0
    return np.dtype(c.dtype).itemsize * (sum(terms.values()) - terms["positions"] + rows)


def decode_step_work(config: DecoderOnlyConfig, cache_length: int, batch_size: int = 1) -> Work:
    r"""One decode step: ``batch_size`` new tokens, each attending to ``cache_length`` cached ones.

    .. math::
        F &= B\bigl(L(8d^2 + 4d\,d_\text{ff} + 4(T+1)d) + 2dV\bigr),\\
        Q &= s\bigl(N_\text{read} + 2LB(T+1)d_{kv}\bigr)

    (:func:`~tinyformer.cost.forward_flops` for one position, with attention over the
    :math:`T + 1` positions now in the cache; :math:`N_\text{read}` the weights of
    :func:`weight_bytes`; the cache's keys and values read, the new ones written).
    The activations, a few vectors of width :math:`d` per sequence, are left out. Each
    weight is read once and used for :math:`2B` FLOPs, so :math:`I \approx B / s`:
    at batch size 1 in float32, half a FLOP per byte.
    """
    c = _decoder_config(config)
    t = positive_int(cache_length, "cache_length")
    b = positive_int(batch_size, "batch_size")
    if t + 1 > c.context_length:
        raise ValueError(f"cache_length must be below context_length={c.context_length}, got {t}")
    terms = forward_flops(c, 1, b)
    terms["attention scores and mixing"] = c.n_layers * b * 4 * (t + 1) * c.d_model
    cache = 2 * c.n_layers * b * (t + 1) * c.kv_heads * c.d_k * np.dtype(c.dtype).itemsize
    return Work(int(sum(terms.values())), weight_bytes(c, 1) + cache)


def prefill_work(config: DecoderOnlyConfig, seq_len: int, batch_size: int = 1) -> Work:
    r"""The prefill: a prompt of ``seq_len`` tokens in one forward pass, its cache written.

    .. math:: F = C_\text{fwd}(T, B), \qquad Q = s\,(N_\text{read} + 2LBTd_{kv})

    (:func:`~tinyformer.cost.forward_flops`; every weight read once and used for all
    :math:`BT` positions, so :math:`I \approx BT/s`.) The activations that travel
    between layers are left out, so this is the least traffic, and the intensity an
    upper bound.
    """
    c = _decoder_config(config)
    t = positive_int(seq_len, "seq_len")
    b = positive_int(batch_size, "batch_size")
    flops = int(sum(forward_flops(c, t, b).values()))
    cache = 2 * c.n_layers * b * t * c.kv_heads * c.d_k * np.dtype(c.dtype).itemsize
    return Work(flops, weight_bytes(c, t) + cache)


def attainable(intensity: float | np.ndarray, peak: float, bandwidth: float) -> np.ndarray:
    r"""The roof, :math:`\min(P, I\beta)`, in FLOP/s, at each intensity :math:`I`."""
    intensity = np.asarray(intensity, dtype=np.float64)
    if not (np.all(np.isfinite(intensity)) and np.all(intensity > 0)):
        raise ValueError("intensity must be positive and finite")
    for value, name in ((peak, "peak"), (bandwidth, "bandwidth")):
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
            raise TypeError(f"{name} must be a positive number, got {describe(value)}")
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value}")
    return np.minimum(float(peak), intensity * float(bandwidth))


# ------------------------------------------------------------------ measurements
@dataclass(frozen=True)
class Kernel:
    """A computation to time, with the work one call does.

    Attributes
    ----------
    name : str
    run : callable
        Called with no arguments; does the work once.
    work : Work
    """

    name: str
    run: Callable[[], object]
    work: Work


def _generator(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {describe(rng)}")
    return rng


def matmul_kernel(size: int, rng: np.random.Generator, dtype: str = "float32") -> Kernel:
    r"""A square float product ``a @ b`` of ``size``: the peak FLOP/s (:math:`2n^3` FLOPs).

    The BLAS library runs it at close to the processor's vector-unit peak once
    :math:`n` is a few hundred; it uses as many threads as the BLAS library is allowed.
    """
    n = positive_int(size, "size")
    gen = _generator(rng)
    a = gen.standard_normal((n, n)).astype(dtype)  # (n, n)
    b = gen.standard_normal((n, n)).astype(dtype)  # (n, n)
    out = np.empty((n, n), dtype=dtype)
    return Kernel(
        f"matmul {n}", lambda: np.matmul(a, b, out=out), matmul_work(n, n, n, itemsize=a.itemsize)
    )


def copy_kernel(nbytes: int, dtype: str = "float32") -> Kernel:
    """STREAM's copy, ``b[:] = a``, over ``nbytes`` per array: bytes moved ``2 * nbytes``.

    STREAM's convention :cite:p:`mccalpin1995stream`: the array read and the array
    written count once each. (A processor that first reads a line it will overwrite,
    as write-allocate caches do, moves more; the count leaves that out, so the
    measured rate is a lower bound on what the memory system delivered.) Arrays must
    be far larger than the last-level cache to measure memory rather than cache.
    """
    itemsize = np.dtype(dtype).itemsize
    n = positive_int(nbytes, "nbytes") // itemsize
    if n == 0:
        raise ValueError(f"nbytes must hold at least one {dtype}, got {nbytes}")
    a = np.ones(n, dtype=dtype)
    b = np.empty(n, dtype=dtype)
    b.fill(0)  # touch every page now, so that no timed call pays for a first touch
    return Kernel("copy", lambda: np.copyto(b, a), Work(0, 2 * a.nbytes))


def read_kernel(nbytes: int, rng: np.random.Generator, dtype: str = "float32") -> Kernel:
    r"""A matrix-vector product ``x @ W`` over a matrix of about ``nbytes``: a read stream.

    Each weight is read once and used for one multiply-add, :math:`I = 2/s`, so the
    product is limited by reading :math:`W`; this is the operation a decode step
    repeats for each weight matrix. Bytes: :math:`W`, :math:`x` and :math:`y`.
    """
    itemsize = np.dtype(dtype).itemsize
    n = int(np.sqrt(positive_int(nbytes, "nbytes") // itemsize))
    if n == 0:
        raise ValueError(f"nbytes must hold at least one {dtype}, got {nbytes}")
    gen = _generator(rng)
    w = gen.random((n, n), dtype=np.float32).astype(dtype, copy=False)  # (n, n), in [0, 1)
    x = gen.random(n, dtype=np.float32).astype(dtype, copy=False)  # (n,)
    out = np.empty(n, dtype=dtype)
    work = Work(2 * n * n, itemsize * (n * n + 2 * n))
    return Kernel("read", lambda: np.matmul(x, w, out=out), work)


_LEVELS = {("1", "Data"): "L1d", ("2", "Unified"): "L2", ("3", "Unified"): "L3"}


def cache_sizes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """The data caches of the first processor, in bytes, as Linux reports them.

    Returns
    -------
    dict of str to int
        ``{"L1d": ..., "L2": ..., "L3": ...}`` for the levels found; empty where the
        system does not report them (not Linux). On a virtual machine these are the
        sizes the hypervisor reports.
    """
    sizes: dict[str, int] = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        name = _LEVELS.get((level, kind))
        if name is None or not text:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1)
        sizes[name] = int(text.rstrip("KMG")) * unit
    return sizes
