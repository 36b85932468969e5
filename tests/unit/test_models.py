"""Whole models: exact gradients, masks, causality, dropout, dtypes, bad input, state dicts."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.gradcheck import max_relative_error, numerical_gradient
from tinyformer.losses import cross_entropy
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
    parameter_count,
)

TINY = {"d_model": 4, "n_heads": 2, "d_ff": 6}


def tiny_encoder_decoder(seed: int = 0, **options) -> EncoderDecoder:
    """A model small enough to difference every parameter; vocabulary 7, pad id 0."""
    sizes = {"n_encoder_layers": 2, "n_decoder_layers": 2, "context_length": 6, **TINY}
    config = EncoderDecoderConfig(src_vocab_size=7, tgt_vocab_size=7, **{**sizes, **options})
    return EncoderDecoder(config, rng=np.random.default_rng(seed))


def tiny_decoder_only(seed: int = 0, **options) -> DecoderOnlyLM:
    config = DecoderOnlyConfig(vocab_size=7, n_layers=2, context_length=6, **{**TINY, **options})
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed))


def source_and_target(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Source (2, 5) and decoder input (2, 4), each with padding at the end of row 1."""
    source = rng.integers(1, 7, (2, 5))
    source[1, 3:] = 0
    target = rng.integers(1, 7, (2, 4))
    target[1, 3:] = 0
    return source, target


def assert_all_gradients_exact(model, run, rng: np.random.Generator, reset=None) -> None:
    """Finite differences of L = sum(logits * w) against backward, for every parameter."""
    if reset is not None:
        reset()
    logits = run()
    weights = rng.standard_normal(logits.shape)

    def loss() -> np.ndarray:
        if reset is not None:
            reset()
        return run() * weights

    model.zero_grad()
    if reset is not None:
        reset()
    run()
    model.backward(weights)
    names = [name for name, _ in model.named_parameters()]
    assert len(names) == len(model.parameters()) > 0
    for name, p in model.named_parameters():
        error = max_relative_error(p.grad, numerical_gradient(loss, p.value))
        assert error <= 1e-6, f"{name}: relative error {error:.2e}"
        assert np.any(p.grad != 0), f"{name} received no gradient"


ENCODER_DECODER_OPTIONS = [
    pytest.param({}, id="post-norm relu sinusoidal tied"),
    pytest.param({"norm_first": True, "positional": "learned"}, id="pre-norm learned"),
    pytest.param({"tie_output": False, "activation": "gelu"}, id="untied"),
    pytest.param({"share_embeddings": True, "positional": "learned"}, id="shared and tied"),
    pytest.param(
        {"share_embeddings": True, "tie_output": False, "norm_first": True}, id="shared untied"
    ),
    pytest.param({"scale_embeddings": False, "activation": "silu"}, id="unscaled"),
]


@pytest.mark.parametrize("options", ENCODER_DECODER_OPTIONS)
def test_encoder_decoder_gradients_match_finite_differences(options, rng):
    model = tiny_encoder_decoder(**options)
    source, target = source_and_target(rng)
    assert_all_gradients_exact(model, lambda: model.forward(source, target), rng)


DECODER_ONLY_OPTIONS = [
    pytest.param({}, id="pre-norm gelu learned tied"),
    pytest.param({"norm_first": False, "positional": "sinusoidal"}, id="post-norm sinusoidal"),
    pytest.param({"positional": "rotary", "tie_output": False}, id="rotary untied"),
    pytest.param({"scale_embeddings": True, "activation": "relu"}, id="scaled relu"),
]


@pytest.mark.parametrize("options", DECODER_ONLY_OPTIONS)
def test_decoder_only_gradients_match_finite_differences(options, rng):
    model = tiny_decoder_only(**options)
    ids = rng.integers(0, 7, (2, 5))
    assert_all_gradients_exact(model, lambda: model.forward(ids), rng)


def test_gradients_with_dropout_match_finite_differences(rng):
    """With the dropout generator reset before each forward, the masks are fixed."""
    model = tiny_encoder_decoder(seed=3, dropout=0.2)
    generator = model.source_dropout.rng
    assert model.decoder_layers[0].feed_forward.dropout.rng is generator
    state = generator.bit_generator.state
    source, target = source_and_target(rng)

    def reset() -> None:
        generator.bit_generator.state = state

    assert_all_gradients_exact(model, lambda: model.forward(source, target), rng, reset)


