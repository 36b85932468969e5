"""Step-by-step decoding: start/step equal forward, and select/truncate/copy keep it so."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.blocks import DecoderCache
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    DecodeState,
    EncoderDecoder,
    EncoderDecoderConfig,
)
from tinyformer.multihead import KVCache

SIZES = {"d_model": 8, "n_heads": 2, "d_ff": 12}
VOCAB = 9
LIMIT = 10
EXACT = {"rtol": 0, "atol": 1e-12}

ENCODER_DECODER = {
    "post-norm sinusoidal": {},
    "pre-norm learned": {"norm_first": True, "positional": "learned"},
}
DECODER_ONLY = {
    "learned": {},
    "rotary": {"positional": "rotary"},
    "sinusoidal post-norm": {"positional": "sinusoidal", "norm_first": False},
}


def _encoder_decoder(options: dict) -> EncoderDecoder:
    config = EncoderDecoderConfig(
        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, context_length=LIMIT, **SIZES, **options
    )
    return EncoderDecoder(config, rng=np.random.default_rng(11)).eval()


def _decoder_only(options: dict) -> DecoderOnlyLM:
    config = DecoderOnlyConfig(vocab_size=VOCAB, context_length=LIMIT, **SIZES, **options)
    return DecoderOnlyLM(config, rng=np.random.default_rng(12)).eval()


MODELS = {
    **{f"encoder-decoder {k}": _encoder_decoder(v) for k, v in ENCODER_DECODER.items()},
    **{f"decoder-only {k}": _decoder_only(v) for k, v in DECODER_ONLY.items()},
}
SOURCE = np.array([[3, 4, 5, 6, 7, 8], [5, 6, 7, 0, 0, 0], [8, 1, 2, 3, 0, 0]])


def start(model, rows: np.ndarray | None = None) -> DecodeState:
    source = SOURCE if rows is None else SOURCE[rows]
    if isinstance(model, EncoderDecoder):
        return model.start(source)
    return model.start(len(source))


def full(model, prefix: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Logits of ``forward`` on the whole prefix: what every step must reproduce."""
    if isinstance(model, EncoderDecoder):
        return model.forward(SOURCE if rows is None else SOURCE[rows], prefix)
    return model.forward(prefix)


def chunks(draw_sizes: list[int], total: int) -> list[tuple[int, int]]:
    """Split ``0 .. total`` into consecutive pieces of the drawn sizes (the last one trimmed)."""
    pieces, at = [], 0
    for size in draw_sizes:
        if at >= total:
            break
        pieces.append((at, min(total, at + size)))
        at += size
    if at < total:
        pieces.append((at, total))
    return pieces


@pytest.mark.parametrize("name", list(MODELS))
@given(
    data=st.data(),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=LIMIT),
)
def test_steps_equal_forward_on_the_whole_prefix(name, data, sizes):
    model = MODELS[name]
    total = data.draw(st.integers(1, LIMIT), label="length")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    tokens = np.random.default_rng(seed).integers(1, VOCAB, (3, total))
    state = start(model)
    stepped = [model.step(tokens[:, a:b], state) for a, b in chunks(sizes, total)]
    assert state.length == total
    np.testing.assert_allclose(np.concatenate(stepped, axis=1), full(model, tokens), **EXACT)


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("encoder-decoder")])
def test_padded_decoder_tokens_step_like_forward(name):
    """Finished rows fed <pad> are masked as keys in step exactly as forward masks them."""
    model = MODELS[name]
    tokens = np.array([[1, 4, 5, 0, 0, 0, 0], [1, 6, 7, 8, 3, 0, 0], [1, 2, 2, 2, 2, 2, 2]])
    state = start(model)
    stepped = [model.step(tokens[:, :2], state)]
    stepped += [model.step(tokens[:, t : t + 1], state) for t in range(2, 5)]
    stepped.append(model.step(tokens[:, 5:], state))
    np.testing.assert_allclose(np.concatenate(stepped, axis=1), full(model, tokens), **EXACT)


