"""Data for the book's experiments: tokenizers, toy tasks, batches and a synthetic language.

- :mod:`tinyformer.data.tokenizers`: special tokens, :class:`~tinyformer.data.tokenizers.CharTokenizer`,
  :class:`~tinyformer.data.tokenizers.WordTokenizer`, :class:`~tinyformer.data.tokenizers.BPETokenizer`
  (byte-pair merges over bytes or characters, by frequency or by PMI, with a trace of every merge), and
  :class:`~tinyformer.data.wordpiece.WordPieceTokenizer` (``##`` continuations, greedy
  longest-match encoding)
- :mod:`tinyformer.data.batching`: padding, teacher forcing, :class:`~tinyformer.data.batching.Batch` and its masks
- :mod:`tinyformer.data.tasks`: copy, reverse and sort, with held-out splits
- :mod:`tinyformer.data.markov`: a Markov source whose entropy rate is known exactly
- :mod:`tinyformer.data.corpus`: real English text that ships with Python, the docstrings of
  the standard library, with held-out text from other packages
- :mod:`tinyformer.data.ngram_lm`: count-based baselines on token ids, from the add-one
  unigram to interpolated and modified Kneser-Ney
"""

from __future__ import annotations

from tinyformer.data.batching import Batch, PairDataset, make_batch, pad_sequences, teacher_forcing
from tinyformer.data.markov import MarkovSource, empirical_entropy_rate
from tinyformer.data.tasks import TASKS, SequenceTask, TaskSplit
from tinyformer.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    N_SPECIAL,
    PAD_ID,
    SPACE_SYMBOL,
    SPECIAL_TOKENS,
    UNK_ID,
    BPETokenizer,
    CharTokenizer,
    MergeStep,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)
from tinyformer.data.wordpiece import WordPieceTokenizer

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "N_SPECIAL",
    "PAD_ID",
    "SPACE_SYMBOL",
    "SPECIAL_TOKENS",
    "TASKS",
    "UNK_ID",
    "BPETokenizer",
    "Batch",
    "CharTokenizer",
    "MarkovSource",
    "MergeStep",
    "PairDataset",
    "SequenceTask",
    "TaskSplit",
    "Tokenizer",
    "WordPieceTokenizer",
    "WordTokenizer",
    "empirical_entropy_rate",
    "load_tokenizer",
    "make_batch",
    "pad_sequences",
    "teacher_forcing",
    "tokenizer_from_dict",
]
