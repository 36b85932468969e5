"""Checkpoints: round trip, atomic writes, version 1 files, and every bad file rejected unchanged.

The version 1 files in ``fixtures/`` were written by tinyformer before its models were
rebuilt from one stack (fused attention projections, flat parameter names); see
``fixtures/make_checkpoint_v1.py`` for how. They must load into today's models and
resume training exactly where they stopped.
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pytest
from small_models import LLAMA, decoder_only, encoder_decoder, encoder_only, perturb

import tinyformer.checkpoint as ckpt
from tinyformer.checkpoint import (
    FORMAT,
    load_checkpoint,
    model_generators,
    read_checkpoint,
    save_checkpoint,
)
from tinyformer.data import BPETokenizer, CharTokenizer, WordTokenizer
from tinyformer.layers import Dropout, Embedding, Linear
from tinyformer.losses import cross_entropy
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderOnlyMLM,
    load_model,
)
from tinyformer.module import Module
from tinyformer.optim import SGD, Adam, AdamW
from tinyformer.training import History

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 10
    d_model: int = 6
    dropout: float = 0.1

    def to_dict(self) -> dict:
        return asdict(self)


class TinyLM(Module):
    """Embedding -> dropout -> linear, with a separate generator for a second dropout."""

    def __init__(self, config: TinyConfig, *, rng: np.random.Generator, rng2=None) -> None:
        super().__init__()
        self.config = config
        self.embedding = Embedding(config.vocab_size, config.d_model, rng=rng)
        self.dropout = Dropout(config.dropout, rng=rng)
        self.dropout2 = Dropout(config.dropout, rng=rng if rng2 is None else rng2)
        self.head = Linear(config.d_model, config.vocab_size, rng=rng)

    def forward(self, ids):
        return self.head(self.dropout2(self.dropout(self.embedding(ids))))

    def backward(self, grad):
        self.embedding.backward(
            self.dropout.backward(self.dropout2.backward(self.head.backward(grad)))
        )


def setup(seed: int = 0, config: TinyConfig | None = None):
    rng = np.random.default_rng(seed)
    model = TinyLM(config or TinyConfig(), rng=rng, rng2=np.random.default_rng(seed + 50))
    optimizer = Adam(model.parameters(), 0.01, betas=(0.8, 0.99))
    for p in model.parameters():  # one update so that the buffers are not all zero
        p.grad[...] = rng.normal(size=p.shape)
    optimizer.step()
    return model, optimizer, np.random.default_rng(seed + 100)


def snapshot(model, optimizer, data_rng):
    return (
        model.state_dict(),
        optimizer.state_dict(),
        [g.bit_generator.state for g in model_generators(model)],
        data_rng.bit_generator.state,
    )


def assert_same(a, b):
    for x, y in zip(a[0].values(), b[0].values(), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a[1].keys() == b[1].keys()
    for key in a[1]:
        np.testing.assert_array_equal(a[1][key], b[1][key])
    assert a[2] == b[2]
    assert a[3] == b[3]


@pytest.fixture
def saved(tmp_path):
    model, optimizer, data_rng = setup(0)
    data_rng.random(3)
    history = History()
    history.log_eval(4, {"accuracy": 0.5})
    path = save_checkpoint(
        tmp_path / "a.npz", model, optimizer, step=4, history=history,
        generators={"data": data_rng}, extra={"note": [1, 2]},
        extra_arrays={"order": np.arange(5)},
    )  # fmt: skip
    return path, snapshot(model, optimizer, data_rng)


def fresh():
    model, optimizer, data_rng = setup(7)
    return model, optimizer, data_rng, snapshot(model, optimizer, data_rng)


# ----------------------------------------------------------------------- round trip
def test_round_trip_restores_weights_optimizer_generators_and_extras(saved):
    path, original = saved
    model, optimizer, data_rng, _ = fresh()
    checkpoint = load_checkpoint(path, model, optimizer, generators={"data": data_rng})
    assert_same(snapshot(model, optimizer, data_rng), original)
    assert checkpoint.step == 4
    assert checkpoint.config == TinyConfig().to_dict()
    assert History.from_dict(checkpoint.history).column("accuracy", "eval").tolist() == [0.5]
    assert checkpoint.extra == {"note": [1, 2]}
    np.testing.assert_array_equal(checkpoint.group("extra")["order"], np.arange(5))
    assert optimizer.betas == (0.8, 0.99)
    assert optimizer.step_count == 1


def test_model_generators_are_found_once_each_in_module_order():
    model, _, _ = setup(0)
    found = model_generators(model)
    assert len(found) == 2
    assert found[0] is model.dropout.rng
    assert found[1] is model.dropout2.rng
    real = DecoderOnlyLM(
        DecoderOnlyConfig(vocab_size=8, d_model=8, n_heads=2, d_ff=16, n_layers=2, dropout=0.1),
        rng=np.random.default_rng(0),
    )
    assert len(model_generators(real)) == 1


def test_file_layout_is_a_plain_npz_with_json_metadata(saved):
    path, _ = saved
    with np.load(path, allow_pickle=False) as npz:
        names = set(npz.files)
        metadata = json.loads(npz["__metadata__"].tobytes().decode())
    assert metadata["format"] == FORMAT
    assert metadata["version"] == ckpt.VERSION
    assert len(metadata["sha256"]) == 64
    assert {"model/embedding.weight", "optimizer/exp_avg.0", "extra/order"} <= names
    assert set(metadata["generators"]) == {"data", "model.0", "model.1"}


def test_model_only_load_without_optimizer(saved):
    path, original = saved
    model, _, _, _ = fresh()
    load_checkpoint(path, model)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, original[0][name])


def test_save_is_atomic_a_failed_write_keeps_the_old_file(saved, monkeypatch):
    path, _ = saved
    before = path.read_bytes()
    model, optimizer, _, _ = fresh()

    def broken(file, **arrays):
        file.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, optimizer)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_save_rejects_bad_arguments(tmp_path):
    model, _, _ = setup(0)
    with pytest.raises(TypeError, match="path must be a str"):
        save_checkpoint(3, model)
    with pytest.raises(TypeError, match="model must be a tinyformer Module"):
        save_checkpoint(tmp_path / "x.npz", "model")
    with pytest.raises(TypeError, match="optimizer must be a tinyformer Optimizer"):
        save_checkpoint(tmp_path / "x.npz", model, "adam")
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        save_checkpoint(tmp_path / "x.npz", model, step=-1)
    with pytest.raises(TypeError, match="must be a numpy Generator"):
        save_checkpoint(tmp_path / "x.npz", model, generators={"data": 5})
    with pytest.raises(TypeError, match="must be numeric"):
        save_checkpoint(tmp_path / "x.npz", model, extra_arrays={"names": np.array(["a"])})
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        read_checkpoint(tmp_path / "missing.npz")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ bad files
def rewrite(path, out, *, drop=(), add=None, metadata_change=None, fix_digest=True):
    """Copy a checkpoint with arrays dropped/added and metadata changed, re-signing the arrays."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    metadata = json.loads(arrays.pop("__metadata__").tobytes().decode())
    for name in drop:
        del arrays[name]
    arrays.update(add or {})
    if metadata_change:
        metadata_change(metadata)
    if fix_digest:
        metadata["sha256"] = ckpt._digest(arrays)
    blob = np.frombuffer(json.dumps(metadata).encode(), dtype=np.uint8)
    with out.open("wb") as file:
        np.savez(file, __metadata__=blob, **arrays)
    return out


