"""The two ablation switches: an attention score scale, and models without positions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.attention import scaled_dot_product_attention
from tinyformer.gradcheck import check_module_gradients
from tinyformer.masks import causal_mask, padding_mask
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
)
from tinyformer.models.encoder_only import EncoderOnlyConfig, EncoderOnlyMLM
from tinyformer.multihead import MultiHeadAttention


def _layer(rng, d_model=8, n_heads=2, **kwargs):
    layer = MultiHeadAttention(d_model, n_heads, rng=rng, **kwargs)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.5
    return layer


# ------------------------------------------------------------ the score scale
def test_default_scale_is_one_over_sqrt_d_k(rng):
    assert _layer(rng, 12, 3).scale == pytest.approx(1 / math.sqrt(4))
    assert _layer(rng, 12, 3, scale=1.0).scale == 1.0


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_scaled_layer_equals_the_function_with_that_scale(rng, scale):
    layer = _layer(rng, 8, 2, bias=False, scale=scale)
    x = rng.standard_normal((2, 5, 8))
    out = layer.forward(x, mask=causal_mask(5))
    w_q, w_k, w_v = np.split(layer.w_qkv.value, 3, axis=1)

    def heads(w):  # (B, h, T, d_k)
        return (x @ w).reshape(2, 5, 2, 4).transpose(0, 2, 1, 3)

    o, _ = scaled_dot_product_attention(
        heads(w_q), heads(w_k), heads(w_v), causal_mask(5), scale=scale
    )
    expected = o.transpose(0, 2, 1, 3).reshape(2, 5, 8) @ layer.w_out.value
    np.testing.assert_allclose(out, expected, atol=1e-12)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_gradients_with_a_given_scale(rng, scale):
    layer = _layer(rng, 8, 2, scale=scale)
    x = rng.standard_normal((2, 4, 8))
    errors = check_module_gradients(layer, [x], rng=rng, kwargs={"mask": causal_mask(4)})
    assert max(errors.values()) < 1e-6, errors
    context = rng.standard_normal((2, 3, 8))
    cross = _layer(rng, 8, 2, scale=scale)
    ids = np.array([[5, 6, 0], [5, 6, 7]])
    errors = check_module_gradients(
        cross, [x, context], rng=rng, kwargs={"mask": padding_mask(ids, 0)}
    )
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize(
    ("scale", "error", "words"),
    [("big", TypeError, "scale must be a number or None"), (math.inf, ValueError, "finite")],
)
def test_bad_scale_is_named(rng, scale, error, words):
    with pytest.raises(error, match=words):
        MultiHeadAttention(8, 2, rng=rng, scale=scale)


def test_config_attention_scale_reaches_every_attention_layer(rng):
    base = {"src_vocab_size": 9, "tgt_vocab_size": 9, "d_model": 8, "n_heads": 2, "d_ff": 8}
    plain = EncoderDecoder(EncoderDecoderConfig(**base), rng=np.random.default_rng(0))
    raw = EncoderDecoder(
        EncoderDecoderConfig(**base, attention_scale="none"), rng=np.random.default_rng(0)
    )
    layers = [m for m in raw.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 2 + 2 * 2  # encoder self; decoder self and cross, two layers each
    assert all(m.scale == 1.0 for m in layers)
    assert all(
        m.scale == pytest.approx(0.5) for m in plain.modules() if isinstance(m, MultiHeadAttention)
    )
    src, tgt = rng.integers(4, 9, (2, 4)), rng.integers(4, 9, (2, 3))
    assert not np.allclose(plain.forward(src, tgt), raw.forward(src, tgt))
    assert EncoderDecoderConfig.from_dict(raw.config.to_dict()).attention_scale == "none"
    with pytest.raises(ValueError, match="attention_scale"):
        EncoderDecoderConfig(**base, attention_scale="sqrt_d")


# ------------------------------------------------------------ no positions
def _no_position_models():
    rng = np.random.default_rng(1)
    small = {"d_model": 8, "n_heads": 2, "d_ff": 8, "positional": "none", "dtype": "float64"}
    return [
        EncoderDecoder(
            EncoderDecoderConfig(src_vocab_size=9, tgt_vocab_size=9, n_encoder_layers=1,
                                 n_decoder_layers=1, **small),
            rng=rng,
        ),
        DecoderOnlyLM(DecoderOnlyConfig(vocab_size=9, n_layers=1, **small), rng=rng),
        EncoderOnlyMLM(EncoderOnlyConfig(vocab_size=9, n_layers=1, **small), rng=rng),
    ]  # fmt: skip


def test_positional_none_builds_no_position_layer():
    ed, lm, mlm = _no_position_models()
    assert ed.source_positions is None
    assert ed.target_positions is None
    assert lm.positions is None
    assert mlm.positions is None


@given(seed=st.integers(0, 2**32 - 1))
def test_without_positions_the_encoder_decoder_ignores_source_order(seed):
    """The memory is permuted with the source, and cross-attention sums over it: same logits."""
    rng = np.random.default_rng(seed)
    model = _no_position_models()[0]
    source = rng.integers(4, 9, (2, 5))
    target = rng.integers(4, 9, (2, 3))
    shuffled = source[:, rng.permutation(5)]
    np.testing.assert_allclose(
        model.forward(source, target), model.forward(shuffled, target), atol=1e-12
    )


@given(seed=st.integers(0, 2**32 - 1))
def test_without_positions_the_encoder_only_model_is_permutation_equivariant(seed):
    rng = np.random.default_rng(seed)
    model = _no_position_models()[2]
    ids = rng.integers(1, 9, (2, 6))
    perm = rng.permutation(6)
    np.testing.assert_allclose(
        model.forward(ids)[:, perm], model.forward(ids[:, perm]), atol=1e-12
    )


def test_with_positions_source_order_matters():
    rng = np.random.default_rng(2)
    config = EncoderDecoderConfig(
        src_vocab_size=9, tgt_vocab_size=9, d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
        n_decoder_layers=1, dtype="float64",
    )  # fmt: skip
    model = EncoderDecoder(config, rng=rng)
    source, target = np.array([[4, 5, 6, 7]]), np.array([[5, 6]])
    assert not np.allclose(model.forward(source, target), model.forward(source[:, ::-1], target))


def test_gradients_of_a_model_without_positions():
    model = _no_position_models()[1]
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 9, (2, 4))
    logits = model.forward(ids)
    grad = rng.standard_normal(logits.shape)
    model.zero_grad()
    model.backward(grad)
    p = model.embedding.weight
    analytic = p.grad.copy()
    eps, numeric = 1e-6, np.zeros_like(p.value)
    for index in zip(*np.nonzero(np.ones_like(p.value)), strict=True):
        old = p.value[index]
        p.value[index] = old + eps
        plus = np.sum(model.forward(ids) * grad)
        p.value[index] = old - eps
        minus = np.sum(model.forward(ids) * grad)
        p.value[index] = old
        numeric[index] = (plus - minus) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)


def test_unknown_positional_is_named():
    with pytest.raises(ValueError, match="positional"):
        DecoderOnlyConfig(vocab_size=9, positional="nothing")
