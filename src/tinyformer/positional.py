"""Ways to tell attention where each token is.

Self-attention treats its input as a set, so order has to be added: as fixed
sinusoids added to the embeddings :cite:p:`vaswani2017attention`, as a learned
table added the same way, or as rotations of queries and keys by an angle
proportional to position (RoPE, :cite:t:`su2021roformer`). A binary code of the
position and two measuring tools (the best linear shift between rows of a
table, and the distance from new encodings to those seen in training) serve
to compare the schemes.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import (
    float_array,
    float_dtype,
    generator,
    non_negative_int,
    positive_float,
    positive_int,
)
from tinyformer.module import Module, Parameter

__all__ = [
    "ROTARY_LAYOUTS",
    "ROTARY_SCALINGS",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "apply_rotary",
    "binary_encoding",
    "convert_rotary_layout",
    "distance_to_seen",
    "fit_shift_matrix",
    "halves_permutation",
    "ntk_rotary_base",
    "rotary_frequencies",
    "sinusoidal_encoding",
    "sinusoidal_encoding_at",
    "sinusoidal_shift_matrix",
]

_MAX_BITS = 62  # positions are int64: 2**62 leaves room for the shifts below
ROTARY_LAYOUTS = ("adjacent", "halves")
"""The RoPE pair layouts. ``"adjacent"`` pairs features :math:`(2i, 2i+1)`, ``"halves"`` :math:`(i, i+d/2)`."""
_LAYOUTS = ROTARY_LAYOUTS
ROTARY_SCALINGS = ("linear", "ntk")
"""Ways to stretch RoPE to longer contexts, position interpolation (``"linear"``) and NTK-aware (``"ntk"``)."""


def _even_size(d_model: object, name: str = "d_model") -> int:
    d = positive_int(d_model, name)
    if d % 2:
        raise ValueError(f"{name} must be even (dimensions come in sine/cosine pairs), got {d}")
    return d


def _finite_positions(positions: object) -> np.ndarray:
    """``positions`` as a float64 vector of finite numbers, else raise."""
    pos = float_array(positions, "positions", ndim=1).astype(np.float64, copy=False)
    if not np.all(np.isfinite(pos)):
        raise ValueError("positions must be finite numbers, got NaN or inf")
    return pos


def _bit_count(n: int, n_bits: object) -> int:
    """The number of bits of a binary code of ``n`` positions: given, or the fewest that do."""
    bits = max(1, (n - 1).bit_length()) if n_bits is None else positive_int(n_bits, "n_bits")
    if bits > _MAX_BITS:
        raise ValueError(f"n_bits must be at most {_MAX_BITS}, got {bits}")
    if n > 2**bits:
        raise ValueError(
            f"n_bits={bits} writes positions 0..{2**bits - 1} only, but n_positions={n}"
            f" needs position {n - 1}"
        )
    return bits


def _integer(value: object, name: str) -> int:
    """``value`` as an ``int`` (of any sign), else raise :class:`TypeError`."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    return int(value)


def _rotary_positions(positions: object, n_pos: int) -> np.ndarray:
    """One integer position per row of ``x``; ``0 .. n_pos - 1`` by default."""
    if positions is None:
        return np.arange(n_pos, dtype=np.float64)
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu" or pos.shape != (n_pos,):
        raise ValueError(
            f"positions must be {n_pos} integers (one per row of x), got"
            f" shape {pos.shape} and dtype {pos.dtype}"
        )
    return pos


def _pair_slices(layout: object, d: int) -> tuple[slice, slice]:
    """Where the first and the second members of the rotated pairs sit in a row of width ``d``."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    if layout == "adjacent":  # pair i is (2i, 2i + 1)
        return slice(0, d, 2), slice(1, d, 2)
    return slice(0, d // 2), slice(d // 2, d)  # "halves": pair i is (i, i + d/2)


def _scaling(scaling: object, factor: object) -> float:
    """Check a RoPE scaling's name (None allowed) and return its factor as a float."""
    if scaling is not None and scaling not in ROTARY_SCALINGS:
        raise ValueError(f"scaling must be None or one of {ROTARY_SCALINGS}, got {scaling!r}")
    factor = positive_float(factor, "scaling_factor")
    if scaling is None and factor != 1.0:
        raise ValueError(
            f"scaling_factor={factor} has no effect without a scaling: pass scaling="
            f"{ROTARY_SCALINGS[0]!r} or {ROTARY_SCALINGS[1]!r}, or leave the factor at 1.0"
        )
    return factor


