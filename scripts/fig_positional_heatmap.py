"""The sinusoidal position table, positions 0-63 over d_model = 64, and the sine of four pairs.

Each curve is labelled with its pair index i and wavelength λ = 2π / ω_i in positions.
"""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.positional import rotary_frequencies, sinusoidal_encoding
from tinyformer.viz import new_figure, save_figure

N_POSITIONS, D_MODEL = 64, 64
PAIRS = (0, 4, 8, 16)  # the sine column 2i of each of these pairs i is drawn as a curve
OFFSET = 2.5  # vertical gap between the curves


def main() -> None:
    """Write positional_heatmap.png: the table as an image, and four pairs' sines as curves."""
    folder = out_dir(__doc__)
    table = sinusoidal_encoding(N_POSITIONS, D_MODEL)  # (64, 64)
    wavelengths = 2 * np.pi / rotary_frequencies(D_MODEL)
    fig, (ax_map, ax_cols) = new_figure(1, 2, height=3.6)

    image = ax_map.imshow(table, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax_map.set_xlabel("dimension j\n(even: sin, odd: cos)")
    ax_map.set_ylabel("position p")
    ax_map.set_title(f"PE[p, j], d_model = {D_MODEL}")
    fig.colorbar(image, ax=ax_map, label="value")

    labels = []
    for row, pair in enumerate(PAIRS):  # markers and line styles from the book's style
        ax_cols.plot(table[:, 2 * pair] + OFFSET * row, markersize=2.5)
        labels.append(f"pair {pair}\nλ = {wavelengths[pair]:.1f}")
    ax_cols.set_yticks([OFFSET * row for row in range(len(PAIRS))], labels=labels)
    ax_cols.set_xlabel("position p")
    ax_cols.set_title("sin(p ω_i) of four pairs i")
    save_figure(fig, folder / "positional_heatmap.png")


if __name__ == "__main__":
    main()
