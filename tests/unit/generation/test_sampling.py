"""Ancestral sampling: the processed distribution, drawn from; the model's own probabilities.

Frequencies are checked against the exact distribution of a toy model with a
chi-square test (false-alarm rate 1e-4, and the test must reject the unprocessed
distribution, so it has the power to see a mistake).
"""

from __future__ import annotations

import numpy as np
import pytest
import toy_decoders as toys
from small_models import OPTIONS, adapt_linears, forward_log_probs, model_and_inputs

from tinyformer.generation import greedy, probabilities, sample

FAMILIES = ["decoder-only", "encoder-decoder"]
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


# ------------------------------------------------------------- the adapter test
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_reports_the_adapted_models_own_log_probabilities(family, dtype):
    options = {"tie_output": False, "dtype": dtype, **OPTIONS["pre-norm learned"]}
    model, inputs = model_and_inputs(family, 5, **options)
    plain, _ = model_and_inputs(family, 5, **options)
    assert adapt_linears(model, np.random.default_rng(6)) > 0
    runs = [
        sample(
            model,
            inputs,
            rng=np.random.default_rng(7),
            max_new_tokens=8,
            eos_id=None,
            temperature=0.8,
            top_k=6,
            use_cache=flag,
        )
        for flag in (True, False)
    ]
    for cached, uncached in zip(runs[0].tokens, runs[1].tokens, strict=True):
        np.testing.assert_array_equal(cached, uncached)  # the same draws, the same tokens
    for result in runs:
        for row, tokens, reported in zip(
            inputs, result.tokens, result.token_log_probs, strict=True
        ):
            own = forward_log_probs(model, row, tokens)  # the unprocessed model's
            np.testing.assert_allclose(reported, own, rtol=0, atol=TOLERANCE[dtype])
            assert np.abs(reported - forward_log_probs(plain, row, tokens)).max() > 0.1


# --------------------------------------------------------- limits of sampling
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiny_temperature_top_k_one_and_tiny_top_p_reproduce_greedy(family, seed):
    model, inputs = model_and_inputs(family, seed, vocab=7)
    expected = greedy(model, inputs, max_new_tokens=10)
    for options in ({"temperature": 1e-6}, {"temperature": 1e-308}, {"top_k": 1}, {"top_p": 1e-9}):
        got = sample(model, inputs, rng=np.random.default_rng(seed), max_new_tokens=10, **options)
        assert got == expected, options  # the same tokens and log-probabilities, to the bit


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


def test_the_chi_square_quantiles_of_the_tests_match_tables():
    # chi-square quantiles from standard tables: (dof, upper tail, value)
    for dof, tail, value in [(10, 0.05, 18.307), (4, 0.01, 13.277), (24, 0.001, 51.179)]:
        assert toys.chi_square_critical(dof, tail) == pytest.approx(value, rel=0.01)


# ------------------------------------------------------------------ the generator
@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_samples_and_different_seeds_differ(family):
    model, inputs = model_and_inputs(family, 5)
    runs = [
        sample(model, inputs, rng=np.random.default_rng(s), max_new_tokens=12, eos_id=None)
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1]
    assert any(
        not np.array_equal(a, b) for a, b in zip(runs[0].tokens, runs[2].tokens, strict=True)
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["pre-norm learned", "llama"])
def test_samples_are_the_same_with_and_without_the_cache(family, name):
    model, inputs = model_and_inputs(family, 3, vocab=7, **OPTIONS[name])
    options = {"max_new_tokens": 10, "temperature": 1.3, "top_k": 5}
    on = sample(model, inputs, rng=np.random.default_rng(9), use_cache=True, **options)
    off = sample(model, inputs, rng=np.random.default_rng(9), use_cache=False, **options)
    for a, b in zip(on.tokens, off.tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(on.token_log_probs, off.token_log_probs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_float32_models_sample_in_float32():
    model = model_and_inputs("decoder-only", 0, dtype="float32")[0]
    result = sample(model, np.array([4, 5]), rng=np.random.default_rng(0), max_new_tokens=3)
    assert result.token_log_probs[0].dtype == np.float32


# ------------------------------------------------------------------ bad options
@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"rng": 42}, TypeError, "Generator"),
        ({"rng": np.random.RandomState(0)}, TypeError, "Generator"),
        ({"temperature": 0}, ValueError, "greedy"),
        ({"top_k": 7}, ValueError, "top_k"),
        ({"top_p": 0}, ValueError, "top_p"),
    ],
)
def test_bad_options_fail_clearly_before_any_work(options, error, words):
    model = toys.ToyLM(lambda p: np.zeros(6), 6, 8)
    options = {"rng": np.random.default_rng(0), "max_new_tokens": 2, **options}
    with pytest.raises(error, match=words):
        sample(model, np.ones(2, dtype=int), **options)
    assert model.start_calls == model.step_calls == 0