@pytest.mark.parametrize("name", list(MODELS))
def test_select_then_continue_equals_recompute(name, rng):
    model = MODELS[name]
    tokens = rng.integers(1, VOCAB, (3, 7))
    state = start(model)
    model.step(tokens[:, :3], state)
    model.step(tokens[:, 3:4], state)
    rows = np.array([2, 0, 2, 2, 1])  # repeats, and more rows than before
    chosen = state.select(rows)
    assert (chosen.batch_size, chosen.length) == (5, 4)
    tail = rng.integers(1, VOCAB, (5, 3))
    stepped = [model.step(tail[:, :1], chosen), model.step(tail[:, 1:], chosen)]
    prefix = np.concatenate([tokens[rows, :4], tail], axis=1)
    expected = full(model, prefix, rows)[:, 4:]
    np.testing.assert_allclose(np.concatenate(stepped, axis=1), expected, **EXACT)
    # The original state is untouched and still continues correctly.
    np.testing.assert_allclose(
        model.step(tokens[:, 4:7], state), full(model, tokens)[:, 4:], **EXACT
    )


@pytest.mark.parametrize("name", list(MODELS))
def test_select_before_the_first_step(name, rng):
    model = MODELS[name]
    rows = np.array([1, 1, 0])
    state = start(model).select(rows)
    tokens = rng.integers(1, VOCAB, (3, 4))
    np.testing.assert_allclose(model.step(tokens, state), full(model, tokens, rows), **EXACT)


@pytest.mark.parametrize("name", list(MODELS))
def test_truncate_then_continue_equals_recompute(name, rng):
    """Speculative decoding: feed a draft, keep part of it, continue differently."""
    model = MODELS[name]
    kept, draft, replacement = (rng.integers(1, VOCAB, (3, n)) for n in (3, 4, 3))
    state = start(model)
    model.step(kept, state)
    model.step(draft, state)
    state.truncate(5)
    stepped = model.step(replacement, state)
    prefix = np.concatenate([kept, draft[:, :2], replacement], axis=1)
    np.testing.assert_allclose(stepped, full(model, prefix)[:, 5:], **EXACT)
    state.truncate(0)
    np.testing.assert_allclose(model.step(prefix, state), full(model, prefix), **EXACT)


@pytest.mark.parametrize("name", list(MODELS))
def test_copy_is_independent(name, rng):
    model = MODELS[name]
    tokens = rng.integers(1, VOCAB, (3, 6))
    state = start(model)
    model.step(tokens[:, :2], state)
    twin = state.copy()
    model.step(rng.integers(1, VOCAB, (3, 3)), state)  # the original moves on
    assert twin.length == 2
    np.testing.assert_allclose(
        model.step(tokens[:, 2:], twin), full(model, tokens)[:, 2:], **EXACT
    )


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("name", list(MODELS))
def test_step_refuses_to_exceed_max_positions(name):
    model = MODELS[name]
    state = start(model)
    model.step(np.ones((3, LIMIT - 1), dtype=np.int64), state)
    with pytest.raises(ValueError, match=rf"to {LIMIT + 1} positions .* limit of {LIMIT}"):
        model.step(np.ones((3, 2), dtype=np.int64), state)
    assert state.length == LIMIT - 1  # unchanged: the last position is still usable
    assert model.step(np.ones((3, 1), dtype=np.int64), state).shape == (3, 1, VOCAB)
    with pytest.raises(ValueError, match="beyond the model's limit"):
        model.step(np.ones((3, 1), dtype=np.int64), state)


