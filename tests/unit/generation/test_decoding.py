"""Step-by-step decoding, shared by every search: the incremental decoder, checks, results.

``IncrementalDecoder`` feeds tokens with the key/value cache or recomputes the whole
prefix; both give the same logits through any sequence of feeds, beam reorderings and
roll-backs. ``prepare`` checks every input before the model does any work, and every
search runs the model in evaluation mode and gives it back in its own.
"""

from __future__ import annotations

import numpy as np
import pytest
import toy_decoders as toys
from hypothesis import given, settings
from hypothesis import strategies as st
from small_models import GENERATION_SIZES, OPTIONS, decoder_only, encoder_decoder, model_and_inputs

from tinyformer.data.tokenizers import EOS_ID
from tinyformer.functional import log_softmax
from tinyformer.generation import (
    GenerationResult,
    IncrementalDecoder,
    beam_search,
    greedy,
    is_encoder_decoder,
    sample,
    speculative_decode,
)
from tinyformer.generation.decoding import chosen_log_probs, evaluation_mode

FAMILIES = ["decoder-only", "encoder-decoder"]
MODELS = {family: model_and_inputs(family, 7) for family in FAMILIES}
PROMPT = np.array([[3, 4, 5], [6, 7, 8]])


def _decoders(model, inputs, family):
    kwargs = {"source_ids": inputs} if family == "encoder-decoder" else {"batch_size": 3}
    return [IncrementalDecoder(model, use_cache=flag, **kwargs) for flag in (True, False)]


# ---------------------------------------------------------------- the family
def test_families_are_recognized():
    assert not is_encoder_decoder(MODELS["decoder-only"][0])
    assert is_encoder_decoder(MODELS["encoder-decoder"][0])
    assert not is_encoder_decoder(toys.ToyLM(lambda p: np.zeros(3), 3))
    assert is_encoder_decoder(toys.ToyEncoderDecoder(lambda p: np.zeros(3), 3))
    with pytest.raises(TypeError, match="start"):
        is_encoder_decoder(object())

    class Unnamed(toys.ToyLM):
        family = "encoder-only"

    with pytest.raises(TypeError, match=r"model\.family must be 'decoder-only' or"):
        is_encoder_decoder(Unnamed(lambda p: np.zeros(3), 3))


# ------------------------------------------------- cached and uncached decoding
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["pre-norm learned", "llama", "post-norm llama, unscaled"])
def test_cached_logits_match_full_recomputation_at_every_step(family, name):
    model, inputs = model_and_inputs(family, 0, **OPTIONS[name])
    cached, full = _decoders(model, inputs, family)
    first = inputs if family == "decoder-only" else np.full((3, 1), 1)
    rng = np.random.default_rng(1)
    feeds = [first] + [rng.integers(3, 11, size=(3, n)) for n in (1, 1, 3, 1)]
    for tokens in feeds:
        np.testing.assert_allclose(cached.feed(tokens), full.feed(tokens), rtol=0, atol=1e-12)
    for decoder in (cached, full):  # beams reordered, then speculative tokens forgotten
        decoder.reorder(np.array([2, 0, 0]))
        decoder.truncate(decoder.length - 2)
    assert cached.length == full.length
    np.testing.assert_array_equal(cached.prefix, full.prefix)
    for n in (2, 1):
        tokens = rng.integers(3, 11, size=(3, n))
        np.testing.assert_allclose(cached.feed(tokens), full.feed(tokens), rtol=0, atol=1e-12)


_operations = st.lists(
    st.one_of(
        st.tuples(st.just("feed"), st.integers(1, 3)),
        st.tuples(st.just("reorder"), st.lists(st.integers(0, 2), min_size=3, max_size=3)),
        st.tuples(st.just("truncate"), st.integers(0, 3)),
    ),
    max_size=6,
)


@settings(max_examples=40)
@given(family=st.sampled_from(FAMILIES), operations=_operations, seed=st.integers(0, 3))
def test_any_sequence_of_feeds_reorders_and_rollbacks_matches_recomputation(
    family, operations, seed
):
    model, inputs = MODELS[family]
    decoders = _decoders(model, inputs, family)
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
            np.testing.assert_allclose(cached, full, rtol=0, atol=1e-12)
    assert decoders[0].length == decoders[1].length
    np.testing.assert_array_equal(decoders[0].prefix, decoders[1].prefix)


def test_the_prefix_buffer_grows_rolls_back_and_reorders():
    model = decoder_only(3, vocab_size=13, context_length=96, **GENERATION_SIZES)
    decoder = IncrementalDecoder(model, batch_size=2)
    rng = np.random.default_rng(4)
    fed = [rng.integers(0, 13, (2, 30))] + [rng.integers(0, 13, (2, 1)) for _ in range(50)]
    for tokens in fed:
        decoder.feed(tokens)
    everything = np.concatenate(fed, axis=1)
    np.testing.assert_array_equal(decoder.prefix, everything)  # past the first 64 columns
    assert decoder.length == 80
    assert decoder.prefix.dtype == np.int64
    decoder.truncate(75)
    decoder.feed(np.array([[5], [6]]))
    np.testing.assert_array_equal(decoder.prefix[:, :75], everything[:, :75])
    np.testing.assert_array_equal(decoder.prefix[:, 75], [5, 6])
    decoder.reorder(np.array([1, 1, 0]))
    assert decoder.batch_size == 3
    assert decoder.length == 76
    np.testing.assert_array_equal(decoder.prefix[0], decoder.prefix[1])
    with pytest.raises(ValueError, match="tokens must have shape"):
        decoder.feed(np.array([[1], [2]]))  # 2 rows, the decoder has 3 now
    assert decoder.length == 76  # a refused feed changes nothing


