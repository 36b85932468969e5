"""The live exercise of the chapter on capabilities: score every head as previous-token and induction head."""

from __future__ import annotations

import numpy as np

from tinyformer.data.icl import repeated_halves, repeated_segments
from tinyformer.exercises import Case, Exercise
from tinyformer.experiments.icl import head_scores
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM


def _layer_weights(model, tokens):
    """Every layer's attention weights (B, h, T - 1, T - 1) on the rows without their last token."""
    model.forward(tokens[:, :-1])
    return [block.self_attention.layer.attention_weights for block in model.decoder.layers]


def _earlier_copy(model, tokens, period):
    """Scores the key of the earlier occurrence itself (t - L), not the key just after it."""
    prev, induction = [], []
    for a in _layer_weights(model, tokens):
        prev.append(np.diagonal(a, offset=-1, axis1=-2, axis2=-1).mean(axis=(0, 2)))
        induction.append(np.diagonal(a, offset=-period, axis1=-2, axis2=-1).mean(axis=(0, 2)))
    return np.array(prev), np.array(induction)


def _every_query(model, tokens, period):
    """Averages the whole diagonal t - L + 1, query L - 1 included (its token has no earlier copy)."""
    prev, induction = [], []
    for a in _layer_weights(model, tokens):
        prev.append(np.diagonal(a, offset=-1, axis1=-2, axis2=-1).mean(axis=(0, 2)))
        induction.append(np.diagonal(a, offset=1 - period, axis1=-2, axis2=-1).mean(axis=(0, 2)))
    return np.array(prev), np.array(induction)


def _whole_rows(model, tokens, period):
    """Runs the model on the whole rows, last token included, where the rows' inputs stop one short."""
    model.forward(tokens)
    prev, induction = [], []
    for block in model.decoder.layers:
        a = block.self_attention.layer.attention_weights
        prev.append(np.diagonal(a, offset=-1, axis1=-2, axis2=-1).mean(axis=(0, 2)))
        after = np.diagonal(a, offset=1 - period, axis1=-2, axis2=-1)[..., 1:]
        induction.append(after.mean(axis=(0, 2)))
    return np.array(prev), np.array(induction)


def _model(n_layers: int, n_heads: int, seed: int) -> DecoderOnlyLM:
    """A random decoder whose weights are scaled up so that its heads attend unevenly."""
    config = DecoderOnlyConfig(
        vocab_size=20, d_model=8 * n_heads, n_heads=n_heads, d_ff=16 * n_heads,
        n_layers=n_layers, context_length=16, dtype="float64",
    )  # fmt: skip
    model = DecoderOnlyLM(config, rng=np.random.default_rng(seed)).eval()
    for parameter in model.parameters():
        parameter.value *= 1.5
    return model


def _cases() -> list[Case]:
    two = _model(2, 2, seed=0)
    halves = repeated_halves(8, 6, 20, rng=np.random.default_rng(1))  # (8, 12)
    period_3, _ = repeated_segments(
        6, 14, 20, min_period=3, max_period=3, rng=np.random.default_rng(2)
    )  # (6, 14)
    one_token = np.full((4, 9), 7)  # period 1: the key after the last copy is the query itself
    return [
        Case(
            (two, halves, 6), label="2 layers of 2 heads, rows whose second half repeats the first"
        ),
        Case((two, period_3, 3), label="the same model, rows repeating a segment of 3 tokens"),
        Case((_model(1, 4, seed=3), halves, 6), label="1 layer of 4 heads"),
        Case((_model(2, 2, seed=4), one_token, 1), label="period 1 (rows of one repeated token)"),
    ]


HEAD_SCORES = Exercise(
    chapter="capabilities",
    name="head_scores",
    stub='''\
def head_scores(model, tokens, period):
    """Previous-token and induction score of every head, on rows of period `period`.

    model: a DecoderOnlyLM; tokens: token ids (B, T) whose tokens repeat every `period`
    places. Run model.forward(tokens[:, :-1]) (a row's last token is only a target);
    then, for each block in model.decoder.layers, block.self_attention.layer.attention_weights
    holds that layer's weights a, shape (B, h, T - 1, T - 1): a[b, i, t, s] is the weight
    query t gives key s in head i. Scores, averaged over rows and queries:
      previous-token: mean over t >= 1 of a[:, :, t, t - 1];
      induction: mean over t >= period of a[:, :, t, t - period + 1]
      (query t's token occurred `period` places earlier; the key just after that).
    Returns (prev, induction), two float arrays of shape (n_layers, n_heads).
    """
    raise NotImplementedError
''',
    reference=head_scores,
    cases=_cases,
    rtol=1e-9,
    atol=1e-12,
    parts=("prev array", "induction array"),
    mistakes=(_earlier_copy, _every_query, _whole_rows),
)
"""Score every head of a model, as the chapter finds its previous-token and induction heads."""