def test_step_refuses_foreign_or_mismatched_states():
    ed, lm = MODELS["encoder-decoder post-norm sinusoidal"], MODELS["decoder-only learned"]
    other_lm = MODELS["decoder-only rotary"]
    one = np.ones((3, 1), dtype=np.int64)
    with pytest.raises(ValueError, match="state was made by another model"):
        lm.step(one, start(ed))
    with pytest.raises(ValueError, match="state was made by another model"):
        lm.step(one, other_lm.start(3))
    with pytest.raises(ValueError, match="tokens has 2 rows but the state decodes 3 sequences"):
        ed.step(one[:2], start(ed))
    with pytest.raises(TypeError, match="state must be a DecodeState"):
        lm.step(one, [])
    with pytest.raises(TypeError, match="tokens must be an integer array"):
        lm.step(one.astype(float), lm.start(3))
    with pytest.raises(ValueError, match=rf"tokens must be token ids in \[0, {VOCAB}\)"):
        lm.step(one * VOCAB, lm.start(3))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        lm.start(0)
    with pytest.raises(TypeError, match="batch_size must be a positive integer"):
        lm.start(2.0)


def test_select_and_truncate_check_their_arguments():
    lm = MODELS["decoder-only learned"]
    state = lm.start(3)
    lm.step(np.ones((3, 2), dtype=np.int64), state)
    with pytest.raises(ValueError, match=r"indices must be rows in \[0, 3\) of the state, got 3"):
        state.select(np.array([0, 3]))
    with pytest.raises(ValueError, match="got -1"):
        state.select(np.array([-1]))
    with pytest.raises(ValueError, match="non-empty 1-D"):
        state.select(np.array([], dtype=np.int64))
    with pytest.raises(TypeError, match="indices must be an integer array"):
        state.select([0.0, 1.0])
    with pytest.raises(ValueError, match="length must be at most the state's length 2, got 3"):
        state.truncate(3)
    with pytest.raises(ValueError, match="length must be a non-negative integer"):
        state.truncate(-1)
    assert "length=2" in repr(state)


# -------------------------------------------------------------- the caches
def test_kv_cache_truncate_select_copy(rng):
    cache = KVCache()
    keys, values = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 3, 5))
    cache.append(keys, values)
    picked = cache.select(np.array([1, 1, 0]))
    np.testing.assert_array_equal(picked.keys, keys[[1, 1, 0]])
    np.testing.assert_array_equal(picked.values, values[[1, 1, 0]])
    twin = cache.copy()
    cache.truncate(1)
    assert len(cache) == 1
    assert len(twin) == 3
    assert len(picked) == 3
    np.testing.assert_array_equal(cache.keys, keys[..., :1, :])
    more_k, more_v = rng.standard_normal((2, 2, 1, 4)), rng.standard_normal((2, 2, 1, 5))
    cache.append(more_k, more_v)
    np.testing.assert_array_equal(cache.keys[..., 1:, :], more_k)
    np.testing.assert_array_equal(twin.keys, keys)  # the copy kept its own storage
    np.testing.assert_array_equal(picked.keys, keys[[1, 1, 0]])
    with pytest.raises(ValueError, match="at most the number of cached positions 2"):
        cache.truncate(3)
    with pytest.raises(ValueError, match=r"rows in \[0, 2\)"):
        cache.select(np.array([2]))
    empty = KVCache().select(np.array([0, 0]))
    assert len(empty) == 0
    assert empty.keys is None
    assert len(KVCache().copy()) == 0


def test_decoder_cache_truncate_keeps_the_cross_attention(rng):
    cache = DecoderCache()
    cache.self_attention.append(
        rng.standard_normal((1, 2, 4, 3)), rng.standard_normal((1, 2, 4, 3))
    )
    cache.cross_attention.append(
        rng.standard_normal((1, 2, 6, 3)), rng.standard_normal((1, 2, 6, 3))
    )
    cache.truncate(2)
    assert len(cache) == 2
    assert len(cache.cross_attention) == 6
    picked, twin = cache.select(np.array([0, 0])), cache.copy()
    assert picked.cross_attention.keys.shape == (2, 2, 6, 3)
    assert len(picked) == 2
    assert twin.self_attention is not cache.self_attention
    assert len(twin) == 2
