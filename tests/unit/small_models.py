"""Small models of the three families, every option their configuration allows, and an adapter.

Test files ``import small_models``: pytest puts ``tests/unit`` on the path
(``pythonpath`` in pyproject.toml).

- :data:`OPTIONS`: named configurations, one per option a configuration allows
  (norm, feed-forward network, biases, positions, attention scale, output tying,
  norm placement) and combinations of them;
- :func:`decoder_only`, :func:`encoder_decoder`, :func:`encoder_only`: a small
  model of each family, built from :data:`SIZES` and any options;
- :func:`perturb`: non-trivial norms and biases, so that every parameter matters;
  :func:`raise_scores`: attention scores large enough that softmax must shift its rows;
- :class:`AdaptedLinear` and :func:`adapt_linears`: every ``Linear`` of a model
  given a low-rank term that changes its output, as a LoRA adapter would;
- :func:`model_and_inputs`: a model of either generating family and a batch of inputs for it;
  :func:`forward_log_probs`: what ``forward`` says of the tokens a search generated;
- :class:`BigramLM` and :func:`bigram_windows`: a stand-in model and data for the training loop;
- :func:`llama_in_float64`: a Hugging Face Llama made to compute in float64 throughout, for
  the reference tests (PyTorch is passed in, never imported here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tinyformer.functional import log_softmax
from tinyformer.layers import Dropout, Embedding, Linear
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    EncoderOnlyMLM,
)
from tinyformer.module import Module
from tinyformer.multihead import MultiHeadAttention
from tinyformer.training import WindowDataset

SIZES = {"d_model": 8, "n_heads": 2, "d_ff": 12}

LLAMA = {
    "norm_first": True,
    "norm": "rmsnorm",
    "norm_eps": 1e-6,
    "feed_forward": "gated",
    "activation": "silu",
    "bias": False,
    "positional": "rotary",
    "tie_output": False,
}
"""Llama's layout: pre-norm RMSNorm, SwiGLU, no biases, rotary positions, an untied output."""

OPTIONS: dict[str, dict] = {
    "pre-norm learned": {"norm_first": True, "positional": "learned"},
    "post-norm sinusoidal": {"norm_first": False, "positional": "sinusoidal"},
    "rmsnorm": {"norm": "rmsnorm", "norm_eps": 1e-6},
    "gated silu": {"feed_forward": "gated", "activation": "silu"},
    "no bias": {"bias": False},
    "rotary": {"positional": "rotary"},
    "no positions": {"positional": "none"},
    "unscaled scores": {"attention_scale": "none"},
    "untied": {"tie_output": False},
    "llama": LLAMA,
    "post-norm llama, unscaled": {**LLAMA, "norm_first": False, "attention_scale": "none"},
}
"""Every option a configuration allows, by name; each family accepts every one of them."""


def decoder_only(
    seed: int = 0, *, vocab_size: int = 9, context_length: int = 10, n_layers: int = 2, **options
) -> DecoderOnlyLM:
    """A decoder-only model of :data:`SIZES` (overridden by ``options``)."""
    config = DecoderOnlyConfig(
        vocab_size,
        n_layers=n_layers,
        context_length=context_length,
        **{**SIZES, **options},
    )
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed))


def encoder_decoder(
    seed: int = 0,
    *,
    src_vocab_size: int = 9,
    tgt_vocab_size: int = 9,
    context_length: int = 10,
    n_encoder_layers: int = 1,
    n_decoder_layers: int = 2,
    **options,
) -> EncoderDecoder:
    """An encoder-decoder of :data:`SIZES` (overridden by ``options``); pad id 0."""
    config = EncoderDecoderConfig(
        src_vocab_size,
        tgt_vocab_size,
        n_encoder_layers=n_encoder_layers,
        n_decoder_layers=n_decoder_layers,
        context_length=context_length,
        **{**SIZES, **options},
    )
    return EncoderDecoder(config, rng=np.random.default_rng(seed))


