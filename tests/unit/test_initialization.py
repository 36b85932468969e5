"""GPT-2's initialization and the growth of the residual stream at initialization."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyformer.experiments.norm_placement import stream_rms
from tinyformer.initialization import gpt2_init, residual_projections, stream_growth
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.module import Parameter

VOCAB = 13


def make_model(n_layers: int = 2, seed: int = 0, **overrides) -> DecoderOnlyLM:
    settings = {"d_model": 32, "n_heads": 4, "d_ff": 128, "context_length": 16}
    settings.update(overrides)
    config = DecoderOnlyConfig(vocab_size=VOCAB, n_layers=n_layers, **settings)
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed)).eval()


def some_ids(seed: int = 1, shape: tuple[int, int] = (4, 16)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape)


# ------------------------------------------------------------ residual projections
@pytest.mark.parametrize(
    "feed_forward", [{"feed_forward": "plain"}, {"feed_forward": "gated", "activation": "silu"}]
)
def test_residual_projections_are_the_output_projections_two_per_block(feed_forward):
    model = make_model(n_layers=3, **feed_forward)
    found = residual_projections(model)
    expected = []
    for block in model.decoder.layers:
        expected += [
            block.self_attention.layer.out_proj.weight,
            block.feed_forward.layer.linear_out.weight,
        ]
    assert len(found) == 2 * 3
    assert all(a is b for a, b in zip(found, expected, strict=True))


def test_residual_projections_refuse_other_models():
    with pytest.raises(TypeError, match="model must be a DecoderOnlyLM"):
        residual_projections(object())
    moe = make_model(feed_forward="moe", n_experts=2)
    with pytest.raises(ValueError, match="feed_forward='moe'"):
        residual_projections(moe)


# ------------------------------------------------------------------- gpt2_init
def test_gpt2_init_draws_the_published_scales():
    n_layers = 4
    model = gpt2_init(
        make_model(n_layers=n_layers, d_model=64, d_ff=256), rng=np.random.default_rng(3)
    )
    projections = {id(p) for p in residual_projections(model)}
    others = [
        p.value for p in model.parameters() if p.value.ndim == 2 and id(p) not in projections
    ]
    scaled = np.concatenate([p.value.ravel() for p in residual_projections(model)])
    rest = np.concatenate([v.ravel() for v in others])
    # a sample standard deviation of n draws is within 3 / sqrt(2 n) of sigma (relative)
    assert abs(rest.std() / 0.02 - 1) < 3 / math.sqrt(2 * rest.size)
    expected = 0.02 / math.sqrt(2 * n_layers)
    assert abs(scaled.std() / expected - 1) < 3 / math.sqrt(2 * scaled.size)
    assert abs(rest.mean()) < 3 * 0.02 / math.sqrt(rest.size)


def test_gpt2_init_sets_gains_to_one_and_biases_to_zero():
    model = gpt2_init(make_model(), rng=np.random.default_rng(0))
    named = dict(model.named_parameters())
    gains = [p.value for n, p in named.items() if n.endswith(".gain")]
    biases = [p.value for n, p in named.items() if n.endswith(".bias")]
    assert gains
    assert biases
    assert all(np.all(g == 1.0) for g in gains)
    assert all(np.all(b == 0.0) for b in biases)


def test_scaling_changes_only_the_projections_by_exactly_the_factor():
    n_layers = 3
    plain = gpt2_init(make_model(n_layers), rng=np.random.default_rng(5), scale_residual=False)
    scaled = gpt2_init(make_model(n_layers), rng=np.random.default_rng(5))
    projections = {id(p) for p in residual_projections(scaled)}
    factor = 1 / math.sqrt(2 * n_layers)
    for (name, p), (_, q) in zip(scaled.named_parameters(), plain.named_parameters(), strict=True):
        if id(p) in projections:
            np.testing.assert_allclose(p.value, q.value * factor, rtol=1e-6, err_msg=name)
        else:
            assert np.array_equal(p.value, q.value), name


def test_gpt2_init_keeps_dtype_and_tying_and_the_model_runs():
    model = make_model(dtype="float32")
    before = dict(model.named_parameters())
    out = gpt2_init(model, rng=np.random.default_rng(0))
    assert out is model
    assert all(p.dtype == np.float32 for p in model.parameters())
    assert model.output.weight is model.decoder.embedding.weight  # still tied
    assert all(before[n] is p for n, p in model.named_parameters())  # in place
    assert model.forward(some_ids()).dtype == np.float32


def test_gpt2_init_is_reproducible():
    a = gpt2_init(make_model(seed=0), rng=np.random.default_rng(9))
    b = gpt2_init(make_model(seed=1), rng=np.random.default_rng(9))  # other starting weights
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert np.array_equal(p.value, q.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rng": 0}, TypeError, "rng must be a numpy.random.Generator"),
        ({"std": 0.0}, ValueError, "std"),
        ({"std": -1.0}, ValueError, "std"),
        ({"scale_residual": 1}, TypeError, "scale_residual must be a bool"),
    ],
)
def test_gpt2_init_checks_its_arguments(kwargs, error, match):
    options = {"rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(error, match=match):
        gpt2_init(make_model(), **options)


# ---------------------------------------------------------------- stream growth
def test_stream_growth_decomposes_every_addition_exactly():
    model = gpt2_init(make_model(n_layers=3), rng=np.random.default_rng(0))
    g = stream_growth(model, some_ids())
    assert g.stream.shape == (7,)
    assert g.added.shape == g.cross.shape == (6,)
    np.testing.assert_allclose(g.stream[1:], g.stream[:-1] + g.added + g.cross, rtol=1e-12)
    assert np.all(g.added > 0)


def test_stream_growth_agrees_with_the_stream_measured_block_by_block():
    model = make_model(n_layers=3)
    ids = some_ids()
    g = stream_growth(model, ids)
    reference = stream_rms(model, ids) ** 2  # the stream entering each block, and the top
    np.testing.assert_allclose(g.stream[::2], reference, rtol=1e-6)


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_without_scaling_the_stream_grows_about_linearly_with_it_it_stays_bounded(seed):
    ids = some_ids(shape=(8, 16))
    tops = {}
    for n_layers in (4, 16):
        for scaled in (False, True):
            model = gpt2_init(
                make_model(n_layers), rng=np.random.default_rng(seed), scale_residual=scaled
            )
            g = stream_growth(model, ids)
            tops[n_layers, scaled] = g.stream[-1] / g.stream[0]
            if not scaled:  # variance adds: the growth is the additions' sum, within 30%
                assert abs((g.stream[-1] - g.stream[0]) / g.added.sum() - 1) < 0.3
    growth_ratio = (tops[16, False] - 1) / (tops[4, False] - 1)  # 4x the additions
    assert 2.5 < growth_ratio < 6.5  # linear: 4; geometric growth would give about 25
    assert abs(math.log(tops[16, True] / tops[4, True])) < math.log(1.2)
    assert tops[16, True] < tops[16, False] / 4


def test_stream_growth_checks_its_inputs():
    with pytest.raises(ValueError, match="pre-norm"):
        stream_growth(make_model(norm_first=False), some_ids())
    with pytest.raises(ValueError, match="ids must have shape"):
        stream_growth(make_model(), some_ids(shape=(2, 17)))
    with pytest.raises(ValueError, match="ids must have shape"):
        stream_growth(make_model(), np.zeros(5, dtype=int))
    with pytest.raises(TypeError, match="model must be a DecoderOnlyLM"):
        stream_growth("model", some_ids())
    with pytest.raises(ValueError, match="evaluation mode"):
        stream_growth(make_model(dropout=0.5).train(), some_ids())


def test_stream_growth_measures_the_share_common_to_every_position():
    model = make_model(n_layers=2)
    ids = some_ids()
    g = stream_growth(model, ids)
    assert g.shared.shape == (5,)
    assert np.all((g.shared >= 0) & (g.shared <= 1))
    x = model.decoder.positions.forward(model.decoder.embedding.forward(ids), 0)  # (B, T, d)
    expected = np.mean(np.mean(x, axis=1) ** 2) / np.mean(x**2)  # the input's share
    np.testing.assert_allclose(g.shared[0], expected, rtol=1e-6)
    same = np.tile(ids[:, :1], (1, ids.shape[1]))  # one token everywhere: positions differ only
    assert stream_growth(model, same).shared[0] > g.shared[0]


def test_gpt2_init_refuses_unknown_parameters_before_changing_any():
    model = make_model()
    before = {name: p.value.copy() for name, p in model.named_parameters()}
    odd = model.decoder.layers[-1].feed_forward.norm  # late: the embeddings come before it
    odd.scale = Parameter(np.full(32, 0.5))  # a one-axis name gpt2_init does not know
    names = [n for n, _ in model.named_parameters()]
    assert names.index("decoder.layers.1.feed_forward.norm.scale") > 0  # something precedes it
    with pytest.raises(ValueError, match="does not know"):
        gpt2_init(model, rng=np.random.default_rng(0))
    for name, p in model.named_parameters():
        if name in before:
            np.testing.assert_array_equal(p.value, before[name], err_msg=name)
