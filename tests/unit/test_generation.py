"""Tests of greedy search, beam search and sampling, on toy models and on both real families."""

from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import pytest
import toy_decoders as toys
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.functional import log_softmax
from tinyformer.generation import (
    IncrementalDecoder,
    beam_search,
    greedy,
    is_encoder_decoder,
    length_normalizer,
    probabilities,
    sample,
)
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
)

EOS = 2


# ----------------------------------------------------------------- model makers
def small_lm(seed: int, vocab: int = 11, context: int = 24, **options) -> DecoderOnlyLM:
    config = DecoderOnlyConfig(
        vocab_size=vocab,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=2,
        context_length=context,
        **options,
    )
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed))


def small_ed(seed: int, vocab: int = 11, context: int = 24, **options) -> EncoderDecoder:
    config = EncoderDecoderConfig(
        src_vocab_size=9,
        tgt_vocab_size=vocab,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=2,
        context_length=context,
        **options,
    )
    return EncoderDecoder(config, rng=np.random.default_rng(seed))


def sharpen(model, factor: float = 6.0):
    """Scale the output layer so that random models have peaked, varied distributions."""
    for name, p in model.named_parameters():
        if "embedding" in name or "output" in name:
            p.value *= factor
    return model


def model_and_inputs(family: str, seed: int, vocab: int = 11, context: int = 24):
    rng = np.random.default_rng(seed + 1000)
    if family == "decoder-only":
        return small_lm(seed, vocab, context), rng.integers(3, vocab, size=(3, 4))
    return small_ed(seed, vocab, context), rng.integers(1, 9, size=(3, 5))


FAMILIES = ["decoder-only", "encoder-decoder"]
MODELS = {family: model_and_inputs(family, 7) for family in FAMILIES}


