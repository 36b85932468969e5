"""The capstone run at a tiny size on a small real corpus, and its sliding-window evaluation."""

from __future__ import annotations

import inspect
import math
import platform
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tinyformer.data import corpus as corpus_module
from tinyformer.data.ngram_lm import AddOneUnigram, KneserNey, bits_per_byte
from tinyformer.data.tokenizers import BPETokenizer
from tinyformer.experiments import ExperimentStore
from tinyformer.experiments import real_text as real_text_module
from tinyformer.experiments.real_text import (
    best_ngram,
    book_runs,
    corpus_for,
    gpt2_layout,
    heldout_stream,
    ngram_baselines,
    real_text,
    result_tokenizer,
    running_library,
    sliding_window_losses,
)
from tinyformer.experiments.recipe import token_losses
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM

PYTHON = platform.python_version()
LIBRARY = running_library()["library"]
MODULES = ("json", "textwrap.py", "colorsys.py", "fnmatch.py", "shlex.py", "glob.py", "bisect.py")
"""A few real modules of the standard library: about 40 KB of docstrings, parsed in a blink."""

TINY = {
    "python": PYTHON, "library": LIBRARY, "vocab_size": 300, "compare_vocab_sizes": [280, 300], "d_model": 16, "n_heads": 2, "n_layers": 1,
    "context_length": 16, "batch_size": 4, "max_steps": 8, "warmup_steps": 2,
    "heldout_fraction": 0.3, "validation_fraction": 0.2, "eval_stride": 8, "eval_every": 4, "n_eval_windows": 4,
    "max_ngram_order": 3, "log_every": 2, "dtype": "float64",
}  # fmt: skip
TIMING = {"train_seconds", "cpu_seconds", "tokenizer_seconds", "ngram_seconds", "eval_seconds"}