def test_cross_entropy_gradient_through_the_model(rng):
    """The loss the trainer uses: d(cross-entropy)/d(parameters) by finite differences."""
    model = tiny_decoder_only(seed=1)
    ids = rng.integers(0, 7, (3, 6))
    inputs, labels = ids[:, :-1], ids[:, 1:]

    def loss() -> float:
        return cross_entropy(model.forward(inputs), labels)[0]

    model.zero_grad()
    _, grad = cross_entropy(model.forward(inputs), labels)
    model.backward(grad)
    table = model.embedding.weight  # used by the embedding and the tied output
    assert max_relative_error(table.grad, numerical_gradient(loss, table.value)) <= 1e-6


def test_shared_table_gets_the_sum_of_its_three_uses(rng):
    model = tiny_encoder_decoder(share_embeddings=True)
    table = model.source_embedding.weight
    assert model.target_embedding.weight is table
    assert model.output.weight is table
    names = [name for name, _ in model.named_parameters()]
    assert names.count("source_embedding.weight") == 1
    assert not any(name.startswith(("target_embedding", "output")) for name in names)
    source, target = source_and_target(rng)
    logits = model.forward(source, target)
    model.zero_grad()
    model.backward(np.ones_like(logits))
    total = table.grad.copy()
    # Each use alone: the other two take a detached copy of the table.
    parts = []
    for use in ("source_embedding", "target_embedding", "output"):
        other = tiny_encoder_decoder(share_embeddings=True)
        other.load_state_dict(model.state_dict())
        for name in {"source_embedding", "target_embedding", "output"} - {use}:
            layer = getattr(other, name)
            layer.weight = type(layer.weight)(layer.weight.value.copy())
        other.zero_grad()
        other.forward(source, target)
        other.backward(np.ones_like(logits))
        parts.append(getattr(other, use).weight.grad)
    np.testing.assert_allclose(total, sum(parts), rtol=1e-12, atol=1e-12)
    assert all(np.abs(part).max() > 0 for part in parts)


def test_backward_accumulates(rng):
    model = tiny_decoder_only()
    ids = rng.integers(0, 7, (2, 4))
    grad = rng.standard_normal((2, 4, 7))
    model.zero_grad()
    model.forward(ids)
    model.backward(grad)
    once = [p.grad.copy() for p in model.parameters()]
    model.forward(ids)
    model.backward(grad)
    for first, p in zip(once, model.parameters(), strict=True):
        np.testing.assert_allclose(p.grad, 2 * first, rtol=1e-13, atol=1e-15)


# ------------------------------------------------------------------ masking
def test_padded_rows_equal_rows_decoded_alone(rng):
    """Padding a row to the batch's length changes neither it nor the other rows."""
    model = tiny_encoder_decoder(seed=2, n_decoder_layers=1, context_length=8)
    sources = [rng.integers(1, 7, n) for n in (6, 3, 5)]
    targets = [rng.integers(1, 7, n) for n in (2, 5, 4)]
    source = np.zeros((3, 6), dtype=np.int64)
    target = np.zeros((3, 5), dtype=np.int64)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        source[i, : len(s)], target[i, : len(t)] = s, t
    batched = model.forward(source, target)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        alone = model.forward(s[None], t[None])
        np.testing.assert_allclose(batched[i, : len(t)], alone[0], rtol=0, atol=1e-12)


def test_explicit_masks_equal_the_defaults(rng):
    model = tiny_encoder_decoder()
    source, target = source_and_target(rng)
    causal = np.tril(np.ones((4, 4), dtype=bool))
    decoder_mask = causal & (target != 0)[:, None, :]
    default = model.forward(source, target)
    explicit = model.forward(
        source, target, source_mask=(source != 0)[:, None, :], decoder_mask=decoder_mask
    )
    np.testing.assert_array_equal(default, explicit)


def test_decoder_only_is_causal(rng):
    model = tiny_decoder_only(positional="rotary")
    ids = rng.integers(0, 7, (2, 6))
    before = model.forward(ids)
    for t in range(6):
        changed = ids.copy()
        changed[:, t] = (changed[:, t] + 1) % 7
        after = model.forward(changed)
        np.testing.assert_array_equal(after[:, :t], before[:, :t])
        assert np.abs(after[:, t:] - before[:, t:]).min(axis=-1).max() > 0


