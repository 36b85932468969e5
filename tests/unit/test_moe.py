"""The mixture-of-experts layer: routing, dispatch and combine, capacity, balance, gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer import functional as F
from tinyformer.blocks import TransformerBlock
from tinyformer.feedforward import FEED_FORWARDS, make_feed_forward
from tinyformer.gradcheck import check_module_gradients, max_relative_error, numerical_gradient
from tinyformer.module import no_grad
from tinyformer.moe import MixtureOfExperts, expert_capacity, moe_parameters

EPS = 1e-4  # the finite-difference step of every check here


def _moe(rng, d_model=4, d_ff=5, n_experts=4, **kwargs):
    layer = MixtureOfExperts(d_model, d_ff, n_experts, rng=rng, **kwargs)
    for p in layer.parameters():
        p.value[...] = rng.standard_normal(p.shape) * 0.7
    layer.router.weight.value *= 2  # spread the router's logits: wide gaps between experts
    return layer


def _logit_gap(layer, x):
    """Smallest gap, over tokens, between the k-th and (k+1)-th largest router logit."""
    if layer.top_k == layer.n_experts:
        return math.inf  # every expert is chosen: there is no boundary to cross
    logits = np.sort(x.reshape(-1, layer.d_model) @ layer.router.weight.value, axis=-1)[:, ::-1]
    return float((logits[:, layer.top_k - 1] - logits[:, layer.top_k]).min())


def _largest_logit_change(layer, x):
    """A bound on how far one finite-difference step (up to 2 EPS) moves any router logit.

    Moving one entry of x by 2 EPS moves a logit by at most 2 EPS max|W_r|; one entry
    of W_r, by at most 2 EPS max|x|. A gap between two logits moves by twice that.
    """
    return 2 * 2 * EPS * max(np.abs(layer.router.weight.value).max(), np.abs(x).max())


def _separated_input(layer, rng, shape, *, attempts=200):
    """A random input whose top-k choice no finite-difference step can flip.

    Asserts a margin of ten times the largest change a step can make to a gap.
    """
    for _ in range(attempts):
        x = rng.standard_normal(shape)
        if _logit_gap(layer, x) > 10 * _largest_logit_change(layer, x):
            return x
    raise AssertionError("no input with a clear top-k margin was found")


def _check_with_aux_loss(layer, x, rng):
    """Finite differences of ``sum(y * g) + w * aux_loss`` against ``backward(g)``."""
    weight = layer.aux_loss_weight
    upstream = rng.standard_normal(x.shape)

    def loss():
        y = layer.forward(x)
        return np.sum(y * upstream) + weight * layer.aux_loss

    layer.zero_grad()
    layer.forward(x)
    pairs = {"x": (layer.backward(upstream), numerical_gradient(loss, x, EPS))}
    for name, p in layer.named_parameters():
        pairs[name] = (p.grad.copy(), numerical_gradient(loss, p.value, EPS))
    scale = max(float(np.abs(n).max()) for _, n in pairs.values())
    return {name: max_relative_error(a, n, magnitude=scale) for name, (a, n) in pairs.items()}


# ------------------------------------------------------------------- gradients
@pytest.mark.parametrize("feed_forward", ["plain", "gated"])
@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("renormalize", [True, False])
def test_gradients(rng, feed_forward, top_k, renormalize):
    activation = "gelu" if feed_forward == "plain" else "silu"
    layer = _moe(
        rng, feed_forward=feed_forward, activation=activation, top_k=top_k, renormalize=renormalize
    )
    x = _separated_input(layer, rng, (2, 3, 4))
    errors = check_module_gradients(layer, [x], rng=rng, eps=EPS)
    assert max(errors.values()) < 1e-6, errors
    assert layer.n_dropped == 0
    used = set(layer.routing.choices.ravel().tolist())
    assert len(used) > 1  # several experts ran, so the dispatch was exercised
    if top_k == 1 and renormalize:  # one renormalized gate is always 1: no gradient to the router
        assert not layer.router.weight.grad.any()
    else:
        assert np.abs(layer.router.weight.grad).max() > 1e-3


@pytest.mark.parametrize(("top_k", "renormalize"), [(1, False), (2, True), (3, True)])
def test_gradients_with_the_load_balancing_loss(rng, top_k, renormalize):
    layer = _moe(rng, top_k=top_k, renormalize=renormalize, aux_loss_weight=0.7)
    x = _separated_input(layer, rng, (3, 4, 4))
    errors = _check_with_aux_loss(layer, x, rng)
    assert max(errors.values()) < 1e-6, errors
    grads = []
    for weight in (0.0, 0.7):  # the loss's term in the router's gradient is not negligible
        layer.aux_loss_weight = weight
        layer.zero_grad()
        layer.backward(np.ones_like(layer.forward(x)))
        grads.append(layer.router.weight.grad.copy())
    assert np.abs(grads[1] - grads[0]).max() > 1e-2


@pytest.mark.parametrize("aux_loss_weight", [0.0, 0.5])
@pytest.mark.parametrize("top_k", [1, 2])
def test_gradients_with_capacity_dropping(rng, top_k, aux_loss_weight):
    layer = _moe(rng, top_k=top_k, capacity_factor=0.75, aux_loss_weight=aux_loss_weight)
    x = _separated_input(layer, rng, (2, 5, 4))
    errors = _check_with_aux_loss(layer, x, rng)
    assert max(errors.values()) < 1e-6, errors
    layer.forward(x)
    assert layer.n_dropped > 0  # the check ran with dropping active
    assert layer.routing.capacity == math.ceil(0.75 * 10 * top_k / 4)


def test_the_tie_guard_is_not_vacuous(rng):
    # Two experts with equal router columns: every gap is zero, so every input is refused.
    layer = _moe(rng, n_experts=2, top_k=1)
    layer.router.weight.value[:, 1] = layer.router.weight.value[:, 0]
    assert _logit_gap(layer, rng.standard_normal((4, 4))) == 0.0
    with pytest.raises(AssertionError, match="no input"):
        _separated_input(layer, rng, (4, 4), attempts=3)


# ----------------------------------------------------------- dispatch, combine
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_identical_experts_equal_one_dense_expert(rng, top_k):
    layer = _moe(rng, top_k=top_k)  # no capacity limit
    for expert in layer.experts[1:]:
        for (_, mine), (_, first) in zip(
            expert.named_parameters(), layer.experts[0].named_parameters(), strict=True
        ):
            mine.value[...] = first.value
    x = rng.standard_normal((3, 7, 4))
    y = layer.forward(x)
    np.testing.assert_allclose(layer.routing.gates.sum(axis=-1), 1.0, rtol=1e-14)
    dense = layer.experts[0].forward(x)
    np.testing.assert_allclose(y, dense, rtol=1e-12, atol=1e-13)
    if top_k < 4:  # different tokens went to different experts: the combine put them back
        assert len(set(layer.routing.choices[..., 0].ravel().tolist())) > 1


def _reference(layer, x):
    """The layer's output, token by token, from its definition (a slow loop)."""
    flat = x.reshape(-1, layer.d_model)
    n_tokens, k = len(flat), layer.top_k
    capacity = (
        n_tokens * k
        if layer.capacity_factor is None
        else math.ceil(layer.capacity_factor * n_tokens * k / layer.n_experts)
    )
    taken = [0] * layer.n_experts
    out = np.zeros_like(flat)
    routes = []
    for token in flat:
        logits = token @ layer.router.weight.value
        p = np.exp(logits - logits.max())
        p /= p.sum()
        best = sorted(range(layer.n_experts), key=lambda i: -p[i])[:k]
        norm = sum(p[i] for i in best) if layer.renormalize else 1.0
        routes.append((p, best, norm))
    for rank in range(k):  # every first choice is served before any second choice
        for n, (p, best, norm) in enumerate(routes):
            i = best[rank]
            if taken[i] < capacity:
                taken[i] += 1
                out[n] += p[i] / norm * layer.experts[i].forward(flat[n][None])[0]
    return out.reshape(x.shape)


