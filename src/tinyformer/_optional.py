"""Optional dependencies, imported where they are used, with an error that says what to do.

``ml_dtypes`` (NumPy's bfloat16) has no build for every Python: the book's in-browser
Python (WebAssembly) lacks it. Everything but bfloat16 works without it.
"""

from __future__ import annotations

from types import ModuleType


def ml_dtypes() -> ModuleType:
    """The ``ml_dtypes`` module, or an :class:`ImportError` saying what needs it and how to get it."""
    try:
        import ml_dtypes as module  # noqa: PLC0415
    except ImportError:
        raise ImportError(
            "bfloat16 needs the package ml_dtypes (pip install ml_dtypes), which this Python"
            " does not have (the book's in-browser Python has none); float16, float32 and"
            " float64 work without it"
        ) from None
    return module
