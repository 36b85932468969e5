"""tinyformer without its optional dependencies, as in the book's in-browser Python."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tinyformer import runtime
from tinyformer.training import mixed_precision


@pytest.fixture
def no_ml_dtypes(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import fails as if not installed


def test_float16_works_without_ml_dtypes(no_ml_dtypes):
    x = np.array([1.0, 1e-3, 7e4], dtype=np.float32)
    assert mixed_precision.round_to(x, "float16").dtype == np.float32
    limits = mixed_precision.format_limits("float16")
    assert limits["max"] == 65504.0
    assert limits["eps"] == 2.0**-10
    assert mixed_precision.format_limits("float64")["eps"] == np.finfo(np.float64).eps


def test_bfloat16_without_ml_dtypes_says_what_to_install(no_ml_dtypes):
    with pytest.raises(ImportError, match="pip install ml_dtypes"):
        mixed_precision.round_to(np.ones(2, np.float32), "bfloat16")
    with pytest.raises(ImportError, match="bfloat16 needs the package ml_dtypes"):
        mixed_precision.format_limits("bfloat16")


def test_bfloat16_limits_with_ml_dtypes():
    limits = mixed_precision.format_limits("bfloat16")
    assert limits["eps"] == 2.0**-7
    assert limits["max"] > 3e38


def test_unknown_format_is_named():
    with pytest.raises(ValueError, match="fmt"):
        mixed_precision.format_limits("float8")


def test_blas_threads_without_threadpoolctl(monkeypatch):
    monkeypatch.setattr(runtime, "threadpool_limits", None)
    with runtime.blas_threads(2) as n:
        assert n == 2
        assert np.allclose(np.ones((3, 3)) @ np.ones(3), 3.0)
    with runtime.blas_threads(None) as n:
        assert n is None
