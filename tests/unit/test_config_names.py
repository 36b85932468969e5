"""One configuration vocabulary: ``context_length`` everywhere, ``max_len`` deprecated.

``EncoderDecoderConfig`` and ``EncoderOnlyConfig`` called the longest sequence
``max_len``; every model configuration now says ``context_length``, as
``DecoderOnlyConfig`` always did. The old keyword and attribute keep working
until 0.2.0 with one ``DeprecationWarning``; checkpoints that stored the old
key keep loading, silently.
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

from tinyformer.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from tinyformer.models import (
    DecoderOnlyConfig,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    EncoderOnlyMLM,
    load_model,
)
from tinyformer.models.config import REMOVED_IN

SMALL = {"d_model": 8, "n_heads": 2, "d_ff": 16}
CONFIGS = [
    pytest.param(EncoderDecoderConfig, {"src_vocab_size": 7, "tgt_vocab_size": 7}, id="ed"),
    pytest.param(EncoderOnlyConfig, {"vocab_size": 7}, id="encoder-only"),
]
OLD_NAME = r"max_len is deprecated and will be removed in tinyformer 0\.2\.0; use context_length"


def test_every_model_config_names_the_longest_sequence_context_length():
    for cls in (EncoderDecoderConfig, EncoderOnlyConfig, DecoderOnlyConfig):
        names = {f.name for f in dataclasses.fields(cls)}
        assert "context_length" in names
        assert "max_len" not in names
    assert REMOVED_IN == "0.2.0"


@pytest.mark.parametrize(("cls", "required"), CONFIGS)
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


@pytest.mark.parametrize(("cls", "required"), CONFIGS)
def test_reading_the_old_attribute_warns_and_returns_context_length(cls, required):
    config = cls(**required, context_length=9)
    with pytest.warns(DeprecationWarning, match=OLD_NAME) as caught:
        value = config.max_len
    assert value == 9
    assert len(caught) == 1
    assert caught[0].filename == __file__


@pytest.mark.parametrize(("cls", "required"), CONFIGS)
def test_both_names_are_refused_by_name(cls, required):
    with pytest.raises(ValueError, match=r"both max_len=8 \(deprecated\) and context_length=9"):
        cls(**required, max_len=8, context_length=9)
    with pytest.raises(ValueError, match=r"both max_len=8 .* and context_length=8"):
        cls(**required, max_len=8, context_length=8)  # even when they agree


@pytest.mark.parametrize(("cls", "required"), CONFIGS)
def test_the_old_name_is_still_checked_under_the_new_one(cls, required):
    with (
        pytest.warns(DeprecationWarning, match=OLD_NAME),
        pytest.raises(ValueError, match="context_length must be a positive integer"),
    ):
        cls(**required, max_len=0)


@pytest.mark.parametrize(("cls", "required"), CONFIGS)
def test_replace_copy_pickle_and_the_signature_use_the_new_name(cls, required):
    config = cls(**required, context_length=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these may warn
        longer = dataclasses.replace(config, context_length=12)
        same = copy.deepcopy(config)
        pickled = pickle.loads(pickle.dumps(config))
        parameters = inspect.signature(cls).parameters
    assert longer.context_length == 12
    assert longer == cls(**required, context_length=12)
    assert same == config
    assert pickled == config
    assert "context_length" in parameters
    assert "max_len" not in parameters
    assert {config, same, pickled} == {config}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_len = 3


@pytest.mark.parametrize(("cls", "required"), CONFIGS)
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


def _as_if_saved_before_the_rename(path):
    """Rewrite a checkpoint's stored config with ``max_len`` where ``context_length`` is."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    metadata = json.loads(arrays["__metadata__"].tobytes().decode("utf-8"))
    config = metadata["model"]["config"]
    config["max_len"] = config.pop("context_length")
    blob = json.dumps(metadata).encode("utf-8")
    arrays["__metadata__"] = np.frombuffer(blob, dtype=np.uint8)
    np.savez(path, **arrays)


@pytest.mark.parametrize(
    ("model_class", "config"),
    [
        (EncoderDecoder, EncoderDecoderConfig(src_vocab_size=7, tgt_vocab_size=7, **SMALL)),
        (EncoderOnlyMLM, EncoderOnlyConfig(vocab_size=7, **SMALL)),
    ],
    ids=["ed", "encoder-only"],
)
def test_a_checkpoint_written_with_the_old_key_still_loads(tmp_path, model_class, config):
    model = model_class(config, rng=np.random.default_rng(0))
    path = tmp_path / "old.npz"
    save_checkpoint(path, model)
    _as_if_saved_before_the_rename(path)
    assert "max_len" in read_checkpoint(path).config
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a file the user cannot edit loads without a warning
        loaded = load_model(path)
        fresh = model_class(config, rng=np.random.default_rng(1))
        load_checkpoint(path, fresh)  # resuming into a model built today
    assert loaded.config == config
    for (name, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.value, q.value, err_msg=name)
    for (_, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.value, q.value)


def test_a_checkpoint_of_another_size_is_still_refused_by_field(tmp_path):
    config = EncoderOnlyConfig(vocab_size=7, **SMALL, context_length=8)
    path = tmp_path / "old.npz"
    save_checkpoint(path, EncoderOnlyMLM(config, rng=np.random.default_rng(0)))
    _as_if_saved_before_the_rename(path)
    other = EncoderOnlyMLM(
        dataclasses.replace(config, context_length=9), rng=np.random.default_rng(0)
    )
    with pytest.raises(ValueError, match="context_length: saved 8, model 9"):
        load_checkpoint(path, other)
