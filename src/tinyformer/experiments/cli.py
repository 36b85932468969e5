"""The command ``python -m tinyformer.experiments``: run the book's experiments, print their results.

Results come from the experiment store (see
:mod:`tinyformer.experiments.store`): a run stored by this version of the
package is loaded, anything else is trained and stored. ``--no-store`` always
trains. ``--book --jobs 2`` computes every run the book shows, two at a time,
which is what ``nox -s docs`` does before Sphinx starts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from tinyformer.experiments.registry import BOOK_RUNS, EXPERIMENTS
from tinyformer.experiments.result import ExperimentResult
from tinyformer.experiments.store import ExperimentStore, default_store

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyformer.experiments",
        description="Run the book's experiments at book size and print their results.",
    )
    parser.add_argument(
        "names", nargs="*", help=f"experiments to run, of {', '.join(EXPERIMENTS)} (default: all)"
    )
    parser.add_argument("--only", choices=sorted(EXPERIMENTS), help="run this experiment only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--book", action="store_true", help="run every run the book shows")
    parser.add_argument("--store", default=None, help="the store's folder ($TINYFORMER_STORE)")
    parser.add_argument("--no-store", action="store_true", help="train, store nothing")
    parser.add_argument("--prune", action="store_true", help="delete other versions' results")
    parser.add_argument("--jobs", type=int, default=1, help="runs computed at the same time")
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    return parser


def _runs(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    if args.book:
        return [(name, dict(params)) for name, params in BOOK_RUNS]
    names = [args.only] if args.only else (args.names or list(EXPERIMENTS))
    return [(name, {"seed": args.seed}) for name in names]


def _report(
    name: str, params: dict[str, Any], store_root: str | None, progress: bool
) -> tuple[str, bool]:
    """Run one experiment (through the store unless ``store_root`` is None); return its report."""
    if store_root is None:
        result = EXPERIMENTS[name](**params, progress=progress)
    else:
        result = ExperimentStore(store_root).run(name, progress=progress, **params)
    verdict, ok = _verdict(result)
    return f"{result.summary()}\n{verdict}", ok


def _verdict(result: ExperimentResult) -> tuple[str, bool]:
    """The book's requirement for this result, and whether it is met."""
    if result.name == "reversal":
        value = result.metrics["heldout_exact_match"]
        ok = value >= 0.99
        need = f"  required: held-out greedy exact match >= 0.99, got {value:.3f}"
    else:
        value = result.metrics["excess_over_entropy_rate"]
        ok = value < 0.03
        need = f"  required: held-out loss within 3% of H, got {100 * value:+.2f}%"
    return f"{need}: {'met' if ok else 'NOT met'}", ok


def main(argv: list[str] | None = None) -> int:
    """Run the experiments asked for and print each result when it is ready; 1 if one fails."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    unknown = [name for name in args.names if name not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiment(s) {unknown}: choose from {sorted(EXPERIMENTS)}")
    store = None if args.no_store else ExperimentStore(args.store or default_store().root)
    if store is not None and args.prune:
        for folder in store.prune():
            sys.stdout.write(f"removed stale results: {folder}\n")
    root = None if store is None else str(store.root)
    runs = _runs(args)
    failed = 0
    if args.jobs == 1 or len(runs) == 1:
        reports = (_report(name, params, root, args.progress) for name, params in runs)
        for text, ok in reports:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            failed += not ok
        return int(failed > 0)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(args.jobs, len(runs)), mp_context=context) as pool:
        futures = [pool.submit(_report, name, params, root, False) for name, params in runs]
        for future in as_completed(futures):
            text, ok = future.result()
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            failed += not ok
    return int(failed > 0)
