r"""A GPT on real text: the standard library's docstrings, against n-gram baselines in bits per byte.

The capstone run. The corpus is :func:`~tinyformer.data.corpus.stdlib_docstrings` of the
running interpreter (nothing is downloaded), split into training text, validation text
and held-out text, the last two from other top-level packages than the first. The run

1. trains a byte-pair tokenizer on the training text;
2. fits count-based language models on the training ids and scores the held-out ids with
   them (:mod:`tinyformer.data.ngram_lm`): the add-one unigram and Kneser-Ney of every
   order from 2 to ``max_ngram_order``, with one discount per order and with three;
3. trains a GPT-2-shaped decoder (pre-norm LayerNorm, learned positions, a plain
   feed-forward network with tanh GELU, biases, the output tied to the embedding: the
   layout :func:`~tinyformer.models.pretrained.save_pretrained` writes for Hugging Face
   ``transformers``) with the book's :class:`~tinyformer.experiments.recipe.Recipe`;
4. scores the validation ids and the held-out ids with the trained model, through a
   sliding window (:func:`sliding_window_losses`).

Every score is in **bits per byte**: the total loss in nats over the held-out tokens,
divided by :math:`\ln 2` and by the UTF-8 bytes of the held-out text
(:func:`~tinyformer.data.ngram_lm.bits_per_byte`), which does not depend on the
tokenizer, so models over different vocabularies compare. The held-out text is encoded
in one piece after a separator (:func:`heldout_stream`): the separator's tokens are
given, and every token of the text, hence every byte, is predicted once, by every
model, from the tokens before it. Since a smaller vocabulary suits count-based models
better, the run also scores the baselines over the tokens of tokenizers of other sizes
(``compare_vocab_sizes``), and the best of all of them is the bar the model must pass.

The defaults (two blocks of width 128, dropout 0.1, 3600 steps, about twelve minutes of
one CPU thread) were chosen among a few trials by the validation text's bits per byte
(``validation_bpb``): dropout 0.1 against 0.2 and none. Exploratory trials made before
the validation split existed (one block of width 96 over more and fewer steps, two of
width 128 without dropout) read the held-out score, and steered which candidates were
tried. The baselines' best, on the other hand, is the best on the held-out text itself, over
every order, both discount schemes and several vocabularies: a choice made with the
answer in hand, which can only favour the baselines.

The corpus depends on the interpreter's library, so the run takes the Python version
and the library's :func:`~tinyformer.data.corpus.source_digest` as arguments
(``python="3.11.7", library="50addb87..."``) and refuses to run on another library: a
stored result of one library is never read as another's, even of the same version
(distributions package the library in parts). The result records the corpus's
:attr:`~tinyformer.data.corpus.DocstringCorpus.digest` and the trained tokenizer
(:func:`result_tokenizer` rebuilds it), so a page can check that it extracts the
same text and decode the model's samples.
"""

from __future__ import annotations

import functools
import math
import platform
import time
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int, token_ids
from tinyformer.data.corpus import SEPARATOR, DocstringCorpus, source_digest, stdlib_docstrings
from tinyformer.data.ngram_lm import AddOneUnigram, KneserNey, bits_per_byte
from tinyformer.data.tokenizers import N_SPECIAL, BPETokenizer, Tokenizer, tokenizer_from_dict
from tinyformer.experiments.recipe import Recipe, token_losses
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import DecoderOnlyConfig
from tinyformer.models.counting import parameter_count
from tinyformer.training import WindowDataset

__all__ = [
    "best_ngram",
    "book_runs",
    "corpus_for",
    "gpt2_layout",
    "heldout_stream",
    "ngram_baselines",
    "real_text",
    "result_tokenizer",
    "running_library",
    "sliding_window_losses",
    "train_tokenizer",
]


def running_library() -> dict[str, str]:
    """The arguments that name the running interpreter's library: ``python`` and ``library``.

    ``python`` is its version; ``library`` the
    :func:`~tinyformer.data.corpus.source_digest` of its standard library's source files
    (computed once per process).
    """
    return {"python": platform.python_version(), "library": _library_digest()}


