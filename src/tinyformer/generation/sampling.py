"""Ancestral sampling: draw each next token from the (processed) model distribution."""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer._validation import generator
from tinyformer.data.tokenizers import BOS_ID
from tinyformer.generation.decoding import (
    FAMILY_DEFAULT,
    GenerationResult,
    evaluation_mode,
    generate,
    prepare,
)
from tinyformer.generation.processing import (
    check_options,
    check_penalties,
    penalize,
    probabilities,
    sample_tokens,
)

__all__ = ["sample"]


def sample(
    model: Any,
    inputs: np.ndarray,
    *,
    rng: np.random.Generator,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    bos_id: int = BOS_ID,
    eos_id: int | None = FAMILY_DEFAULT,  # type: ignore[assignment]
    use_cache: bool = True,
    overflow: str = "slide",
) -> GenerationResult:
    r"""Generate by drawing every next token from the model's processed distribution.

    At each step, :math:`y_t \sim \tilde p(\cdot \mid y_{<t})`, where :math:`\tilde p`
    is the model's distribution after the penalties
    (:func:`~tinyformer.generation.processing.penalize`, on every token fed so
    far) and then temperature, top-k, top-p and min-p
    (:func:`~tinyformer.generation.processing.log_probabilities`). Each
    step draws one uniform number per row from ``rng``, so the same generator
    state gives the same output, with or without the cache.

    Parameters
    ----------
    model : DecoderOnlyLM or EncoderDecoder
        The model (anything with the ``start``/``step`` interface).
    inputs : numpy.ndarray
        The prompt (decoder-only) or the source (encoder-decoder), 1-D or ``(B, T)``;
        rows are sampled independently.
    rng : numpy.random.Generator
        The only source of randomness.
    max_new_tokens : int
        Most tokens per row (EOS included).
    temperature : float
        A finite number > 0 (0 is refused: use :func:`~tinyformer.generation.search.greedy`).
    top_k : int, optional
        Sample only among the ``top_k`` most likely tokens.
    top_p : float, optional
        Sample only from the nucleus of mass ``top_p`` :cite:p:`holtzman2020curious`.
    min_p : float, optional
        Sample only among tokens of probability at least ``min_p`` times the most
        likely one's :cite:p:`nguyen2025minp`.
    repetition_penalty, frequency_penalty, presence_penalty : float
        As for :func:`~tinyformer.generation.processing.penalize`; they count every
        token the model has read in the row: the prompt (or BOS) and the tokens
        generated so far. The defaults (1, 0, 0) change nothing.
    bos_id, eos_id, use_cache, overflow
        As for :func:`~tinyformer.generation.search.greedy`.

    Returns
    -------
    GenerationResult
        Tokens (EOS included) and their log-probabilities under the unprocessed
        model, run in evaluation mode (no dropout) and given back in its own mode.
    """
    rng = generator(rng)
    penalties = check_penalties(repetition_penalty, frequency_penalty, presence_penalty)
    penalized = penalties != (1.0, 0.0, 0.0)

    def choose(logits: np.ndarray) -> np.ndarray:
        if penalized:  # run.decoder.prefix: (B, length), every token fed so far
            logits = penalize(
                logits,
                run.decoder.prefix,
                repetition_penalty=repetition_penalty,
                frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty,
            )
        p = probabilities(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        return sample_tokens(p, rng)

    with evaluation_mode(model):
        run = prepare(
            model,
            inputs,
            max_new_tokens=max_new_tokens,
            bos_id=bos_id,
            eos_id=eos_id,
            use_cache=use_cache,
            overflow=overflow,
            check=lambda vocab_size: check_options(
                vocab_size,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                min_p=min_p,
            ),
        )
        return generate(run, choose)
