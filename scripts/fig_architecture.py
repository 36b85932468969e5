"""The transformer as block diagrams: the encoder-decoder and the decoder-only model side by side.

Every box is a layer of ``tinyformer``, every arrow is labelled with the shape of the array
it carries (batch first: ``B`` sequences, ``S`` source and ``T`` target positions, ``h``
heads of width ``d_k``, vocabulary ``V``). The encoder-decoder is drawn post-norm (each
sub-layer's sum normalized, as in the original paper and the book's reversal model), the
decoder-only model pre-norm (a norm before each sub-layer and one after the last block, as
in the book's language model). Three files: the whole, then the encoder's part and the
decoders' part highlighted (everything else faded).
"""

from __future__ import annotations

from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

from _common import out_dir
from tinyformer.viz import PETROFF10, new_figure, save_figure

HEIGHT = 8.8  # inches; the width is the book's FIGURE_WIDTH, and one data unit is one inch
FONT, SMALL = 8.5, 8.0  # points: box text, shape labels (the book's smallest allowed is 8)
INK, SHAPE_INK = "#222222", "#4a4a4a"
FADED = 0.22  # opacity of the parts a highlighted version does not highlight
ARROW, SHORT = 0.34, 0.26  # lengths of the arrows between parts, inches
BOX_H, ADD_R = 0.3, 0.085  # one-line box height, radius of a residual sum


def tint(colour: str, amount: float = 0.72) -> tuple[float, float, float]:
    """``colour`` mixed with white (``amount`` of white): a pale fill that keeps black text legible."""
    rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return tuple(c + (1 - c) * amount for c in rgb)


FILL = {
    "embed": tint(PETROFF10[4]),
    "attention": tint(PETROFF10[0]),
    "ffn": tint(PETROFF10[1]),
    "norm": tint(PETROFF10[3], 0.6),
    "output": tint(PETROFF10[5]),
}


def shape(*axes: str) -> str:
    """An array shape in the book's notation, as mathtext: ``shape("B", "T", "d")``."""
    names = {"d": r"d_{\mathrm{model}}", "dff": r"d_{\mathrm{ff}}", "dk": "d_k"}
    return "$(" + ", ".join(names.get(a, a) for a in axes) + ")$"