def test_encoder_decoder_decoder_is_causal(rng):
    model = tiny_encoder_decoder(positional="learned", norm_first=True)
    source, target = source_and_target(rng)
    target[1] = target[0]  # no padding: every position is a real token
    before = model.forward(source, target)
    changed = target.copy()
    changed[:, 2] = (changed[:, 2] + 1) % 7 + (changed[:, 2] == 6)  # never the pad id 0
    after = model.forward(source, changed)
    np.testing.assert_array_equal(after[:, :2], before[:, :2])
    assert np.abs(after[:, 2:] - before[:, 2:]).max() > 0
    other_source = source.copy()
    other_source[0, 0] = source[0, 0] % 6 + 1
    assert np.abs(model.forward(other_source, target)[0] - before[0]).min() > 0


# ------------------------------------------------------------------ dropout
def test_eval_mode_turns_dropout_off(rng):
    source, target = source_and_target(rng)
    with_dropout = tiny_encoder_decoder(seed=5, dropout=0.3).eval()
    without = tiny_encoder_decoder(seed=5, dropout=0.0)
    first = with_dropout.forward(source, target)
    np.testing.assert_array_equal(first, with_dropout.forward(source, target))
    np.testing.assert_array_equal(first, without.forward(source, target))


def test_train_mode_dropout_is_random_but_reproducible(rng):
    ids = rng.integers(0, 7, (2, 6))
    model = tiny_decoder_only(seed=6, dropout=0.3)
    twin = tiny_decoder_only(seed=6, dropout=0.3)
    first, second = model.forward(ids), model.forward(ids)
    assert np.abs(first - second).max() > 1e-3  # fresh masks at every forward
    np.testing.assert_array_equal(first, twin.forward(ids))
    np.testing.assert_array_equal(second, twin.forward(ids))
    assert model.training
    assert not model.eval().training


# -------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_float32_in_float32_out(family, rng):
    if family == "encoder-decoder":
        model = tiny_encoder_decoder(dtype="float32")
        source, target = source_and_target(rng)
        logits = model.forward(source, target)
        state = model.start(source)
        stepped = model.step(target[:, :2], state)
    else:
        model = tiny_decoder_only(dtype="float32")
        ids = rng.integers(0, 7, (2, 4))
        logits = model.forward(ids)
        state = model.start(2)
        stepped = model.step(ids[:, :2], state)
    assert logits.dtype == np.float32
    assert stepped.dtype == np.float32
    np.testing.assert_allclose(stepped, logits[:, :2], rtol=0, atol=1e-5)
    inputs = (source, target) if family == "encoder-decoder" else (ids,)
    model.forward(*inputs)  # step() dropped what forward kept; run it again to train
    model.backward(np.ones_like(logits))
    for name, p in model.named_parameters():
        assert (p.value.dtype, p.grad.dtype) == (np.float32, np.float32), name
    model.forward(*inputs)
    with pytest.raises(TypeError, match="dtype float32"):
        model.backward(np.ones(logits.shape))  # float64 gradient for float32 logits


def test_float32_model_agrees_with_float64(rng):
    ids = rng.integers(0, 7, (2, 5))
    high = tiny_decoder_only(seed=4).forward(ids)
    low = tiny_decoder_only(seed=4, dtype="float32").forward(ids)
    np.testing.assert_allclose(low, high, rtol=0, atol=1e-5)


