r"""A synthetic language whose entropy rate is known exactly.

A Markov chain of order :math:`k` over :math:`V` symbols draws each token from a
distribution that depends only on the :math:`k` tokens before it, the
*context* :math:`c`. Seen as a chain on contexts it has a stationary
distribution :math:`\pi`, the solution of :math:`\pi P = \pi` with
:math:`\sum_c \pi(c) = 1`, and its entropy rate is :cite:p:`cover2006elements`

.. math::
    H = \sum_c \pi(c)\, H\bigl(p(\cdot \mid c)\bigr)
      = -\sum_c \pi(c) \sum_x p(x \mid c) \log p(x \mid c)
    \quad \text{nats per token.}

No model can predict the next token with a lower expected cross-entropy than
:math:`H`, so a language model trained on this source can be measured against
the best achievable loss. Tokens are the ids ``0 .. V - 1`` (no special tokens).

Contexts are numbered in base :math:`V`, oldest token first: the context
:math:`(x_1, \dots, x_k)` has index :math:`\sum_j x_j V^{k-j}`, and emitting
:math:`x` moves context :math:`c` to :math:`(c \bmod V^{k-1})\,V + x`.
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import describe, float_array, generator, positive_float, positive_int

__all__ = ["MarkovSource", "empirical_entropy_rate"]

MAX_CONTEXTS = 4096  # the stationary distribution is solved as a dense linear system
MIN_CONCENTRATION = 0.1
_ROW_SUM_TOLERANCE = 1e-9
_POSTERIOR_CHUNK = 256  # windows per forward-backward pass (memory B * T * V**k)


def _entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats along ``axis``, with 0 log 0 = 0."""
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(axis=axis)


