"""Dot products of sinusoidal encodings depend only on the offset between the positions."""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.positional import sinusoidal_encoding, sinusoidal_encoding_at
from tinyformer.viz import heatmap, new_figure, save_figure

N_POSITIONS, D_MODEL = 64, 64
ANCHORS = (300, 1000, 5000)  # positions p whose dot products with p + k are drawn
MAX_OFFSET = 200


def main() -> None:
    """Write positional_dot_products.png: the Gram matrix, and dot product against offset."""
    folder = out_dir(__doc__)
    table = sinusoidal_encoding(N_POSITIONS, D_MODEL)
    gram = table @ table.T  # (64, 64): entry (p, q) = PE(p) . PE(q)
    offsets = np.arange(-MAX_OFFSET, MAX_OFFSET + 1)

    fig, (ax_gram, ax_curve) = new_figure(1, 2, size=(7.8, 3.4))
    image = heatmap(ax_gram, gram, colorbar=False)
    fig.colorbar(image, ax=ax_gram, label="dot product")
    ax_gram.set_xlabel("position q")
    ax_gram.set_ylabel("position p")
    ax_gram.set_title("PE(p) . PE(q)")

    styles = (
        {"lw": 5, "alpha": 0.35, "color": "grey"},
        {"lw": 1.6, "ls": "--", "color": "black"},
        {"lw": 0.9, "color": "tab:orange"},
    )
    for anchor, style in zip(ANCHORS, styles, strict=True):
        here = sinusoidal_encoding_at(np.array([anchor]), D_MODEL)[0]
        there = sinusoidal_encoding_at(anchor + offsets, D_MODEL)  # (401, 64)
        ax_curve.plot(offsets, there @ here, label=f"p = {anchor}", **style)
    ax_curve.axhline(0, color="grey", lw=0.5)
    ax_curve.set_xlabel("offset k")
    ax_curve.set_ylabel("PE(p) . PE(p + k)")
    ax_curve.set_title("PE(p) . PE(p + k) from three p")
    ax_curve.legend(title="starting position", fontsize=8)
    save_figure(fig, folder / "positional_dot_products.png")


if __name__ == "__main__":
    main()
