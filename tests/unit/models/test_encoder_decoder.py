"""The encoder-decoder: gradients, masks, bitwise independence, cached decoding, PyTorch.

Every configuration the config allows (:data:`small_models.OPTIONS`, rotary positions
and an unscaled score included) decodes with the cache as ``forward`` computes; the
cached step runs the same layers (an adapter on every ``Linear`` changes both alike)
under ``no_grad``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_models import assert_same_logits_and_gradients, encoder_decoder_logits
from small_models import (
    LLAMA,
    OPTIONS,
    SHIFTED_SCORES,
    SIZES,
    adapt_linears,
    encoder_decoder,
    perturb,
    raise_scores,
)

from tinyformer.gradcheck import check_parameter_gradients
from tinyformer.layers import Linear, TiedOutputProjection
from tinyformer.models import EncoderDecoder, EncoderDecoderConfig, parameter_count
from tinyformer.models.stack import TransformerStack
from tinyformer.module import Parameter, grad_enabled

VOCAB, LIMIT, PAD = 9, 10, 0
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def tiny(seed: int = 0, n_decoder_layers: int = 2, **options) -> EncoderDecoder:
    """Small enough to difference every parameter; vocabulary 7, pad id 0."""
    sizes = {"d_model": 4, "n_heads": 2, "d_ff": 6, "context_length": 6}
    return encoder_decoder(
        seed,
        src_vocab_size=7,
        tgt_vocab_size=7,
        n_decoder_layers=n_decoder_layers,
        **{**sizes, **options},
    )


def source_and_target(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source (2, 5) and decoder input (2, 4), each with padding at the end of row 1."""
    rng = np.random.default_rng(seed)
    source, target = rng.integers(1, 7, (2, 5)), rng.integers(1, 7, (2, 4))
    source[1, 3:] = PAD
    target[1, 3:] = PAD
    return source, target


# ------------------------------------------------------------------ gradients
GRADIENT_OPTIONS = {
    "post-norm relu sinusoidal tied": ({}, 2),
    "pre-norm learned untied gelu": (
        {"norm_first": True, "positional": "learned", "tie_output": False, "activation": "gelu"},
        1,
    ),
    "one table for source, target and output": (
        {"share_embeddings": True, "positional": "learned", "scale_embeddings": False},
        1,
    ),
    "rmsnorm, gated, no bias, rotary": (
        {
            "norm": "rmsnorm",
            "feed_forward": "gated",
            "activation": "gelu",
            "bias": False,
            "positional": "rotary",
        },
        1,
    ),
    "llama": (LLAMA, 1),
    "post-norm llama, unscaled scores": (OPTIONS["post-norm llama, unscaled"], 1),
}
"""Model options and number of decoder blocks; the first is a quick check, the rest ``slow``."""


def assert_gradients_exact(model, run) -> None:
    """Every gradient against finite differences; every one but the key biases non-zero."""
    errors = check_parameter_gradients(model, run)
    assert len(errors) == len(model.parameters()) > 0
    assert max(errors.values()) < 1e-6, {k: v for k, v in errors.items() if v >= 1e-6}
    for name, p in model.named_parameters():
        if not name.endswith("k_proj.bias"):
            assert np.any(p.grad != 0), f"{name} received no gradient"


@pytest.mark.parametrize(
    ("options", "n_decoder_layers"),
    [
        pytest.param(*case, id=name, marks=[pytest.mark.slow] if i else [])
        for i, (name, case) in enumerate(GRADIENT_OPTIONS.items())
    ],
)
def test_gradients_match_finite_differences(options, n_decoder_layers):
    model = perturb(tiny(n_decoder_layers=n_decoder_layers, **options), 1)
    source, target = source_and_target(2)
    upstream = np.random.default_rng(3).standard_normal((2, 4, 7))
    assert_gradients_exact(model, lambda: (model.forward(source, target) * upstream, upstream))


@pytest.mark.slow
def test_gradients_with_dropout_match_finite_differences():
    """With the one dropout generator reset before each forward, the masks are fixed."""
    model = tiny(seed=3, n_decoder_layers=1, dropout=0.2)
    generator = model.encoder.dropout.rng
    assert model.decoder.layers[0].feed_forward.dropout.rng is generator
    assert model.decoder.layers[0].self_attention.layer.dropout.rng is generator
    state = generator.bit_generator.state
    source, target = source_and_target(4)
    upstream = np.random.default_rng(5).standard_normal((2, 4, 7))

    def run():
        generator.bit_generator.state = state
        return model.forward(source, target) * upstream, upstream

    first, _ = run()
    generator.bit_generator.state = state
    model.eval()
    assert np.abs(model.forward(source, target) * upstream - first).max() > 1e-3  # it drops
    model.train()
    assert_gradients_exact(model, run)


