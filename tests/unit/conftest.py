"""Shared pytest configuration: hypothesis profiles, a seeded generator, PyTorch for reference tests."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator with a fixed seed, fresh for every test."""
    return np.random.default_rng(20170612)


@pytest.fixture(scope="session")
def torch():
    """PyTorch's CPU build, for tests marked ``reference``; they skip when it is not installed."""
    return pytest.importorskip("torch")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test that asks for ``torch`` without the ``reference`` marker.

    ``-m "not reference"`` must leave out every test that needs PyTorch, so a test
    that uses the fixture must say so with ``@pytest.mark.reference``.
    """
    unmarked = [
        item.nodeid
        for item in items
        if "torch" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("reference") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"tests using torch need @pytest.mark.reference: {unmarked}")
