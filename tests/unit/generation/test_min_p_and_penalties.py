"""min-p filtering and the repetition, frequency and presence penalties.

Each rule is checked against a brute-force restatement of its definition, the
sampler against the exact processed distribution of a toy model, and the
default settings against tokens recorded before these options existed.
"""

from __future__ import annotations

import numpy as np
import pytest
import toy_decoders as toys
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from small_models import OPTIONS, model_and_inputs

from tinyformer.functional import softmax
from tinyformer.generation.processing import (
    log_probabilities,
    penalize,
    probabilities,
    token_counts,
)
from tinyformer.generation.sampling import sample

FAMILIES = ["decoder-only", "encoder-decoder"]
finite = st.floats(-20, 20, allow_nan=False, width=64)
logit_rows = arrays(np.float64, st.integers(1, 12), elements=finite)


def _min_p_by_definition(p: np.ndarray, min_p: float) -> set[int]:
    """Tokens whose probability is at least min_p times the largest, one at a time."""
    top = max(p)
    return {v for v in range(len(p)) if p[v] >= min_p * top}


# ------------------------------------------------------------------------ min-p
@given(z=logit_rows, min_p=st.floats(0.0, 1.0), temperature=st.sampled_from([0.5, 1.0, 3.0]))
def test_min_p_keeps_the_tokens_above_its_scaled_cut(z, min_p, temperature):
    p = softmax(z / temperature)
    top = p.max()
    assume(np.all(np.abs(p - min_p * top) > 1e-9 * top))  # no token on the cut itself
    got = probabilities(z, temperature=temperature, min_p=min_p)
    assert set(np.flatnonzero(got > 0)) == _min_p_by_definition(p, min_p)
    kept = got > 0
    np.testing.assert_allclose(got[kept], p[kept] / p[kept].sum(), rtol=1e-9)


def test_min_p_on_a_known_distribution():
    p = np.array([0.5, 0.3, 0.1, 0.06, 0.04])
    z = np.log(p)
    assert set(np.flatnonzero(probabilities(z, min_p=0.19))) == {0, 1, 2}  # cut 0.095
    assert set(np.flatnonzero(probabilities(z, min_p=0.21))) == {0, 1}  # cut 0.105
    flat = np.log(np.array([0.22, 0.2, 0.2, 0.19, 0.19]))
    assert (probabilities(flat, min_p=0.2) > 0).all()  # a flat row keeps everything


def test_min_p_cut_moves_with_the_top_token_while_top_p_keeps_the_tail():
    confident = np.log(np.array([0.9, 0.04, 0.03, 0.02, 0.01]))
    flat = np.log(np.array([0.3, 0.25, 0.2, 0.15, 0.1]))
    assert (probabilities(confident, min_p=0.1) > 0).sum() == 1  # cut 0.09
    assert (probabilities(flat, min_p=0.1) > 0).sum() == 5  # cut 0.03
    assert (probabilities(confident, top_p=0.95) > 0).sum() == 3


@pytest.mark.parametrize("min_p", [None, 0.0])
def test_min_p_zero_or_none_changes_nothing(rng, min_p):
    z = rng.standard_normal((4, 9))
    np.testing.assert_array_equal(log_probabilities(z, min_p=min_p), log_probabilities(z))


def test_min_p_one_keeps_the_argmax_and_its_ties():
    z = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 4.0]])
    p = probabilities(z, min_p=1.0)
    np.testing.assert_array_equal(p, [[0, 0.5, 0.5, 0], [1, 0, 0, 0]])


@given(z=logit_rows, top_p=st.floats(0.05, 1.0), min_p=st.floats(0.0, 1.0))
def test_min_p_runs_after_top_p_on_the_renormalized_distribution(z, top_p, min_p):
    after_top_p = probabilities(z, top_p=top_p)  # renormalized over the nucleus
    top = after_top_p.max()
    assume(np.all(np.abs(after_top_p - min_p * top) > 1e-9 * top))
    nucleus = set(np.flatnonzero(after_top_p > 0))
    expected = nucleus & _min_p_by_definition(after_top_p, min_p)
    got = probabilities(z, top_p=top_p, min_p=min_p)
    assert set(np.flatnonzero(got > 0)) == expected


def test_min_p_keeps_float32():
    z = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    assert log_probabilities(z, min_p=0.3, temperature=1.5).dtype == np.float32


# -------------------------------------------------------------------- penalties
def _penalized_by_definition(z, history, theta, alpha_f, alpha_p):
    """The penalties one token at a time, as written in the docstring."""
    out = z.copy()
    for b in range(z.shape[0]):
        for v in range(z.shape[1]):
            c = int(np.sum(history[b] == v))
            if c == 0:
                continue
            out[b, v] = z[b, v] / theta if z[b, v] > 0 else z[b, v] * theta
            out[b, v] -= alpha_f * c + alpha_p
    return out


