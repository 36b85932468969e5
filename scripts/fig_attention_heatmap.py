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
    """Write attention_heatmap.png: one row of three weight matrices, one per mask."""
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

    fig, axes = new_figure(1, 3, size=(12.0, 4.4))
    for ax, (weights, words, title) in zip(axes, panels, strict=True):
        heatmap(ax, weights, xlabels=words, ylabels=words, vmin=0, vmax=1, colorbar=False)
        ax.set_title(title)
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    axes[2].text(
        len(WORDS) - 1, 1, "rows with every key\nmasked: weights all 0", ha="right", va="center"
    )
    fig.colorbar(axes[2].images[0], ax=axes, label="attention weight", shrink=0.9)
    save_figure(fig, folder / "attention_heatmap.png")


if __name__ == "__main__":
    main()
