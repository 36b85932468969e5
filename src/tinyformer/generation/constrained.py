"""Constrained decoding: a finite-state automaton over tokens masks the logits at every step.

A :class:`TokenAutomaton` says, in each of its states, which tokens may come next
and which state each of them leads to. Decoding under it sets the logit of
every token the current state forbids to ``-inf`` before the usual processing
(temperature, top-k, top-p, min-p) and the draw, then moves the state along the
drawn token. Every output therefore spells a path of the automaton (a prefix
of a well-formed text) by construction, whatever the model's scores were
:cite:p:`willard2023efficient`. A regular expression compiles to such an
automaton; :func:`context_automaton` builds the one of a Markov source's
support, whose states are the last ``k`` tokens.

Limitation: a :class:`TokenAutomaton` has no accepting states and does not
gate EOS, so every path counts as well formed. That is right for a language
closed under prefixes (the Markov source's), not for one that must reach an end
state, such as JSON with its braces closed: an output cut off by
``max_new_tokens`` would be an unfinished prefix. A context-free grammar also
needs a parser's stack, which a finite automaton lacks.

The model's own log-probabilities are still what the result reports, and
:func:`allowed_mass` gives the probability the mask left at every step, so the
price of a constraint can be read from them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyformer._validation import as_array, describe, float_array, generator, token_ids
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

__all__ = [
    "TokenAutomaton",
    "allowed_mass",
    "constrained_sample",
    "context_automaton",
    "context_states",
    "mask_logits",
]


class TokenAutomaton:
    """A deterministic finite automaton whose symbols are token ids.

    Parameters
    ----------
    transitions : numpy.ndarray of int
        ``(S, V)``: ``transitions[s, v]`` is the state after token ``v`` in state
        ``s``, or ``-1`` where state ``s`` does not allow ``v``. Every state must
        allow at least one token, so decoding can never be stuck.

    Attributes
    ----------
    n_states, vocab_size : int
        :math:`S` and :math:`V`.
    """

    def __init__(self, transitions: np.ndarray) -> None:
        table = as_array(transitions, "transitions")
        if table.dtype.kind not in "iu":
            raise TypeError(
                f"transitions must be an integer array of states, got {describe(table)}"
            )
        table = table.astype(np.int64)
        if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] == 0:
            raise ValueError(
                f"transitions must have shape (S, V) with S, V >= 1, got {describe(table)}"
            )
        if table.min() < -1 or table.max() >= table.shape[0]:
            raise ValueError(
                f"transitions must hold states in [0, {table.shape[0]}) or -1, got"
                f" {table.min()}..{table.max()}"
            )
        dead = np.flatnonzero((table < 0).all(axis=1))
        if dead.size:
            raise ValueError(f"every state must allow a token; state {dead[0]} allows none")
        self.transitions = table
        self.n_states, self.vocab_size = table.shape

    def _states(self, states: object) -> np.ndarray:
        s = token_ids(states, "states", self.n_states)
        if s.ndim != 1:
            raise ValueError(f"states must have shape (B,), got shape {s.shape}")
        return s.astype(np.int64)

    def allowed(self, states: object) -> np.ndarray:
        """``(B, V)`` bool: the tokens each of the ``(B,)`` states allows next."""
        return self.transitions[self._states(states)] >= 0

    def advance(self, states: object, tokens: object) -> np.ndarray:
        """The ``(B,)`` states after reading one token per row; a forbidden token is a ValueError."""
        s = self._states(states)
        t = token_ids(tokens, "tokens", self.vocab_size)
        if t.shape != s.shape:
            raise ValueError(f"tokens must have shape {s.shape}, like states, got shape {t.shape}")
        after = self.transitions[s, t]  # (B,)
        if (after < 0).any():
            row = int(np.flatnonzero(after < 0)[0])
            raise ValueError(f"token {t[row]} is not allowed in state {s[row]} (row {row})")
        return after

    def walk(self, states: object, tokens: object) -> np.ndarray:
        """How many tokens of each row of ``tokens`` ``(B, T)`` are read before the first forbidden one.

        ``T`` for a row the automaton accepts whole, from its state in ``states`` ``(B,)``.
        """
        s = self._states(states)
        t = token_ids(tokens, "tokens", self.vocab_size)
        if t.ndim != 2 or t.shape[0] != s.shape[0]:
            raise ValueError(f"tokens must have shape ({s.shape[0]}, T), got shape {t.shape}")
        read = np.full(s.shape[0], t.shape[1], dtype=np.int64)  # (B,)
        alive = np.ones(s.shape[0], dtype=bool)
        for i in range(t.shape[1]):
            after = self.transitions[s, t[:, i]]  # (B,), -1 where forbidden
            broken = alive & (after < 0)
            read[broken] = i
            alive &= ~broken
            s = np.where(alive, after, 0)
        return read


def context_automaton(allowed: object) -> TokenAutomaton:
    r"""The automaton of the sequences a Markov source of order :math:`k` can write.

    Its states are the :math:`V^k` contexts (the last :math:`k` tokens, numbered
    :math:`c = \sum_j x_j V^{k-1-j}`, as :class:`~tinyformer.data.markov.MarkovSource`
    numbers them); token :math:`v` is allowed in context :math:`c` when
    ``allowed[x_1, ..., x_k, v]``, and leads to the context :math:`(x_2, \dots, x_k, v)`.

    Parameters
    ----------
    allowed : numpy.ndarray of bool
        Shape ``(V,) * (k + 1)``, for example ``source.transitions > 0``.

    Returns
    -------
    TokenAutomaton
        With :math:`S = V^k` states.
    """
    table = np.asarray(allowed)
    if table.dtype != bool or table.ndim < 2 or len(set(table.shape)) != 1:
        raise ValueError(
            f"allowed must be a boolean array of shape (V,) * (k + 1) with k >= 1, got {describe(table)}"
        )
    vocab_size, order = table.shape[0], table.ndim - 1
    n_contexts = vocab_size**order
    flat = table.reshape(n_contexts, vocab_size)  # (C, V)
    following = (np.arange(n_contexts)[:, None] * vocab_size + np.arange(vocab_size)) % n_contexts
    return TokenAutomaton(np.where(flat, following, -1))  # (C, V)


def context_states(prefixes: object, vocab_size: int, order: int) -> np.ndarray:
    """The context state (see :func:`context_automaton`) after each row of ``prefixes`` ``(B, T)``, ``T >= order``."""
    ids = token_ids(prefixes, "prefixes", vocab_size)
    if ids.ndim != 2 or ids.shape[1] < order:
        raise ValueError(
            f"prefixes must have shape (B, T) with T >= {order}, got shape {ids.shape}"
        )
    return ids[:, ids.shape[1] - order :].astype(np.int64) @ vocab_size ** np.arange(
        order - 1, -1, -1
    )


def mask_logits(logits: object, allowed: object) -> np.ndarray:
    """Set the logits of the tokens ``allowed`` ``(B, V)`` forbids to ``-inf`` (same dtype)."""
    z = float_array(logits, "logits", ndim=2)
    mask = as_array(allowed, "allowed")
    if mask.dtype != bool or mask.shape != z.shape:
        raise ValueError(
            f"allowed must be a boolean array of shape {z.shape}, got {describe(mask)}"
        )
    if not mask.any(axis=1).all():
        raise ValueError("allowed must allow at least one token in every row")
    return np.where(mask, z, z.dtype.type(-np.inf))  # (B, V)


def constrained_sample(
    model: Any,
    inputs: np.ndarray,
    automaton: TokenAutomaton,
    *,
    states: object,
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
    r"""Sample as :func:`~tinyformer.generation.sampling.sample` does, but only along ``automaton``.

    At each step, with :math:`A(s)` the tokens the row's state :math:`s` allows,

    .. math::
        \tilde z_v = z_v \text{ for } v \in A(s), \quad -\infty \text{ otherwise},

    then :math:`\tilde z` goes through the penalties (as in
    :func:`~tinyformer.generation.sampling.sample`; ``-inf`` stays ``-inf``),
    temperature, top-k, top-p and min-p, and one token is drawn; the state moves along it. No forbidden token can be drawn,
    since its probability is exactly 0. The result is the model's distribution
    renormalized over the allowed tokens at every step, which is not in general
    the model's distribution over sequences conditioned on being well formed.

    Parameters
    ----------
    model, inputs, rng, max_new_tokens, temperature, top_k, top_p, min_p
        As for :func:`~tinyformer.generation.sampling.sample`.
    repetition_penalty, frequency_penalty, presence_penalty, bos_id, eos_id, use_cache, overflow
        As for :func:`~tinyformer.generation.sampling.sample`.
    automaton : TokenAutomaton
        Over the model's vocabulary.
    states : numpy.ndarray of int
        ``(B,)``: each row's state before its first new token (for a Markov
        source, :func:`context_states` of the prompts).

    Returns
    -------
    GenerationResult
        As :func:`~tinyformer.generation.sampling.sample`'s, with the unprocessed
        model's log-probabilities; every row is a path of ``automaton``.
    """
    if not isinstance(automaton, TokenAutomaton):
        raise TypeError(f"automaton must be a TokenAutomaton, got {describe(automaton)}")
    rng = generator(rng)
    current = automaton._states(states)  # (B,)
    penalties = check_penalties(repetition_penalty, frequency_penalty, presence_penalty)
    penalized = penalties != (1.0, 0.0, 0.0)

    def check(vocab_size: int) -> None:
        check_options(vocab_size, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        if vocab_size != automaton.vocab_size:
            raise ValueError(
                f"automaton has {automaton.vocab_size} tokens, the model {vocab_size}"
            )

    def choose(logits: np.ndarray) -> np.ndarray:
        nonlocal current
        masked = mask_logits(logits, automaton.allowed(current))  # (B, V)
        if penalized:  # run.decoder.prefix: (B, length), every token fed so far
            masked = penalize(
                masked,
                run.decoder.prefix,
                repetition_penalty=repetition_penalty,
                frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty,
            )
        p = probabilities(masked, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        chosen = sample_tokens(p, rng)  # (B,)
        current = automaton.advance(current, chosen)
        return chosen

    with evaluation_mode(model):
        run = prepare(
            model,
            inputs,
            max_new_tokens=max_new_tokens,
            bos_id=bos_id,
            eos_id=eos_id,
            use_cache=use_cache,
            overflow=overflow,
            check=check,
        )
        if run.first_tokens.shape[0] != current.shape[0]:
            raise ValueError(
                f"states must have one state per row, {run.first_tokens.shape[0]}, got"
                f" {current.shape[0]}"
            )
        return generate(run, choose)


def allowed_mass(
    model: Any, prompts: object, outputs: object, automaton: TokenAutomaton, *, states: object
) -> np.ndarray:
    r"""The model's probability of the tokens ``automaton`` allows, at every step of ``outputs``.

    With :math:`s_t` the state before output token :math:`t` (``states`` before
    the first, then along the output) and :math:`p` the unprocessed model,

    .. math::
        A_t = \sum_{v \in A(s_t)} p(v \mid x, y_{<t}),

    the mass the mask keeps at step :math:`t`; :math:`1 - A_t` is what it removes.
    At temperature 1 with no filter, the mask draws a well-formed output :math:`y`
    with probability :math:`p(y) / \prod_t A_t`.

    Parameters
    ----------
    model : DecoderOnlyLM
        Anything with ``forward(ids)`` returning ``(B, T, V)`` logits, run in
        evaluation mode; prompt and outputs together must fit its context.
    prompts : numpy.ndarray of int
        ``(B, P)`` with ``P >= 1``.
    outputs : numpy.ndarray of int
        ``(B, T)``: tokens generated after each prompt; each row must be a path of
        ``automaton`` from its state (for example the tokens of :func:`constrained_sample`).
    automaton : TokenAutomaton
        Over the model's vocabulary.
    states : numpy.ndarray of int
        ``(B,)``: each row's state before its first output token.

    Returns
    -------
    numpy.ndarray
        ``(B, T)`` float64 in :math:`(0, 1]`.
    """
    if not isinstance(automaton, TokenAutomaton):
        raise TypeError(f"automaton must be a TokenAutomaton, got {describe(automaton)}")
    x = token_ids(prompts, "prompts", automaton.vocab_size)
    y = token_ids(outputs, "outputs", automaton.vocab_size)
    s = automaton._states(states)  # (B,)
    if x.ndim != 2 or x.shape[1] == 0 or x.shape[0] != s.shape[0]:
        raise ValueError(f"prompts must have shape ({s.shape[0]}, P) with P >= 1, got {x.shape}")
    if y.ndim != 2 or y.shape[0] != s.shape[0] or y.shape[1] == 0:
        raise ValueError(f"outputs must have shape ({s.shape[0]}, T) with T >= 1, got {y.shape}")
    allowed = np.empty((*y.shape, automaton.vocab_size), dtype=bool)  # (B, T, V)
    for t in range(y.shape[1]):
        allowed[:, t] = automaton.allowed(s)
        s = automaton.advance(s, y[:, t])  # a forbidden token is a ValueError
    with evaluation_mode(model):
        logits = model.forward(np.concatenate([x, y[:, :-1]], axis=1))  # (B, P + T - 1, V)
    p = probabilities(np.asarray(logits, dtype=np.float64)[:, x.shape[1] - 1 :])  # (B, T, V)
    return (p * allowed).sum(axis=-1)  # (B, T)
