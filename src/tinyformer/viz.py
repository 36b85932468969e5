"""The book's one figure style, and plotting helpers shared by the scripts and the chapters.

Needs matplotlib (``pip install tinyformer[plot]``); the rest of the package
does not. Importing this module applies :data:`BOOK_STYLE` to matplotlib's
``rcParams``, so a figure drawn in a page cell gets the style too;
:func:`new_figure` applies it again (a script runner may reset ``rcParams``
between scripts).

The style is sized for the width at which the book shows a figure. The theme
shows figures at most :data:`DISPLAY_WIDTH_PX` CSS pixels wide; every figure is
:data:`FIGURE_WIDTH` inches wide (taller, never wider, when it has more panels),
so a font of ``s`` points is shown at ``s * DISPLAY_WIDTH_PX / (72 * FIGURE_WIDTH)``
CSS pixels whatever the dpi. No text is smaller than :data:`MIN_FONT_PT` points,
which that formula turns into at least :data:`MIN_FONT_CSS_PX` CSS pixels. The
colours are matplotlib's colour-blind-safe ``petroff10`` cycle, and each colour
comes with its own marker and line style, so no series depends on colour alone.

Figures are saved without timestamps or version stamps, so the same code and
data give byte-identical PNG files. :func:`save_figure` records the smallest
font of the file in pixels in a PNG text chunk named :data:`PNG_FONT_KEY`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "BOOK_STYLE",
    "DISPLAY_WIDTH_PX",
    "DPI",
    "FIGURE_WIDTH",
    "MIN_FONT_CSS_PX",
    "MIN_FONT_PT",
    "PNG_FONT_KEY",
    "FigureStyleWarning",
    "book_style",
    "displayed_font_px",
    "heatmap",
    "new_figure",
    "save_figure",
    "smallest_font_pt",
]

#: Widest a figure is shown by the book's theme on a desktop, in CSS pixels.
DISPLAY_WIDTH_PX = 672
#: Width of every figure of the book, in inches.
FIGURE_WIDTH = 6.4
#: Resolution of figures drawn in pages and of saved files (1024 pixels across).
DPI = 160
#: Smallest font any figure may use, in points.
MIN_FONT_PT = 8.0
#: Smallest size text may be shown at on a desktop, in CSS pixels.
MIN_FONT_CSS_PX = 9.0
#: Name of the PNG text chunk that holds a saved figure's smallest font in image pixels.
PNG_FONT_KEY = "tinyformer:min-font-px"

# matplotlib's petroff10 cycle (matplotlib >= 3.10), chosen to stay distinct under
# the common colour-vision deficiencies; written out so older versions draw the same.
PETROFF10 = (
    "#3f90da",
    "#ffa90e",
    "#bd1f01",
    "#94a4a2",
    "#832db6",
    "#a96b59",
    "#e76300",
    "#b9ac70",
    "#717581",
    "#92dadd",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", ":", "-.", "-", "--", ":", "-.", "-", "--")


def _cycle() -> Any:
    from cycler import cycler  # noqa: PLC0415  (installed with matplotlib)

    return cycler(color=PETROFF10) + cycler(marker=MARKERS) + cycler(linestyle=LINESTYLES)


BOOK_STYLE: dict[str, Any] = {
    "figure.figsize": (FIGURE_WIDTH, 4.0),
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "figure.constrained_layout.use": True,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "font.size": 10.0,
    "axes.titlesize": 10.0,
    "axes.labelsize": 10.0,
    "xtick.labelsize": 9.0,
    "ytick.labelsize": 9.0,
    "legend.fontsize": 9.0,
    "legend.title_fontsize": 9.0,
    "figure.titlesize": 11.0,
    "figure.labelsize": 10.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.5,
    "lines.markersize": 4.5,
    "patch.facecolor": PETROFF10[0],
    "image.cmap": "viridis",
    "svg.hashsalt": "tinyformer",
}
"""The rcParams of the book's style (the property cycle is added when matplotlib loads)."""


class FigureStyleWarning(UserWarning):
    """A figure breaks the book's style: text too small to read, or a figure too wide."""


def _matplotlib() -> Any:
    try:
        import matplotlib as mpl  # noqa: PLC0415  (optional dependency)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tinyformer.viz needs matplotlib: pip install 'tinyformer[plot]'"
        ) from err
    return mpl


def _style() -> dict[str, Any]:
    return {**BOOK_STYLE, "axes.prop_cycle": _cycle()}


def _apply_style() -> None:
    _matplotlib().rcParams.update(_style())


def _pyplot() -> Any:
    _apply_style()
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


@contextmanager
def book_style() -> Iterator[None]:
    """Draw in the book's style inside a ``with`` block, and restore ``rcParams`` after it."""
    mpl = _matplotlib()
    with mpl.rc_context(_style()):
        yield


def displayed_font_px(font_pt: float, figure_width: float = FIGURE_WIDTH) -> float:
    r"""CSS pixels of a ``font_pt`` font in a figure ``figure_width`` inches wide, shown full width.

    .. math:: s_\text{px} = s_\text{pt} \cdot \frac{W_\text{display}}{72\, W_\text{figure}}
    """
    return font_pt * DISPLAY_WIDTH_PX / (72.0 * figure_width)


