"""Store the book's figures as 256-colour PNGs, when that changes no pixel by more than a trace.

A page's figures are most of what a phone downloads on its first visit: matplotlib writes
24-bit PNGs, which compression barely shrinks. A figure of the book uses a few hundred colours
(a colour map's 256 steps and the anti-aliased edges of lines and text), so a palette of 256
colours, chosen by maximum coverage with a k-means refinement, reproduces it to within a few
levels of 255 per channel at about a third of the bytes. After the HTML is written, every
opaque PNG in ``_images`` is converted; the result is kept only if it is smaller, no channel of
any pixel moved by more than ``MAX_CHANGE`` and the channels moved by less than ``MEAN_CHANGE``
on average (otherwise the original stays). PNG text chunks
(the smallest font size that ``tinyformer.viz.save_figure`` records) are carried over.
Converted files are cached by the original's SHA-256 in the build folder, so a rebuild that
copies the same figures again converts nothing.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image, PngImagePlugin
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

MAX_CHANGE = 24
"""The largest change of any channel of any pixel (in levels of 255) a palette may make."""

MEAN_CHANGE = 0.5
"""The largest mean change of the channels (in levels of 255) a palette may make."""


def to_palette(data: bytes) -> bytes | None:
    """The PNG in ``data`` with 256 colours, or None where that would change it or gain nothing."""
    image = Image.open(io.BytesIO(data))
    if image.mode == "P" or image.mode not in {"RGB", "RGBA"}:
        return None
    if image.mode == "RGBA" and image.getchannel("A").getextrema() != (255, 255):
        return None  # transparency: keep the original
    rgb = image.convert("RGB")
    palette = rgb.quantize(
        colors=256, method=Image.Quantize.MAXCOVERAGE, kmeans=3, dither=Image.Dither.NONE
    )
    change = np.abs(
        np.asarray(palette.convert("RGB"), dtype=np.int16) - np.asarray(rgb, dtype=np.int16)
    )
    if change.max() > MAX_CHANGE or change.mean() >= MEAN_CHANGE:
        return None
    text = PngImagePlugin.PngInfo()
    for key, value in getattr(image, "text", {}).items():
        text.add_text(key, value)
    out = io.BytesIO()
    palette.save(out, "PNG", optimize=True, pnginfo=text)
    return out.getvalue() if out.tell() < len(data) else None


def _convert(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    images = Path(app.outdir) / "_images"
    cache = Path(os.environ.get("BOOK_BUILD", Path(app.srcdir) / "_build")) / "png-palette"
    cache.mkdir(parents=True, exist_ok=True)
    before = after = 0
    for path in sorted(images.glob("*.png")):
        data = path.read_bytes()
        key = hashlib.sha256(f"{MAX_CHANGE} {MEAN_CHANGE} ".encode() + data).hexdigest()
        stored = cache / (key + ".png")  # the settings are part of the key
        if not stored.is_file():
            converted = to_palette(data)
            stored.write_bytes(converted if converted is not None else data)
        before += len(data)
        after += stored.stat().st_size
        shutil.copyfile(stored, path)
    logger.info("figures as 256-colour PNGs: %d kB -> %d kB", before // 1000, after // 1000)


def setup(app: Sphinx) -> dict[str, object]:
    """Convert the figures once the HTML is written."""
    app.connect("build-finished", _convert)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
