"""Cross-entropy from logits: value, gradient, padding, label smoothing, dtypes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.gradcheck import max_relative_error, numerical_gradient
from tinyformer.losses import cross_entropy


def test_value_is_minus_mean_log_probability_of_the_target():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    targets = np.array([0, 2])
    p0 = math.exp(2.0) / (math.exp(2.0) + 1.0 + math.exp(-1.0))
    expected = -(math.log(p0) + math.log(1 / 3)) / 2
    loss, _ = cross_entropy(logits, targets)
    assert loss == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("ignore", [None, 0, -100])
def test_gradient_matches_finite_differences(rng, smoothing, ignore):
    logits = rng.standard_normal((2, 4, 5)) * 2
    targets = rng.integers(0, 5, size=(2, 4))
    if ignore is not None:
        targets[0, :2] = ignore
        targets[1, 3] = ignore
    options = {"ignore_index": ignore, "label_smoothing": smoothing}
    _, grad = cross_entropy(logits, targets, **options)
    numeric = numerical_gradient(lambda: cross_entropy(logits, targets, **options)[0], logits)
    assert max_relative_error(grad, numeric) < 1e-6
    if ignore is not None:
        np.testing.assert_array_equal(grad[targets == ignore], 0.0)


def test_label_smoothing_matches_the_mixed_target_distribution(rng):
    logits = rng.standard_normal((6, 4))
    targets = rng.integers(0, 4, size=6)
    eps = 0.2
    q = np.full((6, 4), eps / 4)
    q[np.arange(6), targets] += 1 - eps
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    loss, _ = cross_entropy(logits, targets, label_smoothing=eps)
    assert loss == pytest.approx(-(q * log_p).sum(-1).mean(), rel=1e-13)


def test_ignored_positions_change_nothing(rng):
    logits = rng.standard_normal((3, 5))
    targets = np.array([1, -1, 4])
    loss, grad = cross_entropy(logits, targets, ignore_index=-1)
    kept, kept_grad = cross_entropy(logits[[0, 2]], targets[[0, 2]])
    assert loss == pytest.approx(kept, rel=1e-14)
    np.testing.assert_allclose(grad[[0, 2]], kept_grad)


def test_all_ignored_gives_zero_loss_and_zero_gradient_not_nan(rng):
    logits = rng.standard_normal((2, 3, 4))
    loss, grad = cross_entropy(logits, np.zeros((2, 3), int), ignore_index=0)
    assert loss == 0.0
    assert grad.shape == logits.shape
    np.testing.assert_array_equal(grad, 0.0)


@given(st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_gradient_rows_sum_to_zero_and_loss_is_non_negative(seed, smoothing):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((4, 6)) * 5
    loss, grad = cross_entropy(logits, rng.integers(0, 6, size=4), label_smoothing=smoothing)
    assert loss >= 0.0
    np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-15)


def test_huge_logits_stay_finite():
    loss, grad = cross_entropy(np.array([[1e4, 0.0, -1e4]]), np.array([2]))
    assert loss == pytest.approx(2e4)
    assert np.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float32_in_float32_out(rng, dtype):
    logits = rng.standard_normal((3, 7)).astype(dtype)
    loss, grad = cross_entropy(logits, np.array([0, 6, 2]), label_smoothing=0.1)
    assert isinstance(loss, float)
    assert grad.dtype == dtype


# ----------------------------------------------------------------- reference
@pytest.mark.reference
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [None, -100, 0])
def test_agrees_with_torch_with_label_smoothing_and_ignore_index(
    rng, smoothing, ignore_index, torch
):
    logits = rng.standard_normal((3, 5, 11)) * 3
    targets = rng.integers(0, 11, size=(3, 5))
    if ignore_index is not None:
        targets[0, 3:] = ignore_index
        targets[2, 0] = ignore_index
    zt = torch.tensor(logits.reshape(-1, 11), requires_grad=True)
    loss_t = torch.nn.functional.cross_entropy(
        zt,
        torch.tensor(targets.reshape(-1)),
        ignore_index=-100 if ignore_index is None else ignore_index,
        label_smoothing=smoothing,
    )
    loss_t.backward()
    loss, grad = cross_entropy(
        logits, targets, ignore_index=ignore_index, label_smoothing=smoothing
    )
    assert loss == pytest.approx(loss_t.item(), rel=1e-10)
    np.testing.assert_allclose(grad.reshape(-1, 11), zt.grad.numpy(), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda: cross_entropy(np.ones((2, 3)), np.array([0.0, 1.0])),
            TypeError,
            "targets must be an integer array",
        ),
        (
            lambda: cross_entropy(np.ones((2, 3)), np.array([0, 1, 2])),
            ValueError,
            "targets must have shape (2,)",
        ),
        (
            lambda: cross_entropy(np.ones((2, 3)), np.array([0, 3])),
            ValueError,
            "class ids in [0, 3)",
        ),
        (
            lambda: cross_entropy(np.ones((2, 3)), np.array([0, 1]), label_smoothing=1.5),
            ValueError,
            "label_smoothing must be in [0, 1]",
        ),
        (
            lambda: cross_entropy(np.ones((2, 3)), np.array([0, 1]), ignore_index="pad"),
            TypeError,
            "ignore_index must be an integer or None",
        ),
        (
            lambda: cross_entropy(np.array([[np.nan, 0.0]]), np.array([0])),
            ValueError,
            "logits must be finite",
        ),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