def _next_context(
    contexts: np.ndarray, tokens: np.ndarray, vocab_size: int, n_contexts: int
) -> np.ndarray:
    """The context after emitting ``tokens`` in ``contexts``: drop the oldest, append the new."""
    return (contexts % (n_contexts // vocab_size)) * vocab_size + tokens


def _edges(n_contexts: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (context, next context) pair, in the row-major order of a ``(C, V)`` table."""
    contexts = np.repeat(np.arange(n_contexts), vocab_size)
    tokens = np.tile(np.arange(vocab_size), n_contexts)
    return contexts, _next_context(contexts, tokens, vocab_size, n_contexts)


def _ngrams(streams: np.ndarray, vocab_size: int, n: int) -> np.ndarray:
    """Base-``V`` index of every run of ``n`` consecutive tokens, shape ``(n_streams, L - n + 1)``."""
    width = streams.shape[1] - n + 1
    index = np.zeros((streams.shape[0], width), dtype=np.int64)
    for j in range(n):
        index = index * vocab_size + streams[:, j : j + width]
    return index


def _check_streams(tokens: object, vocab_size: int, order: int) -> np.ndarray:
    """``tokens`` as int64 streams ``(n, L)`` with ``L > order`` and ids below ``vocab_size``."""
    arr = np.asarray(tokens)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"tokens must be an integer array, got {describe(arr)}")
    streams = arr[None] if arr.ndim == 1 else arr
    if streams.ndim != 2 or streams.shape[1] <= order:
        raise ValueError(
            f"tokens must have shape (L,) or (n, L) with L > order={order}, got shape {arr.shape}"
        )
    if streams.min() < 0 or streams.max() >= vocab_size:
        raise ValueError(
            f"tokens must be ids in [0, {vocab_size}), got {streams.min()}..{streams.max()}"
        )
    return streams.astype(np.int64)


def _de_bruijn(vocab_size: int, order: int) -> list[int]:
    """A cyclic sequence of length ``V**k`` in which every ``k``-gram occurs exactly once.

    Concatenates, in lexicographic order, the Lyndon words whose length divides
    ``k``, generated one after another by Duval's algorithm.
    """
    sequence: list[int] = []
    word = [-1]
    while word:
        word[-1] += 1
        if order % len(word) == 0:
            sequence.extend(word)
        period = len(word)
        while len(word) < order:
            word.append(word[len(word) - period])
        while word and word[-1] == vocab_size - 1:
            word.pop()
    return sequence


def _reachable(start: int, src: np.ndarray, dst: np.ndarray, n_nodes: int) -> np.ndarray:
    """Breadth-first distance from ``start`` along edges ``src -> dst``; -1 if unreachable."""
    level = np.full(n_nodes, -1)
    level[start] = 0
    frontier = np.array([start])
    step = 0
    while frontier.size:
        step += 1
        reached = np.unique(dst[np.isin(src, frontier)])
        frontier = reached[level[reached] < 0]
        level[frontier] = step
    return level


def _check_ergodic(allowed: np.ndarray, vocab_size: int) -> None:
    """Raise unless the context chain is irreducible and aperiodic.

    ``allowed[c, x]`` says whether context ``c`` can emit ``x``. Irreducible:
    every context reaches context 0 and is reached from it. Aperiodic: the
    greatest common divisor of the cycle lengths, computed as the gcd of
    ``level(u) + 1 - level(v)`` over the edges ``u -> v`` (``level`` the
    breadth-first distance from context 0), is 1.
    """
    n_contexts = allowed.shape[0]
    contexts, successors = _edges(n_contexts, vocab_size)
    src, dst = contexts[allowed.ravel()], successors[allowed.ravel()]
    forward = _reachable(0, src, dst, n_contexts)
    backward = _reachable(0, dst, src, n_contexts)
    cut_off = int(((forward < 0) | (backward < 0)).sum())
    if cut_off:
        raise ValueError(
            f"transitions must make an irreducible chain: {cut_off} of {n_contexts} contexts"
            " cannot both reach and be reached from context 0"
        )
    period = int(np.gcd.reduce(np.abs(forward[src] + 1 - forward[dst])))
    if period != 1:
        raise ValueError(f"transitions must make an aperiodic chain, got period {period}")


def _check_transitions(transitions: object) -> np.ndarray:
    """The table as float64 of shape ``(V,) * (k + 1)``, rows checked to be distributions."""
    table = float_array(transitions, "transitions", min_ndim=2).astype(np.float64)
    vocab_size = table.shape[-1]
    if vocab_size < 2 or any(n != vocab_size for n in table.shape):
        raise ValueError(
            "transitions must have shape (V, ..., V) with V >= 2 (k context axes, then the"
            f" next token), got shape {table.shape}"
        )
    if table.size // vocab_size > MAX_CONTEXTS:
        raise ValueError(
            f"transitions has {table.size // vocab_size} contexts (V**k); at most"
            f" {MAX_CONTEXTS} are supported"
        )
    if not np.isfinite(table).all() or (table < 0).any():
        raise ValueError("transitions must be finite and non-negative probabilities")
    sums = table.sum(axis=-1)
    worst = np.unravel_index(np.argmax(np.abs(sums - 1.0)), sums.shape)
    if abs(sums[worst] - 1.0) > _ROW_SUM_TOLERANCE:
        raise ValueError(
            f"transitions[{', '.join(map(str, worst))}] must sum to 1 over the next token,"
            f" got {sums[worst]!r}"
        )
    return table / sums[..., None]


def _check_likelihoods(likelihoods: object, vocab_size: int) -> np.ndarray:
    """``likelihoods`` as finite, non-negative float64 of shape ``(B, T, V)``."""
    e = float_array(likelihoods, "likelihoods", min_ndim=3).astype(np.float64)
    if e.ndim != 3 or e.shape[2] != vocab_size or e.shape[0] == 0 or e.shape[1] == 0:
        raise ValueError(
            f"likelihoods must have shape (B, T, {vocab_size}) with B, T > 0, got shape {e.shape}"
        )
    if not np.isfinite(e).all() or (e < 0).any():
        raise ValueError("likelihoods must be finite and non-negative")
    return e


def _normalized(weights: np.ndarray) -> np.ndarray:
    """``weights`` divided by their sum over the last axis; raise if a sum is 0."""
    total = weights.sum(axis=-1, keepdims=True)
    if (total <= 0).any():
        raise ValueError("likelihoods give the observations probability 0 under this source")
    return weights / total


class MarkovSource:
    r"""A stationary Markov chain of order :math:`k` over :math:`V` symbols.

    Parameters
    ----------
    transitions : numpy.ndarray
        ``transitions[x_1, ..., x_k, x]`` is :math:`p(x \mid x_1 \dots x_k)`,
        shape ``(V,) * (k + 1)``; each row sums to 1 and the chain on contexts
        must be irreducible and aperiodic (checked). Usually made by
        :meth:`random`.

    Attributes
    ----------
    vocab_size, order, n_contexts : int
        :math:`V`, :math:`k` and :math:`V^k`.
    stationary : numpy.ndarray
        :math:`\pi`, shape ``(V,) * k``: the probability of each context, that
        is of each run of :math:`k` consecutive tokens.
    entropy_rate : float
        :math:`H` in nats per token.
    """

    def __init__(self, transitions: np.ndarray) -> None:
        table = _check_transitions(transitions)
        self.vocab_size = table.shape[-1]
        self.order = table.ndim - 1
        self.n_contexts = self.vocab_size**self.order
        self._probs = table.reshape(self.n_contexts, self.vocab_size)  # (C, V)
        _check_ergodic(self._probs > 0, self.vocab_size)
        self._cdf = np.cumsum(self._probs, axis=1)
        self._cdf /= self._cdf[:, -1:]  # exactly 1 from the last possible symbol on
        pi = self._solve_stationary()
        self.stationary = pi.reshape((self.vocab_size,) * self.order)
        self.context_entropies = _entropy(self._probs)  # (C,)
        self.entropy_rate = float(pi @ self.context_entropies)

    @classmethod
    def random(
        cls,
        vocab_size: int = 16,
        order: int = 2,
        branching: int = 4,
        *,
        rng: np.random.Generator,
        concentration: float = 1.0,
    ) -> MarkovSource:
        """A random sparse source: each context allows only ``branching`` next symbols.

        The allowed symbols of each context and their probabilities (drawn from
        a symmetric Dirichlet distribution with parameter ``concentration``) are
        random; ``concentration`` below 1 favours peaked distributions (lower
        entropy), above 1 flat ones. Two of the symbols are planted so that the chain is irreducible and
        aperiodic whatever the draw: the successor along a de Bruijn cycle
        through every context (with the symbols randomly relabeled), and, for
        the one context made of a single repeated symbol ``a``, the symbol
        ``a`` itself (a cycle of length 1).
        """
        vocab_size = positive_int(vocab_size, "vocab_size")
        order = positive_int(order, "order")
        branching = positive_int(branching, "branching")
        rng = generator(rng)
        concentration = positive_float(concentration, "concentration")
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
        if concentration < MIN_CONCENTRATION:
            raise ValueError(
                f"concentration must be at least {MIN_CONCENTRATION} (below it Dirichlet draws"
                f" can underflow to probability 0), got {concentration}"
            )
        if not 2 <= branching <= vocab_size:
            raise ValueError(f"branching must be in [2, vocab_size={vocab_size}], got {branching}")
        n_contexts = vocab_size**order
        if n_contexts > MAX_CONTEXTS:
            raise ValueError(
                f"vocab_size**order must be at most {MAX_CONTEXTS}, got {vocab_size}**{order}"
                f" = {n_contexts}"
            )
        cycle = rng.permutation(vocab_size)[_de_bruijn(vocab_size, order)]  # (C,)
        windows = np.stack([np.roll(cycle, -j) for j in range(order + 1)], axis=1)
        contexts = windows[:, :order] @ vocab_size ** np.arange(order - 1, -1, -1)
        priority = rng.random((n_contexts, vocab_size))  # lowest ones are allowed
        priority[contexts, windows[:, order]] = -2.0  # the de Bruijn successor
        repeated = cycle[0]  # context (a, ..., a) may emit a
        priority[repeated * (n_contexts - 1) // (vocab_size - 1), repeated] = -1.0
        allowed = np.argsort(priority, axis=1, kind="stable")[:, :branching]  # (C, b)
        weights = rng.dirichlet(np.full(branching, concentration), size=n_contexts)  # (C, b)
        table = np.zeros((n_contexts, vocab_size))
        np.put_along_axis(table, allowed, weights, axis=1)
        return cls(table.reshape((vocab_size,) * (order + 1)))

    @property
    def transitions(self) -> np.ndarray:
        r"""The table :math:`p(x \mid c)`, shape ``(V,) * (k + 1)`` (a copy)."""
        return self._probs.reshape((self.vocab_size,) * (self.order + 1)).copy()

    def _solve_stationary(self) -> np.ndarray:
        r"""Solve :math:`\pi P = \pi`, :math:`\sum \pi = 1` as one dense linear system."""
        n = self.n_contexts
        contexts, successors = _edges(n, self.vocab_size)
        P = np.zeros((n, n))
        np.add.at(P, (contexts, successors), self._probs.ravel())  # (C, C)
        A = P.T - np.eye(n)
        A[-1] = 1.0  # replace one (redundant) balance equation by the normalization
        b = np.zeros(n)
        b[-1] = 1.0
        pi = np.clip(np.linalg.solve(A, b), 0.0, None)
        return pi / pi.sum()

    def context_index(self, context: np.ndarray) -> np.ndarray:
        """Index of each context: ``context`` has shape ``(..., k)``, the result ``(...)``."""
        ctx = np.asarray(context)
        if ctx.dtype.kind not in "iu" or ctx.ndim < 1 or ctx.shape[-1] != self.order:
            raise ValueError(
                f"context must be integer ids of shape (..., {self.order}), got {describe(ctx)}"
            )
        if ctx.size and (ctx.min() < 0 or ctx.max() >= self.vocab_size):
            raise ValueError(
                f"context ids must be in [0, {self.vocab_size}), got {ctx.min()}..{ctx.max()}"
            )
        return ctx.astype(np.int64) @ self.vocab_size ** np.arange(self.order - 1, -1, -1)

    def next_token_probs(self, context: np.ndarray) -> np.ndarray:
        r""":math:`p(\cdot \mid c)` for contexts of shape ``(..., k)``; shape ``(..., V)``."""
        return self._probs[self.context_index(context)]

    def sample(
        self, length: int, rng: np.random.Generator, *, n_streams: int | None = None
    ) -> np.ndarray:
        r"""Token streams drawn from the stationary chain.

        The first ``k`` tokens are a context drawn from :math:`\pi`, so the
        stream is stationary from its first token on.

        Returns
        -------
        numpy.ndarray of int
            Shape ``(length,)``, or ``(n_streams, length)`` for that many
            independent streams (generated side by side, much faster than one
            long stream).
        """
        length = positive_int(length, "length")
        rng = generator(rng)
        n = 1 if n_streams is None else positive_int(n_streams, "n_streams")
        if length < self.order:
            raise ValueError(f"length must be at least the order {self.order}, got {length}")
        contexts = rng.choice(self.n_contexts, size=n, p=self.stationary.ravel())  # (n,)
        tokens = np.empty((n, length), dtype=np.int64)
        powers = self.vocab_size ** np.arange(self.order - 1, -1, -1)
        tokens[:, : self.order] = contexts[:, None] // powers % self.vocab_size
        uniforms = rng.random((length - self.order, n))
        for t, u in enumerate(uniforms, start=self.order):
            nxt = (self._cdf[contexts] <= u[:, None]).sum(axis=1)  # inverse CDF, (n,)
            tokens[:, t] = nxt
            contexts = _next_context(contexts, nxt, self.vocab_size, self.n_contexts)
        return tokens[0] if n_streams is None else tokens

    def sample_windows(
        self, n_windows: int, seq_len: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Language-model examples: ``n_windows`` independent stationary windows.

        Returns
        -------
        inputs, targets : numpy.ndarray of int
            Shape ``(n_windows, seq_len)`` each; ``targets[:, t]`` is the token
            that follows ``inputs[:, t]``. Predicting ``targets[:, t]`` from
            ``inputs[:, :t + 1]`` costs at least
            ``optimal_cross_entropy(seq_len)[t]`` nats on average.
        """
        seq_len = positive_int(seq_len, "seq_len")
        streams = self.sample(max(seq_len + 1, self.order), rng, n_streams=n_windows)
        return streams[:, :seq_len], streams[:, 1 : seq_len + 1]

    def optimal_cross_entropy(self, seq_len: int) -> np.ndarray:
        r"""The best achievable expected loss at each target position of a window.

        Target ``t`` (0-based) is predicted from the ``t + 1`` tokens before
        it. Once they cover a whole context (``t + 1 >= k``) the best loss is
        the entropy rate :math:`H`; before that it is the larger
        :math:`H(X_{t+1} \mid X_0 \dots X_t) = H(X_0 \dots X_{t+1}) - H(X_0 \dots X_t)`.

        Returns
        -------
        numpy.ndarray
            Shape ``(seq_len,)``, nats.
        """
        seq_len = positive_int(seq_len, "seq_len")
        # joint entropies of the first j tokens, j = 0 .. k, from the marginals of pi
        joint = [0.0] + [
            float(_entropy(self.stationary.sum(axis=tuple(range(j, self.order))).ravel()))
            for j in range(1, self.order + 1)
        ]
        out = np.full(seq_len, self.entropy_rate)
        for t in range(min(seq_len, self.order - 1)):
            out[t] = joint[t + 2] - joint[t + 1]
        return out

    def token_posteriors(self, likelihoods: np.ndarray, *, left_only: bool = False) -> np.ndarray:
        r"""Each token's distribution given noisy observations of the *other* tokens of a window.

        A window :math:`x_0 \dots x_{T-1}` drawn from the stationary chain is seen
        through independent noise: position :math:`t` yields an observation
        :math:`y_t` with probability ``likelihoods[..., t, v]`` when
        :math:`x_t = v` (a column of ones: nothing observed; a one-hot row: the
        token observed exactly). This is a hidden Markov model whose hidden state
        at :math:`t` is the context ending at :math:`t`, and the forward-backward
        recursions :cite:p:`rabiner1989tutorial` give, exactly,

        .. math::
            p(x_t = v \mid y_s,\ s \ne t) \quad\text{or, with left\_only,}\quad
            p(x_t = v \mid y_s,\ s < t).

        Multiplying by ``likelihoods[..., t, :]`` and normalizing gives the full
        posterior of :math:`x_t`; leaving position :math:`t` out lets a caller
        use a different noise model there.

        Parameters
        ----------
        likelihoods : numpy.ndarray
            ``(B, T, V)``, non-negative.
        left_only : bool
            Condition on the observations before :math:`t` only (the forward pass alone).

        Returns
        -------
        numpy.ndarray
            ``(B, T, V)`` float64, each row summing to 1.
        """
        e = _check_likelihoods(likelihoods, self.vocab_size)
        out = np.empty_like(e)
        for start in range(0, e.shape[0], _POSTERIOR_CHUNK):
            chunk = slice(start, start + _POSTERIOR_CHUNK)
            out[chunk] = self._token_posteriors(e[chunk], left_only)
        return out

    def _token_posteriors(self, e: np.ndarray, left_only: bool) -> np.ndarray:
        """:meth:`token_posteriors` on one chunk of windows (scaled forward-backward)."""
        b, t_len, v = e.shape
        rest = self.n_contexts // v  # contexts without their oldest token: V**(k-1)
        probs = self._probs.reshape(v, rest, v)  # [oldest, rest, next]
        prior = np.empty((b, t_len, self.n_contexts))  # p(s_t | y_<t), (B, T, C)
        prior[:, 0] = self.stationary.ravel()
        alpha = prior[:, 0] * np.tile(e[:, 0], rest)  # the last token of context c is c % V
        for t in range(1, t_len):
            alpha = _normalized(alpha)
            step = np.einsum("boa,oax->bax", alpha.reshape(b, v, rest), probs)  # (B, V^(k-1), V)
            prior[:, t] = step.reshape(b, -1)
            alpha = prior[:, t] * np.tile(e[:, t], rest)
        cavity = prior
        if not left_only:  # times p(y_>t | s_t), the backward messages
            beta = np.ones((b, self.n_contexts))
            for t in range(t_len - 2, -1, -1):
                g = (np.tile(e[:, t + 1], rest) * beta).reshape(b, rest, v)  # [rest, next]
                beta = np.einsum("oax,bax->boa", probs, g).reshape(b, -1)
                beta = _normalized(beta)
                cavity[:, t] *= beta
        return _normalized(cavity.reshape(b, t_len, rest, v).sum(axis=2))  # (B, T, V)

    def cross_entropy(self, tokens: np.ndarray) -> float:
        """The source's own mean negative log-likelihood of ``tokens`` (nats per token).

        Averaged over every token that has a full context before it (positions
        ``k`` onwards of each stream); on a long sample it approaches
        :attr:`entropy_rate`.
        """
        streams = _check_streams(tokens, self.vocab_size, self.order)
        contexts = _ngrams(streams[:, :-1], self.vocab_size, self.order)  # (n, L - k)
        probs = self._probs[contexts, streams[:, self.order :]]
        if (probs == 0).any():
            raise ValueError("tokens contain a transition this source cannot make")
        return float(-np.log(probs).mean())

    def __repr__(self) -> str:
        return (
            f"MarkovSource(vocab_size={self.vocab_size}, order={self.order},"
            f" entropy_rate={self.entropy_rate:.4f} nats)"
        )


def empirical_entropy_rate(tokens: np.ndarray, vocab_size: int, order: int) -> float:
    r"""Plug-in estimate of the entropy rate from counts of (context, next token).

    .. math::
        \hat H = \sum_c \frac{n_c}{N} H\Bigl(\frac{n_{c,\cdot}}{n_c}\Bigr)

    with :math:`n_{c,x}` the number of times context :math:`c` is followed by
    :math:`x` in ``tokens`` (shape ``(L,)`` or ``(n, L)``, each row a stream).
    It knows nothing of the source but its order and vocabulary, and is biased
    low by about (number of observed pairs - number of contexts) / (2N).
    """
    vocab_size = positive_int(vocab_size, "vocab_size")
    order = positive_int(order, "order")
    streams = _check_streams(tokens, vocab_size, order)
    pairs = _ngrams(streams, vocab_size, order + 1)  # context, then the next token
    counts = np.bincount(pairs.ravel(), minlength=vocab_size ** (order + 1))
    counts = counts.reshape(-1, vocab_size).astype(np.float64)  # (C, V)
    per_context = counts.sum(axis=1)
    seen = per_context > 0
    entropies = _entropy(counts[seen] / per_context[seen, None])
    return float((per_context[seen] @ entropies) / per_context.sum())