@given(
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(0, 9),
    theta=st.floats(0.2, 5.0),
    alpha_f=st.floats(-2.0, 2.0),
    alpha_p=st.floats(-2.0, 2.0),
)
def test_penalties_match_their_definition(seed, length, theta, alpha_f, alpha_p):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((3, 6)) * 3
    history = rng.integers(0, 6, size=(3, length))
    got = penalize(
        z,
        history,
        repetition_penalty=theta,
        frequency_penalty=alpha_f,
        presence_penalty=alpha_p,
    )
    expected = _penalized_by_definition(z, history, theta, alpha_f, alpha_p)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_neutral_penalties_return_the_logits_unchanged(rng):
    z = rng.standard_normal((2, 7)).astype(np.float32)
    history = rng.integers(0, 7, size=(2, 5))
    got = penalize(z, history)
    np.testing.assert_array_equal(got, z)
    assert got.dtype == np.float32


def test_repetition_penalty_lowers_seen_tokens_of_either_sign():
    z = np.array([[2.0, -2.0, 1.0, 0.0]])
    got = penalize(z, np.array([[0, 1, 3]]), repetition_penalty=2.0)
    np.testing.assert_array_equal(got, [[1.0, -4.0, 1.0, 0.0]])


def test_only_the_repetition_penalty_depends_on_where_zero_lies(rng):
    z = rng.standard_normal((2, 8))
    history = rng.integers(0, 8, size=(2, 6))
    shift = 5.0

    def p(logits, **options):
        return probabilities(penalize(logits, history, **options))

    for options in ({"frequency_penalty": 0.7}, {"presence_penalty": 1.1}):
        np.testing.assert_allclose(p(z + shift, **options), p(z, **options), atol=1e-12)
    moved = np.abs(p(z + shift, repetition_penalty=1.5) - p(z, repetition_penalty=1.5)).max()
    assert moved > 1e-3


def test_token_counts_match_bincount(rng):
    history = rng.integers(0, 5, size=(4, 11))
    counts = token_counts(history, 5)
    for row, ids in zip(counts, history, strict=True):
        np.testing.assert_array_equal(row, np.bincount(ids, minlength=5))
    assert token_counts(np.zeros((2, 0), dtype=np.int64), 5).sum() == 0


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"min_p": -0.1}, ValueError, "min_p"),
        ({"min_p": 1.5}, ValueError, "min_p"),
        ({"min_p": float("nan")}, ValueError, "min_p"),
        ({"min_p": True}, TypeError, "min_p"),
        ({"min_p": "0.1"}, TypeError, "min_p"),
    ],
)
def test_bad_min_p_is_refused_by_name(options, error, words):
    with pytest.raises(error, match=words):
        log_probabilities(np.zeros(5), **options)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"repetition_penalty": 0.0}, ValueError, "repetition_penalty"),
        ({"repetition_penalty": -1.2}, ValueError, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, ValueError, "repetition_penalty"),
        ({"repetition_penalty": "high"}, TypeError, "repetition_penalty"),
        ({"frequency_penalty": float("nan")}, ValueError, "frequency_penalty"),
        ({"frequency_penalty": None}, TypeError, "frequency_penalty"),
        ({"presence_penalty": float("-inf")}, ValueError, "presence_penalty"),
        ({"presence_penalty": True}, TypeError, "presence_penalty"),
    ],
)
def test_bad_penalties_are_refused_by_name(options, error, words):
    with pytest.raises(error, match=words):
        penalize(np.zeros((1, 5)), np.zeros((1, 2), dtype=np.int64), **options)
    model, inputs = model_and_inputs("decoder-only", 0)
    with pytest.raises(error, match=words):
        sample(model, inputs, rng=np.random.default_rng(0), max_new_tokens=2, **options)


def test_bad_history_is_refused():
    with pytest.raises(ValueError, match="history"):
        penalize(np.zeros((2, 5)), np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="history"):
        penalize(np.zeros((1, 5)), np.array([[7]]))
    with pytest.raises(TypeError, match="history"):
        penalize(np.zeros((1, 5)), np.array([[0.5]]))


