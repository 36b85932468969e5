"""Every attention head of the trained reversal model on one held-out source of length 8.

The model is the book's stored reversal run (``tinyformer.experiments.run``), loaded,
never trained here. It reads one held-out source with teacher forcing (the decoder's
input is ``<bos>`` followed by the correct reversed string); the figure draws, one panel
per head, the weights of the encoder self-attention, the decoder (masked)
self-attention and the cross-attention of each layer, on one shared colour scale.
"""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.data import make_batch
from tinyformer.experiments import run
from tinyformer.experiments.reverse import reversal_data
from tinyformer.viz import heatmap, new_figure, save_figure

SOURCE_LENGTH = 8


def example_source(split) -> np.ndarray:
    """The first held-out source of ``SOURCE_LENGTH`` symbols, all different (unambiguous copies)."""
    for source, _ in (split.heldout[i] for i in range(len(split.heldout))):
        if len(source) == SOURCE_LENGTH and len(set(source.tolist())) == SOURCE_LENGTH:
            return source
    raise LookupError(f"no held-out source of {SOURCE_LENGTH} distinct symbols")


def head_weights(model, source: np.ndarray, target: np.ndarray) -> dict[str, list[np.ndarray]]:
    """Teacher-forced forward of one pair; each layer's weights ``(h, T_q, T_k)`` by kind."""
    batch = make_batch([source], [target])
    model.forward(batch.source_ids, batch.decoder_input_ids)
    return {
        "encoder self-attention": [
            b.self_attention.layer.attention_weights[0] for b in model.encoder.layers
        ],
        "decoder self-attention": [
            b.self_attention.layer.attention_weights[0] for b in model.decoder.layers
        ],
        "cross-attention": [
            b.cross_attention.layer.attention_weights[0] for b in model.decoder.layers
        ],
    }


def main() -> None:
    """Write attention_heads.png: one row per layer and kind of attention, one column per head."""
    folder = out_dir(__doc__)
    model = run("reversal", seed=0).model
    model.eval()
    task, split, _, _ = reversal_data(seed=0)
    source = example_source(split)
    target = task.target(source)
    tokens = task.tokenizer.tokens
    source_labels = [tokens[i] for i in source]
    decoder_labels = ["<bos>"] + [tokens[i] for i in target]
    kinds = head_weights(model, source, target)
    labels = {  # (query labels, key labels)
        "encoder self-attention": (source_labels, source_labels),
        "decoder self-attention": (decoder_labels, decoder_labels),
        "cross-attention": (decoder_labels, source_labels),
    }
    n_layers = len(model.encoder.layers)
    n_heads = model.config.n_heads
    fig, axes = new_figure(3 * n_layers, n_heads, height=13.0)
    row = 0
    for kind, layers in kinds.items():
        queries, keys = labels[kind]
        for layer, weights in enumerate(layers, start=1):
            for head in range(n_heads):
                ax = axes[row, head]
                shown_rows = queries if head == 0 else None
                heatmap(
                    ax,
                    weights[head],
                    xlabels=keys,
                    ylabels=shown_rows,
                    cmap="cividis",
                    vmin=0.0,
                    vmax=1.0,
                    colorbar=False,
                )
                ax.tick_params(axis="both", labelsize=8, length=2)
                ax.set_xticks(range(len(keys)), labels=keys, rotation=90, ha="center")
                if head:
                    ax.set_yticks([])
                ax.set_title(f"head {head + 1}")
            axes[row, 0].set_ylabel(f"{kind}\nlayer {layer}\nquery")
            row += 1
    for ax in axes[-1]:
        ax.set_xlabel("key")
    fig.colorbar(axes[0, 0].images[0], ax=axes, label="attention weight", shrink=0.5, aspect=30)
    save_figure(fig, folder / "attention_heads.png")


if __name__ == "__main__":
    main()