class Column:
    """One vertical stack of parts, drawn bottom to top; ``y`` is where the next part starts.

    (A plain class, not a dataclass: ``make_figures.py`` loads each script as a module that
    is not in ``sys.modules``, where dataclasses cannot resolve their annotations.)
    """

    def __init__(self, ax, *, cx: float, width: float, alpha: float = 1.0) -> None:
        self.ax = ax
        self.cx = cx  # centre of the main path, inches
        self.width = width  # width of its boxes
        self.alpha = alpha
        self.y = 0.15
        self.last_arrow = (0.0, 0.0)
        self.boxes: dict[str, tuple[float, float, float, float]] = {}

    @property
    def right(self) -> float:
        """Where residual paths run: just right of the boxes."""
        return self.cx + self.width / 2 + 0.13

    def _line(self, xs, ys, *, head: bool = False, lw: float = 1.1) -> None:
        for i in range(len(xs) - 1):
            last = head and i == len(xs) - 2
            self.ax.add_patch(
                FancyArrowPatch(
                    (xs[i], ys[i]),
                    (xs[i + 1], ys[i + 1]),
                    arrowstyle="-|>" if last else "-",
                    mutation_scale=8,
                    lw=lw,
                    color=INK,
                    alpha=self.alpha,
                    shrinkA=0,
                    shrinkB=0,
                )
            )

    def text(self, label: str, *, height: float = 0.2) -> None:
        """A caption for data entering or leaving the column (no box)."""
        self.ax.text(self.cx, self.y + height / 2, label, ha="center", va="center",
                     fontsize=FONT, color=INK, alpha=self.alpha)  # fmt: skip
        self.y += height

    def arrow(self, label: str, length: float = ARROW, *, label_at: float = 0.5) -> None:
        """An arrow up the main path, labelled on its left with the shape it carries.

        ``label_at`` is the label's height as a fraction of the arrow; the arrow is
        remembered, so that a residual path can branch off it.
        """
        self._line([self.cx, self.cx], [self.y, self.y + length], head=True)
        self.ax.text(self.cx - 0.06, self.y + label_at * length, label, ha="right",
                     va="center", fontsize=SMALL, color=SHAPE_INK, alpha=self.alpha)  # fmt: skip
        self.last_arrow = (self.y, self.y + length)
        self.y += length

    def branch(self) -> float:
        """Where a residual path leaves the main path: part-way up the last arrow."""
        start, stop = self.last_arrow
        return start + 0.55 * (stop - start)

    def enter_block(self, label: str) -> float:
        """The long arrow into a block, labelled below the block's frame; returns the frame's bottom."""
        self.arrow(label, 0.56, label_at=0.3)
        return self.y - 0.3

    def box(self, lines: str, kind: str, *, name: str | None = None, height: float = BOX_H):
        """A layer: a rounded box of colour ``FILL[kind]`` with its name (and notes) inside."""
        x0 = self.cx - self.width / 2
        self.ax.add_patch(
            FancyBboxPatch((x0, self.y), self.width, height, alpha=self.alpha,
                           boxstyle="round,pad=0,rounding_size=0.05",
                           facecolor=FILL[kind], edgecolor=INK, lw=0.9)
        )  # fmt: skip
        self.ax.text(self.cx, self.y + height / 2, lines, ha="center", va="center",
                     fontsize=FONT, color=INK, alpha=self.alpha, linespacing=1.15)  # fmt: skip
        if name is not None:
            self.boxes[name] = (x0, self.y, self.width, height)
        self.y += height

    def add(self) -> float:
        """A residual sum: a circle with a plus; returns its centre's height."""
        cy = self.y + ADD_R
        self.ax.add_patch(Circle((self.cx, cy), ADD_R, facecolor="white", edgecolor=INK,
                                 lw=1.0, alpha=self.alpha))  # fmt: skip
        r = ADD_R * 0.6
        self._line([self.cx - r, self.cx + r], [cy, cy], lw=1.0)
        self._line([self.cx, self.cx], [cy - r, cy + r], lw=1.0)
        self.y += 2 * ADD_R
        return cy

    def plus_positions(self, label: str) -> None:
        """Add the position vectors, drawn as a box left of the sum with an arrow into it."""
        cy = self.add()
        w = 0.58
        x1 = self.cx - ADD_R - 0.12
        self.ax.add_patch(
            FancyBboxPatch((x1 - w, cy - 0.13), w, 0.26, boxstyle="round,pad=0,rounding_size=0.05",
                           facecolor=FILL["embed"], edgecolor=INK, lw=0.9, alpha=self.alpha)
        )  # fmt: skip
        self.ax.text(x1 - w / 2, cy, label, ha="center", va="center", fontsize=FONT, color=INK,
                     alpha=self.alpha)  # fmt: skip
        self._line([x1, self.cx - ADD_R], [cy, cy], head=True)

    def residual(self, branch_y: float, join_y: float, join_x: float) -> None:
        """The identity path: from the main path at ``branch_y`` around the sub-layer to ``join_x``."""
        self.ax.add_patch(Circle((self.cx, branch_y), 0.025, color=INK, alpha=self.alpha))
        self._line([self.cx, self.right, self.right, join_x], [branch_y, branch_y, join_y, join_y],
                   head=True)  # fmt: skip

    def post_norm(self, lines: str, kind: str, shapes: str, *, name: str | None = None,
                  height: float = 0.46) -> None:  # fmt: skip
        """``N(x + F(x))``: the sub-layer, then an add-and-norm box the identity path enters."""
        branch = self.branch()  # on the arrow that brought x
        self.box(lines, kind, name=name, height=height)
        self.arrow(shapes, SHORT)
        self.box("add & norm", "norm")
        self.residual(branch, self.y - BOX_H / 2, self.cx + self.width / 2)

    def pre_norm(self, lines: str, kind: str, shapes: str, *, height: float = 0.46) -> None:
        """``x + F(N(x))``: a norm, the sub-layer, and a sum the identity path enters."""
        branch = self.branch()
        self.box("norm", "norm")
        self.arrow(shapes, SHORT)
        self.box(lines, kind, height=height)
        self.arrow(shapes, SHORT)
        cy = self.add()
        self.residual(branch, cy, self.cx + ADD_R)

    def frame(self, bottom: float, label: str) -> None:
        """A dashed frame round one block, from ``bottom`` to the current height, repeated ``label``."""
        x0, x1 = self.cx - self.width / 2 - 0.1, self.right + 0.09
        top = self.y + 0.08
        self.ax.add_patch(
            Rectangle((x0, bottom), x1 - x0, top - bottom, fill=False, ls=(0, (4, 2)), lw=0.9,
                      edgecolor=INK, alpha=self.alpha)
        )  # fmt: skip
        self.ax.text(x1 + 0.04, bottom + 0.02, label, ha="left", va="bottom", fontsize=FONT,
                     color=INK, alpha=self.alpha)  # fmt: skip
        self.y = top


