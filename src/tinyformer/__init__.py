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
- :mod:`tinyformer.blocks`: encoder and decoder blocks, post- or pre-norm
- :mod:`tinyformer.losses`: cross-entropy with padding and label smoothing
- :mod:`tinyformer.optim`, :mod:`tinyformer.schedules`: optimizers, clipping and
  learning-rate schedules
- :mod:`tinyformer.data`: tokenizers, toy sequence tasks and a synthetic language source
- :mod:`tinyformer.models`: the encoder-decoder transformer and the decoder-only language
  model, with closed-form parameter counts
- :mod:`tinyformer.training`, :mod:`tinyformer.checkpoint`: the training loop, its history,
  and checkpoints that resume exactly
- :mod:`tinyformer.generation`: greedy, beam search, sampling and speculative decoding
- :mod:`tinyformer.experiments`: the book's training runs, deterministic from a seed, and
  the store that computes each of them once and shares it
- :mod:`tinyformer.analysis`: measurements the book makes of attention
- :mod:`tinyformer.viz`: plotting helpers for the book's figures (needs matplotlib)
"""

from __future__ import annotations

__version__ = "0.1.0"
