"""The arithmetic of published scaling laws (tinyformer.scaling_laws)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tinyformer.scaling_laws import (
    LossFit,
    compute_optimal,
    effective_data,
    inference_optimal,
    kaplan_frontier,
    lifetime_flops,
    non_embedding_view,
    parametric_loss,
    power_law_exponent,
    split_parameters,
    tokens_for_loss,
)

# Hoffmann et al. (2022), approach 3, as published (rounded); used here only as test numbers.
FIT = LossFit(e=1.69, a=406.4, b=410.7, alpha=0.34, beta=0.28)
SHAPE = {"vocab_size": 50257, "context_length": 1024, "aspect_ratio": 64.0}


def test_parametric_loss_matches_the_formula_and_keeps_float32():
    n, d = 70e9, 1.4e12
    expected = 1.69 + 406.4 / n**0.34 + 410.7 / d**0.28
    assert math.isclose(parametric_loss(n, d, FIT), expected, rel_tol=1e-12)
    grid = parametric_loss(np.float32([1e8, 1e9]), np.float32([[1e10], [1e11]]), FIT)
    assert grid.shape == (2, 2)
    assert grid.dtype == np.float32
    assert np.all(np.diff(grid, axis=1) < 0)
    assert np.all(np.diff(grid, axis=0) < 0)
    # a Python number beside a float32 array does not promote it to float64
    mixed = parametric_loss(np.float32([1e9, 1e10]), 1e12, FIT)
    assert mixed.dtype == np.float32
    assert parametric_loss(np.array([1e9]), 1e12, FIT).dtype == np.float64
    assert parametric_loss(1e9, np.float32([1e12]), FIT).dtype == np.float32
    with pytest.raises(TypeError, match="n_params must be float32 or float64"):
        parametric_loss(np.float16([1e3]), 1e12, FIT)


@pytest.mark.parametrize("compute", [1e18, 5.76e23, 1e26])
def test_compute_optimal_is_the_brute_force_minimum(compute):
    n_opt, d_opt = compute_optimal(compute, FIT)
    assert math.isclose(6 * n_opt * d_opt, compute, rel_tol=1e-12)
    grid = n_opt * np.geomspace(0.2, 5, 200_001)  # (points,)
    losses = parametric_loss(grid, compute / (6 * grid), FIT)
    assert abs(grid[np.argmin(losses)] / n_opt - 1) < 1e-4
    # at the optimum the reducible terms stand in the ratio beta : alpha
    ratio = (FIT.a / n_opt**FIT.alpha) / (FIT.b / d_opt**FIT.beta)
    assert math.isclose(ratio, FIT.beta / FIT.alpha, rel_tol=1e-9)


def test_compute_optimal_grows_as_the_published_exponent():
    n1, _ = compute_optimal(1e20, FIT)
    n2, _ = compute_optimal(1e22, FIT)
    assert math.isclose(math.log(n2 / n1) / math.log(100), 0.28 / 0.62, rel_tol=1e-9)


def test_tokens_for_loss_inverts_the_law_and_refuses_the_unreachable():
    n = 1e9
    d = tokens_for_loss(2.5, n, FIT)
    assert math.isclose(parametric_loss(n, d, FIT), 2.5, rel_tol=1e-12)
    with pytest.raises(ValueError, match="no amount of data"):
        tokens_for_loss(1.70, 1e6, FIT)


def test_lifetime_flops_counts_training_and_serving():
    assert lifetime_flops(10.0, 3.0, 0.0) == 180.0
    assert lifetime_flops(10.0, 3.0, 5.0) == 180.0 + 100.0
    with pytest.raises(ValueError, match="inference_tokens"):
        lifetime_flops(10.0, 3.0, -1.0)


def test_inference_optimal_without_serving_is_the_compute_optimal_model():
    n_c, d_c = compute_optimal(1e23, FIT)
    loss = parametric_loss(n_c, d_c, FIT)
    n, d = inference_optimal(loss, 0.0, FIT)
    assert math.isclose(n, n_c, rel_tol=1e-9)
    assert math.isclose(d, d_c, rel_tol=1e-9)


@pytest.mark.parametrize("served", [1e11, 1e13, 1e15])
def test_inference_optimal_is_the_brute_force_minimum_and_smaller(served):
    n_c, d_c = compute_optimal(1e23, FIT)
    loss = parametric_loss(n_c, d_c, FIT)
    n, d = inference_optimal(loss, served, FIT)
    assert math.isclose(parametric_loss(n, d, FIT), loss, rel_tol=1e-9)  # on the curve
    assert n < n_c
    assert d > d_c
    grid = n * np.geomspace(0.5, 2, 20_001)
    grid = grid[FIT.a / grid**FIT.alpha < loss - FIT.e]  # sizes that can reach the loss at all
    cost = [lifetime_flops(m, tokens_for_loss(loss, m, FIT), served) for m in grid]
    assert abs(grid[int(np.argmin(cost))] / n - 1) < 1e-3
    assert lifetime_flops(n, d, served) < lifetime_flops(n_c, d_c, served)


def test_effective_data_closed_form_and_limits():
    u, r_star = 100.0, 15.4
    assert effective_data(u, u, r_star) == u  # one epoch: every token fresh
    for epochs in (2, 4, 16, 40):
        expected = u + u * r_star * (1 - math.exp(-(epochs - 1) / r_star))
        assert math.isclose(effective_data(u, epochs * u, r_star), expected, rel_tol=1e-12)
        assert effective_data(u, epochs * u, r_star) < epochs * u  # repeats are worth less
    tiny = effective_data(u, u * (1 + 1e-6), r_star)
    assert math.isclose(tiny, u * (1 + 1e-6), rel_tol=1e-12)  # the first repeats ~ fresh
    assert math.isclose(effective_data(u, u * 1e6, r_star), u * (1 + r_star), rel_tol=1e-12)
    values = [effective_data(u, e * u, r_star) for e in range(1, 50)]
    assert np.all(np.diff(values) > 0)
    assert np.all(np.diff(values, 2) < 0)
    with pytest.raises(ValueError, match="total_tokens must be at least"):
        effective_data(u, u / 2, r_star)


def test_split_parameters_recovers_a_known_model():
    d, aspect, vocab, ctx = 768.0, 64.0, 50257, 1024
    blocks, tables = 12 * d**3 / aspect, (vocab + ctx) * d
    non_emb, emb = split_parameters(
        blocks + tables, vocab_size=vocab, context_length=ctx, aspect_ratio=aspect
    )
    assert math.isclose(non_emb, blocks, rel_tol=1e-9)
    assert math.isclose(emb, tables, rel_tol=1e-9)


def test_split_parameters_is_exact_when_the_tables_dominate():
    d, aspect, vocab, ctx = 2.0, 64.0, 50257, 1024
    blocks = 12 * d**3 / aspect  # 1.5 parameters beside about 1e5 in the tables
    non_emb, _ = split_parameters(
        blocks + (vocab + ctx) * d, vocab_size=vocab, context_length=ctx, aspect_ratio=aspect
    )
    assert math.isclose(non_emb, blocks, rel_tol=1e-12)


@pytest.mark.parametrize("compute", [1e12, 1e17, 1e21])
def test_kaplan_frontier_is_the_brute_force_minimum(compute):
    n_best = kaplan_frontier(compute, FIT, **SHAPE)
    assert n_best.shape == ()
    table, cube = SHAPE["vocab_size"] + SHAPE["context_length"], 12 / SHAPE["aspect_ratio"]
    width = (n_best / cube) ** (1 / 3) * np.geomspace(0.5, 2, 200_001)  # (points,)
    n_ne = cube * width**3
    losses = parametric_loss(n_ne + table * width, compute / (6 * n_ne), FIT)
    assert abs(n_ne[np.argmin(losses)] / n_best - 1) < 1e-4
    best_loss = parametric_loss(
        n_best + table * (n_best / cube) ** (1 / 3), compute / (6 * n_best), FIT
    )
    assert best_loss <= losses.min() * (1 + 1e-12)


def test_kaplan_frontier_is_steeper_than_the_recounted_frontier_over_kaplans_sizes():
    def in_range(n):  # Kaplan et al.'s sizes
        return (n >= 768) & (n <= 1.5e9)

    c_ne, n_ne = non_embedding_view(np.geomspace(1e12, 1e23, 45), FIT, **SHAPE)
    recounted = power_law_exponent(c_ne[in_range(n_ne)], n_ne[in_range(n_ne)])
    budgets = np.geomspace(1e10, 1e23, 53)
    best = kaplan_frontier(budgets, FIT, **SHAPE)
    chosen = power_law_exponent(budgets[in_range(best)], best[in_range(best)])
    assert chosen > recounted + 0.1
    # with no tables the two procedures agree: the law's own exponent beta / (alpha + beta)
    bare = {**SHAPE, "vocab_size": 1e-9, "context_length": 1e-9}
    exact = kaplan_frontier(budgets, FIT, **bare)
    assert math.isclose(power_law_exponent(budgets, exact), 0.28 / 0.62, rel_tol=1e-6)


def test_kaplan_frontier_checks_inputs():
    with pytest.raises(ValueError, match="compute_non_embedding must be finite and positive"):
        kaplan_frontier([1e20, -1.0], FIT, **SHAPE)
    with pytest.raises(ValueError, match="edge of the search grid"):
        kaplan_frontier(1e60, FIT, **SHAPE)
    with pytest.raises(ValueError, match="grid must be at least 3"):
        kaplan_frontier(1e20, FIT, grid=2, **SHAPE)


def test_non_embedding_view_steepens_small_scales_only():
    small = np.geomspace(1e15, 1e17, 5)
    large = np.geomspace(1e27, 1e29, 5)
    a = FIT.beta / (FIT.alpha + FIT.beta)  # the exponent in total counts
    k_small = power_law_exponent(*non_embedding_view(small, FIT, **SHAPE))
    k_large = power_law_exponent(*non_embedding_view(large, FIT, **SHAPE))
    assert k_small > a + 0.1  # embeddings dominate small models: a steeper apparent law
    assert abs(k_large - a) < 0.01  # and vanish in large ones


def test_power_law_exponent_recovers_an_exact_law_and_checks_inputs():
    x = np.geomspace(1, 1e4, 9)
    assert math.isclose(power_law_exponent(x, 3 * x**0.73), 0.73, rel_tol=1e-9)
    with pytest.raises(ValueError, match="same shape"):
        power_law_exponent(x, x[:-1])
    with pytest.raises(ValueError, match="positive"):
        power_law_exponent(x, -x)


def test_inputs_are_checked():
    with pytest.raises(TypeError, match="fit must be a LossFit"):
        compute_optimal(1e20, (1.69, 406.4, 410.7, 0.34, 0.28))
    with pytest.raises(ValueError, match=r"fit\.alpha"):
        compute_optimal(1e20, dataclasses.replace(FIT, alpha=0.0))
    with pytest.raises(ValueError, match="compute"):
        compute_optimal(-1.0, FIT)
    with pytest.raises(ValueError, match="n_params and n_tokens"):
        parametric_loss(0.0, 1.0, FIT)
    with pytest.raises(ValueError, match="irreducible"):
        inference_optimal(1.5, 1e12, FIT)
