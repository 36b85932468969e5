"""Tests of speculative decoding: exact greedy output, the target's distribution, statistics."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import toy_decoders as toys
from small_models import LLAMA, decoder_only, encoder_decoder

from tinyformer.generation import greedy, probabilities, speculative_decode
from tinyformer.models import DecoderOnlyLM, EncoderDecoder

log = logging.getLogger(__name__)


EOS = 2


def lm(
    seed: int, d_model: int = 16, n_layers: int = 2, vocab: int = 9, **options
) -> DecoderOnlyLM:
    return decoder_only(
        seed,
        vocab_size=vocab,
        d_model=d_model,
        n_heads=2,
        d_ff=2 * d_model,
        n_layers=n_layers,
        context_length=32,
        **options,
    )


def ed(
    seed: int, d_model: int = 16, n_layers: int = 2, vocab: int = 9, **options
) -> EncoderDecoder:
    return encoder_decoder(
        seed,
        src_vocab_size=8,
        tgt_vocab_size=vocab,
        d_model=d_model,
        n_heads=2,
        d_ff=2 * d_model,
        n_decoder_layers=n_layers,
        context_length=32,
        **options,
    )


def perturbed(model, seed: int, noise: float):
    """A draft that is the target with noisy weights: it agrees often, not always."""
    rng = np.random.default_rng(seed)
    copy = type(model)(model.config, rng=np.random.default_rng(0))
    copy.load_state_dict(
        {k: v + noise * rng.standard_normal(v.shape) for k, v in model.state_dict().items()}
    )
    return copy


def pairs(family: str, seed: int, **options):
    make = lm if family == "decoder-only" else ed
    target = make(seed, **options)
    for p in target.parameters():  # peaked distributions, so that EOS and repeats happen
        p.value *= 2.0
    rng = np.random.default_rng(seed + 50)
    inputs = rng.integers(3, 9, size=5) if family == "decoder-only" else rng.integers(1, 8, 4)
    drafts = {
        "itself": target,
        "noisy": perturbed(target, seed, 0.05),
        "unrelated": make(seed + 100, d_model=8, n_layers=1, **options),
    }
    return target, drafts, inputs


# --------------------------------------------------------------------- greedy
@pytest.mark.parametrize("family", ["decoder-only", "encoder-decoder"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_speculative_output_is_the_target_greedy_output(family, seed):
    target, drafts, inputs = pairs(family, seed)
    for eos_id in (None, EOS):
        expected = greedy(target, inputs, max_new_tokens=20, eos_id=eos_id)
        for name, draft in drafts.items():
            for n_draft in (1, 3, 6):
                got = speculative_decode(
                    target, draft, inputs, max_new_tokens=20, n_draft=n_draft, eos_id=eos_id
                )
                np.testing.assert_array_equal(got.tokens, expected.tokens[0], err_msg=name)
                assert got.finished == expected.finished[0]
                if name == "itself":
                    assert got.accepted == got.proposed


@pytest.mark.parametrize("family", ["decoder-only", "encoder-decoder"])
def test_greedy_speculative_output_with_rotary_positions_is_the_targets(family):
    """Rejected drafts are forgotten by truncation: rotary positions must restart where kept."""
    target, drafts, inputs = pairs(family, 3, **LLAMA)
    expected = greedy(target, inputs, max_new_tokens=20, eos_id=None)
    for name, draft in drafts.items():
        got = speculative_decode(target, draft, inputs, max_new_tokens=20, n_draft=4, eos_id=None)
        np.testing.assert_array_equal(got.tokens, expected.tokens[0], err_msg=name)
        if name == "unrelated":
            assert got.accepted < got.proposed  # some drafts were rejected and rolled back


def test_statistics_count_calls_and_tokens():
    rng = np.random.default_rng(3)
    target_logits, draft_logits = toys.mixing(rng, 6), toys.mixing(rng, 6)
    target, draft = toys.ToyLM(target_logits, 6), toys.ToyLM(draft_logits, 6)
    for n_draft in (1, 2, 4):
        target.step_calls = draft.step_calls = 0
        result = speculative_decode(
            target, draft, np.array([4, 1]), max_new_tokens=17, n_draft=n_draft, eos_id=None
        )
        assert len(result.tokens) == 17
        # each round adds its accepted proposals plus one token of the target's
        assert len(result.tokens) == result.accepted + result.target_calls
        assert result.target_calls == target.step_calls
        assert result.draft_calls == draft.step_calls == result.proposed
        assert 0 <= result.accepted <= result.proposed <= n_draft * result.target_calls
        assert result.kept_fraction == result.accepted / result.proposed


def test_a_perfect_draft_needs_one_target_call_per_round():
    target = lm(4)
    result = speculative_decode(
        target, target, np.array([3, 4]), max_new_tokens=20, n_draft=4, eos_id=None
    )
    assert result.kept_fraction == 1.0
    assert result.target_calls == 4  # 20 tokens in rounds of 4 accepted + 1 bonus
    sampled = speculative_decode(
        target,
        target,
        np.array([3, 4]),
        max_new_tokens=20,
        n_draft=4,
        eos_id=None,
        rng=np.random.default_rng(0),
    )
    assert sampled.kept_fraction == 1.0  # p == q: u * q < p always


def test_speculative_decoding_stops_at_eos():
    table = np.full((5, 5), -6.0)
    table[3, 4] = table[4, EOS] = table[EOS, 3] = 6.0  # 3 -> 4 -> EOS -> 3 ...
    model = toys.ToyLM(toys.bigram(table), 5)
    result = speculative_decode(
        model, model, np.array([3]), max_new_tokens=10, n_draft=4, eos_id=EOS
    )
    np.testing.assert_array_equal(result.tokens, [4, EOS])
    assert result.finished
    # a language model has no end token unless told: by default it runs to max_new_tokens
    default = speculative_decode(model, model, np.array([3]), max_new_tokens=10, n_draft=4)
    np.testing.assert_array_equal(default.tokens, [4, EOS, 3, 4, EOS, 3, 4, EOS, 3, 4])
    assert not default.finished


def test_cache_or_not_the_same_samples():
    target, drafts, inputs = pairs("decoder-only", 5)
    runs = [
        speculative_decode(
            target,
            drafts["noisy"],
            inputs,
            max_new_tokens=15,
            rng=np.random.default_rng(1),
            use_cache=flag,
        )
        for flag in (True, False)
    ]
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    assert runs[0].accepted == runs[1].accepted


def test_same_seed_same_output_different_seeds_differ():
    target, drafts, inputs = pairs("encoder-decoder", 6)

    def run(seed):
        return speculative_decode(
            target,
            drafts["noisy"],
            inputs,
            max_new_tokens=15,
            eos_id=None,
            temperature=1.5,
            rng=np.random.default_rng(seed),
        ).tokens

    np.testing.assert_array_equal(run(3), run(3))
    assert not np.array_equal(run(3), run(4))


# ------------------------------------------------------------- distribution
@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_speculative_decoding_keeps_the_target_distribution(temperature):
    vocab, runs, prompt = 5, 6000, 4
    rng = np.random.default_rng(21)
    target_table = 0.8 * rng.standard_normal((vocab, vocab))
    draft_table = target_table + 1.2 * rng.standard_normal((vocab, vocab))
    target = toys.ToyLM(toys.bigram(target_table), vocab)
    draft = toys.ToyLM(toys.bigram(draft_table), vocab)
    counts = np.zeros(vocab**3)
    accepted = proposed = 0
    draw = np.random.default_rng(22)
    for _ in range(runs):
        result = speculative_decode(
            target,
            draft,
            np.array([prompt]),
            max_new_tokens=3,
            n_draft=2,
            eos_id=None,
            temperature=temperature,
            rng=draw,
        )
        x1, x2, x3 = result.tokens
        counts[(x1 * vocab + x2) * vocab + x3] += 1
        accepted, proposed = accepted + result.accepted, proposed + result.proposed

    def joint(table):
        p = probabilities(table, temperature=temperature)  # (V, V), row = previous token
        return (p[prompt][:, None, None] * p[:, :, None] * p[None, :, :]).ravel()

    # cells with tiny expected counts are merged into one, so that chi-square applies
    target_joint, draft_joint = joint(target_table), joint(draft_table)
    small = target_joint * runs < 5
    cells = np.append(counts[~small], counts[small].sum())
    statistic, dof = toys.chi_square(
        cells, np.append(target_joint[~small], target_joint[small].sum())
    )
    against_draft, _ = toys.chi_square(
        cells, np.append(draft_joint[~small], draft_joint[small].sum())
    )
    rate = accepted / proposed
    log.info(
        "temperature %s: chi-square %.1f against the target, %.1f against the draft"
        " (critical %.1f, %d dof); acceptance rate %.3f",
        temperature,
        statistic,
        against_draft,
        toys.chi_square_critical(dof),
        dof,
        rate,
    )
    assert statistic < toys.chi_square_critical(dof)
    assert against_draft > toys.chi_square_critical(dof)  # the test can tell them apart
    assert 0.2 < rate < 0.95  # drafts were both accepted and rejected


# ------------------------------------------------------------------ bad input
def test_bad_inputs_are_refused_by_name():
    target = lm(0)
    inputs = np.array([3, 4])
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_decode(target, lm(1, vocab=10), inputs, max_new_tokens=3)
    with pytest.raises(TypeError, match="same family"):
        speculative_decode(target, ed(1), inputs, max_new_tokens=3)
    with pytest.raises(ValueError, match="n_draft"):
        speculative_decode(target, target, inputs, max_new_tokens=3, n_draft=0)
    with pytest.raises(TypeError, match="Generator"):
        speculative_decode(target, target, inputs, max_new_tokens=3, rng=7)
    with pytest.raises(ValueError, match="greedy"):
        speculative_decode(target, target, inputs, max_new_tokens=3, temperature=0.0)
    with pytest.raises(ValueError, match="one input at a time"):
        speculative_decode(target, target, np.ones((2, 2), dtype=int), max_new_tokens=3)
    with pytest.raises(ValueError, match="context length"):
        speculative_decode(target, target, inputs, max_new_tokens=31)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_decode(target, target, inputs, max_new_tokens=0)


def test_the_draft_must_fit_too():
    table = np.zeros((4, 4))
    target = toys.ToyLM(toys.bigram(table), 4, context_length=20)
    draft = toys.ToyLM(toys.bigram(table), 4, context_length=5)
    with pytest.raises(ValueError, match="context length 5"):
        speculative_decode(target, draft, np.array([1, 3]), max_new_tokens=6)
    assert target.start_calls == draft.start_calls == 0
