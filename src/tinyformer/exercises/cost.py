"""The live exercise of the chapter on cost: the FLOPs of a forward pass, term by term."""

from __future__ import annotations

from tinyformer.cost import forward_flops
from tinyformer.exercises import Case, Exercise
from tinyformer.models.config import DecoderOnlyConfig

TERMS = ("attention projections", "attention scores and mixing", "feed-forward", "output layer")


def _reference(config, seq_len, batch_size):
    """forward_flops of tinyformer, as a tuple of its four nonzero terms."""
    terms = forward_flops(config, seq_len, batch_size)
    return tuple(terms[name] for name in TERMS)


def _shrunk_scores(config, seq_len, batch_size):
    """Shrinks the scores and mixing with the key/value heads, as if fewer query heads attended."""
    projections, scores, feed_forward, output = _reference(config, seq_len, batch_size)
    h_kv = config.n_kv_heads or config.n_heads
    return projections, scores * h_kv // config.n_heads, feed_forward, output


def _causal_half(config, seq_len, batch_size):
    """Counts only the query-key pairs a causal mask allows, about half of them."""
    projections, scores, feed_forward, output = _reference(config, seq_len, batch_size)
    t = seq_len
    return projections, scores * (t + 1) // (2 * t), feed_forward, output


def _multiply_adds(config, seq_len, batch_size):
    """Counts multiply-adds, not FLOPs: every term is half of what it should be."""
    return tuple(term // 2 for term in _reference(config, seq_len, batch_size))


def _cases() -> list[Case]:
    small = DecoderOnlyConfig(50, d_model=16, n_heads=4, d_ff=64, n_layers=2, context_length=16)
    gpt2_small = DecoderOnlyConfig(
        50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, context_length=1024
    )
    grouped = DecoderOnlyConfig(
        100, d_model=64, n_heads=8, n_kv_heads=2, d_ff=256, n_layers=3, context_length=32
    )
    multi_query = DecoderOnlyConfig(
        1000, d_model=128, n_heads=4, n_kv_heads=1, d_ff=512, n_layers=4, context_length=64
    )
    return [
        Case((small, 10, 1), label="a 2-block model of width 16 on one sequence of 10 tokens"),
        Case((gpt2_small, 1024, 1), label="GPT-2 small on one sequence of 1024 tokens"),
        Case(
            (grouped, 32, 4),
            label="4 sequences of 32 tokens with 8 query heads sharing 2 key/value heads",
        ),
        Case((multi_query, 1, 8), label="8 sequences of one token with multi-query attention"),
    ]


FORWARD_FLOPS = Exercise(
    chapter="cost",
    name="forward_flops",
    stub='''\
def forward_flops(config, seq_len, batch_size):
    """FLOPs of the matrix products in one forward pass of a decoder-only model.

    config: a tinyformer DecoderOnlyConfig; use its n_layers (L), d_model (d),
    n_heads (h), n_kv_heads (h_kv, or None for h_kv = h), d_ff and vocab_size (V).
    Each head has width d_k = d / h. Queries and the output projection are d x d;
    keys and values have h_kv heads of width d_k (grouped-query attention: each
    key/value head serves h / h_kv query heads). The feed-forward network is two
    products, d -> d_ff -> d. The output layer, tied to the embedding, maps every
    position to V logits; the embedding lookup multiplies nothing.
    An (m, k) @ (k, n) product costs 2 * m * k * n FLOPs. Count every query-key pair
    (a causal mask does not make NumPy skip any), over batch_size sequences of
    seq_len tokens and all L blocks. Leave out biases, softmax, normalization and
    the activation.
    Returns a tuple of four ints: (attention projections, attention scores and
    mixing, feed-forward, output layer).
    """
    raise NotImplementedError
''',
    reference=_reference,
    cases=_cases,
    rtol=0.0,
    atol=0.0,
    parts=TERMS,
    mistakes=(_shrunk_scores, _causal_half, _multiply_adds),
)
"""Count a forward pass's FLOPs, with grouped-query attention and every query-key pair."""