def test_the_incremental_decoder_checks_its_arguments():
    lm, ed = MODELS["decoder-only"][0], MODELS["encoder-decoder"][0]
    with pytest.raises(TypeError, match="use_cache must be True or False"):
        IncrementalDecoder(lm, use_cache=1)
    with pytest.raises(TypeError, match="slide must be True or False"):
        IncrementalDecoder(lm, slide="yes")
    with pytest.raises(ValueError, match="slide is for decoder-only models"):
        IncrementalDecoder(ed, source_ids=np.ones((1, 2), dtype=int), slide=True)
    with pytest.raises(ValueError, match="source_ids are required"):
        IncrementalDecoder(ed)
    with pytest.raises(ValueError, match="source_ids must be None for a decoder-only model"):
        IncrementalDecoder(lm, source_ids=np.ones((1, 2), dtype=int))
    decoder = IncrementalDecoder(lm, batch_size=1)
    decoder.feed(np.array([[3, 4]]))
    with pytest.raises(ValueError, match="length must be at most the current length 2, got 3"):
        decoder.truncate(3)


# ------------------------------------------------------- chosen log-probabilities
@settings(max_examples=60)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 40),
    scale=st.floats(1e-3, 300.0),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_chosen_log_probs_are_log_softmax_entries_bit_for_bit(rows, vocab, scale, dtype, seed):
    rng = np.random.default_rng(seed)
    logits = (scale * rng.standard_normal((rows, vocab))).astype(dtype)
    if vocab > 2:
        logits[0, 1] = -np.inf  # a masked entry is allowed
    chosen = rng.integers(0, vocab, rows)
    chosen[0] = np.argmax(logits[0])
    expected = np.take_along_axis(log_softmax(logits), chosen[:, None], axis=1)[:, 0]
    got = chosen_log_probs(logits, chosen)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_chosen_log_probs_of_bad_logits_fail_as_log_softmax_does(bad):
    logits = np.array([[0.0, 1.0], [bad, 0.0]])
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        chosen_log_probs(logits, np.array([1, 1]))
    with pytest.raises(ValueError, match="entirely -inf"):
        chosen_log_probs(np.full((1, 3), -np.inf), np.array([0]))


# ------------------------------------------------------ past the context length
def _greedy_by_hand(model, prompt, n_new):
    """Greedy decoding written out: at every step, the full forward pass over the last window."""
    tokens = list(prompt)
    window = model.context_length
    for _ in range(n_new):
        logits = model.forward(np.array([tokens[-window:]]))[0, -1]
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("prompt_length", [3, 24, 30])
@pytest.mark.parametrize("name", ["pre-norm learned", "rotary"])
def test_generation_slides_past_the_context_like_a_fresh_forward_pass(
    use_cache, prompt_length, name
):
    model = model_and_inputs("decoder-only", 1, **OPTIONS[name])[0].eval()  # context 24
    prompt = np.random.default_rng(prompt_length).integers(3, 11, size=prompt_length)
    result = greedy(model, prompt, max_new_tokens=40, eos_id=None, use_cache=use_cache)
    np.testing.assert_array_equal(result.tokens[0], _greedy_by_hand(model, prompt, 40))