def encoder_only(
    seed: int = 0, *, vocab_size: int = 9, context_length: int = 10, n_layers: int = 2, **options
) -> EncoderOnlyMLM:
    """An encoder-only model of :data:`SIZES` (overridden by ``options``)."""
    config = EncoderOnlyConfig(
        vocab_size,
        n_layers=n_layers,
        context_length=context_length,
        **{**SIZES, **options},
    )
    return EncoderOnlyMLM(config, rng=np.random.default_rng(seed))


def perturb(model: Module, seed: int = 0, scale: float = 0.1) -> Module:
    """Add noise to every parameter (gains away from 1, biases away from 0), in place."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.value += (scale * rng.standard_normal(p.shape)).astype(p.dtype)
    return model


SHIFTED_SCORES = {"float32": 100.0, "float64": 720.0}
"""Attention scores around which softmax must shift its rows (beyond ``exp``'s safe range)."""


def raise_scores(model: Module, level: float) -> bool:
    r"""Add about ``level`` to every attention score of ``model``, through the query and key biases.

    With every entry of a head's query and key bias equal to :math:`b`, the scores gain
    :math:`s\,d_k b^2` (plus terms that vary from query to query). Large scores are where a
    softmax that shifted all rows by one number (the largest score of the batch) coupled
    the rows of a batch. Returns False, changing nothing, for a model without biases.
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if any(m.q_proj.bias is None for m in layers):
        return False
    for m in layers:
        b = np.sqrt(level / (m.d_k * m.scale))
        m.q_proj.bias.value[...] = b
        m.k_proj.bias.value[...] = b
    return True


class AdaptedLinear(Linear):
    r"""A ``Linear`` with a low-rank term added to its output, as a LoRA adapter adds one.

    .. math:: y = x W + b + (x A) B

    ``A`` (``adapter_down``, ``(d_in, r)``) and ``B`` (``adapter_up``, ``(r, d_out)``)
    are plain arrays set by :func:`adapt_linears`, not parameters: the tests only run
    the adapted model forward, through every path that should run it.
    """

    adapter_down: np.ndarray
    adapter_up: np.ndarray

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``x W + b + (x A) B``."""
        return super().forward(x) + (x @ self.adapter_down) @ self.adapter_up


def adapt_linears(
    model: Module, rng: np.random.Generator, *, rank: int = 2, scale: float = 0.3
) -> int:
    """Make every ``Linear`` of ``model`` an :class:`AdaptedLinear` in place; return how many.

    Each instance keeps its weights and gets its own random ``A`` and ``B`` (entries of
    standard deviation ``scale``, in the layer's dtype).
    """
    count = 0
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = AdaptedLinear
            module.adapter_down = (scale * rng.standard_normal((module.d_in, rank))).astype(
                module.dtype
            )
            module.adapter_up = (scale * rng.standard_normal((rank, module.d_out))).astype(
                module.dtype
            )
            count += 1
    return count


# ------------------------------------------------------------- for generation
GENERATION_SIZES = {"d_model": 16, "n_heads": 2, "d_ff": 32}


def model_and_inputs(
    family: str, seed: int, vocab: int = 11, context: int = 24, **options
) -> tuple[DecoderOnlyLM | EncoderDecoder, np.ndarray]:
    """A generating model (two decoder blocks) and three prompts or sources for it.

    Decoder-only: prompts ``(3, 4)`` of ids from 3 up; encoder-decoder (source
    vocabulary 9, one encoder block): sources ``(3, 5)`` of ids from 1 up.
    """
    rng = np.random.default_rng(seed + 1000)
    options = {**GENERATION_SIZES, "context_length": context, **options}
    if family == "decoder-only":
        return decoder_only(seed, vocab_size=vocab, **options), rng.integers(3, vocab, (3, 4))
    model = encoder_decoder(seed, src_vocab_size=9, tgt_vocab_size=vocab, **options)
    return model, rng.integers(1, 9, (3, 5))


def forward_logits(model, inputs: np.ndarray, tokens: np.ndarray, bos_id: int = 1):
    """``(n, V)``: the scores ``model.forward`` gives each of the ``n`` generated ``tokens``.

    ``inputs`` is one prompt (decoder-only) or source (encoder-decoder), ``tokens`` what
    was generated after it; row ``i`` is computed from the prefix before token ``i``.
    """
    tokens = np.asarray(tokens)
    if model.family == "decoder-only":
        ids = np.concatenate([inputs, tokens[:-1]])[None]
        return model.forward(ids)[0, len(inputs) - 1 :]
    decoder_input = np.concatenate([[bos_id], tokens[:-1]])[None]
    return model.forward(inputs[None], decoder_input)[0]


def forward_log_probs(model, inputs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Each generated token's log-probability under ``model.forward`` of its whole prefix."""
    tokens = np.asarray(tokens)
    return log_softmax(forward_logits(model, inputs, tokens))[np.arange(len(tokens)), tokens]


def sharpen(model: Module, factor: float = 6.0) -> Module:
    """Scale the embeddings and output so that random models have peaked, varied distributions."""
    for name, p in model.named_parameters():
        if "embedding" in name or "output" in name:
            p.value *= factor
    return model


# ------------------------------------------------------- a stand-in for the loop
@dataclass(frozen=True)
class BigramConfig:
    """The configuration of :class:`BigramLM` (``to_dict`` is what checkpoints store)."""

    vocab_size: int = 12
    d_model: int = 8
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class BigramLM(Module):
    """Embedding, dropout, linear: a bigram language model with the language-model interface."""

    def __init__(self, config: BigramConfig, *, rng: np.random.Generator) -> None:
        super().__init__()
        self.config = config
        self.embedding = Embedding(config.vocab_size, config.d_model, rng=rng)
        self.dropout = Dropout(config.dropout, rng=rng)
        self.head = Linear(config.d_model, config.vocab_size, rng=rng)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        return self.head(self.dropout(self.embedding(ids)))  # (B, T, V)

    def backward(self, grad_logits: np.ndarray) -> None:
        self.embedding.backward(self.dropout.backward(self.head.backward(grad_logits)))


def bigram_windows(
    n: int, seq_len: int, rng: np.random.Generator, vocab: int = 12
) -> WindowDataset:
    """Windows of a next-token rule (``x -> 3x + 1 mod vocab``) with 10% of tokens random."""
    streams = np.empty((n, seq_len + 1), dtype=np.int64)
    streams[:, 0] = rng.integers(0, vocab, n)
    for t in range(seq_len):
        nxt = (3 * streams[:, t] + 1) % vocab
        noise = rng.random(n) < 0.1
        streams[:, t + 1] = np.where(noise, rng.integers(0, vocab, n), nxt)
    return WindowDataset(streams[:, :-1], streams[:, 1:])


def llama_in_float64(torch, hf_model):
    """Make a float64 Llama compute in float64 everywhere.

    ``LlamaRMSNorm`` normalizes in float32 and ``LlamaRotaryEmbedding`` computes its
    angles in float32 even in a float64 model, which limits the agreement to about
    1e-7 of the logits' scale. Recomputed here in float64 (with the config's base and
    linear factor), the two models agree to rounding. GPT-2 needs nothing of the kind.
    """
    config = hf_model.config
    rope = config.rope_parameters
    d_k = config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    if rope.get("rope_type") == "linear":
        inv_freq = inv_freq / rope["factor"]

    def angles(x, position_ids):
        a = position_ids[..., None].to(torch.float64) * inv_freq
        a = torch.cat((a, a), dim=-1)
        return a.cos().to(x.dtype), a.sin().to(x.dtype)

    def rms_norm(norm):
        def forward(h):
            mean_square = h.pow(2).mean(-1, keepdim=True)
            return norm.weight * (h * torch.rsqrt(mean_square + norm.variance_epsilon))

        return forward

    hf_model.model.rotary_emb.forward = angles
    for module in hf_model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = rms_norm(module)
    return hf_model