@pytest.mark.parametrize(
    ("top_k", "capacity_factor", "renormalize"),
    [(1, None, False), (2, None, True), (2, 0.6, True), (3, 1.0, False)],
)
def test_matches_a_token_by_token_reference(rng, top_k, capacity_factor, renormalize):
    layer = _moe(
        rng,
        feed_forward="plain",
        top_k=top_k,
        capacity_factor=capacity_factor,
        renormalize=renormalize,
        bias=True,
    )
    x = rng.standard_normal((2, 9, 4))
    y = layer.forward(x)
    np.testing.assert_allclose(y, _reference(layer, x), rtol=1e-12, atol=1e-13)


def test_each_token_is_independent_without_a_capacity(rng):
    layer = _moe(rng, top_k=2)
    x = rng.standard_normal((2, 6, 4))
    whole = layer.forward(x)
    np.testing.assert_allclose(layer.forward(x[:, 2:3]), whole[:, 2:3], rtol=1e-12, atol=1e-14)


# -------------------------------------------------------------------- capacity
def _hand_routed(rng, top_k):
    """Three experts and a router that reads the route off the input: logits = 10 x."""
    layer = _moe(rng, d_model=3, d_ff=4, n_experts=3, top_k=top_k, capacity_factor=1.0)
    layer.router.weight.value[...] = 10 * np.eye(3)
    return layer


