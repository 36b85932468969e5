"""Constrained decoding: the automaton, the mask, and sampling that never leaves the automaton."""

from __future__ import annotations

import numpy as np
import pytest
import toy_decoders as toys
from hypothesis import given
from hypothesis import strategies as st
from small_models import forward_logits, model_and_inputs

from tinyformer.data import MarkovSource
from tinyformer.generation.constrained import (
    TokenAutomaton,
    allowed_mass,
    constrained_sample,
    context_automaton,
    context_states,
    mask_logits,
)
from tinyformer.generation.processing import probabilities
from tinyformer.generation.sampling import sample

FAMILIES = ["decoder-only", "encoder-decoder"]


def random_automaton(rng: np.random.Generator, n_states: int, vocab: int) -> TokenAutomaton:
    """Each state allows a random non-empty set of tokens, each leading to a random state."""
    table = rng.integers(0, n_states, size=(n_states, vocab))
    forbidden = rng.random((n_states, vocab)) < 0.6
    forbidden[np.arange(n_states), rng.integers(0, vocab, size=n_states)] = False
    return TokenAutomaton(np.where(forbidden, -1, table))


def is_path(automaton: TokenAutomaton, state: int, tokens: np.ndarray) -> bool:
    """Whether ``tokens`` can be read from ``state``, one transition at a time."""
    for token in tokens:
        state = int(automaton.transitions[state, token])
        if state < 0:
            return False
    return True