def ntk_rotary_base(base: float, d: int, factor: float) -> float:
    r"""The rotary base of NTK-aware scaling by ``factor`` :math:`s`: :math:`b\, s^{d/(d-2)}`.

    With base :math:`b' = b\, s^{d/(d-2)}` the frequencies become
    :math:`\omega'_i = b'^{-2i/d} = \omega_i\, s^{-2i/(d-2)}`: the fastest pair
    (:math:`i = 0`) turns as before, the slowest (:math:`i = d/2 - 1`) :math:`s`
    times slower, so a context :math:`s` times longer reaches the angles the
    slowest pair reached in training, while the fast pairs, which tell nearby
    positions apart, keep their resolution. (Proposed by "bloc97" on Reddit's
    r/LocalLLaMA in 2023, so named because it spreads the interpolation over the
    frequencies as neural-tangent-kernel arguments for high-frequency features
    suggest.)

    Parameters
    ----------
    base : float
        The base :math:`b` the model was trained with.
    d : int
        The rotated width :math:`d` (each head's :math:`d_k`), even and at least 4.
    factor : float
        The context stretch :math:`s > 0`.
    """
    base = positive_float(base, "base")
    d = _even_size(d, "d")
    if d < 4:
        raise ValueError(
            f"d must be at least 4 for NTK scaling (d/(d-2) is undefined at 2), got {d}"
        )
    return base * positive_float(factor, "factor") ** (d / (d - 2))


def rotary_frequencies(
    d_model: int, base: float = 10000.0, *, scaling: str | None = None, scaling_factor: float = 1.0
) -> np.ndarray:
    r"""Angular frequencies :math:`\omega_i = \text{base}^{-2i/d}`, one per pair of dimensions.

    Parameters
    ----------
    d_model : int
        The rotated width (even).
    base : float
        The base :math:`b`.
    scaling : str, optional
        ``None`` (the default); ``"linear"``: position interpolation
        :cite:p:`chen2023extending`, position :math:`p` is read as :math:`p/s`, so
        every frequency is divided by :math:`s`; ``"ntk"``: the base becomes
        :func:`ntk_rotary_base` :math:`b\, s^{d/(d-2)}`.
    scaling_factor : float
        :math:`s`, how many times longer a context the scaled rotation spans.

    Returns
    -------
    numpy.ndarray
        Shape ``(d_model // 2,)``, float64, falling geometrically from 1 (unscaled) to
        nearly ``1 / base``.
    """
    d = _even_size(d_model)
    base = positive_float(base, "base")
    factor = _scaling(scaling, scaling_factor)
    if scaling == "ntk":
        base = ntk_rotary_base(base, d, factor)
    freqs = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    return freqs / factor if scaling == "linear" else freqs


def sinusoidal_encoding(
    n_positions: int, d_model: int, *, base: float = 10000.0, dtype: object = np.float64
) -> np.ndarray:
    r"""The fixed sinusoidal position table of :cite:t:`vaswani2017attention`.

    .. math::
        PE_{p,\,2i} = \sin(p\,\omega_i), \qquad PE_{p,\,2i+1} = \cos(p\,\omega_i),
        \qquad \omega_i = \text{base}^{-2i/d_\text{model}}

    Pair :math:`i` is a point on the unit circle turning at frequency
    :math:`\omega_i` as the position :math:`p` grows.

    Parameters
    ----------
    n_positions : int
        Number of positions ``0 .. n_positions - 1``.
    d_model : int
        Width of the encoding; must be even.
    base : float
        Sets the slowest wavelength, :math:`2\pi \cdot \text{base}`.
    dtype : float32 or float64
        Dtype of the result.

    Returns
    -------
    numpy.ndarray
        Shape ``(n_positions, d_model)``: sine in even columns, cosine in odd ones.
    """
    n = positive_int(n_positions, "n_positions")
    return sinusoidal_encoding_at(np.arange(n), d_model, base=base, dtype=dtype)


