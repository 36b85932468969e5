r"""A mixture-of-experts feed-forward layer: a learned router sends each token to k experts.

The layer holds ``n_experts`` feed-forward networks (each one of
:data:`~tinyformer.feedforward.FEED_FORWARDS`) and a router, a bias-free
``Linear`` from ``d_model`` to ``n_experts``. For a token :math:`x` with router
probabilities :math:`p = \operatorname{softmax}(x W_r)`, the k most probable
experts :math:`S` are run, and their outputs are added with gates

.. math:: y = \sum_{i \in S} g_i\, \operatorname{FFN}_i(x), \qquad
          g_i = \frac{p_i}{\sum_{j \in S} p_j},

the softmax renormalized over the chosen k. This is the top-k gating of
:cite:t:`shazeer2017outrageously` (a softmax over the k kept logits), which
Mixtral uses with k = 2 :cite:p:`jiang2024mixtral`. With ``renormalize=False``
the gates are the probabilities themselves, :math:`g_i = p_i`, as in the Switch
Transformer's top-1 routing :cite:p:`fedus2022switch`: renormalized, a single
gate is always 1 and the router would learn only from the auxiliary loss.

Only ``top_k`` of the experts run on a token, so the parameters a token uses
(:meth:`MixtureOfExperts.active_parameters_per_token`) are a fraction of the
layer's (:meth:`MixtureOfExperts.total_parameters`). Two further pieces come from
the Switch Transformer :cite:p:`fedus2022switch`: a *capacity* (each expert takes
at most a fixed number of tokens per forward pass; the assignments beyond it are
dropped and counted) and a *load-balancing loss* that pushes the router to
spread tokens evenly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tinyformer import functional
from tinyformer._validation import (
    describe,
    float_dtype,
    generator,
    layer_input,
    non_negative_float,
    positive_float,
    positive_int,
)
from tinyformer.feedforward import make_feed_forward
from tinyformer.layers import Linear
from tinyformer.module import Module

__all__ = ["MixtureOfExperts", "Routing", "expert_capacity", "moe_parameters"]

_EXPERT_KINDS = ("plain", "gated")


def expert_capacity(capacity_factor: float, n_tokens: int, top_k: int, n_experts: int) -> int:
    r"""Most tokens one expert takes in a forward pass of ``n_tokens`` tokens.

    .. math:: C = \left\lceil c \cdot \frac{N k}{E} \right\rceil

    :math:`N k / E` is each expert's share when the router is perfectly balanced;
    a capacity factor :math:`c > 1` leaves room for imbalance :cite:p:`fedus2022switch`.
    """
    capacity_factor = positive_float(capacity_factor, "capacity_factor")
    n_tokens = positive_int(n_tokens, "n_tokens")
    top_k = positive_int(top_k, "top_k")
    n_experts = positive_int(n_experts, "n_experts")
    # exact arithmetic on the decimal the caller wrote: 1.1 * 100 / 2 is 55, not 55.000000000000007
    share = Fraction(repr(capacity_factor)) * n_tokens * top_k / n_experts
    return math.ceil(share)


def moe_parameters(
    d_model: int,
    d_ff: int,
    n_experts: int,
    *,
    top_k: int = 2,
    feed_forward: str = "gated",
    bias: bool = False,
) -> tuple[int, int]:
    """Closed-form ``(total, active per token)`` parameter counts of :class:`MixtureOfExperts`.

    The router has ``d_model * n_experts`` weights; an expert has ``d_model * d_ff``
    per linear map (two if plain, three if gated), plus ``d_ff`` (``2 d_ff``
    if gated) and ``d_model`` biases. A token uses the router and ``top_k`` experts.
    """
    d_model, d_ff = positive_int(d_model, "d_model"), positive_int(d_ff, "d_ff")
    n_experts, top_k = positive_int(n_experts, "n_experts"), positive_int(top_k, "top_k")
    if feed_forward not in _EXPERT_KINDS:
        raise ValueError(f"feed_forward must be one of {_EXPERT_KINDS}, got {feed_forward!r}")
    width = 2 * d_ff if feed_forward == "gated" else d_ff
    expert = d_model * width + d_ff * d_model + ((width + d_model) if bias else 0)
    router = d_model * n_experts
    return router + n_experts * expert, router + min(top_k, n_experts) * expert


@dataclass(frozen=True)
class Routing:
    r"""What the router decided in the last forward pass (shapes for ``x`` of ``(..., d_model)``).

    Attributes
    ----------
    probabilities : numpy.ndarray
        ``(..., n_experts)``: the router's softmax for every token.
    choices : numpy.ndarray
        ``(..., top_k)`` integers: the chosen experts, most probable first (ties go
        to the lower index).
    gates : numpy.ndarray
        ``(..., top_k)``: the weight of each chosen expert's output.
    kept : numpy.ndarray
        ``(..., top_k)`` booleans: False where the assignment was dropped for capacity.
    capacity : int or None
        Most tokens an expert took (None: no limit).
    n_dropped : int
        Number of dropped (token, expert) assignments.
    load : numpy.ndarray
        ``(n_experts,)``: :math:`f_i`, the fraction of all assignments (before any
        dropping) that went to expert :math:`i`; it sums to one.
    importance : numpy.ndarray
        ``(n_experts,)``: :math:`P_i`, the router's mean probability for expert :math:`i`.
    aux_loss : float
        The load-balancing loss :math:`E \sum_i f_i P_i`.
    """

    probabilities: np.ndarray
    choices: np.ndarray
    gates: np.ndarray
    kept: np.ndarray
    capacity: int | None
    n_dropped: int
    load: np.ndarray
    importance: np.ndarray
    aux_loss: float


class MixtureOfExperts(Module):
    r"""Feed-forward layer of ``n_experts`` experts, each token routed to ``top_k`` of them.

    For the flattened tokens :math:`x_n` (:math:`N` of them) and router
    probabilities :math:`p_n = \operatorname{softmax}(x_n W_r)`, the output is
    :math:`y_n = \sum_{i \in S_n} g_{n i} \operatorname{FFN}_i(x_n)` over the
    ``top_k`` most probable experts :math:`S_n`, with the gates renormalized over
    them (see the module's description). Tokens are dispatched: each expert
    gathers the tokens routed to it, runs on those alone, and its outputs are
    scattered back, weighted by their gates.

    **Capacity.** With ``capacity_factor`` :math:`c`, an expert takes at most
    :math:`C = \lceil c N k / E \rceil` tokens per forward pass (:func:`expert_capacity`),
    every token's first choice before any token's second choice, and within one
    rank in token order (the flattened ``(..., d_model)`` order; GShard's priority,
    so an earlier token's second choice never displaces a later token's first);
    assignments to a full expert are dropped, counted in
    ``n_dropped``, and contribute zero (the residual connection around the layer
    still carries the token). The gates of the kept assignments are left as they
    were. ``capacity_factor=None`` drops nothing. The capacity depends on the
    number of tokens in the call, so with a capacity a token's output depends on
    the other tokens of the call, and a cached decoding step (one token) may keep
    what a full forward pass dropped.

    **Load-balancing loss** :cite:p:`fedus2022switch`, computed in every forward
    pass as ``aux_loss``:

    .. math:: L_\text{aux} = E \sum_{i=1}^{E} f_i P_i, \qquad
              P_i = \frac{1}{N} \sum_n p_{n i},

    where :math:`f_i` is the fraction of the :math:`N k` (token, expert)
    assignments that chose expert :math:`i`, before capacity dropping (for
    ``top_k=1`` the fraction of tokens whose choice is :math:`i`, as in the
    paper; Hugging Face's Mixtral divides the counts by :math:`N` instead, which
    makes its loss :math:`k` times this one, so a coefficient carried over from
    there must be multiplied by :math:`k`). Both sum to one, so the loss is exactly 1 when either is uniform (a
    uniform router, or a perfectly balanced load), and it grows towards
    :math:`E` as tokens and probability pile onto one expert. :math:`f` is piecewise constant (not
    differentiable), so the gradient flows through :math:`P` alone, as in the
    paper: :math:`\partial L_\text{aux} / \partial p_{n i} = E f_i / N`.
    ``backward`` adds ``aux_loss_weight`` times this gradient, i.e. it
    differentiates ``task loss + aux_loss_weight * aux_loss``.

    **Backward.** The choice of experts is piecewise constant in the input, so
    the gradient flows through the experts (to their parameters and to
    :math:`x`) and through the gates of the chosen, kept experts to the router.
    With :math:`G` the output gradient of a token, :math:`\partial L/\partial g_i
    = G \cdot \operatorname{FFN}_i(x)`; renormalized gates give
    :math:`\partial L/\partial p_i = (\partial L/\partial g_i - \sum_{j\in S}
    g_j\, \partial L/\partial g_j) / \sum_{j \in S} p_j` on the chosen experts
    (zero elsewhere); then the softmax's backward pass and the router's.

    Parameters
    ----------
    d_model, d_ff : int
        Model width and each expert's hidden width.
    n_experts : int
        Number of experts :math:`E`.
    top_k : int
        Experts per token, :math:`1 \le k \le E`.
    rng : numpy.random.Generator
        Initializes the router, then the experts in order (and drives their dropout).
    feed_forward : str
        The kind of each expert: ``"gated"`` (SwiGLU with ``activation="silu"``) or
        ``"plain"``, built with :func:`~tinyformer.feedforward.make_feed_forward`.
    activation : str
        The experts' nonlinearity (see :class:`~tinyformer.feedforward.FeedForward`).
    dropout : float
        Dropout on each expert's hidden layer (training mode only).
    bias : bool
        Whether the experts' linear layers have biases (the router never has one).
    capacity_factor : float or None
        The capacity factor :math:`c > 0`; None (the default) for no limit.
    renormalize : bool
        Renormalize the gates over the chosen experts (True) or use the router's
        probabilities as gates (False, the Switch Transformer's top-1 form).
    aux_loss_weight : float
        Coefficient of the load-balancing loss whose gradient ``backward`` adds
        (0 by default: none). An attribute; it may be changed between steps.
    dtype : float32 or float64
        Dtype of the parameters and of accepted inputs.

    Attributes
    ----------
    router : Linear
        ``d_model -> n_experts``, no bias.
    experts : list of Module
        The feed-forward networks (parameter names ``experts.0.linear_in.weight``, ...).
    routing : Routing or None
        The last forward pass's routing; ``aux_loss`` and ``n_dropped`` read from it.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        *,
        top_k: int = 2,
        rng: np.random.Generator,
        feed_forward: str = "gated",
        activation: str = "silu",
        dropout: float = 0.0,
        bias: bool = False,
        capacity_factor: float | None = None,
        renormalize: bool = True,
        aux_loss_weight: float = 0.0,
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        self.d_model = positive_int(d_model, "d_model")
        self.d_ff = positive_int(d_ff, "d_ff")
        self.n_experts = positive_int(n_experts, "n_experts")
        self.top_k = positive_int(top_k, "top_k")
        if self.top_k > self.n_experts:
            raise ValueError(
                f"top_k must be at most n_experts ({self.n_experts}), got {self.top_k}"
            )
        if feed_forward not in _EXPERT_KINDS:
            raise ValueError(f"feed_forward must be one of {_EXPERT_KINDS}, got {feed_forward!r}")
        if capacity_factor is not None:
            capacity_factor = positive_float(capacity_factor, "capacity_factor")
        if not isinstance(renormalize, bool):
            raise TypeError(f"renormalize must be a bool, got {describe(renormalize)}")
        self.capacity_factor = capacity_factor
        self.renormalize = renormalize
        self.aux_loss_weight = non_negative_float(aux_loss_weight, "aux_loss_weight")
        self.feed_forward = feed_forward
        self.dtype = float_dtype(dtype)
        rng = generator(rng)
        self.router = Linear(self.d_model, self.n_experts, rng=rng, bias=False, dtype=self.dtype)
        self.experts = [
            make_feed_forward(
                feed_forward,
                self.d_model,
                self.d_ff,
                rng=rng,
                activation=activation,
                dropout=dropout,
                bias=bias,
                dtype=self.dtype,
            )
            for _ in range(self.n_experts)
        ]
        self.routing: Routing | None = None

    # ------------------------------------------------------------------ counts
    def total_parameters(self) -> int:
        """Parameters of the router and of every expert."""
        return self.num_parameters()

    def active_parameters_per_token(self) -> int:
        """Parameters one token uses: the router's and ``top_k`` experts'."""
        return self.router.num_parameters() + self.top_k * self.experts[0].num_parameters()

    # ----------------------------------------------------------------- results
    @property
    def aux_loss(self) -> float:
        """The load-balancing loss of the last forward pass (see the class notes)."""
        return self._routing().aux_loss

    @property
    def n_dropped(self) -> int:
        """Number of (token, expert) assignments the last forward pass dropped for capacity."""
        return self._routing().n_dropped

    def _routing(self) -> Routing:
        if self.routing is None:
            raise RuntimeError("MixtureOfExperts has no routing yet: run forward first")
        return self.routing

    # ----------------------------------------------------------------- compute
    def _route(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int | None]:
        """Chosen experts ``(N, k)``, their gates ``(N, k)``, the kept mask ``(N, k)``, capacity."""
        # a stable sort of -p: most probable first, ties to the lower index
        choices = np.argsort(-probs, axis=-1, kind="stable")[:, : self.top_k]  # (N, k)
        chosen = np.take_along_axis(probs, choices, axis=-1)  # p of the chosen, (N, k)
        gates = chosen / chosen.sum(axis=-1, keepdims=True) if self.renormalize else chosen
        kept = np.ones(choices.shape, dtype=bool)  # (N, k)
        if self.capacity_factor is None:
            return choices, gates, kept, None
        capacity = expert_capacity(self.capacity_factor, len(probs), self.top_k, self.n_experts)
        for expert in range(self.n_experts):
            # every first choice before any second choice, each rank in token order (GShard's
            # priority): a token's second choice never takes a later token's first choice
            slots, tokens = np.nonzero((choices == expert).T)
            kept[tokens[capacity:], slots[capacity:]] = False  # beyond capacity
        return choices, gates, kept, capacity

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Route each token of ``x`` ``(..., d_model)`` to its experts; same shape out."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model)
        flat = x.reshape(-1, self.d_model)  # (N, d)
        if len(flat) == 0:
            raise ValueError(f"x must hold at least one token, got shape {x.shape}")
        probs = functional._softmax(self.router.forward(flat), 1, "router logits")  # (N, E)
        choices, gates, kept, capacity = self._route(probs)
        out = np.zeros_like(flat)  # (N, d): dropped assignments add nothing
        ran = []  # (expert, its tokens, their slots, its outputs) for backward
        for i, expert in enumerate(self.experts):
            tokens, slots = np.nonzero((choices == i) & kept)  # a token picks i at most once
            if len(tokens) == 0:
                continue  # an idle expert runs on nothing and gets no gradient
            y = expert.forward(flat[tokens])  # gather, run: (n_i, d)
            out[tokens] += gates[tokens, slots, None] * y  # weight, scatter back
            ran.append((i, tokens, slots, y))
        load = np.bincount(choices.ravel(), minlength=self.n_experts) / choices.size  # f, (E,)
        importance = probs.mean(axis=0)  # P, (E,)
        lead = x.shape[:-1]
        self.routing = Routing(
            probabilities=probs.reshape((*lead, self.n_experts)),
            choices=choices.reshape((*lead, self.top_k)),
            gates=gates.reshape((*lead, self.top_k)),
            kept=kept.reshape((*lead, self.top_k)),
            capacity=capacity,
            n_dropped=int(kept.size - np.count_nonzero(kept)),
            load=load,
            importance=importance,
            aux_loss=float(self.n_experts * np.dot(load, importance)),
        )
        self._save(x.shape, probs, choices, gates, load, ran)
        return out.reshape(x.shape)  # (..., d)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Return the gradient for ``x``; add into the router's and the experts' gradients.

        The load-balancing loss's gradient, times ``aux_loss_weight``, is added too.
        """
        shape, probs, choices, gates, load, ran = self._saved()
        grad = self._check_grad(grad_out, shape, self.dtype).reshape(-1, self.d_model)  # (N, d)
        grad_x = np.zeros_like(grad)  # (N, d)
        grad_gates = np.zeros_like(gates)  # (N, k): zero for dropped assignments
        for i, tokens, slots, y in ran:
            g = grad[tokens]  # (n_i, d)
            grad_gates[tokens, slots] = np.einsum("nd,nd->n", g, y)  # dL/dg = G . FFN_i(x)
            grad_x[tokens] += self.experts[i].backward(gates[tokens, slots, None] * g)
        if self.renormalize:  # g = p / s over the chosen: dL/dp = (dL/dg - sum g dL/dg) / s
            total = np.take_along_axis(probs, choices, axis=-1).sum(axis=-1, keepdims=True)
            centred = grad_gates - np.sum(gates * grad_gates, axis=-1, keepdims=True)
            grad_chosen = centred / total  # (N, k)
        else:
            grad_chosen = grad_gates
        grad_probs = np.zeros_like(probs)  # (N, E)
        np.put_along_axis(grad_probs, choices, grad_chosen, axis=-1)  # the chosen are distinct
        if self.aux_loss_weight:  # d(E sum_i f_i P_i)/dp_ni = E f_i / N, f held constant
            scale = self.aux_loss_weight * self.n_experts / len(probs)
            grad_probs += (scale * load).astype(self.dtype)  # (E,) broadcast over tokens
        grad_logits = functional.softmax_backward(grad_probs, probs)  # (N, E)
        grad_x += self.router.backward(grad_logits)
        return grad_x.reshape(shape)  # (..., d)