# ------------------------------------------------------------------ the automaton
def test_a_parity_automaton_reads_its_language():
    # tokens 0 and 1; token 1 may not follow token 1 (no "11"); state = last token
    automaton = TokenAutomaton(np.array([[0, 1], [0, -1]]))
    np.testing.assert_array_equal(automaton.allowed([0, 1]), [[True, True], [True, False]])
    np.testing.assert_array_equal(automaton.advance([0, 1], [1, 0]), [1, 0])
    tokens = np.array([[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(automaton.walk([0, 0, 1], tokens), [4, 2, 0])
    with pytest.raises(ValueError, match="not allowed"):
        automaton.advance([1], [1])


def test_context_automaton_allows_exactly_what_the_source_can_write():
    source = MarkovSource.random(5, 2, 3, rng=np.random.default_rng(0))
    automaton = context_automaton(source.transitions > 0)
    assert automaton.n_states == 25
    assert automaton.vocab_size == 5
    streams = source.sample(30, np.random.default_rng(1), n_streams=50)  # (50, 30)
    states = context_states(streams[:, :2], 5, 2)
    np.testing.assert_array_equal(automaton.walk(states, streams[:, 2:]), 28)  # all accepted
    for stream in streams[:5]:
        for t in range(2, 30):  # the state after a prefix is the context of its last two
            state = context_states(stream[None, :t], 5, 2)[0]
            allowed = automaton.allowed([state])[0]
            np.testing.assert_array_equal(allowed, source.next_token_probs(stream[t - 2 : t]) > 0)


def test_walk_finds_the_first_forbidden_token():
    source = MarkovSource.random(4, 1, 2, rng=np.random.default_rng(3))
    automaton = context_automaton(source.transitions > 0)
    stream = source.sample(12, np.random.default_rng(4))
    forbidden = int(np.flatnonzero(source.next_token_probs(stream[5:6]) == 0)[0])
    broken = stream.copy()
    broken[6] = forbidden
    read = automaton.walk(context_states(broken[None, :1], 4, 1), broken[None, 1:])
    assert read[0] == 5  # tokens 1..5 read, token 6 is the first forbidden


# ----------------------------------------------------------------------- the mask
def test_mask_logits_forbids_exactly_the_masked_tokens(rng):
    z = rng.standard_normal((3, 6)).astype(np.float32)
    allowed = rng.random((3, 6)) < 0.5
    allowed[:, 0] = True
    masked = mask_logits(z, allowed)
    assert masked.dtype == np.float32
    np.testing.assert_array_equal(masked[allowed], z[allowed])
    assert np.isneginf(masked[~allowed]).all()
    p = probabilities(masked)
    np.testing.assert_allclose(p[allowed].sum(), 3.0, rtol=1e-6)
    assert (p[~allowed] == 0).all()


@given(seed=st.integers(0, 2**32 - 1), temperature=st.sampled_from([0.3, 1.0, 5.0]))
def test_sampling_under_the_mask_never_leaves_the_automaton(seed, temperature):
    rng = np.random.default_rng(seed)
    n_states, vocab, rows, steps = 5, 7, 16, 12
    automaton = random_automaton(rng, n_states, vocab)
    states = rng.integers(0, n_states, size=rows)
    start = states.copy()
    drawn = []
    for _ in range(steps):
        logits = rng.standard_normal((rows, vocab)) * 10  # anything the model might say
        p = probabilities(mask_logits(logits, automaton.allowed(states)), temperature=temperature)
        tokens = toys_free_draw(p, rng)
        states = automaton.advance(states, tokens)  # raises on a forbidden token
        drawn.append(tokens)
    tokens = np.stack(drawn, axis=1)  # (rows, steps)
    np.testing.assert_array_equal(automaton.walk(start, tokens), steps)
    assert all(is_path(automaton, s, row) for s, row in zip(start, tokens, strict=True))


def toys_free_draw(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row drawn with NumPy's own sampler (independent of sample_tokens)."""
    return np.array([rng.choice(len(row), p=row / row.sum()) for row in p])


# ------------------------------------------------------------------ constrained_sample
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_constrained_samples_are_paths_and_cached_equals_uncached(family, seed):
    model, inputs = model_and_inputs(family, seed, vocab=11)
    automaton = random_automaton(np.random.default_rng(seed), 4, 11)
    states = np.array([0, 1, 3])
    runs = [
        constrained_sample(
            model,
            inputs,
            automaton,
            states=states,
            rng=np.random.default_rng(seed),
            max_new_tokens=12,
            eos_id=None,
            temperature=2.0,
            use_cache=flag,
        )
        for flag in (True, False)
    ]
    for a, b in zip(runs[0].tokens, runs[1].tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    tokens = np.stack(runs[0].tokens)
    np.testing.assert_array_equal(automaton.walk(states, tokens), 12)


def test_an_automaton_that_allows_everything_changes_nothing():
    model, inputs = model_and_inputs("decoder-only", 5, vocab=9)
    everything = TokenAutomaton(np.zeros((1, 9), dtype=np.int64))
    options = {"max_new_tokens": 10, "eos_id": None, "temperature": 1.2, "top_p": 0.9}
    free = sample(model, inputs, rng=np.random.default_rng(4), **options)
    constrained = constrained_sample(
        model, inputs, everything, states=[0, 0, 0], rng=np.random.default_rng(4), **options
    )
    assert constrained == free


@pytest.mark.parametrize(
    "penalties",
    [{"repetition_penalty": 1.5}, {"frequency_penalty": 0.7, "presence_penalty": 0.3}],
)
def test_penalties_act_as_in_sample_and_never_unmask(penalties):
    model, inputs = model_and_inputs("decoder-only", 6, vocab=9)
    options = {"max_new_tokens": 10, "eos_id": None, "temperature": 1.3, **penalties}
    everything = TokenAutomaton(np.zeros((1, 9), dtype=np.int64))
    free = sample(model, inputs, rng=np.random.default_rng(5), **options)
    same = constrained_sample(
        model, inputs, everything, states=[0, 0, 0], rng=np.random.default_rng(5), **options
    )
    assert same == free  # one path: mask, then the penalties of sample, then the filters
    unpenalized = sample(
        model,
        inputs,
        rng=np.random.default_rng(5),
        max_new_tokens=10,
        eos_id=None,
        temperature=1.3,
    )
    assert unpenalized != free  # the penalties did change the draws
    automaton = random_automaton(np.random.default_rng(6), 4, 9)
    states = np.array([0, 2, 3])
    drawn = constrained_sample(
        model, inputs, automaton, states=states, rng=np.random.default_rng(5), **options
    )
    np.testing.assert_array_equal(automaton.walk(states, np.stack(drawn.tokens)), 10)


def test_allowed_mass_is_the_model_probability_of_the_allowed_tokens():
    model, inputs = model_and_inputs("decoder-only", 3, vocab=11)
    automaton = random_automaton(np.random.default_rng(3), 4, 11)
    states = np.array([0, 1, 3])
    drawn = constrained_sample(
        model,
        inputs,
        automaton,
        states=states,
        rng=np.random.default_rng(9),
        max_new_tokens=8,
        eos_id=None,
    )
    outputs = np.stack(drawn.tokens)  # (3, 8)
    mass = allowed_mass(model, inputs, outputs, automaton, states=states)
    assert mass.shape == (3, 8)
    assert mass.dtype == np.float64
    for row in range(3):  # reference: one state and one forward pass at a time
        logits = forward_logits(model, inputs[row], outputs[row]).astype(np.float64)  # (8, V)
        state = int(states[row])
        for t, token in enumerate(outputs[row]):
            keep = automaton.transitions[state] >= 0
            np.testing.assert_allclose(
                mass[row, t], probabilities(logits[t])[keep].sum(), rtol=1e-9
            )
            state = int(automaton.transitions[state, token])
    assert ((mass > 0) & (mass < 1)).all()  # this automaton forbids something at every state
    everything = TokenAutomaton(np.zeros((1, 11), dtype=np.int64))
    np.testing.assert_allclose(
        allowed_mass(model, inputs, outputs, everything, states=[0, 0, 0]), 1.0, rtol=1e-12
    )


def test_allowed_mass_refuses_outputs_that_leave_the_automaton():
    model, inputs = model_and_inputs("decoder-only", 3, vocab=5)
    no_repeat = TokenAutomaton(np.where(np.eye(5, dtype=bool), -1, np.arange(5)))  # state: last
    with pytest.raises(ValueError, match="not allowed"):
        allowed_mass(
            model, inputs, np.array([[1, 1], [1, 2], [2, 3]]), no_repeat, states=[0, 0, 0]
        )
    with pytest.raises(ValueError, match="outputs"):
        allowed_mass(model, inputs, np.array([1, 2, 3]), no_repeat, states=[0, 0, 0])
    with pytest.raises(ValueError, match="prompts"):
        allowed_mass(model, inputs[:2], np.array([[1], [2], [3]]), no_repeat, states=[0, 0, 0])
    with pytest.raises(TypeError, match="automaton"):
        allowed_mass(model, inputs, np.array([[1], [2], [3]]), "ab", states=[0, 0, 0])


def test_constrained_draws_follow_the_renormalized_distribution():
    vocab, draws, last = 6, 20_000, 2
    table = np.random.default_rng(7).standard_normal((vocab, vocab)) * 1.5
    model = toys.ToyLM(toys.bigram(table), vocab)
    allowed = np.array([True, False, True, True, False, True])
    automaton = TokenAutomaton(np.where(allowed, 0, -1)[None])  # one state
    result = constrained_sample(
        model,
        np.full((draws, 1), last),
        automaton,
        states=np.zeros(draws, dtype=np.int64),
        rng=np.random.default_rng(8),
        max_new_tokens=1,
        eos_id=None,
    )
    counts = np.bincount(np.concatenate(result.tokens), minlength=vocab)
    expected = probabilities(np.where(allowed, table[last], -np.inf))
    statistic, dof = toys.chi_square(counts, expected)  # also: no forbidden token drawn
    assert statistic < toys.chi_square_critical(dof)


# -------------------------------------------------------------------- bad arguments
def test_bad_automata_are_refused():
    with pytest.raises(ValueError, match="allows none"):
        TokenAutomaton(np.array([[0, 1], [-1, -1]]))
    with pytest.raises(ValueError, match="states in"):
        TokenAutomaton(np.array([[0, 2], [0, 1]]))
    with pytest.raises(TypeError, match="transitions"):
        TokenAutomaton(np.array([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        TokenAutomaton(np.array([0, 1]))
    with pytest.raises(ValueError, match="allowed"):
        context_automaton(np.ones((3, 4), dtype=bool))
    with pytest.raises(ValueError, match="allowed"):
        context_automaton(np.ones((3, 3)))


def test_bad_arguments_of_constrained_sample_are_refused():
    model, inputs = model_and_inputs("decoder-only", 0, vocab=9)
    automaton = TokenAutomaton(np.zeros((2, 9), dtype=np.int64))
    small = TokenAutomaton(np.zeros((2, 5), dtype=np.int64))
    good = {"rng": np.random.default_rng(0), "max_new_tokens": 3, "states": [0, 1, 0]}
    with pytest.raises(TypeError, match="automaton"):
        constrained_sample(model, inputs, "a|b", **good)
    with pytest.raises(ValueError, match="automaton has 5 tokens"):
        constrained_sample(model, inputs, small, **good)
    with pytest.raises(ValueError, match="states"):
        constrained_sample(model, inputs, automaton, **{**good, "states": [0, 1]})
    with pytest.raises(ValueError, match="states"):
        constrained_sample(model, inputs, automaton, **{**good, "states": [0, 2, 0]})
    with pytest.raises(ValueError, match="min_p"):
        constrained_sample(model, inputs, automaton, min_p=2.0, **good)
    with pytest.raises(ValueError, match="allowed"):
        mask_logits(np.zeros((1, 3)), np.zeros((1, 3), dtype=bool))
    with pytest.raises(ValueError, match="allowed"):
        mask_logits(np.zeros((1, 3)), np.ones((1, 4), dtype=bool))
    with pytest.raises(ValueError, match="prefixes"):
        context_states(np.array([[1]]), 4, 2)