@pytest.fixture(scope="module")
def small_library(tmp_path_factory) -> Path:
    """A copy of a few modules of the running interpreter's standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    root = tmp_path_factory.mktemp("stdlib")
    for name in MODULES:
        source = stdlib / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, root / name)
    return root


@pytest.fixture
def small_corpus(small_library, monkeypatch):
    """The run reads the small library instead of the whole standard library."""

    def stdlib_docstrings(root=None, **fractions):
        return corpus_module.stdlib_docstrings(small_library, **fractions)

    monkeypatch.setattr(real_text_module, "stdlib_docstrings", stdlib_docstrings)
    corpus = corpus_module.stdlib_docstrings(
        small_library,
        heldout_fraction=TINY["heldout_fraction"],
        validation_fraction=TINY["validation_fraction"],
    )
    assert all(corpus.split(name) for name in corpus_module.SPLITS)
    return corpus


_RUNS: dict[str, object] = {}


@pytest.fixture
def tiny(small_corpus):
    """The tiny run, trained once per test module."""
    if "run" not in _RUNS:
        _RUNS["run"] = real_text(**TINY)
    return _RUNS["run"]


def test_the_run_reports_its_model_against_the_baselines_on_the_same_tokens(tiny, small_corpus):
    r, m = tiny, tiny.metrics
    assert r.name == "real_text"
    assert isinstance(r.model, DecoderOnlyLM)
    assert not r.model.training
    assert int(m["steps"]) == TINY["max_steps"]
    assert r.config["corpus"]["digest"] == small_corpus.digest
    assert r.config["corpus"]["python"] == PYTHON
    tokenizer = result_tokenizer(r)
    assert tokenizer.vocab_size == TINY["vocab_size"] == r.model.vocab_size
    train_text, heldout_text = small_corpus.text("train"), small_corpus.text("heldout")
    train = tokenizer.encode(train_text)
    # every token of the held-out text is scored, after the tokens of a blank line
    stream = tokenizer.encode("\n\n" + heldout_text)
    text_ids = tokenizer.encode(heldout_text)
    given = stream.size - text_ids.size
    assert given == r.config["evaluation"]["separator_tokens"] >= 1
    np.testing.assert_array_equal(stream[given:], text_ids)
    n_bytes = len(heldout_text.encode())
    assert m["heldout_bytes"] == n_bytes
    assert m["heldout_tokens"] == text_ids.size
    # the baselines, recomputed from the classes themselves
    unigram = -AddOneUnigram(300).fit(train).log_probs(stream)[given:].sum()
    assert m["bpb_unigram"] == pytest.approx(unigram / math.log(2) / n_bytes, rel=1e-12)
    kn3 = -KneserNey(3, 300, discounts="modified").fit(train).log_probs(stream)[given:].sum()
    assert m["bpb_mkn3"] == pytest.approx(bits_per_byte(kn3, n_bytes), rel=1e-12)
    names = {"bpb_unigram", "bpb_kn2", "bpb_mkn2", "bpb_kn3", "bpb_mkn3"}
    assert names <= m.keys()
    assert m["best_ngram_bpb"] == min(m[k] for k in names)
    # and over the tokens of a tokenizer of another size
    assert m["best_ngram_bpb_vocab_280"] == pytest.approx(
        best_ngram(small_corpus, 280, max_order=3), rel=1e-12
    )
    assert "best_ngram_bpb_vocab_300" not in m  # the model's own size is best_ngram_bpb
    best = min(m["best_ngram_bpb"], m["best_ngram_bpb_vocab_280"])
    assert m["best_ngram_bpb_any_vocab"] == best
    assert m["margin_bpb"] == pytest.approx(best - m["heldout_bpb"], abs=1e-12)
    # the model, rescored
    losses, _ = sliding_window_losses(r.model, stream, stride=TINY["eval_stride"])
    assert losses.size == stream.size - 1
    nats = losses[given - 1 :].sum()
    assert m["heldout_bpb"] == pytest.approx(bits_per_byte(nats, n_bytes), rel=1e-12)
    assert m["min_context"] == TINY["context_length"] - TINY["eval_stride"] + 1
    assert m["parameters"] == r.model.num_parameters()
    assert m["train_tokens"] == train.size
    assert len(r.history.eval) == TINY["max_steps"] // TINY["eval_every"]
    # the validation text, scored the same way, and read by the curve (never the held-out text)
    validation_text = small_corpus.text("validation")
    v_stream, v_given = heldout_stream(tokenizer, validation_text)
    v_losses, _ = sliding_window_losses(r.model, v_stream, stride=TINY["eval_stride"])
    assert m["validation_bpb"] == pytest.approx(
        bits_per_byte(v_losses[v_given - 1 :].sum(), len(validation_text.encode())), rel=1e-12
    )
    assert r.config["corpus"]["validation_modules"] == sorted(small_corpus.validation_modules)


def test_the_held_out_stream_starts_after_a_separator(tiny, small_corpus):
    tokenizer = result_tokenizer(tiny)
    ids, given = heldout_stream(tokenizer, "Return the value.")
    assert tokenizer.decode(ids[:given]) == "\n\n"
    assert tokenizer.decode(ids[given:]) == "Return the value."
    with pytest.raises(ValueError, match="text"):
        heldout_stream(tokenizer, "")


def test_without_other_vocabularies_the_bar_is_the_models_own(small_corpus):
    m = real_text(**{**TINY, "compare_vocab_sizes": [], "max_steps": 4}).metrics
    assert not [k for k in m if k.startswith("best_ngram_bpb_vocab_")]
    assert m["best_ngram_bpb_any_vocab"] == m["best_ngram_bpb"]


def test_the_tokenizer_is_trained_on_the_training_text_alone(tiny, small_corpus):
    tokenizer = result_tokenizer(tiny)
    alone = BPETokenizer.train(small_corpus.text("train"), TINY["vocab_size"], pretokenize="bytes")
    assert alone.to_dict() == tokenizer.to_dict()
    everything = "\n\n".join(small_corpus.text(name) for name in corpus_module.SPLITS)
    leaky = BPETokenizer.train(everything, TINY["vocab_size"], pretokenize="bytes")
    assert leaky.to_dict() != tokenizer.to_dict()  # the comparison can tell them apart


def test_the_model_is_gpt2_shaped(tiny):
    c = tiny.model.config
    assert (c.norm_first, c.norm, c.feed_forward, c.activation) == (
        True, "layernorm", "plain", "gelu_tanh",
    )  # fmt: skip
    default_dropout = inspect.signature(real_text).parameters["dropout"].default
    assert (c.positional, c.bias, c.tie_output, c.dropout) == (
        "learned",
        True,
        True,
        default_dropout,
    )
    sizes = {"d_model": 8, "n_heads": 2, "d_ff": 32, "n_layers": 1, "context_length": 4}
    assert gpt2_layout(50, dropout=0.1, **sizes) == DecoderOnlyConfig(
        50, norm_first=True, norm="layernorm", feed_forward="plain", activation="gelu_tanh",
        positional="learned", bias=True, tie_output=True, dropout=0.1, **sizes,
    )  # fmt: skip


def test_the_same_seed_gives_the_same_run(tiny, small_corpus):
    again = real_text(**TINY)
    untimed = {k: v for k, v in tiny.metrics.items() if k not in TIMING}
    assert untimed == {k: v for k, v in again.metrics.items() if k not in TIMING}
    for (name, a), (_, b) in zip(
        tiny.model.named_parameters(), again.model.named_parameters(), strict=True
    ):
        assert np.array_equal(a.value, b.value), name


def test_a_stored_run_keeps_its_tokenizer_and_metrics(tiny, small_corpus, tmp_path):
    store = ExperimentStore(tmp_path, experiments={"real_text": real_text})
    first = store.run("real_text", **TINY)
    loaded = store.run("real_text", **TINY)
    assert result_tokenizer(loaded) == result_tokenizer(tiny)
    assert loaded.metrics == first.metrics
    untimed = {k: v for k, v in tiny.metrics.items() if k not in TIMING}
    assert untimed == {k: v for k, v in loaded.metrics.items() if k not in TIMING}
    assert "loaded real_text" in (tmp_path / "log.txt").read_text()


def test_the_book_run_is_keyed_by_the_running_interpreters_library(tmp_path):
    ((name, params),) = book_runs()
    assert name == "real_text"
    assert params == {"python": PYTHON, "library": corpus_module.source_digest()}
    store = ExperimentStore(tmp_path, experiments={"real_text": real_text})
    assert store.arguments(name, **params)["library"] == LIBRARY
    assert store.key(name, **params) != store.key(name, **{**params, "python": "3.99.0"})
    assert store.key(name, **params) != store.key(name, **{**params, "library": "0" * 64})


def test_another_interpreter_or_library_is_refused_by_name():
    with pytest.raises(ValueError, match=r"python='2\.7\.18'.*this interpreter"):
        corpus_for("2.7.18", LIBRARY)
    with pytest.raises(ValueError, match=r"library='0+'.*source digest"):
        corpus_for(PYTHON, "0" * 64)
    with pytest.raises(TypeError, match="python"):
        corpus_for(3.11, LIBRARY)
    with pytest.raises(TypeError, match="library"):
        corpus_for(PYTHON, None)
    with pytest.raises(ValueError, match="python"):
        real_text(**{**TINY, "python": "2.7.18"})
    with pytest.raises(ValueError, match="library"):
        real_text(**{**TINY, "library": "f" * 64})


def test_bad_arguments_are_refused_by_name(small_corpus):
    with pytest.raises(ValueError, match="eval_stride"):
        real_text(**{**TINY, "eval_stride": TINY["context_length"] + 1})
    with pytest.raises(ValueError, match="max_ngram_order"):
        real_text(**{**TINY, "max_ngram_order": 0})
    with pytest.raises(ValueError, match="n_heads"):
        real_text(**{**TINY, "n_heads": 3})
    with pytest.raises(TypeError, match="compare_vocab_sizes"):
        real_text(**{**TINY, "compare_vocab_sizes": 512})
    with pytest.raises(ValueError, match=r"compare_vocab_sizes must be at least 260.*\[100\]"):
        real_text(**{**TINY, "compare_vocab_sizes": [100]})
    with pytest.raises(ValueError, match="vocab_size must be at least 260"):
        real_text(**{**TINY, "vocab_size": 200})
    with pytest.raises(ValueError, match="context_length must be below the held-out text"):
        real_text(**{**TINY, "context_length": 100_000, "eval_stride": 8})
    with pytest.raises(ValueError, match="validation_fraction"):
        real_text(**{**TINY, "validation_fraction": 0.0})
    with pytest.raises(ValueError, match="max_order"):
        ngram_baselines([4, 5], [4, 5], 6, max_order=0)
    with pytest.raises(ValueError, match="start"):
        ngram_baselines([4, 5], [4, 5], 6, start=2)


# ------------------------------------------------------------ the sliding window
@pytest.fixture(scope="module")
def small_model():
    config = gpt2_layout(
        11, d_model=8, n_heads=2, d_ff=16, n_layers=1, context_length=6, dtype="float64"
    )
    return DecoderOnlyLM(config, rng=np.random.default_rng(0)).eval()


def _from_every_context(model, ids, context):
    """The loss of each token after the first, read from the ``context`` tokens before it."""
    out = []
    for t in range(1, ids.size):
        window = ids[max(0, t - context) : t + 1]
        losses, _ = token_losses(model, window[None, :-1], window[None, 1:])
        out.append(losses[0, -1])
    return np.array(out)


@pytest.mark.parametrize("stride", [1, 2, 4, 6])
def test_every_token_is_scored_once_with_at_least_the_promised_context(small_model, stride):
    ids = np.random.default_rng(1).integers(0, 11, 23)
    losses, min_context = sliding_window_losses(small_model, ids, stride=stride)
    assert losses.shape == (22,)
    assert min_context == (6 - stride + 1 if stride < 6 else 1)
    # each token's loss is the model's with some context between min_context and 6 tokens
    by_context = {c: _from_every_context(small_model, ids, c) for c in range(1, 7)}
    for t in range(22):
        matches = [c for c, row in by_context.items() if np.isclose(losses[t], row[t], rtol=1e-12)]
        assert matches, t
        assert max(matches) >= min(min_context, t + 1)
    if stride == 1:  # every token reads the whole context it can
        np.testing.assert_allclose(losses, by_context[6], rtol=1e-12)


def test_a_stream_shorter_than_the_context_is_one_window(small_model):
    ids = np.array([3, 4, 5, 6])
    losses, min_context = sliding_window_losses(small_model, ids, stride=2)
    np.testing.assert_allclose(losses, _from_every_context(small_model, ids, 6), rtol=1e-12)
    assert min_context == 3  # the one window: no later window to shorten any context


def test_sliding_window_arguments_are_checked(small_model):
    with pytest.raises(ValueError, match="stride"):
        sliding_window_losses(small_model, np.arange(10), stride=7)
    with pytest.raises(ValueError, match="ids"):
        sliding_window_losses(small_model, np.array([3]), stride=2)
    with pytest.raises(ValueError, match="ids"):
        sliding_window_losses(small_model, np.array([3, 11]), stride=2)
