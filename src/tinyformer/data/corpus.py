r"""Real English text that ships with every Python: the docstrings of the standard library.

The book's capstone trains on text that needs no download. Every CPython installation
carries the source of its standard library, and its docstrings are English prose written
by many authors over thirty years, with code examples (doctests) mixed in.
:func:`stdlib_docstrings` collects them from the running interpreter's source files
(``sysconfig.get_paths()["stdlib"]``) with ``ast``: the files are parsed, never
imported, since importing a module runs its code (``antigravity`` opens a web browser).

**Which files.** Every ``*.py`` file under the standard library's folder, in the order of
their sorted relative paths (``"/"``-separated), except

- ``site-packages/``: third-party packages installed into this interpreter, not the
  standard library, and different on every machine;
- any file inside a folder named ``test``, ``tests`` or ``idle_test``: test suites, whose
  docstrings describe tests, some of whose files are deliberately broken;
- ``idlelib/`` (the IDLE editor) and ``turtledemo/`` (demonstration programs):
  applications shipped with Python rather than library modules (and often packaged
  apart from the library by Linux distributions);
- ``__hello__.py`` and ``__phello__/``: fixtures that test freezing modules;
- a file that the running interpreter cannot read or parse (none in CPython 3.11's
  library; the count is kept in :attr:`DocstringCorpus.unparsable`).

**Which text.** In each file, the docstrings of the module, of every class and of every
function (methods and nested definitions included), in the order of the definitions in
the source. Each is cleaned as ``inspect.cleandoc`` does (``ast.get_docstring``: tabs
expanded, the common indentation removed), then stripped of trailing whitespace on every
line and of blank lines at both ends. Empty docstrings and docstrings that cannot be
written as UTF-8 (lone surrogates) are left out. A docstring whose cleaned text already
appeared earlier in the order is dropped: an exact duplicate (``"Internal function."``
29 times in ``tkinter``) would otherwise sit in both the training and the held-out text.

**The splits.** The held-out text and the validation text are each made of whole
top-level packages and modules (``email`` with all its submodules, ``json``,
``difflib``...), never of parts of one, so that they are text from other modules than the
training text, and near-duplicates inside a package (the generated docstrings of the 100
codecs of ``encodings`` differ only by the codec's name) never straddle a split. The rule:
order the top-level names by the SHA-256 of their UTF-8 name; walk them in that order and
hold out each one whose text still fits within ``heldout_fraction`` of all the text's
bytes; of the names not held out, set aside for validation each one that still fits
within ``validation_fraction``. It depends on nothing but the names and the text, so
every run on the same interpreter makes the same splits. (A name's size is the UTF-8
bytes of its docstrings, each counted with one separator.) The validation text is for
choosing settings (sizes, learning rates, when to stop); the held-out text is read once,
to report. Only exact duplicates are dropped: a few docstrings of the held-out text
open with the same line as one of the training text (``queue.Queue.put`` and its twin in
``asyncio.queues``, ``cmd.Cmd.onecmd`` and ``pdb.Pdb.onecmd``), as two texts about the
same library will.

**The text of a split** is its docstrings in the fixed order, joined by a blank line
(:data:`SEPARATOR`). :attr:`DocstringCorpus.digest` is the SHA-256 of the three texts
(training, validation, held-out, in UTF-8, each followed by a NUL byte), which names the
corpus a run saw.

**The same version is not the same text.** The library is the running interpreter's
files, and Linux distributions package it in parts (Debian's ``python3.11`` leaves
``tkinter``, ``distutils`` and ``lib2to3`` to packages of their own) and patch some of its
text, so two interpreters of one version can give two corpora, and two splits. Compare
digests, not versions: :func:`source_digest` names the library's source files cheaply,
without parsing them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sysconfig
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tinyformer._validation import describe, unit_interval

__all__ = [
    "EXCLUDED_DIRS",
    "EXCLUDED_TOP_LEVEL",
    "SEPARATOR",
    "SPLITS",
    "Docstring",
    "DocstringCorpus",
    "doctest_bytes",
    "excluded",
    "module_name",
    "source_digest",
    "stdlib_docstrings",
]

SEPARATOR = "\n\n"
"""The blank line that joins two docstrings in the text of a split."""

SPLITS = ("train", "validation", "heldout")
"""The three parts of the corpus (see :meth:`DocstringCorpus.text`)."""

EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test"})
"""Folder names whose files are test suites; a file inside any of them is left out."""

EXCLUDED_TOP_LEVEL = frozenset(
    {"site-packages", "idlelib", "turtledemo", "__phello__", "__hello__.py"}
)
"""First components of a relative path that are left out (third-party code, applications, fixtures)."""

_PARSING = threading.Lock()  # CPython 3.11's parser is not safe to run from two threads at once


def excluded(relative_path: str) -> bool:
    """Whether a ``"/"``-separated path inside the standard library is left out of the corpus.

    See the module's description for the rules and their reasons.

    Examples
    --------
    >>> excluded("json/decoder.py"), excluded("unittest/test/test_case.py")
    (False, True)
    """
    if not isinstance(relative_path, str):
        raise TypeError(f"relative_path must be a str, got {describe(relative_path)}")
    parts = relative_path.split("/")
    return parts[0] in EXCLUDED_TOP_LEVEL or any(p in EXCLUDED_DIRS for p in parts[:-1])


def module_name(relative_path: str) -> str:
    """The dotted module name of a ``"/"``-separated ``.py`` path (a package's ``__init__`` is the package).

    Examples
    --------
    >>> module_name("email/mime/text.py"), module_name("json/__init__.py")
    ('email.mime.text', 'json')
    """
    if not isinstance(relative_path, str) or not relative_path.endswith(".py"):
        raise ValueError(f"relative_path must be a path ending in '.py', got {relative_path!r}")
    return relative_path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


@dataclass(frozen=True)
class Docstring:
    """One docstring of the corpus and where it comes from.

    Attributes
    ----------
    module : str
        The dotted module name (``"email.mime.text"``).
    owner : str
        The qualified name of the class or function it documents inside the module
        (``"JSONDecoder.decode"``), or ``""`` for the module's own docstring.
    kind : str
        ``"module"``, ``"class"`` or ``"function"``.
    text : str
        The cleaned docstring.
    """

    module: str
    owner: str
    kind: str
    text: str

    @property
    def top_level(self) -> str:
        """The top-level package or module it belongs to (the unit of the split)."""
        return self.module.split(".", 1)[0]


def _clean(raw: str) -> str:
    """``inspect.cleandoc``'s text (as ``ast.get_docstring`` gives it), trailing spaces removed."""
    return "\n".join(line.rstrip() for line in raw.splitlines()).strip("\n")


def _docstrings(tree: ast.Module, module: str) -> list[Docstring]:
    """The module's, classes' and functions' docstrings of one file, in source order."""
    found = []
    kinds = {ast.ClassDef: "class", ast.FunctionDef: "function", ast.AsyncFunctionDef: "function"}

    def visit(node: ast.AST, owner: str) -> None:
        kind = "module" if isinstance(node, ast.Module) else kinds.get(type(node))
        if kind is not None:
            if kind != "module":
                owner = f"{owner}.{node.name}" if owner else node.name  # type: ignore[attr-defined]
            text = _clean(ast.get_docstring(node, clean=True) or "")  # type: ignore[arg-type]
            if text:
                found.append(Docstring(module, owner, kind, text))
        for child in ast.iter_child_nodes(node):  # in source order
            visit(child, owner)

    visit(tree, "")
    return found


@dataclass(frozen=True)
class _Extracted:
    files: tuple[str, ...]
    unparsable: tuple[str, ...]
    found: tuple[Docstring, ...]
    seconds: float


def _source_files(base: Path) -> list[str]:
    """The kept ``.py`` files under ``base``: sorted ``"/"``-separated relative paths.

    Excluded folders are never entered (``site-packages`` can hold far more files than
    the library itself).
    """
    found = []
    for folder, subfolders, names in os.walk(base):
        here = Path(folder).relative_to(base).as_posix()
        prefix = "" if here == "." else here + "/"
        subfolders[:] = [d for d in subfolders if not excluded(f"{prefix}{d}/x.py")]
        found.extend(
            f"{prefix}{n}"
            for n in names
            if n.endswith(".py") and not excluded(f"{prefix}{n}") and (Path(folder) / n).is_file()
        )
    return sorted(found)


@functools.lru_cache(maxsize=4)
def _extract(root: str) -> _Extracted:
    """Parse every kept file under ``root`` once per process (a few seconds for CPython's library)."""
    started = time.perf_counter()
    base = Path(root)
    files, unparsable, found = [], [], []
    for relative in _source_files(base):
        try:
            source = (base / relative).read_bytes()
            with _PARSING:
                tree = ast.parse(source, filename=relative)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            unparsable.append(relative)
            continue
        files.append(relative)
        found.extend(_docstrings(tree, module_name(relative)))
    return _Extracted(tuple(files), tuple(unparsable), tuple(found), time.perf_counter() - started)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _set_aside(
    documents: tuple[Docstring, ...], heldout: float, validation: float
) -> tuple[frozenset[str], frozenset[str]]:
    """The top-level names held out and set aside for validation, by the SHA-256 rule."""
    sizes: Counter[str] = Counter()
    for doc in documents:  # each docstring with the separator that follows it in its split
        sizes[doc.top_level] += len(doc.text.encode("utf-8")) + len(SEPARATOR)
    total = sum(sizes.values())
    budgets = {"heldout": heldout * total, "validation": validation * total}
    chosen: dict[str, set[str]] = {"heldout": set(), "validation": set()}
    used = dict.fromkeys(budgets, 0)
    for name in sorted(sizes, key=lambda n: hashlib.sha256(n.encode("utf-8")).hexdigest()):
        for split in ("heldout", "validation"):  # held-out text first
            if used[split] + sizes[name] <= budgets[split]:
                chosen[split].add(name)
                used[split] += sizes[name]
                break
    return frozenset(chosen["heldout"]), frozenset(chosen["validation"])


def source_digest(root: str | os.PathLike[str] | None = None) -> str:
    """SHA-256 (hex) of the source files the corpus reads: their relative paths and bytes.

    Reads the files without parsing them (a fraction of a second for CPython's library),
    so it can name a corpus before :func:`stdlib_docstrings` extracts it: two libraries
    with the same source digest give the same corpus. ``root`` as for
    :func:`stdlib_docstrings`.
    """
    base = _library_folder(root)
    h = hashlib.sha256()
    for relative in _source_files(base):
        data = (base / relative).read_bytes()
        h.update(f"{relative}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _library_folder(root: str | os.PathLike[str] | None) -> Path:
    if root is None:
        root = sysconfig.get_paths()["stdlib"]
    if not isinstance(root, str | os.PathLike):
        raise TypeError(f"root must be a str or path-like, got {describe(root)}")
    folder = Path(root).resolve()
    if not folder.is_dir():
        raise ValueError(f"root must be an existing folder, got {str(root)!r}")
    return folder


def doctest_bytes(text: str) -> int:
    r"""UTF-8 bytes of ``text`` that belong to doctest examples (code and its expected output).

    An example starts at a line whose first non-blank characters are ``>>>`` and runs
    through the following lines up to the first blank one (the ``...`` continuation
    lines and the expected output): the rule the ``doctest`` module itself follows. Each line
    counts with its newline.

    Examples
    --------
    >>> doctest_bytes("Add.\n\n>>> 1 + 1\n2\n\nDone.")
    12
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {describe(text)}")
    total, inside = 0, False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        inside = stripped.startswith(">>>") or (inside and bool(stripped))
        if inside:
            total += len(line.encode("utf-8"))
    return total


@dataclass(frozen=True)
class DocstringCorpus:
    """The standard library's docstrings, split into training and held-out text.

    Made by :func:`stdlib_docstrings`; see :mod:`tinyformer.data.corpus` for the rules.

    Attributes
    ----------
    root : str
        The folder the files were read from.
    files : tuple of str
        The relative paths read, sorted (excluded files are not listed).
    unparsable : tuple of str
        Files left out because they could not be read or parsed.
    documents : tuple of Docstring
        Every kept docstring, duplicates dropped, in the fixed order.
    n_found : int
        Docstrings found before exact duplicates were dropped.
    heldout_modules : frozenset of str
        The top-level packages and modules whose docstrings are held out.
    heldout_fraction : float
        The share of the text's bytes the held-out part could take at most.
    validation_modules : frozenset of str
        The top-level packages and modules whose docstrings are the validation text.
    validation_fraction : float
        The share of the text's bytes the validation part could take at most.
    parse_seconds : float
        Time spent reading and parsing the files (once per process and folder).
    """

    root: str
    files: tuple[str, ...]
    unparsable: tuple[str, ...]
    documents: tuple[Docstring, ...] = field(repr=False)
    n_found: int
    heldout_modules: frozenset[str] = field(repr=False)
    heldout_fraction: float
    validation_modules: frozenset[str] = field(repr=False)
    validation_fraction: float
    parse_seconds: float = field(compare=False)

    def _split_of(self, doc: Docstring) -> str:
        if doc.top_level in self.heldout_modules:
            return "heldout"
        return "validation" if doc.top_level in self.validation_modules else "train"

    def split(self, name: str) -> tuple[Docstring, ...]:
        """The docstrings of one split (one of :data:`SPLITS`), in the fixed order."""
        if name not in SPLITS:
            raise ValueError(f"name must be one of {SPLITS}, got {name!r}")
        return tuple(d for d in self.documents if self._split_of(d) == name)

    def text(self, name: str) -> str:
        """The text of one split: its docstrings joined by :data:`SEPARATOR`."""
        return SEPARATOR.join(d.text for d in self.split(name))

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 (hex) of the three texts in the order of :data:`SPLITS`, each in UTF-8 and followed by a NUL byte."""
        h = hashlib.sha256()
        for name in SPLITS:
            h.update(self.text(name).encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()

    @property
    def n_duplicates(self) -> int:
        """Docstrings dropped as exact repeats of an earlier one."""
        return self.n_found - len(self.documents)

    def n_bytes(self, name: str) -> int:
        """UTF-8 bytes of the text of a split."""
        return len(self.text(name).encode("utf-8"))

    def summary(self) -> dict[str, float]:
        """Counts that say what the text is: files, docstrings, bytes, and how much is doctest code.

        ``doctest_share`` is the share of the bytes (both splits) inside doctest examples
        (:func:`doctest_bytes`); ``with_doctests`` the share of docstrings holding one;
        ``ascii_share`` the share of bytes that are ASCII.
        """
        texts = [d.text for d in self.documents]
        both = b"".join(self.text(name).encode("utf-8") for name in SPLITS)
        total = sum(len(t.encode("utf-8")) for t in texts)
        return {
            "files": float(len(self.files)),
            "unparsable": float(len(self.unparsable)),
            "docstrings_found": float(self.n_found),
            "duplicates_dropped": float(self.n_duplicates),
            "docstrings": float(len(texts)),
            **{f"{name}_docstrings": float(len(self.split(name))) for name in SPLITS},
            **{f"{name}_bytes": float(self.n_bytes(name)) for name in SPLITS},
            "heldout_share": self.n_bytes("heldout") / len(both),
            "validation_share": self.n_bytes("validation") / len(both),
            "doctest_share": sum(doctest_bytes(t) for t in texts) / total,
            "with_doctests": sum(doctest_bytes(t) > 0 for t in texts) / len(texts),
            "ascii_share": sum(b < 128 for b in both) / len(both),
        }


def stdlib_docstrings(
    root: str | os.PathLike[str] | None = None,
    *,
    heldout_fraction: float = 0.1,
    validation_fraction: float = 0.05,
) -> DocstringCorpus:
    """The docstrings of the standard library of the running interpreter (or of a folder).

    Parameters
    ----------
    root : str or path-like, optional
        A folder laid out like the standard library; by default the running
        interpreter's, ``sysconfig.get_paths()["stdlib"]``. Files are parsed once per
        process and folder (about 6 s for CPython 3.11's library) and the parse is
        reused by later calls.
    heldout_fraction : float
        The share of the text's bytes the held-out top-level packages may take at
        most, in ``(0, 1)``.
    validation_fraction : float
        The share the validation packages may take at most, in ``[0, 1)`` (0: no
        validation text); the two shares sum to less than 1.

    Returns
    -------
    DocstringCorpus

    Raises
    ------
    ValueError
        If the folder does not exist, holds no docstring, or the split leaves the
        training or the held-out text empty.
    """
    folder = _library_folder(root)
    fraction = unit_interval(heldout_fraction, "heldout_fraction")
    if fraction == 0.0:
        raise ValueError("heldout_fraction must be in (0, 1), got 0.0")
    validation = unit_interval(validation_fraction, "validation_fraction")
    if fraction + validation >= 1.0:
        raise ValueError(
            "heldout_fraction + validation_fraction must be below 1 (some text must be left"
            f" to train on), got {fraction} + {validation}"
        )
    extracted = _extract(str(folder))
    seen: set[str] = set()
    documents = []
    for doc in extracted.found:
        if doc.text not in seen and _encodable(doc.text):
            seen.add(doc.text)
            documents.append(doc)
    n_found = sum(_encodable(d.text) for d in extracted.found)
    if not documents:
        where = "no .py source file" if not extracted.files else "no docstring"
        raise ValueError(
            f"root {str(folder)!r} holds {where} in the files the corpus reads (a library"
            " installed as compiled .pyc files alone has no text to read)"
        )
    held, validating = _set_aside(tuple(documents), fraction, validation)
    corpus = DocstringCorpus(
        str(folder),
        extracted.files,
        extracted.unparsable,
        tuple(documents),
        n_found,
        held,
        fraction,
        validating,
        validation,
        extracted.seconds,
    )
    for name in ("train", "heldout"):
        if not corpus.split(name):
            raise ValueError(
                f"the {name} split of {str(folder)!r} is empty with heldout_fraction={fraction}"
                " (too few top-level packages, or one too large for the held-out share)"
            )
    return corpus
