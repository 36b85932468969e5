"""Whole models of the three families: encoder-decoder, decoder-only and encoder-only.

- :class:`~tinyformer.models.config.TransformerConfig`: the options every family's blocks
  are built from; :class:`~tinyformer.models.config.EncoderDecoderConfig`,
  :class:`~tinyformer.models.config.DecoderOnlyConfig` and
  :class:`~tinyformer.models.config.EncoderOnlyConfig` add each family's own fields
- :class:`~tinyformer.models.stack.TransformerStack`: embedding, positions, blocks and
  final norm, the one stack every model is made of
- :class:`~tinyformer.models.encoder_decoder.EncoderDecoder`, :class:`~tinyformer.models.decoder_only.DecoderOnlyLM`,
  :class:`~tinyformer.models.encoder_only.EncoderOnlyMLM`: ``forward``/``backward`` for
  training; the first two also ``start``/``step`` with key/value caches for generation
- :class:`~tinyformer.models.state.DecodeState`: what ``step`` carries from one call to the next
- :func:`~tinyformer.models.loading.load_model`: a saved model back from its checkpoint in one call
- :func:`~tinyformer.models.counting.parameter_count`, :func:`~tinyformer.models.counting.parameter_terms`: sizes in closed form;
  :func:`~tinyformer.models.counting.published_sizes`: GPT-2 and the original Transformer, checked against the formula
"""

from __future__ import annotations

from tinyformer.models.config import (
    DecoderOnlyConfig,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    TransformerConfig,
)
from tinyformer.models.counting import (
    PublishedSize,
    parameter_count,
    parameter_terms,
    published_sizes,
)
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.models.encoder_decoder import EncoderDecoder
from tinyformer.models.encoder_only import EncoderOnlyMLM
from tinyformer.models.loading import load_model, model_from_checkpoint
from tinyformer.models.stack import TransformerStack
from tinyformer.models.state import DecodeState

__all__ = [
    "DecodeState",
    "DecoderOnlyConfig",
    "DecoderOnlyLM",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "EncoderOnlyConfig",
    "EncoderOnlyMLM",
    "PublishedSize",
    "TransformerConfig",
    "TransformerStack",
    "load_model",
    "model_from_checkpoint",
    "parameter_count",
    "parameter_terms",
    "published_sizes",
]