# ---------------------------------------------------------------------- sample
RECORDED = {  # sample(..., rng=default_rng(11), max_new_tokens=12), before min-p and penalties
    ("decoder-only", False): [
        [3, 1, 1, 6, 9, 9, 10, 4, 1, 8, 7, 8],
        [6, 0, 2, 3, 4, 6, 6, 6, 8, 10, 6, 5],
        [6, 10, 10, 5, 0, 7, 10, 5, 3, 1, 0, 3],
    ],
    ("decoder-only", True): [
        [3, 1, 1, 6, 8, 10, 10, 4, 4, 8, 7, 10],
        [6, 0, 2, 3, 5, 8, 7, 6, 6, 10, 6, 2],
        [6, 10, 10, 5, 0, 6, 10, 7, 1, 1, 1, 1],
    ],
    ("encoder-decoder", False): [
        [1, 0, 0, 8, 8, 9, 10, 1, 3, 10, 7, 10],
        [4, 1, 1, 2, 2, 7, 6, 6, 6, 7, 6, 6],
        [7, 10, 10, 7, 1, 6, 10, 6, 3, 1, 1, 1],
    ],
    ("encoder-decoder", True): [
        [0, 0, 0, 8, 8, 8, 10, 1, 1, 10, 6, 10],
        [2, 0, 0, 2, 1, 6, 6, 6, 6, 7, 5, 6],
        [7, 10, 10, 7, 1, 6, 10, 7, 1, 1, 0, 1],
    ],
}
PROCESSED = {"temperature": 1.7, "top_k": 6, "top_p": 0.9}
NEUTRAL = {"min_p": None, "repetition_penalty": 1.0, "frequency_penalty": 0.0}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("processed", [False, True])
def test_defaults_draw_the_tokens_drawn_before_the_new_options(family, processed):
    model, inputs = model_and_inputs(family, 3)
    options = PROCESSED if processed else {}
    for extra in ({}, {**NEUTRAL, "presence_penalty": 0.0, "min_p": 0.0}):
        got = sample(
            model,
            inputs,
            rng=np.random.default_rng(11),
            max_new_tokens=12,
            eos_id=None,
            **options,
            **extra,
        )
        np.testing.assert_array_equal(np.stack(got.tokens), RECORDED[family, processed])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["pre-norm learned", "llama"])
def test_min_p_and_penalties_draw_the_same_with_and_without_the_cache(family, name):
    model, inputs = model_and_inputs(family, 4, vocab=7, **OPTIONS[name])
    options = {
        "max_new_tokens": 10,
        "eos_id": None,
        "temperature": 1.3,
        "min_p": 0.05,
        "repetition_penalty": 1.3,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    }
    runs = [
        sample(model, inputs, rng=np.random.default_rng(5), use_cache=flag, **options)
        for flag in (True, False)
    ]
    for a, b in zip(runs[0].tokens, runs[1].tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(runs[0].token_log_probs, runs[1].token_log_probs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    plain = sample(
        model,
        inputs,
        rng=np.random.default_rng(5),
        max_new_tokens=10,
        eos_id=None,
        temperature=1.3,
    )
    assert runs[0] != plain  # the options changed the draws


def test_a_large_presence_penalty_never_repeats_a_token_the_model_has_read():
    model, inputs = model_and_inputs("decoder-only", 2, vocab=11)  # prompts of a few tokens
    new = 11 - inputs.shape[1]  # as many new tokens as unseen ids
    got = sample(
        model,
        inputs,
        rng=np.random.default_rng(3),
        max_new_tokens=new,
        eos_id=None,
        presence_penalty=1e4,
    )
    for prompt, tokens in zip(inputs, got.tokens, strict=True):
        seen = list(prompt) + list(tokens)
        assert len(set(seen)) == len(set(prompt)) + len(tokens)  # each new token is new


@pytest.mark.parametrize("min_p", [0.05, 0.3])
def test_sampled_frequencies_with_min_p_match_the_processed_distribution(min_p):
    vocab, draws, last = 8, 20_000, 5
    table = np.random.default_rng(7).standard_normal((vocab, vocab)) * 1.5
    model = toys.ToyLM(toys.bigram(table), vocab)
    options = {"temperature": 1.4, "min_p": min_p}
    result = sample(
        model,
        np.full((draws, 1), last),
        rng=np.random.default_rng(8),
        max_new_tokens=1,
        eos_id=None,
        **options,
    )
    counts = np.bincount(np.concatenate(result.tokens), minlength=vocab)
    statistic, dof = toys.chi_square(counts, probabilities(table[last], **options))
    assert statistic < toys.chi_square_critical(dof)
    plain, dof_plain = toys.chi_square(counts, probabilities(table[last], temperature=1.4))
    assert plain > toys.chi_square_critical(dof_plain)


def test_penalized_draws_follow_the_penalized_distribution():
    vocab, draws = 6, 20_000
    table = np.random.default_rng(9).standard_normal((vocab, vocab))
    model = toys.ToyLM(toys.bigram(table), vocab)
    prompt = np.array([2, 4, 4, 1])
    options = {"repetition_penalty": 1.8, "frequency_penalty": 0.5, "presence_penalty": 0.3}
    result = sample(
        model,
        np.tile(prompt, (draws, 1)),
        rng=np.random.default_rng(10),
        max_new_tokens=1,
        eos_id=None,
        **options,
    )
    counts = np.bincount(np.concatenate(result.tokens), minlength=vocab)
    expected = probabilities(penalize(table[prompt[-1]][None], prompt[None], **options))[0]
    statistic, dof = toys.chi_square(counts, expected)
    assert statistic < toys.chi_square_critical(dof)
    plain, dof_plain = toys.chi_square(counts, probabilities(table[prompt[-1]]))
    assert plain > toys.chi_square_critical(dof_plain)
