"""The command ``python -m tinyformer.experiments``: run the book's experiments, print their results.

Results come from the experiment store (see
:mod:`tinyformer.experiments.store`): a run stored by this version of the
package is loaded, anything else is trained and stored. ``--no-store`` always
trains. ``--book --jobs 2`` computes every run the book shows, two at a time,
which is what ``nox -s docs`` does before Sphinx starts (with ``--missing``: the
runs stored already are not loaded and printed again: a chapter or a test that reads
one checks its file, and a build from an empty store, as in CI, trains and checks them all).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from tinyformer.experiments.registry import BOOK_RUNS, EXPERIMENTS, TYPICAL_SECONDS
from tinyformer.experiments.result import ExperimentResult
from tinyformer.experiments.store import ExperimentStore, default_store
from tinyformer.runtime import retain_freed_memory

__all__ = ["headline", "longest_first", "main", "requirement"]

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


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
    parser.add_argument(
        "--missing",
        action="store_true",
        help="train and print only the runs not stored yet: a stored run is not loaded, so its"
        " file's checksum and the book's requirement on it are checked only where it is read",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show the training loop's progress bar (default: when run in a terminal)",
    )
    return parser


def _runs(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    if args.book:
        return [(name, dict(params)) for name, params in BOOK_RUNS]
    names = [args.only] if args.only else (args.names or list(EXPERIMENTS))
    return [(name, {"seed": args.seed}) for name in names]


def longest_first(runs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``runs`` in the order to start them on a pool: the longest expected first.

    The expected time of a run is its experiment's entry in
    :data:`~tinyformer.experiments.registry.TYPICAL_SECONDS` (an unknown experiment
    counts as long); runs of one experiment keep their order. Started this way, the
    pool's last runs are short ones and the workers finish at nearly the same time.
    """
    return sorted(runs, key=lambda run: -TYPICAL_SECONDS.get(run[0], float("inf")))


def _report(
    name: str, params: dict[str, Any], store_root: str | None, progress: bool
) -> tuple[str, bool]:
    """Run one experiment (through the store unless ``store_root`` is None); return its report."""
    if store_root is None:
        result = EXPERIMENTS[name](**params, progress=progress)
    else:
        result = ExperimentStore(store_root).run(name, progress=progress, **params)
    verdict, ok = _verdict(name, params, result)
    return f"{result.summary()}\n{verdict}", ok


def requirement(result: ExperimentResult) -> tuple[str, bool] | None:
    """The book's requirement on this experiment's result and whether it holds (None: no rule)."""
    m = result.metrics
    if result.name == "reversal":
        value = m["heldout_exact_match"]
        return f"held-out greedy exact match >= 0.99, got {value:.3f}", value >= 0.99
    if result.name == "markov_lm":
        value = m["excess_over_entropy_rate"]
        return f"held-out loss within 3% of H, got {100 * value:+.2f}%", value < 0.03
    if result.name == "in_context":
        first, repeated = m["loss_first_half"], m["loss_repeated_half"]
        need = (  # every seed learns in context; not every seed does it with an induction head
            "held-out loss on the repeated half below a fifth of the first half's, got"
            f" {repeated:.3f} against {first:.3f} nats"
        )
        return need, repeated < 0.2 * first
    if result.name == "masked_lm":
        ok = m["loss"] < m["optimal_left_only"] and m["excess_over_optimum"] <= 0.35
        need = (
            "held-out masked-token loss below the best left-context-only loss and within 35%"
            f" of the exact optimum, got {m['loss']:.3f} against {m['optimal_left_only']:.3f}"
            f" and {m['optimal_bidirectional']:.3f}"
        )
        return need, ok
    if result.name == "scaling":
        seen = int(m["heldout_windows_in_training"])
        return f"no held-out window among the training windows, got {seen}", seen == 0
    return None


def _verdict(name: str, params: dict[str, Any], result: ExperimentResult) -> tuple[str, bool]:
    """The line that says whether the run meets the book's requirement, and whether it does."""
    rule = requirement(result)
    if rule is None:  # an experiment whose outcome the book reports, whatever it is
        return "  no requirement: the book reports what this run shows", True
    if set(params) - {"seed"}:  # a variant (a draft model, an ablation): no book requirement
        return f"  a variant of the book's {name} run: no requirement", True
    need, ok = rule
    return f"  required: {need}: {'met' if ok else 'NOT met'}", ok


