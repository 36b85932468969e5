"""The encoder-only model: exact gradients, bidirectional context, padding, MLM loss, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.blocks import EncoderBlock
from tinyformer.checkpoint import load_checkpoint, save_checkpoint
from tinyformer.data.masking import MaskingScheme
from tinyformer.gradcheck import max_relative_error, numerical_gradient
from tinyformer.models.encoder_only import (
    EncoderOnlyConfig,
    EncoderOnlyMLM,
    trace_encoder_block,
)
from tinyformer.training.mlm import mlm_loss

TINY = {"d_model": 4, "n_heads": 2, "d_ff": 6, "n_layers": 2, "context_length": 6}


def tiny_model(seed: int = 0, **options) -> EncoderOnlyMLM:
    config = EncoderOnlyConfig(vocab_size=7, **{**TINY, **options})
    return EncoderOnlyMLM(config, rng=np.random.default_rng(seed))


def assert_all_gradients_exact(model, run, rng) -> None:
    """Finite differences of L = sum(logits * w) against backward, for every parameter."""
    weights = rng.standard_normal(run().shape)
    model.zero_grad()
    run()
    model.backward(weights)
    assert len(model.parameters()) > 0
    for name, p in model.named_parameters():
        error = max_relative_error(p.grad, numerical_gradient(lambda: run() * weights, p.value))
        assert error <= 1e-6, f"{name}: relative error {error:.2e}"
        assert np.any(p.grad != 0), f"{name} received no gradient"


OPTIONS = [
    pytest.param({}, id="pre-norm gelu learned tied"),
    pytest.param({"norm_first": False, "positional": "sinusoidal"}, id="post-norm sinusoidal"),
    pytest.param({"tie_output": False, "activation": "relu"}, id="untied relu"),
    pytest.param({"scale_embeddings": True, "pad_id": 0}, id="scaled, padded"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_gradients_match_finite_differences(options, rng):
    model = tiny_model(**options)
    ids = rng.integers(1, 7, (2, 5))
    ids[1, 3:] = 0  # padding in row 1 (hidden when pad_id=0)
    assert_all_gradients_exact(model, lambda: model.forward(ids), rng)


def test_mlm_loss_gradient_through_the_model(rng):
    model = tiny_model(seed=1)
    scheme = MaskingScheme(6, mask_id=6, select_prob=0.5)
    batch = scheme.corrupt(rng.integers(0, 6, (3, 6)), rng)
    assert batch.chosen.any()
    assert not batch.chosen.all()
    model.zero_grad()
    result = mlm_loss(model, batch)
    assert result.n_tokens == batch.chosen.sum()
    table = model.embedding.weight

    def loss() -> float:
        return mlm_loss(model, batch, backward=False).loss

    assert max_relative_error(table.grad, numerical_gradient(loss, table.value)) <= 1e-6


def test_every_position_sees_both_sides(rng):
    """Changing any one token changes the logits at every position (unlike a causal model)."""
    model = tiny_model(seed=2)
    ids = rng.integers(0, 7, (2, 6))
    before = model.forward(ids)
    for t in range(6):
        changed = ids.copy()
        changed[:, t] = (changed[:, t] + 1) % 7
        assert np.abs(model.forward(changed) - before).max(axis=-1).min() > 0


def test_padding_leaves_real_positions_unchanged(rng):
    model = tiny_model(seed=3, pad_id=0, context_length=8)
    rows = [rng.integers(1, 7, n) for n in (6, 3, 5)]
    ids = np.zeros((3, 8), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    batched = model.forward(ids)
    for i, row in enumerate(rows):
        alone = model.forward(row[None])
        np.testing.assert_allclose(batched[i, : len(row)], alone[0], rtol=0, atol=1e-12)
    unmasked = model.forward(ids, mask=np.ones((3, 1, 8), dtype=bool))
    assert np.abs(unmasked[1, :3] - batched[1, :3]).max() > 1e-3  # without the mask they leak


def test_explicit_mask_equals_the_default(rng):
    model = tiny_model(pad_id=0)
    ids = rng.integers(1, 7, (2, 5))
    ids[0, 4] = 0
    np.testing.assert_array_equal(model.forward(ids), model.forward(ids, mask=(ids != 0)[:, None]))


def test_trace_ends_at_the_block_output(rng):
    for norm_first in (False, True):
        block = EncoderBlock(8, 2, 12, rng=rng, norm_first=norm_first)
        x = rng.standard_normal((2, 5, 8))
        mask = np.ones((2, 1, 5), dtype=bool)
        mask[1, 0, 3:] = False
        steps = trace_encoder_block(block, x, mask)
        np.testing.assert_allclose(steps[-1][1], block.forward(x, mask), rtol=0, atol=1e-13)
        shapes = {name: a.shape for name, a in steps}
        assert shapes["attention weights"] == (2, 2, 5, 5)
        assert shapes["FFN first linear"] == (2, 5, 12)
        assert shapes["queries Q / sqrt(d_k), heads split"] == (2, 2, 5, 4)


def test_trace_refuses_dropout_in_training_mode(rng):
    block = EncoderBlock(8, 2, 12, rng=rng, dropout=0.1)
    with pytest.raises(ValueError, match=r"block.eval\(\)"):
        trace_encoder_block(block, np.zeros((1, 2, 8)))
    assert len(trace_encoder_block(block.eval(), np.zeros((1, 2, 8)))) > 10
    with pytest.raises(TypeError, match="block must be an EncoderBlock"):
        trace_encoder_block("block", np.zeros((1, 2, 8)))


def test_float32_in_float32_out(rng):
    model = tiny_model(dtype="float32")
    ids = rng.integers(0, 7, (2, 4))
    logits = model.forward(ids)
    assert logits.dtype == np.float32
    model.backward(np.ones_like(logits))
    assert all(p.grad.dtype == np.float32 for p in model.parameters())
    high = tiny_model().forward(ids)
    np.testing.assert_allclose(logits, high, rtol=0, atol=1e-5)


def test_checkpoint_round_trip(tmp_path, rng):
    model = tiny_model(seed=4, pad_id=0)
    path = save_checkpoint(tmp_path / "mlm.npz", model)
    twin = tiny_model(seed=5, pad_id=0)
    load_checkpoint(path, twin)
    ids = rng.integers(0, 7, (2, 5))
    np.testing.assert_array_equal(model.forward(ids), twin.forward(ids))
    assert EncoderOnlyConfig.from_dict(model.config.to_dict()) == model.config


def test_bad_input_is_refused_by_name(rng):
    model = tiny_model(pad_id=0)
    with pytest.raises(TypeError, match="ids must be an integer array"):
        model.forward(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"ids must be token ids in \[0, 7\), got 7"):
        model.forward(np.full((1, 3), 7))
    with pytest.raises(ValueError, match="longer than the model's context_length=6"):
        model.forward(np.ones((1, 7), dtype=np.int64))
    with pytest.raises(ValueError, match="hides every position"):
        model.forward(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        model.forward(np.ones((1, 3), dtype=np.int64), mask=np.ones((1, 1, 3)))
    with pytest.raises(ValueError, match=r"mask of shape \(1, 3, 3\) must broadcast"):
        model.forward(np.ones((1, 3), dtype=np.int64), mask=np.ones((1, 3, 3), dtype=bool))
    model.forward(np.ones((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="forward output's shape"):
        model.backward(np.ones((1, 3, 6)))
    with pytest.raises(
        TypeError, match=r"batch must be a tinyformer\.data\.masking\.MaskedTokens"
    ):
        mlm_loss(model, (np.ones((1, 3), dtype=np.int64),))
    with pytest.raises(TypeError, match="config must be an EncoderOnlyConfig"):
        EncoderOnlyMLM({"vocab_size": 7}, rng=rng)


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        ({"vocab_size": 0}, ValueError, "vocab_size must be a positive integer"),
        ({"pad_id": 9}, ValueError, "pad_id=9 must be below vocab_size=7"),
        ({"positional": "rotary"}, ValueError, "positional"),
        ({"d_model": 6, "n_heads": 4}, ValueError, "divisible"),
        ({"norm_first": 1}, TypeError, "norm_first must be True or False"),
    ],
)
def test_bad_configs_are_refused_by_name(fields, error, words):
    with pytest.raises(error) as info:
        EncoderOnlyConfig(**{"vocab_size": 7, **fields})
    assert words in str(info.value)
