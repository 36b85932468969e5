"""The position-wise feed-forward network, plain or gated (the GLU family).

The same two-layer network is applied to every position on its own: widen to
``d_ff``, apply a nonlinearity, narrow back to ``d_model``. The gated variants
of :cite:t:`shazeer2020glu` multiply the activated branch by a second, linear
branch; with SiLU this is SwiGLU.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tinyformer import functional
from tinyformer._validation import float_dtype, generator, layer_input, one_of, positive_int
from tinyformer.layers import Dropout, Linear
from tinyformer.module import Module, grad_enabled

__all__ = ["ACTIVATIONS", "FEED_FORWARDS", "MOE_OPTIONS", "FeedForward", "make_feed_forward"]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
"""Names accepted by ``activation=``: ReLU, exact GELU, tanh-approximated GELU, SiLU."""

_Fn = Callable[[np.ndarray], np.ndarray]
_FUNCTIONS: dict[str, tuple[_Fn, _Fn]] = {
    "relu": (functional.relu, functional.relu_grad),
    "gelu": (functional.gelu, functional.gelu_grad),
    "gelu_tanh": (lambda x: functional.gelu(x, "tanh"), lambda x: functional.gelu_grad(x, "tanh")),
    "silu": (functional.silu, functional.silu_grad),
}


class FeedForward(Module):
    r"""Position-wise feed-forward network of :cite:t:`vaswani2017attention`.

    Plain (``gated=False``), with :math:`\phi` the activation:

    .. math:: \operatorname{FFN}(x) = \phi(x W_1 + b_1)\, W_2 + b_2

    Gated (``gated=True``), a GLU variant :cite:p:`shazeer2020glu`; with
    ``activation="silu"`` this is SwiGLU:

    .. math:: \operatorname{FFN}(x) = \bigl(\phi(x W_1 + b_1) \odot (x V + c)\bigr)\, W_2 + b_2

    :math:`W_1` and :math:`V` are stored side by side as one
    ``(d_model, 2 d_ff)`` matrix in ``linear_in``, so both branches come from a
    single matrix product. The backward pass of the gate is the product rule:
    with :math:`a = x W_1 + b_1`, :math:`u = x V + c` and :math:`G` the gradient
    at the hidden layer, :math:`\partial L/\partial a = G \odot u \odot \phi'(a)`
    and :math:`\partial L/\partial u = G \odot \phi(a)`.

    Parameters
    ----------
    d_model, d_ff : int
        Model width and hidden width.
    rng : numpy.random.Generator
        Initializes both linear layers and drives the dropout.
    activation : str
        The nonlinearity :math:`\phi`: ``"relu"``, ``"gelu"`` (exact), ``"gelu_tanh"``
        (tanh approximation) or ``"silu"``.
    gated : bool
        Use the gated (GLU) form.
    dropout : float
        Dropout probability on the hidden layer (training mode only).
    bias : bool
        Whether the linear layers have biases (gated models often drop them).
    dtype : float32 or float64
        Dtype of parameters and accepted inputs.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        rng: np.random.Generator,
        activation: str = "relu",
        gated: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        self.d_model = positive_int(d_model, "d_model")
        self.d_ff = positive_int(d_ff, "d_ff")
        self.activation = one_of(activation, ACTIVATIONS, "activation")
        self.gated = bool(gated)
        self.dtype = float_dtype(dtype)
        rng = generator(rng)
        width = 2 * self.d_ff if self.gated else self.d_ff
        self.linear_in = Linear(self.d_model, width, rng=rng, bias=bias, dtype=self.dtype)
        self.linear_out = Linear(self.d_ff, self.d_model, rng=rng, bias=bias, dtype=self.dtype)
        self.dropout = Dropout(dropout, rng=rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Apply the network to ``x`` of shape ``(..., d_model)``; same shape out."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model)
        pre = self.linear_in.forward(x)  # (..., d_ff) or (..., 2 d_ff)
        if self.gated:
            # ffn-gate-forward-begin
            a, u = pre[..., : self.d_ff], pre[..., self.d_ff :]  # (..., d_ff) each
            act = _FUNCTIONS[self.activation][0](a)  # phi(a), (..., d_ff)
            hidden = act * u  # the gate: phi(a) times the linear branch u
            self._save(pre, act)
            # ffn-gate-forward-end
        elif self.activation == "relu":
            hidden = np.maximum(pre, 0, out=pre)  # in place: pre is ours
            self._save(hidden, None)
        elif grad_enabled():  # the derivative at pre is all that backward needs: keep it
            hidden, slope = functional._activation_and_derivative(pre, self.activation)
            self._save(slope, None)  # (..., d_ff)
        else:  # no backward will follow (no_grad): the value alone, the same bits
            hidden = functional._activation(pre, self.activation)
            self._save(None, None)  # nothing: under no_grad a backward refuses
        return self.linear_out.forward(self.dropout.forward(hidden))  # (..., d_model)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Return the gradient for ``x``; add into both linear layers' gradients."""
        saved, act = self._saved()
        grad_hidden = self.dropout.backward(self.linear_out.backward(grad_out))  # (..., d_ff)
        derivative = _FUNCTIONS[self.activation][1]
        if self.gated:
            # ffn-gate-backward-begin
            a, u = saved[..., : self.d_ff], saved[..., self.d_ff :]  # (..., d_ff) each
            grad_a = grad_hidden * u * derivative(a)  # product rule: u phi'(a) ...
            grad_u = grad_hidden * act  # ... and phi(a)
            grad_pre = np.concatenate([grad_a, grad_u], axis=-1)  # (..., 2 d_ff)
            # ffn-gate-backward-end
        elif self.activation == "relu":
            grad_pre = grad_hidden  # a fresh array from linear_out: safe to change
            np.multiply(grad_pre, saved > 0, out=grad_pre)  # ReLU passes gradient where x > 0
        else:
            grad_pre = grad_hidden  # a fresh array, as above
            grad_pre *= saved  # the activation's derivative at the pre-activation
        return self.linear_in.backward(grad_pre)


def _plain(d_model: int, d_ff: int, **options: object) -> FeedForward:
    return FeedForward(d_model, d_ff, gated=False, **options)  # type: ignore[arg-type]


def _gated(d_model: int, d_ff: int, **options: object) -> FeedForward:
    return FeedForward(d_model, d_ff, gated=True, **options)  # type: ignore[arg-type]


def _moe(d_model: int, d_ff: int, **options: object) -> Module:
    # imported here: tinyformer.moe builds its experts with make_feed_forward
    from tinyformer.moe import MixtureOfExperts  # noqa: PLC0415

    return MixtureOfExperts(d_model, d_ff, **options)  # type: ignore[arg-type]


FEED_FORWARDS: dict[str, Callable[..., Module]] = {"plain": _plain, "gated": _gated, "moe": _moe}
"""The feed-forward networks a transformer block can be built with, by name.

Each entry takes ``(d_model, d_ff, *, rng, activation, dropout, bias, dtype)``
and returns a :class:`~tinyformer.module.Module` from ``(..., d_model)`` to
``(..., d_model)``. ``"moe"`` is a :class:`~tinyformer.moe.MixtureOfExperts`
(``d_ff`` is each expert's width); it also needs the options of :data:`MOE_OPTIONS`.
"""

MOE_OPTIONS = ("n_experts", "top_k", "feed_forward", "capacity_factor", "aux_loss_weight")
"""The further keyword arguments of ``make_feed_forward("moe", ...)``; ``n_experts`` is required."""


def make_feed_forward(
    kind: str,
    d_model: int,
    d_ff: int,
    *,
    rng: np.random.Generator,
    activation: str,
    dropout: float,
    bias: bool,
    dtype: object,
    **options: object,
) -> Module:
    """The feed-forward network named ``kind`` (a key of :data:`FEED_FORWARDS`).

    ``options`` are the further arguments of a mixture of experts
    (:data:`MOE_OPTIONS`: ``n_experts``, ``top_k``, the experts' ``feed_forward``,
    ``capacity_factor``, ``aux_loss_weight``); the other kinds take none.
    """
    if kind not in FEED_FORWARDS:
        raise ValueError(f"kind must be one of {sorted(FEED_FORWARDS)}, got {kind!r}")
    allowed = MOE_OPTIONS if kind == "moe" else ()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"feed-forward kind {kind!r} takes no option(s) {unknown}; it takes {list(allowed)}"
        )
    if kind == "moe" and "n_experts" not in options:
        raise TypeError("feed-forward kind 'moe' needs n_experts (the number of experts)")
    return FEED_FORWARDS[kind](
        d_model,
        d_ff,
        rng=rng,
        activation=activation,
        dropout=dropout,
        bias=bias,
        dtype=dtype,
        **options,
    )