def sinusoidal_encoding_at(
    positions: np.ndarray, d_model: int, *, base: float = 10000.0, dtype: object = np.float64
) -> np.ndarray:
    r"""The sinusoidal encoding of any real positions, fractional ones included.

    The same formula as :func:`sinusoidal_encoding`, evaluated at the given
    positions instead of ``0 .. n - 1``. Fractional positions arise when
    positions are rescaled to squeeze a long sequence into a trained range
    (position interpolation, :cite:t:`chen2023extending`).

    Parameters
    ----------
    positions : numpy.ndarray
        Shape ``(n,)``, finite real numbers.
    d_model : int
        Width of the encoding; must be even.
    base : float
        As in :func:`sinusoidal_encoding`.
    dtype : float32 or float64
        Dtype of the result.

    Returns
    -------
    numpy.ndarray
        Shape ``(n, d_model)``.
    """
    pos, dtype = _finite_positions(positions), float_dtype(dtype)  # (n,)
    angles = pos[:, None] * rotary_frequencies(d_model, base)  # (n, d_model / 2)
    table = np.empty((len(pos), 2 * angles.shape[1]))  # (n, d_model)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table.astype(dtype, copy=False)


def binary_encoding(
    n_positions: int, n_bits: int | None = None, *, dtype: object = np.float64
) -> np.ndarray:
    r"""Each position written in base two, least significant bit first.

    .. math:: B_{p,\,j} = \lfloor p / 2^j \rfloor \bmod 2

    Column :math:`j` flips every :math:`2^j` positions, as sinusoid pair
    :math:`i` turns with wavelength :math:`2\pi/\omega_i`: the code is the
    discrete cousin of the sinusoidal table, kept here to show what it lacks.

    Parameters
    ----------
    n_positions : int
        Number of positions ``0 .. n_positions - 1``.
    n_bits : int, optional
        Number of columns; defaults to the fewest bits that write
        ``n_positions - 1`` (at least one). ``n_bits`` bits reach position
        :math:`2^{n\_bits} - 1` and no further.
    dtype : float32 or float64
        Dtype of the result.

    Returns
    -------
    numpy.ndarray
        Shape ``(n_positions, n_bits)``, entries 0 and 1.
    """
    n = positive_int(n_positions, "n_positions")
    bits, dtype = _bit_count(n, n_bits), float_dtype(dtype)
    positions = np.arange(n, dtype=np.int64)[:, None]  # (n, 1)
    return ((positions >> np.arange(bits)) & 1).astype(dtype)  # (n, n_bits)


def sinusoidal_shift_matrix(offset: int, d_model: int, *, base: float = 10000.0) -> np.ndarray:
    r"""The matrix :math:`M_k` with :math:`PE_{p+k} = M_k\,PE_p` for every position :math:`p`.

    It is block diagonal, one :math:`2 \times 2` rotation per sine/cosine pair,

    .. math::
        \begin{pmatrix} \sin(p+k)\omega \\ \cos(p+k)\omega \end{pmatrix}
        = \begin{pmatrix} \cos k\omega & \sin k\omega \\ -\sin k\omega & \cos k\omega
          \end{pmatrix}
          \begin{pmatrix} \sin p\omega \\ \cos p\omega \end{pmatrix},

    and depends on the offset :math:`k` alone, not on :math:`p`.

    Returns
    -------
    numpy.ndarray
        Shape ``(d_model, d_model)``, float64.
    """
    angles = _integer(offset, "offset") * rotary_frequencies(d_model, base)  # (d_model / 2,)
    c, s = np.cos(angles), np.sin(angles)
    m = np.zeros((2 * len(angles), 2 * len(angles)))  # (d_model, d_model)
    even = np.arange(0, m.shape[0], 2)
    m[even, even], m[even, even + 1] = c, s
    m[even + 1, even], m[even + 1, even + 1] = -s, c
    return m


