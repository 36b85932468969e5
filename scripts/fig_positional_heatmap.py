"""Heatmap of the sinusoidal position table: positions 0-63, d_model = 64."""

from __future__ import annotations

from _common import out_dir
from tinyformer.positional import sinusoidal_encoding
from tinyformer.viz import new_figure, save_figure

N_POSITIONS, D_MODEL = 64, 64


def main() -> None:
    """Write positional_heatmap.png."""
    folder = out_dir(__doc__)
    table = sinusoidal_encoding(N_POSITIONS, D_MODEL)
    fig, ax = new_figure(size=(7.0, 4.8))
    image = ax.imshow(table, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", origin="upper")
    ax.set_xlabel("encoding dimension (even: sine, odd: cosine)")
    ax.set_ylabel("position p")
    ax.set_title(f"Sinusoidal positional encoding, d_model = {D_MODEL}")
    fig.colorbar(image, ax=ax, label="value")
    save_figure(fig, folder / "positional_heatmap.png")


if __name__ == "__main__":
    main()
