"""Time the book's build as an author meets it: cold, with nothing changed, after one edit.

From a clean ``docs/_build`` it runs ``nox -s docs`` for three scenarios, each
``--repeats`` times, and prints the median of each phase:

- **cold**: no ``docs/_build`` at all (training runs, every figure, every page);
  ``--keep-store`` keeps the stored training runs, to see the rest alone;
- **no change**: the same command again (the session finds nothing changed and stops);
- **no change, Sphinx**: the same with the session's record of the last build removed, so
  that Sphinx runs and finds nothing to do (what a build costs when the record misses);
- **one cell edited**: a line added to the first code cell of ``--page``, so
  that page (only) executes again; the edit is undone afterwards;
- **docstring edited**: a word added to the docstring of ``tinyformer.multihead``: no
  training run and no page may execute again (the store and the execution cache key on
  the code without its docstrings), only the pages that show that module are read again.

Phases come from the build itself: ``nox -s docs`` logs the seconds of its
training runs, figures and Sphinx steps, and the book's ``build_report``
extension writes Sphinx's start-up, read and write times and every page's read
(and execution) time into ``build-report.json``. The remainder is nox itself
(checking and installing into the environment). The five slowest pages of the
cold build close the report. Budgets are in ``docs/reproducing.md``.

Usage: ``python benchmarks/bench_build.py [--repeats 3] [--page chapters/attention]``
(needs nox; the first run creates the docs environment if it is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUDGETS = {
    "cold": 480.0,
    "no change": 10.0,
    "no change, Sphinx": 20.0,
    "one cell edited": 30.0,
    "docstring edited": 60.0,
}
DOCSTRING = ROOT / "src" / "tinyformer" / "multihead.py"  # whose module docstring is edited


def _build_dir() -> Path:
    return Path(os.environ.get("BOOK_BUILD", DOCS / "_build")).resolve()


def _store_dir() -> Path:
    default = DOCS / "_build" / "experiments"
    return Path(os.environ.get("TINYFORMER_STORE", default)).resolve()


def build() -> dict[str, object]:
    """Run ``nox -s docs`` once; return its wall time, logged phases and the build report."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-s", "docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit("nox -s docs failed: see the output above")
    log = done.stdout + done.stderr
    phases = {}
    match = re.search(r"timing: (.*)", log)
    if match:
        for part in match.group(1).split(", "):
            name, seconds, _ = part.rsplit(" ", 2)
            phases[name] = float(seconds)
    report = {"phases": {}, "notebooks": {}, "read_seconds": {}}  # nothing built: no report
    if match:
        report = json.loads((_build_dir() / "html" / "build-report.json").read_text())
    for name, seconds in report["phases"].items():
        phases[f"sphinx {name}"] = seconds
    phases["nox and install"] = wall - sum(
        phases.get(k, 0.0) for k in ("training runs", "figures", "sphinx")
    )
    computed = re.findall(r"computed (\S+) \[", log)
    return {"wall": wall, "phases": phases, "report": report, "computed": computed}


def edit_first_cell(path: Path, counter: int) -> str:
    """Add a harmless line to the first code cell of ``path``; return the original text."""
    original = path.read_text()
    marker = "```{code-cell} ipython3\n"
    at = original.index(marker) + len(marker)
    while original[at] == ":" or original[at:].startswith("---"):  # skip cell options
        at = original.index("\n", at) + 1
    path.write_text(original[:at] + f"_bench_edit = {counter}\n" + original[at:])
    return original


def main() -> int:
    """Run the scenarios and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--page", default="chapters/attention", help="page whose cell to edit")
    parser.add_argument(
        "--keep-store", action="store_true", help="cold builds keep the stored training runs"
    )
    args = parser.parse_args()
    page = DOCS / f"{args.page}.md"
    if not page.is_file():
        parser.error(f"--page {args.page}: no file {page}")
    results: dict[str, list[dict[str, object]]] = {s: [] for s in BUDGETS}
    for repeat in range(args.repeats):
        build_dir, store = _build_dir(), _store_dir()
        kept = None
        if args.keep_store and store.is_dir():
            kept = Path(shutil.copytree(store, ROOT / ".bench-store", dirs_exist_ok=True))
        shutil.rmtree(build_dir, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
        if kept is not None:
            shutil.move(kept, store)
        results["cold"].append(build())
        results["no change"].append(build())
        # without the session's record of the last build, Sphinx runs (and finds nothing to do)
        (_build_dir() / "book-inputs.txt").unlink(missing_ok=True)
        results["no change, Sphinx"].append(build())
        original = edit_first_cell(page, repeat)
        try:
            results["one cell edited"].append(build())
        finally:
            page.write_text(original)
        build()  # back to the unedited page (its outputs come from the cache)
        original = DOCSTRING.read_text()
        DOCSTRING.write_text(original.replace('"""', f'"""Edited ({repeat}). ', 1))
        try:
            results["docstring edited"].append(build())
        finally:
            DOCSTRING.write_text(original)
        sys.stdout.write(f"repeat {repeat + 1}/{args.repeats} done\n")
        sys.stdout.flush()

    sys.stdout.write(f"\nnox -s docs, median of {args.repeats} (seconds)\n")
    names = sorted({p for runs in results.values() for r in runs for p in r["phases"]})
    header = f"{'scenario':<19}{'total':>8}{'budget':>8}" + "".join(f"{n:>16}" for n in names)
    sys.stdout.write(header + "\n")
    for scenario, runs in results.items():
        total = statistics.median(r["wall"] for r in runs)
        cells = "".join(
            f"{statistics.median(r['phases'].get(n, 0.0) for r in runs):>16.2f}" for n in names
        )
        sys.stdout.write(f"{scenario:<19}{total:>8.1f}{BUDGETS[scenario]:>8.0f}{cells}\n")
    for scenario, runs in results.items():
        executed = sorted(
            {d for r in runs for d, n in r["report"]["notebooks"].items() if n["executed_now"]}
        )
        trained = sorted({name for r in runs for name in r["computed"]})
        sys.stdout.write(
            f"{scenario}: pages executed {executed or 'none'}; runs trained {trained or 'none'}\n"
        )
    docstring = results["docstring edited"]
    if any(r["computed"] for r in docstring) or any(
        n["executed_now"] for r in docstring for n in r["report"]["notebooks"].values()
    ):
        sys.stdout.write("FAILED: a docstring edit trained a run or executed a page\n")
        return 1
    cold = results["cold"][0]["report"]
    slowest = sorted(cold["read_seconds"].items(), key=lambda kv: -kv[1])[:5]
    sys.stdout.write("\nslowest five pages of the first cold build (read, execution included):\n")
    for docname, seconds in slowest:
        run = cold["notebooks"].get(docname, {}).get("runtime")
        executed = f", executing {run:.2f} s" if run is not None else ""
        sys.stdout.write(f"  {docname:<32}{seconds:>7.2f} s{executed}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
