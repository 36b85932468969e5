"""Plotting helpers: deterministic PNG files and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from tinyformer.viz import heatmap, new_figure, save_figure


def _draw(path, matrix):
    fig, ax = new_figure(size=(3.0, 2.5))
    heatmap(ax, matrix, xlabels=["a", "b", "c"], ylabels=["x", "y"], annotate=True)
    return save_figure(fig, path)


def test_the_same_figure_gives_byte_identical_files(tmp_path, rng):
    matrix = rng.random((2, 3))
    first = _draw(tmp_path / "one.png", matrix).read_bytes()
    second = _draw(tmp_path / "two.png", matrix).read_bytes()
    assert first == second
    assert first.startswith(b"\x89PNG")
    assert b"Software" not in first  # no version stamp in the metadata


def test_a_different_figure_gives_different_bytes(tmp_path, rng):
    first = _draw(tmp_path / "one.png", rng.random((2, 3))).read_bytes()
    second = _draw(tmp_path / "two.png", rng.random((2, 3))).read_bytes()
    assert first != second


def test_heatmap_annotates_every_cell(rng):
    fig, ax = new_figure()
    heatmap(ax, rng.random((2, 3)), annotate=True, colorbar=False)
    assert len(ax.texts) == 6
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(fig)


def test_bad_input_is_named(tmp_path):
    fig, ax = new_figure()
    with pytest.raises(ValueError, match=r"matrix must be 2-D, got shape \(3,\)"):
        heatmap(ax, np.ones(3))
    with pytest.raises(ValueError, match=r"path must end in \.png"):
        save_figure(fig, tmp_path / "figure.jpg")
