"""Step-by-step decoding with or without the key/value cache, shared by every search.

A model that decodes offers ``start`` and ``step`` (see :mod:`tinyformer.models`):
``start`` returns a decode state with empty caches, and ``step(tokens, state)``
feeds the next ``n`` tokens, returning their logits while extending the caches.
:class:`~tinyformer.generation.decoding.IncrementalDecoder` wraps a model and such a state and adds the
*uncached* mode, which recomputes the whole prefix at every call; both modes
return the same logits, which is what makes the uncached mode the baseline of
the cache benchmark.

The two families that generate are told apart by the class attribute ``family``:
``"decoder-only"`` (a language model, which continues a prompt) or
``"encoder-decoder"`` (which decodes from a BOS token given a source).

Every search runs the model in evaluation mode (:func:`evaluation_mode`), so
dropout never makes greedy decoding random, and gives the caller's model back
in the mode it came in.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer._validation import describe, non_negative_int, one_of, positive_int, token_ids
from tinyformer.data.tokenizers import EOS_ID
from tinyformer.functional import log_softmax

__all__ = [
    "FAMILY_DEFAULT",
    "GenerationResult",
    "IncrementalDecoder",
    "evaluation_mode",
    "is_encoder_decoder",
]

FAMILIES = ("decoder-only", "encoder-decoder")
OVERFLOW = ("slide", "error")
"""What a decoder-only model does when the prompt and the new tokens outgrow its context."""


class _FamilyDefault:
    """The default of ``eos_id``: ``EOS_ID`` (2) for an encoder-decoder, None for a decoder-only model."""

    def __repr__(self) -> str:
        return "FAMILY_DEFAULT"


FAMILY_DEFAULT = _FamilyDefault()
"""``eos_id``'s default: stop at EOS (id 2) with an encoder-decoder, never stop early with a
decoder-only model (a language model has no end token unless its data had one)."""


def is_encoder_decoder(model: object) -> bool:
    """Whether ``model`` is an encoder-decoder (True) or a decoder-only model (False).

    Read from the model's ``family`` attribute, ``"encoder-decoder"`` or
    ``"decoder-only"``.

    Raises
    ------
    TypeError
        If ``model`` has no ``start`` and ``step`` methods or no such ``family``.
    """
    start, step = getattr(model, "start", None), getattr(model, "step", None)
    if not callable(start) or not callable(step):
        raise TypeError(
            "model must have start() and step() methods (a tinyformer.models.DecoderOnlyLM or"
            f" EncoderDecoder), got {describe(model)}"
        )
    family = getattr(model, "family", None)
    if family not in FAMILIES:
        raise TypeError(
            "model.family must be 'decoder-only' or 'encoder-decoder' (the class attribute"
            f" that says which inputs start() takes), got {family!r}"
        )
    return family == "encoder-decoder"


@contextlib.contextmanager
def evaluation_mode(*models: Any) -> Iterator[None]:
    """Run the ``with`` block with every module of ``models`` in evaluation mode.

    Each module's own ``training`` flag is restored afterwards (also when the
    block raises), so a model that was training goes on training, with its
    sub-modules exactly as they were. Models that are not
    :class:`~tinyformer.module.Module` objects are left alone.
    """
    saved = [
        (module, module.training)
        for model in models
        if callable(getattr(model, "modules", None))
        for module in model.modules()
    ]
    try:
        for module, _ in saved:
            module.training = False
        yield
    finally:
        for module, flag in saved:
            module.training = flag


class IncrementalDecoder:
    """A model and its decode state: feed tokens, get logits, reorder or roll back rows.

    Parameters
    ----------
    model : DecoderOnlyLM or EncoderDecoder
        Anything with the ``start``/``step`` interface of :mod:`tinyformer.models`.
    source_ids : numpy.ndarray, optional
        ``(B, S)`` source token ids; required for an encoder-decoder, refused otherwise.
    batch_size : int, optional
        Number of rows for a decoder-only model (ignored for an encoder-decoder,
        whose batch is the number of sources).
    use_cache : bool
        Keep the model's key/value caches between calls (the normal way). With
        ``False`` every :meth:`feed` starts afresh and runs the model over the
        whole prefix, then keeps only the logits of the new positions.
    slide : bool
        Decoder-only models only: once the prefix outgrows the model's context
        (``context_length``), the model reads only its most recent
        ``context_length`` tokens. The positions of the cache no longer fit then
        (learned and sinusoidal positions are absolute), so from that point
        every :meth:`feed` restarts the cache on the window: correct, and as
        costly per token as decoding without a cache. Without ``slide`` an
        over-long prefix is the model's error.
    """

    def __init__(
        self,
        model: Any,
        *,
        source_ids: np.ndarray | None = None,
        batch_size: int | None = None,
        use_cache: bool = True,
        slide: bool = False,
    ) -> None:
        self.model = model
        self.encoder_decoder = is_encoder_decoder(model)
        if not isinstance(use_cache, bool):
            raise TypeError(f"use_cache must be True or False, got {describe(use_cache)}")
        if not isinstance(slide, bool):
            raise TypeError(f"slide must be True or False, got {describe(slide)}")
        if slide and self.encoder_decoder:
            raise ValueError("slide is for decoder-only models: a decoder's output cannot slide")
        self.use_cache = use_cache
        self.slide = slide
        self.cached = 0  # positions held by the cache (with slide, at most context_length)
        if self.encoder_decoder:
            if source_ids is None:
                raise ValueError("source_ids are required to decode with an encoder-decoder")
            self.source_ids: np.ndarray | None = token_ids(source_ids, "source_ids")
            if self.source_ids.ndim != 2:
                raise ValueError(
                    f"source_ids must have shape (B, S), got shape {self.source_ids.shape}"
                )
            rows = self.source_ids.shape[0]
        else:
            if source_ids is not None:
                raise ValueError("source_ids must be None for a decoder-only model")
            self.source_ids = None
            rows = positive_int(1 if batch_size is None else batch_size, "batch_size")
        self._tokens = np.zeros((rows, 64), dtype=np.int64)  # (B, capacity): grows by doubling
        self._length = 0  # every token fed so far is self._tokens[:, : self._length]
        self.state = self._start() if use_cache else None

    def _start(self) -> Any:
        if self.encoder_decoder:
            return self.model.start(self.source_ids)
        return self.model.start(self.prefix.shape[0])

    @property
    def prefix(self) -> np.ndarray:
        """``(B, length)`` int64: every token fed so far (a view; do not write to it)."""
        return self._tokens[:, : self._length]

    @prefix.setter
    def prefix(self, value: np.ndarray) -> None:
        self._tokens = np.array(value, dtype=np.int64)  # a copy the decoder owns
        self._length = self._tokens.shape[1]

    @property
    def batch_size(self) -> int:
        """Number of rows."""
        return self._tokens.shape[0]

    @property
    def length(self) -> int:
        """Number of decoder positions fed so far."""
        return self._length

    def feed(self, tokens: np.ndarray) -> np.ndarray:
        """Feed ``tokens`` ``(B, n)``, the next ``n`` decoder inputs; return their logits ``(B, n, V)``."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[0] != self.batch_size or tokens.shape[1] == 0:
            raise ValueError(
                f"tokens must have shape ({self.batch_size}, n) with n >= 1, got {tokens.shape}"
            )
        n, window, stop = (
            tokens.shape[1],
            self.model.context_length,
            self._length + tokens.shape[1],
        )
        if stop > self._tokens.shape[1]:  # double the buffer (amortized O(1) per token)
            grown = np.zeros((self.batch_size, max(stop, 2 * self._tokens.shape[1])), np.int64)
            grown[:, : self._length] = self.prefix
            self._tokens = grown
        self._tokens[:, self._length : stop] = tokens  # beyond length until the model accepts
        prefix = self._tokens[:, :stop]  # (B, length + n)
        if self.slide and n > window:
            raise ValueError(f"with slide, at most context_length={window} tokens fit one feed")
        if self.use_cache and not (self.slide and self.cached + n > window):
            logits = self.model.step(tokens, self.state)  # (B, n, V)
            self.cached += n
        else:  # afresh: no cache, or the window slid past what the cache holds
            visible = prefix[:, -window:] if self.slide else prefix  # (B, <= window)
            state = self._start()
            logits = self.model.step(visible, state)[:, -n:]
            if self.use_cache:
                self.state, self.cached = state, visible.shape[1]
        self._length = stop  # only once the model has accepted the tokens
        return logits

    def reorder(self, indices: np.ndarray) -> None:
        """Make row ``i`` a copy of the old row ``indices[i]`` (repeats allowed; beam search)."""
        indices = np.asarray(indices, dtype=np.int64)
        self.prefix = self.prefix[indices]
        if self.source_ids is not None:
            self.source_ids = self.source_ids[indices]
        if self.use_cache:
            self.state = self.state.select(indices)

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding rolls back this way)."""
        length = non_negative_int(length, "length")
        if length > self.length:
            raise ValueError(
                f"length must be at most the current length {self.length}, got {length}"
            )
        if self.slide and self.length > self.model.context_length:
            raise ValueError("truncate is not available once a sliding window has moved")
        self._length = length  # the forgotten tokens stay in the buffer, to be overwritten
        if self.use_cache:
            self.state.truncate(length)
            self.cached = length


@dataclass(eq=False)
class GenerationResult:
    """What :func:`~tinyformer.generation.search.greedy` and :func:`~tinyformer.generation.sampling.sample` return.

    Attributes
    ----------
    tokens : list of numpy.ndarray
        One array per input row: the generated ids, without the prompt (or BOS),
        ending with the EOS token when one was generated.
    token_log_probs : list of numpy.ndarray
        For each generated token, its log-probability under the model (the plain
        softmax of the logits: no temperature, top-k or top-p).
    finished : numpy.ndarray
        ``(B,)`` bool: the row ended with EOS (rather than at ``max_new_tokens``).
    """

    tokens: list[np.ndarray]
    token_log_probs: list[np.ndarray]
    finished: np.ndarray

    @property
    def log_prob(self) -> np.ndarray:
        """``(B,)`` total log-probability of each row's generated tokens."""
        return np.array([float(lp.sum()) for lp in self.token_log_probs])

    def __eq__(self, other: object) -> bool:
        """Equal when every row has the same tokens, log-probabilities and finished flag."""
        if not isinstance(other, GenerationResult):
            return NotImplemented
        return (
            _same_rows(self.tokens, other.tokens)
            and _same_rows(self.token_log_probs, other.token_log_probs)
            and np.array_equal(self.finished, other.finished)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value


def _same_rows(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _check_id(value: object, name: str, vocab_size: int, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "an integer token id or None" if optional else "an integer token id"
        raise TypeError(f"{name} must be {kind}, got {describe(value)}")
    if not 0 <= value < vocab_size:
        raise ValueError(f"{name} must be in [0, {vocab_size}), got {value}")
    return int(value)


def _as_rows(ids: object, name: str) -> np.ndarray:
    arr = token_ids(ids, name)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D sequence or a (B, T) array with B, T >= 1,"
            f" got shape {np.shape(ids)}"
        )
    return arr.astype(np.int64)


@dataclass
class _Prepared:
    """Checked inputs of one decoding run."""

    decoder: IncrementalDecoder
    first_tokens: np.ndarray  # (B, n): what the first call of feed() gets
    max_new_tokens: int
    eos_id: int | None
    vocab_size: int


def prepare(
    model: Any,
    inputs: object,
    *,
    max_new_tokens: object,
    bos_id: object,
    eos_id: object,
    use_cache: object,
    overflow: object = "error",
    check: Callable[[int], object] | None = None,
) -> _Prepared:
    """Check everything about a decoding run before any model work; build its decoder.

    A decoder-only model continues ``inputs`` (the prompt). With
    ``overflow="error"`` the prompt and the new tokens must fit in the
    context, ``T + max_new_tokens <= context_length``; with ``"slide"`` the
    model reads the most recent ``context_length`` tokens at every step (a
    longer prompt is cut to its last ``context_length`` tokens, which is all the
    model could see of it). An encoder-decoder encodes ``inputs`` (the source)
    and decodes from ``bos_id``; its decoder inputs are BOS and all but the
    last new token, so ``max_new_tokens <= context_length`` whatever
    ``overflow`` says. ``check(vocab_size)``, if given, checks the caller's own
    options before the model does any work.
    """
    overflow = one_of(overflow, OVERFLOW, "overflow")
    family_is_encoder_decoder = is_encoder_decoder(model)
    vocab_size = positive_int(model.vocab_size, "model.vocab_size")
    context_length = positive_int(model.context_length, "model.context_length")
    max_new_tokens = positive_int(max_new_tokens, "max_new_tokens")
    if eos_id is FAMILY_DEFAULT:
        eos_id = EOS_ID if family_is_encoder_decoder else None
    eos_id = _check_id(eos_id, "eos_id", vocab_size, optional=True)
    if check is not None:
        check(vocab_size)
    if family_is_encoder_decoder:
        source = _as_rows(inputs, "source")
        bos_id = _check_id(bos_id, "bos_id", vocab_size)
        pad_id = getattr(getattr(model, "config", None), "pad_id", None)
        if bos_id == pad_id:
            raise ValueError(
                f"bos_id={bos_id} is the model's pad_id: the decoder would mask its first input"
                " as padding; pass the BOS id the model was trained with"
            )
        if source.shape[1] > context_length:
            raise ValueError(
                f"source has {source.shape[1]} tokens, more than the model's context_length"
                f" {context_length}"
            )
        if max_new_tokens > context_length:
            raise ValueError(
                f"max_new_tokens must be at most the model's context_length {context_length} (BOS and"
                f" the new tokens but the last are decoder inputs), got {max_new_tokens}"
            )
        first = np.full((source.shape[0], 1), bos_id, dtype=np.int64)
        decoder = IncrementalDecoder(model, source_ids=source, use_cache=_flag(use_cache))
    else:
        prompt = _as_rows(inputs, "prompt")
        token_ids(prompt, "prompt", vocab_size)
        slide = overflow == "slide"
        if slide:
            prompt = prompt[:, -context_length:]  # all the model can see of a longer prompt
        length = prompt.shape[1]
        if length > context_length:
            raise ValueError(
                f"prompt has {length} tokens, more than the model's context length {context_length}"
                f" (pass overflow='slide' to keep the most recent {context_length})"
            )
        if not slide and length + max_new_tokens > context_length:
            raise ValueError(
                f"prompt length {length} + max_new_tokens {max_new_tokens} exceeds the model's"
                f" context length {context_length}: max_new_tokens can be at most"
                f" {context_length - length} (or pass overflow='slide' to keep the most recent"
                f" {context_length} tokens)"
            )
        first = prompt
        decoder = IncrementalDecoder(
            model, batch_size=prompt.shape[0], use_cache=_flag(use_cache), slide=slide
        )
    return _Prepared(decoder, first, max_new_tokens, eos_id, vocab_size)


def _flag(use_cache: object) -> bool:
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache must be True or False, got {describe(use_cache)}")
    return use_cache


def chosen_log_probs(logits: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    r"""``log_softmax(logits)[i, chosen[i]]`` for every row ``i``, without the whole table.

    .. math:: \log p_i = (z_{i c_i} - m_i) - \log \sum_v e^{z_{iv} - m_i}, \qquad m_i = \max_v z_{iv}

    The same operations as :func:`~tinyformer.functional.log_softmax` in the
    same order, so the same numbers to the last bit; only the chosen entry of
    each row is formed. Rows whose maximum is not finite go through
    ``log_softmax`` itself, for its checks and messages.

    Parameters
    ----------
    logits : numpy.ndarray
        ``(B, V)`` scores.
    chosen : numpy.ndarray
        ``(B,)`` integer token ids in ``[0, V)``.

    Returns
    -------
    numpy.ndarray
        ``(B,)`` log-probabilities, in the dtype of ``logits``.
    """
    row_max = logits.max(axis=1, keepdims=True)  # (B, 1)
    if not np.isfinite(row_max).all():
        return np.take_along_axis(log_softmax(logits), chosen[:, None], axis=1)[:, 0]
    shifted = logits - row_max  # (B, V)
    picked = shifted[np.arange(shifted.shape[0]), chosen]  # (B,), before exp overwrites them
    log_total = np.log(np.exp(shifted, out=shifted).sum(axis=1))  # (B,)
    return picked - log_total


def generate(run: _Prepared, choose: Callable[[np.ndarray], np.ndarray]) -> GenerationResult:
    """Decode every row of one batch: ``choose(logits (B, V)) -> tokens (B,)`` picks each token.

    A row stops at EOS; rows that stopped keep being fed EOS (their outputs are
    ignored) until every row has stopped or ``max_new_tokens`` are out.
    """
    decoder, rows = run.decoder, run.first_tokens.shape[0]
    token_columns: list[np.ndarray] = []
    log_prob_columns: list[np.ndarray] = []
    lengths = np.full(rows, run.max_new_tokens)
    finished = np.zeros(rows, dtype=bool)
    pending = run.first_tokens
    for t in range(run.max_new_tokens):
        logits = decoder.feed(pending)[:, -1]  # (B, V)
        chosen = np.asarray(choose(logits), dtype=np.int64)  # (B,)
        log_p = chosen_log_probs(logits, chosen)  # (B,)
        token_columns.append(chosen)
        log_prob_columns.append(log_p)
        if run.eos_id is not None:
            ended = ~finished & (chosen == run.eos_id)
            lengths[ended] = t + 1
            finished |= ended
            chosen = np.where(finished, run.eos_id, chosen)
        if run.eos_id is not None and finished.all():
            break
        pending = chosen[:, None]  # (B, 1)
    tokens = np.stack(token_columns, axis=1)  # (B, steps)
    log_probs = np.stack(log_prob_columns, axis=1)  # (B, steps)
    return GenerationResult(
        tokens=[tokens[i, : lengths[i]].copy() for i in range(rows)],
        token_log_probs=[log_probs[i, : lengths[i]].copy() for i in range(rows)],
        finished=finished,
    )
