"""A store of experiment results on disk: each run is computed once and shared by all who ask.

A chapter, a figure script and a test that ask for the same run (the same
experiment with the same arguments) get the same stored result: the first one
to ask trains it, every later one loads it. A run's key holds its experiment, the
function that computes it, its full arguments and the digest of the code that
function can execute (:func:`code_digest`: its module and every tinyformer module
imported from it, directly or not), so a change to that code makes the stored
result unreachable and it is computed again: nothing stale is ever returned. The
digest reads the code, not its text: docstrings and comments do not enter it, and
a module the run never imports retrains nothing (nor do the two modules that only
choose which runs to make and print them, ``registry.py`` and ``cli.py``).
Results live in a folder named by the NumPy version (and kept apart when the
initial weights are perturbed, see :mod:`tinyformer.experiments.recipe`).

Each result is one checkpoint (:mod:`tinyformer.checkpoint`: the trained
weights, the history, and the configuration and metrics as extra values) plus
a small JSON manifest holding the SHA-256 of the whole checkpoint file. A
result whose file is missing, truncated or changed in any byte fails that
check (or the checkpoint's own), is discarded and computed again, and the store
says so in its log. Files are written to a temporary name and renamed, so an
interrupted run leaves no half-written result; an exclusive lock per run
(``fcntl.flock``) makes a second process that asks for a run being computed
wait for it instead of computing it again.

Every action (computed, loaded, discarded) is logged to the logger
``tinyformer.experiments`` at INFO level and appended to ``log.txt`` in the
store's root, which is how a build shows that each run executed once.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tinyformer._validation import describe
from tinyformer.checkpoint import read_checkpoint, save_checkpoint, write_atomically
from tinyformer.experiments.recipe import perturbed
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import model_from_checkpoint
from tinyformer.training import History

try:  # POSIX; elsewhere runs are not locked (two processes may both compute one run)
    import fcntl
except ImportError:  # pragma: no cover - depends on the platform
    fcntl = None  # type: ignore[assignment]

__all__ = ["STORE_ENV", "ExperimentStore", "code_digest", "default_store", "package_digest"]

STORE_ENV = "TINYFORMER_STORE"
"""Environment variable naming the folder of the default store."""

_PACKAGE = Path(__file__).resolve().parent.parent
_NOT_KEYED = frozenset({"progress"})  # arguments that do not change a run's result
logger = logging.getLogger("tinyformer.experiments")


_NOT_DIGESTED = frozenset({"experiments/registry.py", "experiments/cli.py"})
"""Modules whose code cannot change what a run computes: the book's list of runs and the CLI."""


_PARSING = threading.Lock()

_READ: dict[Path, tuple[bytes, bytes, frozenset[str]]] = {}
"""Each source file read so far: its text, its code (:func:`_code`) and the names it imports.

Keyed runs name the same files again and again (every chapter, figure script and test
asks the store for many runs, and each new store object computes its digests afresh),
so a file is parsed once per process for each text it has had: a file whose bytes
changed is parsed again.
"""


def _parse(path: Path, source: bytes) -> ast.Module:
    """The syntax tree of a source file, parsed by one thread at a time.

    CPython 3.11's parser is not safe to run from several threads at once (it can raise
    ``SystemError: AST constructor recursion depth mismatch``), and runs may be keyed
    from threads.
    """
    with _PARSING:
        return ast.parse(source, filename=str(path))


def _read(path: Path) -> tuple[bytes, frozenset[str]]:
    """A source file's code and the dotted names it imports, parsed once per text."""
    source = path.read_bytes()
    known = _READ.get(path)
    if known is not None and known[0] == source:
        return known[1], known[2]
    tree = _parse(path, source)
    names = _import_names(tree)
    code = _code(tree)
    _READ[path] = (source, code, names)
    return code, names