def _positions_slice(x: np.ndarray, start: object, context_length: int | None, kind: str) -> slice:
    start = non_negative_int(start, "start")
    stop = start + x.shape[-2]
    if context_length is not None and stop > context_length:
        raise ValueError(
            f"{kind} covers positions 0..{context_length - 1}, but x of shape {x.shape}"
            f" starting at {start} needs position {stop - 1}"
        )
    return slice(start, stop)


class SinusoidalPositionalEncoding(Module):
    """Adds the fixed sinusoidal table to its input; has no parameters.

    Parameters
    ----------
    d_model : int
        Model width (even).
    context_length : int
        Length of the precomputed table; longer inputs are rejected.
    dtype : float32 or float64
        Dtype of the table and of accepted inputs.
    """

    def __init__(self, d_model: int, context_length: int = 4096, *, dtype: object = np.float64):
        super().__init__()
        self.d_model = _even_size(d_model)
        self.context_length = positive_int(context_length, "context_length")
        self.table = sinusoidal_encoding(self.context_length, self.d_model, dtype=dtype)

    def forward(self, x: np.ndarray, start: int = 0) -> np.ndarray:
        """Return ``x + PE[start : start + T]`` for ``x`` of shape ``(..., T, d_model)``."""
        x = float_array(x, "x", min_ndim=2, last_dim=self.d_model)
        if x.dtype != self.table.dtype:
            raise TypeError(f"x must have dtype {self.table.dtype}, got {x.dtype}")
        rows = _positions_slice(x, start, self.context_length, "the sinusoidal table")
        self._save(x.shape)
        return x + self.table[rows]

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """The table is a constant, so the gradient passes through unchanged."""
        (shape,) = self._saved()
        return self._check_grad(grad_out, shape, self.table.dtype)


