"""The roofline: work counted from shapes, checked against what the model multiplies; the roof."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.cost import count_matmuls
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.roofline import (
    Kernel,
    Work,
    attainable,
    attention_work,
    cache_sizes,
    copy_kernel,
    decode_step_work,
    layernorm_work,
    matmul_kernel,
    matmul_work,
    prefill_work,
    read_kernel,
    weight_bytes,
)

CONFIG = DecoderOnlyConfig(
    vocab_size=11,
    d_model=16,
    n_heads=4,
    d_ff=24,
    n_layers=2,
    context_length=12,
    dtype="float32",
)


def test_matmul_work_by_hand():
    w = matmul_work(2, 3, 5)
    assert w.flops == 2 * 2 * 3 * 5
    assert w.nbytes == 4 * (6 + 15 + 10)
    assert matmul_work(2, 3, 5, itemsize=8).nbytes == 2 * w.nbytes
    # a square product: I = 2n / (3 s), growing with n
    assert matmul_work(96, 96, 96).intensity == pytest.approx(2 * 96 / 12)


def test_attention_work_materialized_costs_more_traffic_and_both_grow_with_length():
    fused = [attention_work(t, 64, 4, materialized=False).intensity for t in (16, 64, 256)]
    full = [attention_work(t, 64, 4).intensity for t in (16, 64, 256)]
    assert fused == sorted(fused)
    assert fused[0] < fused[-1]
    assert all(a > b for a, b in zip(fused, full, strict=True))
    w = attention_work(8, 16, 2, batch_size=3)
    assert w.flops == 3 * 4 * 8 * 8 * 16
    assert w.nbytes == 4 * 3 * (4 * 8 * 16 + 4 * 2 * 8 * 8)


def test_materialized_attention_has_a_ceiling_of_d_k_over_s_and_fused_grows_like_t_over_s():
    d, h, s = 64, 4, 4  # d_k = 16: ceiling 4 FLOPs per byte
    full = [attention_work(t, d, h, itemsize=s).intensity for t in (16, 256, 4096, 65536)]
    for t, value in zip((16, 256, 4096, 65536), full, strict=True):
        assert value == pytest.approx(t * d / (s * (d + h * t)))
        assert value < d / h / s
    assert full[-1] > 0.99 * d / h / s  # approached
    for t in (16, 4096):
        assert attention_work(t, d, h, itemsize=s, materialized=False).intensity == t / s


def test_layernorm_is_memory_bound_at_any_size():
    for rows in (1, 10, 10_000):
        w = layernorm_work(rows, 64)
        assert w.flops == 7 * rows * 64
        assert w.intensity < 7 / 8


def _model(config=CONFIG, seed=0):
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed)).eval()


def test_weight_bytes_counts_every_parameter_but_unused_position_rows():
    model = _model()
    held = sum(p.value.nbytes for p in model.parameters())
    positions = CONFIG.context_length * CONFIG.d_model * 4
    assert weight_bytes(CONFIG, 1) == held - positions + CONFIG.d_model * 4
    assert weight_bytes(CONFIG, CONFIG.context_length) == held


@pytest.mark.parametrize("batch_size", [1, 3])
def test_decode_step_flops_equal_the_products_the_model_performs(batch_size):
    """Reference: every matrix product of a real cached step, recorded by count_matmuls."""
    model = _model()
    cache_length = 7
    state = model.start(batch_size)
    ids = np.random.default_rng(1).integers(0, CONFIG.vocab_size, (batch_size, cache_length + 1))
    model.step(ids[:, :cache_length], state)
    with count_matmuls(model) as count:
        model.step(ids[:, cache_length:], state)
    assert decode_step_work(CONFIG, cache_length, batch_size).flops == count.matrix


def test_prefill_flops_equal_the_products_the_model_performs():
    model = _model()
    ids = np.random.default_rng(2).integers(0, CONFIG.vocab_size, (2, 9))
    with count_matmuls(model) as count:
        model.step(ids, model.start(2))
    assert prefill_work(CONFIG, 9, 2).flops == count.matrix


def test_decode_bytes_are_weights_plus_the_cache_the_model_holds():
    model = _model()
    state = model.start(2)
    ids = np.random.default_rng(3).integers(0, CONFIG.vocab_size, (2, 6))
    model.step(ids, state)  # 6 positions cached: the step reads 5 and writes the 6th
    cache = sum(
        a.nbytes for c in state.caches for a in (c.self_attention.keys, c.self_attention.values)
    )
    assert decode_step_work(CONFIG, 5, 2).nbytes == weight_bytes(CONFIG, 1) + cache


def test_decode_intensity_is_about_batch_over_itemsize_and_prefill_grows():
    big = DecoderOnlyConfig(
        vocab_size=64,
        d_model=256,
        n_heads=4,
        d_ff=1024,
        n_layers=2,
        context_length=256,
        dtype="float32",
    )
    one = decode_step_work(big, 16, 1).intensity
    assert 0.4 < one < 0.5  # 2 FLOPs per 4-byte weight, less the cache traffic
    assert decode_step_work(big, 16, 8).intensity > 6 * one
    assert prefill_work(big, 128).intensity > 100 * one


def test_work_rejects_bad_arguments():
    with pytest.raises(ValueError, match="m"):
        matmul_work(0, 2, 2)
    with pytest.raises(ValueError, match="divisible"):
        attention_work(4, 10, 3)
    with pytest.raises(TypeError, match="materialized"):
        attention_work(4, 8, 2, materialized=1)
    with pytest.raises(TypeError, match="DecoderOnlyConfig"):
        decode_step_work({"d_model": 4}, 2)
    with pytest.raises(ValueError, match="cache_length"):
        decode_step_work(CONFIG, CONFIG.context_length)
    with pytest.raises(ValueError, match="positions"):
        weight_bytes(CONFIG, CONFIG.context_length + 1)


def test_attainable_is_the_lower_of_the_two_roofs():
    peak, bandwidth = 100.0, 10.0
    i = np.array([0.5, 10.0, 50.0])
    np.testing.assert_allclose(attainable(i, peak, bandwidth), [5.0, 100.0, 100.0])
    assert attainable(peak / bandwidth, peak, bandwidth) == pytest.approx(peak)
    with pytest.raises(ValueError, match="intensity"):
        attainable(0.0, peak, bandwidth)
    with pytest.raises(ValueError, match="bandwidth"):
        attainable(1.0, peak, -1.0)
    with pytest.raises(TypeError, match="peak"):
        attainable(1.0, "fast", 1.0)


def test_kernels_do_the_work_they_count(rng):
    k = matmul_kernel(8, rng)
    assert k.work == matmul_work(8, 8, 8)
    assert np.isfinite(k.run()).all()
    c = copy_kernel(4096)
    c.run()
    assert c.work == Work(0, 2 * 4096)
    r = read_kernel(4 * 32 * 32, rng)
    assert r.work.nbytes == 4 * (32 * 32 + 64)
    assert r.run().shape == (32,)
    assert isinstance(k, Kernel)
    with pytest.raises(TypeError, match="rng"):
        matmul_kernel(8, 0)
    with pytest.raises(ValueError, match="nbytes"):
        copy_kernel(2)


def test_cache_sizes_reads_linux_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate(
        [
            ("1", "Data", "32K"),
            ("1", "Instruction", "32K"),
            ("2", "Unified", "512K"),
            ("3", "Unified", "32768K"),
        ]
    ):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert cache_sizes(tmp_path) == {"L1d": 32 * 2**10, "L2": 512 * 2**10, "L3": 32 * 2**20}
    assert cache_sizes(tmp_path / "missing") == {}