def _import_names(tree: ast.Module) -> frozenset[str]:
    """Every dotted name a module imports, anywhere in it (``from a import b`` gives a and a.b)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(found)


def _code(tree: ast.Module) -> bytes:
    """A module's code without its docstrings and comments (the AST, dumped).

    Every statement that is a bare string (a module, class or function docstring, or the
    docstring of a module-level name that Sphinx reads) is dropped: none can change a result.
    The tree is changed in place.
    """
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body:
                continue
            kept = [
                statement
                for statement in body
                if not (
                    isinstance(statement, ast.Expr)
                    and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)
                )
            ]
            if len(kept) != len(body):
                body[:] = kept or [ast.Pass()]
    return ast.dump(tree, include_attributes=False).encode()


def _file(module: str) -> Path | None:
    """The source file of a ``tinyformer...`` module (None if there is none)."""
    parts = module.split(".")[1:]
    for path in (
        _PACKAGE.joinpath(*parts).with_suffix(".py"),
        _PACKAGE.joinpath(*parts, "__init__.py"),
    ):
        if path.is_file():
            return path
    return None


def _imported(path: Path) -> set[str]:
    """The tinyformer modules a file imports, anywhere in it, and the packages they sit in."""
    found = set()
    for name in _read(path)[1]:
        parts = name.split(".")
        if parts[0] == "tinyformer":  # the module, and every package above it
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in found if _file(name) is not None}


def _closure(module: str) -> list[Path]:
    """The files of ``module`` and of every tinyformer module it imports, directly or not."""
    seen: dict[str, Path] = {}
    parts = module.split(".")
    todo = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]  # its packages run first
    while todo:
        name = todo.pop()
        path = _file(name)
        if name in seen or path is None:
            continue
        if path.relative_to(_PACKAGE).as_posix() in _NOT_DIGESTED:
            continue
        seen[name] = path
        todo.extend(_imported(path))
    return sorted(seen.values())


def _digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(b"\0")
        digest.update(_read(path)[0])
    return digest.hexdigest()[:16]


def code_digest(module: str) -> str:
    """SHA-256 (first 16 hex digits) of the code a run computed by a function of ``module`` executes.

    The module and every tinyformer module it imports, directly or not (imports
    anywhere in a file count, as do the packages they sit in), without docstrings
    and comments, and without the modules in ``_NOT_DIGESTED``.
    """
    return _digest(_closure(module))


def package_digest() -> str:
    """The same digest over every module of the package (what a book page may execute)."""
    return _digest(sorted(_PACKAGE.rglob("*.py")))


def default_store() -> ExperimentStore:
    """The store in ``$TINYFORMER_STORE``, or else in ``~/.cache/tinyformer/experiments``."""
    root = os.environ.get(STORE_ENV) or Path.home() / ".cache" / "tinyformer" / "experiments"
    return ExperimentStore(root)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _in_use(folder: Path) -> bool:
    """Whether another process holds the lock of a run in ``folder``."""
    if fcntl is None:  # pragma: no cover - depends on the platform
        return False
    for lock in folder.glob("*.lock"):
        with lock.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    return False


class ExperimentStore:
    """Results of the book's experiments on disk, keyed by package source, experiment and arguments.

    Parameters
    ----------
    root : str or path-like
        The store's folder (created when needed). Results go into
        ``root/tinyformer-numpy-<version>/`` (``...-perturbed`` for perturbed runs).
    experiments : dict of str to callable, optional
        The experiments it can run, by name; by default
        :data:`tinyformer.experiments.registry.EXPERIMENTS`.

    Examples
    --------
    >>> store = ExperimentStore("/tmp/tinyformer-store")  # doctest: +SKIP
    >>> result = store.run("reversal", seed=0)  # trains once, then loads  # doctest: +SKIP
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        experiments: dict[str, Callable[..., ExperimentResult]] | None = None,
    ) -> None:
        if not isinstance(root, str | os.PathLike):
            raise TypeError(f"root must be a str or path-like, got {describe(root)}")
        if experiments is None:
            from tinyformer.experiments.registry import EXPERIMENTS  # noqa: PLC0415 (cycle)

            experiments = EXPERIMENTS
        self.root = Path(root)
        self.experiments = dict(experiments)
        self._digests: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"ExperimentStore({str(self.root)!r})"

    @property
    def folder(self) -> Path:
        """The folder of the results (perturbed runs have a folder of their own)."""
        suffix = "-perturbed" if perturbed() else ""
        return self.root / f"tinyformer-numpy-{np.__version__}{suffix}"

    # ------------------------------------------------------------------ keys
    def arguments(self, name: str, **params: Any) -> dict[str, Any]:
        """The run's full arguments: ``params`` with every default filled in (what the key hashes)."""
        function = self._experiment(name)
        try:
            bound = inspect.signature(function).bind(**params)
        except TypeError as err:
            raise TypeError(f"experiment {name!r}: {err}") from None
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k not in _NOT_KEYED}
        try:
            return json.loads(json.dumps(arguments, sort_keys=True, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"experiment {name!r}: arguments must be plain numbers, strings and booleans"
                f" ({err})"
            ) from None

    def key(self, name: str, **params: Any) -> str:
        """16 hex digits naming one run: its experiment, function, arguments and code digest."""
        text = json.dumps(
            {
                "experiment": name,
                "function": self._function_name(name),
                "code": self._code_digest(name),
                "arguments": self.arguments(name, **params),
            }
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _function_name(self, name: str) -> str:
        function = self._experiment(name)
        where = function if hasattr(function, "__qualname__") else type(function)
        return f"{where.__module__}.{where.__qualname__}"

    def _code_digest(self, name: str) -> str:
        """:func:`code_digest` of the experiment's module, computed once per store object."""
        module = self._function_name(name).rsplit(".", 1)[0]
        while module not in self._digests and _file(module) is None and "." in module:
            module = module.rsplit(".", 1)[0]  # a nested function or class: its module
        if module not in self._digests:
            self._digests[module] = (
                code_digest(module) if module.startswith("tinyformer") else "outside tinyformer"
            )
        return self._digests[module]

    def paths(self, name: str, **params: Any) -> tuple[Path, Path]:
        """The run's checkpoint file and its manifest."""
        stem = self.folder / f"{name}-{self.key(name, **params)}"
        return stem.with_suffix(".npz"), stem.with_suffix(".json")

    def contains(self, name: str, **params: Any) -> bool:
        """Whether a complete result of this run is stored (its files are not verified here)."""
        return all(path.is_file() for path in self.paths(name, **params))

    # ------------------------------------------------------------------ runs
    def run(self, name: str, *, progress: bool = False, **params: Any) -> ExperimentResult:
        """The result of ``experiments[name](**params)``: loaded when stored, else computed and stored.

        Parameters
        ----------
        name : str
            An experiment of the store (``"reversal"``, ``"markov_lm"``, ...).
        progress : bool
            Show a progress bar if the run has to be computed.
        **params
            The experiment's arguments (``seed=...`` and any other); omitted
            ones take the experiment's defaults, so ``run("reversal")`` and
            ``run("reversal", seed=0)`` are the same run.

        Returns
        -------
        ExperimentResult
            Always as read back from the store, so the first caller and every
            later one get identical results.
        """
        arguments = self.arguments(name, **params)
        checkpoint, manifest = self.paths(name, **params)
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._lock(checkpoint.with_suffix(".lock")):
            if checkpoint.is_file() or manifest.is_file():
                try:
                    result = self._load(checkpoint, manifest)
                except (OSError, ValueError, KeyError, TypeError) as err:
                    self._log("discarded", name, checkpoint, f"(unreadable or corrupted: {err})")
                    checkpoint.unlink(missing_ok=True)
                    manifest.unlink(missing_ok=True)
                else:
                    self._log("loaded", name, checkpoint)
                    return result
            started = time.perf_counter()
            fresh = self._experiment(name)(**arguments, progress=progress)
            self._save(name, fresh, arguments, checkpoint, manifest)
            self._log("computed", name, checkpoint, f"in {time.perf_counter() - started:.1f} s")
            return self._load(checkpoint, manifest)

    def prune(self) -> list[Path]:
        """Delete stored results no run can reach any more; returns the files removed.

        A result is stale when the code its experiment executes changed since it was
        computed (its manifest records the digest) or its experiment is unknown, and
        every folder of an older layout or NumPy version goes. A result whose lock is
        held (being computed right now) is left alone, so pruning never pulls a run
        from under another build. Perturbed results are pruned the same way.
        """
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        current = {self.folder.name.removesuffix("-perturbed")}
        for folder in sorted(self.root.glob("tinyformer-*")):
            if not folder.is_dir() or _in_use(folder):
                continue
            if folder.name.removesuffix("-perturbed") not in current:
                removed.extend(sorted(folder.iterdir()))
                for path in folder.iterdir():
                    path.unlink()
                folder.rmdir()
                continue
            for manifest in sorted(folder.glob("*.json")):
                if self._stale(manifest):
                    for path in sorted(folder.glob(f"{manifest.stem}.*")):
                        path.unlink()
                        removed.append(path)
        return removed

    def _stale(self, manifest: Path) -> bool:
        try:
            record = json.loads(manifest.read_text(encoding="utf-8"))
            name = record["experiment"]
        except (OSError, ValueError, KeyError, TypeError):
            return True
        return name not in self.experiments or record.get("code") != self._code_digest(name)

    # -------------------------------------------------------------- internals
    def _experiment(self, name: str) -> Callable[..., ExperimentResult]:
        if not isinstance(name, str) or name not in self.experiments:
            raise ValueError(
                f"name must be one of the experiments {sorted(self.experiments)}, got {name!r}"
            )
        return self.experiments[name]

    @contextlib.contextmanager
    def _lock(self, path: Path) -> Iterator[None]:
        with path.open("a") as handle:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def _save(
        self,
        name: str,
        result: ExperimentResult,
        arguments: dict[str, Any],
        checkpoint: Path,
        manifest: Path,
    ) -> None:
        extra = {
            "experiment": result.name,
            "seed": result.seed,
            "config": result.config,
            "metrics": result.metrics,
            "wall_time": result.wall_time,
        }
        save_checkpoint(checkpoint, result.model, history=result.history, extra=extra)
        record = {
            "experiment": name,
            "arguments": arguments,
            "sha256": _file_sha256(checkpoint),
            "code": self._code_digest(name),
            "numpy": np.__version__,
            "wall_time": result.wall_time,
        }
        text = json.dumps(record, indent=1, sort_keys=True) + "\n"
        write_atomically(manifest, lambda file: file.write(text.encode("utf-8")))

    def _load(self, checkpoint: Path, manifest: Path) -> ExperimentResult:
        if not manifest.is_file():
            raise ValueError(f"{manifest.name} is missing (an interrupted run?)")
        record = json.loads(manifest.read_text(encoding="utf-8"))
        if not checkpoint.is_file():
            raise ValueError(f"{checkpoint.name} is missing")
        if _file_sha256(checkpoint) != record["sha256"]:
            raise ValueError(f"{checkpoint.name} does not match the SHA-256 of its manifest")
        stored = read_checkpoint(checkpoint)
        model = model_from_checkpoint(stored)  # in evaluation mode
        extra = stored.extra
        history = History.from_dict(stored.history)
        return ExperimentResult(
            extra["experiment"],
            extra["seed"],
            extra["config"],
            history,
            extra["metrics"],
            extra["wall_time"],
            model,
        )

    def _log(self, action: str, name: str, checkpoint: Path, detail: str = "") -> None:
        line = f"{action} {name} [{checkpoint.stem}] {detail}".rstrip()
        logger.info("experiment store: %s", line)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with (self.root / "log.txt").open("a", encoding="utf-8") as log:
            log.write(f"{stamp} pid {os.getpid()} {line}\n")
