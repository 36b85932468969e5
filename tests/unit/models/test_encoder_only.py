"""The encoder-only model: gradients, bidirectional context, padding, independence, PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from reference_models import assert_same_logits_and_gradients, encoder_only_logits
from small_models import LLAMA, OPTIONS, SHIFTED_SCORES, encoder_only, perturb, raise_scores

from tinyformer.gradcheck import check_parameter_gradients
from tinyformer.layers import Linear, TiedOutputProjection
from tinyformer.models import EncoderOnlyConfig, EncoderOnlyMLM, parameter_count
from tinyformer.models.stack import TransformerStack

VOCAB, LIMIT, PAD = 9, 10, 0


def tiny(seed: int = 0, **options) -> EncoderOnlyMLM:
    sizes = {"d_model": 4, "n_heads": 2, "d_ff": 6, "vocab_size": 7, "context_length": 6}
    return encoder_only(seed, **{**sizes, **options})


# ------------------------------------------------------------------ gradients
GRADIENT_OPTIONS = {
    "pre-norm gelu learned tied": {},
    "post-norm sinusoidal untied relu, scaled embeddings, padded": {
        "norm_first": False,
        "positional": "sinusoidal",
        "tie_output": False,
        "activation": "relu",
        "scale_embeddings": True,
        "pad_id": PAD,
    },
    "post-norm rmsnorm, gated, no bias, rotary, unscaled, padded": {
        **OPTIONS["post-norm llama, unscaled"],
        "pad_id": PAD,
    },
    "llama, padded": {**LLAMA, "pad_id": PAD},
}
"""The first is a quick check of the default layout; the others are marked ``slow``."""


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(options, id=name, marks=[pytest.mark.slow] if i else [])
        for i, (name, options) in enumerate(GRADIENT_OPTIONS.items())
    ],
)
def test_gradients_match_finite_differences(options):
    model = perturb(tiny(**options), 1)
    rng = np.random.default_rng(2)
    ids = rng.integers(1, 7, (2, 5))
    ids[1, 3:] = PAD  # padding in row 1 (hidden when pad_id=0)
    upstream = rng.standard_normal((2, 5, 7))
    errors = check_parameter_gradients(model, lambda: (model.forward(ids) * upstream, upstream))
    assert len(errors) == len(model.parameters()) > 0
    assert max(errors.values()) < 1e-6, {k: v for k, v in errors.items() if v >= 1e-6}
    for name, p in model.named_parameters():
        if not name.endswith("k_proj.bias"):  # softmax ignores a shift shared by all keys
            assert np.any(p.grad != 0), f"{name} received no gradient"


# ----------------------------------------------------------------- context
def test_every_position_sees_both_sides():
    """Changing any one token changes the logits at every position (unlike a causal model)."""
    model = tiny(seed=2)
    ids = np.random.default_rng(3).integers(0, 7, (2, 6))
    before = model.forward(ids)
    for t in range(6):
        changed = ids.copy()
        changed[:, t] = (changed[:, t] + 1) % 7
        assert np.abs(model.forward(changed) - before).max(axis=-1).min() > 0


def test_padding_leaves_real_positions_as_they_are_alone():
    model = tiny(seed=3, pad_id=PAD, context_length=8)
    rng = np.random.default_rng(4)
    rows = [rng.integers(1, 7, n) for n in (6, 3, 5)]
    ids = np.zeros((3, 8), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    batched = model.forward(ids)
    for i, row in enumerate(rows):
        alone = model.forward(row[None])  # shorter arrays: another order of sums
        np.testing.assert_allclose(batched[i, : len(row)], alone[0], rtol=0, atol=1e-12)
    unmasked = model.forward(ids, mask=np.ones((3, 1, 8), dtype=bool))
    assert np.abs(unmasked[1, :3] - batched[1, :3]).max() > 1e-3  # without the mask they leak


def test_explicit_mask_equals_the_default():
    model = tiny(pad_id=PAD)
    ids = np.random.default_rng(5).integers(1, 7, (2, 5))
    ids[0, 4] = PAD
    np.testing.assert_array_equal(
        model.forward(ids), model.forward(ids, mask=(ids != PAD)[:, None])
    )
    assert model.key_mask(np.ones((2, 5), dtype=np.int64))[1] is None  # nothing to hide


@settings(max_examples=40)
@given(data=st.data())
def test_each_sequence_of_a_batch_is_bitwise_independent_of_the_others(data):
    n_heads = data.draw(st.integers(1, 3), label="n_heads")
    d_k = data.draw(st.sampled_from([2, 4] if n_heads > 1 else [4]), label="d_k")
    name = data.draw(st.sampled_from(sorted(OPTIONS)), label="options")
    dtype = data.draw(st.sampled_from(["float32", "float64"]), label="dtype")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    model = encoder_only(
        seed,
        n_layers=data.draw(st.integers(1, 2)),
        pad_id=PAD,
        **{**OPTIONS[name], "d_model": n_heads * d_k, "n_heads": n_heads, "dtype": dtype},
    )
    perturb(model, seed).eval()
    if data.draw(st.booleans(), label="large scores"):  # where softmax must shift its rows
        raise_scores(model, SHIFTED_SCORES[dtype])
    b, t = data.draw(st.integers(2, 4), label="batch"), data.draw(st.integers(1, LIMIT))
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (b, t))
    for i in range(b):
        ids[i, rng.integers(1, t + 1) :] = PAD
    row = data.draw(st.integers(0, b - 1), label="row")
    changed = ids.copy()
    changed[row] = np.where(ids[row] == PAD, PAD, ids[row] % (VOCAB - 1) + 1)
    before, after = model.forward(ids), model.forward(changed)
    others = np.arange(b) != row
    assert np.array_equal(after[others], before[others])
    assert not np.array_equal(after[row], before[row])


@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1))
def test_without_positions_the_model_is_permutation_equivariant(seed):
    model = encoder_only(1, n_layers=1, positional="none")
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (2, 6))
    perm = rng.permutation(6)
    # a permutation that only swaps equal ids changes nothing, with positions or without
    assume(not np.array_equal(ids[:, perm], ids))
    np.testing.assert_allclose(
        model.forward(ids)[:, perm], model.forward(ids[:, perm]), rtol=0, atol=1e-12
    )
    with_positions = encoder_only(1, n_layers=1)
    assert not np.allclose(
        with_positions.forward(ids)[:, perm], with_positions.forward(ids[:, perm])
    )


# ------------------------------------------------------------ the parts
def test_layout_and_attributes():
    model = tiny()
    assert (model.vocab_size, model.context_length, model.dtype) == (7, 6, np.dtype(np.float64))
    assert model.family == "encoder-only"
    assert isinstance(model.encoder, TransformerStack)
    assert not model.encoder.cross_attention
    assert isinstance(model.output, TiedOutputProjection)
    names = [name for name, _ in model.named_parameters()]
    assert names[:2] == ["encoder.embedding.weight", "encoder.positions.weight"]
    assert "encoder.layers.1.self_attention.layer.v_proj.weight" in names
    untied = tiny(tie_output=False)
    assert isinstance(untied.output, Linear)
    assert untied.output.bias is None
    assert not hasattr(model, "start")  # an encoder-only model does not generate
    assert model.num_parameters() == parameter_count(model.config)


def test_float32_in_float32_out_and_close_to_float64():
    model = tiny(dtype="float32")
    ids = np.random.default_rng(6).integers(0, 7, (2, 4))
    logits = model.forward(ids)
    assert logits.dtype == np.float32
    model.backward(np.ones_like(logits))
    assert all(p.grad.dtype == np.float32 for p in model.parameters())
    np.testing.assert_allclose(logits, tiny().forward(ids), rtol=0, atol=1e-5)


def test_bad_input_is_refused_by_name():
    model = tiny(pad_id=PAD)
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
    with pytest.raises(ValueError, match=r"mask of shape \(1, 3, 3\) does not broadcast"):
        model.forward(np.ones((1, 3), dtype=np.int64), mask=np.ones((1, 3, 3), dtype=bool))
    model.forward(np.ones((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="forward output's shape"):
        model.backward(np.ones((1, 3, 6)))
    with pytest.raises(TypeError, match="config must be an EncoderOnlyConfig"):
        EncoderOnlyMLM({"vocab_size": 7}, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        EncoderOnlyMLM(EncoderOnlyConfig(7), rng=None)


# ----------------------------------------------------------------- PyTorch
@pytest.mark.reference
@pytest.mark.parametrize(
    "options",
    [
        {"pad_id": PAD},
        {
            "norm_first": False,
            "positional": "sinusoidal",
            "tie_output": False,
            "activation": "relu",
        },
        {
            "norm": "rmsnorm",
            "feed_forward": "gated",
            "activation": "silu",
            "bias": False,
            "pad_id": PAD,
            "attention_scale": "none",
        },
    ],
    ids=["pre-norm learned padded", "post-norm sinusoidal untied", "rmsnorm swiglu unscaled"],
)
def test_logits_and_gradients_match_pytorch(torch, options):
    model = perturb(encoder_only(19, vocab_size=11, context_length=8, **options), 20)
    rng = np.random.default_rng(21)
    ids = rng.integers(1, 11, (3, 8))
    ids[1, 5:] = PAD
    ours = model.forward(ids)
    theirs, pairs = encoder_only_logits(torch, model, ids)
    assert_same_logits_and_gradients(torch, model, ours, theirs, pairs, rng)