@functools.lru_cache(maxsize=1)
def _library_digest() -> str:
    return source_digest()


def book_runs() -> tuple[tuple[str, dict[str, Any]], ...]:
    """The run of chapter "A GPT on real text": the defaults, on the running interpreter's library.

    The library's version and source digest are part of the run's arguments
    (:func:`running_library`), so another library asks for (and trains) a run of its own.
    """
    return (("real_text", running_library()),)


def corpus_for(
    python: str,
    library: str,
    *,
    heldout_fraction: float = 0.1,
    validation_fraction: float = 0.05,
) -> DocstringCorpus:
    """The docstring corpus of the running interpreter, whose library must be the one named.

    Raises
    ------
    ValueError
        If the running interpreter is another version, or its library's source files
        have another digest: the corpus would be another text.
    """
    for name, value in (("python", python), ("library", library)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {describe(value)}")
    running = running_library()
    if python != running["python"]:
        raise ValueError(
            f"python={python!r} but this interpreter is Python {running['python']}: the corpus"
            " is the docstrings of the running interpreter's standard library, so a run of"
            f" another version would read another text; pass python={running['python']!r}"
        )
    if library != running["library"]:
        raise ValueError(
            f"library={library!r} but the source digest of this interpreter's standard"
            f" library is {running['library']!r}: the same version packaged or patched"
            " otherwise is another text; pass running_library() for this one"
        )
    return stdlib_docstrings(
        heldout_fraction=heldout_fraction, validation_fraction=validation_fraction
    )


def train_tokenizer(corpus: DocstringCorpus, vocab_size: int) -> BPETokenizer:
    """A byte-level BPE tokenizer of ``vocab_size`` ids trained on the training text alone.

    GPT-2's pre-tokenization and byte alphabet (``pretokenize="bytes"``): any text,
    held-out text included, is encoded without an unknown token and decodes back exactly.
    """
    return BPETokenizer.train(corpus.text("train"), vocab_size, pretokenize="bytes")


def result_tokenizer(result: ExperimentResult) -> Tokenizer:
    """The tokenizer a :func:`real_text` run trained, rebuilt from its result."""
    if not isinstance(result, ExperimentResult) or "tokenizer" not in result.config:
        raise TypeError(f"result must be the result of a real_text run, got {describe(result)}")
    return tokenizer_from_dict(result.config["tokenizer"])


def gpt2_layout(vocab_size: int, *, dropout: float = 0.0, **sizes: Any) -> DecoderOnlyConfig:
    """A decoder in GPT-2's layout (what Hugging Face's ``GPT2LMHeadModel`` computes) of given sizes.

    Pre-norm blocks with LayerNorm and a final LayerNorm, learned positions, a plain
    feed-forward network with GELU in its tanh form, biases, the output tied to the
    embedding; ``dropout`` in training (GPT-2's three dropouts, one probability).
    ``sizes`` are the other fields of
    :class:`~tinyformer.models.config.DecoderOnlyConfig` (``d_model``, ``n_heads``,
    ``d_ff``, ``n_layers``, ``context_length``, ``dtype``).
    """
    return DecoderOnlyConfig(
        vocab_size,
        norm_first=True,
        norm="layernorm",
        feed_forward="plain",
        activation="gelu_tanh",
        positional="learned",
        bias=True,
        tie_output=True,
        dropout=dropout,
        **sizes,
    )


def sliding_window_losses(
    model: Any, ids: object, *, stride: int, batch_size: int = 32
) -> tuple[np.ndarray, int]:
    r"""The model's loss (nats) on every token of ``ids`` after the first, through a sliding window.

    Windows of the model's ``context_length`` :math:`T` tokens start every ``stride``
    :math:`S` tokens (the last one is moved back to end at the stream's end). The first
    window scores all its predictions; each later one scores only the tokens no earlier
    window scored, at the end of the window, so that every token after the first is
    predicted exactly once, and from at least :math:`T - S + 1` tokens of context (all
    the tokens before it, near the start). :math:`S = T` cuts the stream into windows
    (a token at the start of a window sees a context of one token); :math:`S = 1` gives
    every token the whole context at the cost of :math:`T` times more computation.

    Parameters
    ----------
    model : DecoderOnlyLM
        Anything :func:`~tinyformer.experiments.recipe.token_losses` reads.
    ids : array_like of int
        One stream, shape ``(n,)``, ``n >= 2``.
    stride : int
        :math:`S`, in ``[1, T]``.
    batch_size : int
        Windows per forward pass.

    Returns
    -------
    losses : numpy.ndarray
        ``(n - 1,)`` float64: entry ``i`` is the loss of predicting ``ids[i + 1]``.
    min_context : int
        The fewest tokens any prediction read among those that could have read more (the
        first window's read every token before them); the window's length if there are none.
    """
    stream = token_ids(ids, "ids", model.vocab_size)
    if stream.ndim != 1 or stream.size < 2:
        raise ValueError(f"ids must be one stream of at least 2 token ids, got {describe(stream)}")
    length = min(model.context_length, stream.size - 1)
    stride = positive_int(stride, "stride")
    if stride > model.context_length:
        raise ValueError(
            f"stride must be at most the model's context_length={model.context_length},"
            f" got {stride}"
        )
    last_start = stream.size - 1 - length
    starts = list(range(0, last_start + 1, stride))
    if starts[-1] != last_start:
        starts.append(last_start)
    windows = np.lib.stride_tricks.sliding_window_view(stream, length + 1)[starts]  # (W, T + 1)
    losses, _ = token_losses(model, windows[:, :-1], windows[:, 1:], batch_size=batch_size)
    out = np.empty(stream.size - 1)
    done, min_context = 0, length
    for row, start in enumerate(starts):  # targets start + 1 .. start + length
        first = done - start  # the first target of this window not scored yet
        out[done : start + length] = losses[row, first:]
        if row:  # the first window's tokens read every token before them
            min_context = min(min_context, first + 1)
        done = start + length
    return out, min_context


def heldout_stream(tokenizer: Tokenizer, text: str) -> tuple[np.ndarray, int]:
    """The ids of a separator followed by ``text``, and how many of them the separator takes.

    ``text`` is encoded after :data:`~tinyformer.data.corpus.SEPARATOR` (the blank line
    that comes before every docstring of the corpus but the first), so that its first
    token is predicted from the context it has in the training text. The ids after the
    separator's are exactly ``tokenizer.encode(text)``; this is checked.

    Returns
    -------
    ids : numpy.ndarray
        ``(n,)``: the separator's ids, then the text's.
    given : int
        The number of separator ids (the context, never scored).
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty str, got {describe(text)}")
    ids = tokenizer.encode(SEPARATOR + text)
    own = tokenizer.encode(text)
    given = ids.size - own.size
    if given < 1 or not np.array_equal(ids[given:], own):
        raise ValueError(
            "text must start where a token starts after the separator (it is encoded"
            " otherwise after a blank line than alone), got one starting with"
            f" {text[:20]!r}"
        )
    if tokenizer.decode(own) != text:
        raise ValueError("the tokenizer does not give text back exactly")
    return ids, given


def ngram_baselines(
    train_ids: object, ids: object, vocab_size: int, *, max_order: int = 12, start: int = 1
) -> dict[str, float]:
    """Total nats of count-based models on the tokens ``ids[start:]``, each read after those before it.

    Keys: ``"unigram"`` (:class:`~tinyformer.data.ngram_lm.AddOneUnigram`), and for every
    order ``n`` from 2 to ``max_order`` ``"kn<n>"`` (interpolated Kneser-Ney, one discount
    per order) and ``"mkn<n>"`` (modified Kneser-Ney, three), each fitted on ``train_ids``.
    """
    max_order = positive_int(max_order, "max_order")
    stream = token_ids(ids, "ids", vocab_size)
    start = positive_int(start, "start")
    if stream.ndim != 1 or start >= stream.size:
        raise ValueError(
            f"ids must be one stream longer than start={start}, got {describe(stream)}"
        )
    totals = {"unigram": -AddOneUnigram(vocab_size).fit(train_ids).log_probs(stream)[start:].sum()}
    for prefix, discounts in (("kn", "single"), ("mkn", "modified")):
        models = KneserNey.fit_orders(train_ids, max_order, vocab_size, discounts=discounts)
        for n in range(2, max_order + 1):
            totals[f"{prefix}{n}"] = -models[n].log_probs(stream)[start:].sum()
    return {name: float(value) for name, value in totals.items()}


def best_ngram(corpus: DocstringCorpus, vocab_size: int, *, max_order: int = 12) -> float:
    """The best held-out bits per byte of :func:`ngram_baselines` over the tokens of another tokenizer.

    A tokenizer of ``vocab_size`` ids is trained on the training text
    (:func:`train_tokenizer`); the held-out text is scored as in :func:`real_text`.
    """
    tokenizer = train_tokenizer(corpus, vocab_size)
    text = corpus.text("heldout")
    ids, given = heldout_stream(tokenizer, text)
    train_ids = tokenizer.encode(corpus.text("train"))
    totals = ngram_baselines(train_ids, ids, vocab_size, max_order=max_order, start=given)
    return bits_per_byte(min(totals.values()), len(text.encode("utf-8")))


def real_text(
    *,
    python: str,
    library: str,
    seed: int = 0,
    vocab_size: int = 4096,
    d_model: int = 128,
    n_heads: int = 4,
    d_ff: int | None = None,
    n_layers: int = 2,
    context_length: int = 128,
    dropout: float = 0.1,
    batch_size: int = 8,
    max_steps: int = 3600,
    peak_lr: float = 5e-3,
    warmup_steps: int = 100,
    heldout_fraction: float = 0.1,
    validation_fraction: float = 0.05,
    eval_stride: int = 32,
    eval_every: int = 600,
    n_eval_windows: int = 64,
    max_ngram_order: int = 12,
    compare_vocab_sizes: tuple[int, ...] = (512, 1024, 2048),
    log_every: int = 10,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train a byte-pair tokenizer and a GPT on the standard library's docstrings; score both against n-grams.

    Parameters
    ----------
    python, library : str
        The version of the running interpreter and the source digest of its library
        (:func:`running_library`), both checked.
    seed : int
        Seeds the initialization and the batch order (:class:`~tinyformer.experiments.recipe.Recipe`).
    vocab_size : int
        Ids of the tokenizer (:func:`train_tokenizer`): 4 special tokens, the 256 byte
        values and the merges learned on the training text.
    d_model, n_heads, d_ff, n_layers, context_length : int
        The model's sizes (:func:`gpt2_layout`; ``d_ff=None`` means ``4 * d_model``).
    dropout : float
        The dropout probability in training (:func:`gpt2_layout`).
    batch_size, max_steps, peak_lr, warmup_steps : int, int, float, int
        The recipe. Training windows of ``context_length`` tokens start every
        ``context_length // 2`` tokens of the training stream; ``max_steps`` updates
        are made (no early stopping).
    heldout_fraction, validation_fraction : float
        The held-out and validation shares of the corpus
        (:func:`~tinyformer.data.corpus.stdlib_docstrings`).
    eval_stride : int
        The stride of the final sliding-window evaluations (:func:`sliding_window_losses`).
    eval_every, n_eval_windows : int
        Every ``eval_every`` steps the history gets the mean loss (nats per token) on
        ``n_eval_windows`` windows spread evenly over the validation stream (each window
        cut, not slid: a cheap curve, not the final score). The held-out text is read
        only after training.
    max_ngram_order : int
        The longest n-gram of the baselines (:func:`ngram_baselines`).
    compare_vocab_sizes : tuple of int
        Other tokenizer sizes over whose tokens the baselines are scored too
        (:func:`best_ngram`): the baselines' best need not be at the model's vocabulary.
    log_every : int
        Steps between the training rows of the history.
    dtype : str
        ``"float32"`` or ``"float64"``.
    progress : bool
        Show a progress bar.

    Returns
    -------
    ExperimentResult
        ``metrics``: ``heldout_bpb`` and ``validation_bpb`` (the model), ``bpb_<name>``
        for every baseline of
        :func:`ngram_baselines` over the model's tokens, ``best_ngram_bpb`` (their
        best), ``best_ngram_bpb_vocab_<V>`` for every size of ``compare_vocab_sizes``,
        ``best_ngram_bpb_any_vocab`` (the best of all) and ``margin_bpb`` (that best
        minus the model's: positive when the model wins), ``heldout_nats_per_token``,
        ``heldout_tokens`` and ``heldout_bytes`` (the predicted tokens and the bytes of
        the held-out text), ``train_tokens``, ``bytes_per_token`` (held-out), ``min_context``,
        ``tokens_seen`` and ``epochs`` (training tokens read, and over the stream's
        length), ``parameters``, ``tokenizer_seconds``, ``ngram_seconds``,
        ``eval_seconds``, and the recipe's ``steps``, ``train_seconds`` and
        ``cpu_seconds``. ``config`` holds, besides the model and the recipe,
        ``"corpus"`` (Python version, digests, sizes, held-out and validation packages),
        ``"tokenizer"``
        (its ``to_dict()``, see :func:`result_tokenizer`) and ``"evaluation"``.
    """
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    context_length = positive_int(context_length, "context_length")
    eval_stride = positive_int(eval_stride, "eval_stride")
    if eval_stride > context_length:
        raise ValueError(
            f"eval_stride must be at most context_length={context_length}, got {eval_stride}"
        )
    n_eval_windows = positive_int(n_eval_windows, "n_eval_windows")
    if d_ff is None:
        d_ff = 4 * positive_int(d_model, "d_model")
    config = gpt2_layout(
        vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        dropout=dropout,
        dtype=dtype,
    )
    max_ngram_order = positive_int(max_ngram_order, "max_ngram_order")
    eval_every = positive_int(eval_every, "eval_every")
    if isinstance(compare_vocab_sizes, str | int) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in compare_vocab_sizes
    ):
        raise TypeError(
            "compare_vocab_sizes must be a sequence of vocabulary sizes (int), got"
            f" {describe(compare_vocab_sizes)}"
        )
    smallest = N_SPECIAL + 256  # the special tokens and the byte alphabet
    for name, sizes in (
        ("vocab_size", [vocab_size]),
        ("compare_vocab_sizes", compare_vocab_sizes),
    ):
        if any(v < smallest for v in sizes):
            raise ValueError(
                f"{name} must be at least {smallest} ({N_SPECIAL} special tokens + 256 bytes),"
                f" got {vocab_size if name == 'vocab_size' else list(sizes)}"
            )
    corpus = corpus_for(
        python,
        library,
        heldout_fraction=heldout_fraction,
        validation_fraction=validation_fraction,
    )
    if not corpus.split("validation"):
        raise ValueError(
            f"validation_fraction={validation_fraction} sets no package aside for validation"
            " (each is larger than that share): the run needs validation text"
        )

    started = time.perf_counter()
    tokenizer = train_tokenizer(corpus, vocab_size)
    heldout_text = corpus.text("heldout")
    train_ids = tokenizer.encode(corpus.text("train"))
    heldout_ids, given = heldout_stream(tokenizer, heldout_text)
    validation_text = corpus.text("validation")
    validation_ids, validation_given = heldout_stream(tokenizer, validation_text)
    tokenizer_seconds = time.perf_counter() - started
    n_bytes = len(heldout_text.encode("utf-8"))
    for name, ids in (("held-out", heldout_ids), ("validation", validation_ids)):
        if ids.size < context_length + 2:
            raise ValueError(
                f"context_length must be below the {name} text's length in tokens"
                f" ({ids.size - 1}), got {context_length}"
            )

    started = time.perf_counter()
    baselines = ngram_baselines(
        train_ids, heldout_ids, vocab_size, max_order=max_ngram_order, start=given
    )
    other_vocabularies = {
        v: best_ngram(corpus, v, max_order=max_ngram_order)
        for v in sorted(set(compare_vocab_sizes) - {vocab_size})
    }
    ngram_seconds = time.perf_counter() - started
    scores = {f"bpb_{name}": bits_per_byte(value, n_bytes) for name, value in baselines.items()}
    elsewhere = {f"best_ngram_bpb_vocab_{v}": bpb for v, bpb in other_vocabularies.items()}
    broken = [k for k, v in {**scores, **elsewhere}.items() if not math.isfinite(v)]
    if broken:  # a degenerate count (no n-gram seen once) would make a zero probability
        raise FloatingPointError(f"baselines with an infinite score: {broken}")

    train = WindowDataset.from_tokens(
        train_ids, context_length, stride=max(context_length // 2, 1)
    )
    spread = np.linspace(0, validation_ids.size - context_length - 1, n_eval_windows).astype(int)
    probe = np.stack([validation_ids[s : s + context_length + 1] for s in spread])

    def probe_loss(model: Any) -> dict[str, float]:
        losses, _ = token_losses(model, probe[:, :-1], probe[:, 1:])
        return {"loss": float(losses.mean())}

    trainer = recipe.trainer(
        config,
        train,
        clip_norm=1.0,
        evaluate=probe_loss,
        eval_every=eval_every,
        log_every=log_every,
        progress=progress,
    )
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()

    started = time.perf_counter()
    validation_losses, _ = sliding_window_losses(model, validation_ids, stride=eval_stride)
    validation_nats = float(validation_losses[validation_given - 1 :].sum())
    losses, min_context = sliding_window_losses(model, heldout_ids, stride=eval_stride)
    losses = losses[given - 1 :]  # the text's tokens, not the separator's
    eval_seconds = time.perf_counter() - started
    nats = float(losses.sum())

    model_bpb = bits_per_byte(nats, n_bytes)
    best = min(scores.values())
    best_any = min([best, *elsewhere.values()])
    tokens_seen = float(trainer.step * batch_size * context_length)
    metrics = {
        "heldout_bpb": model_bpb,
        "validation_bpb": bits_per_byte(validation_nats, len(validation_text.encode("utf-8"))),
        **scores,
        "best_ngram_bpb": best,
        **elsewhere,
        "best_ngram_bpb_any_vocab": best_any,
        "margin_bpb": best_any - model_bpb,
        "heldout_nats_per_token": nats / losses.size,
        "heldout_tokens": float(losses.size),
        "heldout_bytes": float(n_bytes),
        "train_tokens": float(train_ids.size),
        "bytes_per_token": n_bytes / losses.size,
        "min_context": float(min_context),
        "tokens_seen": tokens_seen,
        "epochs": tokens_seen / train_ids.size,
        "parameters": float(parameter_count(config)),
        "tokenizer_seconds": tokenizer_seconds,
        "ngram_seconds": ngram_seconds,
        "eval_seconds": eval_seconds,
    }
    settings = {
        "corpus": {
            "python": python,
            "library": library,
            "digest": corpus.digest,
            "heldout_fraction": corpus.heldout_fraction,
            "heldout_modules": sorted(corpus.heldout_modules),
            "validation_fraction": corpus.validation_fraction,
            "validation_modules": sorted(corpus.validation_modules),
            **corpus.summary(),
        },
        "tokenizer": tokenizer.to_dict(),
        "evaluation": {
            "stride": eval_stride,
            "n_eval_windows": n_eval_windows,
            "max_ngram_order": max_ngram_order,
            "compare_vocab_sizes": sorted(other_vocabularies),
            "separator_tokens": given,
            "train_window_stride": max(context_length // 2, 1),
        },
    }
    if not all(math.isfinite(v) for v in metrics.values()):
        raise FloatingPointError(f"a metric is not finite: {metrics}")
    return recipe.result("real_text", trainer, metrics, settings)
