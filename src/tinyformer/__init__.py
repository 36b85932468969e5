"""tinyformer: every part of the transformer in NumPy, with exact backward passes.

The library behind the book *Understanding Transformers*. Modules, from the
bottom up:

- :mod:`tinyformer.functional`: softmax, log-softmax and activations with derivatives
- :mod:`tinyformer.module`: :class:`~tinyformer.module.Parameter` and
  :class:`~tinyformer.module.Module`
- :mod:`tinyformer.positional`: sinusoidal, learned and rotary positions
- :mod:`tinyformer.masks`: boolean attention masks (True where a query may attend)
- :mod:`tinyformer.attention`: scaled dot-product attention and its backward pass
- :mod:`tinyformer.viz`: plotting helpers for the book's figures (needs matplotlib)
"""

from __future__ import annotations

__version__ = "0.1.0"
