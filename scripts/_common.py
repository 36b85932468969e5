"""Command-line plumbing shared by the figure scripts."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "_static" / "figures"


def out_dir(description: str) -> Path:
    """Parse ``--out-dir`` (default ``docs/_static/figures``) and return it, created."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="folder for the PNGs")
    folder = parser.parse_args().out_dir
    folder.mkdir(parents=True, exist_ok=True)
    return folder
