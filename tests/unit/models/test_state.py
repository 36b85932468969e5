"""The decode state: select, truncate and copy keep step-by-step decoding equal to ``forward``.

Beam search keeps some rows of a state (several times over), speculative decoding
forgets the last positions, and both copy states; after any of them the next
``step`` must give what ``forward`` gives on the prefix the state now stands for.
"""

from __future__ import annotations

import numpy as np
import pytest
from small_models import LLAMA, decoder_only, encoder_decoder, perturb

from tinyformer.blocks import BlockCache
from tinyformer.models import DecodeState, EncoderDecoder

VOCAB, LIMIT = 9, 10
EXACT = {"rtol": 0, "atol": 1e-12}
SOURCE = np.array([[3, 4, 5, 6, 7, 8], [5, 6, 7, 0, 0, 0], [8, 1, 2, 3, 0, 0]])
MODELS = {
    "encoder-decoder": perturb(encoder_decoder(11, context_length=LIMIT), 1).eval(),
    "encoder-decoder llama": perturb(encoder_decoder(12, context_length=LIMIT, **LLAMA), 2).eval(),
    "decoder-only": perturb(decoder_only(13, context_length=LIMIT), 3).eval(),
    "decoder-only llama": perturb(decoder_only(14, context_length=LIMIT, **LLAMA), 4).eval(),
}


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


@pytest.mark.parametrize("name", list(MODELS))
def test_select_then_continue_matches_recomputation(name):
    model = MODELS[name]
    rng = np.random.default_rng(0)
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
def test_select_before_the_first_step(name):
    model = MODELS[name]
    rows = np.array([1, 1, 0])
    state = start(model).select(rows)
    tokens = np.random.default_rng(1).integers(1, VOCAB, (3, 4))
    np.testing.assert_allclose(model.step(tokens, state), full(model, tokens, rows), **EXACT)


@pytest.mark.parametrize("name", list(MODELS))
def test_truncate_then_continue_matches_recomputation(name):
    """Speculative decoding: feed a draft, keep part of it, continue differently."""
    model = MODELS[name]
    rng = np.random.default_rng(2)
    kept, draft, replacement = (rng.integers(1, VOCAB, (3, n)) for n in (3, 4, 3))
    state = start(model)
    model.step(kept, state)
    model.step(draft, state)
    state.truncate(5)
    assert state.length == 5
    stepped = model.step(replacement, state)
    prefix = np.concatenate([kept, draft[:, :2], replacement], axis=1)
    np.testing.assert_allclose(stepped, full(model, prefix)[:, 5:], **EXACT)
    state.truncate(0)
    np.testing.assert_allclose(model.step(prefix, state), full(model, prefix), **EXACT)


@pytest.mark.parametrize("name", list(MODELS))
def test_copy_is_independent(name):
    model = MODELS[name]
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, VOCAB, (3, 6))
    state = start(model)
    model.step(tokens[:, :2], state)
    twin = state.copy()
    model.step(rng.integers(1, VOCAB, (3, 3)), state)  # the original moves on
    assert twin.length == 2
    np.testing.assert_allclose(
        model.step(tokens[:, 2:], twin), full(model, tokens)[:, 2:], **EXACT
    )


# ------------------------------------------------------ what the state holds
def test_the_state_holds_one_block_cache_per_decoder_block():
    model = MODELS["encoder-decoder"]
    state = start(model)
    assert len(state.caches) == len(model.decoder.layers)
    assert all(isinstance(c, BlockCache) and len(c) == 0 for c in state.caches)
    assert state.memory.shape == (3, 6, model.config.d_model)
    np.testing.assert_array_equal(state.memory_mask[:, 0], SOURCE != 0)
    assert state.key_mask.shape == (3, 0)
    lm_state = start(MODELS["decoder-only"])
    assert (lm_state.memory, lm_state.memory_mask, lm_state.key_mask) == (None, None, None)


def test_select_copies_rows_of_every_cache_and_of_the_memory():
    model = MODELS["encoder-decoder"]
    state = start(model)
    model.step(np.array([[1, 4], [1, 5], [1, 6]]), state)
    rows = np.array([2, 2, 0])
    chosen = state.select(rows)
    for old, new in zip(state.caches, chosen.caches, strict=True):
        for part in ("self_attention", "cross_attention"):
            np.testing.assert_array_equal(getattr(new, part).keys, getattr(old, part).keys[rows])
            np.testing.assert_array_equal(
                getattr(new, part).values, getattr(old, part).values[rows]
            )
            assert not np.shares_memory(getattr(new, part).keys, getattr(old, part).keys)
    np.testing.assert_array_equal(chosen.memory, state.memory[rows])
    np.testing.assert_array_equal(chosen.memory_mask, state.memory_mask[rows])
    np.testing.assert_array_equal(chosen.key_mask, state.key_mask[rows])


def test_truncate_forgets_decoded_positions_but_keeps_the_memorys_keys():
    model = MODELS["encoder-decoder"]
    state = start(model)
    model.step(np.array([[1, 4, 5, 6]] * 3), state)
    state.truncate(1)
    for cache in state.caches:
        assert len(cache) == 1
        assert cache.self_attention.keys.shape[2] == 1
        assert cache.cross_attention.keys.shape[2] == SOURCE.shape[1]  # computed once, kept
    assert state.key_mask.shape == (3, 1)


def test_copy_does_not_share_storage():
    model = MODELS["decoder-only"]
    state = start(model)
    model.step(np.ones((3, 2), dtype=np.int64), state)
    twin = state.copy()
    for old, new in zip(state.caches, twin.caches, strict=True):
        assert not np.shares_memory(old.self_attention.keys, new.self_attention.keys)
        np.testing.assert_array_equal(old.self_attention.keys, new.self_attention.keys)


# ------------------------------------------------------------------ refusals
def test_select_and_truncate_check_their_arguments():
    lm = MODELS["decoder-only"]
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
    assert state.length == 2  # refused calls change nothing
    assert repr(state) == "DecodeState(batch_size=3, length=2, model=DecoderOnlyLM)"


def test_a_state_is_accepted_only_by_the_model_that_made_it():
    ed, lm = MODELS["encoder-decoder"], MODELS["decoder-only"]
    one = np.ones((3, 1), dtype=np.int64)
    with pytest.raises(ValueError, match="state was made by another model"):
        lm.step(one, start(ed))
    with pytest.raises(ValueError, match="state was made by another model"):
        ed.step(one, start(MODELS["encoder-decoder llama"]))
    selected = start(lm).select(np.array([0, 1, 2]))
    assert lm.step(one, selected).shape == (3, 1, VOCAB)  # a selected state is still its own
