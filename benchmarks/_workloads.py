"""The benchmarks' training models, batches and block sizes: one place for every script.

Only what every version of tinyformer offers is used here (the model and
configuration classes, ``forward`` and ``backward``, ``cross_entropy``,
``AdamW``), and no PyTorch: ``bench_training_step.py`` copies these models into
PyTorch, and ``bench_versions.py`` builds them under two source trees of
tinyformer, one per child process.

- encoder-decoder: vocabularies of 14 (10 symbols + 4 specials), d_model=64,
  4 heads, d_ff=256, 2 + 2 post-norm layers, sinusoidal positions, tied output,
  batch 64, source length 8, decoder length 9;
- decoder-only: vocabulary 16, d_model=64, 4 heads, d_ff=256, 2 pre-norm layers
  with a final LayerNorm, exact GELU, learned positions, tied output, context 64,
  batch 32;
- decoder-only tanh: the same with the tanh approximation of GELU, a diagnostic:
  NumPy has no error function, so the exact GELU evaluates erf with tinyformer's
  own vectorized table, the dearest elementwise step of the model, and this row
  shows what the rest of the step costs;
- encoder-only: the masked-language-model experiment's defaults
  (``tinyformer.experiments.mlm``): vocabulary 17 (16 symbols and [MASK]),
  d_model=32, 4 heads, d_ff=128, 2 pre-norm layers with a final LayerNorm, tanh
  GELU, learned positions, tied output, batch 128 of 16 tokens; about 15% of the
  positions are replaced by [MASK] and scored by the loss (symbols 1-15 are
  drawn, as 0 marks a position without a loss);
- one encoder block (``bench_encoder_block.py``, ``bench_versions.py``): the
  size of the models above, and a larger one (``BLOCK_SIZES``).
"""

from __future__ import annotations

import numpy as np

from tinyformer.losses import cross_entropy
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    EncoderOnlyMLM,
)
from tinyformer.optim import AdamW

PAD, BOS = 0, 1  # the loss ignores PAD targets
MASK_ID = 16  # the encoder-only model's [MASK] token
FAMILIES = ["encoder-decoder", "decoder-only", "decoder-only tanh", "encoder-only"]
LEARNING_RATE = 1e-3
# One encoder block (bench_encoder_block.py): a block of the book's size and a larger one.
BLOCK_SIZES = [
    {"batch": 64, "seq_len": 16, "d_model": 64, "n_heads": 4, "d_ff": 256},
    {"batch": 32, "seq_len": 128, "d_model": 256, "n_heads": 8, "d_ff": 1024},
]


def training_model(family: str, dtype_name: str, rng: np.random.Generator):
    """The benchmark's model of ``family``, its initial weights drawn from ``rng``."""
    common = {"d_model": 64, "n_heads": 4, "d_ff": 256, "dtype": dtype_name}
    if family == "encoder-decoder":
        config = EncoderDecoderConfig(
            src_vocab_size=14,
            tgt_vocab_size=14,
            n_encoder_layers=2,
            n_decoder_layers=2,
            norm_first=False,
            **common,
        )
        return EncoderDecoder(config, rng=rng)
    if family in ("decoder-only", "decoder-only tanh"):
        config = DecoderOnlyConfig(
            vocab_size=16,
            n_layers=2,
            context_length=64,
            norm_first=True,
            activation="gelu_tanh" if family.endswith("tanh") else "gelu",
            **common,
        )
        return DecoderOnlyLM(config, rng=rng)
    if family == "encoder-only":
        config = EncoderOnlyConfig(
            vocab_size=MASK_ID + 1,
            d_model=32,
            n_heads=4,
            d_ff=128,
            n_layers=2,
            context_length=16,
            norm_first=True,
            activation="gelu_tanh",
            dtype=dtype_name,
        )
        return EncoderOnlyMLM(config, rng=rng)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def training_batch(
    family: str, rng: np.random.Generator
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The model's inputs and the targets of the loss (``PAD`` where there is no loss)."""
    if family == "encoder-decoder":
        source = rng.integers(4, 14, (64, 8))
        target = rng.integers(4, 14, (64, 9))  # labels; the decoder reads them shifted right
        decoder_input = np.concatenate([np.full((64, 1), BOS), target[:, :-1]], axis=1)
        return (source, decoder_input), target
    if family.startswith("decoder-only"):
        tokens = rng.integers(0, 16, (32, 65))
        return (tokens[:, :-1],), tokens[:, 1:]
    tokens = rng.integers(1, MASK_ID, (128, 16))  # 1 .. 15: no PAD among the symbols
    chosen = rng.random(tokens.shape) < 0.15  # the positions the loss scores
    chosen[:, 0] = True  # at least one per sequence
    inputs = np.where(chosen, MASK_ID, tokens)
    return (inputs,), np.where(chosen, tokens, PAD)


def training_step(model, inputs: tuple[np.ndarray, ...], target: np.ndarray):
    """A function that runs one step (zero_grad, forward, loss, backward, AdamW) and returns the loss."""
    optimizer = AdamW(model.parameters(), lr=LEARNING_RATE)

    def step() -> float:
        optimizer.zero_grad()
        logits = model.forward(*inputs)
        loss, grad = cross_entropy(logits, target, ignore_index=PAD)
        model.backward(grad)
        optimizer.step()
        return loss

    return step
