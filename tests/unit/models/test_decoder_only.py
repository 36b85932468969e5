"""The decoder-only model: gradients, causality and row independence to the bit, cached decoding.

Every configuration the config allows (:data:`small_models.OPTIONS`) is decoded with
the cache and compared with ``forward``; the cached step runs the same layers (an
adapter on every ``Linear`` changes both alike) under ``no_grad``; and PyTorch,
given our weights, computes the same logits and gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_models import assert_same_logits_and_gradients, decoder_only_logits
from small_models import (
    LLAMA,
    OPTIONS,
    SHIFTED_SCORES,
    SIZES,
    adapt_linears,
    decoder_only,
    perturb,
    raise_scores,
)

from tinyformer.gradcheck import check_parameter_gradients, max_relative_error, numerical_gradient
from tinyformer.layers import Linear, TiedOutputProjection
from tinyformer.losses import cross_entropy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM, DecodeState, parameter_count
from tinyformer.models.stack import TransformerStack
from tinyformer.module import grad_enabled

VOCAB, LIMIT = 9, 10
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
"""How close two computations of the same logits in a different order must be."""


def tiny(seed: int = 0, **options) -> DecoderOnlyLM:
    """Small enough to difference every parameter: d_model 4, vocabulary 7, context 6."""
    sizes = {"d_model": 4, "n_heads": 2, "d_ff": 6, "vocab_size": 7, "context_length": 6}
    return decoder_only(seed, **{**sizes, **options})


# ------------------------------------------------------------------ gradients
GRADIENT_OPTIONS = {
    "pre-norm gelu learned tied": {},
    "post-norm sinusoidal": {"norm_first": False, "positional": "sinusoidal"},
    "rotary untied, scaled embeddings, relu": {
        "positional": "rotary",
        "tie_output": False,
        "scale_embeddings": True,
        "activation": "relu",
    },
    "unscaled scores, no positions": {"attention_scale": "none", "positional": "none"},
    "llama (rmsnorm, swiglu, no bias, rotary, untied)": LLAMA,
    "post-norm llama, unscaled": OPTIONS["post-norm llama, unscaled"],
}
"""The first is a quick check of the default layout; the others are marked ``slow``."""


def assert_gradients_exact(model, run) -> None:
    """Every parameter's gradient against finite differences, relative to the largest entry.

    Every parameter but the key biases must receive a gradient (the key bias shifts every
    score of a query by the same amount, which softmax ignores: its gradient is zero).
    """
    errors = check_parameter_gradients(model, run)
    assert len(errors) == len(model.parameters()) > 0
    assert max(errors.values()) < 1e-6, {k: v for k, v in errors.items() if v >= 1e-6}
    for name, p in model.named_parameters():
        if not name.endswith("k_proj.bias"):
            assert np.any(p.grad != 0), f"{name} received no gradient"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(options, id=name, marks=[pytest.mark.slow] if i else [])
        for i, (name, options) in enumerate(GRADIENT_OPTIONS.items())
    ],
)
def test_gradients_match_finite_differences(options):
    model = perturb(tiny(**options), 1)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 7, (2, 5))
    upstream = rng.standard_normal((2, 5, 7))
    assert_gradients_exact(model, lambda: (model.forward(ids) * upstream, upstream))


def test_cross_entropy_gradient_through_the_tied_table():
    """The loss the trainer uses; the table is read by the embedding and by the output."""
    model = tiny(seed=1)
    ids = np.random.default_rng(3).integers(0, 7, (3, 6))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    model.zero_grad()
    _, grad = cross_entropy(model.forward(inputs), labels)
    model.backward(grad)
    table = model.decoder.embedding.weight
    assert model.output.weight is table
    numeric = numerical_gradient(
        lambda: cross_entropy(model.forward(inputs), labels)[0], table.value
    )
    assert max_relative_error(table.grad, numeric) < 1e-6


def test_backward_adds_into_the_gradients():
    model = tiny()
    rng = np.random.default_rng(4)
    ids, grad = rng.integers(0, 7, (2, 4)), rng.standard_normal((2, 4, 7))
    model.zero_grad()
    model.forward(ids)
    model.backward(grad)
    once = {name: p.grad.copy() for name, p in model.named_parameters()}
    model.forward(ids)
    model.backward(grad)
    for name, p in model.named_parameters():
        if name == "decoder.embedding.weight":  # the tied table adds two uses each time,
            scale = np.abs(once[name]).max()  # (a + b) + a + b: rounded unlike 2 (a + b)
            np.testing.assert_allclose(p.grad, 2 * once[name], rtol=1e-14, atol=1e-14 * scale)
        else:
            np.testing.assert_array_equal(p.grad, 2 * once[name], err_msg=name)


# ------------------------------------------------- independence, to the bit
@st.composite
def models_and_ids(draw, *, min_batch: int = 1):
    """A model of any option, shape and dtype, and a batch of ids for it."""
    n_heads = draw(st.integers(1, 3))
    d_k = draw(st.sampled_from([2, 4] if n_heads > 1 else [4]))  # d_model >= 4: a post-norm
    # LayerNorm of 2 features keeps only their order, and hides most changes of the input
    name = draw(st.sampled_from(sorted(OPTIONS)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    seed = draw(st.integers(0, 2**16))
    model = decoder_only(
        seed,
        n_layers=draw(st.integers(1, 2)),
        **{**OPTIONS[name], "d_model": n_heads * d_k, "n_heads": n_heads, "dtype": dtype},
    )
    perturb(model, seed)
    if draw(st.booleans(), label="large scores"):  # where softmax must shift its rows
        raise_scores(model, SHIFTED_SCORES[dtype])
    shape = (draw(st.integers(min_batch, 4)), draw(st.integers(1, LIMIT)))
    return model.eval(), np.random.default_rng(seed).integers(0, VOCAB, shape), seed


@settings(max_examples=40)
@given(case=models_and_ids(min_batch=2), data=st.data())
def test_each_sequence_of_a_batch_is_bitwise_independent_of_the_others(case, data):
    model, ids, _ = case
    row = data.draw(st.integers(0, ids.shape[0] - 1), label="row")
    changed = ids.copy()
    changed[row] = (changed[row] + 1) % VOCAB
    before, after = model.forward(ids), model.forward(changed)
    others = np.arange(ids.shape[0]) != row
    assert np.array_equal(after[others], before[others])
    assert not np.array_equal(after[row], before[row])


@settings(max_examples=40)
@given(case=models_and_ids(), data=st.data())
def test_earlier_positions_are_bitwise_independent_of_later_tokens(case, data):
    model, ids, _ = case
    t = data.draw(st.integers(0, ids.shape[1] - 1), label="position")
    changed = ids.copy()
    changed[:, t] = (changed[:, t] + 1) % VOCAB
    before, after = model.forward(ids), model.forward(changed)
    assert np.array_equal(after[:, :t], before[:, :t])
    assert not np.array_equal(after[:, t:], before[:, t:])
    last = ids.copy()
    last[:, -1] = (last[:, -1] + 1) % VOCAB
    assert np.array_equal(model.forward(last)[:, :-1], before[:, :-1])


@settings(max_examples=30)
@given(case=models_and_ids(min_batch=2), data=st.data())
def test_a_cached_step_of_one_row_is_bitwise_independent_of_the_other_rows(case, data):
    model, ids, seed = case
    b, t = ids.shape
    row = data.draw(st.integers(0, b - 1), label="row")
    prompt = data.draw(st.integers(1, t), label="prompt length")
    others = np.random.default_rng(seed + 1).integers(0, VOCAB, ids.shape)
    others[row] = ids[row]
    states = [model.start(b), model.start(b)]
    for a, z in [(0, prompt), *((i, i + 1) for i in range(prompt, t))]:
        first, second = (
            model.step(x[:, a:z], s) for x, s in zip((ids, others), states, strict=True)
        )
        assert np.array_equal(first[row], second[row])


# ------------------------------------------------------------ cached decoding
MODELS = {
    (name, dtype): perturb(decoder_only(3, context_length=LIMIT, dtype=dtype, **options), 4).eval()
    for name, options in OPTIONS.items()
    for dtype in ("float64", "float32")
}


def pieces(sizes: list[int], total: int) -> list[tuple[int, int]]:
    """Split ``0 .. total`` into consecutive pieces of the drawn sizes (the last one trimmed)."""
    out, at = [], 0
    for size in sizes:
        if at >= total:
            break
        out.append((at, min(total, at + size)))
        at += size
    if at < total:
        out.append((at, total))
    return out


@pytest.mark.parametrize(("name", "dtype"), list(MODELS), ids=[f"{n}-{d}" for n, d in MODELS])
@settings(max_examples=15)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=LIMIT), data=st.data())
def test_cached_steps_match_forward_on_the_whole_prefix(name, dtype, sizes, data):
    model = MODELS[name, dtype]
    total = data.draw(st.integers(1, LIMIT), label="length")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    tokens = np.random.default_rng(seed).integers(0, VOCAB, (3, total))
    state = model.start(3)
    stepped = [model.step(tokens[:, a:b], state) for a, b in pieces(sizes, total)]
    assert state.length == total
    steps = np.concatenate(stepped, axis=1)
    assert steps.dtype == np.dtype(dtype)
    np.testing.assert_allclose(steps, model.forward(tokens), rtol=0, atol=TOLERANCE[dtype])


class RecordingLinear(Linear):
    """A ``Linear`` that notes, at every forward, whether a backward pass may follow."""

    def forward(self, x):
        self.modes.append(grad_enabled())
        return super().forward(x)


def test_step_runs_the_same_layers_under_no_grad():
    model = decoder_only(5, tie_output=False)
    linears = [m for m in model.modules() if type(m) is Linear]
    for layer in linears:
        layer.__class__, layer.modes = RecordingLinear, []
    ids = np.array([[1, 2, 3, 4]])
    model.forward(ids)
    assert all(layer.modes == [True] for layer in linears)
    state = model.start(1)
    model.step(ids[:, :3], state)
    model.step(ids[:, 3:], state)
    assert all(layer.modes == [True, False, False] for layer in linears)
    assert grad_enabled()  # the mode came back
    with pytest.raises(RuntimeError, match="no_grad"):  # the stack kept nothing for backward
        model.decoder.backward(np.ones((1, 1, SIZES["d_model"])))
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(np.ones((1, 4, VOCAB)))  # step dropped what forward kept


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_adapter_on_every_linear_changes_step_as_it_changes_forward(dtype):
    model, plain = (decoder_only(6, tie_output=False, dtype=dtype) for _ in range(2))
    assert adapt_linears(model, np.random.default_rng(7)) == 2 * (4 + 2) + 1
    ids = np.random.default_rng(8).integers(0, VOCAB, (2, 7))
    state = model.start(2)
    stepped = np.concatenate(
        [model.step(ids[:, :4], state)]
        + [model.step(ids[:, t : t + 1], state) for t in range(4, 7)],
        axis=1,
    )
    adapted = model.forward(ids)
    np.testing.assert_allclose(stepped, adapted, rtol=0, atol=TOLERANCE[dtype])
    assert np.abs(adapted - plain.forward(ids)).max() > 0.1  # the adapter does change the model


# ------------------------------------------------------------ modes and dtypes
def test_train_mode_dropout_is_random_but_reproducible():
    ids = np.random.default_rng(9).integers(0, 7, (2, 6))
    model, twin = tiny(seed=6, dropout=0.3), tiny(seed=6, dropout=0.3)
    first, second = model.forward(ids), model.forward(ids)
    assert np.abs(first - second).max() > 1e-3  # fresh masks at every forward
    np.testing.assert_array_equal(first, twin.forward(ids))
    np.testing.assert_array_equal(second, twin.forward(ids))
    assert model.training
    evaluated = model.eval().forward(ids)
    np.testing.assert_array_equal(evaluated, model.forward(ids))
    np.testing.assert_array_equal(evaluated, tiny(seed=6).forward(ids))  # as without dropout


def test_float32_in_float32_out_and_close_to_float64():
    ids = np.random.default_rng(10).integers(0, 7, (2, 4))
    model = tiny(dtype="float32")
    logits = model.forward(ids)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, tiny().forward(ids), rtol=0, atol=1e-5)
    model.backward(np.ones_like(logits))
    for name, p in model.named_parameters():
        assert (p.value.dtype, p.grad.dtype) == (np.float32, np.float32), name
    model.forward(ids)
    with pytest.raises(TypeError, match="dtype float32"):
        model.backward(np.ones(logits.shape))  # float64 gradient for float32 logits


# ------------------------------------------------------------------ the parts
def test_layout_and_attributes():
    model = tiny()
    assert (model.vocab_size, model.context_length, model.dtype) == (7, 6, np.dtype(np.float64))
    assert model.family == "decoder-only"
    assert isinstance(model.decoder, TransformerStack)
    assert not model.decoder.cross_attention
    assert isinstance(model.output, TiedOutputProjection)
    names = [name for name, _ in model.named_parameters()]
    assert names[0] == "decoder.embedding.weight"
    assert "decoder.layers.1.self_attention.layer.q_proj.weight" in names
    assert "decoder.layers.0.feed_forward.layer.linear_in.bias" in names
    assert names[-2:] == ["decoder.final_norm.gain", "decoder.final_norm.bias"]
    assert not any(name.startswith("output") for name in names)  # tied: the table, once
    untied = tiny(tie_output=False)
    assert isinstance(untied.output, Linear)
    assert untied.output.bias is None
    assert [n for n, _ in untied.named_parameters()][-1] == "output.weight"
    assert not hasattr(model, "max_positions")


@pytest.mark.parametrize(
    "options", [{}, {"tie_output": False}, LLAMA], ids=["tied", "untied", "llama"]
)
def test_state_dict_round_trip(options):
    model, other = tiny(0, **options), tiny(1, **options)
    ids = np.random.default_rng(11).integers(0, 7, (2, 5))
    assert np.abs(model.forward(ids) - other.forward(ids)).max() > 1e-3
    state = model.state_dict()
    assert sum(v.size for v in state.values()) == model.num_parameters()
    other.load_state_dict(state)
    np.testing.assert_array_equal(model.forward(ids), other.forward(ids))


def test_parameter_count_of_the_default_layout():
    assert tiny().num_parameters() == parameter_count(tiny().config)


# ------------------------------------------------------------------ bad input
def test_bad_ids_are_refused_by_name():
    model = tiny()
    with pytest.raises(
        ValueError, match="ids has length 7, longer than the model's context_length=6"
    ):
        model.forward(np.zeros((1, 7), dtype=np.int64))
    with pytest.raises(TypeError, match="ids must be an integer array"):
        model.forward([[0.5, 1.0]])
    with pytest.raises(ValueError, match=r"ids must be token ids in \[0, 7\), got 7"):
        model.forward(np.array([[1, 7]]))
    with pytest.raises(ValueError, match="non-empty array of shape"):
        model.forward(np.zeros((2, 0), dtype=np.int64))
    with pytest.raises(ValueError, match=r"ids must be a rectangular array.*lengths 3, 1"):
        model.forward([[1, 2, 3], [4]])


def test_bad_gradients_are_refused():
    model = tiny()
    with pytest.raises(RuntimeError, match="backward was called before forward"):
        model.backward(np.ones((2, 4, 7)))
    logits = model.forward(np.random.default_rng(12).integers(0, 7, (2, 4)))
    with pytest.raises(ValueError, match=r"shape \(2, 4, 7\), got \(2, 4, 6\)"):
        model.backward(np.ones((2, 4, 6)))
    with pytest.raises(TypeError, match=r"grad_out must be a numpy\.ndarray"):
        model.backward(logits.tolist())
    model.backward(np.ones_like(logits))
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(np.ones_like(logits))  # one backward per forward
    model.forward(np.ones((2, 4), dtype=np.int64))
    model.start(2)
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(np.ones_like(logits))  # start() invalidates what forward kept


def test_constructor_checks_its_arguments():
    config = DecoderOnlyConfig(vocab_size=5, d_model=4, n_heads=2, d_ff=6)
    with pytest.raises(TypeError, match="config must be a DecoderOnlyConfig"):
        DecoderOnlyLM(config.to_dict(), rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        DecoderOnlyLM(config, rng=0)


def test_start_and_step_check_their_arguments():
    model, other = decoder_only(0), decoder_only(1)
    one = np.ones((3, 1), dtype=np.int64)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        model.start(0)
    with pytest.raises(TypeError, match="batch_size must be a positive integer"):
        model.start(2.0)
    with pytest.raises(TypeError, match="state must be a DecodeState"):
        model.step(one, [])
    with pytest.raises(ValueError, match="state was made by another model"):
        model.step(one, other.start(3))
    with pytest.raises(ValueError, match="tokens has 3 rows but the state decodes 2 sequences"):
        model.step(one, model.start(2))
    with pytest.raises(TypeError, match="tokens must be an integer array"):
        model.step(one.astype(float), model.start(3))
    with pytest.raises(ValueError, match=rf"tokens must be token ids in \[0, {VOCAB}\)"):
        model.step(one * VOCAB, model.start(3))
    state = model.start(3)
    assert isinstance(state, DecodeState)
    model.step(np.ones((3, LIMIT - 1), dtype=np.int64), state)
    with pytest.raises(ValueError, match=rf"to {LIMIT + 1} positions .* limit of {LIMIT}"):
        model.step(np.ones((3, 2), dtype=np.int64), state)
    assert state.length == LIMIT - 1  # unchanged: the last position is still usable
    assert model.step(one, state).shape == (3, 1, VOCAB)


# ----------------------------------------------------------------- PyTorch
@pytest.mark.reference
@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "norm_first": False,
            "positional": "sinusoidal",
            "tie_output": False,
            "activation": "relu",
        },
        {"norm": "rmsnorm", "feed_forward": "gated", "activation": "silu", "bias": False},
        {"attention_scale": "none", "activation": "gelu_tanh", "scale_embeddings": True},
    ],
    ids=[
        "pre-norm learned tied",
        "post-norm sinusoidal untied",
        "rmsnorm swiglu no bias",
        "unscaled scores",
    ],
)
def test_logits_and_gradients_match_pytorch(torch, options):
    model = perturb(decoder_only(12, vocab_size=11, context_length=8, **options), 13)
    ids = np.random.default_rng(14).integers(0, 11, (3, 8))
    ours = model.forward(ids)
    theirs, pairs = decoder_only_logits(torch, model, ids)
    assert_same_logits_and_gradients(torch, model, ours, theirs, pairs, np.random.default_rng(15))
