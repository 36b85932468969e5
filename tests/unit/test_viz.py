"""The book's figure style: deterministic PNG files, readable text, colour-blind-safe series."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import matplotlib as mpl
import matplotlib.pyplot as plt
from PIL import Image

from tinyformer import viz
from tinyformer.viz import heatmap, new_figure, save_figure, smallest_font_pt


def _draw(path, matrix):
    fig, ax = new_figure(size=(3.0, 2.5))
    heatmap(ax, matrix, xlabels=["a", "b", "c"], ylabels=["x", "y"], annotate=True)
    return save_figure(fig, path)


def _busy_figure(rng):
    """A figure with every kind of text the book's figures use, all at their default sizes."""
    fig, axes = new_figure(2, 2, sharex=False)
    for i, ax in enumerate(axes.flat[:3]):
        for k in range(3):
            ax.plot(rng.random(5), label=f"series {k}")
        ax.set(title=f"panel {i}", xlabel="x", ylabel="y")
        ax.legend(title="legend")
        ax.text(0.5, 0.5, "note")
        ax.annotate("arrow", xy=(1, 0.5), xytext=(2, 0.8), arrowprops={"arrowstyle": "->"})
    heatmap(axes[1, 1], rng.random((3, 3)), xlabels="abc", ylabels="xyz", annotate=True)
    fig.suptitle("a figure")
    fig.supxlabel("shared x")
    return fig


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
    plt.close(fig)


def test_bad_input_is_named(tmp_path):
    fig, ax = new_figure()
    with pytest.raises(ValueError, match=r"matrix must be 2-D, got shape \(3,\)"):
        heatmap(ax, np.ones(3))
    with pytest.raises(ValueError, match=r"path must end in \.png"):
        save_figure(fig, tmp_path / "figure.jpg")
    with pytest.raises(ValueError, match=r"height must be positive, got -1"):
        new_figure(height=-1)


def test_the_smallest_font_is_at_least_nine_css_pixels_at_the_displayed_width():
    shown = viz.displayed_font_px(viz.MIN_FONT_PT)
    assert shown == pytest.approx(viz.MIN_FONT_PT * 672 / (72 * viz.FIGURE_WIDTH))
    assert shown >= viz.MIN_FONT_CSS_PX
    # Files are at least as wide as the display, so the browser shrinks, never enlarges them.
    assert viz.FIGURE_WIDTH * viz.DPI >= viz.DISPLAY_WIDTH_PX


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (2, 1), (3, 1), (2, 3)])
def test_every_figure_is_one_width_and_taller_with_more_rows(shape):
    fig, _ = new_figure(*shape)
    width, height = fig.get_size_inches()
    assert width == viz.FIGURE_WIDTH
    assert height >= 2.4 * shape[0]
    plt.close(fig)
    fig, _ = new_figure(*shape, size=(13.0, 5.0))  # an old call's width is not honoured
    assert tuple(fig.get_size_inches()) == (viz.FIGURE_WIDTH, 5.0)
    plt.close(fig)


def test_every_text_of_a_style_made_figure_is_at_least_the_minimum(rng):
    fig = _busy_figure(rng)
    fig.draw_without_rendering()
    texts = viz._texts(fig)
    assert len(texts) > 40  # tick labels, titles, legends, notes and cell values are all seen
    assert smallest_font_pt(fig) >= viz.MIN_FONT_PT
    plt.close(fig)


def test_page_figures_get_the_style_from_rcparams(rng):
    with viz.book_style():
        fig, ax = plt.subplots()  # as a page cell might, without new_figure
        ax.plot(rng.random(4), label="one")
        ax.legend()
        fig.draw_without_rendering()
        assert smallest_font_pt(fig) >= viz.MIN_FONT_PT
        assert fig.dpi == viz.DPI
        assert fig.get_size_inches()[0] == viz.FIGURE_WIDTH
        plt.close(fig)


