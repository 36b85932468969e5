"""Decoding: greedy and beam search, sampling, and speculative decoding.

Every function works with the two families of :mod:`tinyformer.models` that
generate (the third, the encoder-only model, fills in masked tokens instead): a
decoder-only language model continues a prompt, an encoder-decoder decodes from
a BOS token given a source. Each takes ``use_cache``: with ``True`` (the
default) the key/value caches are kept between steps; with ``False`` the whole
prefix is recomputed at every step, which gives the same tokens more slowly.

- :mod:`tinyformer.generation.processing`: temperature, top-k and top-p
- :mod:`tinyformer.generation.decoding`: :class:`~tinyformer.generation.decoding.IncrementalDecoder` (cached or not)
  and :class:`~tinyformer.generation.decoding.GenerationResult`
- :mod:`tinyformer.generation.search`: :func:`~tinyformer.generation.search.greedy` and :func:`~tinyformer.generation.search.beam_search`
- :mod:`tinyformer.generation.sampling`: :func:`~tinyformer.generation.sampling.sample`
- :mod:`tinyformer.generation.speculative`: :func:`~tinyformer.generation.speculative.speculative_decode`
"""

from __future__ import annotations

from tinyformer.generation.decoding import GenerationResult, IncrementalDecoder, is_encoder_decoder
from tinyformer.generation.processing import (
    log_probabilities,
    probabilities,
    sample_tokens,
)
from tinyformer.generation.sampling import sample
from tinyformer.generation.search import (
    BeamSearchResult,
    Hypothesis,
    beam_search,
    greedy,
    length_normalizer,
)
from tinyformer.generation.speculative import SpeculativeResult, speculative_decode

__all__ = [
    "BeamSearchResult",
    "GenerationResult",
    "Hypothesis",
    "IncrementalDecoder",
    "SpeculativeResult",
    "beam_search",
    "greedy",
    "is_encoder_decoder",
    "length_normalizer",
    "log_probabilities",
    "probabilities",
    "sample",
    "sample_tokens",
    "speculative_decode",
]
