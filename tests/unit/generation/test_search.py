"""Greedy search and beam search, on toy models with known distributions and on real models.

The log-probabilities a search reports are the model's own: those of its ``forward``
pass, even when every ``Linear`` of the model has been changed by an adapter, with the
cache and without it.
"""

from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import pytest
import toy_decoders as toys
from small_models import (
    OPTIONS,
    adapt_linears,
    forward_log_probs,
    forward_logits,
    model_and_inputs,
    sharpen,
)

from tinyformer.functional import log_softmax
from tinyformer.generation import beam_search, greedy, length_normalizer

EOS = 2
FAMILIES = ["decoder-only", "encoder-decoder"]
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def adapted(family: str, dtype: str):
    """A model with an adapter on every ``Linear``, and the same model without adapters."""
    options = {"tie_output": False, "dtype": dtype, **OPTIONS["pre-norm learned"]}
    model, inputs = model_and_inputs(family, 3, **options)
    plain, _ = model_and_inputs(family, 3, **options)
    assert adapt_linears(model, np.random.default_rng(4)) > 0
    return model.eval(), plain.eval(), inputs


# ------------------------------------------------------------- the adapter test
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_reports_the_adapted_models_own_log_probabilities(family, dtype, use_cache):
    model, plain, inputs = adapted(family, dtype)
    result = greedy(model, inputs, max_new_tokens=8, eos_id=None, use_cache=use_cache)
    for row, tokens, reported in zip(inputs, result.tokens, result.token_log_probs, strict=True):
        assert len(tokens) == 8
        np.testing.assert_allclose(
            reported, forward_log_probs(model, row, tokens), rtol=0, atol=TOLERANCE[dtype]
        )
        unadapted = forward_log_probs(plain, row, tokens)
        assert np.abs(reported - unadapted).max() > 0.1  # the adapter changed the model
        # and greedy followed the adapted model: each token is its forward pass's argmax
        np.testing.assert_array_equal(tokens, forward_logits(model, row, tokens).argmax(-1))


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_scores_with_the_adapted_models_own_log_probabilities(
    family, dtype, use_cache
):
    model, plain, inputs = adapted(family, dtype)
    result = beam_search(
        model,
        inputs[0],
        beam_size=3,
        max_new_tokens=6,
        eos_id=None,
        length_penalty=0.0,
        use_cache=use_cache,
    )
    assert len(result.hypotheses) == 3
    for h in result.hypotheses:
        own = forward_log_probs(model, inputs[0], h.tokens).astype(np.float64)
        assert h.log_prob == pytest.approx(own.sum(), abs=len(own) * TOLERANCE[dtype])
        unadapted = forward_log_probs(plain, inputs[0], h.tokens)
        assert np.abs(own - unadapted).max() > 0.1  # the adapter changed the model


