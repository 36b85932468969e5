"""The live exercises' checks: right answers pass, wrong ones fail, and the verdicts say why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tinyformer.exercises import Case, Exercise, all_exercises, differences, get

EXERCISES = all_exercises()
IDS = [exercise.key for exercise in EXERCISES]


def stub_function(exercise: Exercise):
    namespace: dict = {"np": np}
    exec(exercise.stub, namespace)  # noqa: S102 - the stub is the package's own source
    return namespace[exercise.name]


def test_every_exercise_is_found():
    assert "attention.masked_attention" in IDS
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("exercise", EXERCISES, ids=IDS)
def test_reference_passes(exercise):
    verdict = exercise.require(exercise.reference)
    assert verdict.passed
    assert verdict.message.startswith("Right")


@pytest.mark.parametrize("exercise", EXERCISES, ids=IDS)
def test_stub_is_not_an_answer(exercise):
    fn = stub_function(exercise)
    assert fn.__name__ == exercise.name
    assert fn.__doc__, "the stub's docstring states the task"
    verdict = exercise.check(fn)
    assert not verdict.passed
    assert "Not answered yet" in verdict.message
    with pytest.raises(AssertionError, match="Not answered yet"):
        exercise.require(fn)


@pytest.mark.parametrize("exercise", EXERCISES, ids=IDS)
def test_mistakes_are_rejected(exercise):
    assert exercise.mistakes, "each exercise lists at least one likely wrong answer"
    for mistake in exercise.mistakes:
        verdict = exercise.check(mistake)
        assert not verdict.passed, mistake.__name__
        assert verdict.message.startswith("Not yet"), verdict.message


@pytest.mark.parametrize("exercise", EXERCISES, ids=IDS)
def test_returning_nothing_is_explained(exercise):
    verdict = exercise.check(lambda *args, **kwargs: None)
    assert not verdict.passed
    assert "return" in verdict.message


@pytest.mark.parametrize("exercise", EXERCISES, ids=IDS)
def test_cases_are_fresh_and_deterministic(exercise):
    first, second = exercise.cases(), exercise.cases()
    assert len(first) >= 2
    for a, b in zip(first, second, strict=True):
        assert a.label, "every case says what it is"
        for x, y in zip(a.args, b.args, strict=True):
            if isinstance(x, np.ndarray):
                assert x is not y
                assert np.array_equal(x, y, equal_nan=True)


def test_verdict_words_for_arrays():
    expected = np.eye(3, dtype=bool)
    assert differences(expected.copy(), expected, rtol=0, atol=0) is None
    assert "shape (3, 2); expected (3, 3)" in differences(
        expected[:, :2], expected, rtol=0, atol=0
    )
    assert "holds float64; expected booleans" in differences(np.eye(3), expected, rtol=0, atol=0)
    wrong = expected.copy()
    wrong[0, 1] = True
    said = differences(wrong, expected, rtol=0, atol=0)
    assert "1 of 9 entries differ" in said
    assert "first at [0, 1]" in said
    nan = np.array([1.0, np.nan])
    assert "1 NaN entries" in differences(nan, np.array([1.0, 2.0]), rtol=1e-6, atol=0)
    said = differences(np.array([1.0, 2.5]), np.array([1.0, 2.0]), rtol=1e-6, atol=0)
    assert "by up to 0.5" in said
    assert "yours 2.5, expected 2" in said
    assert (
        differences(np.array([1.0, 2.0 + 1e-9]), np.array([1.0, 2.0]), rtol=1e-6, atol=0) is None
    )


def test_verdict_words_for_tuples_and_scalars():
    said = differences(
        (1.0, np.zeros(2)), (1.0, np.ones(2)), rtol=0, atol=0, parts=("loss", "grad")
    )
    assert said.startswith("the grad is wrong")
    assert "expected a tuple of 2 items" in differences(np.zeros(2), (1, 2), rtol=0, atol=0)
    assert differences(3, 3, rtol=0, atol=0) is None
    assert "is int 4; expected int 3" in differences(4, 3, rtol=0, atol=0)
    assert "yours nan, expected 1" in differences(float("nan"), 1.0, rtol=1e-6, atol=0)
    assert "yours 1.1, expected 1" in differences(1.1, 1.0, rtol=1e-6, atol=0)


def test_verdict_shows_enough_digits_to_tell_values_apart():
    said = differences(np.array([1.0 + 3e-7]), np.array([1.0]), rtol=1e-9, atol=0)
    assert "yours 1.0000003, expected 1" in said


def test_verdict_for_a_tuple_where_an_array_is_expected():
    said = differences((np.zeros((2, 3)), np.zeros(2)), np.zeros((2, 3)), rtol=0, atol=0)
    assert (
        said
        == "the result is a tuple of 2 items; expected an array of shape (2, 3) and dtype float64"
    )
    said = differences([[1, 2], [3]], np.zeros((2, 2)), rtol=0, atol=0)
    assert "which is not an array" in said


def test_check_reports_in_place_changes_and_errors():
    def reference(x):
        return x * 2

    exercise = Exercise(
        "demo",
        "double",
        "def double(x):\n    raise NotImplementedError\n",
        reference,
        lambda: [Case((np.arange(3.0),), label="x = [0, 1, 2]")],
    )

    def in_place(x):
        x *= 2
        return x

    said = exercise.check(in_place).message
    assert "changed its argument 1 in place" in said
    said = exercise.check(lambda x: x[5]).message
    assert said.startswith("Not yet. For x = [0, 1, 2], `double` raised IndexError")
    assert exercise.check(reference).message.startswith("Right: `double`")
    assert "should be a function" in exercise.check(None).message


def test_get_names_what_exists():
    assert get("attention.masked_attention").name == "masked_attention"
    with pytest.raises(ValueError, match="no exercises for chapter"):
        get("nochapter.f")
    with pytest.raises(ValueError, match="has exercises"):
        get("attention.nothing")
    with pytest.raises(ValueError, match=r"<chapter>\.<function name>"):
        get("attention")


def test_every_chapter_has_a_live_exercise():
    chapters = {
        path.stem for path in (Path(__file__).parents[2] / "docs" / "chapters").glob("*.md")
    }
    assert chapters, "no chapters found"
    assert {exercise.chapter for exercise in EXERCISES} == chapters
