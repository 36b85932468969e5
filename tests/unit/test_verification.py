"""The gradient-check table covers every layer of the package, and every check passes."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer import verification
from tinyformer.blocks import Residual, TransformerBlock
from tinyformer.layers import Linear
from tinyformer.models import DecoderOnlyLM, EncoderDecoder, TransformerStack
from tinyformer.module import Module
from tinyformer.multihead import MultiHeadAttention
from tinyformer.verification import (
    RECIPES,
    gradient_check_table,
    missing_recipes,
    module_classes,
    run_check,
)


def test_module_classes_walks_the_whole_package():
    classes = module_classes()
    for cls in (
        Linear,
        Residual,
        TransformerBlock,
        TransformerStack,
        DecoderOnlyLM,
        EncoderDecoder,
    ):
        assert cls in classes
    assert all(issubclass(c, Module) and c is not Module for c in classes)
    assert not any(c.__name__.startswith("_") for c in classes)


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


@pytest.mark.slow
def test_every_gradient_of_every_module_agrees_with_finite_differences(table):
    rows = table
    worst = max(rows, key=lambda r: r.max_relative_error)
    assert worst.max_relative_error < 1e-4, worst  # a wrong gradient is off by 1e-2 or more
    checked = {r.module.split(" (")[0] for r in rows}
    assert checked == {c.__name__ for c in module_classes()}
    # every parameter of every case is in the table, except frozen ones (nothing computes theirs)
    for cls in module_classes():
        for case in RECIPES[cls](np.random.default_rng(1)):
            names = {r.gradient for r in rows if r.module == case.label and r.kind == "parameter"}
            trainable = {n for n, p in case.module.named_parameters() if p.requires_grad}
            assert names == trainable, case.label
    frozen = {r.gradient for r in rows if r.module == "LoRALinear"}
    assert frozen == {"x", "lora_A", "lora_B"}  # the base weight and bias are frozen


@pytest.mark.slow
def test_every_gradient_agrees_to_the_precision_the_checker_promises(table):
    worst = max(table, key=lambda r: r.max_relative_error)
    assert worst.max_relative_error < 1e-5, worst


@pytest.mark.slow
def test_the_block_recipes_cover_every_kind_of_part(table):
    blocks = {r.module for r in table if r.module.startswith("TransformerBlock")}
    assert any("RMSNorm" in m and "SwiGLU" in m and "rotary" in m for m in blocks), blocks
    assert any("cross-attention" in m for m in blocks), blocks
    memory = [r for r in table if r.module.startswith("TransformerBlock") and r.kind == "input"]
    assert {r.gradient for r in memory} == {"x", "memory"}


@pytest.mark.slow
def test_integer_inputs_are_marked_parameters_only(table):
    for label in ("Embedding", "TransformerStack", "EncoderDecoder", "DecoderOnlyLM"):
        rows = [r for r in table if r.module.startswith(label)]
        assert rows
        assert all(r.kind == "parameter" and "integers" in r.note for r in rows)


@pytest.mark.parametrize(
    "cls", [Linear, MultiHeadAttention, pytest.param(DecoderOnlyLM, marks=pytest.mark.slow)]
)
def test_checks_are_deterministic(cls):
    def errors():
        rng = np.random.default_rng(3)
        return [r.max_relative_error for c in RECIPES[cls](rng) for r in run_check(c, rng)]

    assert errors() == errors()


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed(seed):
    with pytest.raises((TypeError, ValueError), match="seed"):
        gradient_check_table(seed=seed)