def _equal_tokens(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- the family
def test_families_are_recognized():
    assert not is_encoder_decoder(small_lm(0))
    assert is_encoder_decoder(small_ed(0))
    assert not is_encoder_decoder(toys.ToyLM(lambda p: np.zeros(3), 3))
    assert is_encoder_decoder(toys.ToyEncoderDecoder(lambda p: np.zeros(3), 3))
    with pytest.raises(TypeError, match="start"):
        is_encoder_decoder(object())


# ------------------------------------------------- cached and uncached decoding
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_cached_logits_equal_full_recomputation_at_every_step(family, seed):
    model, inputs = model_and_inputs(family, seed)
    kwargs = {"source_ids": inputs} if family == "encoder-decoder" else {"batch_size": 3}
    cached = IncrementalDecoder(model, use_cache=True, **kwargs)
    full = IncrementalDecoder(model, use_cache=False, **kwargs)
    first = inputs if family == "decoder-only" else np.full((3, 1), 1)
    rng = np.random.default_rng(seed)
    feeds = [first] + [rng.integers(3, 11, size=(3, n)) for n in (1, 1, 3, 1)]
    for tokens in feeds:
        np.testing.assert_allclose(cached.feed(tokens), full.feed(tokens), rtol=0, atol=1e-10)
    for decoder in (cached, full):  # beams reordered, then speculative tokens forgotten
        decoder.reorder(np.array([2, 0, 0]))
        decoder.truncate(decoder.length - 2)
    assert cached.length == full.length
    np.testing.assert_array_equal(cached.prefix, full.prefix)
    for n in (2, 1):
        tokens = rng.integers(3, 11, size=(3, n))
        np.testing.assert_allclose(cached.feed(tokens), full.feed(tokens), rtol=0, atol=1e-10)


_operations = st.lists(
    st.one_of(
        st.tuples(st.just("feed"), st.integers(1, 3)),
        st.tuples(st.just("reorder"), st.lists(st.integers(0, 2), min_size=3, max_size=3)),
        st.tuples(st.just("truncate"), st.integers(0, 3)),
    ),
    max_size=6,
)


@given(family=st.sampled_from(FAMILIES), operations=_operations, seed=st.integers(0, 3))
def test_any_sequence_of_feeds_reorders_and_rollbacks_matches_recomputation(
    family, operations, seed
):
    model, inputs = MODELS[family]
    kwargs = {"source_ids": inputs} if family == "encoder-decoder" else {"batch_size": 3}
    decoders = [IncrementalDecoder(model, use_cache=flag, **kwargs) for flag in (True, False)]
    rng = np.random.default_rng(seed)
    for name, argument in [("feed", 2), *operations, ("feed", 1)]:
        if name == "truncate":
            for d in decoders:
                d.truncate(max(0, d.length - argument))
        elif name == "reorder":
            for d in decoders:
                d.reorder(np.array(argument))
        else:
            tokens = rng.integers(3, 11, size=(3, argument))
            cached, full = (d.feed(tokens) for d in decoders)
            np.testing.assert_allclose(cached, full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_gives_the_same_tokens_with_and_without_the_cache(family, seed):
    model, inputs = model_and_inputs(family, seed, vocab=7)
    sharpen(model)
    on = greedy(model, inputs, max_new_tokens=12, use_cache=True)
    off = greedy(model, inputs, max_new_tokens=12, use_cache=False)
    assert _equal_tokens(on.tokens, off.tokens)
    for a, b in zip(on.token_log_probs, off.token_log_probs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(on.finished, off.finished)


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_and_beams_are_the_same_with_and_without_the_cache(family):
    model, inputs = model_and_inputs(family, 3, vocab=7)
    options = {"max_new_tokens": 10, "temperature": 1.3, "top_k": 5}
    on = sample(model, inputs, rng=np.random.default_rng(9), use_cache=True, **options)
    off = sample(model, inputs, rng=np.random.default_rng(9), use_cache=False, **options)
    assert _equal_tokens(on.tokens, off.tokens)
    beams = [
        beam_search(model, inputs[0], beam_size=3, max_new_tokens=8, use_cache=flag)
        for flag in (True, False)
    ]
    assert _equal_tokens(
        [h.tokens for h in beams[0].hypotheses], [h.tokens for h in beams[1].hypotheses]
    )
    np.testing.assert_allclose(
        [h.score for h in beams[0].hypotheses], [h.score for h in beams[1].hypotheses], atol=1e-10
    )


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
        np.testing.assert_allclose(result.token_log_probs[i], log_probs, atol=1e-12)
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


# ------------------------------------------------------------- beam search
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(5))
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
    for length in range(max_new + 1):
        for body in itertools.product(others, repeat=length):
            yield (*body, eos), True
    yield from ((body, False) for body in itertools.product(others, repeat=max_new))


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", range(3))
def test_a_beam_as_wide_as_every_prefix_finds_the_exact_best_output(alpha, seed):
    vocab, max_new = 4, 3
    rng = np.random.default_rng(seed)
    next_logits = toys.mixing(rng, vocab, scale=1.5)
    prompt = (int(rng.integers(vocab)),)
    best_score, best_tokens = -np.inf, None
    for tokens, _ in _all_outputs(vocab, max_new, EOS):
        if len(tokens) > max_new:
            continue
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
    for seed in range(12):
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
        assert h.score == pytest.approx(log_p / length_normalizer(len(h.tokens), alpha))
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
    assert length_normalizer(7, 0.5) == pytest.approx(np.sqrt(2.0))
    assert length_normalizer(13, 0.0) == 1.0


# --------------------------------------------------------- limits of sampling
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiny_temperature_top_k_one_and_tiny_top_p_reproduce_greedy(family, seed):
    model, inputs = model_and_inputs(family, seed, vocab=7)
    expected = greedy(model, inputs, max_new_tokens=10)
    for options in ({"temperature": 1e-6}, {"top_k": 1}, {"top_p": 1e-9}):
        got = sample(model, inputs, rng=np.random.default_rng(seed), max_new_tokens=10, **options)
        assert _equal_tokens(got.tokens, expected.tokens), options
        for a, b in zip(got.token_log_probs, expected.token_log_probs, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-12)


# ---------------------------------------------------- sampled distributions
SETTINGS = [
    {},
    {"temperature": 0.6},
    {"temperature": 2.0},
    {"top_k": 3},
    {"top_p": 0.7},
    {"temperature": 1.5, "top_k": 5, "top_p": 0.8},
]


@pytest.mark.parametrize("options", SETTINGS)
def test_sampled_frequencies_match_the_processed_distribution(options):
    vocab, draws, last = 8, 20_000, 5
    table = np.random.default_rng(7).standard_normal((vocab, vocab)) * 1.5
    model = toys.ToyLM(toys.bigram(table), vocab)
    prompts = np.full((draws, 1), last)
    result = sample(
        model, prompts, rng=np.random.default_rng(8), max_new_tokens=1, eos_id=None, **options
    )
    counts = np.bincount(np.concatenate(result.tokens), minlength=vocab)
    expected = probabilities(table[last], **options)
    statistic, dof = toys.chi_square(counts, expected)  # also: no token outside the set
    assert statistic < toys.chi_square_critical(dof)
    if options:  # power: the plain softmax is rejected
        plain, dof_plain = toys.chi_square(counts, probabilities(table[last]))
        assert plain > toys.chi_square_critical(dof_plain)


def test_sampled_pairs_follow_the_chain():
    vocab, draws = 5, 20_000
    table = np.random.default_rng(12).standard_normal((vocab, vocab))
    model = toys.ToyLM(toys.bigram(table), vocab)
    result = sample(
        model,
        np.full((draws, 2), 4),
        rng=np.random.default_rng(13),
        max_new_tokens=2,
        eos_id=None,
        temperature=0.8,
    )
    pairs = np.stack(result.tokens)
    counts = np.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab)
    p = probabilities(table, temperature=0.8)  # (V, V): row = previous token
    joint = p[4][:, None] * p  # P(x1, x2)
    statistic, dof = toys.chi_square(counts, joint)
    assert statistic < toys.chi_square_critical(dof)
    independent = p[4][:, None] * p[4][None, :]  # the second token ignoring the first
    wrong, _ = toys.chi_square(counts, independent)
    assert wrong > toys.chi_square_critical(dof)


def test_wilson_hilferty_quantiles_match_tables():
    # chi-square quantiles from standard tables: (dof, upper tail, value)
    for dof, tail, value in [(10, 0.05, 18.307), (4, 0.01, 13.277), (24, 0.001, 51.179)]:
        assert toys.chi_square_critical(dof, tail) == pytest.approx(value, rel=0.01)


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_samples_and_different_seeds_differ(family):
    model, inputs = model_and_inputs(family, 5)
    runs = [
        sample(model, inputs, rng=np.random.default_rng(s), max_new_tokens=12, eos_id=None)
        for s in (1, 1, 2)
    ]
    assert _equal_tokens(runs[0].tokens, runs[1].tokens)
    assert not _equal_tokens(runs[0].tokens, runs[2].tokens)


def test_float32_models_decode():
    model = small_lm(0, dtype="float32")
    result = greedy(model, np.array([4, 5, 6]), max_new_tokens=5, eos_id=None)
    assert result.token_log_probs[0].dtype == np.float32
    same = sample(model, np.array([4, 5]), rng=np.random.default_rng(0), max_new_tokens=3)
    assert same.token_log_probs[0].dtype == np.float32


# ------------------------------------------------------------------ bad input
def _counting_toy(family: str, vocab: int = 6, context: int = 8):
    cls = toys.ToyLM if family == "decoder-only" else toys.ToyEncoderDecoder
    return cls(lambda p: np.zeros(vocab), vocab, context)


BAD = [
    # (family, inputs, options, error, words)
    ("decoder-only", np.array([], dtype=int), {}, ValueError, "prompt"),
    ("decoder-only", np.zeros((1, 0), dtype=int), {}, ValueError, "prompt"),
    ("decoder-only", np.zeros((1, 2, 3), dtype=int), {}, ValueError, "prompt"),
    ("decoder-only", np.array([1.0, 2.0]), {}, TypeError, "prompt"),
    ("decoder-only", np.array([1, 6]), {}, ValueError, "vocabulary size 6"),
    ("decoder-only", np.array([-1, 2]), {}, ValueError, "prompt"),
    ("decoder-only", np.ones(9, dtype=int), {"overflow": "error"}, ValueError, "context length 8"),
    (
        "decoder-only",
        np.ones(5, dtype=int),
        {"max_new_tokens": 4, "overflow": "error"},
        ValueError,
        "at most 3",
    ),
    ("decoder-only", np.ones(5, dtype=int), {"overflow": "clip"}, ValueError, "overflow must be"),
    ("decoder-only", np.ones(2, dtype=int), {"max_new_tokens": 0}, ValueError, "max_new_tokens"),
    ("decoder-only", np.ones(2, dtype=int), {"max_new_tokens": 2.0}, TypeError, "max_new_tokens"),
    ("decoder-only", np.ones(2, dtype=int), {"max_new_tokens": True}, TypeError, "max_new_tokens"),
    ("decoder-only", np.ones(2, dtype=int), {"eos_id": 6}, ValueError, "eos_id"),
    ("decoder-only", np.ones(2, dtype=int), {"eos_id": "2"}, TypeError, "eos_id"),
    ("decoder-only", np.ones(2, dtype=int), {"use_cache": 1}, TypeError, "use_cache"),
    ("encoder-decoder", np.ones(9, dtype=int), {}, ValueError, "context_length 8"),
    (
        "encoder-decoder",
        np.ones(3, dtype=int),
        {"max_new_tokens": 9},
        ValueError,
        "context_length 8",
    ),
    ("encoder-decoder", np.ones(3, dtype=int), {"bos_id": 6}, ValueError, "bos_id"),
    ("encoder-decoder", np.ones(3, dtype=int), {"bos_id": None}, TypeError, "bos_id"),
    ("encoder-decoder", np.zeros(0, dtype=int), {}, ValueError, "source"),
]


@pytest.mark.parametrize(("family", "inputs", "options", "error", "words"), BAD)
@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
def test_bad_inputs_fail_clearly_before_any_work(family, inputs, options, error, words, method):
    model = _counting_toy(family)
    options = {"max_new_tokens": 2, **options}
    call = {
        "greedy": lambda: greedy(model, inputs, **options),
        "sample": lambda: sample(model, inputs, rng=np.random.default_rng(0), **options),
        "beam": lambda: beam_search(model, inputs, beam_size=2, **options),
    }[method]
    with pytest.raises(error, match=words):
        call()
    assert model.start_calls == 0
    assert model.step_calls == 0


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda m: beam_search(m, np.ones(2, dtype=int), beam_size=0, max_new_tokens=2),
            ValueError,
            "beam_size",
        ),
        (
            lambda m: beam_search(m, np.ones(2, dtype=int), beam_size=1.5, max_new_tokens=2),
            TypeError,
            "beam_size",
        ),
        (
            lambda m: beam_search(m, np.ones((2, 2), dtype=int), beam_size=2, max_new_tokens=2),
            ValueError,
            "one input at a time",
        ),
        (
            lambda m: beam_search(
                m, np.ones(2, dtype=int), beam_size=2, max_new_tokens=2, length_penalty=-1
            ),
            ValueError,
            "length_penalty",
        ),
        (
            lambda m: sample(m, np.ones(2, dtype=int), rng=42, max_new_tokens=2),
            TypeError,
            "Generator",
        ),
        (
            lambda m: sample(
                m, np.ones(2, dtype=int), rng=np.random.RandomState(0), max_new_tokens=2
            ),
            TypeError,
            "Generator",
        ),
        (
            lambda m: sample(
                m,
                np.ones(2, dtype=int),
                rng=np.random.default_rng(0),
                max_new_tokens=2,
                temperature=0,
            ),
            ValueError,
            "greedy",
        ),
        (
            lambda m: sample(
                m, np.ones(2, dtype=int), rng=np.random.default_rng(0), max_new_tokens=2, top_k=7
            ),
            ValueError,
            "top_k",
        ),
        (
            lambda m: sample(
                m, np.ones(2, dtype=int), rng=np.random.default_rng(0), max_new_tokens=2, top_p=0
            ),
            ValueError,
            "top_p",
        ),
        (lambda m: greedy("model", np.ones(2, dtype=int), max_new_tokens=2), TypeError, "start"),
    ],
)
def test_bad_options_fail_clearly_before_any_work(call, error, words):
    model = _counting_toy("decoder-only")
    with pytest.raises(error, match=words):
        call(model)
    assert model.start_calls == 0
    assert model.step_calls == 0