def test_a_shared_table_gets_the_sum_of_its_three_uses():
    model = tiny(share_embeddings=True, n_decoder_layers=1)
    table = model.encoder.embedding.weight
    assert model.decoder.embedding.weight is table
    assert model.output.weight is table
    names = [name for name, _ in model.named_parameters()]
    assert names.count("encoder.embedding.weight") == 1
    assert not any(name.startswith(("decoder.embedding", "output")) for name in names)
    source, target = source_and_target(6)
    upstream = np.random.default_rng(7).standard_normal((2, 4, 7))
    model.zero_grad()
    model.forward(source, target)
    model.backward(upstream)
    uses = {
        "source": lambda m: m.encoder.embedding,
        "target": lambda m: m.decoder.embedding,
        "output": lambda m: m.output,
    }
    parts = []
    for use, layer_of in uses.items():  # each use alone: the other two read a detached copy
        other = tiny(share_embeddings=True, n_decoder_layers=1)
        other.load_state_dict(model.state_dict())
        for name, layer in uses.items():
            if name != use:
                layer(other).weight = Parameter(table.value.copy())
        other.zero_grad()
        other.forward(source, target)
        other.backward(upstream)
        parts.append(layer_of(other).weight.grad)
    np.testing.assert_allclose(table.grad, sum(parts), rtol=1e-12, atol=1e-12)
    assert all(np.abs(part).max() > 0 for part in parts)


# --------------------------------------------------------------------- masks
def test_padded_rows_match_rows_decoded_alone():
    """Padding a row to the batch's length changes neither it nor the other rows."""
    model = perturb(encoder_decoder(2, n_decoder_layers=1, context_length=8), 3)
    rng = np.random.default_rng(4)
    sources = [rng.integers(1, VOCAB, n) for n in (6, 3, 5)]
    targets = [rng.integers(1, VOCAB, n) for n in (2, 5, 4)]
    source = np.zeros((3, 6), dtype=np.int64)
    target = np.zeros((3, 5), dtype=np.int64)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        source[i, : len(s)], target[i, : len(t)] = s, t
    batched = model.forward(source, target)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        alone = model.forward(s[None], t[None])  # shorter arrays: another order of sums
        np.testing.assert_allclose(batched[i, : len(t)], alone[0], rtol=0, atol=1e-12)
    unmasked = model.forward(source, target, source_mask=np.ones((3, 1, 6), dtype=bool))
    assert np.abs(unmasked[1] - batched[1]).max() > 1e-3  # without the mask, padding leaks


def test_explicit_masks_equal_the_defaults():
    model = tiny()
    source, target = source_and_target(8)
    causal = np.tril(np.ones((4, 4), dtype=bool))
    decoder_mask = causal & (target != PAD)[:, None, :]
    default = model.forward(source, target)
    explicit = model.forward(
        source, target, source_mask=(source != PAD)[:, None, :], decoder_mask=decoder_mask
    )
    np.testing.assert_array_equal(default, explicit)


