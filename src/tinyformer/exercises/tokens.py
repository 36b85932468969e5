"""The live exercise of the chapter on tokens and embeddings."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.layers import Embedding


def _table_gradient(ids, grad_out, vocab_size, scale_by_sqrt_d=False):
    """The gradient of an embedding table, from tinyformer's :class:`Embedding` backward pass."""
    d_model = grad_out.shape[-1]
    layer = Embedding(
        vocab_size, d_model, rng=np.random.default_rng(0), scale_by_sqrt_d=scale_by_sqrt_d
    )
    layer.zero_grad()
    layer.forward(ids)
    layer.backward(grad_out)
    return layer.weight.grad.copy()


def _fancy_index_add(ids, grad_out, vocab_size, scale_by_sqrt_d=False):
    """Writes grad[ids] += g: of a repeated token's positions only the last one counts."""
    d_model = grad_out.shape[-1]
    grad = np.zeros((vocab_size, d_model))
    scale = np.sqrt(d_model) if scale_by_sqrt_d else 1.0
    grad[ids.reshape(-1)] += scale * grad_out.reshape(-1, d_model)
    return grad


def _unscaled(ids, grad_out, vocab_size, scale_by_sqrt_d=False):  # noqa: ARG001
    """Forgets that the forward pass multiplied the rows by sqrt(d_model)."""
    d_model = grad_out.shape[-1]
    grad = np.zeros((vocab_size, d_model))
    np.add.at(grad, ids.reshape(-1), grad_out.reshape(-1, d_model))
    return grad


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    return [
        Case((np.array([3, 7, 3, 0, 9]), rng.standard_normal((5, 6)), 10),
             label="5 positions where token 3 occurs twice"),
        Case((np.array([[1, 4, 4, 2], [4, 0, 1, 6]]), rng.standard_normal((2, 4, 5)), 8),
             label="a batch of 2 sequences of 4 ids"),
        Case((np.array([1, 1, 4]), rng.standard_normal((3, 9)), 5), {"scale_by_sqrt_d": True},
             label="rows scaled by sqrt(d_model) = 3"),
        Case((np.array([2, 2, 2, 2]), rng.standard_normal((4, 3)), 4),
             label="one token at every position"),
    ]  # fmt: skip


EMBEDDING_BACKWARD = Exercise(
    chapter="tokens",
    name="embedding_backward",
    stub='''\
def embedding_backward(ids, grad_out, vocab_size, scale_by_sqrt_d=False):
    """The gradient of the loss with respect to an embedding table E of shape (V, d_model).

    The forward pass was y = s * E[ids], with s = sqrt(d_model) if scale_by_sqrt_d else 1.
    ids: integers in [0, vocab_size), any shape S; grad_out: dL/dy, of shape (*S, d_model).
    Returns a new float array of shape (vocab_size, d_model): row i is s times the sum of
    grad_out over every position where token i occurs (a token that occurs twice gets both
    positions' gradients added), and zero for tokens that do not occur.
    """
    raise NotImplementedError
''',
    reference=_table_gradient,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    mistakes=(_fancy_index_add, _unscaled),
)
"""Write the embedding's backward pass, a scatter-add in which repeated tokens add up."""
