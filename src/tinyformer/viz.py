"""Plotting helpers shared by the figure scripts and the book's chapters.

Needs matplotlib (``pip install tinyformer[plot]``); the rest of the package
does not. Figures are saved without timestamps or version stamps, so the same
code and data give byte-identical PNG files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["BOOK_STYLE", "heatmap", "new_figure", "save_figure"]

BOOK_STYLE: dict[str, Any] = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "viridis",
    "svg.hashsalt": "tinyformer",
}


def _pyplot() -> Any:
    try:
        import matplotlib as mpl  # noqa: PLC0415  (optional dependency)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tinyformer.viz needs matplotlib: pip install 'tinyformer[plot]'"
        ) from err
    mpl.rcParams.update(BOOK_STYLE)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def new_figure(
    nrows: int = 1, ncols: int = 1, *, size: tuple[float, float] = (6.0, 4.0)
) -> tuple[Figure, Any]:
    """Create a figure in the book's style; returns ``(figure, axes)`` like ``plt.subplots``."""
    plt = _pyplot()
    return plt.subplots(nrows, ncols, figsize=size, layout="constrained")


def heatmap(
    ax: Axes,
    matrix: np.ndarray,
    *,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar: bool = True,
) -> Any:
    """Draw a matrix as an image with optional tick labels and cell values."""
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {matrix.shape}")
    image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), labels=list(xlabels), rotation=45, ha="right")
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), labels=list(ylabels))
    if annotate:
        middle = (np.nanmax(matrix) + np.nanmin(matrix)) / 2
        for (i, j), value in np.ndenumerate(matrix):
            color = "black" if value > middle else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color=color, fontsize=8)
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    return image


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG with no varying metadata, close it, and return the path."""
    plt = _pyplot()
    path = Path(path)
    if path.suffix != ".png":
        raise ValueError(f"path must end in .png, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
    return path