# ------------------------------------------------- independence, to the bit
@st.composite
def models_and_inputs(draw, *, min_batch: int = 1):
    """A model of any option, shape and dtype; padded sources and targets for it."""
    n_heads = draw(st.integers(1, 3))
    d_k = draw(st.sampled_from([2, 4] if n_heads > 1 else [4]))  # d_model >= 4: a post-norm
    # LayerNorm of 2 features keeps only their order, and hides most changes of the input
    name = draw(st.sampled_from(sorted(OPTIONS)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    seed = draw(st.integers(0, 2**16))
    model = encoder_decoder(
        seed,
        n_encoder_layers=draw(st.integers(1, 2)),
        n_decoder_layers=draw(st.integers(1, 2)),
        **{**OPTIONS[name], "d_model": n_heads * d_k, "n_heads": n_heads, "dtype": dtype},
    )
    perturb(model, seed)
    if draw(st.booleans(), label="large scores"):  # where softmax must shift its rows
        raise_scores(model, SHIFTED_SCORES[dtype])
    b = draw(st.integers(min_batch, 4))
    s, t = draw(st.integers(1, LIMIT)), draw(st.integers(1, LIMIT))
    rng = np.random.default_rng(seed)
    source, target = rng.integers(1, VOCAB, (b, s)), rng.integers(1, VOCAB, (b, t))
    for row in range(b):  # padding at the end of some rows, never all of a source
        source[row, rng.integers(1, s + 1) :] = PAD
    return model.eval(), source, target, seed


def _other_tokens(ids: np.ndarray) -> np.ndarray:
    """Another real (non-pad) token at every real position; padding stays padding."""
    return np.where(ids == PAD, PAD, ids % (VOCAB - 1) + 1)


@settings(max_examples=40)
@given(case=models_and_inputs(min_batch=2), data=st.data())
def test_each_sequence_of_a_batch_is_bitwise_independent_of_the_others(case, data):
    model, source, target, _ = case
    row = data.draw(st.integers(0, source.shape[0] - 1), label="row")
    other_source, other_target = source.copy(), target.copy()
    other_source[row], other_target[row] = _other_tokens(source[row]), _other_tokens(target[row])
    before, after = model.forward(source, target), model.forward(other_source, other_target)
    others = np.arange(source.shape[0]) != row
    assert np.array_equal(after[others], before[others])
    assert not np.array_equal(after[row], before[row])


@settings(max_examples=40)
@given(case=models_and_inputs(), data=st.data())
def test_earlier_decoder_positions_are_bitwise_independent_of_later_tokens(case, data):
    model, source, target, _ = case
    t = data.draw(st.integers(0, target.shape[1] - 1), label="position")
    changed = target.copy()
    changed[:, t] = _other_tokens(target[:, t])
    before, after = model.forward(source, target), model.forward(source, changed)
    assert np.array_equal(after[:, :t], before[:, :t])
    assert not np.array_equal(after[:, t:], before[:, t:])


@settings(max_examples=30)
@given(case=models_and_inputs(min_batch=2), data=st.data())
def test_a_cached_step_of_one_row_is_bitwise_independent_of_the_other_rows(case, data):
    model, source, target, seed = case
    b, t = target.shape
    row = data.draw(st.integers(0, b - 1), label="row")
    prompt = data.draw(st.integers(1, t), label="first feed")
    rng = np.random.default_rng(seed + 1)
    other_source, other_target = rng.integers(1, VOCAB, source.shape), _other_tokens(target)
    other_source[row], other_target[row] = source[row], target[row]
    states = [model.start(source), model.start(other_source)]
    for a, z in [(0, prompt), *((i, i + 1) for i in range(prompt, t))]:
        first = model.step(target[:, a:z], states[0])
        second = model.step(other_target[:, a:z], states[1])
        assert np.array_equal(first[row], second[row])
    assert not np.array_equal(first, second)


@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1))
def test_without_positions_the_source_order_does_not_matter(seed):
    """The memory is permuted with the source, and cross-attention sums over it: same logits."""
    model = encoder_decoder(1, n_decoder_layers=1, positional="none")
    rng = np.random.default_rng(seed)
    source, target = rng.integers(1, VOCAB, (2, 5)), rng.integers(1, VOCAB, (2, 3))
    shuffled = source[:, rng.permutation(5)]
    np.testing.assert_allclose(
        model.forward(source, target), model.forward(shuffled, target), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_with_positions_the_source_order_matters(positional):
    model = encoder_decoder(2, n_decoder_layers=1, positional=positional)
    source, target = np.array([[4, 5, 6, 7]]), np.array([[5, 6]])
    assert (
        np.abs(model.forward(source, target) - model.forward(source[:, ::-1], target)).max() > 1e-3
    )


# ------------------------------------------------------------ cached decoding
SOURCE = np.array([[3, 4, 5, 6, 7, 8], [5, 6, 7, 0, 0, 0], [8, 1, 2, 3, 0, 0]])
MODELS = {
    (name, dtype): perturb(
        encoder_decoder(3, context_length=LIMIT, dtype=dtype, **options), 4
    ).eval()
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
    tokens = np.random.default_rng(seed).integers(1, VOCAB, (3, total))
    state = model.start(SOURCE)
    stepped = [model.step(tokens[:, a:b], state) for a, b in pieces(sizes, total)]
    assert state.length == total
    steps = np.concatenate(stepped, axis=1)
    assert steps.dtype == np.dtype(dtype)
    np.testing.assert_allclose(steps, model.forward(SOURCE, tokens), rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("name", ["post-norm sinusoidal", "llama"])
def test_padded_decoder_tokens_step_like_forward(name):
    """Finished rows fed <pad> are masked as keys in step exactly as forward masks them."""
    model = MODELS[name, "float64"]
    tokens = np.array([[1, 4, 5, 0, 0, 0, 0], [1, 6, 7, 8, 3, 0, 0], [1, 2, 2, 2, 2, 2, 2]])
    state = model.start(SOURCE)
    stepped = [model.step(tokens[:, :2], state)]
    stepped += [model.step(tokens[:, t : t + 1], state) for t in range(2, 5)]
    stepped.append(model.step(tokens[:, 5:], state))
    np.testing.assert_allclose(
        np.concatenate(stepped, axis=1), model.forward(SOURCE, tokens), rtol=0, atol=1e-12
    )


class RecordingLinear(Linear):
    """A ``Linear`` that notes, at every forward, whether a backward pass may follow."""

    def forward(self, x):
        self.modes.append(grad_enabled())
        return super().forward(x)


def test_start_and_step_run_the_same_layers_under_no_grad():
    model = encoder_decoder(5, tie_output=False)
    encoder = [m for m in model.encoder.modules() if type(m) is Linear]
    decoder = [
        m for m in model.modules() if type(m) is Linear and not any(m is e for e in encoder)
    ]
    for layer in encoder + decoder:
        layer.__class__, layer.modes = RecordingLinear, []
    target = np.array([[1, 2, 3]])
    model.forward(SOURCE[:1], target)
    assert all(layer.modes == [True] for layer in encoder + decoder)
    state = model.start(SOURCE[:1])
    assert all(layer.modes == [True, False] for layer in encoder)  # start encodes once
    model.step(target[:, :2], state)
    model.step(target[:, 2:], state)
    assert all(layer.modes == [True, False] for layer in encoder)
    cross_kv = [
        m
        for block in model.decoder.layers
        for m in (block.cross_attention.layer.k_proj, block.cross_attention.layer.v_proj)
    ]
    for layer in decoder:  # the memory's keys and values are computed at the first step only
        assert layer.modes == (
            [True, False] if any(layer is m for m in cross_kv) else [True, False, False]
        )
    assert grad_enabled()
    with pytest.raises(RuntimeError, match="no_grad"):
        model.decoder.backward(np.ones((1, 1, SIZES["d_model"])))
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(np.ones((1, 3, VOCAB)))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_adapter_on_every_linear_changes_step_as_it_changes_forward(dtype):
    model, plain = (encoder_decoder(6, tie_output=False, dtype=dtype) for _ in range(2))
    # one encoder block, two decoder blocks: 4 + 2, and 8 + 2 each, and the output
    assert adapt_linears(model, np.random.default_rng(7)) == 6 + 2 * 10 + 1
    target = np.random.default_rng(8).integers(1, VOCAB, (3, 7))
    state = model.start(SOURCE)
    stepped = np.concatenate(
        [model.step(target[:, :4], state)]
        + [model.step(target[:, t : t + 1], state) for t in range(4, 7)],
        axis=1,
    )
    adapted = model.forward(SOURCE, target)
    np.testing.assert_allclose(stepped, adapted, rtol=0, atol=TOLERANCE[dtype])
    assert np.abs(adapted - plain.forward(SOURCE, target)).max() > 0.1


# ------------------------------------------------------------ modes and dtypes
def test_eval_mode_turns_dropout_off():
    source, target = source_and_target(9)
    with_dropout = tiny(seed=5, dropout=0.3)
    without = tiny(seed=5, dropout=0.0)
    training = with_dropout.forward(source, target)
    assert np.abs(training - without.forward(source, target)).max() > 1e-3
    first = with_dropout.eval().forward(source, target)
    np.testing.assert_array_equal(first, with_dropout.forward(source, target))
    np.testing.assert_array_equal(first, without.forward(source, target))


def test_float32_in_float32_out_and_close_to_float64():
    model = tiny(dtype="float32")
    source, target = source_and_target(10)
    logits = model.forward(source, target)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, tiny().forward(source, target), rtol=0, atol=1e-5)
    stepped = model.step(target[:, :2], model.start(source))
    assert stepped.dtype == np.float32
    model.forward(source, target)
    model.backward(np.ones_like(logits))
    for name, p in model.named_parameters():
        assert (p.value.dtype, p.grad.dtype) == (np.float32, np.float32), name


# ------------------------------------------------------------------ the parts
def test_layout_and_attributes():
    model = tiny(dtype="float32")
    assert (model.vocab_size, model.context_length, model.dtype) == (7, 6, np.dtype(np.float32))
    assert model.family == "encoder-decoder"
    assert isinstance(model.encoder, TransformerStack)
    assert isinstance(model.decoder, TransformerStack)
    assert (model.encoder.cross_attention, model.decoder.cross_attention) == (False, True)
    assert isinstance(model.output, TiedOutputProjection)
    assert model.output.weight is model.decoder.embedding.weight
    names = [name for name, _ in model.named_parameters()]
    assert names[0] == "encoder.embedding.weight"
    assert "decoder.embedding.weight" in names
    assert "decoder.layers.1.cross_attention.layer.out_proj.bias" in names
    assert "encoder.final_norm.gain" not in names  # post-norm by default: no final norm
    assert "encoder.final_norm.gain" in [n for n, _ in tiny(norm_first=True).named_parameters()]
    assert not hasattr(model, "max_positions")


@pytest.mark.parametrize("options", [{"positional": "learned"}, LLAMA], ids=["learned", "llama"])
def test_state_dict_round_trip(options):
    model, other = tiny(0, **options), tiny(1, **options)
    source, target = source_and_target(11)
    assert np.abs(model.forward(source, target) - other.forward(source, target)).max() > 1e-3
    state = model.state_dict()
    assert sum(v.size for v in state.values()) == model.num_parameters()
    other.load_state_dict(state)
    np.testing.assert_array_equal(model.forward(source, target), other.forward(source, target))


def test_parameter_count_of_the_default_layout():
    assert tiny().num_parameters() == parameter_count(tiny().config)


# ------------------------------------------------------------------ bad input
def test_bad_ids_are_refused_by_name():
    model = tiny()
    source, target = source_and_target(12)
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


def test_bad_masks_are_refused_by_name():
    model = tiny()
    source, target = source_and_target(13)
    with pytest.raises(TypeError, match="source_mask must be a boolean array"):
        model.forward(source, target, source_mask=np.ones((2, 1, 5)))
    with pytest.raises(ValueError, match=r"source_mask of shape \(2, 5, 5\) does not broadcast"):
        model.forward(source, target, source_mask=np.ones((2, 5, 5), dtype=bool))
    with pytest.raises(ValueError, match=r"decoder_mask of shape \(3, 3\) does not broadcast"):
        model.forward(source, target, decoder_mask=np.ones((3, 3), dtype=bool))


def test_bad_gradients_and_constructor_arguments_are_refused():
    model = tiny()
    with pytest.raises(RuntimeError, match="backward was called before forward"):
        model.backward(np.ones((2, 4, 7)))
    source, target = source_and_target(14)
    model.forward(source, target)
    with pytest.raises(ValueError, match=r"shape \(2, 4, 7\), got \(2, 4, 6\)"):
        model.backward(np.ones((2, 4, 6)))
    config = EncoderDecoderConfig(7, 7, d_model=4, n_heads=2, d_ff=6)
    with pytest.raises(TypeError, match="config must be an EncoderDecoderConfig"):
        EncoderDecoder(config.to_dict(), rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        EncoderDecoder(config, rng=1)


def test_step_checks_its_arguments():
    model = MODELS["post-norm sinusoidal", "float64"]
    one = np.ones((3, 1), dtype=np.int64)
    with pytest.raises(ValueError, match="tokens has 2 rows but the state decodes 3 sequences"):
        model.step(one[:2], model.start(SOURCE))
    with pytest.raises(ValueError, match="state was made by another model"):
        model.step(one, MODELS["llama", "float64"].start(SOURCE))
    state = model.start(SOURCE)
    model.step(np.ones((3, LIMIT), dtype=np.int64), state)
    with pytest.raises(ValueError, match=rf"to {LIMIT + 1} positions .* limit of {LIMIT}"):
        model.step(one, state)
    with pytest.raises(ValueError, match="source_ids has length 11"):
        model.start(np.ones((1, LIMIT + 1), dtype=np.int64))


# ----------------------------------------------------------------- PyTorch
@pytest.mark.reference
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"norm_first": True, "positional": "learned", "tie_output": False, "activation": "gelu"},
        {"share_embeddings": True, "scale_embeddings": False},
        {
            "norm": "rmsnorm",
            "feed_forward": "gated",
            "activation": "silu",
            "bias": False,
            "norm_first": True,
        },
        {"attention_scale": "none", "positional": "none"},
    ],
    ids=[
        "post-norm tied",
        "pre-norm learned untied",
        "shared",
        "rmsnorm swiglu no bias",
        "unscaled scores, no positions",
    ],
)
def test_logits_and_gradients_match_pytorch(torch, options):
    model = perturb(
        encoder_decoder(
            16,
            src_vocab_size=11,
            tgt_vocab_size=11,
            context_length=8,
            n_encoder_layers=2,
            **options,
        ),
        17,
    )
    rng = np.random.default_rng(18)
    source, target = rng.integers(1, 11, (3, 7)), rng.integers(1, 11, (3, 6))
    source[1, 4:] = PAD
    target[2, 3:] = PAD
    ours = model.forward(source, target)
    theirs, pairs = encoder_decoder_logits(torch, model, source, target)
    assert_same_logits_and_gradients(torch, model, ours, theirs, pairs, rng)