def encoder(col: Column) -> None:
    """The encoder of the encoder-decoder: post-norm blocks under a padding mask."""
    col.text("source tokens")
    col.arrow(shape("B", "S"))
    col.box("embedding", "embed")
    col.arrow(shape("B", "S", "d"))
    col.plus_positions("positions")
    bottom = col.enter_block(shape("B", "S", "d"))
    col.post_norm("self-attention\npadding mask\nheads " + shape("B", "h", "S", "dk"),
                  "attention", shape("B", "S", "d"), height=0.62)  # fmt: skip
    col.arrow(shape("B", "S", "d"))
    col.post_norm("feed-forward\nhidden " + shape("B", "S", "dff"), "ffn", shape("B", "S", "d"))
    col.frame(bottom, r"$\times L$")


def decoder(col: Column) -> None:
    """The decoder of the encoder-decoder: post-norm blocks with cross-attention, and the output."""
    col.text("target, shifted right")
    col.arrow(shape("B", "T"))
    col.box("embedding", "embed")
    col.arrow(shape("B", "T", "d"))
    col.plus_positions("positions")
    bottom = col.enter_block(shape("B", "T", "d"))
    col.post_norm("masked self-attention\ncausal mask\nheads " + shape("B", "h", "T", "dk"),
                  "attention", shape("B", "T", "d"), height=0.62)  # fmt: skip
    col.arrow(shape("B", "T", "d"))
    col.post_norm("cross-attention\nK, V from memory\nsource padding mask\nweights "
                  + shape("B", "h", "T", "S"), "attention", shape("B", "T", "d"), name="cross",
                  height=0.8)  # fmt: skip
    col.arrow(shape("B", "T", "d"))
    col.post_norm("feed-forward\nhidden " + shape("B", "T", "dff"), "ffn", shape("B", "T", "d"))
    col.frame(bottom, r"$\times L$")
    output_layers(col)


def decoder_only(col: Column) -> None:
    """The decoder-only model: pre-norm blocks under a causal mask, a final norm, the output."""
    col.text("tokens")
    col.arrow(shape("B", "T"))
    col.box("embedding", "embed")
    col.arrow(shape("B", "T", "d"))
    col.plus_positions("positions")
    bottom = col.enter_block(shape("B", "T", "d"))
    col.pre_norm("masked self-attention\ncausal mask\nheads " + shape("B", "h", "T", "dk"),
                 "attention", shape("B", "T", "d"), height=0.62)  # fmt: skip
    col.arrow(shape("B", "T", "d"))
    col.pre_norm("feed-forward\nhidden " + shape("B", "T", "dff"), "ffn", shape("B", "T", "d"))
    col.frame(bottom, r"$\times L$")
    col.arrow(shape("B", "T", "d"))
    col.box("final norm", "norm")
    output_layers(col)


