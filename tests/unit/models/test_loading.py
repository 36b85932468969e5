"""``load_model``: a saved model of any family and configuration back in one call."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from small_models import LLAMA, OPTIONS, decoder_only, encoder_decoder, encoder_only, perturb

from tinyformer.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from tinyformer.layers import Linear
from tinyformer.models import (
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    EncoderOnlyMLM,
    load_model,
    model_from_checkpoint,
)

SOURCE = np.array([[3, 4, 5, 6], [5, 6, 0, 0]])
TARGET = np.array([[1, 2, 3], [1, 4, 0]])
FAMILIES = {
    "decoder-only": (decoder_only, lambda m: m.forward(TARGET)),
    "encoder-decoder": (encoder_decoder, lambda m: m.forward(SOURCE, TARGET)),
    "encoder-only": (encoder_only, lambda m: m.forward(SOURCE)),
}


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_model_of_any_configuration_comes_back_in_one_call(tmp_path, family, name):
    make, run = FAMILIES[family]
    model = perturb(make(1, **OPTIONS[name]), 2)
    path = save_checkpoint(tmp_path / "model.npz", model)
    loaded = load_model(path)
    assert type(loaded) is type(model)
    assert loaded.config == model.config  # every field, the new ones included
    for field, value in OPTIONS[name].items():
        assert getattr(loaded.config, field) == value
    assert not loaded.training  # ready to use
    assert loaded.state_dict().keys() == model.state_dict().keys()
    np.testing.assert_array_equal(run(loaded), run(model.eval()))


def test_the_stored_configuration_is_plain_json(tmp_path):
    model = encoder_decoder(0, **LLAMA)
    path = save_checkpoint(tmp_path / "ed.npz", model)
    config = read_checkpoint(path).config
    assert json.loads(json.dumps(config)) == config
    assert {k: config[k] for k in ("norm", "feed_forward", "bias", "positional")} == {
        "norm": "rmsnorm",
        "feed_forward": "gated",
        "bias": False,
        "positional": "rotary",
    }


def test_load_model_refuses_what_it_cannot_build(tmp_path):
    path = save_checkpoint(tmp_path / "linear.npz", Linear(3, 2, rng=np.random.default_rng(0)))
    with pytest.raises(ValueError, match="holds a 'Linear', not one of the models"):
        load_model(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"junk\.npz"):
        load_model(tmp_path / "junk.npz")
    checkpoint = read_checkpoint(save_checkpoint(tmp_path / "lm.npz", decoder_only()))
    checkpoint.metadata["model"]["config"] = None
    with pytest.raises(ValueError, match="has no model configuration"):
        model_from_checkpoint(checkpoint)


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
        (EncoderDecoder, EncoderDecoderConfig(7, 7, d_model=8, n_heads=2, d_ff=16)),
        (EncoderOnlyMLM, EncoderOnlyConfig(7, d_model=8, n_heads=2, d_ff=16)),
    ],
    ids=["ed", "encoder-only"],
)
def test_a_checkpoint_written_with_max_len_still_loads(tmp_path, model_class, config):
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


def test_models_print_their_configuration_and_size():
    model = decoder_only(3, vocab_size=20)
    text = repr(model)
    assert text.startswith("DecoderOnlyLM(DecoderOnlyConfig(")
    assert "vocab_size=20" in text
    assert "norm='layernorm'" in text
    assert f"{model.num_parameters():,} parameters, training mode)" in text
    assert repr(model.eval()).endswith("evaluation mode)")
    assert " at 0x" not in text
