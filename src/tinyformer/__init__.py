"""tinyformer: every part of the transformer in NumPy, with exact backward passes.

The library behind the book *Understanding Transformers*. Modules, from the
bottom up (each uses only those above it):

- :mod:`tinyformer.functional`: softmax, log-softmax and activations with derivatives
- :mod:`tinyformer.gradcheck`: finite-difference checks of hand-written gradients
- :mod:`tinyformer.module`: :class:`~tinyformer.module.Parameter` and
  :class:`~tinyformer.module.Module`
- :mod:`tinyformer.layers`, :mod:`tinyformer.norm`, :mod:`tinyformer.feedforward`:
  linear and embedding layers, dropout, LayerNorm and RMSNorm, feed-forward networks
- :mod:`tinyformer.rnn`: an Elman recurrent layer, to measure what attention replaced
- :mod:`tinyformer.positional`: sinusoidal, learned and rotary positions
- :mod:`tinyformer.masks`: boolean attention masks (True where a query may attend)
- :mod:`tinyformer.attention`: scaled dot-product attention and its backward pass
- :mod:`tinyformer.multihead`, :mod:`tinyformer.efficient`: multi-head attention with a
  key/value cache; linear and tiled (memory-efficient) attention
- :mod:`tinyformer.blocks`: the transformer block from named parts (norm, attention,
  optional cross-attention, feed-forward network), post- or pre-norm
- :mod:`tinyformer.losses`: cross-entropy with padding and label smoothing
- :mod:`tinyformer.optim`, :mod:`tinyformer.schedules`: optimizers, clipping and
  learning-rate schedules
- :mod:`tinyformer.data`: tokenizers, toy sequence tasks and a synthetic language source
- :mod:`tinyformer.models`: one configuration and one stack of blocks, composed into the
  three families (encoder-decoder, decoder-only, encoder-only), with closed-form
  parameter counts
- :mod:`tinyformer.training`, :mod:`tinyformer.checkpoint`: the training loop, its history,
  and checkpoints that resume exactly
- :mod:`tinyformer.generation`: greedy, beam search, sampling and speculative decoding
- :mod:`tinyformer.experiments`: the book's training runs, deterministic from a seed, and
  the store that computes each of them once and shares it
- :mod:`tinyformer.analysis`: measurements the book makes of attention
- :mod:`tinyformer.claims`: conclusions drawn from measurements, asserted with a margin
- ``tinyformer.exercises``: the book's live exercises, a function for the reader to write
  and a check that says in words what differs from tinyformer's own
- :mod:`tinyformer.viz`: plotting helpers for the book's figures (needs matplotlib)

The names a user reaches for first are also here at the top level (imported on
first use, so ``import tinyformer`` stays cheap): the models and their
configurations, the tokenizers, the training loop and its pieces, the
optimizers and schedules, generation, and saving and loading (tinyformer's own
checkpoints, and Hugging Face folders with :func:`~tinyformer.models.pretrained.save_pretrained`
and :func:`~tinyformer.models.pretrained.from_pretrained`)::

    import tinyformer as tf

    model = tf.DecoderOnlyLM(tf.DecoderOnlyConfig(vocab_size=40), rng=np.random.default_rng(0))
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_TOP_LEVEL = {
    "tinyformer.models": (
        "DecoderOnlyConfig",
        "DecoderOnlyLM",
        "EncoderDecoder",
        "EncoderDecoderConfig",
        "EncoderOnlyConfig",
        "EncoderOnlyMLM",
        "load_model",
    ),
    "tinyformer.data": (
        "BPETokenizer",
        "CharTokenizer",
        "PairDataset",
        "WordPieceTokenizer",
        "WordTokenizer",
        "load_tokenizer",
    ),
    "tinyformer.training": (
        "BatchStream",
        "EarlyStopping",
        "LossEvaluator",
        "Trainer",
        "WindowDataset",
        "lm_loss",
        "seq2seq_loss",
    ),
    "tinyformer.optim": ("SGD", "Adam", "AdamW"),
    "tinyformer.schedules": ("InverseSqrtSchedule", "WarmupCosineSchedule"),
    "tinyformer.generation": ("beam_search", "greedy", "sample"),
    "tinyformer.checkpoint": ("load_checkpoint", "read_checkpoint", "save_checkpoint"),
    "tinyformer.models.pretrained": ("from_pretrained", "save_pretrained"),
}
_WHERE = {name: module for module, names in _TOP_LEVEL.items() for name in names}
# __all__ spells the same names out (tools read it without running this module)

__all__ = [  # noqa: RUF022 (the version first, then the names in order)
    "__version__",
    "Adam",
    "AdamW",
    "BPETokenizer",
    "BatchStream",
    "CharTokenizer",
    "DecoderOnlyConfig",
    "DecoderOnlyLM",
    "EarlyStopping",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "EncoderOnlyConfig",
    "EncoderOnlyMLM",
    "InverseSqrtSchedule",
    "LossEvaluator",
    "PairDataset",
    "SGD",
    "Trainer",
    "WarmupCosineSchedule",
    "WindowDataset",
    "WordPieceTokenizer",
    "WordTokenizer",
    "beam_search",
    "from_pretrained",
    "greedy",
    "lm_loss",
    "load_checkpoint",
    "load_model",
    "load_tokenizer",
    "read_checkpoint",
    "sample",
    "save_checkpoint",
    "save_pretrained",
    "seq2seq_loss",
]


def __getattr__(name: str) -> Any:
    """Import a top-level name's module the first time the name is used (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'tinyformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