# ------------------------------------------------- cached and uncached decoding
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["pre-norm learned", "post-norm sinusoidal", "llama"])
def test_greedy_gives_the_same_output_with_and_without_the_cache(family, name):
    model, inputs = model_and_inputs(family, 1, vocab=7, **OPTIONS[name])
    sharpen(model)
    on = greedy(model, inputs, max_new_tokens=12, use_cache=True)
    off = greedy(model, inputs, max_new_tokens=12, use_cache=False)
    for a, b in zip(on.tokens, off.tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(on.token_log_probs, off.token_log_probs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(on.finished, off.finished)


@pytest.mark.parametrize("family", FAMILIES)
def test_beams_are_the_same_with_and_without_the_cache(family):
    model, inputs = model_and_inputs(family, 3, vocab=7)
    beams = [
        beam_search(model, inputs[0], beam_size=3, max_new_tokens=8, use_cache=flag)
        for flag in (True, False)
    ]
    assert len(beams[0].hypotheses) == len(beams[1].hypotheses) == 3
    for a, b in zip(beams[0].hypotheses, beams[1].hypotheses, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert a.score == pytest.approx(b.score, abs=1e-12)
        assert a.finished == b.finished


# -------------------------------------------------------------------- greedy
def _exact_greedy(next_logits, prefix: tuple[int, ...], steps: int, eos: int | None):
    tokens, log_probs = [], []
    for _ in range(steps):
        log_p = log_softmax(next_logits(prefix))
        token = int(np.argmax(log_p))
        tokens.append(token)
        log_probs.append(log_p[token])
        prefix = (*prefix, token)
        if token == eos:
            break
    return tokens, log_probs


@pytest.mark.parametrize("seed", range(4))
def test_greedy_follows_the_most_likely_token_of_a_toy(seed):
    rng = np.random.default_rng(seed)
    next_logits = toys.mixing(rng, 6)
    prompts = rng.integers(0, 6, size=(4, 3))
    result = greedy(toys.ToyLM(next_logits, 6), prompts, max_new_tokens=9, eos_id=EOS)
    for i, prompt in enumerate(prompts):
        tokens, log_probs = _exact_greedy(next_logits, tuple(int(t) for t in prompt), 9, EOS)
        np.testing.assert_array_equal(result.tokens[i], tokens)
        np.testing.assert_allclose(result.token_log_probs[i], log_probs, rtol=0, atol=1e-12)
        assert result.finished[i] == (tokens[-1] == EOS)
        assert result.log_prob[i] == pytest.approx(sum(log_probs), abs=1e-12)


def test_greedy_with_an_encoder_decoder_toy_starts_from_bos():
    next_logits = toys.mixing(np.random.default_rng(4), 7)
    sources = np.array([[3, 4, 5], [6, 6, 1]])
    result = greedy(toys.ToyEncoderDecoder(next_logits, 7), sources, max_new_tokens=6, bos_id=1)
    for i, source in enumerate(sources):
        start = (*(int(s) for s in source), -1, 1)
        tokens, _ = _exact_greedy(next_logits, start, 6, EOS)
        np.testing.assert_array_equal(result.tokens[i], tokens)


def test_greedy_stops_each_row_at_eos_and_keeps_it():
    table = np.full((5, 5), -5.0)
    table[3, 4] = table[4, 2] = table[2, 2] = 5.0  # 3 -> 4 -> EOS
    table[0, 0] = 5.0  # 0 -> 0 -> 0 ... never ends
    model = toys.ToyLM(toys.bigram(table), 5)
    result = greedy(model, np.array([[3], [0]]), max_new_tokens=6, eos_id=2)
    np.testing.assert_array_equal(result.tokens[0], [4, 2])
    np.testing.assert_array_equal(result.tokens[1], [0] * 6)
    np.testing.assert_array_equal(result.finished, [True, False])
    everything = greedy(model, np.array([[3], [3]]), max_new_tokens=6, eos_id=2)
    assert model.step_calls == 6 + 2  # the batch of two finished rows stopped after 2 steps
    assert all(len(t) == 2 for t in everything.tokens)
    no_eos = greedy(model, np.array([3]), max_new_tokens=4, eos_id=None)
    np.testing.assert_array_equal(no_eos.tokens[0], [4, 2, 2, 2])


def test_float32_models_decode_in_float32():
    model = model_and_inputs("decoder-only", 0, dtype="float32")[0]
    result = greedy(model, np.array([4, 5, 6]), max_new_tokens=5, eos_id=None)
    assert result.token_log_probs[0].dtype == np.float32


# ------------------------------------------------------------- beam search
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(3))
def test_beam_of_one_is_greedy(family, seed):
    model, inputs = model_and_inputs(family, seed, vocab=6)
    sharpen(model, 3.0)
    for row in inputs:
        expected = greedy(model, row, max_new_tokens=10)
        got = beam_search(model, row, beam_size=1, max_new_tokens=10, length_penalty=0.0).best
        np.testing.assert_array_equal(got.tokens, expected.tokens[0])
        assert got.log_prob == pytest.approx(expected.log_prob[0], abs=1e-10)
        assert got.finished == expected.finished[0]


def _all_outputs(vocab: int, max_new: int, eos: int):
    """Every possible output: ends with EOS (length <= max_new), or max_new non-EOS tokens."""
    others = [v for v in range(vocab) if v != eos]
    for length in range(max_new):
        for body in itertools.product(others, repeat=length):
            yield (*body, eos)
    yield from itertools.product(others, repeat=max_new)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", range(3))
def test_a_beam_as_wide_as_every_prefix_finds_the_exact_best_output(alpha, seed):
    vocab, max_new = 4, 3
    rng = np.random.default_rng(seed)
    next_logits = toys.mixing(rng, vocab, scale=1.5)
    prompt = (int(rng.integers(vocab)),)
    best_score, best_tokens = -np.inf, None
    for tokens in _all_outputs(vocab, max_new, EOS):
        log_p, prefix = 0.0, prompt
        for t in tokens:
            log_p += log_softmax(next_logits(prefix))[t]
            prefix = (*prefix, t)
        score = log_p / length_normalizer(len(tokens), alpha)
        if score > best_score:
            best_score, best_tokens = score, tokens
    result = beam_search(
        toys.ToyLM(next_logits, vocab),
        np.array(prompt),
        beam_size=(vocab - 1) ** max_new,
        max_new_tokens=max_new,
        length_penalty=alpha,
        eos_id=EOS,
    )
    np.testing.assert_array_equal(result.best.tokens, best_tokens)
    assert result.best.score == pytest.approx(best_score, abs=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_best_beam_is_never_below_greedy_on_random_models(family):
    # Not a theorem (the next test builds a counterexample), but on random small models
    # a search that keeps more hypotheses finds outputs at least as likely as greedy's.
    for seed in range(8):
        model, inputs = model_and_inputs(family, seed, vocab=6)
        sharpen(model, 3.0)
        row = inputs[0]
        g = greedy(model, row, max_new_tokens=8).log_prob[0]
        for beam_size in (2, 4):
            best = beam_search(
                model, row, beam_size=beam_size, max_new_tokens=8, length_penalty=0.0
            ).best
            assert best.log_prob >= g - 1e-12, (seed, beam_size)


def test_beams_can_lose_to_greedy_beam_search_is_a_heuristic():
    # Greedy takes A (0.40) and then a sure continuation; a beam of two prefers B (0.35)
    # because B's continuations are likelier for one step, and then pays for it.
    vocab, a, b, x, y = 8, 3, 4, 5, 6

    def next_logits(prefix):
        p = np.full(vocab, 1e-9)
        if len(prefix) == 1:
            p[[a, b, 7]] = [0.40, 0.35, 0.25]
        elif prefix[1] == a and len(prefix) == 2:
            p[[x, y, 7, 0, 1]] = 0.2  # five ways on, then certainty
        elif prefix[1] == b and len(prefix) == 2:
            p[[x, y]] = 0.5  # 0.175 each beats 0.08, but after them everything is flat
        elif prefix[1] == a:
            p[EOS] = 1.0
        else:
            p[[0, 1, 5, 6, 7, EOS]] = 1 / 6
        return np.log(p / p.sum())

    model = toys.ToyLM(next_logits, vocab)
    g = greedy(model, np.array([0]), max_new_tokens=3, eos_id=EOS)
    best = beam_search(model, np.array([0]), beam_size=2, max_new_tokens=3, length_penalty=0.0)
    assert best.best.log_prob < g.log_prob[0] - 0.5


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_hypotheses_are_consistent_and_handle_eos(alpha):
    vocab = 5
    next_logits = toys.mixing(np.random.default_rng(11), vocab, scale=1.0)
    model = toys.ToyLM(next_logits, vocab)
    result = beam_search(
        model, np.array([1, 3]), beam_size=4, max_new_tokens=6, length_penalty=alpha, eos_id=EOS
    )
    assert 1 <= len(result.hypotheses) <= 4
    assert any(h.finished for h in result.hypotheses)
    scores = [h.score for h in result.hypotheses]
    assert scores == sorted(scores, reverse=True)
    for h in result.hypotheses:
        body = h.tokens[:-1] if h.finished else h.tokens
        assert EOS not in body
        assert (h.tokens[-1] == EOS) == h.finished
        if not h.finished:
            assert len(h.tokens) == 6
        log_p, prefix = 0.0, (1, 3)
        for t in h.tokens:
            log_p += log_softmax(next_logits(prefix))[t]
            prefix = (*prefix, int(t))
        assert h.log_prob == pytest.approx(log_p, abs=1e-12)
        assert h.score == pytest.approx(log_p / length_normalizer(len(h.tokens), alpha), abs=1e-12)
    none = beam_search(model, np.array([1, 3]), beam_size=3, max_new_tokens=4, eos_id=None)
    assert not any(h.finished for h in none.hypotheses)
    assert all(len(h.tokens) == 4 for h in none.hypotheses)


def test_beam_search_stops_when_no_live_beam_can_win():
    table = np.full((5, 5), -8.0)
    table[:, EOS] = 0.0  # EOS is the most likely token at once (p = 0.73)
    table[:, 4] = -1.0
    model = toys.ToyLM(toys.bigram(table), 5)
    search = partial(beam_search, model, np.array([3]), beam_size=2, max_new_tokens=10, eos_id=EOS)
    result = search(length_penalty=0.0)
    np.testing.assert_array_equal(result.best.tokens, [EOS])
    assert result.steps == 1
    # with a length penalty, longer hypotheses might still win, so the search goes on
    longer = search(length_penalty=3.0)
    assert longer.steps > 1


def test_length_normalizer_is_gnmt():
    assert length_normalizer(1, 0.6) == 1.0
    assert length_normalizer(7, 0.5) == pytest.approx(np.sqrt(2.0), rel=1e-15)
    assert length_normalizer(13, 0.0) == 1.0
    assert length_normalizer(4, 1.0) == 1.5


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"beam_size": 0}, ValueError, "beam_size"),
        ({"beam_size": 1.5}, TypeError, "beam_size"),
        ({"length_penalty": -1}, ValueError, "length_penalty"),
        ({"length_penalty": float("nan")}, ValueError, "length_penalty"),
        ({"length_penalty": "0.6"}, TypeError, "length_penalty"),
    ],
)
def test_bad_beam_options_fail_clearly_before_any_work(options, error, words):
    model = toys.ToyLM(lambda p: np.zeros(6), 6, 8)
    with pytest.raises(error, match=words):
        beam_search(model, np.ones(2, dtype=int), max_new_tokens=2, **{"beam_size": 2, **options})
    with pytest.raises(ValueError, match="one input at a time"):
        beam_search(model, np.ones((2, 2), dtype=int), beam_size=2, max_new_tokens=2)
    with pytest.raises(TypeError, match="start"):
        greedy("model", np.ones(2, dtype=int), max_new_tokens=2)
    assert model.start_calls == model.step_calls == 0
