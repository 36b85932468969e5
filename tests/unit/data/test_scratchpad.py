"""Parity rows with and without a scratchpad, held-out strings, and the answer checker."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.data.scratchpad import SEPARATOR, bit_strings, final_answers, parity_rows


def test_direct_rows_end_with_the_parity_after_the_separator():
    bits = np.array([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]])
    rows, produced = parity_rows(bits, scratchpad=False)
    assert rows.tolist() == [[1, 0, 1, 1, 2, 1], [0, 0, 0, 0, 2, 0], [1, 1, 0, 0, 2, 0]]
    assert produced.tolist() == [[False] * 5 + [True]] * 3


def test_scratchpad_rows_write_the_running_parity_then_the_answer():
    rows, produced = parity_rows(np.array([[1, 0, 1, 1]]), scratchpad=True)
    assert rows.tolist() == [[1, 0, 1, 1, 2, 1, 1, 0, 1, 2, 1]]
    assert produced[0].tolist() == [False] * 5 + [True] * 6


def test_every_scratchpad_step_is_the_xor_of_the_previous_step_and_one_bit():
    bits = bit_strings(200, 12, rng=np.random.default_rng(0))
    rows, _ = parity_rows(bits, scratchpad=True)
    running = rows[:, 13:25]  # p_1 .. p_12
    previous = np.concatenate([np.zeros((200, 1), np.int64), running[:, :-1]], axis=1)
    assert np.array_equal(running, previous ^ bits)
    assert np.array_equal(rows[:, -1], bits.sum(axis=1) % 2)  # the answer is the parity
    assert np.all(rows[:, [12, 25]] == SEPARATOR)


def test_bit_strings_are_uniform_bits_and_avoid_the_excluded_ones():
    held = bit_strings(20, 6, rng=np.random.default_rng(1))
    drawn = bit_strings(20_000, 6, rng=np.random.default_rng(2), exclude=held)
    codes = lambda b: set((b @ 2 ** np.arange(6)).tolist())
    assert codes(drawn).isdisjoint(codes(held))
    assert len(codes(drawn)) == 64 - len(codes(held))  # every other string occurs
    counts = np.bincount(drawn @ 2 ** np.arange(6), minlength=64)
    allowed = counts[counts > 0]  # uniform over the strings not excluded: about 440 each
    assert np.all(np.abs(allowed / allowed.mean() - 1) < 0.25)  # 5 standard deviations
    again = bit_strings(20_000, 6, rng=np.random.default_rng(2), exclude=held)
    assert np.array_equal(drawn, again)  # the generator decides everything


def test_final_answers_read_the_answer_where_the_format_puts_it():
    direct = np.array([[1], [0], [2]])
    assert final_answers(direct, 4, scratchpad=False).tolist() == [1, 0, -1]
    good = [1, 1, 0, 1, SEPARATOR, 1]
    misplaced = [1, 1, 0, SEPARATOR, 1, 1]  # separator one step early
    not_a_bit = [1, 1, 0, 1, SEPARATOR, SEPARATOR]
    extra_separator = [1, SEPARATOR, 0, 1, SEPARATOR, 1]  # a separator among the n bits too
    answers = final_answers(
        np.array([good, misplaced, not_a_bit, extra_separator]), 4, scratchpad=True
    )
    assert answers.tolist() == [1, -1, -1, -1]


def test_final_answers_of_the_true_continuations_are_the_parities():
    bits = bit_strings(64, 9, rng=np.random.default_rng(3))
    for scratchpad in (False, True):
        rows, produced = parity_rows(bits, scratchpad=scratchpad)
        continuation = rows[:, produced[0]]
        answers = final_answers(continuation, 9, scratchpad=scratchpad)
        assert np.array_equal(answers, bits.sum(axis=1) % 2)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: parity_rows(np.array([[0, 2]]), scratchpad=True), ValueError, "only 0 and 1"),
        (lambda: parity_rows(np.array([0, 1]), scratchpad=True), ValueError, "shape (N, n)"),
        (lambda: parity_rows(np.array([[0.0, 1.0]]), scratchpad=True), TypeError, "bits"),
        (lambda: parity_rows(np.array([[0, 1]]), scratchpad=1), TypeError, "scratchpad"),
        (lambda: bit_strings(3, 63, rng=np.random.default_rng(0)), ValueError, "n_bits"),
        (
            lambda: bit_strings(3, 2, rng=np.random.default_rng(0), exclude=[[0, 0, 1]]),
            ValueError,
            "exclude",
        ),
        (
            lambda: bit_strings(3, 1, rng=np.random.default_rng(0), exclude=[[0], [1]]),
            ValueError,
            "every one",
        ),
        (lambda: final_answers(np.array([[0, 1]]), 4, scratchpad=True), ValueError, "at least 6"),
        (lambda: final_answers(np.array([[0.5]]), 4, scratchpad=False), TypeError, "integer"),
    ],
)
def test_bad_arguments_are_refused_by_name(call, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()
