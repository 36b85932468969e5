"""The book's link-preview card: its title over the sinusoidal position table, computed.

Social sites and chat programs show this image (named by the ``og:image`` tag of every
page) when someone shares a link to the book. The background is tinyformer's own
sinusoidal encoding of 64 positions over 64 dimensions; 1,024 x 536 pixels, the 1.91:1
shape those previews use.
"""

from __future__ import annotations

from _common import out_dir
from tinyformer.positional import sinusoidal_encoding
from tinyformer.viz import new_figure, save_figure

HEIGHT_IN = 3.35  # 536 pixels at the book's 160 dots per inch; the width is the book's 6.4 in


def main() -> None:
    """Write card.png."""
    folder = out_dir(__doc__)
    table = sinusoidal_encoding(64, 64)  # (positions, dimensions), values in [-1, 1]
    fig, ax = new_figure(height=HEIGHT_IN, layout=None)
    ax.set_position((0.0, 0.0, 1.0, 1.0))
    ax.imshow(table, cmap="RdBu_r", vmin=-2.0, vmax=2.0, aspect="auto", interpolation="nearest")
    ax.set_axis_off()
    band = {
        "facecolor": "#10151c",
        "alpha": 0.82,
        "edgecolor": "none",
        "boxstyle": "square,pad=0.6",
    }
    ax.text(0.5, 0.6, "Understanding Transformers", transform=ax.transAxes, ha="center",
            va="center", fontsize=26, color="white", weight="bold", bbox=band)  # fmt: skip
    ax.text(0.5, 0.33, "The transformer from first principles, in NumPy, executed on every page",
            transform=ax.transAxes, ha="center", va="center", fontsize=11, color="white",
            bbox=band)  # fmt: skip
    save_figure(fig, folder / "card.png")


if __name__ == "__main__":
    main()
