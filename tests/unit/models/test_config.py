"""Model configurations: defaults, every field checked when made, JSON round trips, old dicts.

One base, ``TransformerConfig``, holds the options every family's blocks are built
from; ``EncoderDecoderConfig``, ``DecoderOnlyConfig`` and ``EncoderOnlyConfig`` add
their vocabularies and layer counts. ``max_len``, the encoder-decoder's and
encoder-only model's old name for ``context_length``, keeps working until 0.2.0 with
one ``DeprecationWarning``; dicts that store it (old checkpoints) load silently, and
dicts written before a field existed load with its default.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle
import warnings

import numpy as np
import pytest
from small_models import LLAMA, OPTIONS

from tinyformer.models import (
    DecoderOnlyConfig,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    TransformerConfig,
)
from tinyformer.models.config import REMOVED_IN

ED = {"src_vocab_size": 10, "tgt_vocab_size": 10}
LM = {"vocab_size": 10}
CLASSES = {
    "encoder-decoder": (EncoderDecoderConfig, ED),
    "decoder-only": (DecoderOnlyConfig, LM),
    "encoder-only": (EncoderOnlyConfig, LM),
}
FAMILIES = [pytest.param(cls, required, id=name) for name, (cls, required) in CLASSES.items()]
NEW_FIELDS = {
    "norm": "rmsnorm",
    "norm_eps": 1e-6,
    "feed_forward": "gated",
    "bias": False,
    "attention_scale": "none",
    "positional": "rotary",
}
"""The options issue 24 opened to every family, each at a value other than its default."""


# ------------------------------------------------------------------ defaults
def test_defaults_of_each_family():
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
    mlm = EncoderOnlyConfig(**LM)
    assert (mlm.n_layers, mlm.norm_first, mlm.activation, mlm.positional, mlm.pad_id) == (
        2,
        True,
        "gelu",
        "learned",
        None,
    )


@pytest.mark.parametrize(("cls", "required"), FAMILIES)
def test_the_new_fields_default_to_what_every_model_did_before_them(cls, required):
    config = cls(**required)
    assert (config.norm, config.norm_eps, config.feed_forward) == ("layernorm", 1e-5, "plain")
    assert (config.bias, config.attention_scale) == (True, "sqrt")
    assert config.score_scale is None  # None: every attention layer's 1 / sqrt(d_k)
    assert cls(**required, attention_scale="none").score_scale == 1.0


@pytest.mark.parametrize(("cls", "required"), FAMILIES)
def test_every_family_is_a_transformer_config_with_the_same_options(cls, required):
    assert issubclass(cls, TransformerConfig)
    shared = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert shared <= {f.name for f in dataclasses.fields(cls)}
    assert set(NEW_FIELDS) <= shared
    config = cls(**required, d_model=12, n_heads=3)
    assert config.d_k == 4


def test_the_vocabularies_are_the_only_positional_arguments():
    assert EncoderDecoderConfig(7, 8).tgt_vocab_size == 8
    assert DecoderOnlyConfig(7).vocab_size == 7
    assert EncoderOnlyConfig(7).vocab_size == 7
    with pytest.raises(TypeError):
        DecoderOnlyConfig(7, 32)  # d_model is a keyword


# ------------------------------------------------------------- round trips
ROUND_TRIPS = [
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
    *(cls(**required, **NEW_FIELDS) for cls, required in CLASSES.values()),
    *(
        cls(**required, **options)
        for cls, required in CLASSES.values()
        for options in OPTIONS.values()
    ),
]


@pytest.mark.parametrize("config", ROUND_TRIPS, ids=lambda c: type(c).__name__)
def test_json_round_trip_keeps_every_field(config):
    text = json.dumps(config.to_dict())
    again = type(config).from_dict(json.loads(text))
    assert again == config
    assert again.to_dict() == config.to_dict()
    for name in NEW_FIELDS:
        assert getattr(again, name) == getattr(config, name), name


@pytest.mark.parametrize(("cls", "required"), FAMILIES)
def test_every_new_field_survives_the_round_trip_on_its_own(cls, required):
    for name, value in NEW_FIELDS.items():
        config = cls(**required, **{name: value})
        assert getattr(cls.from_dict(config.to_dict()), name) == value, name
        assert cls.from_dict(config.to_dict()) != cls(**required), name


def test_numpy_numbers_are_stored_as_python_numbers():
    config = DecoderOnlyConfig(
        vocab_size=np.int64(10),
        d_model=np.int32(32),
        dropout=np.float64(0.5),
        norm_eps=np.float32(1e-6),
    )
    assert type(config.vocab_size) is int
    assert type(config.d_model) is int
    assert type(config.dropout) is float
    assert type(config.norm_eps) is float
    json.dumps(config.to_dict())


def test_configs_are_frozen():
    config = DecoderOnlyConfig(**LM)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 32  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.norm = "rmsnorm"  # type: ignore[misc]


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
    with pytest.raises(ValueError, match="norm must be one of 'layernorm', 'rmsnorm'"):
        DecoderOnlyConfig.from_dict({"vocab_size": 3, "norm": "scalenorm"})


def test_numpy_dtypes_are_accepted_and_stored_by_name():
    for dtype in (np.float32, np.dtype("float32"), "float32"):
        assert DecoderOnlyConfig(vocab_size=3, dtype=dtype).dtype == "float32"
        assert EncoderDecoderConfig(**{**ED, "dtype": dtype}).dtype == "float32"
        assert EncoderOnlyConfig(vocab_size=3, dtype=dtype).dtype == "float32"
    assert DecoderOnlyConfig(vocab_size=3, dtype=np.float64) == DecoderOnlyConfig(vocab_size=3)


# ------------------------------------------------------------- old dicts
# What tinyformer wrote before issue 24 (the configurations of the version 1 checkpoints
# in tests/unit/fixtures): no norm, norm_eps, feed_forward or bias; attention_scale only
# for the encoder-decoder.
OLD_DICTS = [
    pytest.param(
        EncoderDecoderConfig,
        {
            "src_vocab_size": 9, "tgt_vocab_size": 9, "d_model": 8, "n_heads": 2, "d_ff": 16,
            "n_encoder_layers": 2, "n_decoder_layers": 2, "context_length": 8, "dropout": 0.0,
            "norm_first": False, "activation": "relu", "positional": "sinusoidal",
            "attention_scale": "sqrt", "share_embeddings": False, "tie_output": True,
            "scale_embeddings": True, "pad_id": 0, "dtype": "float64",
        },
        id="encoder-decoder",
    ),
    pytest.param(
        DecoderOnlyConfig,
        {
            "vocab_size": 9, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 2,
            "context_length": 8, "dropout": 0.0, "norm_first": True, "activation": "gelu",
            "positional": "learned", "tie_output": False, "scale_embeddings": False,
            "dtype": "float64",
        },
        id="decoder-only",
    ),
    pytest.param(
        EncoderOnlyConfig,
        {
            "vocab_size": 9, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 2,
            "context_length": 8, "dropout": 0.0, "norm_first": False, "activation": "gelu",
            "positional": "learned", "tie_output": True, "scale_embeddings": False,
            "pad_id": None, "dtype": "float64",
        },
        id="encoder-only",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "old"), OLD_DICTS)
def test_a_dict_written_before_the_new_fields_loads_with_their_defaults(cls, old):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = cls.from_dict(old)
    assert (config.norm, config.norm_eps, config.feed_forward, config.bias) == (
        "layernorm",
        1e-5,
        "plain",
        True,
    )
    assert config.attention_scale == "sqrt"
    for name, value in old.items():
        assert getattr(config, name) == value, name
    assert config == cls(**old)


@pytest.mark.parametrize(("cls", "old"), [p for p in OLD_DICTS if p.id != "decoder-only"])  # type: ignore[union-attr]
def test_an_old_dict_with_max_len_loads_silently(cls, old):
    with_old_name = {("max_len" if k == "context_length" else k): v for k, v in old.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cls.from_dict(with_old_name) == cls.from_dict(old)
    assert cls.from_dict(with_old_name).context_length == 8


# ------------------------------------------------------------- bad fields
COMMON_BAD = [
    ("d_model", 0, ValueError, "d_model must be a positive integer, got 0"),
    ("d_model", 2.0, TypeError, "d_model must be a positive integer"),
    ("n_heads", -1, ValueError, "n_heads must be a positive integer"),
    ("n_heads", 3, ValueError, "d_model=64 must be divisible by n_heads=3"),
    ("d_ff", True, TypeError, "d_ff must be a positive integer"),
    ("context_length", 0, ValueError, "context_length must be a positive integer"),
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
    (
        "positional",
        "alibi",
        ValueError,
        "positional must be one of 'learned', 'sinusoidal', 'rotary', 'none', got 'alibi'",
    ),
    # the fields every family has had since issue 24
    (
        "norm",
        "batchnorm",
        ValueError,
        "norm must be one of 'layernorm', 'rmsnorm', got 'batchnorm'",
    ),
    ("norm", None, ValueError, "norm must be one of 'layernorm', 'rmsnorm', got None"),
    ("norm_eps", 0, ValueError, "norm_eps must be a finite positive number, got 0"),
    ("norm_eps", -1e-5, ValueError, "norm_eps must be a finite positive number"),
    ("norm_eps", float("nan"), ValueError, "norm_eps must be a finite positive number, got nan"),
    ("norm_eps", "1e-5", TypeError, "norm_eps must be a positive number, got str"),
    (
        "feed_forward",
        "experts",
        ValueError,
        "feed_forward must be one of 'plain', 'gated', 'moe', got 'experts'",
    ),
    ("feed_forward", True, ValueError, "feed_forward must be one of 'plain', 'gated', 'moe'"),
    ("feed_forward", "moe", ValueError, "n_experts is required with feed_forward='moe', got None"),
    ("n_experts", 4, ValueError, "n_experts must be None unless feed_forward='moe', got n_exp"),
    ("experts_per_token", 0, ValueError, "experts_per_token must be a positive integer"),
    ("experts_per_token", 1.0, TypeError, "experts_per_token must be a positive integer"),
    ("expert_feed_forward", "moe", ValueError, "expert_feed_forward must be one of 'gated', 'p"),
    ("expert_capacity_factor", 0, ValueError, "expert_capacity_factor must be a finite positiv"),
    ("expert_capacity_factor", "1", TypeError, "expert_capacity_factor must be a positive numb"),
    ("router_aux_loss_weight", -0.1, ValueError, "router_aux_loss_weight must be a finite non-"),
    ("router_aux_loss_weight", None, TypeError, "router_aux_loss_weight must be a non-negative"),
    ("rotary_scaling", "yarn", ValueError, "rotary_scaling must be one of 'linear', 'ntk'"),
    ("rotary_scaling", "ntk", ValueError, "rotary_scaling='ntk' needs positional='rotary', got"),
    ("rotary_scaling_factor", 2.0, ValueError, "must be 1.0 when rotary_scaling is None, got 2"),
    ("rotary_scaling_factor", 0, ValueError, "rotary_scaling_factor must be a finite positive"),
    ("rotary_scaling_factor", "2", TypeError, "rotary_scaling_factor must be a positive number"),
    ("bias", 1, TypeError, "bias must be True or False, got int 1"),
    ("bias", "no", TypeError, "bias must be True or False"),
    ("attention_scale", "sqrt_d", ValueError, "attention_scale must be one of 'sqrt', 'none'"),
    ("attention_scale", 0.5, ValueError, "attention_scale must be one of 'sqrt', 'none'"),
]

FAMILY_BAD = {
    "encoder-decoder": [
        ("src_vocab_size", 0, ValueError, "src_vocab_size must be a positive integer"),
        ("tgt_vocab_size", 1.5, TypeError, "tgt_vocab_size must be a positive integer"),
        ("n_encoder_layers", 0, ValueError, "n_encoder_layers must be a positive integer"),
        ("n_decoder_layers", -2, ValueError, "n_decoder_layers must be a positive integer"),
        ("pad_id", -1, ValueError, "pad_id must be a non-negative integer"),
        ("pad_id", None, TypeError, "pad_id must be a non-negative integer, got None"),
        ("pad_id", 10, ValueError, "pad_id=10 must be below both src_vocab_size=10"),
        ("share_embeddings", 0, TypeError, "share_embeddings must be True or False"),
    ],
    "decoder-only": [
        ("vocab_size", 0, ValueError, "vocab_size must be a positive integer"),
        ("n_layers", 0, ValueError, "n_layers must be a positive integer"),
    ],
    "encoder-only": [
        ("vocab_size", 0, ValueError, "vocab_size must be a positive integer"),
        ("n_layers", 2.0, TypeError, "n_layers must be a positive integer"),
        ("pad_id", 10, ValueError, "pad_id=10 must be below vocab_size=10"),
        ("pad_id", -3, ValueError, "pad_id must be a non-negative integer"),
    ],
}

BAD = [
    pytest.param(cls, required, *case, id=f"{name}-{case[0]}-{i}")
    for name, (cls, required) in CLASSES.items()
    for i, case in enumerate([*COMMON_BAD, *FAMILY_BAD[name]])
]


@pytest.mark.parametrize(("cls", "required", "field", "value", "error", "message"), BAD)
def test_every_field_is_checked_when_made_and_refused_by_name(
    cls, required, field, value, error, message
):
    with pytest.raises(error, match=message):
        cls(**{**required, field: value})
    with pytest.raises(error, match=message):  # from a dict (a checkpoint) alike
        cls.from_dict({**cls(**required).to_dict(), field: value})


@pytest.mark.parametrize(("cls", "required"), FAMILIES)
def test_rotary_scaling_combinations_are_checked_in_every_family(cls, required):
    rotary = {**required, "positional": "rotary", "rotary_scaling_factor": 4.0}
    linear = cls(**rotary, rotary_scaling="linear")
    assert (linear.rotary_interpolation, linear.rotary_frequency_base) == (4.0, 10000.0)
    assert cls.from_dict(linear.to_dict()) == linear
    with pytest.raises(ValueError, match="rotary_scaling='ntk' needs a head size d_k >= 4, got 2"):
        cls(**rotary, rotary_scaling="ntk", d_model=4, n_heads=2)
    config = cls(**rotary, rotary_scaling="ntk")
    assert config.rotary_interpolation == 1.0
    assert config.rotary_frequency_base == 10000.0 * 4.0 ** (config.d_k / (config.d_k - 2))
    assert cls.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(("cls", "required"), FAMILIES)
def test_combinations_of_fields_are_checked_in_every_family(cls, required):
    with pytest.raises(ValueError, match=r"positional='rotary' needs an even head size .* = 3"):
        cls(**required, d_model=12, n_heads=4, positional="rotary")
    with pytest.raises(
        ValueError, match=r"needs an even d_model \(sine and cosine pairs\), got d_model=15"
    ):
        cls(**required, d_model=15, n_heads=3, positional="sinusoidal")
    # odd widths are fine where nothing pairs dimensions up
    assert cls(**required, d_model=9, n_heads=3, positional="learned").d_model == 9
    assert cls(**required, d_model=12, n_heads=3, positional="rotary").d_k == 4


def test_encoder_decoder_combinations_are_checked():
    with pytest.raises(
        ValueError, match="share_embeddings=True needs src_vocab_size == tgt_vocab"
    ):
        EncoderDecoderConfig(src_vocab_size=10, tgt_vocab_size=11, share_embeddings=True)
    with pytest.raises(ValueError, match=r"pad_id=10 must be below both .* tgt_vocab_size=10"):
        EncoderDecoderConfig(src_vocab_size=20, tgt_vocab_size=10, pad_id=10)


@pytest.mark.parametrize(("cls", "required"), FAMILIES)
def test_every_option_is_accepted_by_every_family(cls, required):
    for name, options in OPTIONS.items():
        config = cls(**required, **options)
        for field, value in options.items():
            assert getattr(config, field) == value, name
    assert cls(**required, **LLAMA).norm == "rmsnorm"


# --------------------------------------------------- max_len, the old name
OLD_NAME = r"max_len is deprecated and will be removed in tinyformer 0\.2\.0; use context_length"
RENAMED = [
    pytest.param(EncoderDecoderConfig, {"src_vocab_size": 7, "tgt_vocab_size": 7}, id="ed"),
    pytest.param(EncoderOnlyConfig, {"vocab_size": 7}, id="encoder-only"),
]
SMALL = {"d_model": 8, "n_heads": 2, "d_ff": 16}


def test_every_model_config_names_the_longest_sequence_context_length():
    for cls in (EncoderDecoderConfig, EncoderOnlyConfig, DecoderOnlyConfig):
        names = {f.name for f in dataclasses.fields(cls)}
        assert "context_length" in names
        assert "max_len" not in names
    assert REMOVED_IN == "0.2.0"


@pytest.mark.parametrize(("cls", "required"), RENAMED)
def test_the_old_keyword_warns_once_and_builds_the_same_config(cls, required):
    new = cls(**required, **SMALL, context_length=8)
    with pytest.warns(DeprecationWarning, match=OLD_NAME) as caught:
        old = cls(**required, **SMALL, max_len=8)
    assert len(caught) == 1
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert old == new
    assert hash(old) == hash(new)
    assert repr(old) == repr(new)
    assert "max_len" not in repr(old)
    assert old.to_dict() == new.to_dict()
    assert "max_len" not in old.to_dict()


def test_the_decoder_only_config_never_had_max_len():
    with pytest.raises(TypeError, match="max_len"):
        DecoderOnlyConfig(vocab_size=7, max_len=8)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['max_len'\]"):
        DecoderOnlyConfig.from_dict({"vocab_size": 7, "max_len": 8})


@pytest.mark.parametrize(("cls", "required"), RENAMED)
def test_reading_the_old_attribute_warns_and_returns_context_length(cls, required):
    config = cls(**required, context_length=9)
    with pytest.warns(DeprecationWarning, match=OLD_NAME) as caught:
        value = config.max_len
    assert value == 9
    assert len(caught) == 1
    assert caught[0].filename == __file__


@pytest.mark.parametrize(("cls", "required"), RENAMED)
def test_both_names_are_refused_by_name(cls, required):
    with pytest.raises(ValueError, match=r"both max_len=8 \(deprecated\) and context_length=9"):
        cls(**required, max_len=8, context_length=9)
    with pytest.raises(ValueError, match=r"both max_len=8 .* and context_length=8"):
        cls(**required, max_len=8, context_length=8)  # even when they agree


@pytest.mark.parametrize(("cls", "required"), RENAMED)
def test_the_old_name_is_still_checked_under_the_new_one(cls, required):
    with (
        pytest.warns(DeprecationWarning, match=OLD_NAME),
        pytest.raises(ValueError, match="context_length must be a positive integer"),
    ):
        cls(**required, max_len=0)


@pytest.mark.parametrize(("cls", "required"), RENAMED)
def test_replace_copy_pickle_and_the_signature_use_the_new_name(cls, required):
    config = cls(**required, context_length=8, norm="rmsnorm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these may warn
        longer = dataclasses.replace(config, context_length=12)
        same = copy.deepcopy(config)
        pickled = pickle.loads(pickle.dumps(config))
        parameters = inspect.signature(cls).parameters
    assert longer.context_length == 12
    assert longer == cls(**required, context_length=12, norm="rmsnorm")
    assert same == config
    assert pickled == config
    assert "context_length" in parameters
    assert "max_len" not in parameters
    assert {config, same, pickled} == {config}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_len = 3


@pytest.mark.parametrize(("cls", "required"), RENAMED)
def test_from_dict_reads_the_old_key_silently(cls, required):
    new = cls(**required, context_length=8)
    old_dict = {("max_len" if k == "context_length" else k): v for k, v in new.to_dict().items()}
    assert "max_len" in old_dict
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cls.from_dict(old_dict) == new
    both = {**old_dict, "context_length": 8}
    with pytest.raises(ValueError, match=r"both 'max_len' .* and 'context_length'"):
        cls.from_dict(both)
