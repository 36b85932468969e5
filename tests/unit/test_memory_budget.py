"""The memory budget of training: the formula against the arrays a model and its optimizer hold."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.cost import activation_bytes, saved_bytes
from tinyformer.losses import cross_entropy
from tinyformer.memory_budget import (
    bytes_per_parameter,
    held_bytes,
    model_state_bytes,
    training_memory,
)
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.counting import gpt2_config, parameter_count
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.optim import SGD, AdamW


def test_sixteen_bytes_per_parameter_for_adam_in_float32_and_in_mixed_precision():
    assert bytes_per_parameter("float32") == {
        "weights": 4, "gradients": 4, "first moment": 4, "second moment": 4,
    }  # fmt: skip
    mixed = bytes_per_parameter("mixed")
    assert mixed == {
        "weights": 2, "gradients": 2, "master weights": 4, "first moment": 4, "second moment": 4,
    }  # fmt: skip
    assert sum(mixed.values()) == 16  # ZeRO's 2 + 2 + K with K = 12
    assert sum(bytes_per_parameter("float64").values()) == 32
    assert sum(bytes_per_parameter("float32", "momentum").values()) == 12
    assert bytes_per_parameter("mixed", "sgd") == {
        "weights": 2,
        "gradients": 2,
        "master weights": 4,
    }


def test_gpt2_xl_needs_about_24_gb_of_model_states_as_zero_says():
    states = model_state_bytes(parameter_count(gpt2_config(1600, 48, 25)), "mixed")
    assert 24e9 < sum(states.values()) < 25e9  # 1.56e9 parameters x 16 bytes
    assert states["weights"] == 2 * 1_557_611_200


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_the_formula_equals_the_arrays_held_after_a_step(tie, kind):
    config = DecoderOnlyConfig(
        vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=2, context_length=6,
        tie_output=tie, dtype="float32",
    )  # fmt: skip
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    optimizer = AdamW(model.parameters()) if kind == "adamw" else SGD(model.parameters(), lr=0.1)
    batch = np.random.default_rng(1).integers(0, 11, (3, 7))
    model.backward(cross_entropy(model.forward(batch[:, :-1]), batch[:, 1:])[1])
    optimizer.step()
    held = held_bytes(model, optimizer)
    # tinyformer's SGD keeps a momentum buffer even at momentum 0 (PyTorch's does not)
    expected = model_state_bytes(
        model.num_parameters(), "float32", "adam" if kind == "adamw" else "momentum"
    )
    assert held == expected
    assert held_bytes(model) == {
        k: v for k, v in expected.items() if k in ("weights", "gradients")
    }


def test_activations_in_the_budget_are_what_a_forward_pass_keeps():
    config = DecoderOnlyConfig(
        vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=2, context_length=6
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, 11, (3, 6))
    model.forward(ids)
    budget = training_memory(config, 6, 3)
    assert budget["activations"] == sum(saved_bytes(model).values())
    mixed = training_memory(config, 6, 3, precision="mixed")
    ids_bytes = activation_bytes(config, 6, 3)["token ids"]
    itemsize = np.dtype(config.dtype).itemsize  # float64 here: mixed precision keeps 2 bytes
    assert mixed["activations"] - ids_bytes == (budget["activations"] - ids_bytes) // itemsize * 2


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="precision"):
        bytes_per_parameter("float16")
    with pytest.raises(ValueError, match="optimizer"):
        bytes_per_parameter("float32", "lion")
    with pytest.raises(ValueError, match="n_parameters"):
        model_state_bytes(-1)
    with pytest.raises(TypeError, match="config"):
        training_memory("gpt2", 8, 1)
    with pytest.raises(TypeError, match="model"):
        held_bytes(object())
