"""Saving and loading as a user does it: one call for a model, tokenizers kept with it, readable reprs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tinyformer
from tinyformer.checkpoint import read_checkpoint, save_checkpoint
from tinyformer.data import (
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)
from tinyformer.layers import Linear
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
    load_model,
)

TEXT = "the river bank and the bank of the river"


def small_lm() -> DecoderOnlyLM:
    config = DecoderOnlyConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1)
    return DecoderOnlyLM(config, rng=np.random.default_rng(3))


def test_a_model_comes_back_in_one_call(tmp_path):
    model = small_lm()
    ids = np.array([[4, 5, 6, 7]])
    path = save_checkpoint(tmp_path / "lm.npz", model)
    loaded = load_model(path)
    assert type(loaded) is DecoderOnlyLM
    assert loaded.config == model.config
    assert not loaded.training  # ready to use
    np.testing.assert_array_equal(loaded.forward(ids), model.eval().forward(ids))
    ed = EncoderDecoder(
        EncoderDecoderConfig(
            src_vocab_size=12, tgt_vocab_size=12, d_model=8, n_heads=2, d_ff=16, context_length=8
        ),
        rng=np.random.default_rng(0),
    )
    again = load_model(save_checkpoint(tmp_path / "ed.npz", ed))
    assert again.state_dict().keys() == ed.state_dict().keys()
    assert all(np.array_equal(again.state_dict()[k], v) for k, v in ed.state_dict().items())


def test_load_model_refuses_what_it_cannot_build(tmp_path):
    path = save_checkpoint(tmp_path / "linear.npz", Linear(3, 2, rng=np.random.default_rng(0)))
    with pytest.raises(ValueError, match="holds a 'Linear', not one of the models"):
        load_model(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"junk\.npz"):
        load_model(tmp_path / "junk.npz")


@pytest.mark.parametrize(
    "tokenizer",
    [
        CharTokenizer.from_corpus(TEXT),
        WordTokenizer.from_corpus(TEXT),
        BPETokenizer.train([TEXT], vocab_size=30),
        BPETokenizer.train([TEXT], vocab_size=30, pretokenize="metaspace"),
    ],
    ids=["char", "word", "bpe", "bpe-metaspace"],
)
def test_tokenizers_round_trip_alone_and_inside_a_checkpoint(tmp_path, tokenizer):
    text = "the bank river"
    rebuilt = tokenizer_from_dict(json.loads(json.dumps(tokenizer.to_dict())))
    assert rebuilt == tokenizer
    assert type(rebuilt) is type(tokenizer)
    np.testing.assert_array_equal(rebuilt.encode(text), tokenizer.encode(text))
    assert load_tokenizer(tokenizer.save(tmp_path / "tok.json")) == tokenizer
    path = save_checkpoint(tmp_path / "lm.npz", small_lm(), tokenizer=tokenizer)
    carried = read_checkpoint(path).tokenizer
    assert carried == tokenizer
    assert carried.decode(carried.encode(text)) == text


def test_tokenizer_errors_name_the_problem(tmp_path):
    assert read_checkpoint(save_checkpoint(tmp_path / "m.npz", small_lm())).tokenizer is None
    with pytest.raises(ValueError, match="kind one of \\['bpe', 'char', 'word'\\], got kind 'sp'"):
        tokenizer_from_dict({"kind": "sp"})
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json is not a saved tokenizer"):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(TypeError, match="tokenizer must be a tinyformer Tokenizer"):
        save_checkpoint(tmp_path / "m.npz", small_lm(), tokenizer="abc")
    assert CharTokenizer("ab") != CharTokenizer("ba")  # ids differ


def test_models_print_their_configuration_and_size():
    model = small_lm()
    text = repr(model)
    assert text.startswith("DecoderOnlyLM(DecoderOnlyConfig(vocab_size=20, d_model=8")
    assert f"{model.num_parameters():,} parameters, training mode)" in text
    assert repr(model.eval()).endswith("evaluation mode)")
    assert " at 0x" not in text


def test_the_first_names_are_at_the_top_level():
    assert tinyformer.DecoderOnlyLM is DecoderOnlyLM
    assert tinyformer.load_model is load_model
    for name in tinyformer.__all__:
        assert getattr(tinyformer, name) is not None
    assert set(tinyformer.__all__) <= set(dir(tinyformer))
    with pytest.raises(AttributeError, match="no attribute 'Transformer'"):
        _ = tinyformer.Transformer
