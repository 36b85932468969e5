"""The live exercise of the chapter on mixtures of experts: the load-balancing loss."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.moe import MixtureOfExperts


def _layer_aux_loss(probs, top_k):
    """The layer's own loss: a router with identity weights, fed log(probs), routes with probs."""
    n_experts = probs.shape[-1]
    layer = MixtureOfExperts(n_experts, 2, n_experts, top_k=top_k, rng=np.random.default_rng(0))
    layer.router.weight.value[:] = np.eye(n_experts)  # logits = log p, softmax(log p) = p
    layer.forward(np.log(probs))
    return layer.aux_loss


def _per_token(probs, top_k):
    """Divides the counts by the N tokens instead of the N k assignments: k times too large."""
    n, e = probs.shape
    choices = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    f = np.bincount(choices.ravel(), minlength=e) / n
    return float(e * f @ probs.mean(axis=0))


def _soft_load(probs, top_k):  # noqa: ARG001 - ignores k, the mistake
    """Uses the mean probabilities for f as well as for P: E sum P_i^2 ignores the choice."""
    p = probs.mean(axis=0)
    return float(len(p) * p @ p)


def _softmax(logits):
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    probs = _softmax(rng.standard_normal((8, 4)))  # 8 tokens, 4 experts
    skewed = _softmax(2 * rng.standard_normal((12, 6)) + np.array([2.0, 1, 0, 0, 0, 0]))
    same = np.tile(_softmax(np.array([0.3, 1.2, -0.4, 0.1])), (10, 1))  # every token alike
    return [
        Case((probs, 2), label="8 tokens, 4 experts, 2 per token"),
        Case((probs, 1), label="the same tokens with 1 expert per token"),
        Case(
            (skewed, 2),
            label="12 tokens whose router favours the first experts, 6 experts, 2 per token",
        ),
        Case((same, 1), label="10 tokens with the same probabilities, 1 expert per token"),
        Case(
            (np.full((5, 4), 0.25), 2),
            label="uniform probabilities (every expert tied), 2 per token",
        ),
    ]


LOAD_BALANCING_LOSS = Exercise(
    chapter="moe",
    name="load_balancing_loss",
    stub='''\
def load_balancing_loss(probs, top_k):
    """The Switch Transformer's load-balancing loss of one batch of routed tokens.

    probs: (N, E) router probabilities, one row per token (each row sums to one);
    top_k: the number of experts each token is sent to, its top_k most probable ones
    (ties go to the lower expert index). With f_i the fraction of the N * top_k
    assignments that go to expert i, and P_i the mean of probs[:, i] over the tokens,
    returns the float E * sum_i f_i * P_i, which is 1 when the load is even.
    """
    raise NotImplementedError
''',
    reference=_layer_aux_loss,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    mistakes=(_per_token, _soft_load),
)
"""Write the auxiliary loss that keeps the experts evenly used, from the router's probabilities."""
