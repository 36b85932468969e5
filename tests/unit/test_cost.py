"""FLOP counts and activation memory: formulas against what the model actually does."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer import cost
from tinyformer.losses import cross_entropy
from tinyformer.models.config import DecoderOnlyConfig
from tinyformer.models.counting import gpt2_config
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.models.encoder_only import EncoderOnlyConfig, EncoderOnlyMLM


def _config(**options) -> DecoderOnlyConfig:
    sizes = {"vocab_size": 11, "d_model": 16, "n_heads": 4, "d_ff": 24, "n_layers": 2}
    return DecoderOnlyConfig(**sizes, context_length=12, **options)


OPTIONS = [
    {},
    {"activation": "relu", "norm_first": False},
    {"activation": "gelu_tanh", "positional": "sinusoidal"},
    {"dropout": 0.2, "tie_output": False},
    {"dtype": "float32", "activation": "silu"},
    {"n_kv_heads": 2, "activation": "relu"},
    {"n_kv_heads": 1, "dropout": 0.2},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_counted_matmuls_equal_formula_and_backward_is_twice_forward(options):
    config = _config(**options)
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, 11, (3, 10))
    with cost.count_matmuls(model) as forward:
        logits = model.forward(ids)
    _, grad = cross_entropy(logits, ids)
    with cost.count_matmuls(model) as backward:
        model.backward(grad)
    assert forward.matrix == sum(cost.forward_flops(config, 10, 3).values())
    assert backward.matrix == 2 * forward.matrix
    assert forward.matrix + backward.matrix == cost.training_flops(config, 10, 3)


def test_count_matmuls_restores_parameters_and_methods():
    model = DecoderOnlyLM(_config(), rng=np.random.default_rng(0))
    before = [p.value for p in model.parameters()]
    with cost.count_matmuls(model):
        model.forward(np.zeros((1, 4), dtype=int))
    assert all(p.value is v for p, v in zip(model.parameters(), before, strict=True))
    assert all("forward" not in vars(m) for m in model.modules())
    assert type(model.forward(np.zeros((1, 4), dtype=int))) is np.ndarray


@pytest.mark.parametrize("options", OPTIONS)
def test_saved_bytes_equal_formula(options):
    config = _config(**options)
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    model.forward(np.random.default_rng(1).integers(0, 11, (2, 9)))
    measured = cost.saved_bytes(model)
    assert sum(measured.values()) == sum(cost.activation_bytes(config, 9, 2).values())
    per_block = sum(v for k, v in measured.items() if k.startswith("decoder.layers.0."))
    itemsize = np.dtype(config.dtype).itemsize
    assert per_block == 2 * itemsize * sum(cost.block_activation_elements(config, 9).values())


def test_saved_bytes_of_encoder_only_model():
    config = EncoderOnlyConfig(
        vocab_size=9, d_model=8, n_heads=2, d_ff=16, n_layers=3, context_length=7
    )
    model = EncoderOnlyMLM(config, rng=np.random.default_rng(0))
    model.forward(np.ones((2, 7), dtype=int))
    assert sum(cost.saved_bytes(model).values()) == sum(
        cost.activation_bytes(config, 7, 2).values()
    )


def test_backward_empties_the_saved_state():
    model = DecoderOnlyLM(_config(), rng=np.random.default_rng(0))
    ids = np.ones((2, 5), dtype=int)
    logits = model.forward(ids)
    model.backward(cross_entropy(logits, ids)[1])
    assert cost.saved_bytes(model) == {}


def test_kaplan_six_n_d_is_close_for_gpt2_and_exact_without_extra_terms():
    config = gpt2_config(768, 12, 12)
    n = cost.non_embedding_parameters(config)
    exact = cost.training_flops(config, 1024)
    assert 1.5 < exact / cost.kaplan_flops(n, 1024) < 1.8
    assert cost.kaplan_flops(n, 1) == 6 * n
    terms = cost.forward_flops(config, 1024)
    assert terms["embeddings"] == 0
    weights_only = terms["attention projections"] + terms["feed-forward"]
    assert weights_only == 2 * 1024 * 12 * (4 * 768**2 + 2 * 768 * 3072)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: cost.forward_flops("gpt", 4), "config must be"),
        (lambda: cost.forward_flops(_config(), 0), "seq_len"),
        (lambda: cost.activation_bytes(_config(), 4, -1), "batch_size"),
        (lambda: cost.kaplan_flops(0, 5), "n_parameters"),
        (lambda: cost.saved_bytes([1]), "module must be"),
    ],
)
def test_bad_inputs(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_count_matmuls_refuses_non_module():
    with pytest.raises(TypeError, match="model must be"), cost.count_matmuls(np.zeros(3)):
        pass