def test_sampling_and_beam_search_slide_too():
    model = model_and_inputs("decoder-only", 2)[0].eval()
    prompt = np.array([[4, 5, 6], [7, 8, 9]])
    runs = [
        sample(model, prompt, rng=np.random.default_rng(5), max_new_tokens=50, use_cache=flag)
        for flag in (True, False)
    ]
    assert [len(t) for t in runs[0].tokens] == [50, 50]
    for a, b, lp_a, lp_b in zip(
        runs[0].tokens,
        runs[1].tokens,
        runs[0].token_log_probs,
        runs[1].token_log_probs,
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(lp_a, lp_b, rtol=0, atol=1e-12)  # other sums, same numbers
    beams = [
        beam_search(model, prompt[0], beam_size=3, max_new_tokens=30, eos_id=None, use_cache=flag)
        for flag in (True, False)
    ]
    np.testing.assert_array_equal(beams[0].best.tokens, beams[1].best.tokens)
    assert len(beams[0].best.tokens) == 30


# ------------------------------------------------------------------ the mode
def dropout_lm(seed: int = 0):
    return decoder_only(seed, vocab_size=11, context_length=24, dropout=0.5, **GENERATION_SIZES)


def dropout_ed(seed: int = 0):
    return encoder_decoder(
        seed,
        src_vocab_size=11,
        tgt_vocab_size=11,
        context_length=16,
        n_decoder_layers=1,
        dropout=0.5,
        **GENERATION_SIZES,
    )


def test_searches_run_without_dropout_and_give_the_mode_back():
    lm = dropout_lm()
    assert lm.training  # models are built in training mode
    runs = [greedy(lm, PROMPT, max_new_tokens=8) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert all(m.training for m in lm.modules())  # still training afterwards
    draws = [sample(lm, PROMPT, rng=np.random.default_rng(4), max_new_tokens=8) for _ in range(2)]
    assert draws[0] == draws[1]
    spec = speculative_decode(lm, dropout_lm(1), PROMPT[0], max_new_tokens=8)
    np.testing.assert_array_equal(spec.tokens, runs[0].tokens[0])
    assert lm.training
    lm.eval()
    assert greedy(lm, PROMPT, max_new_tokens=8) == runs[0]  # the same as in evaluation mode
    ed = dropout_ed()
    first = greedy(ed, PROMPT, max_new_tokens=6)
    assert greedy(ed, PROMPT, max_new_tokens=6) == first
    hyps = [beam_search(ed, PROMPT[0], beam_size=3, max_new_tokens=6).best for _ in range(2)]
    assert np.array_equal(hyps[0].tokens, hyps[1].tokens)
    assert ed.training


def test_evaluation_mode_restores_mixed_modes_even_after_an_error():
    lm = dropout_lm()
    lm.decoder.layers[0].train(False)  # a caller's mixed state: one block frozen in eval mode
    before = [m.training for m in lm.modules()]
    seen = []

    def fails_inside() -> None:
        with evaluation_mode(lm):
            seen.extend(m.training for m in lm.modules())
            raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        fails_inside()
    assert not any(seen)
    assert [m.training for m in lm.modules()] == before
    assert True in before
    assert False in before


# ---------------------------------------------------------- defaults and results
def test_eos_default_depends_on_the_family():
    lm = dropout_lm().eval()
    # An untrained language model must not stop at token 2 unless asked to.
    free = greedy(lm, PROMPT, max_new_tokens=10)
    assert free == greedy(lm, PROMPT, max_new_tokens=10, eos_id=None)
    assert [len(t) for t in free.tokens] == [10, 10]
    assert not free.finished.any()
    early = int(free.tokens[0][3])
    stopped = greedy(lm, PROMPT, max_new_tokens=10, eos_id=early)
    assert stopped.finished[0]
    assert len(stopped.tokens[0]) <= 4
    # An encoder-decoder stops at EOS unless told otherwise.
    ed = dropout_ed().eval()
    assert greedy(ed, PROMPT, max_new_tokens=6) == greedy(
        ed, PROMPT, max_new_tokens=6, eos_id=EOS_ID
    )


def test_generation_results_compare_by_value():
    tokens = [np.array([3, 4]), np.array([5])]
    log_probs = [np.array([-0.5, -1.0]), np.array([-0.25])]
    a = GenerationResult(tokens, log_probs, np.array([False, True]))
    assert a == GenerationResult(
        [t.copy() for t in tokens], [lp.copy() for lp in log_probs], np.array([False, True])
    )
    assert a != GenerationResult(tokens, log_probs, np.array([False, False]))
    assert a != GenerationResult([tokens[0], np.array([6])], log_probs, a.finished)
    assert a != GenerationResult(tokens, [log_probs[0], np.array([-0.2500001])], a.finished)
    assert a != GenerationResult(tokens[:1], log_probs[:1], a.finished[:1])
    assert a != "a string"
    np.testing.assert_array_equal(a.log_prob, [-1.5, -0.25])
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)


# --------------------------------------------------------------- bad input
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


def test_real_models_refuse_bad_prompts_by_name():
    lm, ed = MODELS["decoder-only"][0], MODELS["encoder-decoder"][0]
    with pytest.raises(ValueError, match="context length 24"):
        greedy(lm, np.ones(25, dtype=int) * 4, max_new_tokens=1, overflow="error")
    with pytest.raises(ValueError, match=r"max_new_tokens can be at most 4.*overflow='slide'"):
        sample(
            lm,
            np.ones(20, dtype=int) * 4,
            rng=np.random.default_rng(0),
            max_new_tokens=5,
            overflow="error",
        )
    with pytest.raises(ValueError, match="overflow must be one of 'slide', 'error'"):
        greedy(lm, np.ones(2, dtype=int) * 4, max_new_tokens=1, overflow="wrap")
    with pytest.raises(ValueError, match="vocabulary size 11"):
        greedy(lm, np.array([3, 11]), max_new_tokens=1)
    with pytest.raises(ValueError, match=r"prompt must be a rectangular array.*lengths 3, 1"):
        greedy(lm, [[1, 2, 3], [4]], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"source must be a rectangular array.*lengths 2, 3"):
        greedy(ed, [[1, 2], [4, 5, 6]], max_new_tokens=2)
    with pytest.raises(ValueError, match="bos_id=0 is the model's pad_id"):
        greedy(ed, PROMPT, max_new_tokens=2, bos_id=0)
