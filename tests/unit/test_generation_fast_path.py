"""The per-token fast path of generation gives the same numbers, to the last bit, as the layers.

``DecoderOnlyLM.step`` runs through ``models._stack.decode_step`` (embedding,
blocks, final norm and output layer without their checks) when ``can_fuse``
allows it; ``greedy`` takes each chosen token's log-probability with
``chosen_log_probs`` instead of a whole log-softmax; and ``IncrementalDecoder``
keeps the prefix in a buffer that doubles. None of them may change a single bit
of what decoding returns.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyformer.functional import log_softmax
from tinyformer.generation import IncrementalDecoder, greedy, sample
from tinyformer.generation.decoding import chosen_log_probs
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.models._stack import _extend, can_fuse
from tinyformer.multihead import KVCache

OPTIONS = {
    "pre-norm gelu learned": {},
    "post-norm relu sinusoidal": {
        "norm_first": False,
        "activation": "relu",
        "positional": "sinusoidal",
    },
    "gelu_tanh, no positions": {"activation": "gelu_tanh", "positional": "none"},
    "silu": {"activation": "silu"},
    "untied output, unscaled embeddings": {"tie_output": False, "scale_embeddings": False},
}


def lm(options: dict, dtype: str = "float64", seed: int = 3, **extra) -> DecoderOnlyLM:
    config = DecoderOnlyConfig(
        vocab_size=13,
        d_model=16,
        n_heads=4,
        d_ff=24,
        n_layers=2,
        context_length=96,
        dtype=dtype,
        **options,
        **extra,
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(seed))
    for p in model.parameters():  # non-trivial norms and biases, so that every term counts
        p.value[...] = p.value + 0.1 * np.random.default_rng(seed).standard_normal(p.shape)
    return model.eval()


def _decode(model: DecoderOnlyLM, fused: bool, feeds: list[np.ndarray]) -> list[np.ndarray]:
    model.fused_decoding = fused
    state = model.start(feeds[0].shape[0])
    try:
        return [model.step(tokens, state) for tokens in feeds]
    finally:
        model.fused_decoding = True


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_fused_steps_equal_the_layers_bit_for_bit(name, dtype):
    model = lm(OPTIONS[name], dtype)
    assert can_fuse(model)
    rng = np.random.default_rng(0)
    # a prompt (the causal mask), single tokens (no mask), then a draft of 3 (mask again)
    feeds = [rng.integers(0, 13, (3, 7))] + [rng.integers(0, 13, (3, 1)) for _ in range(70)]
    feeds.append(rng.integers(0, 13, (3, 3)))
    fused, layered = _decode(model, True, feeds), _decode(model, False, feeds)
    for a, b in zip(fused, layered, strict=True):
        assert a.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(a, b)


def test_fused_steps_equal_a_full_forward_pass():
    model = lm({})
    ids = np.random.default_rng(1).integers(0, 13, (2, 20))
    state = model.start(2)
    stepped = np.concatenate(
        [model.step(ids[:, :5], state)]
        + [model.step(ids[:, t : t + 1], state) for t in range(5, 20)],
        axis=1,
    )
    np.testing.assert_allclose(stepped, model.forward(ids), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_greedy_and_sampling_are_unchanged_by_the_fast_path(dtype):
    model = lm({}, dtype)
    prompt = np.random.default_rng(2).integers(0, 13, (4, 5))
    results = {}
    for fused in (True, False):
        model.fused_decoding = fused
        results[fused] = (
            greedy(model, prompt, max_new_tokens=60),
            sample(model, prompt, max_new_tokens=30, rng=np.random.default_rng(5), top_k=4),
        )
    model.fused_decoding = True
    assert results[True] == results[False]  # GenerationResult: bit-equal tokens and log-probs


def test_models_the_fast_path_cannot_run_take_the_layers():
    assert not can_fuse(lm({"positional": "rotary"}))
    training = lm({}, dropout=0.1).train()
    assert not can_fuse(training)
    assert can_fuse(lm({}, dropout=0.1).eval())
    assert can_fuse(lm({}).train())  # dropout rate 0: the identity even in training mode
    rotary = lm({"positional": "rotary"})
    prompt = np.array([[1, 2, 3]])
    cached = greedy(rotary, prompt, max_new_tokens=8)
    uncached = greedy(rotary, prompt, max_new_tokens=8, use_cache=False)
    np.testing.assert_array_equal(cached.tokens[0], uncached.tokens[0])
    np.testing.assert_allclose(cached.token_log_probs[0], uncached.token_log_probs[0], atol=1e-12)


@settings(max_examples=60, deadline=None)
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


def test_the_prefix_buffer_grows_rolls_back_and_reorders():
    model = lm({})
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


def test_the_decoding_steps_extend_is_append_without_the_checks_it_does_not_need():
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((2, 2, 40, 3))
    values = rng.standard_normal((2, 2, 40, 5))
    checked, fast = KVCache(), KVCache()
    for i in range(0, 40, 3):  # through the first allocation and two doublings
        expected = checked.append(keys[:, :, i : i + 3], values[:, :, i : i + 3])
        got = _extend(fast, keys[:, :, i : i + 3], values[:, :, i : i + 3])
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
    fast.truncate(10)
    with pytest.raises(ValueError, match="call reset"):  # another batch size: append's error
        _extend(fast, keys[:1, :, :1], values[:1, :, :1])
    assert len(fast) == 10
