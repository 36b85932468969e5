"""The gradient-check table covers every layer of the package, and every check passes."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer import verification
from tinyformer.blocks import _Residual
from tinyformer.layers import Linear
from tinyformer.models import DecoderOnlyLM, EncoderDecoder
from tinyformer.module import Module
from tinyformer.verification import (
    RECIPES,
    gradient_check_table,
    missing_recipes,
    module_classes,
    run_check,
)


def test_module_classes_walks_the_whole_package():
    classes = module_classes()
    for cls in (Linear, DecoderOnlyLM, EncoderDecoder):
        assert cls in classes
    assert all(issubclass(c, Module) and c is not Module for c in classes)
    assert _Residual not in classes  # private helpers are covered through the blocks


def test_every_module_class_has_a_recipe():
    assert missing_recipes() == [], "add a recipe to tinyformer.verification.RECIPES"
    assert set(module_classes()) == set(RECIPES)


def test_a_class_without_a_recipe_fails_the_table(monkeypatch):
    recipes = dict(RECIPES)
    del recipes[Linear]
    monkeypatch.setattr(verification, "RECIPES", recipes)
    assert missing_recipes() == ["tinyformer.layers.Linear"]
    with pytest.raises(LookupError, match="Linear"):
        gradient_check_table()


@pytest.fixture(scope="module")
def table():
    """The whole table, computed once for this file."""
    return gradient_check_table(seed=0)


def test_every_gradient_of_every_module_agrees_with_finite_differences(table):
    rows = table
    worst = max(rows, key=lambda r: r.max_relative_error)
    assert worst.max_relative_error < 1e-5, worst
    checked = {r.module.split(" (")[0] for r in rows}
    assert checked == {c.__name__ for c in module_classes()}
    # every parameter of every case is in the table
    for cls in module_classes():
        for case in RECIPES[cls](np.random.default_rng(1)):
            names = {r.gradient for r in rows if r.module == case.label and r.kind == "parameter"}
            assert names == {name for name, _ in case.module.named_parameters()}, case.label


def test_integer_inputs_are_marked_parameters_only(table):
    for label in ("Embedding", "EncoderDecoder", "DecoderOnlyLM"):
        rows = [r for r in table if r.module.startswith(label)]
        assert rows
        assert all(r.kind == "parameter" and "integers" in r.note for r in rows)


@pytest.mark.parametrize("cls", [Linear, DecoderOnlyLM])
def test_checks_are_deterministic(cls):
    def errors():
        rng = np.random.default_rng(3)
        return [r.max_relative_error for c in RECIPES[cls](rng) for r in run_check(c, rng)]

    assert errors() == errors()


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed(seed):
    with pytest.raises((TypeError, ValueError), match="seed"):
        gradient_check_table(seed=seed)