def test_capacity_drops_are_counted_on_a_hand_made_routing_top1(rng):
    layer = _hand_routed(rng, top_k=1)
    # token: 0    1    2    3    4    5   (first choices 0, 0, 0, 0, 1, 2)
    x = np.array([[1.0, 0, 0], [0.9, 0, 0.1], [1, 0.2, 0], [0.8, 0, 0], [0, 1, 0], [0, 0, 1]])
    y = layer.forward(x)
    assert expert_capacity(1.0, 6, 1, 3) == 2  # ceil(6 * 1 / 3)
    assert layer.routing.capacity == 2
    assert layer.routing.choices[:, 0].tolist() == [0, 0, 0, 0, 1, 2]
    assert layer.routing.kept[:, 0].tolist() == [True, True, False, False, True, True]
    assert layer.n_dropped == 2  # tokens 2 and 3 came after expert 0 was full
    assert not y[2:4].any()  # a dropped token gets exactly nothing from the layer
    for n, i in [(0, 0), (1, 0), (4, 1), (5, 2)]:  # one renormalized gate: 1
        np.testing.assert_allclose(y[n], layer.experts[i].forward(x[n : n + 1])[0], rtol=1e-13)
    np.testing.assert_array_equal(layer.routing.load, [4 / 6, 1 / 6, 1 / 6])  # before dropping


def test_capacity_drops_are_counted_on_a_hand_made_routing_top2(rng):
    layer = _hand_routed(rng, top_k=2)
    # every token prefers expert 0; tokens 0-2 then expert 1, tokens 3-5 expert 2
    x = np.array([[1.0, 0.5, 0], [1, 0.4, 0], [1, 0.6, 0], [1, 0, 0.5], [1, 0, 0.3], [1, 0, 0.2]])
    y = layer.forward(x)
    capacity = math.ceil(1.0 * 6 * 2 / 3)  # 4
    assert layer.routing.capacity == capacity
    assert layer.routing.choices.tolist() == [[0, 1]] * 3 + [[0, 2]] * 3
    expected_kept = [[True, True]] * 4 + [[False, True]] * 2  # expert 0 full after token 3
    assert layer.routing.kept.tolist() == expected_kept
    assert layer.n_dropped == 2
    gates = layer.routing.gates
    for n in (4, 5):  # only the second expert's share is left, its gate not renormalized
        expected = gates[n, 1] * layer.experts[2].forward(x[n : n + 1])[0]
        np.testing.assert_allclose(y[n], expected, rtol=1e-13)
        assert gates[n, 1] < 0.5
    # without a limit nothing is dropped and the gates are the same
    unlimited = MixtureOfExperts(3, 4, 3, top_k=2, rng=rng)
    unlimited.load_state_dict(layer.state_dict())
    unlimited.forward(x)
    assert unlimited.n_dropped == 0
    np.testing.assert_array_equal(unlimited.routing.gates, gates)


def test_expert_capacity_formula():
    assert expert_capacity(1.25, 10, 2, 4) == 7  # ceil(6.25)
    assert expert_capacity(1.0, 8, 2, 4) == 4  # exact: no rounding up
    assert expert_capacity(0.01, 3, 1, 8) == 1
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(0.0, 8, 2, 4)


