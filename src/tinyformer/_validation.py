"""Input checks shared by the public functions and layers.

Every check raises :class:`TypeError` (wrong kind of thing) or :class:`ValueError`
(right kind, wrong value or shape) with a message that names the argument, says
what was expected and shows what came.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class NonFiniteError(ValueError):
    """A computation met NaN or inf in its input: raised where values must be finite.

    A :class:`ValueError`, so callers that catch those keep working; the training loop
    catches this one in particular, as a sign that the model has diverged.
    """


def describe(x: object) -> str:
    """Say briefly what ``x`` is, for error messages."""
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"[:120]


def as_array(value: object, name: str) -> np.ndarray:
    """``np.asarray(value)``, with an error naming ``name`` when ``value`` is ragged.

    NumPy refuses nested sequences of unequal lengths with a message about an
    "inhomogeneous shape" that names nothing of the caller's; this says which
    argument it was and how long its rows were.
    """
    try:
        return np.asarray(value)
    except ValueError as error:
        if "inhomogeneous" not in str(error):
            raise
        lengths = [len(row) if hasattr(row, "__len__") else "scalar" for row in value]  # type: ignore[attr-defined]
        shown = ", ".join(map(str, lengths[:8])) + (", ..." if len(lengths) > 8 else "")
        raise ValueError(
            f"{name} must be a rectangular array (every row the same length: pad the shorter"
            f" rows), got rows of lengths {shown}"
        ) from None


def positive_int(value: object, name: str) -> int:
    """Return ``value`` as an ``int`` if it is a positive integer, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {describe(value)}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def non_negative_int(value: object, name: str) -> int:
    """Return ``value`` as an ``int`` if it is an integer >= 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative integer, got {describe(value)}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    return int(value)


def positive_float(value: object, name: str) -> float:
    """Return ``value`` as a ``float`` if it is a finite number > 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {describe(value)}")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value}")
    return float(value)


def float_dtype(dtype: object, name: str = "dtype") -> np.dtype:
    """Return ``dtype`` as a NumPy dtype if it is float32 or float64, else raise."""
    try:
        resolved = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as err:
        raise TypeError(f"{name} must be float32 or float64, got {dtype!r}") from err
    if resolved not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {resolved}")
    return resolved


def float_array(
    x: object,
    name: str,
    *,
    min_ndim: int = 0,
    ndim: int | None = None,
    last_dim: int | None = None,
) -> np.ndarray:
    """Return ``x`` as a floating-point array, checking its rank and last dimension.

    Floating inputs keep their dtype; integer and boolean inputs become float64.
    Anything else (complex, strings, objects) is a :class:`TypeError`.
    """
    arr = np.asarray(x)
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind != "f":
        raise TypeError(f"{name} must be a real floating-point array, got {describe(arr)}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {arr.shape}")
    if last_dim is not None and arr.shape[-1] != last_dim:
        raise ValueError(f"{name} must have last dimension {last_dim}, got shape {arr.shape}")
    return arr


def axis_index(axis: object, ndim: int, name: str = "axis") -> int:
    """Return ``axis`` as a non-negative axis index of an ``ndim``-dimensional array."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {describe(axis)}")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{name} must be in [{-ndim}, {ndim - 1}] for an array with {ndim} dimensions,"
            f" got {axis}"
        )
    return int(axis) % ndim


def same_dtype(arrays: Sequence[np.ndarray], names: Sequence[str]) -> np.dtype:
    """Return the common dtype of ``arrays``; raise if they differ."""
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1:
        listed = ", ".join(f"{n} is {a.dtype}" for n, a in zip(names, arrays, strict=True))
        raise TypeError(f"{', '.join(names)} must share one dtype; got {listed}")
    return arrays[0].dtype


def bool_mask(mask: object, name: str, target_shape: tuple[int, ...]) -> np.ndarray:
    """Return ``mask`` as a boolean array that broadcasts to ``target_shape``.

    The mask may have fewer dimensions than the target or size-1 axes, but
    broadcasting it must not change ``target_shape``.
    """
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise TypeError(
            f"{name} must be a boolean array (True where a query may attend),"
            f" got dtype {arr.dtype}"
        )
    return broadcasts_to(arr, name, tuple(target_shape), "the score shape")


def broadcasts_to(arr: np.ndarray, name: str, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``arr`` if it broadcasts to ``shape`` (``what``: its name in the message) unchanged.

    Broadcasting may add leading axes and stretch size-1 axes, but must give ``shape``.
    """
    try:
        result = np.broadcast_shapes(arr.shape, shape)
    except ValueError:
        result = None
    if result != shape:
        raise ValueError(f"{name} of shape {arr.shape} does not broadcast to {what} {shape}")
    return arr


def token_ids(ids: object, name: str, vocab_size: int | None = None) -> np.ndarray:
    """Return ``ids`` as an integer array of valid token ids (0 <= id < vocab_size)."""
    arr = as_array(ids, name)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array of token ids, got {describe(arr)}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be non-negative token ids, got minimum {arr.min()}")
    if vocab_size is not None and arr.size and arr.max() >= vocab_size:
        raise ValueError(
            f"{name} must be below the vocabulary size {vocab_size}, got maximum {arr.max()}"
        )
    return arr


def non_negative_float(value: object, name: str) -> float:
    """Return ``value`` as a ``float`` if it is a finite number >= 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a non-negative number, got {describe(value)}")
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value}")
    return float(value)


def unit_interval(value: object, name: str, *, include_one: bool = False) -> float:
    """Return ``value`` as a ``float`` if it lies in [0, 1) (or [0, 1]), else raise."""
    interval = "[0, 1]" if include_one else "[0, 1)"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in {interval}, got {describe(value)}")
    if not (0.0 <= value < 1.0 or (include_one and value == 1.0)):
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return float(value)


def generator(rng: object, name: str = "rng") -> np.random.Generator:
    """Return ``rng`` if it is a :class:`numpy.random.Generator`, else raise."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (np.random.default_rng(seed)),"
            f" got {describe(rng)}"
        )
    return rng


def probability(p: object, name: str) -> float:
    """Return ``p`` as a ``float`` if it is a number in ``[0, 1)`` (a dropout rate), else raise."""
    return unit_interval(p, name)


def one_of(value: object, options: Sequence[str], name: str) -> str:
    """Return ``value`` if it is one of the strings ``options``, else raise."""
    if not isinstance(value, str) or value not in options:
        listed = ", ".join(repr(o) for o in options)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def layer_input(
    x: object,
    name: str,
    dtype: np.dtype,
    *,
    last_dim: int | None = None,
    min_ndim: int = 1,
) -> np.ndarray:
    """Return ``x`` as a float array of a layer's ``dtype`` with the expected last dimension.

    Unlike :func:`float_array`, integers are not promoted: a layer accepts
    exactly the dtype of its parameters, so float32 stays float32 end to end.
    """
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
        if x.dtype.kind in "biu":
            x = x.astype(dtype)
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must be a real floating-point array, got {describe(x)}")
    if x.dtype != dtype:
        raise TypeError(
            f"{name} must have the layer's dtype {dtype}, got {x.dtype}"
            " (convert it with .astype or build the layer with that dtype)"
        )
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {x.shape}")
    if last_dim is not None and x.shape[-1] != last_dim:
        raise ValueError(f"{name} must have last dimension {last_dim}, got shape {x.shape}")
    return x
