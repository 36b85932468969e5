"""The sinusoidal position table, positions 0-63 over d_model = 64, and four of its columns.

The curves are labelled with their wavelength λ = 2π / ω_i in positions.
"""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.positional import rotary_frequencies, sinusoidal_encoding
from tinyformer.viz import new_figure, save_figure

N_POSITIONS, D_MODEL = 64, 64
PAIRS = (0, 4, 8, 16)  # sine columns 2i of these pairs i are drawn as curves


def main() -> None:
    """Write positional_heatmap.png: the table as an image, and a few sine columns as curves."""
    folder = out_dir(__doc__)
    table = sinusoidal_encoding(N_POSITIONS, D_MODEL)  # (64, 64)
    freqs = rotary_frequencies(D_MODEL)
    fig, (ax_map, ax_cols) = new_figure(1, 2, size=(7.8, 3.6))

    image = ax_map.imshow(table, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax_map.set_xlabel("dimension j (even: sin, odd: cos)")
    ax_map.set_ylabel("position p")
    ax_map.set_title(f"PE[p, j], d_model = {D_MODEL}")
    fig.colorbar(image, ax=ax_map, label="value")

    positions = np.arange(N_POSITIONS)
    labels = []
    for offset, pair in enumerate(PAIRS):
        ax_cols.plot(positions, table[:, 2 * pair] + 2.5 * offset, marker=".", markersize=2)
        labels.append(f"col {2 * pair}\nλ = {2 * np.pi / freqs[pair]:.1f}")
    ax_cols.set_yticks([2.5 * o for o in range(len(PAIRS))], labels=labels)
    ax_cols.set_xlabel("position p")
    ax_cols.set_title("sine columns of four pairs")
    save_figure(fig, folder / "positional_heatmap.png")


if __name__ == "__main__":
    main()