# -------------------------------------------------------------- load balancing
def test_aux_loss_is_one_for_a_uniform_router(rng):
    layer = _moe(rng, n_experts=5, top_k=2)
    layer.router.weight.value[...] = 0.0  # every probability exactly 1/5
    layer.forward(rng.standard_normal((4, 6, 4)))
    np.testing.assert_array_equal(layer.routing.probabilities, 0.2)
    assert layer.aux_loss == pytest.approx(1.0, abs=1e-15)
    assert layer.routing.load.sum() == pytest.approx(1.0, abs=1e-15)


def test_aux_loss_is_large_for_a_collapsed_router(rng):
    layer = _moe(rng, n_experts=4, top_k=1)
    layer.router.weight.value[...] = 0.0
    layer.router.weight.value[0, 2] = 20.0  # expert 2 takes every token with x_0 > 0
    x = np.abs(rng.standard_normal((50, 4))) + 0.5
    layer.forward(x)
    np.testing.assert_array_equal(layer.routing.load, [0, 0, 1, 0])
    assert 3.9 < layer.aux_loss <= 4.0  # E * P_2 with P_2 close to 1


def test_the_load_balancing_gradient_spreads_a_collapsed_router(rng):
    layer = _moe(rng, n_experts=4, top_k=1, renormalize=False, aux_loss_weight=1.0)
    layer.router.weight.value[:, 0] += 2.0  # expert 0 favoured
    x = np.abs(rng.standard_normal((64, 4)))
    layer.forward(x)
    before, load_before = layer.aux_loss, layer.routing.load.max()
    for _ in range(300):  # gradient descent on the router, the experts' output ignored
        layer.zero_grad()
        layer.forward(x)
        layer.backward(np.zeros_like(x))
        layer.router.weight.value -= 0.5 * layer.router.weight.grad
    layer.forward(x)
    assert before > 2.0
    assert layer.aux_loss < 1.2 < before
    assert layer.routing.load.max() < load_before


# ------------------------------------------------------ parameters and counts
def test_parameter_names_follow_the_module_convention(rng):
    layer = MixtureOfExperts(4, 5, 3, rng=rng, feed_forward="plain", activation="relu", bias=True)
    names = [n for n, _ in layer.named_parameters()]
    assert names[0] == "router.weight"
    assert names[1:5] == [
        "experts.0.linear_in.weight",
        "experts.0.linear_in.bias",
        "experts.0.linear_out.weight",
        "experts.0.linear_out.bias",
    ]
    assert names[-1] == "experts.2.linear_out.bias"
    assert len(layer.parameters()) == 1 + 3 * 4


@pytest.mark.parametrize(
    ("feed_forward", "bias", "top_k", "total", "active"),
    [
        # gated, no bias: expert 4 * 10 + 5 * 4 = 60; router 4 * 4 = 16
        ("gated", False, 2, 16 + 4 * 60, 16 + 2 * 60),
        # plain with biases: expert 4 * 5 + 5 + 5 * 4 + 4 = 49
        ("plain", True, 1, 16 + 4 * 49, 16 + 49),
        ("gated", True, 4, 16 + 4 * 74, 16 + 4 * 74),  # every expert active
    ],
)
def test_total_and_active_parameters(rng, feed_forward, bias, top_k, total, active):
    layer = MixtureOfExperts(4, 5, 4, top_k=top_k, rng=rng, feed_forward=feed_forward, bias=bias)
    assert layer.total_parameters() == layer.num_parameters() == total
    assert layer.active_parameters_per_token() == active
    closed_form = moe_parameters(4, 5, 4, top_k=top_k, feed_forward=feed_forward, bias=bias)
    assert closed_form == (total, active)


