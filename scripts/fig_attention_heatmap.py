"""Attention weights of one small self-attention under three masks: none, causal, causal + padding."""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.attention import scaled_dot_product_attention
from tinyformer.masks import causal_mask, combine_masks, padding_mask
from tinyformer.viz import heatmap, new_figure, save_figure

WORDS = ["the", "cat", "sat", "on", "the", "mat", "because", "it", "was", "tired"]
N_PAD = 3  # the third panel pads a shorter sentence on the left with this many PAD tokens
D_MODEL, SEED = 16, 4


def main() -> None:
    """Write attention_heatmap.png: three weight matrices, one per mask, two to a row."""
    folder = out_dir(__doc__)
    rng = np.random.default_rng(SEED)
    vocab = {w: i for i, w in enumerate(["<pad>", *dict.fromkeys(WORDS)])}
    embeddings = rng.standard_normal((len(vocab), D_MODEL))
    w_q, w_k = rng.standard_normal((2, D_MODEL, D_MODEL)) / np.sqrt(D_MODEL)
    padded = ["<pad>"] * N_PAD + WORDS[: len(WORDS) - N_PAD]
    ids = np.array([[vocab[w] for w in WORDS], [vocab[w] for w in padded]])  # (B, T)
    x = embeddings[ids]  # (B, T, d_model); no positions, so the two 'the' rows are equal
    q, k = x @ w_q, x @ w_k  # (B, T, d_model) each

    causal = causal_mask(len(WORDS))  # (T, T), True where a query may attend
    both = combine_masks(causal, padding_mask(ids, vocab["<pad>"]))  # (B, T, T)
    _, no_mask = scaled_dot_product_attention(q, k, x)
    _, with_causal = scaled_dot_product_attention(q, k, x, causal)
    _, with_both = scaled_dot_product_attention(q, k, x, both)
    # Masked cells are drawn blank (NaN), so that they stand apart from small weights.
    panels = [
        (no_mask[0], WORDS, "no mask"),
        (np.where(causal, with_causal[0], np.nan), WORDS, "causal mask"),
        (np.where(both[1], with_both[1], np.nan), padded, "causal + padding mask"),
    ]

    # Two panels per row, so that ten words fit under each panel at the book's width;
    # the fourth place holds the colour scale and the note on fully masked rows.
    fig, grid = new_figure(2, 2, height=6.6)
    axes = [grid[0, 0], grid[0, 1], grid[1, 0]]
    for ax, (weights, words, title) in zip(axes, panels, strict=True):
        heatmap(ax, weights, xlabels=words, ylabels=words, vmin=0, vmax=1, colorbar=False)
        ax.set_title(title)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    legend = grid[1, 1]
    legend.axis("off")
    colour_scale = legend.inset_axes((0.0, 0.1, 0.07, 0.8))
    fig.colorbar(axes[0].images[0], cax=colour_scale, label="attention weight")
    note = "blank: masked keys\n\nthe <pad> rows of\nthe padded sentence\nhave every key\nmasked: weights all 0"
    legend.text(0.36, 0.5, note, va="center")
    save_figure(fig, folder / "attention_heatmap.png")


if __name__ == "__main__":
    main()