def output_layers(col: Column) -> None:
    """The output layer, its logits, and the softmax over the vocabulary."""
    col.arrow(shape("B", "T", "d"))
    col.box("output layer", "output")
    col.arrow(shape("B", "T", "V"))
    col.box("softmax", "output")
    col.arrow(shape("B", "T", "V"))
    col.text("next-token probabilities")


def memory_path(ax, enc: Column, dec: Column, alpha: float) -> None:
    """The encoder's output (the memory) into every decoder block's cross-attention."""
    x0, y0, _, h = dec.boxes["cross"]
    gap_x = (enc.right + 0.1 + x0) / 2 + 0.02
    top = enc.y + 0.18
    ys = [enc.y, top, top, y0 + h / 2, y0 + h / 2]
    xs = [enc.cx, enc.cx, gap_x, gap_x, x0]
    for i in range(len(xs) - 1):
        ax.add_patch(
            FancyArrowPatch((xs[i], ys[i]), (xs[i + 1], ys[i + 1]), lw=1.4, color=INK, alpha=alpha,
                            arrowstyle="-|>" if i == len(xs) - 2 else "-", mutation_scale=9,
                            shrinkA=0, shrinkB=0)
        )  # fmt: skip
    ax.text(enc.cx, top + 0.06, "memory " + shape("B", "S", "d"), ha="center", va="bottom",
            fontsize=SMALL, color=SHAPE_INK, alpha=alpha)  # fmt: skip


def draw(highlight: str | None):
    """The figure, with ``highlight`` ``"encoder"``, ``"decoder"`` or ``None`` (all in full)."""
    fig, ax = new_figure(height=HEIGHT, layout="none")
    ax.set_position((0, 0, 1, 1))
    width = fig.get_size_inches()[0]
    ax.set_xlim(0, width)
    ax.set_ylim(0, HEIGHT)
    ax.set_axis_off()
    full = {"encoder": highlight in (None, "encoder"), "decoder": highlight in (None, "decoder")}
    alpha = {part: 1.0 if shown else FADED for part, shown in full.items()}
    enc = Column(ax, cx=1.02, width=1.26, alpha=alpha["encoder"])
    dec = Column(ax, cx=3.12, width=1.34, alpha=alpha["decoder"])
    gpt = Column(ax, cx=5.21, width=1.34, alpha=alpha["decoder"])
    encoder(enc)
    decoder(dec)
    decoder_only(gpt)
    memory_path(ax, enc, dec, 1.0)
    split = dec.right + 0.43  # right of the decoder's "x L", left of the shape labels
    ax.plot([split, split], [0.1, HEIGHT - 0.1], color=INK, lw=0.8, ls=":", marker="")
    title_y = HEIGHT - 0.2
    ax.text((enc.cx + dec.cx) / 2, title_y, "encoder-decoder", ha="center", va="center",
            fontsize=10, fontweight="bold", color=INK)  # fmt: skip
    ax.text(gpt.cx, title_y, "decoder-only", ha="center", va="center", fontsize=10,
            fontweight="bold", color=INK)  # fmt: skip
    for col, name, shown in ((enc, "encoder", "encoder"), (dec, "decoder", "decoder"),
                             (gpt, "decoder (GPT)", "decoder")):  # fmt: skip
        ax.text(col.cx, title_y - 0.27, name, ha="center", va="center", fontsize=9.5,
                color=INK, alpha=alpha[shown])  # fmt: skip
    return fig


def main() -> None:
    """Write architecture.png, architecture_encoder.png and architecture_decoder.png."""
    folder = out_dir(__doc__)
    save_figure(draw(None), folder / "architecture.png")
    save_figure(draw("encoder"), folder / "architecture_encoder.png")
    save_figure(draw("decoder"), folder / "architecture_decoder.png")


if __name__ == "__main__":
    main()