# ------------------------------------------------------------- dtypes and modes
@pytest.mark.parametrize("capacity_factor", [None, 0.8])
def test_float32_in_float32_out(rng, capacity_factor):
    wide = _moe(rng, top_k=2, capacity_factor=capacity_factor, aux_loss_weight=0.3)
    narrow = MixtureOfExperts(
        4,
        5,
        4,
        top_k=2,
        rng=rng,
        capacity_factor=capacity_factor,
        aux_loss_weight=0.3,
        dtype=np.float32,
    )
    narrow.load_state_dict({k: v.astype(np.float32) for k, v in wide.state_dict().items()})
    x = _separated_input(wide, rng, (3, 5, 4))
    g = rng.standard_normal(x.shape)
    y64, y32 = wide.forward(x), narrow.forward(x.astype(np.float32))
    assert y32.dtype == np.float32
    assert narrow.routing.gates.dtype == narrow.routing.probabilities.dtype == np.float32
    np.testing.assert_array_equal(narrow.routing.choices, wide.routing.choices)
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-5)
    assert narrow.aux_loss == pytest.approx(wide.aux_loss, rel=1e-6)
    gx64, gx32 = wide.backward(g), narrow.backward(g.astype(np.float32))
    assert gx32.dtype == np.float32
    np.testing.assert_allclose(gx32, gx64, rtol=1e-4, atol=1e-4)
    for (name, p64), (_, p32) in zip(
        wide.named_parameters(), narrow.named_parameters(), strict=True
    ):
        assert p32.grad.dtype == np.float32, name
        np.testing.assert_allclose(p32.grad, p64.grad, rtol=1e-4, atol=1e-4, err_msg=name)
    with pytest.raises(TypeError, match="x must have the layer's dtype float32"):
        narrow.forward(x)


def test_no_grad_gives_the_same_output_and_refuses_backward(rng):
    layer = _moe(rng, top_k=2)
    x = rng.standard_normal((2, 3, 4))
    expected = layer.forward(x)
    with no_grad():
        y = layer.forward(x)
    np.testing.assert_array_equal(y, expected)
    with pytest.raises(RuntimeError, match="no_grad"):
        layer.backward(np.ones_like(x))


def test_backward_before_forward_and_results_before_forward(rng):
    layer = _moe(rng)
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.zeros((2, 4)))
    with pytest.raises(RuntimeError, match="run forward first"):
        _ = layer.aux_loss


# ------------------------------------------------------------- argument errors
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_experts": 0}, ValueError, "n_experts must be a positive integer, got 0"),
        ({"top_k": 0}, ValueError, "top_k must be a positive integer, got 0"),
        ({"top_k": 5}, ValueError, r"top_k must be at most n_experts \(4\), got 5"),
        ({"top_k": 1.5}, TypeError, "top_k must be a positive integer"),
        ({"capacity_factor": 0.0}, ValueError, "capacity_factor must be a finite positive"),
        ({"capacity_factor": "big"}, TypeError, "capacity_factor must be a positive number"),
        ({"feed_forward": "moe"}, ValueError, "feed_forward must be one of"),
        ({"activation": "tanh"}, ValueError, "activation must be one of"),
        ({"aux_loss_weight": -1.0}, ValueError, "aux_loss_weight must be a finite non-negative"),
        ({"renormalize": 1}, TypeError, "renormalize must be a bool, got int 1"),
        ({"rng": 3}, TypeError, "rng must be a numpy.random.Generator"),
        ({"dtype": np.int32}, TypeError, "dtype must be float32 or float64"),
        ({"dropout": 1.0}, ValueError, r"p must be in \[0, 1\)|dropout"),
    ],
)
def test_argument_errors_name_the_argument(rng, kwargs, error, match):
    arguments = {"d_model": 4, "d_ff": 5, "n_experts": 4, "rng": rng, **kwargs}
    with pytest.raises(error, match=match):
        MixtureOfExperts(**arguments)


def test_input_and_gradient_errors(rng):
    layer = _moe(rng)
    with pytest.raises(ValueError, match="x must have last dimension 4, got shape"):
        layer.forward(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="x must hold at least one token"):
        layer.forward(np.zeros((0, 4)))
    layer.forward(rng.standard_normal((2, 3, 4)))
    with pytest.raises(ValueError, match=r"grad_out must have the forward output's shape \(2, 3"):
        layer.backward(np.zeros((3, 4)))


