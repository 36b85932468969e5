"""Run a chapter's live notebooks as the in-browser Python would: without what it lacks.

The live mode (docs/_ext/live.py) runs a chapter's cells tagged ``live`` and its live
exercises in JupyterLite, whose Python has NumPy and tinyformer but no matplotlib, myst-nb,
ml_dtypes, threadpoolctl or PyTorch, and no store of trained runs. This script makes the same
notebooks from the chapter's source and runs each cell in a fresh Python where importing those
modules fails and the experiment store is empty (a cell that loads or trains a stored run
fails), timing every cell::

    python scripts/live_check.py attention            # docs/chapters/attention.md
    python scripts/live_check.py --all                # every chapter

It exits 1 if a cell fails or a notebook takes longer than ``--budget`` seconds (the browser's
WebAssembly NumPy is several times slower than this). ``tests/book/test_live.py`` runs the
notebooks of a built site with :func:`run_notebook`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "docs" / "chapters"
# Importable in the build's Python, absent from the browser's.
ABSENT = (
    "matplotlib", "myst_nb", "ml_dtypes", "threadpoolctl", "torch", "transformers",
    "safetensors", "tokenizers", "sentencepiece", "scipy", "pandas", "nbformat", "ipywidgets",
)  # fmt: skip
EXERCISE = re.compile(r"^\s*:::\{live-exercise\}\s+(\S+)", re.MULTILINE)

_RUNNER = """
import importlib.abc, json, sys, time, traceback
ABSENT = set(sys.argv[2].split(","))

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the browser's Python)")
        return None

sys.meta_path.insert(0, Absent())
cells = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
for index, source in cells:
    start = time.perf_counter()
    try:
        exec(compile(source, f"<cell {index}>", "exec"), namespace)
        error = None
    except Exception:
        error = traceback.format_exc(limit=-3)
    seconds = time.perf_counter() - start
    print("LIVE-CELL " + json.dumps({"index": index, "seconds": seconds, "error": error}), flush=True)
    if error:
        break
"""


def run_notebook(nb: dict, *, timeout: float = 300.0) -> list[dict]:
    """Run a notebook's code cells in order in a fresh Python without the browser's absentees.

    Returns one record per cell run (``index``, ``seconds``, ``error``: None or the
    traceback); it stops at the first error. A cell that wrote to the experiment store (which
    it sees empty) is reported as an error too.
    """
    cells = [
        (i, "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code"
    ]
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        source = Path(tmp) / "cells.json"
        source.write_text(json.dumps(cells), encoding="utf-8")
        env = {**os.environ, "TINYFORMER_STORE": str(store), "MPLBACKEND": "Agg"}
        env.pop("TINYFORMER_CLAIMS_LOG", None)
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(source), ",".join(ABSENT)],
            capture_output=True, text=True, env=env, timeout=timeout, cwd=tmp, check=False,
        )  # fmt: skip
        records = [
            json.loads(line.removeprefix("LIVE-CELL "))
            for line in done.stdout.splitlines()
            if line.startswith("LIVE-CELL ")
        ]
        if done.returncode != 0:
            records.append({"index": -1, "seconds": 0.0, "error": done.stderr[-3000:]})
        if store.exists() and any(p.is_file() for p in store.rglob("*")):
            records.append(
                {"index": -1, "seconds": 0.0, "error": "a cell loaded or trained a stored run"}
            )
    return records


def chapter_notebooks(chapter: str) -> dict[str, dict]:
    """The live notebooks of ``docs/chapters/<chapter>.md``, made as the build makes them."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    from live import chapter_notebooks as make  # noqa: PLC0415
    from myst_nb.core.read import read_myst_markdown_notebook  # noqa: PLC0415
    from notebooks import downloadable  # noqa: PLC0415

    text = (CHAPTERS / f"{chapter}.md").read_text(encoding="utf-8")
    title = next(line[2:].strip() for line in text.splitlines() if line.startswith("# "))
    nb = downloadable(read_myst_markdown_notebook(text))
    return make(nb, chapter, title, EXERCISE.findall(text))


def main() -> int:
    """Check the chapters named on the command line; 1 if any notebook failed or was too slow."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter file names without .md")
    parser.add_argument("--all", action="store_true", help="every chapter")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per notebook")
    args = parser.parse_args()
    names = sorted(p.stem for p in CHAPTERS.glob("*.md")) if args.all else args.chapters
    failed = False
    for chapter in names:
        books = chapter_notebooks(chapter)
        if not books:
            print(f"{chapter}: no live cells or exercises")
            continue
        for name, nb in books.items():
            records = run_notebook(nb)
            total = sum(r["seconds"] for r in records)
            errors = [r for r in records if r["error"]]
            slow = total > args.budget
            failed |= bool(errors) or slow
            state = "FAILED" if errors else ("TOO SLOW" if slow else "ok")
            print(f"{name}: {len(records)} cells, {total:.1f} s, {state}")
            for r in records:
                print(f"  cell {r['index']}: {r['seconds']:.2f} s")
            for r in errors:
                print(f"  cell {r['index']} failed:\n{r['error']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
