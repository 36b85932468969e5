"""Loss curves of the book's two training runs, from the experiment store.

Left: the reversal model's training loss and its validation exact match.
Right: the Markov language model's training loss and held-out-style validation
loss against the source's entropy rate H, the lowest loss any model can reach.
Both runs come from ``tinyformer.experiments.run``: trained once per version of
the package, shared with the chapters and the tests.
"""

from __future__ import annotations

from _common import out_dir
from tinyformer.experiments import run
from tinyformer.viz import new_figure, save_figure


def main() -> None:
    """Write training_curves.png: one panel per run."""
    folder = out_dir(__doc__)
    reversal = run("reversal", seed=0)
    markov = run("markov_lm", seed=0)
    fig, (ax_rev, ax_lm) = new_figure(1, 2, height=3.6)

    steps = reversal.history.column("step")
    ax_rev.plot(steps, reversal.history.column("loss"), label="training loss")
    ax_rev.set_yscale("log")
    ax_rev.set_xlabel("step")
    ax_rev.set_ylabel("cross-entropy (nats), log scale")
    ax_rev.set_title("reversal\n(encoder-decoder)")
    ax_acc = ax_rev.twinx()
    ax_acc.plot(
        reversal.history.column("step", "eval"),
        reversal.history.column("exact_match", "eval"),
        color="C1",  # the twin axes' cycle would start again at C0
        linestyle="--",
        marker="s",
        label="validation exact match",
    )
    ax_acc.set_ylim(0, 1.02)
    ax_acc.set_ylabel("exact match")
    ax_acc.spines["right"].set_visible(True)
    lines = ax_rev.get_lines() + ax_acc.get_lines()
    ax_rev.legend(lines, [line.get_label() for line in lines], loc="lower left")

    h = markov.metrics["entropy_rate"]
    ax_lm.plot(
        markov.history.column("step"),
        markov.history.column("loss"),
        label="training loss (all positions)",
    )
    ax_lm.plot(
        markov.history.column("step", "eval"),
        markov.history.column("loss_full_context", "eval"),
        label="validation loss (full context)",
    )
    ax_lm.axhline(h, color="black", linestyle=":", marker="", label="entropy rate H")
    ax_lm.set_ylim(h - 0.2, h + 1.5)
    ax_lm.set_xlabel("step")
    ax_lm.set_ylabel("cross-entropy (nats)")
    ax_lm.set_title("Markov language model\n(decoder-only)")
    ax_lm.legend(loc="upper right")
    save_figure(fig, folder / "training_curves.png")


if __name__ == "__main__":
    main()
