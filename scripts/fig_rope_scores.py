"""Attention scores of one repeated token: added sinusoids versus rotary positions (RoPE)."""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.positional import apply_rotary, sinusoidal_encoding
from tinyformer.viz import heatmap, new_figure, save_figure

N_POSITIONS, D_MODEL, SEED = 64, 64, 0


def main() -> None:
    """Write rope_scores.png: the score matrices q_m . k_n of the same token at every position."""
    folder = out_dir(__doc__)
    rng = np.random.default_rng(SEED)
    token = rng.standard_normal(D_MODEL)
    w_q, w_k = rng.standard_normal((2, D_MODEL, D_MODEL)) / np.sqrt(D_MODEL)
    same = np.tile(token, (N_POSITIONS, 1))  # (T, d_model): one token repeated

    x = same + sinusoidal_encoding(N_POSITIONS, D_MODEL)  # positions added to the input
    added = (x @ w_q) @ (x @ w_k).T  # (T, T)
    rotated = apply_rotary(same @ w_q) @ apply_rotary(same @ w_k).T  # (T, T)

    fig, axes = new_figure(1, 2, size=(7.8, 3.4))
    for ax, scores, title in zip(
        axes,
        (added, rotated),
        ("sinusoids added to the input", "RoPE: q, k rotated by position"),
        strict=True,
    ):
        image = heatmap(ax, scores, cmap="magma", colorbar=False)
        fig.colorbar(image, ax=ax, label="score")
        ax.set_title(title)
        ax.set_xlabel("key position n")
        ax.set_ylabel("query position m")
    save_figure(fig, folder / "rope_scores.png")


if __name__ == "__main__":
    main()