def bad_files(path, tmp_path):
    """(name, file, message pattern) for every way a checkpoint can be wrong."""
    raw = path.read_bytes()
    cases = []

    def write(name, data):
        target = tmp_path / name
        target.write_bytes(data)
        return target

    cases.append(("truncated", write("truncated.npz", raw[: len(raw) // 2]), "not a readable"))
    cases.append(("empty", write("empty.npz", b""), "not a readable"))
    flipped = bytearray(raw)
    for i in range(len(raw) // 3, len(raw) // 3 + 40):
        flipped[i] ^= 0xFF
    cases.append(("flipped", write("flipped.npz", bytes(flipped)), "not a readable|corrupted"))
    cases.append(("text", write("notes.npz", b"just some text\n" * 20), "not a readable"))
    np.save(tmp_path / "single.npy", np.arange(4))
    cases.append(("npy", tmp_path / "single.npy", "single array"))
    np.savez(tmp_path / "plain.npz", weights=np.ones(3))
    cases.append(("plain npz", tmp_path / "plain.npz", "no __metadata__"))
    out = tmp_path
    cases.append(
        (
            "wrong format",
            rewrite(path, out / "f.npz", metadata_change=lambda m: m.update(format="other")),
            "not a tinyformer checkpoint",
        )
    )
    cases.append(
        (
            "future version",
            rewrite(path, out / "v.npz", metadata_change=lambda m: m.update(version=99)),
            r"format version 99 is not supported \(this tinyformer reads versions 1 and 2\)",
        )
    )
    cases.append(
        (
            "version as text",
            rewrite(path, out / "v2.npz", metadata_change=lambda m: m.update(version="2")),
            "format version '2' is not supported",
        )
    )
    cases.append(
        (
            "no version",
            rewrite(path, out / "v0.npz", metadata_change=lambda m: m.pop("version")),
            "format version None is not supported",
        )
    )
    cases.append(
        (
            "tampered array",
            rewrite(
                path,
                out / "t.npz",
                add={"model/head.bias": np.full(10, 0.5)},
                fix_digest=False,
            ),
            "SHA-256",
        )
    )
    cases.append(
        (
            "missing array",
            rewrite(path, out / "m.npz", drop=["model/head.bias"]),
            r"missing \['head.bias'\]",
        )
    )
    cases.append(
        (
            "extra array",
            rewrite(path, out / "e.npz", add={"model/head.scale": np.ones(3)}),
            r"extra \['head.scale'\]",
        )
    )
    cases.append(
        (
            "wrong shape",
            rewrite(path, out / "s.npz", add={"model/head.bias": np.zeros(11)}),
            "parameter 'head.bias' must have shape",
        )
    )
    cases.append(
        (
            "nan weight",
            rewrite(path, out / "n.npz", add={"model/head.bias": np.full(10, np.nan)}),
            "NaN",
        )
    )
    cases.append(
        (
            "config",
            rewrite(
                path,
                out / "c.npz",
                metadata_change=lambda m: m["model"]["config"].update(dropout=0.5),
            ),
            r"config does not match.*dropout: saved 0\.5, model 0\.1",
        )
    )
    cases.append(
        (
            "optimizer buffer",
            rewrite(path, out / "o.npz", drop=["optimizer/exp_avg.0"]),
            "optimizer state does not fit",
        )
    )
    cases.append(
        (
            "generator",
            rewrite(
                path,
                out / "g.npz",
                metadata_change=lambda m: m["generators"]["model.0"].update(
                    bit_generator="MT19937"
                ),
            ),
            "another bit generator",
        )
    )
    cases.append(
        (
            "broken metadata",
            rewrite(path, out / "b.npz", metadata_change=lambda m: m.update(step="four")),
            "'step' is missing or malformed",
        )
    )
    return cases


def test_every_bad_checkpoint_raises_naming_the_file_and_changes_nothing(saved, tmp_path):
    path, _ = saved
    (tmp_path / "bad").mkdir()
    for name, bad, pattern in bad_files(path, tmp_path / "bad"):  # a folder of its own
        model, optimizer, data_rng, before = fresh()
        with pytest.raises(ValueError, match=pattern) as info:
            load_checkpoint(bad, model, optimizer, generators={"data": data_rng})
        assert bad.name in str(info.value), name
        assert_same(snapshot(model, optimizer, data_rng), before)


def test_flipped_bytes_in_a_stored_entry_are_caught(saved, tmp_path):
    path, _ = saved
    # find the weights of one entry inside the zip and flip them there
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("model/embedding.weight.npy")
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + 200
    raw[start : start + 8] = bytes(b ^ 0x5A for b in raw[start : start + 8])
    bad = tmp_path / "bits.npz"
    bad.write_bytes(bytes(raw))
    model, optimizer, data_rng, before = fresh()
    with pytest.raises(ValueError, match=r"bits\.npz"):
        load_checkpoint(bad, model, optimizer, generators={"data": data_rng})
    assert_same(snapshot(model, optimizer, data_rng), before)


def test_mismatched_objects_are_rejected(saved):
    path, _ = saved
    model, optimizer, data_rng, before = fresh()
    with pytest.raises(ValueError, match="no state for the generators"):
        load_checkpoint(path, model, optimizer, generators={"data": data_rng, "other": data_rng})
    with pytest.raises(ValueError, match=r"optimizer state does not fit.*'Adam', not 'SGD'"):
        load_checkpoint(path, model, SGD(model.parameters(), 0.1), generators={"data": data_rng})
    other = TinyLM(TinyConfig(d_model=4), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"config does not match.*d_model"):
        load_checkpoint(path, other)
    real = DecoderOnlyLM(DecoderOnlyConfig(vocab_size=10), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="holds a TinyLM, not a DecoderOnlyLM"):
        load_checkpoint(path, real)
    one_rng = TinyLM(TinyConfig(), rng=np.random.default_rng(0))  # both dropouts share one
    with pytest.raises(ValueError, match="2 model generators, the model has 1"):
        load_checkpoint(path, one_rng)
    assert_same(snapshot(model, optimizer, data_rng), before)
    _, saved_optimizer, _ = setup(0)
    bare = save_checkpoint(path.with_name("bare.npz"), model)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(bare, model, saved_optimizer)


def test_real_model_round_trip_with_float32(tmp_path):
    config = DecoderOnlyConfig(
        vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=1, context_length=8,
        dropout=0.1, dtype="float32",
    )  # fmt: skip
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    path = save_checkpoint(tmp_path / "lm.npz", model, step=2)
    other = DecoderOnlyLM(config, rng=np.random.default_rng(1))
    load_checkpoint(path, other)
    for name, value in model.state_dict().items():
        assert other.state_dict()[name].dtype == np.float32
        np.testing.assert_array_equal(other.state_dict()[name], value)
    generators = model_generators(model) + model_generators(other)
    assert generators[0].bit_generator.state == generators[1].bit_generator.state
    wide = DecoderOnlyLM(
        DecoderOnlyConfig(
            vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=1, context_length=8, dropout=0.1
        ),
        rng=np.random.default_rng(1),
    )
    with pytest.raises(ValueError, match="dtype: saved 'float32', model 'float64'"):
        load_checkpoint(path, wide)


def test_a_checkpoint_of_another_size_is_refused_by_field(tmp_path):
    model = encoder_only(0, context_length=8)
    path = save_checkpoint(tmp_path / "mlm.npz", model)
    other = EncoderOnlyMLM(
        dataclasses.replace(model.config, context_length=9), rng=np.random.default_rng(0)
    )
    with pytest.raises(ValueError, match="context_length: saved 8, model 9"):
        load_checkpoint(path, other)
    rms = EncoderOnlyMLM(
        dataclasses.replace(model.config, norm="rmsnorm"), rng=np.random.default_rng(0)
    )
    with pytest.raises(ValueError, match="norm: saved 'layernorm', model 'rmsnorm'"):
        load_checkpoint(path, rms)


# -------------------------------------------------- real models, version 2
SOURCE = np.array([[3, 4, 5, 6], [5, 6, 0, 0]])
TARGET = np.array([[1, 2, 3, 4], [1, 4, 5, 0]])
FAMILIES = {
    "decoder-only": (decoder_only, lambda m: m.forward(TARGET[:, :-1]), TARGET[:, 1:]),
    "encoder-decoder": (
        encoder_decoder,
        lambda m: m.forward(SOURCE, TARGET[:, :-1]),
        TARGET[:, 1:],
    ),
    "encoder-only": (encoder_only, lambda m: m.forward(SOURCE), SOURCE),
}


def _train_step(model, optimizer, run, targets) -> None:
    model.zero_grad()
    _, grad = cross_entropy(run(model), targets, ignore_index=0)
    model.backward(grad)
    optimizer.step()


@pytest.mark.parametrize("options", [{}, LLAMA], ids=["defaults", "llama"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_version_2_round_trip_resumes_training_exactly(tmp_path, family, options):
    make, run, targets = FAMILIES[family]
    model = perturb(make(0, dropout=0.1, **options), 1)
    optimizer = AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        _train_step(model, optimizer, run, targets)
    path = save_checkpoint(tmp_path / "run.npz", model, optimizer, step=2)
    assert read_checkpoint(path).metadata["version"] == ckpt.VERSION == 2
    names = set(read_checkpoint(path).group("model"))
    assert names == set(model.state_dict())  # today's names: q_proj, k_proj, ...
    _train_step(model, optimizer, run, targets)  # the run goes on
    twin = make(7, dropout=0.1, **options)  # other weights and other dropout generator
    twin_optimizer = AdamW(twin.parameters(), lr=1e-2)
    assert load_checkpoint(path, twin, twin_optimizer).step == 2
    assert twin_optimizer.step_count == 2
    _train_step(twin, twin_optimizer, run, targets)  # the same step, dropout masks included
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(twin.state_dict()[name], value, err_msg=name)


# --------------------------------------------------------- version 1 files
# The inputs make_checkpoint_v1.py drew (numpy.random.default_rng(0)), as they came out.
V1_SOURCE = np.array([[7, 6, 5, 3, 3], [1, 1, 1, 2, 7], [6, 8, 5, 5, 8]])
V1_TARGET = np.array([[6, 6, 5, 5, 8, 3], [7, 6, 1, 4, 7, 5], [1, 7, 6, 7, 2, 1]])
V1_IDS = np.array([[7, 7, 8, 1, 5, 8, 6], [0, 1, 4, 0, 3, 8, 5], [1, 4, 2, 2, 3, 3, 7]])
VERSION_1 = {
    "encoder_decoder": (
        EncoderDecoder,
        lambda m: m.forward(V1_SOURCE, V1_TARGET[:, :-1]),
        V1_TARGET[:, 1:],
    ),
    "decoder_only": (DecoderOnlyLM, lambda m: m.forward(V1_IDS[:, :-1]), V1_IDS[:, 1:]),
    "encoder_only": (EncoderOnlyMLM, lambda m: m.forward(V1_IDS), V1_IDS),
}


def _version_1_step(model, optimizer, run, targets) -> None:
    """One training step as make_checkpoint_v1.py took it (no ignored index)."""
    model.zero_grad()
    _, grad = cross_entropy(run(model), targets)
    model.backward(grad)
    optimizer.step()


@pytest.mark.parametrize("name", list(VERSION_1))
def test_a_version_1_file_loads_with_load_model(name):
    model_class, run, _ = VERSION_1[name]
    path = FIXTURES / f"checkpoint_v1_{name}.npz"
    checkpoint = read_checkpoint(path)
    assert checkpoint.metadata["version"] == 1
    assert checkpoint.step == 2
    model = load_model(path)
    assert type(model) is model_class
    assert set(checkpoint.group("model")) == set(model.state_dict())  # upgraded as it was read
    recorded = np.load(FIXTURES / f"checkpoint_v1_{name}_logits.npz")
    np.testing.assert_allclose(run(model), recorded["before"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(VERSION_1))
def test_a_version_1_file_resumes_training_where_it_stopped(name):
    model_class, run, targets = VERSION_1[name]
    path = FIXTURES / f"checkpoint_v1_{name}.npz"
    recorded = np.load(FIXTURES / f"checkpoint_v1_{name}_logits.npz")
    fresh = load_model(path).train()  # the right configuration, then other weights
    model = model_class(fresh.config, rng=np.random.default_rng(123))
    optimizer = AdamW(model.parameters(), lr=1e-2)
    assert load_checkpoint(path, model, optimizer).step == 2
    assert optimizer.step_count == 2
    np.testing.assert_allclose(run(model), recorded["before"], rtol=0, atol=1e-12)
    _version_1_step(model, optimizer, run, targets)
    np.testing.assert_allclose(run(model), recorded["after"], rtol=0, atol=1e-12)
    # the optimizer's state came from the file: without it, the step lands elsewhere
    alone = load_model(path).train()
    blank = AdamW(alone.parameters(), lr=1e-2)
    _version_1_step(alone, blank, run, targets)
    assert np.abs(run(alone) - recorded["after"]).max() > 1e-3


def test_a_version_1_file_refuses_an_optimizer_of_another_kind():
    path = FIXTURES / "checkpoint_v1_decoder_only.npz"
    model = load_model(path)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="optimizer state does not fit"):
        load_checkpoint(path, model, SGD(model.parameters(), 0.1))
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


# -------------------------------------------------------------- tokenizers
TEXT = "the river bank and the bank of the river"


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
def test_a_tokenizer_travels_inside_a_checkpoint(tmp_path, tokenizer):
    text = "the bank river"
    path = save_checkpoint(
        tmp_path / "lm.npz", decoder_only(0, vocab_size=30), tokenizer=tokenizer
    )
    carried = read_checkpoint(path).tokenizer
    assert carried == tokenizer
    assert type(carried) is type(tokenizer)
    np.testing.assert_array_equal(carried.encode(text), tokenizer.encode(text))
    assert carried.decode(carried.encode(text)) == text


def test_a_checkpoint_without_a_tokenizer_and_a_bad_tokenizer(tmp_path):
    assert read_checkpoint(save_checkpoint(tmp_path / "m.npz", decoder_only())).tokenizer is None
    with pytest.raises(TypeError, match="tokenizer must be a tinyformer Tokenizer"):
        save_checkpoint(tmp_path / "m.npz", decoder_only(), tokenizer="abc")
