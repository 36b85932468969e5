"""Why attention divides its scores by sqrt(d_k): score spread, peakedness and gradient vs d_k."""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.analysis import softmax_saturation
from tinyformer.viz import new_figure, save_figure

D_KS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
SEQ_LEN, SEED = 32, 0
# Label, colour, line style and marker of each curve, and the power p in the scale s = d_k ** -p.
VARIANTS = [
    ("no scaling, $s = 1$", "tab:red", "-", "o", 0.0),
    (r"$s = 1/\sqrt{d_k}$", "tab:blue", "-", "s", 0.5),
    ("$s = 1/d_k$", "tab:gray", "--", "^", 1.0),
]


def scale_for(power: float, d_k: int) -> float | None:
    """The scale d_k ** -power; None (tinyformer's default, 1/sqrt(d_k)) for power 0.5."""
    return None if power == 0.5 else float(d_k) ** -power


def main() -> None:
    """Write attention_scaling.png: three panels against d_k for three choices of scale."""
    folder = out_dir(__doc__)
    fig, (ax_std, ax_max, ax_grad) = new_figure(1, 3, size=(11.0, 3.6))
    for label, colour, style, marker, power in VARIANTS:
        reports = [
            softmax_saturation(
                d_k, scale=scale_for(power, d_k), seq_len=SEQ_LEN, rng=np.random.default_rng(SEED)
            )
            for d_k in D_KS
        ]
        kw = {
            "color": colour,
            "linestyle": style,
            "marker": marker,
            "markersize": 4,
            "label": label,
        }
        ax_std.plot(D_KS, [r.score_std for r in reports], **kw)
        ax_max.plot(D_KS, [r.max_weight for r in reports], **kw)
        ax_grad.plot(D_KS, [r.score_grad_norm for r in reports], **kw)

    ax_std.set_yscale("log", base=2)
    ax_std.set_title("spread of the scores")
    ax_std.set_ylabel("std of the softmax's input")
    ax_max.axhline(1.0 / SEQ_LEN, color="black", linewidth=0.8, linestyle=":")
    ax_max.text(300, 2.2 / SEQ_LEN, f"uniform: 1/{SEQ_LEN}", fontsize=8, ha="center")
    ax_max.set_ylim(0, 1.05)
    ax_max.set_title("how peaked each row is")
    ax_max.set_ylabel("mean largest weight in a row")
    ax_grad.set_yscale("log")
    ax_grad.set_title("gradient reaching the scores")
    ax_grad.set_ylabel(r"median norm of a row of $\partial L/\partial S$")
    for ax in (ax_std, ax_max, ax_grad):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("$d_k$")
    ax_grad.legend(loc="lower left", fontsize=8)
    save_figure(fig, folder / "attention_scaling.png")


if __name__ == "__main__":
    main()
