"""The live exercise of the chapter on the decoder and the full model: count the parameters."""

from __future__ import annotations

from tinyformer.exercises import Case, Exercise
from tinyformer.models import DecoderOnlyConfig, parameter_count


def _reference(
    vocab_size,
    d_model,
    n_heads,
    d_ff,
    n_layers,
    context_length,
    positional,
    norm_first,
    tie_output,
):
    """The package's count for a decoder-only model with these settings."""
    config = DecoderOnlyConfig(
        vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, d_ff=d_ff, n_layers=n_layers,
        context_length=context_length, positional=positional, norm_first=norm_first,
        tie_output=tie_output,
    )  # fmt: skip
    return parameter_count(config)


def _count(
    vocab_size,
    d_model,
    n_heads,
    d_ff,
    n_layers,
    context_length,
    positional,
    norm_first,
    tie_output,
    *,
    mistake="",
):
    """The count by hand, with one of the mistakes below if ``mistake`` names it."""
    d = d_model
    attention = 4 * d * d + 4 * d
    if mistake == "per head":
        attention *= n_heads
    block = attention + 2 * d * d_ff + d_ff + d + 2 * 2 * d
    total = vocab_size * d + n_layers * block
    if positional == "learned" or mistake == "positions always":
        total += context_length * d
    if norm_first and mistake != "no final norm":
        total += 2 * d
    if not tie_output:
        total += d * vocab_size
    return total


def _per_head(*args):
    """Gives every head its own d x d projections: heads split d_model, they do not multiply it."""
    return _count(*args, mistake="per head")


def _no_final_norm(*args):
    """Forgets the LayerNorm a pre-norm stack adds after its last block."""
    return _count(*args, mistake="no final norm")


def _positions_always(*args):
    """Counts a position table for every encoding: sinusoidal and rotary ones have no parameters."""
    return _count(*args, mistake="positions always")


def _cases() -> list[Case]:
    return [
        Case((50257, 768, 12, 3072, 12, 1024, "learned", True, True),
             label="GPT-2 small"),
        Case((17, 32, 4, 64, 2, 16, "sinusoidal", False, False),
             label="a small post-norm model with sinusoidal positions and an untied output"),
        Case((50, 48, 6, 192, 3, 32, "rotary", True, False),
             label="a pre-norm model with rotary positions and an untied output"),
        Case((40, 64, 8, 256, 4, 20, "learned", False, True),
             label="a post-norm model with learned positions and a tied output"),
    ]  # fmt: skip


COUNT_PARAMETERS = Exercise(
    chapter="decoder",
    name="count_parameters",
    stub='''\
def count_parameters(vocab_size, d_model, n_heads, d_ff, n_layers, context_length,
                     positional, norm_first, tie_output):
    """The number of trainable scalars of a decoder-only transformer, as an int.

    The model: a token embedding table (vocab_size x d_model); a learned position table
    (context_length x d_model) only if positional == "learned" ("sinusoidal" and "rotary"
    positions have no parameters); n_layers blocks, each holding one self-attention with
    n_heads heads (query, key, value and output projections, each with a bias), one
    feed-forward network d_model -> d_ff -> d_model (two linear layers with biases) and two
    LayerNorms (a gain and a bias each); if norm_first (pre-norm), one more LayerNorm after
    the last block; and an output projection d_model -> vocab_size without a bias, unless
    tie_output, in which case it reuses the embedding table and adds nothing.
    """
    raise NotImplementedError
''',
    reference=_reference,
    cases=_cases,
    mistakes=(_per_head, _no_final_norm, _positions_always),
)
"""Count a decoder-only model's parameters from its settings, without building it."""
