"""Optimizers and gradient clipping: update rules, dtypes, resumption, bad input, PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer.module import Parameter
from tinyformer.optim import (
    SGD,
    Adam,
    AdamW,
    Optimizer,
    clip_grad_norm,
    grad_norm,
    one_dimensional,
)
from tinyformer.schedules import WarmupCosineSchedule

OPTIMIZERS = {
    "sgd": lambda ps, lr=0.1: SGD(ps, lr),
    "momentum": lambda ps, lr=0.1: SGD(ps, lr, momentum=0.9, weight_decay=0.01),
    "nesterov": lambda ps, lr=0.1: SGD(ps, lr, momentum=0.8, nesterov=True),
    "dampened": lambda ps, lr=0.1: SGD(ps, lr, momentum=0.5, dampening=0.3),
    "adam": lambda ps, lr=0.05: Adam(ps, lr, weight_decay=0.01),
    "adamw": lambda ps, lr=0.05: AdamW(ps, lr, weight_decay=0.1),
}


def _params(rng, dtype=np.float64):
    return [
        Parameter(rng.standard_normal((3, 4)).astype(dtype)),
        Parameter(rng.standard_normal(4).astype(dtype)),
    ]


def _set_grads(params, rng):
    for p in params:
        p.grad[...] = rng.standard_normal(p.shape) + 0.5 * p.value


def _run(opt, rng, n_steps):
    for _ in range(n_steps):
        _set_grads(opt.parameters, rng)
        opt.step()


def test_plain_sgd_step():
    p = Parameter(np.array([1.0, -2.0]))
    p.grad[...] = [0.5, 0.25]
    SGD([p], lr=0.1).step()
    np.testing.assert_allclose(p.value, [0.95, -2.025], rtol=1e-15)


def test_sgd_momentum_matches_the_recurrence_written_out(rng):
    mu, lr, wd = 0.9, 0.05, 0.01
    p = Parameter(rng.standard_normal(5))
    theta, buf = p.value.copy(), None
    opt = SGD([p], lr, momentum=mu, weight_decay=wd)
    for _ in range(4):
        g = rng.standard_normal(5)
        p.grad[...] = g
        opt.step()
        g = g + wd * theta
        buf = g if buf is None else mu * buf + g
        theta = theta - lr * buf
        np.testing.assert_allclose(p.value, theta, rtol=1e-14)


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_adam_matches_the_recurrence_written_out(rng, decoupled):
    # Every step against the update written out by hand, bias corrections included
    # (a correction frozen at its first-step value fails from step 2 on).
    b1, b2, eps, lr, wd = 0.8, 0.95, 1e-6, 0.03, 0.1
    p = Parameter(rng.standard_normal(6))
    theta, m, v = p.value.copy(), np.zeros(6), np.zeros(6)
    make = AdamW if decoupled else Adam
    opt = make([p], lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for t in range(1, 8):
        g = rng.standard_normal(6) * 10.0 ** rng.uniform(-3, 2)
        p.grad[...] = g
        opt.step()
        if decoupled:
            theta = theta * (1.0 - lr * wd)
        else:
            g = g + wd * theta
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g**2
        m_hat, v_hat = m / (1.0 - b1**t), v / (1.0 - b2**t)
        theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
        np.testing.assert_allclose(p.value, theta, rtol=1e-13, atol=1e-15, err_msg=f"step {t}")


@pytest.mark.parametrize("make", [Adam, AdamW], ids=["adam", "adamw"])
def test_no_decay_parameters_are_never_decayed(rng, make):
    weight, bias = Parameter(rng.standard_normal((3, 2))), Parameter(rng.standard_normal(2))
    twin_w, twin_b = Parameter(weight.value.copy()), Parameter(bias.value.copy())
    assert one_dimensional([weight, bias]) == [bias]
    opt = make([weight, bias], 0.05, weight_decay=0.5, no_decay=one_dimensional([weight, bias]))
    decays = make([twin_w], 0.05, weight_decay=0.5)
    plain = make([twin_b], 0.05, weight_decay=0.0)
    for _ in range(3):
        g_w, g_b = rng.standard_normal((3, 2)), rng.standard_normal(2)
        weight.grad[...], twin_w.grad[...] = g_w, g_w
        bias.grad[...], twin_b.grad[...] = g_b, g_b
        for o in (opt, decays, plain):
            o.step()
    np.testing.assert_array_equal(weight.value, twin_w.value)  # decayed as usual
    np.testing.assert_array_equal(bias.value, twin_b.value)  # as if weight_decay were 0
    with pytest.raises(ValueError, match=r"no_decay\[0\] is not one of the optimizer's"):
        make([weight], 0.1, no_decay=[bias])
    with pytest.raises(TypeError, match="no_decay must be an iterable of Parameter"):
        make([weight], 0.1, no_decay=bias)


def test_adam_first_step_moves_each_coordinate_by_lr():
    p = Parameter(np.zeros(4))
    p.grad[...] = [3.0, -0.01, 200.0, -5.0]
    Adam([p], lr=0.1, eps=1e-12).step()
    np.testing.assert_allclose(p.value, [-0.1, 0.1, -0.1, 0.1], rtol=1e-9)


def test_adamw_decay_is_decoupled_from_the_gradient_scale():
    a, b = Parameter(np.ones(2)), Parameter(np.ones(2))
    a.grad[...] = [1e-3, 1e3]
    b.grad[...] = [1e-3, 1e3]
    AdamW([a], lr=0.1, weight_decay=0.5, eps=1e-12).step()
    Adam([b], lr=0.1, weight_decay=0.5, eps=1e-12).step()
    # AdamW: shrink by (1 - lr * wd), then the sign-like Adam step
    np.testing.assert_allclose(a.value, 0.95 - 0.1, rtol=1e-9)
    # Adam: the decay enters the gradient and is normalized with it: every coordinate moves by lr
    assert b.value[0] == pytest.approx(0.9, rel=1e-9)
    assert b.value[1] == pytest.approx(0.9, rel=1e-9)


def test_adamw_without_decay_equals_adam(rng):
    pa, pb = _params(rng), _params(rng)
    for x, y in zip(pa, pb, strict=True):
        y.value[...] = x.value
    opt_a, opt_b = AdamW(pa, 0.01, weight_decay=0.0), Adam(pb, 0.01)
    _run(opt_a, np.random.default_rng(1), 5)
    _run(opt_b, np.random.default_rng(1), 5)
    for x, y in zip(pa, pb, strict=True):
        np.testing.assert_array_equal(x.value, y.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: SGD(ps, 0.1),
        lambda ps: SGD(ps, 0.02, momentum=0.9),
        lambda ps: SGD(ps, 0.02, momentum=0.9, nesterov=True),
        lambda ps: Adam(ps, WarmupCosineSchedule(0.05, 50, 2000, min_lr=1e-4)),
        lambda ps: AdamW(ps, WarmupCosineSchedule(0.05, 50, 2000, min_lr=1e-4), weight_decay=0.0),
    ],
    ids=["sgd", "momentum", "nesterov", "adam", "adamw"],
)
def test_optimizers_solve_least_squares(make, rng):
    A = rng.standard_normal((20, 3))
    b = rng.standard_normal(20)
    x_star = np.linalg.lstsq(A, b, rcond=None)[0]
    x = Parameter(np.zeros(3))
    opt = make([x])
    for _ in range(2000):
        x.grad[...] = A.T @ (A @ x.value - b) / len(b)
        opt.step()
    np.testing.assert_allclose(x.value, x_star, atol=1e-6)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_float32_stays_float32(name, rng):
    params = _params(rng, np.float32)
    opt = OPTIMIZERS[name](params)
    _run(opt, rng, 3)
    assert all(p.value.dtype == np.float32 for p in params)
    assert all(b.dtype == np.float32 for bufs in opt.buffers.values() for b in bufs)
    clip_grad_norm(params, 0.1)
    assert all(p.grad.dtype == np.float32 for p in params)


def test_zero_grad_clears_every_gradient(rng):
    params = _params(rng)
    _set_grads(params, rng)
    Adam(params).zero_grad()
    assert all((p.grad == 0).all() for p in params)


def test_a_schedule_sets_the_rate_of_each_step():
    schedule = WarmupCosineSchedule(0.1, warmup_steps=4, total_steps=10)
    p = Parameter(np.zeros(1))
    opt = SGD([p], schedule)
    assert opt.schedule is schedule
    for t in range(1, 13):
        assert opt.lr == schedule(t)
        before = p.value.copy()
        p.grad[...] = 1.0
        opt.step()
        np.testing.assert_allclose(before - p.value, schedule(t), rtol=0, atol=1e-15)
    opt.lr = 0.5
    assert opt.schedule is None
    assert opt.lr == 0.5


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("scheduled", [False, True])
def test_state_dict_resumes_exactly(name, scheduled, rng):
    lr = WarmupCosineSchedule(0.05, 3, 12) if scheduled else 0.05
    start = _params(rng)
    straight = [Parameter(p.value.copy()) for p in start]
    opt = OPTIMIZERS[name](straight, lr)
    _run(opt, np.random.default_rng(1), 10)

    first = [Parameter(p.value.copy()) for p in start]
    opt1 = OPTIMIZERS[name](first, lr)
    grads = np.random.default_rng(1)
    _run(opt1, grads, 6)
    state = opt1.state_dict()
    values = [p.value.copy() for p in first]
    _run(opt1, np.random.default_rng(99), 2)  # the saved state must not follow
    resumed = [Parameter(v) for v in values]
    opt2 = OPTIMIZERS[name](resumed, 123.0 if not scheduled else lr)
    opt2.load_state_dict(state)
    assert opt2.step_count == 6
    _run(opt2, grads, 4)
    for a, b in zip(straight, resumed, strict=True):
        np.testing.assert_array_equal(a.value, b.value)


def test_state_dict_survives_an_npz_file(rng, tmp_path):
    params = _params(rng)
    opt = Adam(params, 0.01, betas=(0.8, 0.99))
    _run(opt, rng, 3)
    np.savez(tmp_path / "opt.npz", **opt.state_dict())
    with np.load(tmp_path / "opt.npz") as saved:
        state = dict(saved)
    other = Adam([Parameter(p.value.copy()) for p in params])
    other.load_state_dict(state)
    assert other.step_count == 3
    assert other.betas == (0.8, 0.99)
    assert other.lr == 0.01
    for a, b in zip(opt.buffers["exp_avg_sq"], other.buffers["exp_avg_sq"], strict=True):
        np.testing.assert_array_equal(a, b)


def _broken(state, **changes):
    out = dict(state)
    for key, value in changes.items():
        if value is None:
            del out[key]
        else:
            out[key] = value
    return out


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"optimizer": "SGD"}, ValueError, "state is for optimizer 'SGD', not 'Adam'"),
        ({"exp_avg.1": None}, ValueError, "missing ['exp_avg.1']"),
        ({"step": -1}, ValueError, "state['step'] must be a non-negative integer"),
        ({"step": 2.5}, TypeError, "state['step']"),
        ({"exp_avg.0": np.zeros((4, 3))}, ValueError, "state['exp_avg.0'] must have shape (3, 4)"),
        ({"exp_avg.0": np.zeros((3, 4), np.float32)}, ValueError, "dtype float64"),
        ({"exp_avg_sq.1": np.full(4, np.nan)}, ValueError, "NaN or infinite"),
        ({"betas": (0.9, 1.0)}, ValueError, "betas[1] must be in [0, 1)"),
        ({"lr": -0.1}, ValueError, "state['lr']"),
        ({"lr": None}, ValueError, "a constant lr is saved"),
    ],
)
def test_load_state_dict_rejects_bad_state_and_changes_nothing(rng, changes, error, words):
    opt = Adam(_params(rng), 0.01)
    _run(opt, rng, 2)
    state = opt.state_dict()
    before = (opt.step_count, opt.lr, opt.betas, [b.copy() for b in opt.buffers["exp_avg"]])
    with pytest.raises(error) as info:
        opt.load_state_dict(_broken(state, **changes))
    assert words in str(info.value)
    assert (opt.step_count, opt.lr, opt.betas) == before[:3]
    for a, b in zip(opt.buffers["exp_avg"], before[3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_non_finite_gradient_stops_the_step_and_touches_nothing(rng):
    params = _params(rng)
    opt = AdamW(params, 0.01)
    _run(opt, rng, 1)
    values = [p.value.copy() for p in params]
    params[1].grad[2] = np.inf
    with pytest.raises(
        ValueError, match=r"parameters\[1\]\.grad contains NaN or infinite values at step 2"
    ):
        opt.step()
    assert opt.step_count == 1
    for p, v in zip(params, values, strict=True):
        np.testing.assert_array_equal(p.value, v)


def test_clip_grad_norm_rescales_to_the_max_norm_and_returns_the_norm_before(rng):
    params = _params(rng)
    _set_grads(params, rng)
    grads = [p.grad.copy() for p in params]
    norm = math.sqrt(sum((g**2).sum() for g in grads))
    assert grad_norm(params) == pytest.approx(norm, rel=1e-14)
    returned = clip_grad_norm(params, norm / 4)
    assert returned == pytest.approx(norm, rel=1e-14)
    assert grad_norm(params) == pytest.approx(norm / 4, rel=1e-6)
    for p, g in zip(params, grads, strict=True):  # the direction is kept
        np.testing.assert_allclose(p.grad, g * (norm / 4) / (norm + 1e-6), rtol=1e-14)


def test_clip_grad_norm_leaves_small_gradients_alone(rng):
    params = _params(rng)
    _set_grads(params, rng)
    grads = [p.grad.copy() for p in params]
    clip_grad_norm(params, 1e6)
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_array_equal(p.grad, g)


def test_clip_grad_norm_on_non_finite_gradients(rng):
    params = _params(rng)
    params[0].grad[0, 0] = np.nan
    with pytest.raises(ValueError, match="global gradient norm is nan"):
        clip_grad_norm(params, 1.0)
    assert math.isnan(clip_grad_norm(params, 1.0, error_if_nonfinite=False))
    assert np.isnan(params[0].grad[0, 0])


def _p():
    return [Parameter(np.zeros(2))]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: SGD(_p(), lr=-0.1), ValueError, "lr must be a finite non-negative"),
        (
            lambda: SGD(_p(), lr="fast"),
            TypeError,
            "lr must be a non-negative number or a schedule",
        ),
        (lambda: SGD(_p(), lr=float("nan")), ValueError, "lr must be a finite"),
        (lambda: SGD(_p(), 0.1, momentum=1.0), ValueError, "momentum must be in [0, 1)"),
        (lambda: SGD(_p(), 0.1, momentum=-0.5), ValueError, "momentum must be in [0, 1)"),
        (lambda: SGD(_p(), 0.1, dampening=1.5), ValueError, "dampening must be in [0, 1]"),
        (lambda: SGD(_p(), 0.1, nesterov=True), ValueError, "nesterov needs momentum > 0"),
        (
            lambda: SGD(_p(), 0.1, momentum=0.9, nesterov="yes"),
            TypeError,
            "nesterov must be a bool",
        ),
        (
            lambda: SGD(_p(), 0.1, weight_decay=-1.0),
            ValueError,
            "weight_decay must be a finite non-negative",
        ),
        (lambda: Adam(_p(), betas=(0.9, 1.0)), ValueError, "betas[1] must be in [0, 1)"),
        (lambda: Adam(_p(), betas=(-0.1, 0.9)), ValueError, "betas[0] must be in [0, 1)"),
        (lambda: Adam(_p(), betas=0.9), TypeError, "betas must be a pair"),
        (lambda: Adam(_p(), eps=0.0), ValueError, "eps must be a finite positive"),
        (lambda: AdamW(_p(), weight_decay=float("inf")), ValueError, "weight_decay"),
        (lambda: Adam([]), ValueError, "at least one Parameter"),
        (lambda: Adam([np.zeros(2)]), TypeError, "parameters[0] must be a Parameter"),
        (lambda: Adam(Parameter(np.zeros(2))), TypeError, "parameters must be an iterable"),
        (lambda: Adam(_p() * 2), ValueError, "the same Parameter twice"),
        (
            lambda: SGD(_p(), lambda t: -1.0).step(),
            ValueError,
            "finite lr >= 0, got -1.0 at step 1",
        ),
        (lambda: SGD(_p(), lambda t: "x").step(), TypeError, "schedule must return a number"),
        (lambda: clip_grad_norm(_p(), 0.0), ValueError, "max_norm must be a finite positive"),
        (lambda: clip_grad_norm(_p(), -1.0), ValueError, "max_norm"),
        (lambda: Optimizer(_p(), 0.1).step(), NotImplementedError, ""),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_wrong_gradient_shape_is_named():
    p = Parameter(np.zeros(3))
    p.grad = np.zeros(4)
    with pytest.raises(
        ValueError, match=r"parameters\[0\]\.grad must be an array of the parameter's shape \(3,\)"
    ):
        SGD([p], 0.1).step()


# ----------------------------------------------------------------- reference
TORCH_CASES = {
    "sgd": (lambda ps: SGD(ps, 0.1), lambda torch, ts: torch.optim.SGD(ts, lr=0.1)),
    "sgd-momentum-decay": (
        lambda ps: SGD(ps, 0.05, momentum=0.9, weight_decay=0.01),
        lambda torch, ts: torch.optim.SGD(ts, lr=0.05, momentum=0.9, weight_decay=0.01),
    ),
    "sgd-nesterov-decay": (
        lambda ps: SGD(ps, 0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
        lambda torch, ts: torch.optim.SGD(
            ts, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02
        ),
    ),
    "sgd-dampening": (
        lambda ps: SGD(ps, 0.05, momentum=0.7, dampening=0.25),
        lambda torch, ts: torch.optim.SGD(ts, lr=0.05, momentum=0.7, dampening=0.25),
    ),
    "adam": (lambda ps: Adam(ps, 0.01), lambda torch, ts: torch.optim.Adam(ts, lr=0.01)),
    "adam-l2": (
        lambda ps: Adam(ps, 0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05),
        lambda torch, ts: torch.optim.Adam(
            ts, lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05
        ),
    ),
    "adamw": (lambda ps: AdamW(ps, 0.01), lambda torch, ts: torch.optim.AdamW(ts, lr=0.01)),
    "adamw-decay": (
        lambda ps: AdamW(ps, 0.03, betas=(0.85, 0.99), weight_decay=0.1),
        lambda torch, ts: torch.optim.AdamW(ts, lr=0.03, betas=(0.85, 0.99), weight_decay=0.1),
    ),
}
TORCH_SHAPES = [(5, 3), (3,), (2, 2, 4)]


def _moving_gradient(value: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """A gradient that depends on where the parameter is, so the two runs must stay together."""
    return noise + 0.5 * value**3 - value


@pytest.mark.reference
@pytest.mark.parametrize("case", TORCH_CASES)
def test_updates_agree_with_torch_over_several_steps(case, rng, torch):
    ours, theirs = TORCH_CASES[case]
    start = [rng.standard_normal(shape) for shape in TORCH_SHAPES]
    params = [Parameter(x.copy()) for x in start]
    tensors = [torch.tensor(x.copy(), requires_grad=True) for x in start]
    opt, ref = ours(params), theirs(torch, tensors)
    for _ in range(8):
        noise = [rng.standard_normal(shape) for shape in TORCH_SHAPES]
        for p, t, n in zip(params, tensors, noise, strict=True):
            p.grad[...] = _moving_gradient(p.value, n)
            t.grad = torch.from_numpy(_moving_gradient(t.detach().numpy(), n))
        opt.step()
        ref.step()
        for p, t in zip(params, tensors, strict=True):
            np.testing.assert_allclose(p.value, t.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert max(abs(p.value - x).max() for p, x in zip(params, start, strict=True)) > 1e-3


@pytest.mark.reference
@pytest.mark.parametrize("case", ["sgd-nesterov-decay", "adamw-decay"])
def test_float32_updates_agree_with_torch(case, rng, torch):
    ours, theirs = TORCH_CASES[case]
    start = [rng.standard_normal(shape).astype(np.float32) for shape in TORCH_SHAPES]
    params = [Parameter(x.copy()) for x in start]
    tensors = [torch.tensor(x.copy(), requires_grad=True) for x in start]
    opt, ref = ours(params), theirs(torch, tensors)
    for _ in range(8):
        grads = [rng.standard_normal(shape).astype(np.float32) for shape in TORCH_SHAPES]
        for p, t, g in zip(params, tensors, grads, strict=True):
            p.grad[...] = g
            t.grad = torch.from_numpy(g.copy())
        opt.step()
        ref.step()
    for p, t in zip(params, tensors, strict=True):
        assert p.value.dtype == np.float32
        np.testing.assert_allclose(p.value, t.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.reference
@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e3])
def test_clip_grad_norm_agrees_with_torch(max_norm, rng, torch):
    grads = [rng.standard_normal(shape) for shape in TORCH_SHAPES]
    params = [Parameter(np.zeros(shape)) for shape in TORCH_SHAPES]
    tensors = [
        torch.zeros(shape, dtype=torch.float64, requires_grad=True) for shape in TORCH_SHAPES
    ]
    for p, t, g in zip(params, tensors, grads, strict=True):
        p.grad[...] = g
        t.grad = torch.from_numpy(g.copy())
    ours = clip_grad_norm(params, max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(tensors, max_norm)
    assert math.isclose(ours, float(theirs), rel_tol=1e-14)
    for p, t in zip(params, tensors, strict=True):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_frozen_parameter_is_refused_when_given_and_when_frozen_later(name):
    rng = np.random.default_rng(0)
    params = _params(rng)
    params[1].requires_grad = False
    with pytest.raises(
        ValueError,
        match=r"parameters\[1\] \(shape \(4,\)\) is frozen \(requires_grad=False\); 1 of the 2"
        r" .*pass model.trainable_parameters\(\) rather than model.parameters\(\)",
    ):
        OPTIMIZERS[name](params)
    params[1].requires_grad = True
    opt = OPTIMIZERS[name](params)
    _run(opt, rng, 2)
    params[0].requires_grad = False  # frozen after the optimizer was made
    before = [p.value.copy() for p in params]
    state = opt.state_dict()
    _set_grads(params, rng)
    with pytest.raises(ValueError, match=r"parameters\[0\] .* is frozen .* since the optimizer"):
        opt.step()
    assert all(np.array_equal(p.value, b) for p, b in zip(params, before, strict=True))
    assert opt.step_count == state["step"]  # nothing moved, not even the count
    params[0].requires_grad = True
    opt.step()
    assert opt.step_count == state["step"] + 1
