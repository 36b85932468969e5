"""Why attention divides its scores by sqrt(d_k): score spread, peakedness and gradient vs d_k."""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.analysis import softmax_saturation
from tinyformer.viz import new_figure, save_figure

D_KS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
SEQ_LEN, SEED = 32, 0
# Label of each curve and the power p in the scale s = d_k ** -p; colours, markers and
# line styles come from the book's style, in this order.
VARIANTS = [
    ("no scaling, $s = 1$", 0.0),
    (r"$s = 1/\sqrt{d_k}$", 0.5),
    ("$s = 1/d_k$", 1.0),
]


def scale_for(power: float, d_k: int) -> float | None:
    """The scale d_k ** -power; None (tinyformer's default, 1/sqrt(d_k)) for power 0.5."""
    return None if power == 0.5 else float(d_k) ** -power


def main() -> None:
    """Write attention_scaling.png: three stacked panels against d_k for three choices of scale."""
    folder = out_dir(__doc__)
    fig, (ax_std, ax_max, ax_grad) = new_figure(3, 1, height=7.2, sharex=True)
    for label, power in VARIANTS:
        reports = [
            softmax_saturation(
                d_k, scale=scale_for(power, d_k), seq_len=SEQ_LEN, rng=np.random.default_rng(SEED)
            )
            for d_k in D_KS
        ]
        ax_std.plot(D_KS, [r.score_std for r in reports], label=label)
        ax_max.plot(D_KS, [r.max_weight for r in reports], label=label)
        ax_grad.plot(D_KS, [r.score_grad_norm for r in reports], label=label)

    ax_std.set_yscale("log", base=2)
    ax_std.set_title("spread of the scores")
    ax_std.set_ylabel("std of the\nsoftmax's input")
    ax_std.legend(loc="upper left")
    ax_max.axhline(1.0 / SEQ_LEN, color="black", linewidth=0.8, linestyle=":", marker="")
    ax_max.text(300, 2.2 / SEQ_LEN, f"uniform: 1/{SEQ_LEN}", ha="center")
    ax_max.set_ylim(0, 1.05)
    ax_max.set_title("how peaked each row is")
    ax_max.set_ylabel("mean largest\nweight in a row")
    ax_grad.set_yscale("log")
    ax_grad.set_title("gradient reaching the scores")
    ax_grad.set_ylabel("median norm of a\n" r"row of $\partial L/\partial S$")
    ax_grad.set_xscale("log", base=2)
    ax_grad.set_xlabel("$d_k$")
    save_figure(fig, folder / "attention_scaling.png")


if __name__ == "__main__":
    main()
