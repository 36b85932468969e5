"""Attention weights of a small causal self-attention on a short sentence."""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.attention import scaled_dot_product_attention
from tinyformer.masks import causal_mask
from tinyformer.positional import sinusoidal_encoding
from tinyformer.viz import heatmap, new_figure, save_figure

WORDS = ["the", "cat", "sat", "on", "the", "mat", "because", "it", "was", "tired"]
D_MODEL, SEED = 16, 4


def main() -> None:
    """Write attention_heatmap.png: one matrix without a mask, one with a causal mask."""
    folder = out_dir(__doc__)
    rng = np.random.default_rng(SEED)
    vocab = {w: i for i, w in enumerate(dict.fromkeys(WORDS))}
    embeddings = rng.standard_normal((len(vocab), D_MODEL))
    x = embeddings[[vocab[w] for w in WORDS]] + sinusoidal_encoding(len(WORDS), D_MODEL)
    w_q, w_k = rng.standard_normal((2, D_MODEL, D_MODEL)) / np.sqrt(D_MODEL)
    q, k = x @ w_q, x @ w_k
    _, full = scaled_dot_product_attention(q, k, x)
    _, causal = scaled_dot_product_attention(q, k, x, causal_mask(len(WORDS)))

    fig, axes = new_figure(1, 2, size=(10.0, 4.4))
    for ax, weights, title in zip(axes, (full, causal), ("no mask", "causal mask"), strict=True):
        heatmap(ax, weights, xlabels=WORDS, ylabels=WORDS, vmin=0, vmax=1, colorbar=False)
        ax.set_title(f"attention weights, {title}")
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(axes[1].images[0], ax=axes, label="weight")
    save_figure(fig, folder / "attention_heatmap.png")


if __name__ == "__main__":
    main()
