"""Deterministic decoding: greedy search and beam search.

Both work with either model family (see :mod:`tinyformer.generation.decoding`):
a decoder-only model continues a prompt, an encoder-decoder decodes from BOS
given a source. Generated tokens include the EOS token that ended them, and
their log-probabilities are the model's own (the softmax of its logits), so the
score of a sequence is the sum of its tokens' log-probabilities.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int
from tinyformer.data.tokenizers import BOS_ID
from tinyformer.functional import log_softmax
from tinyformer.generation.decoding import (
    FAMILY_DEFAULT,
    GenerationResult,
    evaluation_mode,
    generate,
    prepare,
)

__all__ = ["BeamSearchResult", "Hypothesis", "beam_search", "greedy", "length_normalizer"]


def greedy(
    model: Any,
    inputs: np.ndarray,
    *,
    max_new_tokens: int,
    bos_id: int = BOS_ID,
    eos_id: int | None = FAMILY_DEFAULT,  # type: ignore[assignment]
    use_cache: bool = True,
    overflow: str = "slide",
) -> GenerationResult:
    r"""Pick the most likely next token at every step.

    That is, :math:`y_t = \arg\max_v p(v \mid y_{<t})`.

    Parameters
    ----------
    model : DecoderOnlyLM or EncoderDecoder
        The model (anything with the ``start``/``step`` interface).
    inputs : numpy.ndarray
        The prompt (decoder-only) or the source (encoder-decoder): token ids,
        1-D for one sequence or ``(B, T)`` for a batch.
    max_new_tokens : int
        Most tokens to generate per row (EOS included).
    bos_id : int
        First decoder input of an encoder-decoder (unused for a decoder-only model).
    eos_id : int or None, optional
        A row stops after generating this token; ``None`` never stops early.
        The default is ``EOS_ID`` (2) for an
        encoder-decoder and ``None`` for a decoder-only model.
    use_cache : bool
        Reuse the key/value caches (``False`` recomputes the whole prefix each step).
    overflow : str
        Decoder-only models: ``"slide"`` (the default, as nanoGPT and minGPT do)
        keeps generating once the prompt and the new tokens outgrow the
        context, the model reading the most recent ``context_length`` tokens;
        ``"error"`` refuses such a request up front.

    Returns
    -------
    GenerationResult
        Tokens (EOS included), their log-probabilities and which rows finished.
        Ties between equally likely tokens go to the smaller id. The model runs
        in evaluation mode (no dropout) and is given back in its own mode.
    """
    with evaluation_mode(model):
        run = prepare(
            model,
            inputs,
            max_new_tokens=max_new_tokens,
            bos_id=bos_id,
            eos_id=eos_id,
            use_cache=use_cache,
            overflow=overflow,
        )
        return generate(run, lambda logits: np.argmax(logits, axis=-1))


def length_normalizer(length: int, alpha: float) -> float:
    r"""GNMT's length penalty :math:`\mathrm{lp}(y) = \bigl((5 + |y|)/6\bigr)^\alpha` :cite:p:`wu2016google`.

    Beam search ranks finished hypotheses by :math:`\log p(y) / \mathrm{lp}(y)`.
    With :math:`\alpha = 0` this is the plain log-probability, which favours short
    outputs (every token adds a negative term); larger :math:`\alpha` favours
    longer ones. :math:`\mathrm{lp} = 1` for a single token.
    """
    return ((5.0 + length) / 6.0) ** alpha


@dataclass(frozen=True)
class Hypothesis:
    """One output of beam search.

    Attributes
    ----------
    tokens : numpy.ndarray
        Generated ids (without prompt or BOS), ending with EOS if ``finished``.
    log_prob : float
        Sum of the tokens' log-probabilities under the model.
    score : float
        ``log_prob / length_normalizer(len(tokens), length_penalty)``: what beams are ranked by.
    finished : bool
        Ended with EOS (otherwise it was cut at ``max_new_tokens``).
    """

    tokens: np.ndarray
    log_prob: float
    score: float
    finished: bool


@dataclass(frozen=True)
class BeamSearchResult:
    """Hypotheses of :func:`~tinyformer.generation.search.beam_search`, best score first, and how many steps it ran."""

    hypotheses: list[Hypothesis]
    steps: int

    @property
    def best(self) -> Hypothesis:
        """The hypothesis with the highest score."""
        return self.hypotheses[0]


def _check_alpha(length_penalty: object) -> float:
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real):
        raise TypeError(f"length_penalty must be a number >= 0, got {describe(length_penalty)}")
    if not np.isfinite(length_penalty) or length_penalty < 0:
        raise ValueError(f"length_penalty must be a finite number >= 0, got {length_penalty}")
    return float(length_penalty)


def beam_search(
    model: Any,
    inputs: np.ndarray,
    *,
    beam_size: int,
    max_new_tokens: int,
    length_penalty: float = 0.6,
    bos_id: int = BOS_ID,
    eos_id: int | None = FAMILY_DEFAULT,  # type: ignore[assignment]
    use_cache: bool = True,
    overflow: str = "slide",
) -> BeamSearchResult:
    r"""Keep the ``beam_size`` most likely partial outputs at every step.

    At each step every live hypothesis :math:`y` is extended by every token
    :math:`v`, scored by :math:`\log p(y) + \log p(v \mid y)`, and the candidates
    are taken best first (ties: the earlier beam, then the smaller token id). A
    candidate ending in EOS leaves the beam as a *finished* hypothesis, ranked
    by :math:`\log p(y) / \mathrm{lp}(y)` (:func:`~tinyformer.generation.search.length_normalizer`); the others
    fill the beam until it holds ``beam_size``. The caches follow their
    hypotheses through ``DecodeState.select``.

    The search stops when ``max_new_tokens`` are generated (the live hypotheses
    then join the results, unfinished) or when no live hypothesis can still beat
    the best finished one. The bound is exact: log-probabilities only fall as a
    hypothesis grows, so its best possible score is its current log-probability
    divided by the largest normalizer it could still reach.

    Parameters
    ----------
    model : DecoderOnlyLM or EncoderDecoder
        The model (anything with the ``start``/``step`` interface).
    inputs : numpy.ndarray
        ONE prompt or source: 1-D, or ``(1, T)``. Decode a batch row by row.
    beam_size : int
        Number of live hypotheses; 1 is greedy search when ``length_penalty=0``.
    max_new_tokens : int
        Most tokens per hypothesis (EOS included).
    length_penalty : float
        GNMT's :math:`\alpha \ge 0`; the default 0.6 is in the range
        :cite:t:`wu2016google` found best, 0 ranks by plain log-probability.
    bos_id, eos_id, use_cache, overflow
        As for :func:`~tinyformer.generation.search.greedy`; with ``eos_id=None`` nothing finishes early.

    Returns
    -------
    BeamSearchResult
        At most ``beam_size`` hypotheses, best score first.
    """
    beam_size = positive_int(beam_size, "beam_size")
    alpha = _check_alpha(length_penalty)
    if np.ndim(inputs) == 2 and np.shape(inputs)[0] != 1:
        raise ValueError(
            f"beam_search decodes one input at a time: inputs must be 1-D or (1, T), got"
            f" shape {np.shape(inputs)}"
        )
    with evaluation_mode(model):  # no dropout while searching; the caller's mode comes back
        run = prepare(
            model,
            inputs,
            max_new_tokens=max_new_tokens,
            bos_id=bos_id,
            eos_id=eos_id,
            use_cache=use_cache,
            overflow=overflow,
        )
        decoder, eos, limit = run.decoder, run.eos_id, run.max_new_tokens
        live_tokens = np.zeros((1, 0), dtype=np.int64)  # (k, t)
        live_scores = np.zeros(1)  # (k,) summed log-probabilities
        finished: list[Hypothesis] = []
        pending = run.first_tokens  # (k, n)
        step = 0
        for step in range(1, limit + 1):
            log_p = log_softmax(decoder.feed(pending)[:, -1]).astype(np.float64)  # (k, V)
            candidates = (live_scores[:, None] + log_p).ravel()  # (k * V,)
            order = np.argsort(-candidates, kind="stable")
            order = order[np.isfinite(candidates[order])]  # impossible tokens never enter
            keep: list[int] = []
            for flat in order:
                beam, token = divmod(int(flat), run.vocab_size)
                if token == eos:
                    ids = np.append(live_tokens[beam], token)
                    score = float(candidates[flat]) / length_normalizer(step, alpha)
                    finished.append(Hypothesis(ids, float(candidates[flat]), score, True))
                else:
                    keep.append(int(flat))
                if len(keep) == beam_size:
                    break
            if not keep:
                break
            beams, tokens = np.divmod(np.array(keep), run.vocab_size)
            live_tokens = np.concatenate([live_tokens[beams], tokens[:, None]], axis=1)
            live_scores = candidates[keep]
            if step == limit or _cannot_improve(finished, live_scores, alpha, limit):
                break
            decoder.reorder(beams)
            pending = tokens[:, None]
        if step == limit and keep:
            normalizer = length_normalizer(limit, alpha)
            finished += [
                Hypothesis(ids, float(s), float(s) / normalizer, False)
                for ids, s in zip(live_tokens, live_scores, strict=True)
            ]
        finished.sort(key=lambda h: -h.score)  # stable: earlier (shorter) hypotheses win ties
        return BeamSearchResult(hypotheses=finished[:beam_size], steps=step)


def _cannot_improve(
    finished: list[Hypothesis], live_scores: np.ndarray, alpha: float, limit: int
) -> bool:
    """Whether no live hypothesis can end with a better score than the best finished one."""
    if not finished:
        return False
    best_possible = float(live_scores.max()) / length_normalizer(limit, alpha)
    return best_possible <= max(h.score for h in finished)