def test_new_figure_restores_the_style_after_a_reset():
    mpl.rcdefaults()
    fig, _ = new_figure()
    assert mpl.rcParams["font.size"] == viz.BOOK_STYLE["font.size"]
    assert fig.dpi == viz.DPI
    plt.close(fig)


def test_the_cycle_is_petroff10_and_no_series_depends_on_colour_alone():
    # The style as a figure of the book gets it (another test may have reset matplotlib's
    # settings in this process: which one ran before depends on how pytest-xdist shared them).
    plt.close(new_figure()[0])
    cycle = list(mpl.rcParams["axes.prop_cycle"])
    colours = [entry["color"] for entry in cycle]
    assert colours == list(viz.PETROFF10)
    if "petroff10" in mpl.style.library:  # matplotlib >= 3.10
        assert colours == mpl.style.library["petroff10"]["axes.prop_cycle"].by_key()["color"]
    markers = [entry["marker"] for entry in cycle]
    assert len(set(markers)) == len(cycle)  # each colour has its own marker
    fig, ax = new_figure()
    lines = [ax.plot([0, 1], [k, k])[0] for k in range(4)]
    assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) == 4
    plt.close(fig)


def test_small_text_warns_when_drawn_and_is_refused_when_saved(tmp_path):
    fig, ax = new_figure()
    ax.plot([0, 1])
    ax.text(0.5, 0.5, "tiny note", fontsize=6)
    with pytest.warns(viz.FigureStyleWarning, match=r"'tiny note' is 6 pt"):
        fig.canvas.draw()
    with (
        pytest.warns(viz.FigureStyleWarning),
        pytest.raises(ValueError, match=r"fig breaks the book's style: text 'tiny note' is 6 pt"),
    ):
        save_figure(fig, tmp_path / "tiny.png")
    plt.close(fig)


def test_a_widened_figure_is_refused(tmp_path):
    fig, ax = new_figure()
    ax.plot([0, 1])
    fig.set_size_inches(12, 4)
    with pytest.raises(ValueError, match=r"figure is 12 in wide, wider than 6.4 in"):
        save_figure(fig, tmp_path / "wide.png")
    plt.close(fig)


def test_a_tight_bounding_box_is_not_taken_for_a_wider_figure(tmp_path):
    """The inline backend saves with bbox_inches="tight": a label sticking out is no error."""
    fig, ax = new_figure()
    ax.plot([0, 1])
    ax.text(1.2, 0.5, "a note beyond the right edge", transform=ax.transAxes)
    fig.savefig(tmp_path / "tight.png", bbox_inches="tight")  # no FigureStyleWarning
    plt.close(fig)


def test_saved_png_records_its_smallest_font_in_pixels(tmp_path, rng):
    fig = _busy_figure(rng)
    fig.draw_without_rendering()
    expected = smallest_font_pt(fig) * viz.DPI / 72
    path = save_figure(fig, tmp_path / "busy.png")
    with Image.open(path) as image:
        assert image.size[0] == round(viz.FIGURE_WIDTH * viz.DPI)
        recorded = float(image.text[viz.PNG_FONT_KEY])
    assert recorded == pytest.approx(expected, abs=0.01)
    assert recorded * viz.DISPLAY_WIDTH_PX / image.size[0] >= viz.MIN_FONT_CSS_PX


def test_dense_lines_show_a_marker_every_tenth_of_the_diagonal_sparse_ones_at_every_point():
    fig, ax = new_figure()
    (dense,) = ax.plot(np.arange(200.0))
    (sparse,) = ax.plot(np.arange(10.0))
    (chosen,) = ax.plot(np.arange(200.0), markevery=5)
    fig.draw_without_rendering()
    assert dense.get_markevery() == viz.DENSE_MARKEVERY
    assert sparse.get_markevery() is None
    assert chosen.get_markevery() == 5
    plt.close(fig)
