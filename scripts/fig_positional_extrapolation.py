"""What sinusoidal encodings look like past the training length, extrapolated or interpolated."""

from __future__ import annotations

import numpy as np

from _common import out_dir
from tinyformer.positional import (
    distance_to_seen,
    rotary_frequencies,
    sinusoidal_encoding,
    sinusoidal_encoding_at,
)
from tinyformer.viz import new_figure, save_figure

D_MODEL, TRAIN_LEN, TEST_LEN = 64, 64, 256


def main() -> None:
    """Write positional_extrapolation.png: circle coverage per pair, distance to seen encodings."""
    folder = out_dir(__doc__)
    freqs = rotary_frequencies(D_MODEL)
    seen = sinusoidal_encoding(TRAIN_LEN, D_MODEL)
    step = float(np.linalg.norm(seen[1] - seen[0]))
    positions = np.arange(TEST_LEN)
    extrapolated = distance_to_seen(sinusoidal_encoding(TEST_LEN, D_MODEL), seen)
    squeezed = positions * (TRAIN_LEN / TEST_LEN)  # position interpolation
    interpolated = distance_to_seen(sinusoidal_encoding_at(squeezed, D_MODEL), seen)

    fig, (ax_turns, ax_dist) = new_figure(1, 2, size=(7.8, 3.6))
    pairs = np.arange(len(freqs))
    for length, color in ((TEST_LEN, "tab:orange"), (TRAIN_LEN, "tab:blue")):
        turns = np.minimum((length - 1) * freqs / (2 * np.pi), 1.0)
        ax_turns.bar(pairs, turns, color=color, label=f"positions 0-{length - 1}")
    ax_turns.set_xlabel("pair i (slower to the right)")
    ax_turns.set_ylabel("fraction of the circle swept")
    ax_turns.set_title("angles each pair visits")
    ax_turns.legend(fontsize=8)

    ax_dist.axvspan(0, TRAIN_LEN - 1, color="tab:blue", alpha=0.12, label="training positions")
    ax_dist.plot(positions, extrapolated, color="tab:orange", label="extrapolated: p")
    ax_dist.plot(
        positions,
        interpolated,
        color="tab:green",
        lw=0.9,
        label=f"interpolated: p x {TRAIN_LEN}/{TEST_LEN}",
    )
    ax_dist.axhline(step, color="black", ls="--", lw=1, label="step between neighbours")
    ax_dist.set_xlabel(f"position p (sequence of {TEST_LEN})")
    ax_dist.set_ylabel("distance to nearest seen encoding")
    ax_dist.set_title(f"trained on positions 0-{TRAIN_LEN - 1}")
    ax_dist.legend(fontsize=8, loc="center right")
    save_figure(fig, folder / "positional_extrapolation.png")


if __name__ == "__main__":
    main()
