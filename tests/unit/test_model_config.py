"""Model configurations: defaults, JSON round trips, and every bad field refused by name."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tinyformer.models import DecoderOnlyConfig, EncoderDecoderConfig

ED = {"src_vocab_size": 10, "tgt_vocab_size": 10}
LM = {"vocab_size": 10}


def test_defaults_match_the_interface():
    ed = EncoderDecoderConfig(**ED)
    assert (ed.d_model, ed.n_heads, ed.d_ff, ed.n_encoder_layers, ed.n_decoder_layers) == (
        64,
        4,
        256,
        2,
        2,
    )
    assert (ed.context_length, ed.dropout, ed.norm_first, ed.activation, ed.positional) == (
        64,
        0.0,
        False,
        "relu",
        "sinusoidal",
    )
    assert (ed.share_embeddings, ed.tie_output, ed.scale_embeddings, ed.pad_id, ed.dtype) == (
        False,
        True,
        True,
        0,
        "float64",
    )
    lm = DecoderOnlyConfig(**LM)
    assert (lm.d_model, lm.n_heads, lm.d_ff, lm.n_layers, lm.context_length) == (64, 4, 256, 2, 64)
    assert (lm.norm_first, lm.activation, lm.positional, lm.tie_output) == (
        True,
        "gelu",
        "learned",
        True,
    )
    assert (lm.scale_embeddings, lm.dtype, lm.dropout) == (False, "float64", 0.0)


@pytest.mark.parametrize(
    "config",
    [
        EncoderDecoderConfig(
            src_vocab_size=12,
            tgt_vocab_size=12,
            d_model=32,
            dropout=0.1,
            norm_first=True,
            positional="learned",
            share_embeddings=True,
            tie_output=False,
            pad_id=3,
            dtype="float32",
        ),
        DecoderOnlyConfig(vocab_size=50, n_layers=3, positional="rotary", activation="silu"),
    ],
)
def test_json_round_trip(config):
    text = json.dumps(config.to_dict())
    again = type(config).from_dict(json.loads(text))
    assert again == config
    assert again.to_dict() == config.to_dict()


def test_numpy_integers_are_stored_as_python_ints():
    config = DecoderOnlyConfig(
        vocab_size=np.int64(10), d_model=np.int32(32), dropout=np.float64(0.5)
    )
    assert type(config.vocab_size) is int
    assert type(config.d_model) is int
    assert type(config.dropout) is float
    json.dumps(config.to_dict())


def test_configs_are_frozen():
    config = DecoderOnlyConfig(**LM)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 32  # type: ignore[misc]


def test_from_dict_refuses_unknown_and_missing_fields():
    data = EncoderDecoderConfig(**ED).to_dict()
    with pytest.raises(
        ValueError, match=r"unknown field\(s\) \['n_layers'\] for EncoderDecoderConfig"
    ):
        EncoderDecoderConfig.from_dict({**data, "n_layers": 2})
    del data["tgt_vocab_size"]
    with pytest.raises(ValueError, match=r"missing required field\(s\) \['tgt_vocab_size'\]"):
        EncoderDecoderConfig.from_dict(data)
    with pytest.raises(ValueError, match=r"missing required field\(s\) \['vocab_size'\]"):
        DecoderOnlyConfig.from_dict({"d_model": 32})
    with pytest.raises(TypeError, match="d must be a mapping"):
        DecoderOnlyConfig.from_dict([("vocab_size", 3)])
    with pytest.raises(ValueError, match="d_model=30 must be divisible by n_heads=4"):
        DecoderOnlyConfig.from_dict({"vocab_size": 3, "d_model": 30})
    # Defaults fill in what a dict leaves out.
    assert DecoderOnlyConfig.from_dict({"vocab_size": 3}) == DecoderOnlyConfig(vocab_size=3)


def test_numpy_dtypes_are_accepted_and_stored_by_name():
    for dtype in (np.float32, np.dtype("float32"), "float32"):
        assert DecoderOnlyConfig(vocab_size=3, dtype=dtype).dtype == "float32"
        assert EncoderDecoderConfig(**{**ED, "dtype": dtype}).dtype == "float32"
    assert DecoderOnlyConfig(vocab_size=3, dtype=np.float64) == DecoderOnlyConfig(vocab_size=3)


COMMON_BAD = [
    ("d_model", 0, ValueError, "d_model must be a positive integer, got 0"),
    ("d_model", 2.0, TypeError, "d_model must be a positive integer"),
    ("n_heads", -1, ValueError, "n_heads must be a positive integer"),
    ("n_heads", 3, ValueError, "d_model=64 must be divisible by n_heads=3"),
    ("d_ff", True, TypeError, "d_ff must be a positive integer"),
    ("dropout", 1.0, ValueError, r"dropout must be in \[0, 1\), got 1.0"),
    ("dropout", -0.1, ValueError, "dropout must be in"),
    ("dropout", "0.1", TypeError, "dropout must be a number"),
    ("activation", "tanh", ValueError, "activation must be one of 'relu', 'gelu'"),
    ("dtype", "float16", ValueError, "dtype must be one of 'float32', 'float64', got 'float16'"),
    ("dtype", np.float16, ValueError, "dtype must be one of"),
    ("dtype", object(), ValueError, "dtype must be one of"),
    ("norm_first", 1, TypeError, "norm_first must be True or False"),
    ("tie_output", None, TypeError, "tie_output must be True or False"),
    ("scale_embeddings", "yes", TypeError, "scale_embeddings must be True or False"),
]

ENCODER_DECODER_BAD = [
    *COMMON_BAD,
    ("src_vocab_size", 0, ValueError, "src_vocab_size must be a positive integer"),
    ("tgt_vocab_size", 1.5, TypeError, "tgt_vocab_size must be a positive integer"),
    ("n_encoder_layers", 0, ValueError, "n_encoder_layers must be a positive integer"),
    ("n_decoder_layers", -2, ValueError, "n_decoder_layers must be a positive integer"),
    ("context_length", 0, ValueError, "context_length must be a positive integer"),
    ("positional", "rotary", ValueError, "positional must be one of 'sinusoidal', 'learned'"),
    ("pad_id", -1, ValueError, "pad_id must be a non-negative integer"),
    ("pad_id", 10, ValueError, "pad_id=10 must be below both src_vocab_size=10"),
    ("share_embeddings", 0, TypeError, "share_embeddings must be True or False"),
]

DECODER_ONLY_BAD = [
    *COMMON_BAD,
    ("vocab_size", 0, ValueError, "vocab_size must be a positive integer"),
    ("n_layers", 0, ValueError, "n_layers must be a positive integer"),
    ("context_length", -5, ValueError, "context_length must be a positive integer"),
    (
        "positional",
        "alibi",
        ValueError,
        "positional must be one of 'learned', 'sinusoidal', 'rotary'",
    ),
]


@pytest.mark.parametrize(("field", "value", "error", "message"), ENCODER_DECODER_BAD)
def test_encoder_decoder_config_refuses_bad_fields(field, value, error, message):
    with pytest.raises(error, match=message):
        EncoderDecoderConfig(**{**ED, field: value})


@pytest.mark.parametrize(("field", "value", "error", "message"), DECODER_ONLY_BAD)
def test_decoder_only_config_refuses_bad_fields(field, value, error, message):
    with pytest.raises(error, match=message):
        DecoderOnlyConfig(**{**LM, field: value})


def test_combinations_of_fields_are_checked():
    with pytest.raises(
        ValueError, match="share_embeddings=True needs src_vocab_size == tgt_vocab"
    ):
        EncoderDecoderConfig(src_vocab_size=10, tgt_vocab_size=11, share_embeddings=True)
    with pytest.raises(ValueError, match=r"pad_id=10 must be below both .* tgt_vocab_size=10"):
        EncoderDecoderConfig(src_vocab_size=20, tgt_vocab_size=10, pad_id=10)
    with pytest.raises(ValueError, match=r"positional='rotary' needs an even head size .* = 3"):
        DecoderOnlyConfig(vocab_size=5, d_model=12, n_heads=4, positional="rotary")
    with pytest.raises(ValueError, match="positional='sinusoidal' needs an even d_model"):
        DecoderOnlyConfig(vocab_size=5, d_model=9, n_heads=3, positional="sinusoidal")
    with pytest.raises(
        ValueError, match=r"needs an even d_model \(sine and cosine pairs\), got d_model=15"
    ):
        EncoderDecoderConfig(**ED, d_model=15, n_heads=3)
    # Odd widths are fine where nothing pairs dimensions up.
    assert DecoderOnlyConfig(vocab_size=5, d_model=9, n_heads=3).d_model == 9
    assert DecoderOnlyConfig(vocab_size=5, d_model=12, n_heads=3, positional="rotary")
    assert EncoderDecoderConfig(**ED, d_model=15, n_heads=3, positional="learned")
