"""The live exercise of the chapter on language modeling: the entropy rate of a Markov source."""

from __future__ import annotations

import numpy as np

from tinyformer.data import MarkovSource
from tinyformer.exercises import Case, Exercise


def _reference(transitions):
    """The package's entropy rate of the source with this transition table."""
    return MarkovSource(transitions).entropy_rate


def _stationary(table, vocab_size):
    """The stationary distribution of the chain on contexts, solved as a linear system."""
    n = table.shape[0]
    chain = np.zeros((n, n))
    for c in range(n):
        for x in range(vocab_size):
            chain[c, (c * vocab_size) % n + x] += table[c, x]
    system = chain.T - np.eye(n)
    system[-1] = 1.0
    rhs = np.zeros(n)
    rhs[-1] = 1.0
    return np.linalg.solve(system, rhs)


def _flat(transitions):
    vocab_size = transitions.shape[-1]
    return transitions.reshape(-1, vocab_size), vocab_size


def _uniform_average(transitions):
    """Averages the contexts' entropies equally, as if every context were as likely as every other."""
    table, _ = _flat(transitions)
    logs = np.log(table, out=np.zeros_like(table), where=table > 0)
    return float(-(table * logs).sum(axis=1).mean())


def _zero_log_zero(transitions):
    """Computes p log p as written, so a forbidden transition gives 0 * log 0 = NaN."""
    table, vocab_size = _flat(transitions)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropies = -(table * np.log(table)).sum(axis=1)
    return float(_stationary(table, vocab_size) @ entropies)


def _in_bits(transitions):
    """Uses log base 2: bits per token, where the chapter's losses are in nats."""
    table, vocab_size = _flat(transitions)
    logs = np.log2(table, out=np.zeros_like(table), where=table > 0)
    return float(_stationary(table, vocab_size) @ -(table * logs).sum(axis=1))


def _cases() -> list[Case]:
    dense = np.array([[0.8, 0.15, 0.05], [0.5, 0.2, 0.3], [0.2, 0.3, 0.5]])
    sparse = np.array([[0.9, 0.1, 0.0], [0.5, 0.0, 0.5], [0.0, 0.3, 0.7]])
    small = MarkovSource.random(5, 2, 3, rng=np.random.default_rng(1)).transitions
    book_size = MarkovSource.random(16, 2, 4, rng=np.random.default_rng(2)).transitions
    return [
        Case((dense,), label="a first-order source over 3 symbols with every transition allowed"),
        Case((sparse,), label="a first-order source with forbidden transitions (probability 0)"),
        Case((small,), label="a random second-order source over 5 symbols"),
        Case(
            (book_size,),
            label="a random second-order source over 16 symbols with 4 successors per context",
        ),
    ]


ENTROPY_RATE = Exercise(
    chapter="language_modeling",
    name="entropy_rate",
    stub='''\
def entropy_rate(transitions):
    """The entropy rate of a Markov source of order k, in nats per token, as a float.

    transitions: shape (V,) * (k + 1); transitions[x_1, ..., x_k, x] is the probability
    that x follows the context x_1 ... x_k. Each context's row sums to 1; some entries
    may be 0 (forbidden transitions, which contribute 0 log 0 = 0). The chain is
    irreducible and aperiodic. The rate is the entropy of the next token after each
    context, averaged with the stationary probability of each context: the long-run
    share of positions at which it is the last k tokens. Emitting x in context
    (x_1, ..., x_k) moves the chain to context (x_2, ..., x_k, x).
    """
    raise NotImplementedError
''',
    reference=_reference,
    cases=_cases,
    rtol=1e-8,
    atol=1e-10,
    mistakes=(_uniform_average, _zero_log_zero, _in_bits),
)
"""Compute a Markov source's entropy rate: the floor under every language model's loss."""
