"""The live exercise of the chapter on training: one step of AdamW."""

from __future__ import annotations

import numpy as np

from tinyformer.exercises import Case, Exercise
from tinyformer.module import Parameter
from tinyformer.optim import AdamW


def _reference(theta, grad, m, v, t, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """The package's AdamW, set to step ``t`` with moments ``m`` and ``v``, taking one step."""
    p = Parameter(theta.copy())
    optimizer = AdamW([p], lr, betas=betas, eps=eps, weight_decay=weight_decay)
    optimizer.buffers["exp_avg"][0][...] = m
    optimizer.buffers["exp_avg_sq"][0][...] = v
    optimizer.step_count = t - 1  # the step about to be taken is step t
    p.grad[...] = grad
    optimizer.step()
    return (
        p.value,
        optimizer.buffers["exp_avg"][0].copy(),
        optimizer.buffers["exp_avg_sq"][0].copy(),
    )


def _by_hand(theta, grad, m, v, t, lr, weight_decay, betas, eps, *, mistake=""):
    """One AdamW step written out, with one of the mistakes below if ``mistake`` names it."""
    beta1, beta2 = betas
    if mistake == "l2":
        grad = grad + weight_decay * theta
    elif mistake == "decay without lr":
        theta = theta * (1.0 - weight_decay)
    else:
        theta = theta * (1.0 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    if mistake == "no bias correction":
        m_hat, v_hat = m, v
    else:
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return theta - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _l2_penalty(theta, grad, m, v, t, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """Adds weight_decay * theta to the gradient (Adam's L2 penalty), which Adam then rescales."""
    return _by_hand(theta, grad, m, v, t, lr, weight_decay, betas, eps, mistake="l2")


def _no_bias_correction(theta, grad, m, v, t, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """Skips the division by 1 - beta**t, so early steps use moments biased towards zero."""
    return _by_hand(
        theta, grad, m, v, t, lr, weight_decay, betas, eps, mistake="no bias correction"
    )


def _decay_without_lr(theta, grad, m, v, t, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """Shrinks the weights by 1 - weight_decay instead of 1 - lr * weight_decay."""
    return _by_hand(theta, grad, m, v, t, lr, weight_decay, betas, eps, mistake="decay without lr")


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    theta = rng.standard_normal((3, 4))
    zeros = np.zeros((3, 4))
    first_grad = rng.standard_normal((3, 4))
    first_grad[0, 0] = 1e-8  # as small as eps: where eps's place in the formula shows
    later = rng.standard_normal(6)
    m_later = 0.1 * rng.standard_normal(6)
    v_later = 0.01 * rng.random(6)
    scales = np.array([1e-3, 1.0, 1e3])  # gradients of very different sizes
    return [
        Case((theta, first_grad, zeros, zeros.copy(), 1, 1e-2, 0.0),
             label="the first step from zero moments, no decay and one gradient as small as eps"),
        Case((theta, rng.standard_normal((3, 4)), zeros, zeros.copy(), 1, 1e-2, 0.1),
             label="the first step from zero moments with weight decay 0.1"),
        Case((later, rng.standard_normal(6), m_later, v_later, 10, 3e-3, 0.01),
             label="step t = 10 with moments already built up"),
        Case((np.ones(3), scales * rng.standard_normal(3), np.zeros(3), np.zeros(3), 2, 0.1, 0.5,
              (0.8, 0.99), 1e-6),
             label="step t = 2 with gradients from 1e-3 to 1e3 and betas (0.8, 0.99)"),
    ]  # fmt: skip


ADAMW_STEP = Exercise(
    chapter="training",
    name="adamw_step",
    stub='''\
def adamw_step(theta, grad, m, v, t, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """One step of AdamW on one array of weights, as PyTorch's AdamW takes it.

    theta: the weights; grad: their gradient; m, v: the running averages of the gradient
    and of its square before this step (zeros before the first step); all four of one shape.
    t: the number of this step, 1 for the first. lr: the learning rate of this step;
    weight_decay: the decoupled decay lambda, which shrinks the weights by the factor
    1 - lr * weight_decay before the Adam update (PyTorch's convention); betas:
    (beta1, beta2); eps: added to the square root of the corrected v.
    Returns (new_theta, new_m, new_v), new arrays (do not change the inputs in place).
    """
    raise NotImplementedError
''',
    reference=_reference,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    parts=("new theta", "new m", "new v"),
    mistakes=(_l2_penalty, _no_bias_correction, _decay_without_lr),
)
"""Write one AdamW step: the moments, their bias correction and the decoupled decay."""
