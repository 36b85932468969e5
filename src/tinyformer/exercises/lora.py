"""The live exercise of the chapter on LoRA: the adapter's backward pass."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.layers import Linear
from tinyformer.lora import LoRALinear


def _layer_backward(x, weight, lora_A, lora_B, alpha, grad_out):
    """The library's LoRALinear around a Linear with ``weight``: its backward pass."""
    d_in, d_out = weight.shape
    rank = lora_A.shape[1]
    base = Linear(d_in, d_out, rng=np.random.default_rng(0), bias=False)
    base.weight.value[:] = weight
    layer = LoRALinear(base, rank, alpha=alpha, rng=np.random.default_rng(0))
    layer.lora_A.value[:] = lora_A
    layer.lora_B.value[:] = lora_B
    layer.zero_grad()
    layer.forward(x)
    grad_x = layer.backward(grad_out)
    return grad_x, layer.lora_A.grad.copy(), layer.lora_B.grad.copy()


def _unscaled_grad_b(x, weight, lora_A, lora_B, alpha, grad_out):
    """Uses (x A)^T G for B's gradient: forgets that the scale s multiplies x A too."""
    s = alpha / lora_A.shape[1]
    rows, g = x.reshape(-1, weight.shape[0]), grad_out.reshape(-1, weight.shape[1])
    grad_x = g @ weight.T + s * g @ lora_B.T @ lora_A.T
    return grad_x.reshape(x.shape), rows.T @ (s * g @ lora_B.T), (rows @ lora_A).T @ g


def _base_path_only(x, weight, lora_A, lora_B, alpha, grad_out):
    """Passes only G W^T back to x: forgets the adapter's path to the input."""
    s = alpha / lora_A.shape[1]
    rows, g = x.reshape(-1, weight.shape[0]), grad_out.reshape(-1, weight.shape[1])
    grad_x = g @ weight.T
    return grad_x.reshape(x.shape), rows.T @ (s * g @ lora_B.T), (s * rows @ lora_A).T @ g


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((4, 6)), rng.standard_normal((4, 5))
    w = rng.standard_normal((6, 5))
    a, b = rng.standard_normal((6, 2)), rng.standard_normal((2, 5))
    rng = np.random.default_rng(1)
    x3, g3 = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 4))
    w3, a3, b3 = (
        rng.standard_normal((8, 4)),
        rng.standard_normal((8, 3)),
        rng.standard_normal((3, 4)),
    )
    return [
        Case((x, w, a, b, 4.0, g), label="4 rows, d_in = 6, d_out = 5, rank 2, alpha = 4"),
        Case(
            (x, w, a, np.zeros((2, 5)), 4.0, g),
            label="the same layer with B = 0, as at the start of training",
        ),
        Case(
            (x3, w3, a3, b3, 8.0, g3),
            label="a batch of 2 sequences of 3 tokens, rank 3, alpha = 8",
        ),
        Case((x, w, a[:, :1], b[:1], 1.0, g), label="rank 1 with alpha = 1"),
    ]


LORA_BACKWARD = Exercise(
    chapter="lora",
    name="lora_backward",
    stub='''\
def lora_backward(x, weight, lora_A, lora_B, alpha, grad_out):
    """The backward pass of a LoRA layer y = x W + b + s (x A) B, with s = alpha / r.

    x: (..., d_in) the layer's input; weight: W, (d_in, d_out), frozen; lora_A: A, (d_in, r);
    lora_B: B, (r, d_out); alpha: the float alpha; grad_out: dL/dy, (..., d_out), with the
    same leading axes as x. Returns (grad_x, grad_A, grad_B): dL/dx of the shape of x, and
    dL/dA and dL/dB summed over every row of the leading axes. No dropout; W and b are
    frozen and get no gradient.
    """
    raise NotImplementedError
''',
    reference=_layer_backward,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    parts=("input gradient", "gradient of A", "gradient of B"),
    mistakes=(_unscaled_grad_b, _base_path_only),
)
"""Write the gradients of LoRA's two factors and of its input, the heart of its training."""