def headline(result: ExperimentResult) -> str:
    """The held-out result a run is judged by, in a few words (for tables of runs)."""
    m = result.metrics
    if result.name == "reversal":
        return (
            f"greedy exact match {m['heldout_exact_match']:.3f}"
            f" on {int(m['heldout_size'])} unseen sources"
        )
    if result.name == "markov_lm":
        return (
            f"loss {m['loss_full_context']:.4f} nats against the entropy rate"
            f" {m['entropy_rate']:.4f} ({100 * m['excess_over_entropy_rate']:+.2f}%)"
        )
    if result.name == "masked_lm":
        return (
            f"masked-token loss {m['loss']:.3f} nats; exact optimum"
            f" {m['optimal_bidirectional']:.3f}, left context only {m['optimal_left_only']:.3f}"
        )
    if result.name == "in_context":
        return (
            f"loss {m['loss_first_half']:.3f} nats on a random first half,"
            f" {m['loss_repeated_half']:.3f} on its repeat; induction score"
            f" {m['induction_score']:.2f}"
        )
    if result.name == "norm_placement":
        if m["diverged"]:
            return f"diverged at step {int(m['diverged_at_step'])}"
        return f"held-out loss {m['heldout_loss']:.3f} nats"
    if result.name == "scaling":
        return (
            f"N = {int(m['parameters'])}, D = {int(m['train_tokens'])}: held-out loss"
            f" {m['heldout_loss']:.4f} nats, {m['excess_loss']:.4f} above H"
        )
    return ", ".join(f"{key} {value:.4g}" for key, value in list(m.items())[:3])


def main(argv: list[str] | None = None) -> int:
    """Run the experiments asked for and print each result when it is ready; 1 if one fails."""
    parser = _parser()
    args = parser.parse_args(argv)
    retain_freed_memory()  # this process only trains: keep freed memory for the next step
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
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    runs = _runs(args)
    stored = [run for run in runs if store is not None and store.contains(run[0], **run[1])]
    to_train = longest_first([run for run in runs if run not in stored])
    n_stored = len(stored)
    if args.missing:  # the stored runs are neither loaded nor printed
        stored, runs = [], to_train
    # Stored runs are loaded in this process; with jobs > 1 the runs to train go to others.
    pooled = args.jobs > 1 and len(to_train) > 1
    serial = stored if pooled else runs
    if to_train:  # say at once what the wait is for
        _print(
            f"{n_stored} run(s) stored; training {len(to_train)}"
            f" ({min(args.jobs, len(to_train))} at a time), each printed when it is ready",
            True,
        )
    elif args.missing:
        _print(f"all {n_stored} run(s) stored (not loaded: --missing)", True)
    failed = 0
    for name, params in serial:
        if (name, params) in to_train:
            _print(f"training {_label(name, params)} ...", True)
        text, ok = _report(name, params, root, progress)
        failed += _print(text, ok)
    if pooled:
        context = multiprocessing.get_context("spawn")
        with (
            _one_blas_thread(),
            ProcessPoolExecutor(
                min(args.jobs, len(to_train)),
                mp_context=context,
                initializer=retain_freed_memory,
            ) as pool,
        ):
            futures = [
                pool.submit(_report, name, params, root, False) for name, params in to_train
            ]
            for future in as_completed(futures):
                failed += _print(*future.result())
    return int(failed > 0)


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Start worker processes with one BLAS thread each: ``jobs`` runs share the cores.

    Without this, each worker's BLAS starts a thread per core, and on a busy
    machine their spinning threads take the cores from each other's work.
    """
    saved = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    os.environ.update(dict.fromkeys(_THREAD_VARIABLES, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _label(name: str, params: dict[str, Any]) -> str:
    """``name(seed=0, ...)``: a run as the store keys it."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"


def _print(text: str, ok: bool) -> int:
    """Print one report at once; 1 if its requirement is not met."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return int(not ok)
