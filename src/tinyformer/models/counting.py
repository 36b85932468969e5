r"""Parameter counts in closed form, term by term, and the published model sizes they reproduce.

With :math:`d` the width, :math:`d_\text{ff}` the feed-forward width and
:math:`V` a vocabulary size, the pieces of a model hold

- an embedding table: :math:`V d`;
- a learned position table: :math:`T_\text{max} d` (sinusoidal and rotary: 0);
- one attention sub-layer (four :math:`d \times d` projections with biases):
  :math:`4(d^2 + d)`, or :math:`4d^2` without biases; with grouped-query attention
  the key and value projections are :math:`d \times d_{kv}`, :math:`d_{kv} = h_{kv} d_k`,
  so :math:`2d^2 + 2d\,d_{kv}` (plus :math:`2d + 2d_{kv}` of biases);
- one feed-forward sub-layer: :math:`2 d\,d_\text{ff} + d_\text{ff} + d`
  (:math:`2 d\,d_\text{ff}` without biases; gated: :math:`3 d\,d_\text{ff}`, see
  :func:`gated_feed_forward_parameters`);
- a mixture of experts (``feed_forward="moe"``): a router of :math:`dE` weights and
  :math:`E` feed-forward networks (:func:`~tinyformer.moe.moe_parameters`), of which a token
  uses the router and :math:`k` (:func:`active_parameter_count`);
- one norm: :math:`2d` for LayerNorm (gain and bias), :math:`d` for RMSNorm (gain);
- an untied output projection: :math:`d V` (it has no bias; tied: 0).

An encoder block is attention + feed-forward + 2 norms, a decoder block
with cross-attention two attentions + feed-forward + 3 norms, a
decoder-only block one attention + feed-forward + 2 norms; an encoder-only
model (:mod:`tinyformer.models.encoder_only`) is counted like a decoder-only one. Pre-norm
models add a final norm after each stack.

The presets reproduce published models: GPT-2's four sizes (:func:`gpt2_config`), the
original Transformer (:func:`transformer_config`), BERT (:func:`bert_config`), Llama 2 7B
and 70B (:func:`llama2_config`) and Mistral 7B (:func:`mistral_7b_config`); the last three
with :func:`kv_cache_bytes_per_token`, what a decoding server keeps per token of context.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tinyformer._validation import describe, positive_int
from tinyformer.models.config import DecoderOnlyConfig, EncoderDecoderConfig, EncoderOnlyConfig
from tinyformer.moe import moe_parameters

__all__ = [
    "PublishedSize",
    "active_parameter_count",
    "attention_parameters",
    "bert_config",
    "bert_extra_terms",
    "bert_sizes",
    "block_forward_flops",
    "feed_forward_parameters",
    "gated_d_ff",
    "gated_feed_forward_parameters",
    "gpt2_config",
    "kv_cache_bytes_per_token",
    "llama2_config",
    "mistral_7b_config",
    "mixtral_8x7b_config",
    "modern_sizes",
    "norm_parameters",
    "parameter_count",
    "parameter_terms",
    "published_sizes",
    "transformer_config",
]


def attention_parameters(
    d_model: int, *, bias: bool = True, n_heads: int | None = None, n_kv_heads: int | None = None
) -> int:
    r"""Query, key, value and output projections: :math:`4d^2`, plus :math:`4d` of biases.

    With ``n_kv_heads`` (and ``n_heads``, which it divides) the key and value
    projections make :math:`d_{kv} = h_{kv}\, d / h` features each (grouped-query
    attention): :math:`2d^2 + 2 d\,d_{kv}`, plus :math:`2d + 2d_{kv}` of biases.
    """
    if n_kv_heads is None:
        return 4 * d_model * d_model + (4 * d_model if bias else 0)
    if n_heads is None:
        raise ValueError(
            "n_heads is needed with n_kv_heads (d_kv = n_kv_heads * d_model / n_heads)"
        )
    d_kv = positive_int(n_kv_heads, "n_kv_heads") * (d_model // positive_int(n_heads, "n_heads"))
    weights = 2 * d_model * d_model + 2 * d_model * d_kv
    return weights + ((2 * d_model + 2 * d_kv) if bias else 0)


def feed_forward_parameters(d_model: int, d_ff: int, *, bias: bool = True) -> int:
    r"""Two linear layers: :math:`2 d\,d_\text{ff}`, plus :math:`d_\text{ff} + d` of biases."""
    return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)


def gated_feed_forward_parameters(d_model: int, d_ff: int, *, bias: bool = True) -> int:
    r"""A gated (GLU-family) feed-forward sub-layer: :math:`3 d\,d_\text{ff}` weights.

    With biases, add :math:`2 d_\text{ff} + d`. Two input matrices (the activated branch
    and the gate) and one output matrix, as in :class:`~tinyformer.feedforward.FeedForward`
    with ``gated=True``.
    """
    d_model, d_ff = positive_int(d_model, "d_model"), positive_int(d_ff, "d_ff")
    return 3 * d_model * d_ff + ((2 * d_ff + d_model) if bias else 0)


def gated_d_ff(d_model: int, *, expansion: int = 4, multiple_of: int = 1) -> int:
    r"""The hidden width that gives a gated FFN about the weights of a plain one.

    A plain FFN of width :math:`e\,d` has :math:`2 e d^2` weights; a gated one of width
    :math:`d_\text{ff}` has :math:`3 d\,d_\text{ff}`. They are equal at
    :math:`d_\text{ff} = \tfrac23 e\,d` :cite:p:`shazeer2020glu`. As in the LLaMA code
    :cite:p:`touvron2023llama`, the width is truncated to an integer and then rounded up to
    a multiple of ``multiple_of`` (a hardware-friendly size):

    .. math:: d_\text{ff} = m \Bigl\lceil \lfloor \tfrac23 e\,d \rfloor / m \Bigr\rceil
    """
    d_model = positive_int(d_model, "d_model")
    expansion = positive_int(expansion, "expansion")
    multiple_of = positive_int(multiple_of, "multiple_of")
    width = 2 * expansion * d_model // 3
    return multiple_of * -(-width // multiple_of)  # round up to a multiple


def block_forward_flops(
    d_model: int, d_ff: int, seq_len: int, *, d_kv: int | None = None
) -> dict[str, int]:
    r"""Floating-point operations of one block's forward pass over one sequence of ``seq_len``.

    A multiply-add counts as two operations; biases, softmax, normalization and the
    activation are left out (they are linear in :math:`T` and small). With
    :math:`T` = ``seq_len``:

    - ``"attention projections"``: four :math:`d \times d` products, :math:`8 T d^2`
      (with grouped-query attention, keys and values of width ``d_kv``
      :math:`= h_{kv} d_k`: :math:`4 T d^2 + 4 T d\,d_{kv}`);
    - ``"attention scores and mixing"``: :math:`Q K^\top` and the weighted sum of the
      values, :math:`4 T^2 d` (without the saving a causal mask allows);
    - ``"feed-forward"``: two products with :math:`d \times d_\text{ff}` matrices,
      :math:`4 T d\,d_\text{ff}`.
    """
    d = positive_int(d_model, "d_model")
    d_ff = positive_int(d_ff, "d_ff")
    t = positive_int(seq_len, "seq_len")
    projections = (
        8 * t * d * d if d_kv is None else 4 * t * d * d + 4 * t * d * positive_int(d_kv, "d_kv")
    )
    return {
        "attention projections": projections,
        "attention scores and mixing": 4 * t * t * d,
        "feed-forward": 4 * t * d * d_ff,
    }


def norm_parameters(d_model: int, kind: str = "layernorm") -> int:
    """A LayerNorm's gain and bias, :math:`2d`; an RMSNorm's gain, :math:`d`."""
    return 2 * d_model if kind == "layernorm" else d_model


def _feed_forward_sizes(
    c: EncoderDecoderConfig | DecoderOnlyConfig | EncoderOnlyConfig,
) -> tuple[int, int]:
    """``(all, active per token)`` parameters of one feed-forward sub-layer."""
    if c.feed_forward == "moe":
        return moe_parameters(
            c.d_model,
            c.d_ff,
            c.n_experts,
            top_k=c.experts_per_token,
            feed_forward=c.expert_feed_forward,
            bias=c.bias,
        )
    feed_forward = (
        gated_feed_forward_parameters if c.feed_forward == "gated" else feed_forward_parameters
    )
    size = feed_forward(c.d_model, c.d_ff, bias=c.bias)
    return size, size


def _block_parts(c: EncoderDecoderConfig | DecoderOnlyConfig | EncoderOnlyConfig, *, active=False):
    """Parameters of one attention sub-layer, one feed-forward sub-layer and one norm.

    ``active``: the feed-forward sub-layer's parameters one token uses (a mixture
    of experts: the router's and ``experts_per_token`` experts').
    """
    return (
        attention_parameters(c.d_model, bias=c.bias, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads),
        _feed_forward_sizes(c)[1 if active else 0],
        norm_parameters(c.d_model, c.norm),
    )


def parameter_terms(
    config: EncoderDecoderConfig | DecoderOnlyConfig | EncoderOnlyConfig, *, active: bool = False
) -> dict[str, int]:
    """The parameter count of a model with this ``config``, split into named terms.

    Parameters
    ----------
    config : EncoderDecoderConfig, DecoderOnlyConfig or EncoderOnlyConfig
    active : bool
        Count, in each block, only the feed-forward parameters one token uses:
        with ``feed_forward="moe"``, the router and ``experts_per_token`` of the
        ``n_experts`` experts (:func:`~tinyformer.moe.moe_parameters`); other
        feed-forward networks use all of theirs. The embedding tables count whole,
        as in the published "active parameters" of Mixtral.

    Returns
    -------
    dict of str to int
        Terms in the order of the model's layers; terms that are zero for
        this configuration (e.g. ``"output projection"`` when tied) are present
        with the value 0, so the table always has the same rows.
    """
    if not isinstance(active, bool):
        raise TypeError(f"active must be True or False, got {describe(active)}")
    if isinstance(config, EncoderDecoderConfig):
        return _encoder_decoder_terms(config, active)
    if isinstance(config, DecoderOnlyConfig | EncoderOnlyConfig):
        return _decoder_only_terms(config, active)
    raise TypeError(
        f"config must be an EncoderDecoderConfig or a DecoderOnlyConfig (or an"
        f" EncoderOnlyConfig), got {describe(config)}"
    )


def _encoder_decoder_terms(c: EncoderDecoderConfig, active: bool) -> dict[str, int]:
    d = c.d_model
    attention, ffn, norm = _block_parts(c, active=active)
    learned = c.positional == "learned"
    return {
        "source embedding": c.src_vocab_size * d,
        "target embedding": 0 if c.share_embeddings else c.tgt_vocab_size * d,
        "source positions": c.context_length * d if learned else 0,
        "target positions": c.context_length * d if learned else 0,
        "encoder blocks": c.n_encoder_layers * (attention + ffn + 2 * norm),
        "decoder blocks": c.n_decoder_layers * (2 * attention + ffn + 3 * norm),
        "final norms": 2 * norm if c.norm_first else 0,
        "output projection": 0 if c.tie_output else d * c.tgt_vocab_size,
    }


def _decoder_only_terms(c: DecoderOnlyConfig | EncoderOnlyConfig, active: bool) -> dict[str, int]:
    """One stack of blocks with one attention each: decoder-only and encoder-only alike."""
    d = c.d_model
    attention, ffn, norm = _block_parts(c, active=active)
    return {
        "token embedding": c.vocab_size * d,
        "positions": c.context_length * d if c.positional == "learned" else 0,
        "blocks": c.n_layers * (attention + ffn + 2 * norm),
        "final norm": norm if c.norm_first else 0,
        "output projection": 0 if c.tie_output else d * c.vocab_size,
    }


def parameter_count(config: EncoderDecoderConfig | DecoderOnlyConfig | EncoderOnlyConfig) -> int:
    """Number of trainable scalars of the model built from ``config``, without building it.

    Equal to ``model.num_parameters()`` (shared tables counted once); the sum
    of :func:`~tinyformer.models.counting.parameter_terms`.
    """
    return sum(parameter_terms(config).values())


def active_parameter_count(
    config: EncoderDecoderConfig | DecoderOnlyConfig | EncoderOnlyConfig,
) -> int:
    """Parameters a token uses: :func:`parameter_count` with each mixture of experts' idle experts left out.

    Each block's mixture of experts counts its router and ``experts_per_token``
    experts (see :func:`parameter_terms` with ``active=True``); a model without
    one uses every parameter, and the count equals :func:`parameter_count`.
    """
    return sum(parameter_terms(config, active=True).values())


# ------------------------------------------------------------ published sizes
def gpt2_config(d_model: int, n_layers: int, n_heads: int) -> DecoderOnlyConfig:
    r"""GPT-2's architecture at one size :cite:p:`radford2019language`.

    50,257-token vocabulary, 1,024 learned positions, pre-norm blocks with a
    final LayerNorm, GELU in its tanh approximation (as in the released code, so
    a model loaded from GPT-2's weights computes their logits), :math:`d_\text{ff} = 4d`,
    biases everywhere and the output tied to the token embedding.
    """
    return DecoderOnlyConfig(
        vocab_size=50257,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=4 * d_model,
        n_layers=n_layers,
        context_length=1024,
        norm_first=True,
        activation="gelu_tanh",
        positional="learned",
        tie_output=True,
    )


def _llama_layout(**sizes: int) -> DecoderOnlyConfig:
    """Pre-norm RMSNorm blocks, SwiGLU, no biases, rotary positions, an untied output."""
    return DecoderOnlyConfig(
        norm_first=True,
        norm="rmsnorm",
        norm_eps=1e-5,
        feed_forward="gated",
        activation="silu",
        bias=False,
        positional="rotary",
        rotary_base=10000.0,
        tie_output=False,
        **sizes,
    )


def llama2_config(size: str) -> DecoderOnlyConfig:
    r"""Llama 2's architecture :cite:p:`touvron2023llama2`, ``size`` ``"7b"`` or ``"70b"``.

    A 32,000-token vocabulary, 4,096 positions, pre-norm RMSNorm blocks
    (:math:`\epsilon = 10^{-5}`), SwiGLU feed-forward networks, rotary positions
    (base 10,000), no biases and an untied output projection. 7B: :math:`d = 4096`,
    32 layers of 32 heads, :math:`d_\text{ff} = 11008`. 70B: :math:`d = 8192`, 80
    layers of 64 query heads sharing 8 key/value heads (grouped-query attention),
    :math:`d_\text{ff} = 28672`. The released weights use the adjacent rotary layout
    (Meta's code); Hugging Face's copies are converted to the halves layout
    (see :func:`~tinyformer.positional.convert_rotary_layout`). Too large to build here:
    count it with :func:`parameter_count`.
    """
    sizes = {
        "7b": {"d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": None, "d_ff": 11008},
        "70b": {"d_model": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "d_ff": 28672},
    }
    if size not in sizes:
        raise ValueError(f"size must be one of {sorted(sizes)}, got {size!r}")
    return _llama_layout(vocab_size=32000, context_length=4096, **sizes[size])


def mistral_7b_config() -> DecoderOnlyConfig:
    r"""Mistral 7B's architecture :cite:p:`jiang2023mistral`.

    Llama's layout (:func:`llama2_config`) with :math:`d = 4096`, 32 layers of 32
    query heads sharing 8 key/value heads, :math:`d_\text{ff} = 14336`, a
    32,000-token vocabulary and a context of 32,768 positions. Its sliding-window
    attention (each layer sees the last 4,096 positions) adds no parameters and is
    not modelled here.
    """
    return _llama_layout(
        vocab_size=32000,
        context_length=32768,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        d_ff=14336,
    )


def mixtral_8x7b_config() -> DecoderOnlyConfig:
    r"""Mixtral 8x7B's architecture :cite:p:`jiang2024mixtral`.

    Mistral 7B's layout and attention (:func:`mistral_7b_config`: :math:`d = 4096`,
    32 layers of 32 query heads sharing 8 key/value heads) with every feed-forward
    network replaced by a mixture of 8 SwiGLU experts of width 14,336, each token
    routed to 2 of them; rotary base :math:`10^6`, a 32,768-token context. Every
    token uses the router and 2 experts, about 13B of the 47B parameters
    (:func:`active_parameter_count`).
    """
    return replace(
        mistral_7b_config(),
        feed_forward="moe",
        n_experts=8,
        experts_per_token=2,
        expert_feed_forward="gated",
        rotary_base=1e6,
    )


def kv_cache_bytes_per_token(
    config: DecoderOnlyConfig, bytes_per_element: int | None = None
) -> int:
    r"""Bytes of key/value cache a decoder-only model keeps for each token of context.

    .. math:: 2\, L\, h_{kv}\, d_k \cdot \text{bytes per element}

    (a key and a value of :math:`h_{kv} d_k` numbers in each of :math:`L` layers).
    Grouped-query attention divides it by :math:`h / h_{kv}`, multi-query attention by :math:`h`.

    Parameters
    ----------
    config : DecoderOnlyConfig
        The model.
    bytes_per_element : int, optional
        The cache's number format: 2 for float16 or bfloat16 (how the published models
        are served); by default the item size of ``config.dtype``.
    """
    if not isinstance(config, DecoderOnlyConfig):
        raise TypeError(f"config must be a DecoderOnlyConfig, got {describe(config)}")
    size = (
        np.dtype(config.dtype).itemsize
        if bytes_per_element is None
        else positive_int(bytes_per_element, "bytes_per_element")
    )
    return 2 * config.n_layers * config.kv_heads * config.d_k * size


def transformer_config(d_model: int, n_heads: int, d_ff: int) -> EncoderDecoderConfig:
    """The original Transformer's architecture at one size :cite:p:`vaswani2017attention`.

    Six encoder and six decoder layers, post-norm, sinusoidal positions and one
    table shared by source embedding, target embedding and output projection
    over a joint vocabulary of about 37,000 byte-pair tokens (the English-German
    setting; the paper gives only this approximate size).
    """
    return EncoderDecoderConfig(
        src_vocab_size=37000,
        tgt_vocab_size=37000,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_encoder_layers=6,
        n_decoder_layers=6,
        context_length=512,
        norm_first=False,
        activation="relu",
        positional="sinusoidal",
        share_embeddings=True,
        tie_output=True,
    )


@dataclass(frozen=True)
class PublishedSize:
    """A published model, its configuration here and the sizes reported for it.

    Attributes
    ----------
    name : str
        E.g. ``"GPT-2 small"``.
    config : EncoderDecoderConfig, DecoderOnlyConfig or EncoderOnlyConfig
        The architecture, in this library's terms.
    reported : int
        The size in the paper, as printed (rounded to millions).
    released : int or None
        The exact count of the released weights, where one exists.
    """

    name: str
    config: EncoderDecoderConfig | DecoderOnlyConfig | EncoderOnlyConfig
    reported: int
    released: int | None = None

    @property
    def formula(self) -> int:
        """:func:`~tinyformer.models.counting.parameter_count` of :attr:`config`."""
        return parameter_count(self.config)


def published_sizes() -> list[PublishedSize]:
    """GPT-2's four sizes and the Transformer's base and big models, with reported counts.

    The GPT-2 paper :cite:p:`radford2019language` prints 117M, 345M, 762M and
    1542M; the released checkpoints hold exactly 124,439,808, 354,823,168,
    774,030,080 and 1,557,611,200 parameters, which :func:`~tinyformer.models.counting.parameter_count`
    reproduces exactly; the paper's figures are lower and are not roundings of
    these counts. :cite:t:`vaswani2017attention` report 65M (base) and
    213M (big); the formula gives about 63.1M and 214.2M. The gap for base,
    3%, is as large as about 3,700 vocabulary rows: the paper states the
    vocabulary only as "about 37000 tokens", so the count cannot be pinned down
    closer than that.
    """
    return [
        PublishedSize("GPT-2 small", gpt2_config(768, 12, 12), 117_000_000, 124_439_808),
        PublishedSize("GPT-2 medium", gpt2_config(1024, 24, 16), 345_000_000, 354_823_168),
        PublishedSize("GPT-2 large", gpt2_config(1280, 36, 20), 762_000_000, 774_030_080),
        PublishedSize("GPT-2 XL", gpt2_config(1600, 48, 25), 1_542_000_000, 1_557_611_200),
        PublishedSize("Transformer base", transformer_config(512, 8, 2048), 65_000_000),
        PublishedSize("Transformer big", transformer_config(1024, 16, 4096), 213_000_000),
    ]


def modern_sizes() -> list[PublishedSize]:
    """Llama 2 7B and 70B, Mistral 7B and Mixtral 8x7B, with the sizes their papers name and release holds.

    :cite:t:`touvron2023llama2` name the models 7B and 70B; :cite:t:`jiang2023mistral`,
    7B; :cite:t:`jiang2024mixtral` give Mixtral 47B parameters, 13B of them active
    per token. The released checkpoints hold exactly 6,738,415,616, 68,976,648,192,
    7,241,732,096 and 46,702,792,704 parameters (the sums of the tensors in the
    published weights), which :func:`parameter_count` reproduces.
    """
    return [
        PublishedSize("Llama 2 7B", llama2_config("7b"), 7_000_000_000, 6_738_415_616),
        PublishedSize("Llama 2 70B", llama2_config("70b"), 70_000_000_000, 68_976_648_192),
        PublishedSize("Mistral 7B", mistral_7b_config(), 7_000_000_000, 7_241_732_096),
        PublishedSize("Mixtral 8x7B", mixtral_8x7b_config(), 47_000_000_000, 46_702_792_704),
    ]


# ------------------------------------------------------------ BERT
BERT_VOCAB_SIZE = 30522  # the released English WordPiece vocabulary (uncased)


def bert_config(d_model: int, n_layers: int, n_heads: int) -> EncoderOnlyConfig:
    r"""BERT's encoder stack at one size, as far as this library's encoder-only model goes.

    :cite:t:`devlin2019bert`: a 30,522-token WordPiece vocabulary, 512 learned
    positions, post-norm blocks, GELU, :math:`d_\text{ff} = 4d`, the output tied to
    the token embedding. The parts of BERT this model does not have are counted by
    :func:`~tinyformer.models.counting.bert_extra_terms`.
    """
    return EncoderOnlyConfig(
        vocab_size=BERT_VOCAB_SIZE,
        d_model=positive_int(d_model, "d_model"),
        n_heads=n_heads,
        d_ff=4 * d_model,
        n_layers=n_layers,
        context_length=512,
        norm_first=False,
        activation="gelu",
        positional="learned",
        tie_output=True,
    )


def bert_extra_terms(d_model: int, vocab_size: int = BERT_VOCAB_SIZE) -> dict[str, int]:
    r"""Parameters of BERT that :func:`bert_config`'s model leaves out, term by term.

    - ``"segment embeddings"``: two rows, sentence A and sentence B, :math:`2d`;
    - ``"embedding LayerNorm"``: after embedding + position + segment, :math:`2d`;
    - ``"pooler"``: a :math:`d \times d` dense layer with bias on the first
      (``[CLS]``) position, :math:`d^2 + d`;
    - ``"masked-LM head"``: a dense layer, a LayerNorm and a bias on the tied output,
      :math:`d^2 + d + 2d + V`;
    - ``"next-sentence head"``: two classes from the pooled vector, :math:`2d + 2`.

    The first three belong to the pre-trained encoder (its released checkpoints hold
    them), the last two to the pre-training heads.
    """
    d = positive_int(d_model, "d_model")
    v = positive_int(vocab_size, "vocab_size")
    return {
        "segment embeddings": 2 * d,
        "embedding LayerNorm": 2 * d,
        "pooler": d * d + d,
        "masked-LM head": d * d + d + 2 * d + v,
        "next-sentence head": 2 * d + 2,
    }


def bert_sizes() -> list[PublishedSize]:
    """BERT base and large with the sizes :cite:t:`devlin2019bert` report (110M and 340M).

    The paper gives the sizes in Section 3 as rounded totals with no breakdown. The
    formula counts this library's encoder-only model of the same shape; the
    difference is mostly :func:`bert_extra_terms`.
    """
    return [
        PublishedSize("BERT base", bert_config(768, 12, 12), 110_000_000),
        PublishedSize("BERT large", bert_config(1024, 24, 16), 340_000_000),
    ]
