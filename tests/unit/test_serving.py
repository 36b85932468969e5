"""The paged key/value cache and the serving scheduler of tinyformer.serving."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import decoder_only

from tinyformer.generation import greedy
from tinyformer.serving import (
    BlockPool,
    BlockTable,
    PagedKVCache,
    Request,
    doubling_capacity,
    kv_reservation,
    random_requests,
    serve,
    start_paged,
)


def _decode(model, state, tokens, prompt_len):
    """Logits of a prefill of ``prompt_len`` tokens, then one token per step: (B, T, V)."""
    out = [model.step(tokens[:, :prompt_len], state)]
    out += [model.step(tokens[:, t : t + 1], state) for t in range(prompt_len, tokens.shape[1])]
    return np.concatenate(out, axis=1)


# --- the pool and the block table ---------------------------------------------------------


def test_pool_hands_out_every_block_once_and_takes_them_back():
    pool = BlockPool(3, 4)
    taken = [pool.allocate() for _ in range(3)]
    assert sorted(taken) == [0, 1, 2]
    assert pool.n_free == 0
    assert pool.n_used == 3
    with pytest.raises(MemoryError, match="3 blocks"):
        pool.allocate()
    pool.release(taken[:2])
    assert pool.n_free == 2
    with pytest.raises(ValueError, match="in use"):
        pool.release([taken[0]])  # already free


def test_table_reserves_whole_blocks_and_finds_each_position():
    pool = BlockPool(10, 4)
    table = BlockTable(pool)
    table.reserve(9)  # 9 positions: 3 blocks of 4
    assert len(table.blocks) == 3
    assert pool.n_used == 3
    ids, offsets = table.slots(np.array([0, 3, 4, 8]))
    assert ids.tolist() == [table.blocks[0], table.blocks[0], table.blocks[1], table.blocks[2]]
    assert offsets.tolist() == [0, 3, 0, 0]
    table.shrink(4)
    assert len(table.blocks) == 1
    assert pool.n_used == 1
    table.release()
    assert pool.n_used == 0


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(4, 0)
    with pytest.raises(TypeError, match="pool"):
        BlockTable("pool")
    with pytest.raises(TypeError, match="model"):
        BlockPool.for_model("model", 4, 2)
    with pytest.raises(TypeError, match="storage"):
        PagedKVCache(BlockPool(4, 2), 0, [])
    with pytest.raises(ValueError, match="policy"):
        serve([], policy="greedy", max_batch=1, pool=BlockPool(1, 1))
    with pytest.raises(ValueError, match="prompt"):
        Request(np.zeros((2, 2), dtype=int), 3)


# --- decoding with the paged cache ---------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"n_kv_heads": 1},
        {"positional": "rotary", "n_heads": 4, "n_kv_heads": 2},
        {"dtype": "float32"},
    ],
    ids=["multi-head", "multi-query", "grouped rotary", "float32"],
)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_logits_equal_contiguous_logits(options, block_size):
    model = decoder_only(1, context_length=12, **options).eval()
    tokens = np.random.default_rng(0).integers(0, model.vocab_size, (2, 11))  # (2, 11)
    expected = _decode(model, model.start(2), tokens, 4)
    pool = BlockPool.for_model(model, 2 * 11, block_size)
    state, tables = start_paged(model, pool, batch_size=2)
    got = _decode(model, state, tokens, 4)
    dtype = np.dtype(options.get("dtype", "float64"))
    assert pool.keys.dtype == got.dtype == expected.dtype == dtype  # float32 in, float32 out
    atol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)
    np.testing.assert_allclose(got, model.forward(tokens), atol=atol)  # (2, 11, V)
    # every token fed is cached: 11 positions per row, in whole blocks
    assert pool.n_used == 2 * -(-11 // block_size)
    for table in tables:
        table.release()
    assert pool.n_used == 0
    assert pool.n_free == pool.n_blocks


def test_blocks_are_not_contiguous_and_still_give_the_same_logits():
    """Interleave two sequences' allocations, so each one's blocks are scattered."""
    model = decoder_only(2, context_length=12).eval()
    pool = BlockPool.for_model(model, 12, 2)
    (s1, (t1,)), (s2, (t2,)) = start_paged(model, pool), start_paged(model, pool)
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, model.vocab_size, (2, 1, 10))
    logits_a, logits_b = [], []
    for t in range(10):
        logits_a.append(model.step(a[:, t : t + 1], s1))
        logits_b.append(model.step(b[:, t : t + 1], s2))
    assert t1.blocks == [0, 2, 4, 6, 8]
    assert t2.blocks == [1, 3, 5, 7, 9]
    np.testing.assert_allclose(np.concatenate(logits_a, 1), model.forward(a), atol=1e-12)
    np.testing.assert_allclose(np.concatenate(logits_b, 1), model.forward(b), atol=1e-12)
    t1.release()
    assert pool.n_used == 5  # only the other sequence's blocks remain


def test_truncate_returns_blocks_and_decoding_continues_as_if_never_fed():
    model = decoder_only(3, context_length=12).eval()
    tokens = np.random.default_rng(2).integers(0, model.vocab_size, (1, 9))
    pool = BlockPool.for_model(model, 8, 2)
    state, _ = start_paged(model, pool)
    model.step(tokens, state)  # 9 positions: 5 blocks
    assert pool.n_used == 5
    state.truncate(4)  # back to 2 blocks
    assert pool.n_used == 2
    assert state.length == 4
    logits = model.step(tokens[:, 4:6], state)
    np.testing.assert_allclose(logits, model.forward(tokens[:, :6])[:, 4:], atol=1e-12)


def test_the_pool_must_fit_the_model():
    model = decoder_only(0).eval()
    other = decoder_only(0, n_kv_heads=1).eval()
    with pytest.raises(ValueError, match="h_kv"):
        start_paged(model, BlockPool.for_model(other, 4, 2))
    with pytest.raises(ValueError, match="storage"):
        start_paged(model, BlockPool(4, 2))


def test_a_paged_cache_refuses_to_copy_rows():
    model = decoder_only(0).eval()
    state, _ = start_paged(model, BlockPool.for_model(model, 4, 2))
    with pytest.raises(NotImplementedError):
        state.select(np.array([0, 0]))


# --- memory ---------------------------------------------------------------------------------


def test_reservation_by_hand():
    r = kv_reservation([1, 16, 17], max_length=32, block_size=16)
    assert (r.used, r.contiguous, r.paged) == (34, 96, 64)


def test_paged_waste_is_under_one_block_per_sequence():
    rng = np.random.default_rng(3)
    for _ in range(50):
        lengths = rng.integers(1, 200, rng.integers(1, 30))
        b = int(rng.integers(1, 40))
        r = kv_reservation(lengths, max_length=200, block_size=b)
        assert r.used <= r.paged < r.used + len(lengths) * b
        assert r.paged <= len(lengths) * b * -(-200 // b)  # whole blocks of the longest
    with pytest.raises(ValueError, match="max_length"):
        kv_reservation([5, 9], max_length=8, block_size=2)


@pytest.mark.parametrize("prompt_length", [1, 5, 16, 20])
def test_doubling_capacity_follows_the_contiguous_cache(prompt_length):
    model = decoder_only(0, context_length=80, n_layers=1).eval()
    state = model.start(1)
    tokens = np.zeros((1, 80), dtype=int)
    model.step(tokens[:, :prompt_length], state)
    for n in range(prompt_length, 80):
        buffer = state.caches[0].self_attention._keys  # (1, h, capacity, d_k)
        assert doubling_capacity(prompt_length, n) == buffer.shape[2]
        model.step(tokens[:, n : n + 1], state)


def test_doubling_capacity_by_hand_and_errors():
    assert [doubling_capacity(8, n) for n in (8, 16, 17, 33, 64, 65)] == [16, 16, 32, 64, 64, 128]
    assert doubling_capacity(40, 41) == 80
    with pytest.raises(ValueError, match="length"):
        doubling_capacity(10, 9)
    with pytest.raises(ValueError, match="prompt_length"):
        doubling_capacity(0, 9)


# --- scheduling -----------------------------------------------------------------------------


def _requests(outputs, prompt=2):
    return [Request(np.zeros(prompt, dtype=int), m) for m in outputs]


def test_static_and_continuous_schedules_by_hand():
    requests = _requests([1, 4, 1, 4])
    static = serve(requests, policy="static", max_batch=2, pool=BlockPool(100, 4))
    cont = serve(requests, policy="continuous", max_batch=2, pool=BlockPool(100, 4))
    # static: {0, 1} for 4 steps (request 0 done after one), then {2, 3} for 4
    assert static.batch.tolist() == [2, 1, 1, 1, 2, 1, 1, 1]
    # continuous: 0 and 1; 2 takes 0's slot; 3 takes 2's; 3 runs to step 6
    assert cont.batch.tolist() == [2, 2, 2, 2, 1, 1]
    assert static.batch.sum() == cont.batch.sum() == 10  # every token once
    assert cont.finished.tolist() == [0, 3, 1, 5]
    assert cont.tokens_per_step == 10 / 6
    assert static.n_steps == 8
    # positions held after each step: prompt 2, so 2 + (tokens so far - 1) per request
    assert static.positions.tolist() == [4, 3, 4, 5, 4, 3, 4, 5]
    assert cont.positions.tolist() == [4, 5, 6, 8, 4, 5]
    assert static.positions.sum() == cont.positions.sum()  # same positions, other steps
    with pytest.raises(ValueError, match="requests"):
        serve([], policy="static", max_batch=2, pool=BlockPool(4, 4))


def test_block_budget_is_respected_and_every_block_comes_back():
    rng = np.random.default_rng(4)
    requests = random_requests(
        40, rng, prompt_lengths=(1, 30), output_lengths=(1, 60), vocab_size=5
    )
    for policy in ("static", "continuous"):
        pool = BlockPool(30, 8)
        trace = serve(requests, policy=policy, max_batch=6, pool=pool)
        assert trace.blocks.max() <= 30
        assert trace.batch.max() <= 6
        assert trace.batch.sum() == sum(r.max_new_tokens for r in requests)
        assert pool.n_used == 0
    with pytest.raises(ValueError, match="more blocks"):
        serve(_requests([40]), policy="continuous", max_batch=1, pool=BlockPool(2, 4))


def test_continuous_batching_needs_fewer_steps_than_static():
    rng = np.random.default_rng(5)
    requests = random_requests(
        60, rng, prompt_lengths=(1, 20), output_lengths=(1, 50), vocab_size=5
    )
    steps = {
        p: serve(requests, policy=p, max_batch=8, pool=BlockPool(1000, 4)).n_steps
        for p in ("static", "continuous")
    }
    assert steps["continuous"] < steps["static"]


def test_served_tokens_equal_greedy_decoding_alone():
    model = decoder_only(6, context_length=16, n_heads=2, n_kv_heads=1).eval()
    rng = np.random.default_rng(6)
    requests = random_requests(
        5, rng, prompt_lengths=(1, 5), output_lengths=(1, 10), vocab_size=model.vocab_size
    )
    alone = [
        greedy(model, r.prompt, max_new_tokens=r.max_new_tokens, eos_id=None).tokens[0]
        for r in requests
    ]
    for policy in ("static", "continuous"):
        pool = BlockPool.for_model(model, 12, 2)
        trace = serve(requests, policy=policy, max_batch=2, pool=pool, model=model)
        for got, want in zip(trace.tokens, alone, strict=True):
            np.testing.assert_array_equal(got, want)
        assert pool.n_used == 0