def _texts(fig: Figure) -> list[Any]:
    from matplotlib.text import Text  # noqa: PLC0415

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def smallest_font_pt(fig: Figure) -> float:
    """Smallest font size, in points, of the visible text of ``fig`` (tick labels included).

    Call it after the figure was drawn (or after ``fig.draw_without_rendering()``):
    tick labels exist only once their axis has been laid out.
    """
    sizes = [t.get_fontsize() for t in _texts(fig)]
    return float(min(sizes)) if sizes else float("inf")


def _style_problems(fig: Figure, *, check_width: bool = True) -> list[str]:
    problems = [
        f"text {t.get_text()!r} is {t.get_fontsize():g} pt, smaller than {MIN_FONT_PT:g} pt"
        for t in _texts(fig)
        if t.get_fontsize() < MIN_FONT_PT
    ]
    width = float(fig.get_size_inches()[0])
    if check_width and width > FIGURE_WIDTH + 1e-9:
        problems.append(f"figure is {width:g} in wide, wider than {FIGURE_WIDTH:g} in")
    return problems


#: A line with more points than this shows its marker only every ``DENSE_MARKEVERY``.
DENSE_POINTS = 40
#: Marker spacing of dense lines: a tenth of the axes' diagonal (matplotlib's float markevery).
DENSE_MARKEVERY = 0.1


def _thin_dense_markers(fig: Figure) -> None:
    from matplotlib.lines import Line2D  # noqa: PLC0415

    for line in fig.findobj(Line2D):
        dense = len(np.atleast_1d(line.get_xdata())) > DENSE_POINTS
        if (
            dense
            and line.get_marker() not in (None, "", "None", " ")
            and line.get_markevery() is None
        ):
            line.set_markevery(DENSE_MARKEVERY)


def _book_figure_class() -> type:
    from matplotlib.figure import Figure  # noqa: PLC0415

    class BookFigure(Figure):
        """A figure that thins the markers of dense lines and checks its text when drawn."""

        def draw(self, renderer: Any) -> None:
            _thin_dense_markers(self)
            super().draw(renderer)
            # Not the width: a save with bbox_inches="tight" (the inline backend's) draws
            # the figure at its tight size, a little wider when a label sticks out.
            problems = _style_problems(self, check_width=False)
            if problems:
                warnings.warn(
                    "figure breaks the book's style: " + "; ".join(problems[:3]),
                    FigureStyleWarning,
                    stacklevel=2,
                )

    return BookFigure


def new_figure(
    nrows: int = 1,
    ncols: int = 1,
    *,
    height: float | None = None,
    size: tuple[float, float] | None = None,
    **subplots: Any,
) -> tuple[Figure, Any]:
    """Create a figure in the book's style; returns ``(figure, axes)`` like ``plt.subplots``.

    The figure is always :data:`FIGURE_WIDTH` inches wide, so that its text is shown
    at the same size as every other figure's. ``height`` (inches) defaults to 4.0 for
    one column, 3.0 per row of two columns and 2.4 per row of more. ``size`` is
    accepted for older calls: only its height is used. Other keywords go to
    ``plt.subplots`` (``sharex``, ``gridspec_kw``, ...). Each time the figure is drawn,
    a line of more than ``DENSE_POINTS`` points shows its marker only every
    ``DENSE_MARKEVERY`` of the axes' diagonal (unless it sets ``markevery``), and
    the figure is checked: a text smaller than :data:`MIN_FONT_PT` raises a
    :class:`FigureStyleWarning` (and :func:`save_figure` refuses a figure made wider).
    """
    if height is None:
        height = size[1] if size is not None else nrows * {1: 4.0, 2: 3.0}.get(ncols, 2.4)
    if not height > 0:
        raise ValueError(f"height must be positive, got {height!r}")
    plt = _pyplot()
    subplots.setdefault("layout", "constrained")
    subplots.setdefault("FigureClass", _book_figure_class())
    return plt.subplots(nrows, ncols, figsize=(FIGURE_WIDTH, float(height)), **subplots)


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
        low = vmin if vmin is not None else np.nanmin(matrix)
        high = vmax if vmax is not None else np.nanmax(matrix)
        middle = (low + high) / 2
        for (i, j), value in np.ndenumerate(matrix):
            color = "black" if value > middle else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color=color, fontsize=8)
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    return image


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG with no varying metadata, close it, and return the path.

    The file is :data:`DPI` dots per inch and records its smallest font in image
    pixels (``smallest_font_pt * DPI / 72``) in the PNG text chunk
    :data:`PNG_FONT_KEY`. A figure that breaks the style is refused with a
    ``ValueError`` naming the text that is too small.
    """
    plt = _pyplot()
    path = Path(path)
    if path.suffix != ".png":
        raise ValueError(f"path must end in .png, got {str(path)!r}")
    fig.draw_without_rendering()
    problems = _style_problems(fig)
    if problems:
        raise ValueError(f"fig breaks the book's style: {'; '.join(problems)}")
    smallest_px = smallest_font_pt(fig) * DPI / 72.0
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"Software": None, PNG_FONT_KEY: f"{smallest_px:.2f}"}
    fig.savefig(path, format="png", dpi=DPI, metadata=metadata)
    plt.close(fig)
    return path


_apply_style()