class LearnedPositionalEmbedding(Module):
    r"""A trainable table of position vectors added to the input.

    Initialized :math:`\mathcal{N}(0, \text{init\_std}^2)`. Unlike sinusoids, it
    has nothing to say about positions at or beyond ``context_length``: they are errors.
    """

    def __init__(
        self,
        context_length: int,
        d_model: int,
        *,
        rng: np.random.Generator,
        init_std: float = 0.02,
        dtype: object = np.float64,
    ):
        super().__init__()
        rng = generator(rng)
        self.context_length = positive_int(context_length, "context_length")
        self.d_model = positive_int(d_model, "d_model")
        std = positive_float(init_std, "init_std")
        dtype = float_dtype(dtype)
        self.weight = Parameter(
            rng.normal(0.0, std, (self.context_length, self.d_model)).astype(dtype)
        )

    def forward(self, x: np.ndarray, start: int = 0) -> np.ndarray:
        """Return ``x + P[start : start + T]`` for ``x`` of shape ``(..., T, d_model)``."""
        x = float_array(x, "x", min_ndim=2, last_dim=self.d_model)
        if x.dtype != self.weight.dtype:
            raise TypeError(f"x must have dtype {self.weight.dtype}, got {x.dtype}")
        rows = _positions_slice(x, start, self.context_length, "the learned position table")
        self._save(x.shape, rows)
        return x + self.weight.value[rows]

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Pass the gradient through and add its sum over the batch into the table rows used."""
        shape, rows = self._saved()
        grad = self._check_grad(grad_out, shape, self.weight.dtype)
        if self.weight.requires_grad:  # a frozen table costs nothing
            self.weight.grad[rows] += grad.reshape(-1, *shape[-2:]).sum(axis=0)
        return grad


def apply_rotary(
    x: np.ndarray,
    positions: np.ndarray | None = None,
    *,
    base: float = 10000.0,
    inverse: bool = False,
    layout: str = "adjacent",
    scaling: str | None = None,
    scaling_factor: float = 1.0,
) -> np.ndarray:
    r"""Rotate each pair of features of ``x`` by an angle proportional to its position (RoPE).

    For pair :math:`i`, made of features :math:`(a, b)`, at position :math:`p`,

    .. math::
        \begin{pmatrix} a' \\ b' \end{pmatrix}
        = \begin{pmatrix} \cos p\omega_i & -\sin p\omega_i \\
                          \sin p\omega_i & \cos p\omega_i \end{pmatrix}
          \begin{pmatrix} a \\ b \end{pmatrix}.

    Applied to queries and keys, the score :math:`q'_m \cdot k'_n` depends on
    the positions only through :math:`m - n` :cite:p:`su2021roformer`. The map is a
    rotation, so its backward pass is the inverse rotation: ``inverse=True``.

    Parameters
    ----------
    x : numpy.ndarray
        Shape ``(..., T, d)`` with ``d`` even.
    positions : numpy.ndarray of int, optional
        Shape ``(T,)``; defaults to ``0 .. T-1``.
    base : float
        Frequency base, as in :func:`rotary_frequencies`.
    inverse : bool
        Rotate by minus the angle (the transpose, used for the gradient).
    layout : str
        Which features form pair :math:`i`: ``"adjacent"`` rotates
        :math:`(x_{2i}, x_{2i+1})`, as the RoFormer paper writes it;
        ``"halves"`` rotates :math:`(x_i, x_{i + d/2})`, the ``rotate_half``
        layout of much LLaMA and GPT-NeoX code. The two are the same rotation
        up to the fixed feature order :func:`halves_permutation`.
    scaling : str, optional
        Stretch the rotation to a context ``scaling_factor`` :math:`s` times longer:
        ``"linear"`` (position interpolation :cite:p:`chen2023extending`: position
        :math:`p` is rotated as position :math:`p/s` is without scaling) or ``"ntk"``
        (the base becomes :func:`ntk_rotary_base`); ``None`` (the default) does not.
    scaling_factor : float
        :math:`s > 0`.

    Returns
    -------
    numpy.ndarray
        Same shape and dtype as ``x``.
    """
    x = float_array(x, "x", min_ndim=2)
    n_pos, d = x.shape[-2:]
    if scaling is None:  # the rotation as it has always been computed
        _scaling(scaling, scaling_factor)  # a factor without a scaling is refused
        freqs = rotary_frequencies(_even_size(d, "x.shape[-1]"), base)  # (d / 2,)
        pos = _rotary_positions(positions, n_pos)
    else:
        factor = _scaling(scaling, scaling_factor)
        if scaling == "linear":  # position interpolation: p is read as p / s
            freqs = rotary_frequencies(_even_size(d, "x.shape[-1]"), base)
            pos = _rotary_positions(positions, n_pos) / factor
        else:
            freqs = rotary_frequencies(
                _even_size(d, "x.shape[-1]"), base, scaling="ntk", scaling_factor=factor
            )
            pos = _rotary_positions(positions, n_pos)
    first, second = _pair_slices(layout, d)
    angles = pos[:, None] * freqs  # (T, d / 2)
    angles = -angles if inverse else angles
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    a, b = x[..., first], x[..., second]  # (..., T, d / 2) each
    out = np.empty_like(x)
    out[..., first] = a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


def halves_permutation(d_k: int) -> np.ndarray:
    r"""The feature order that carries the ``"adjacent"`` RoPE layout to the ``"halves"`` one.

    With ``perm = halves_permutation(d)``, feature :math:`2i` moves to slot
    :math:`i` and feature :math:`2i+1` to slot :math:`i + d/2`, so

    .. math::
        \operatorname{rope}_\text{halves}(x_{[\pi]}) = \operatorname{rope}_\text{adjacent}(x)_{[\pi]} .

    Loading weights trained with one layout into code that uses the other
    needs the columns of :math:`W_Q` and :math:`W_K` (of each head) reordered
    by ``perm`` (or by its inverse, ``np.argsort(perm)``, the other way).

    Returns
    -------
    numpy.ndarray
        Shape ``(d_k,)``, int64: ``[0, 2, 4, ..., d - 2, 1, 3, ..., d - 1]``.
    """
    d = _even_size(d_k, "d_k")
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def convert_rotary_layout(
    weight: np.ndarray, n_heads: int, *, source: str, target: str, axis: int = -1
) -> np.ndarray:
    r"""Reorder query or key projection weights trained with one RoPE layout for the other.

    A model whose attention rotates pairs :math:`(i, i + d_k/2)` (``"halves"``,
    Hugging Face's LLaMA, Mistral and GPT-NeoX code) computes the same scores as one
    that rotates pairs :math:`(2i, 2i+1)` (``"adjacent"``, tinyformer's default, the
    RoFormer paper and Meta's original LLaMA code) once the output features of
    :math:`W_Q` and :math:`W_K` are reordered within each head: both models then
    rotate the same two numbers by the same angle, and a score is a dot product,
    which does not see the order of the features. The direction matters:

    - ``source="halves", target="adjacent"``: feature :math:`i` of a head moves to
      slot :math:`2i` and feature :math:`i + d_k/2` to slot :math:`2i+1`
      (``new[2i] = old[i]``, ``new[2i+1] = old[i + d_k/2]``);
    - ``source="adjacent", target="halves"``: the inverse, ``new = old[perm]`` with
      ``perm =`` :func:`halves_permutation` ``(d_k)``.

    Values, the output projection and the rest of the model are not touched.

    Parameters
    ----------
    weight : numpy.ndarray
        The query or key weights (or biases) with the heads' features along
        ``axis``: ``(d_model, n_heads d_k)`` for tinyformer's ``Linear`` (``axis=-1``,
        the default), ``(n_heads d_k, d_model)`` for a PyTorch ``nn.Linear``
        (``axis=0``), ``(n_heads d_k,)`` for a bias.
    n_heads : int
        Number of heads along ``axis`` (for keys with grouped-query attention, the
        number of key/value heads).
    source, target : str
        The layouts, each ``"adjacent"`` or ``"halves"``; equal layouts give a copy.
    axis : int
        The axis of the heads' features.

    Returns
    -------
    numpy.ndarray
        A new array of the shape and dtype of ``weight``.
    """
    w = float_array(weight, "weight", min_ndim=1)
    n_heads = positive_int(n_heads, "n_heads")
    for name, layout in (("source", source), ("target", target)):
        if layout not in ROTARY_LAYOUTS:
            raise ValueError(f"{name} must be one of {ROTARY_LAYOUTS}, got {layout!r}")
    axis = _integer(axis, "axis")
    if not -w.ndim <= axis < w.ndim:
        raise ValueError(f"axis must index one of the {w.ndim} axes of weight, got {axis}")
    width = w.shape[axis]
    if width % n_heads:
        raise ValueError(
            f"weight's axis {axis} ({width} features) must split into n_heads={n_heads} heads"
        )
    d_k = width // n_heads
    perm = halves_permutation(d_k)  # (d_k,): adjacent order -> halves order
    if source == target:
        within = np.arange(d_k)
    elif source == "adjacent":
        within = perm
    else:  # halves -> adjacent: the inverse permutation
        within = np.argsort(perm)
    order = (np.arange(n_heads)[:, None] * d_k + within).reshape(-1)  # (n_heads d_k,)
    return np.take(w, order, axis=axis)


class RotaryEmbedding(Module):
    """RoPE as a layer: rotates its input in ``forward``, rotates back in ``backward``.

    It rotates pairs of features in either layout (``layout``); the attention layers
    (:class:`~tinyformer.multihead.MultiHeadAttention`) use ``"adjacent"`` unless
    configured otherwise, and :func:`convert_rotary_layout` moves trained query and
    key weights from one layout to the other.

    Parameters
    ----------
    d_k : int
        Width of each query or key (even).
    base : float
        Frequency base, as in :func:`rotary_frequencies`.
    layout : str
        ``"adjacent"`` or ``"halves"``: which features are paired, as in :func:`apply_rotary`.
    scaling : str, optional
        ``"linear"`` or ``"ntk"``: stretch the rotation to a longer context, as in
        :func:`apply_rotary`; ``None`` (the default) does not.
    scaling_factor : float
        How many times longer.
    """

    def __init__(
        self,
        d_k: int,
        *,
        base: float = 10000.0,
        layout: str = "adjacent",
        scaling: str | None = None,
        scaling_factor: float = 1.0,
    ):
        super().__init__()
        self.d_k = _even_size(d_k, "d_k")
        self.base = positive_float(base, "base")
        _pair_slices(layout, self.d_k)  # checks the layout's name
        self.layout = layout
        self.scaling_factor = _scaling(scaling, scaling_factor)
        self.scaling = scaling
        if scaling == "ntk":
            ntk_rotary_base(self.base, self.d_k, self.scaling_factor)  # checks d_k >= 4

    def _rotate(self, x: np.ndarray, positions: np.ndarray, *, inverse: bool) -> np.ndarray:
        if self.scaling is None:  # the call it has always made
            return apply_rotary(x, positions, base=self.base, inverse=inverse, layout=self.layout)
        return apply_rotary(
            x,
            positions,
            base=self.base,
            inverse=inverse,
            layout=self.layout,
            scaling=self.scaling,
            scaling_factor=self.scaling_factor,
        )

    def forward(self, x: np.ndarray, start: int = 0) -> np.ndarray:
        """Rotate ``x`` of shape ``(..., T, d_k)`` for positions ``start .. start+T-1``."""
        x = float_array(x, "x", min_ndim=2, last_dim=self.d_k)
        rows = _positions_slice(x, start, None, "RoPE")
        positions = np.arange(rows.start, rows.stop)
        self._save(x.shape, x.dtype, positions)
        return self._rotate(x, positions, inverse=False)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Rotate the gradient back by the same angles (the rotation is orthogonal)."""
        shape, dtype, positions = self._saved()
        grad = self._check_grad(grad_out, shape, dtype)
        return self._rotate(grad, positions, inverse=True)


def fit_shift_matrix(table: np.ndarray, offset: int) -> np.ndarray:
    r"""The matrix that best moves every row of a position table ``offset`` rows on.

    The least-squares solution of

    .. math:: \min_M \sum_{p=0}^{n-1-k} \lVert T_{p+k} - M\,T_p \rVert^2 ,

    which answers: is "``offset`` positions later" a linear function of the
    encoding? For the sinusoidal table the residual vanishes (to rounding)
    because :func:`sinusoidal_shift_matrix` is such a map; for codes where it
    is not (the binary code, with its carries) a residual remains. Where the
    rows do not span the whole space, the smallest-norm solution is returned.

    Parameters
    ----------
    table : numpy.ndarray
        Shape ``(n, d)``: row ``p`` encodes position ``p``.
    offset : int
        The shift :math:`k`, with ``1 <= k < n``.

    Returns
    -------
    numpy.ndarray
        Shape ``(d, d)``, float64, such that ``table[p + k] ~ M @ table[p]``.
    """
    table = float_array(table, "table", ndim=2).astype(np.float64, copy=False)
    k = positive_int(offset, "offset")
    if k >= table.shape[0]:
        raise ValueError(
            f"offset must be smaller than the number of rows of table ({table.shape[0]}), got {k}"
        )
    # Solve table[:-k] @ X = table[k:] for X (d, d); then M = X^T acts on columns.
    solution, *_ = np.linalg.lstsq(table[:-k], table[k:], rcond=None)
    return solution.T


def distance_to_seen(encodings: np.ndarray, seen: np.ndarray) -> np.ndarray:
    r"""Euclidean distance from each encoding to the nearest of a set of seen encodings.

    .. math:: \delta_p = \min_q \lVert e_p - s_q \rVert

    With ``seen`` the encodings of the positions a model was trained on, a
    large :math:`\delta_p` says position :math:`p` looks like nothing the
    model has met. Memory grows as ``n * m * d``; meant for tables of a few
    thousand rows.

    Parameters
    ----------
    encodings : numpy.ndarray
        Shape ``(n, d)``.
    seen : numpy.ndarray
        Shape ``(m, d)``.

    Returns
    -------
    numpy.ndarray
        Shape ``(n,)``, float64.
    """
    e = float_array(encodings, "encodings", ndim=2).astype(np.float64, copy=False)
    s = float_array(seen, "seen", ndim=2, last_dim=e.shape[1]).astype(np.float64, copy=False)
    if s.shape[0] == 0:
        raise ValueError(f"seen must hold at least one encoding, got shape {s.shape}")
    gaps = e[:, None, :] - s[None, :, :]  # (n, m, d)
    return np.sqrt(np.einsum("nmd,nmd->nm", gaps, gaps).min(axis=1))  # (n,)
