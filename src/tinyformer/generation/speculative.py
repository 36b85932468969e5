"""Speculative decoding: a small draft model proposes, the large target model verifies.

The draft generates ``n_draft`` tokens one at a time; the target scores all of
them in a single ``step`` of ``n_draft + 1`` positions. Tokens are accepted in
order by a rejection rule that makes the output follow the *target's*
distribution exactly :cite:p:`leviathan2023fast,chen2023accelerating`, so a
good draft buys several target tokens per target call at no cost in quality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyformer._validation import generator, positive_int
from tinyformer.data.tokenizers import BOS_ID
from tinyformer.generation.decoding import (
    FAMILY_DEFAULT,
    IncrementalDecoder,
    evaluation_mode,
    is_encoder_decoder,
    prepare,
)
from tinyformer.generation.processing import check_temperature, probabilities, sample_tokens

__all__ = ["SpeculativeResult", "speculative_decode"]


@dataclass(frozen=True)
class SpeculativeResult:
    """Output and statistics of :func:`~tinyformer.generation.speculative.speculative_decode`.

    Attributes
    ----------
    tokens : numpy.ndarray
        Generated ids (without prompt or BOS), ending with EOS if ``finished``.
    finished : bool
        Ended with EOS (otherwise at ``max_new_tokens``).
    target_calls, draft_calls : int
        Number of ``step`` calls of each model.
    proposed, accepted : int
        Draft tokens proposed, and those the target accepted.
    """

    tokens: np.ndarray
    finished: bool
    target_calls: int
    draft_calls: int
    proposed: int
    accepted: int

    @property
    def kept_fraction(self) -> float:
        r"""``accepted / proposed``: the share of draft tokens kept; NaN if none was proposed.

        Not the acceptance rate :math:`\alpha` of :cite:t:`leviathan2023fast`, the expected
        :math:`\sum_x \min(p(x), q(x))` of one examined proposal: a round stops at its first
        rejection, so the proposals after it are counted here as not kept without having
        been examined, and the fraction comes out below :math:`\alpha`.
        """
        return self.accepted / self.proposed if self.proposed else float("nan")


def _check_pair(target: Any, draft: Any) -> None:
    if is_encoder_decoder(target) != is_encoder_decoder(draft):
        raise TypeError(
            "target and draft must be of the same family (both decoder-only or both"
            " encoder-decoder)"
        )
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            "target and draft must share one vocabulary: target.vocab_size is"
            f" {target.vocab_size}, draft.vocab_size is {draft.vocab_size}"
        )


def speculative_decode(
    target: Any,
    draft: Any,
    inputs: np.ndarray,
    *,
    max_new_tokens: int,
    n_draft: int = 4,
    rng: np.random.Generator | None = None,
    temperature: float = 1.0,
    bos_id: int = BOS_ID,
    eos_id: int | None = FAMILY_DEFAULT,  # type: ignore[assignment]
    use_cache: bool = True,
) -> SpeculativeResult:
    r"""Generate from ``target`` with proposals from ``draft``; the output follows ``target``.

    One round, with :math:`p` and :math:`q` the target's and the draft's next-token
    distributions (after ``temperature``) and :math:`\gamma` = ``n_draft``:

    1. the draft proposes :math:`x_1, \dots, x_\gamma`, :math:`x_i \sim q(\cdot \mid x_{<i})`;
    2. the target computes :math:`p(\cdot \mid x_{<i})` for :math:`i = 1, \dots, \gamma + 1`
       in ONE call;
    3. :math:`x_i` is accepted with probability :math:`\min(1, p(x_i) / q(x_i))`, in
       order; at the first rejection the round ends with a token drawn from
       :math:`\operatorname{normalize}(\max(0, p - q))`, and if all are accepted
       with a bonus token drawn from :math:`p(\cdot \mid x_{\le\gamma})`.

    Each round adds between 1 and :math:`\gamma + 1` tokens for one target call,
    and both models' caches are rolled back past the rejected proposals with
    ``DecodeState.truncate``. With ``rng=None`` the rule is the greedy one: the
    draft proposes its argmax, a proposal is accepted while it equals the
    target's argmax, and the output is exactly the target's greedy output.

    Parameters
    ----------
    target, draft : DecoderOnlyLM or EncoderDecoder
        Two models of the same family and vocabulary (the draft normally smaller).
    inputs : numpy.ndarray
        ONE prompt or source: 1-D, or ``(1, T)``.
    max_new_tokens : int
        Most tokens to generate (EOS included).
    n_draft : int
        :math:`\gamma`, proposals per round; fewer near ``max_new_tokens``.
    rng : numpy.random.Generator, optional
        Sample (the output is distributed as sampling from the target); ``None``
        decodes greedily.
    temperature : float
        Applied to both models when sampling (ignored when greedy).
    bos_id, eos_id, use_cache
        As for :func:`~tinyformer.generation.search.greedy`.

    Returns
    -------
    SpeculativeResult
        The tokens and the counts of calls, proposals and accepted proposals.
    """
    _check_pair(target, draft)
    n_draft = positive_int(n_draft, "n_draft")
    if rng is not None:
        rng = generator(rng)
    temperature = check_temperature(temperature)
    if np.ndim(inputs) == 2 and np.shape(inputs)[0] != 1:
        raise ValueError(
            "speculative_decode decodes one input at a time: inputs must be 1-D or (1, T),"
            f" got shape {np.shape(inputs)}"
        )
    options = {"max_new_tokens": max_new_tokens, "bos_id": bos_id, "eos_id": eos_id}
    with evaluation_mode(target, draft):  # no dropout; the callers' modes come back
        run = prepare(draft, inputs, use_cache=use_cache, **options)  # checks fit the draft too
        run_target = prepare(target, inputs, use_cache=use_cache, **options)
        rounds = _Rounds(run_target.decoder, run.decoder, rng, temperature)
        committed = run.first_tokens[0].tolist()  # the prompt, or [BOS]
        start, limit = len(committed), run.max_new_tokens
        finished = False
        while len(committed) - start < limit and not finished:
            remaining = limit - (len(committed) - start)
            new_tokens = rounds.play(committed, min(n_draft, remaining - 1))
            for token in new_tokens[:remaining]:
                committed.append(token)
                if token == run.eos_id:
                    finished = True
                    break
    return SpeculativeResult(
        tokens=np.array(committed[start:], dtype=np.int64),
        finished=finished,
        target_calls=rounds.target_calls,
        draft_calls=rounds.draft_calls,
        proposed=rounds.proposed,
        accepted=rounds.accepted,
    )


class _Rounds:
    """The two decoders and the counters of one speculative run."""

    def __init__(
        self,
        target: IncrementalDecoder,
        draft: IncrementalDecoder,
        rng: np.random.Generator | None,
        temperature: float,
    ) -> None:
        self.target, self.draft, self.rng, self.temperature = target, draft, rng, temperature
        self.target_calls = self.draft_calls = self.proposed = self.accepted = 0

    def _distribution(self, logits: np.ndarray) -> np.ndarray:
        """``(n, V)`` logits -> the distributions to draw from (float64)."""
        return probabilities(logits.astype(np.float64), temperature=self.temperature)

    def _pick(self, probs: np.ndarray) -> int:
        """A token from ``probs`` ``(V,)``: drawn with the rng, or the argmax when greedy."""
        if self.rng is None:
            return int(np.argmax(probs))
        return int(sample_tokens(probs[None, :], self.rng)[0])

    def play(self, committed: list[int], n_propose: int) -> list[int]:
        """One round after the tokens ``committed``; return the tokens it adds (1 to n + 1)."""
        length = len(committed)
        tokens = np.array(committed, dtype=np.int64)[None, :]  # (1, L)
        proposals: list[int] = []
        draft_probs = []
        unfed = tokens[:, self.draft.length :]  # (1, >= 1): the draft lags by one or two
        for _ in range(n_propose):
            q = self._distribution(self.draft.feed(unfed)[0, -1:])[0]  # (V,)
            proposals.append(self._pick(q))
            draft_probs.append(q)
            unfed = np.array([[proposals[-1]]])
        self.draft_calls += n_propose
        drafted = np.array(proposals, dtype=np.int64)[None, :]  # (1, n_propose)
        verify = np.concatenate([tokens[:, self.target.length :], drafted], axis=1)
        target_probs = self._distribution(self.target.feed(verify)[0, -(n_propose + 1) :])
        self.target_calls += 1  # target_probs: (n_propose + 1, V)
        accepted, last = self._verify(proposals, draft_probs, target_probs)
        self.proposed += n_propose
        self.accepted += accepted
        self.target.truncate(length + accepted)
        self.draft.truncate(min(self.draft.length, length + accepted))
        return [*proposals[:accepted], last]

    def _verify(
        self, proposals: list[int], draft_probs: list[np.ndarray], target_probs: np.ndarray
    ) -> tuple[int, int]:
        """Number of proposals accepted, and the token that ends the round."""
        for i, token in enumerate(proposals):
            p, q = target_probs[i], draft_probs[i]
            if self.rng is None:
                if int(np.argmax(p)) != token:
                    return i, int(np.argmax(p))
            elif not self.rng.random() * q[token] < p[token]:
                residual = np.maximum(p - q, 0.0)
                if residual.sum() <= 0:  # p == q up to rounding: nothing to correct
                    residual = p
                return i, self._pick(residual)
        return len(proposals), self._pick(target_probs[-1])
