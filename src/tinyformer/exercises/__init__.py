"""Exercises the reader answers in code, with a check that says in words what is wrong.

An :class:`Exercise` names a function for the reader to write (``stub``: its signature and a
docstring that states what it must return), a reference implementation from tinyformer, and
the inputs (:class:`Case`) on which the two are compared. :meth:`Exercise.check` calls the
reader's function on every case and returns a :class:`Verdict`: right, or the first thing
that differs, said in words ("for T = 4 the result has shape (4, 3); expected (4, 4)",
"2 of 16 entries differ, first at [0, 1]: yours True, expected False").

The book uses each exercise twice, with the same check. In the live page (JupyterLite), the
reader writes the function and runs ``EXERCISE.check(their_function)``. In the build, the
chapter's hidden solution cell runs ``EXERCISE.require(solution)``, which raises
:class:`AssertionError` with the verdict's words if the solution fails, so a check that
rejected a right answer (or a solution that went wrong) stops the build.

The chapters' exercises live in one module per chapter (``tinyformer.exercises.attention``
and so on); :func:`get` finds one by its key, ``"<chapter>.<function>"``.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Case", "Exercise", "Verdict", "all_exercises", "differences", "get"]


@dataclass(frozen=True)
class Case:
    """One input of an exercise: the arguments and how to name them in a verdict.

    ``label`` says in words what the input is (``"T = 4"``, ``"a batch of 2 rows with a
    masked key"``); a verdict starts with it.
    """

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class Verdict:
    """The result of checking an answer: ``passed`` and a ``message`` in words.

    It shows as its message (in a notebook or with ``print``) and is true when the answer
    passed.
    """

    exercise: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message


def _show(value: Any, digits: int = 6) -> str:
    """A value, short, as a verdict quotes it (floats to ``digits`` significant digits)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _pair(got: Any, expected: Any) -> str:
    """The words "yours X, expected Y", with enough digits that X and Y read differently."""
    for digits in (6, 10, 17):
        mine, theirs = _show(got, digits), _show(expected, digits)
        if mine != theirs:
            break
    return f"yours {mine}, expected {theirs}"


def _kind(value: Any) -> str:
    """What a value is, in a few words."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    if value is None:
        return "None"
    return f"{type(value).__name__} {_show(value)}"


def differences(
    got: Any,
    expected: Any,
    *,
    rtol: float,
    atol: float,
    where: str = "",
    parts: Sequence[str] = (),
) -> str | None:
    """Say in words how ``got`` differs from ``expected``, or None if they agree.

    Arrays must agree in shape, in kind (booleans, integers or floating point) and in value
    (``numpy.isclose`` with ``rtol`` and ``atol``, NaN never equal); tuples and lists
    element by element; other values by ``==`` (floats with the same tolerance). ``where``
    names the part compared, for nested results; ``parts`` names the items of a tuple result
    (``("output", "weights")``), which are otherwise "item 0", "item 1"...
    """
    part = f"{where} " if where else "the result "
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"{part}is {_kind(got)}; expected a {type(expected).__name__} of {len(expected)} items"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            name = f"the {parts[i]}" if i < len(parts) else f"item {i} of {part.strip()}"
            found = differences(g, e, rtol=rtol, atol=atol, where=name)
            if found:
                return found
        return None
    if isinstance(expected, np.ndarray):
        if not isinstance(got, (np.ndarray, np.generic, int, float, bool, list, tuple)):
            return f"{part}is {_kind(got)}; expected {_kind(expected)}"
        if isinstance(got, (list, tuple)) and any(isinstance(g, np.ndarray) for g in got):
            return (
                f"{part}is a {type(got).__name__} of {len(got)} items; expected {_kind(expected)}"
            )
        try:
            got_array = np.asarray(got)
        except (ValueError, TypeError):
            return f"{part}is {_kind(got)}, which is not an array; expected {_kind(expected)}"
        if got_array.shape != expected.shape:
            return f"{part}has shape {got_array.shape}; expected {expected.shape}"
        want_bool = expected.dtype == np.bool_
        if want_bool != (got_array.dtype == np.bool_):
            wanted = "booleans (True/False)" if want_bool else f"numbers ({expected.dtype})"
            return f"{part}holds {got_array.dtype}; expected {wanted}"
        if want_bool or expected.dtype.kind in "iu":
            wrong = got_array != expected
        else:
            if got_array.dtype.kind not in "biuf":
                return f"{part}holds {got_array.dtype}; expected numbers ({expected.dtype})"
            nan = np.isnan(got_array.astype(np.float64)) & ~np.isnan(expected)
            if nan.any():
                first = tuple(int(i) for i in np.argwhere(nan)[0])
                return f"{part}has {int(nan.sum())} NaN entries where a number is expected (first at {list(first)})"
            wrong = ~np.isclose(got_array, expected, rtol=rtol, atol=atol, equal_nan=True)
        if not wrong.any():
            return None
        first = tuple(int(i) for i in np.argwhere(wrong)[0]) if wrong.ndim else ()
        at = f"[{', '.join(map(str, first))}]" if first else ""
        head = (
            f"{int(wrong.sum())} of {wrong.size} entries differ"
            if wrong.ndim
            else "the value differs"
        )
        detail = _pair(got_array[first], expected[first])
        if not (want_bool or expected.dtype.kind in "iu"):
            gap = float(np.max(np.abs(got_array.astype(np.float64) - expected)[wrong]))
            head += f" (by up to {gap:.3g})"
        return f"{part}is wrong: {head}; {'first at ' + at + ': ' if at else ''}{detail}"
    if isinstance(expected, (float, np.floating)) and not isinstance(expected, bool):
        try:
            value = float(got)
        except (TypeError, ValueError):
            return f"{part}is {_kind(got)}; expected a number close to {_show(expected)}"
        if np.isnan(value) or not np.isclose(value, float(expected), rtol=rtol, atol=atol):
            return f"{part}is wrong: {_pair(value, float(expected))}"
        return None
    if isinstance(got, np.ndarray) and got.shape == ():
        got = got.item()
    if got != expected:
        return f"{part}is {_kind(got)}; expected {_kind(expected)}"
    return None


def _changed(before: Sequence[Any], after: Sequence[Any]) -> int | None:
    """The position of the first array argument the call modified, or None."""
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        if isinstance(old, np.ndarray) and not np.array_equal(old, new, equal_nan=True):
            return i
    return None


@dataclass(frozen=True)
class Exercise:
    """A function for the reader to write, checked against tinyformer's own on fixed inputs.

    Parameters
    ----------
    chapter
        The chapter's file name without ``.md`` (``"attention"``).
    name
        The function's name, as the reader defines it (``"causal_mask"``).
    stub
        The source the reader starts from: the signature, a docstring saying what the
        function takes and returns, and ``raise NotImplementedError`` as its body.
    reference
        A function with the same signature that gives the right answer (usually the
        package's own).
    cases
        The inputs, built when the check runs (a function, so each check gets fresh
        arrays, made from fixed seeds).
    rtol, atol
        Tolerances for floating-point results (``numpy.isclose``).
    parts
        Names of the items when the function returns a tuple (``("output", "weights")``),
        for the verdict's words.
    mistakes
        Wrong answers a reader is likely to write (the tests assert that the check rejects
        each of them, so a check that accepts anything cannot pass unnoticed).
    """

    chapter: str
    name: str
    stub: str
    reference: Callable[..., Any]
    cases: Callable[[], Sequence[Case]]
    rtol: float = 1e-6
    atol: float = 1e-9
    parts: tuple[str, ...] = ()
    mistakes: tuple[Callable[..., Any], ...] = ()

    @property
    def key(self) -> str:
        """``"<chapter>.<name>"``: how the book and :func:`get` name it."""
        return f"{self.chapter}.{self.name}"

    def _verdict(self, passed: bool, message: str) -> Verdict:
        return Verdict(self.key, passed, message)

    def check(self, answer: Any) -> Verdict:
        """Run ``answer`` on every case and compare it with the reference: a :class:`Verdict`."""
        if not callable(answer):
            return self._verdict(
                False, f"Not yet: `{self.name}` should be a function; got {_kind(answer)}."
            )
        cases = list(self.cases())
        for case in cases:
            label = f"For {case.label}, " if case.label else ""
            args = copy.deepcopy(case.args)
            kwargs = copy.deepcopy(case.kwargs)
            expected = self.reference(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
            try:
                got = answer(*args, **kwargs)
            except NotImplementedError:
                return self._verdict(
                    False,
                    f"Not answered yet: `{self.name}` still raises NotImplementedError. Replace"
                    " that line with your code and run the cell again.",
                )
            except Exception as error:  # noqa: BLE001 - the reader's code may raise anything
                return self._verdict(
                    False, f"Not yet. {label}`{self.name}` raised {type(error).__name__}: {error}"
                )
            if got is None and expected is not None:
                return self._verdict(
                    False, f"Not yet. {label}`{self.name}` returned None: is a `return` missing?"
                )
            moved = _changed(case.args, args)
            if moved is not None:
                return self._verdict(
                    False,
                    f"Not yet. {label}`{self.name}` changed its argument {moved + 1} in place;"
                    " compute a new array instead.",
                )
            found = differences(got, expected, rtol=self.rtol, atol=self.atol, parts=self.parts)
            if found:
                return self._verdict(False, f"Not yet. {label}{found}.")
        labels = ", ".join(case.label for case in cases if case.label)
        on = f" ({labels})" if labels else ""
        return self._verdict(
            True, f"Right: `{self.name}` gives the expected result on all {len(cases)} inputs{on}."
        )

    def require(self, answer: Any) -> Verdict:
        """:meth:`check`, raising :class:`AssertionError` with the verdict's words if it fails."""
        verdict = self.check(answer)
        if not verdict.passed:
            raise AssertionError(f"exercise {self.key}: {verdict.message}")
        return verdict


def all_exercises() -> list[Exercise]:
    """Every exercise of the book, from the modules of this package, in key order."""
    import pkgutil  # noqa: PLC0415

    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found += [value for value in vars(module).values() if isinstance(value, Exercise)]
    return sorted(found, key=lambda exercise: exercise.key)


def get(key: str) -> Exercise:
    """The exercise named ``"<chapter>.<name>"`` (from ``tinyformer.exercises.<chapter>``)."""
    if not isinstance(key, str) or key.count(".") != 1:
        raise ValueError(f"key must be '<chapter>.<function name>', got {key!r}")
    chapter = key.split(".", maxsplit=1)[0]
    try:
        module = importlib.import_module(f"tinyformer.exercises.{chapter}")
    except ModuleNotFoundError:
        raise ValueError(f"key {key!r}: no exercises for chapter {chapter!r}") from None
    for value in vars(module).values():
        if isinstance(value, Exercise) and value.key == key:
            return value
    found = sorted(v.key for v in vars(module).values() if isinstance(v, Exercise))
    raise ValueError(f"key {key!r}: chapter {chapter!r} has exercises {found}")