# ----------------------------------------------------------------- bad input
def test_bad_ids_are_refused_by_name(rng):
    model = tiny_encoder_decoder()
    source, target = source_and_target(rng)
    with pytest.raises(TypeError, match="source_ids must be an integer array"):
        model.forward(source.astype(float), target)
    with pytest.raises(ValueError, match=r"decoder_input_ids must be a non-empty array of shape"):
        model.forward(source, target[0])
    with pytest.raises(ValueError, match=r"source_ids must be token ids in \[0, 7\), got 7"):
        model.forward(np.full((2, 3), 7), target)
    with pytest.raises(ValueError, match=r"decoder_input_ids must be token ids .* got -1"):
        model.forward(source, -np.ones((2, 3), dtype=np.int64))
    with pytest.raises(
        ValueError, match="source_ids has length 7, longer than the model's context_length=6"
    ):
        model.forward(np.ones((2, 7), dtype=np.int64), target)
    with pytest.raises(ValueError, match="decoder_input_ids has length 7"):
        model.forward(source, np.ones((2, 7), dtype=np.int64))
    with pytest.raises(ValueError, match="decoder_input_ids has 1 rows but source_ids has 2"):
        model.forward(source, target[:1])
    with pytest.raises(ValueError, match="non-empty"):
        model.forward(source[:, :0], target)
    lm = tiny_decoder_only()
    with pytest.raises(
        ValueError, match="ids has length 7, longer than the model's context_length=6"
    ):
        lm.forward(np.zeros((1, 7), dtype=np.int64))
    with pytest.raises(TypeError, match="ids must be an integer array"):
        lm.forward([[0.5, 1.0]])


def test_bad_masks_are_refused_by_name(rng):
    model = tiny_encoder_decoder()
    source, target = source_and_target(rng)
    with pytest.raises(TypeError, match="source_mask must be a boolean array"):
        model.forward(source, target, source_mask=np.ones((2, 1, 5)))
    with pytest.raises(ValueError, match=r"source_mask of shape \(2, 5, 5\) must broadcast"):
        model.forward(source, target, source_mask=np.ones((2, 5, 5), dtype=bool))
    with pytest.raises(ValueError, match=r"decoder_mask of shape \(3, 3\) must broadcast"):
        model.forward(source, target, decoder_mask=np.ones((3, 3), dtype=bool))


def test_bad_gradients_are_refused(rng):
    model = tiny_decoder_only()
    with pytest.raises(RuntimeError, match="backward was called before forward"):
        model.backward(np.ones((2, 4, 7)))
    logits = model.forward(rng.integers(0, 7, (2, 4)))
    with pytest.raises(ValueError, match=r"shape \(2, 4, 7\), got \(2, 4, 6\)"):
        model.backward(np.ones((2, 4, 6)))
    with pytest.raises(TypeError, match=r"grad_out must be a numpy\.ndarray"):
        model.backward(logits.tolist())
    model.backward(np.ones_like(logits))
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(np.ones_like(logits))  # one backward per forward
    model.forward(rng.integers(0, 7, (2, 4)))
    model.start(2)
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(np.ones_like(logits))  # start() invalidates what forward kept


def test_constructors_check_their_arguments():
    config = DecoderOnlyConfig(vocab_size=5, **TINY)
    with pytest.raises(TypeError, match="config must be a DecoderOnlyConfig"):
        DecoderOnlyLM(config.to_dict(), rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="config must be an EncoderDecoderConfig"):
        EncoderDecoder(config, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        DecoderOnlyLM(config, rng=0)


# -------------------------------------------------------------------- state
@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_state_dict_round_trip(family, rng):
    if family == "encoder-decoder":
        make = lambda seed: tiny_encoder_decoder(seed, positional="learned")
        source, target = source_and_target(rng)
        run = lambda m: m.forward(source, target)
    else:
        make = lambda seed: tiny_decoder_only(seed, tie_output=False)
        ids = rng.integers(0, 7, (2, 5))
        run = lambda m: m.forward(ids)
    model, other = make(0), make(1)
    assert np.abs(run(model) - run(other)).max() > 1e-3
    state = model.state_dict()
    assert sum(v.size for v in state.values()) == model.num_parameters()
    other.load_state_dict(state)
    np.testing.assert_array_equal(run(model), run(other))
    assert other.num_parameters() == parameter_count(other.config)


def test_model_attributes():
    ed = tiny_encoder_decoder(dtype="float32")
    assert (ed.vocab_size, ed.max_positions, ed.dtype) == (7, 6, np.dtype(np.float32))
    lm = tiny_decoder_only()
    assert (lm.vocab_size, lm.max_positions, lm.dtype) == (7, 6, np.dtype(np.float64))
    assert lm.final_norm is not None
    assert tiny_decoder_only(norm_first=False).final_norm is None
    assert tiny_decoder_only(positional="rotary").layers[0].self_attention.layer.rotary