def test_real_models_refuse_long_prompts_by_name():
    with pytest.raises(ValueError, match="context length 24"):
        greedy(small_lm(0), np.ones(25, dtype=int) * 4, max_new_tokens=1, overflow="error")
    with pytest.raises(ValueError, match=r"max_new_tokens can be at most 4.*overflow='slide'"):
        sample(
            small_lm(0),
            np.ones(20, dtype=int) * 4,
            rng=np.random.default_rng(0),
            max_new_tokens=5,
            overflow="error",
        )
    with pytest.raises(ValueError, match="overflow must be one of 'slide', 'error'"):
        greedy(small_lm(0), np.ones(2, dtype=int) * 4, max_new_tokens=1, overflow="wrap")
    with pytest.raises(ValueError, match="vocabulary size 11"):
        greedy(small_lm(0), np.array([3, 11]), max_new_tokens=1)


# ------------------------------------------------------ past the context length
def _greedy_by_hand(model, prompt, n_new):
    """Greedy decoding written out: at every step, the full forward pass over the last window."""
    tokens = list(prompt)
    window = model.max_positions
    for _ in range(n_new):
        logits = model.forward(np.array([tokens[-window:]]))[0, -1]
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("prompt_length", [3, 24, 30])
def test_generation_slides_past_the_context_like_a_fresh_forward_pass(use_cache, prompt_length):
    model = small_lm(1).eval()  # context length 24
    prompt = np.random.default_rng(prompt_length).integers(3, 11, size=prompt_length)
    result = greedy(model, prompt, max_new_tokens=40, eos_id=None, use_cache=use_cache)
    np.testing.assert_array_equal(result.tokens[0], _greedy_by_hand(model, prompt, 40))


def test_sampling_and_beam_search_slide_too():
    model = small_lm(2).eval()
    prompt = np.array([[4, 5, 6], [7, 8, 9]])
    runs = [
        sample(model, prompt, rng=np.random.default_rng(5), max_new_tokens=50, use_cache=flag)
        for flag in (True, False)
    ]
    assert [len(t) for t in runs[0].tokens] == [50, 50]
    assert all(np.array_equal(a, b) for a, b in zip(runs[0].tokens, runs[1].tokens, strict=True))
    beams = [
        beam_search(model, prompt[0], beam_size=3, max_new_tokens=30, eos_id=None, use_cache=flag)
        for flag in (True, False)
    ]
    np.testing.assert_array_equal(beams[0].best.tokens, beams[1].best.tokens)
    assert len(beams[0].best.tokens) == 30