# ------------------------------------------------------------ in a transformer
def test_the_registry_entry_runs_it_inside_a_transformer_block(rng):
    assert "moe" in FEED_FORWARDS
    block = TransformerBlock(
        8,
        2,
        6,
        rng=rng,
        norm_first=True,
        norm="rmsnorm",
        feed_forward="moe",
        activation="silu",
        bias=False,
        n_experts=4,
        experts_per_token=2,
        expert_feed_forward="plain",
        expert_capacity_factor=1.25,
        router_aux_loss_weight=0.01,
    )
    layer = block.feed_forward.layer
    assert isinstance(layer, MixtureOfExperts)
    assert (layer.n_experts, layer.top_k, layer.feed_forward) == (4, 2, "plain")
    assert (layer.capacity_factor, layer.aux_loss_weight) == (1.25, 0.01)
    assert layer.experts[0].activation == "silu"
    assert layer.experts[0].linear_in.bias is None
    names = [n for n, _ in block.named_parameters()]
    assert "feed_forward.layer.router.weight" in names
    assert "feed_forward.layer.experts.3.linear_out.weight" in names
    x = rng.standard_normal((2, 5, 8))
    y = block.forward(x, mask=np.tril(np.ones((5, 5), dtype=bool)))
    assert y.shape == x.shape
    assert layer.routing.capacity == expert_capacity(1.25, 10, 2, 4)
    grad = block.backward(rng.standard_normal(x.shape))
    assert grad.shape == x.shape
    assert np.abs(layer.router.weight.grad).max() > 0


def test_the_registry_refuses_missing_and_foreign_options(rng):
    common = {"rng": rng, "activation": "relu", "dropout": 0.0, "bias": True, "dtype": np.float64}
    with pytest.raises(TypeError, match="feed-forward kind 'moe' needs n_experts"):
        make_feed_forward("moe", 4, 6, **common)
    with pytest.raises(
        TypeError, match=r"feed-forward kind 'gated' takes no option\(s\) \['n_exp"
    ):
        make_feed_forward("gated", 4, 6, n_experts=2, **common)
    with pytest.raises(TypeError, match=r"kind 'moe' takes no option\(s\) \['experts'\]"):
        make_feed_forward("moe", 4, 6, n_experts=2, experts=3, **common)
    with pytest.raises(ValueError, match="n_experts must be None unless feed_forward='moe'"):
        TransformerBlock(8, 2, 6, rng=rng, n_experts=4)
    with pytest.raises(ValueError, match="top_k must be at most n_experts"):
        TransformerBlock(8, 2, 6, rng=rng, feed_forward="moe", n_experts=2, experts_per_token=3)
    made = make_feed_forward("moe", 4, 6, n_experts=3, top_k=1, **common)
    direct = MixtureOfExperts(
        4,
        6,
        3,
        top_k=1,
        rng=np.random.default_rng(0),
        **{k: v for k, v in common.items() if k != "rng"},
    )
    assert [n for n, _ in made.named_parameters()] == [n for n, _ in direct.named_parameters()]


def test_softmax_matches_the_library_softmax(rng):
    layer = _moe(rng)
    x = rng.standard_normal((5, 4))
    layer.forward(x)
    np.testing.assert_allclose(
        layer.routing.probabilities, F.softmax(x @ layer.router.weight.value), rtol=1e-14
    )


def test_a_first_choice_comes_before_an_earlier_tokens_second_choice(rng):
    layer = _hand_routed(rng, top_k=2)
    layer.capacity_factor = 0.5  # ceil(0.5 * 2 tokens * 2 / 3 experts) = 1 slot per expert
    x = np.array([[1.0, 0.5, 0], [0.5, 1.0, 0]])  # token 0: experts 0 then 1; token 1: 1 then 0
    layer.forward(x)
    assert layer.routing.capacity == 1
    assert layer.routing.choices.tolist() == [[0, 1], [1, 0]]
    # in token order, token 0 would take both slots and token 1 would get nothing
    assert layer.routing.kept.tolist() == [[True, False], [True, False]]
    assert layer.n_dropped == 2


def test_expert_capacity_is_exact_and_checks_its_arguments():
    assert expert_capacity(1.1, 100, 1, 2) == 55  # 1.1 * 100 / 2 in floats is 55.000000000000007
    assert expert_capacity(1.25, 10, 2, 4) == 7  # ceil(6.25)
    with pytest.raises(ValueError, match="n_experts"):
        expert_capacity(1.0, 10, 2, 0)
    with pytest.raises(ValueError, match="n_tokens"):
        expert_capacity(1.0, -5, 2, 4)
    with pytest.raises(TypeError, match="n_tokens"):
        expert_capacity(1.0, 10.5, 2, 4)
