r"""WordPiece: subwords matched greedily, longest first, with ``##`` continuation pieces.

The tokenizer of BERT :cite:p:`devlin2019bert`. Text is split into words at
whitespace, and every punctuation character is a word of its own
(:func:`bert_pretokenize`). A word is then spelled with vocabulary pieces from left
to right: at each position the longest piece of the vocabulary that matches is
taken, and every piece after the first is looked up with the prefix ``##``
(``"playing"`` -> ``play``, ``##ing``). If some position cannot be matched, the
whole word becomes ``<unk>``, as in BERT; so does a word longer than
``max_input_chars_per_word`` characters.

The vocabulary shares the layout of every tokenizer of the book (by default ids
0-3 are ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``; see :mod:`tinyformer.data.tokenizers`,
whose :class:`~tinyformer.data.tokenizers.Tokenizer` also gives batch encoding and
the choice of special tokens).
:meth:`WordPieceTokenizer.train` learns a vocabulary the way Hugging Face's
``tokenizers`` library does (its ``WordPieceTrainer``): byte-pair-encoding merges by
frequency over words whose non-initial characters carry the ``##`` prefix.
:meth:`WordPieceTokenizer.to_hf_json` and :meth:`WordPieceTokenizer.from_hf_json`
exchange the ``tokenizer.json`` format that library reads and writes.

**No normalization.** BERT's uncased models lower-case the text and strip accents
first (``tokenizers``' ``BertNormalizer``). That step is left out here: those
rules depend on Unicode tables, and ``tokenizers`` 0.23 uses older tables than
Python's ``unicodedata``, so a reimplementation could not agree with it on every
character. A ``tokenizer.json`` with a normalizer is refused by name.

**Unicode versions.** Punctuation is what Python's ``unicodedata`` calls P*
(Unicode 14.0 in Python 3.11). ``tokenizers`` 0.23 classifies characters with
tables older than Unicode 9.0 (those of the Rust crate ``unicode_categories``,
2016), so the two split differently at 106 of the 1,112,064 code points: 104
punctuation marks added to Unicode since (historic and South and Central Asian
scripts, e.g. U+2E43..U+2E5D, U+11660..U+1166C) and two characters whose category
changed (U+166D, U+111C9). Whitespace agrees everywhere.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tinyformer._validation import describe, positive_int, token_ids
from tinyformer.data.tokenizers import (
    SPECIAL_TOKENS,
    Tokenizer,
    _check_special_tokens,
    _hf_added_tokens,
    _hf_roles,
    _hf_tokens,
)

__all__ = [
    "CONTINUATION_PREFIX",
    "MAX_INPUT_CHARS_PER_WORD",
    "WordPieceTokenizer",
    "bert_pretokenize",
    "is_bert_punctuation",
    "is_bert_whitespace",
]

#: Marks a piece that continues a word rather than starting one (``"##ing"``).
CONTINUATION_PREFIX = "##"
#: BERT's limit on the length of a word, in characters; a longer word is ``<unk>``.
MAX_INPUT_CHARS_PER_WORD = 100

_REPLACEMENT = "\ufffd"  # how decode shows <unk>, as Tokenizer.decode does

# The Unicode White_Space property (what Rust's char::is_whitespace tests, and so
# the whitespace of tokenizers' BertPreTokenizer). Python's str.isspace differs: it
# also counts U+001C..U+001F.
_WHITESPACE = frozenset(
    map(
        chr,
        [
            *range(0x09, 0x0E),
            0x20,
            0x85,
            0xA0,
            0x1680,
            *range(0x2000, 0x200B),
            0x2028,
            0x2029,
            0x202F,
            0x205F,
            0x3000,
        ],
    )
)
# BERT counts every printable ASCII character that is neither a letter, a digit
# nor a space as punctuation, though $ + < = > ^ ` | ~ are symbols (S*) in Unicode.
_ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")

# Hugging Face's WordPiece decoder removes these spaces from each decoded piece.
_CLEANUP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" do not", " don't"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def is_bert_whitespace(char: str) -> bool:
    """Whether ``char`` separates words: the Unicode White_Space property.

    Parameters
    ----------
    char : str
        One character.
    """
    return char in _WHITESPACE


def is_bert_punctuation(char: str) -> bool:
    """Whether ``char`` is a word of its own: Unicode category P*, or an ASCII symbol.

    The Unicode categories are those of Python's ``unicodedata``.

    Parameters
    ----------
    char : str
        One character.
    """
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def _ranges(code_points: list[int]) -> str:
    """A regular-expression character class body covering ``code_points`` (sorted)."""
    parts = []
    start = previous = code_points[0]
    for c in [*code_points[1:], -2]:
        if c != previous + 1:
            parts.append(re.escape(chr(start)))
            if previous > start:
                parts.append("-" + re.escape(chr(previous)))
            start = c
        previous = c
    return "".join(parts)


@functools.cache
def _word_pattern() -> re.Pattern[str]:
    """One punctuation character, or a run of characters that are neither punctuation nor space.

    Built on first use from every code point's category (about 0.2 s).
    """
    punctuation = [c for c in range(sys.maxunicode + 1) if is_bert_punctuation(chr(c))]
    space = sorted(map(ord, _WHITESPACE))
    p, s = _ranges(punctuation), _ranges(space)
    return re.compile(f"[{p}]|[^{p}{s}]+")


def _words_at(text: str) -> Iterator[tuple[int, str]]:
    """Each word of ``text`` with the position of its first character."""
    for match in _word_pattern().finditer(text):
        yield match.start(), match.group()


def bert_pretokenize(text: str) -> list[str]:
    """Split ``text`` into words as BERT does before WordPiece.

    Whitespace (:func:`is_bert_whitespace`) separates words and is dropped; every
    punctuation character (:func:`is_bert_punctuation`) is a word of its own.

    Parameters
    ----------
    text : str
        The text to split.

    Returns
    -------
    list of str
        The words, in order.

    Examples
    --------
    >>> bert_pretokenize("Hey friend!  How's it going?")
    ['Hey', 'friend', '!', 'How', "'", 's', 'it', 'going', '?']
    """
    return [word for _, word in _words_at(_check_text(text))]


def _check_text(text: object, name: str = "text") -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {describe(text)}")
    return text


def _check_characters(chars: object, name: str) -> tuple[str, ...]:
    """``chars`` as a tuple of distinct single characters."""
    if not isinstance(chars, str | Iterable):
        raise TypeError(
            f"{name} must be a str or an iterable of characters, got {describe(chars)}"
        )
    out = tuple(chars)
    for c in out:
        if not isinstance(c, str) or len(c) != 1:
            raise TypeError(f"{name} must hold single characters, got {describe(c)}")
    repeated = sorted(c for c, n in Counter(out).items() if n > 1)
    if repeated:
        raise ValueError(f"{name} must not repeat characters, got {repeated[:10]} more than once")
    return out


def _check_vocabulary(vocabulary: object) -> tuple[str, ...]:
    if isinstance(vocabulary, str) or not isinstance(vocabulary, Iterable):
        raise TypeError(f"vocabulary must be an iterable of str, got {describe(vocabulary)}")
    tokens = tuple(vocabulary)
    for t in tokens:
        if not isinstance(t, str) or not t:
            raise TypeError(f"vocabulary must hold non-empty strings, got {describe(t)}")
    repeated = sorted(t for t, n in Counter(tokens).items() if n > 1)
    if repeated:
        raise ValueError(f"vocabulary must not repeat tokens, got {repeated[:10]} more than once")
    return tokens


class WordPieceTokenizer(Tokenizer):
    r"""WordPiece: greedy longest-match-first subwords, ``##`` on every piece after a word's first.

    Encoding splits the text into words with :func:`bert_pretokenize` and spells
    each word from left to right, taking at each position the longest matching
    piece of the vocabulary (looked up with the prefix :data:`CONTINUATION_PREFIX`
    after the word's first piece). When some position matches nothing, the whole
    word is ``<unk>``, even if another split would have spelled it: with the pieces
    ``a``, ``ab`` and ``##bc``, ``"abc"`` starts with ``ab`` and then finds no
    ``##c``, so it is ``<unk>`` though ``a`` + ``##bc`` spells it. This is BERT's
    rule :cite:p:`devlin2019bert`, and that of Hugging Face's ``tokenizers``.

    **Decoding is not the inverse of encoding.** :meth:`decode` joins the pieces
    of a word, drops their ``##`` and puts one space between words, as BERT's
    WordPiece decoder does; whitespace is not stored, so runs of spaces and
    newlines come back as one space, and punctuation gets spaces around it
    (``"f(x)"`` comes back as ``"f ( x )"``), except for the spaces that
    ``cleanup`` removes (before ``.``, ``?``, ``!`` and ``,``).

    Parameters
    ----------
    vocabulary : list of str
        The pieces, in id order (ids ``4, 5, ...`` after the special tokens); a
        piece that continues a word starts with ``"##"``. Distinct and non-empty.
    special_tokens : list of str, optional
        The names of the padding, beginning, end and unknown tokens, then any
        extra special tokens, as in :class:`~tinyformer.data.tokenizers.Tokenizer`.
        WordPiece needs an unknown token.
    vocab : list of str, optional
        An explicit id order of every token, special ones included, for a
        vocabulary laid out by another library (:meth:`from_hf_json`).
    max_input_chars_per_word : int
        A longer word (in characters) is ``<unk>`` without being matched.
    cleanup : bool
        Whether :meth:`decode` removes the space in front of ``.``, ``?``, ``!``,
        ``,`` and a few English contractions, as Hugging Face's WordPiece decoder
        does by default.

    Examples
    --------
    >>> tok = WordPieceTokenizer(["play", "##ing", "##s", "run", "!"])
    >>> tok.tokenize("playing runs!")
    ['play', '##ing', 'run', '##s', '!']
    >>> tok.decode(tok.encode("playing runs!"))
    'playing runs!'
    >>> tok.tokenize("plays jumping")
    ['play', '##s', '<unk>']
    """

    kind = "wordpiece"
    """The name :func:`~tinyformer.data.tokenizers.tokenizer_from_dict` knows this class by."""

    def __init__(
        self,
        vocabulary: Iterable[str],
        *,
        special_tokens: Sequence[str | None] = SPECIAL_TOKENS,
        vocab: Sequence[str] | None = None,
        max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
        cleanup: bool = True,
    ) -> None:
        self.vocabulary = _check_vocabulary(vocabulary)
        self.max_input_chars_per_word = positive_int(
            max_input_chars_per_word, "max_input_chars_per_word"
        )
        if not isinstance(cleanup, bool):
            raise TypeError(f"cleanup must be a bool, got {describe(cleanup)}")
        self.cleanup = cleanup
        super().__init__(self.vocabulary, special_tokens=special_tokens, vocab=vocab)
        clash = sorted(set(self.vocabulary) & set(self._special_ids))
        if clash:
            raise ValueError(
                f"vocabulary must not hold the special tokens' names, got {clash[:10]}"
                " (rename the special tokens with special_tokens)"
            )
        if self.unk_id is None:
            raise ValueError(
                "WordPieceTokenizer needs an unknown token (special_tokens[3]): a word it"
                " cannot spell becomes that token"
            )
        # The longest piece that can start a word, and the longest continuation
        # (without its prefix), in characters: no longer match needs to be tried.
        n = len(CONTINUATION_PREFIX)
        self._longest_first = max((len(t) for t in self.vocabulary), default=0)
        self._longest_next = max(
            (len(t) - n for t in self.vocabulary if t.startswith(CONTINUATION_PREFIX)), default=0
        )
        self._cache: dict[str, tuple[int, ...] | None] = {}

    def _arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {"vocabulary": list(self.vocabulary)}
        if self.special_tokens != SPECIAL_TOKENS:
            arguments["special_tokens"] = list(self.special_tokens)
        if self._vocab_given:
            arguments["vocab"] = list(self.tokens)
        arguments["max_input_chars_per_word"] = self.max_input_chars_per_word
        arguments["cleanup"] = self.cleanup
        return arguments

    # ---------------------------------------------------------------- encoding
    def _spell(self, word: str) -> tuple[int, ...] | None:
        """The ids of ``word``'s pieces, longest match first; None when it is ``<unk>``."""
        if word in self._cache:
            return self._cache[word]
        pieces: tuple[int, ...] | None = None
        if len(word) <= self.max_input_chars_per_word:
            found = []
            start = 0
            while start < len(word):
                prefix = CONTINUATION_PREFIX if start else ""
                longest = self._longest_next if start else self._longest_first
                end = min(len(word), start + longest)
                while end > start and prefix + word[start:end] not in self._ids:
                    end -= 1
                if end == start:  # nothing matches here: the whole word is unknown
                    break
                found.append(self._ids[prefix + word[start:end]])
                start = end
            else:
                pieces = tuple(found)
        self._cache[word] = pieces
        return pieces

    def _segment_ids(self, text: str) -> list[int]:
        """The ids of a text without special tokens: each word's pieces, or ``<unk>``."""
        ids: list[int] = []
        for _, word in _words_at(text):
            pieces = self._spell(word)
            ids.extend((self.unk_id,) if pieces is None else pieces)
        return ids

    def _raise_on_unknown(self, text: str, offset: int) -> None:
        """Raise ValueError at the first word of ``text`` that becomes ``<unk>``."""
        for start, word in _words_at(text):
            if self._spell(word) is None:
                why = (
                    f"longer than max_input_chars_per_word={self.max_input_chars_per_word}"
                    if len(word) > self.max_input_chars_per_word
                    else "which the vocabulary cannot spell"
                )
                raise ValueError(
                    f"text contains the word {word[:40]!r} at position {offset + start}, {why}"
                    " (pass unknown='unk' to map it to <unk>)"
                )

    def encode(
        self,
        text: str,
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        unknown: str = "unk",
        allow_special: bool = False,
    ) -> np.ndarray:
        """Token ids of ``text``, shape ``(n,)``, int64.

        Parameters
        ----------
        text : str
            The text to encode.
        add_bos, add_eos : bool
            Put ``<bos>`` in front, ``<eos>`` at the end.
        unknown : str
            ``"unk"``: a word the vocabulary cannot spell (or longer than
            ``max_input_chars_per_word``) becomes one ``<unk>``; ``"raise"``: it
            raises :class:`ValueError` naming the word and its position.
        allow_special : bool
            Whether the special tokens' names in ``text`` are those tokens (as
            ``tokenizers`` always takes them) or ordinary text, as in
            :meth:`Tokenizer.encode <tinyformer.data.tokenizers.Tokenizer.encode>`.
        """
        return super().encode(
            text, add_bos=add_bos, add_eos=add_eos, unknown=unknown, allow_special=allow_special
        )

    def tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` as strings; a word the vocabulary cannot spell is ``"<unk>"``."""
        return [self.tokens[i] for i in self._segment_ids(_check_text(text))]

    def decode(self, ids: object, *, skip_special: bool = True) -> str:
        """The text of a sequence of ids, shape ``(n,)``, as BERT's WordPiece decoder writes it.

        A piece that starts with ``##`` is glued to the one before it, without its
        ``##``; any other piece is a new word, after one space (the first piece is
        written as it is, ``##`` included). With ``cleanup``, the space in front of
        ``.``, ``?``, ``!`` and ``,`` goes. With ``skip_special`` (the default)
        the special tokens are dropped, except ``<unk>``, which shows as U+FFFD
        (``tokenizers`` drops it too); otherwise every special token shows its
        name, e.g. ``<eos>``, as a word.
        """
        if isinstance(ids, list | tuple) and not ids:
            return ""  # an empty list has no integer dtype to check
        ids = token_ids(ids, "ids", self.vocab_size)
        if ids.ndim != 1:
            raise ValueError(f"ids must be one sequence of shape (n,), got shape {ids.shape}")
        pieces = []
        for i in ids.tolist():
            if not skip_special or i not in self._is_special:
                pieces.append(self.tokens[i])
            elif i == self.unk_id:
                pieces.append(_REPLACEMENT)
        out = []
        for k, piece in enumerate(pieces):
            written = piece
            if k:
                if piece.startswith(CONTINUATION_PREFIX):
                    written = piece[len(CONTINUATION_PREFIX) :]
                else:
                    written = " " + piece
            if self.cleanup:
                for old, new in _CLEANUP:
                    written = written.replace(old, new)
            out.append(written)
        return "".join(out)

    # ---------------------------------------------------------------- training
    @classmethod
    def train(
        cls,
        corpus: str | Iterable[str],
        vocab_size: int,
        *,
        min_frequency: int = 2,
        special_tokens: Sequence[str] = SPECIAL_TOKENS,
        initial_alphabet: str | Iterable[str] = (),
        continuation_order: str | Iterable[str] | None = None,
        max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
    ) -> WordPieceTokenizer:
        r"""Learn a vocabulary from ``corpus`` as Hugging Face's ``WordPieceTrainer`` does.

        The algorithm is byte-pair encoding :cite:p:`sennrich2016neural` over
        WordPiece's symbols, which is what the ``WordPieceTrainer`` of Hugging
        Face's ``tokenizers`` library runs; it is *not* the likelihood-based
        selection of the original WordPiece :cite:p:`schuster2012japanese,wu2016google`,
        which adds the piece that most raises the likelihood of the training
        data under a language model over pieces.

        1. Split the corpus into words with :func:`bert_pretokenize` and count them.
        2. Start each word as its characters, the first as it is and every later
           one with the prefix ``##`` (``"cat"`` -> ``c``, ``##a``, ``##t``). The
           initial vocabulary is the special tokens, every character of the
           corpus and of ``initial_alphabet`` (by code point), then the ``##``
           symbols of the characters seen after a word's first.
        3. Repeatedly find the most frequent adjacent pair :math:`(a, b)` over the
           counted words, ties going to the pair whose ids :math:`(\mathrm{id}_a,
           \mathrm{id}_b)` are smallest; replace it everywhere by the piece
           :math:`a` followed by :math:`b` without its ``##``
           (``##a`` + ``##t`` -> ``##at``), which becomes a new id unless it is
           already in the vocabulary (two different pairs can spell the same piece).
        4. Stop when the vocabulary holds ``vocab_size`` ids, or when the most
           frequent pair occurs fewer than ``min_frequency`` times.

        The vocabulary is every symbol made along the way; encoding then ignores
        the merges and matches pieces greedily. So the ``vocab_size`` pieces are
        those of a BPE tokenizer, but a word is not always split the way the
        merges would split it.

        **Agreement with** ``tokenizers``. Its trainer numbers the ``##`` symbols
        of step 2 in the iteration order of a hash map, which changes from run to
        run, and breaks ties by those numbers; so two of its runs on the same
        corpus can learn slightly different vocabularies (on 300 KB of docstrings
        at 2,000 ids, five runs differed in 10 pieces). Passing one run's order
        as ``continuation_order`` reproduces that run's vocabulary, id for id.
        One difference of bookkeeping remains: ``tokenizers`` queues a pair once
        per step that created occurrences of it and merges each batch of words
        when its entry comes up, where this function merges every occurrence at
        once. The two can only part when a merge spells a piece that is already
        in the vocabulary (so that a pair arises at two steps), which overlapping
        runs such as ``##b ##a ##a ##a`` can cause; on the corpora compared it
        never happened.

        Parameters
        ----------
        corpus : str or list of str
            Training text (one string, or several documents).
        vocab_size : int
            Target number of ids, special tokens included. It must be at least
            the size of the initial vocabulary of step 2.
        min_frequency : int
            A pair seen fewer times than this is never merged.
        special_tokens : list of str, optional
            The names of the padding, beginning, end and unknown tokens, then any
            extra special tokens; they take the first ids, in this order.
        initial_alphabet : str or list of str
            Characters to include even if the corpus lacks them (as in
            ``tokenizers``, only as word-initial pieces).
        continuation_order : str or list of str, optional
            The characters whose ``##`` symbols start the vocabulary, in the order
            of their ids: exactly the characters seen after a word's first. By
            default, by code point.
        max_input_chars_per_word : int
            Passed to the tokenizer (training counts words of every length).

        Returns
        -------
        WordPieceTokenizer
            The tokenizer with the learned vocabulary.
        """
        docs = [corpus] if isinstance(corpus, str) else corpus
        if not isinstance(docs, Iterable):
            raise TypeError(f"corpus must be a str or an iterable of str, got {describe(corpus)}")
        counts: Counter[str] = Counter()
        for doc in docs:
            counts.update(bert_pretokenize(_check_text(doc, "every document of corpus")))
        if not counts:
            raise ValueError("corpus must contain at least one word, got none (only whitespace)")
        vocab_size = positive_int(vocab_size, "vocab_size")
        min_frequency = positive_int(min_frequency, "min_frequency")
        specials = _check_special_tokens(special_tokens, roles_may_be_absent=False)
        extra = _check_characters(initial_alphabet, "initial_alphabet")
        alphabet = sorted({c for w in counts for c in w}.union(extra))
        clash = sorted(set(alphabet) & set(specials))
        if clash:
            raise ValueError(
                f"special_tokens must not be characters of the alphabet, got {clash[:10]}"
            )
        later = {c for w in counts for c in w[1:]}
        if continuation_order is None:
            following = sorted(later)
        else:
            following = list(_check_characters(continuation_order, "continuation_order"))
            if set(following) != later:
                missing, unseen = sorted(later - set(following)), sorted(set(following) - later)
                raise ValueError(
                    "continuation_order must hold exactly the characters seen after a word's"
                    f" first; it lacks {missing[:10]} and has {unseen[:10]} besides"
                )
        symbols = [*alphabet, *(CONTINUATION_PREFIX + c for c in following)]
        smallest = len(specials) + len(symbols)
        if vocab_size < smallest:
            raise ValueError(
                f"vocab_size must be at least {smallest} ({len(specials)} special tokens +"
                f" {len(alphabet)} characters + {len(following)} '##' characters), got {vocab_size}"
            )
        vocabulary = _bpe_vocabulary(counts, specials, symbols, vocab_size, min_frequency)
        return cls(
            vocabulary, special_tokens=specials, max_input_chars_per_word=max_input_chars_per_word
        )

    # ------------------------------------------------------- tokenizer.json
    def to_hf_json(self) -> dict[str, Any]:
        """The tokenizer as a Hugging Face ``tokenizer.json``, as a dict.

        Model ``WordPiece`` with the unknown token as ``unk_token``,
        pre-tokenizer ``BertPreTokenizer``, decoder ``WordPiece``, no normalizer
        and no post-processor; the special tokens are its ``added_tokens``, and
        the ids keep their layout. ``tokenizers.Tokenizer.from_str(json.dumps(d))``
        reads it and encodes every text to the ids of :meth:`encode` with
        ``allow_special=True`` (``tokenizers`` always recognizes the special
        tokens' names) and no ``<bos>``/``<eos>``, except at the rare code points
        named in the module's notes. Each special token that plays a role
        carries it in a ``"tinyformer_role"`` entry, as
        :meth:`~tinyformer.data.tokenizers.BPETokenizer.to_hf_json` writes.
        """
        added = _hf_added_tokens(self)
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": None,
            "decoder": {
                "type": "WordPiece",
                "prefix": CONTINUATION_PREFIX,
                "cleanup": self.cleanup,
            },
            "model": {
                "type": "WordPiece",
                "unk_token": self.tokens[self.unk_id],
                "continuing_subword_prefix": CONTINUATION_PREFIX,
                "max_input_chars_per_word": self.max_input_chars_per_word,
                "vocab": {token: i for i, token in enumerate(self.tokens)},
            },
        }

    @classmethod
    def from_hf_json(
        cls,
        d: Mapping[str, Any],
        *,
        special_tokens: Sequence[str | None] | None = None,
        tokenizer_config: Mapping[str, Any] | None = None,
    ) -> WordPieceTokenizer:
        """Read a Hugging Face ``tokenizer.json`` (parsed into a dict) with a WordPiece model.

        The ids keep the file's layout, and the result encodes every text as
        ``tokenizers`` does with the file (with ``allow_special=True``), except
        at the rare code points named in the module's notes. What this tokenizer
        cannot express is refused by name with :class:`ValueError`: a normalizer
        (such as BERT's ``BertNormalizer``, which lower-cases), a pre-tokenizer
        other than ``BertPreTokenizer``, a decoder other than ``WordPiece``, a
        post-processor (add ``<bos>``/``<eos>`` with :meth:`encode`'s arguments
        instead), truncation or padding, a continuation prefix other than
        ``##``, added tokens that are not special or that strip spaces, and a
        ``unk_token`` that is not a special token.

        Parameters
        ----------
        d : dict
            The parsed JSON, e.g. ``json.loads(tokenizer.to_str())``.
        special_tokens : list of str or None, optional
            The names of the padding, beginning, end and unknown tokens (None
            where the file has none; the unknown token must be the file's
            ``unk_token``); the file's other special tokens follow as extras. By
            default each role goes to a special token only on evidence, never by
            its id (see :func:`~tinyformer.data.tokenizers.load_tokenizer`): in
            BERT's file only ``[UNK]``, the ``unk_token``, has a role.
        tokenizer_config : dict, optional
            The parsed ``tokenizer_config.json`` that sits next to the file:
            its ``pad_token``, ``bos_token``, ``eos_token`` and ``unk_token``
            (strings, or dicts with a ``"content"``) name the roles. Ignored
            when ``special_tokens`` is given.
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"d must be a tokenizer.json parsed into a dict, got {describe(d)}")
        model = d.get("model")
        if not isinstance(model, Mapping) or model.get("type") != "WordPiece":
            kind = model.get("type") if isinstance(model, Mapping) else model
            raise ValueError(f"d['model'] must be a WordPiece model, got type {kind!r}")
        for key in ("normalizer", "post_processor", "truncation", "padding"):
            if d.get(key) is not None:
                named = d[key].get("type", d[key]) if isinstance(d[key], Mapping) else d[key]
                raise ValueError(
                    f"tokenizer.json has {key} {named!r}, which WordPieceTokenizer does not"
                    f" implement; it reads only tokenizer.json files with {key} null"
                )
        pre = d.get("pre_tokenizer")
        if not isinstance(pre, Mapping) or pre.get("type") != "BertPreTokenizer":
            named = pre.get("type") if isinstance(pre, Mapping) else pre
            raise ValueError(
                f"tokenizer.json has pre_tokenizer {named!r}; WordPieceTokenizer implements"
                " only 'BertPreTokenizer'"
            )
        prefix = model.get("continuing_subword_prefix")
        if prefix != CONTINUATION_PREFIX:
            raise ValueError(
                f"tokenizer.json's continuing_subword_prefix is {prefix!r}; WordPieceTokenizer"
                f" uses {CONTINUATION_PREFIX!r}"
            )
        decoder = d.get("decoder")
        if (
            not isinstance(decoder, Mapping)
            or decoder.get("type") != "WordPiece"
            or decoder.get("prefix") != CONTINUATION_PREFIX
        ):
            raise ValueError(
                f"tokenizer.json has decoder {decoder!r}; WordPieceTokenizer implements only"
                f" the WordPiece decoder with prefix {CONTINUATION_PREFIX!r}"
            )
        if not isinstance(model.get("vocab"), Mapping):
            raise TypeError(
                f"d['model']['vocab'] must map tokens to ids, got {describe(model.get('vocab'))}"
            )
        tokens, specials, recorded = _hf_tokens(d, model)
        unk = model.get("unk_token")
        if unk not in specials:
            raise ValueError(
                f"tokenizer.json's unk_token {unk!r} is not one of its special added tokens"
                f" {specials[:10]}"
            )
        roles = _hf_roles(
            special_tokens,
            specials,
            unk,
            recorded=recorded,
            config=tokenizer_config,
            unk_unused=False,
        )
        names = (*roles, *(s for s in specials if s not in roles))
        vocabulary = [t for t in tokens if t not in specials]
        options = {
            "max_input_chars_per_word": model.get(
                "max_input_chars_per_word", MAX_INPUT_CHARS_PER_WORD
            ),
            "cleanup": decoder.get("cleanup", True),
        }
        if None not in roles and tokens == (*names, *vocabulary):
            return cls(vocabulary, special_tokens=names, **options)
        return cls(vocabulary, special_tokens=names, vocab=tokens, **options)


def _merge_word(word: list[int], left: int, right: int, new: int) -> list[int]:
    """Replace each ``left, right`` in ``word`` by ``new``, scanning left to right."""
    out: list[int] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def _bpe_vocabulary(
    counts: Mapping[str, int],
    specials: Sequence[str],
    symbols: Sequence[str],
    vocab_size: int,
    min_frequency: int,
) -> list[str]:
    """The non-special vocabulary that frequency merges over ``##`` symbols build (see ``train``).

    Pair counts are kept up to date incrementally: a merge recounts only the
    words that hold the pair, and a heap hands out the most frequent pair (ties:
    smallest ids), skipping entries whose count has changed since they were pushed.
    A merge that spells an existing token (a special token's name included, as in
    ``tokenizers``) reuses its id.
    """
    tokens = [*specials, *symbols]
    index = {t: i for i, t in enumerate(tokens)}
    words = [[index[w[0]], *(index[CONTINUATION_PREFIX + c] for c in w[1:])] for w in counts]
    weights = list(counts.values())
    pair_count: defaultdict[tuple[int, int], int] = defaultdict(int)
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for k, word in enumerate(words):
        for pair in itertools.pairwise(word):
            pair_count[pair] += weights[k]
            where[pair].add(k)
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)
    n_prefix = len(CONTINUATION_PREFIX)
    while len(tokens) < vocab_size:
        while heap and pair_count.get(heap[0][1], 0) != -heap[0][0]:
            heapq.heappop(heap)  # stale: the count changed after it was pushed
        if not heap or -heap[0][0] < min_frequency:
            break
        _, (left, right) = heapq.heappop(heap)
        piece = tokens[left] + tokens[right][n_prefix:]
        if piece not in index:
            index[piece] = len(tokens)
            tokens.append(piece)
        new = index[piece]
        touched: set[tuple[int, int]] = set()
        for k in where.pop((left, right)):
            old = words[k]
            merged = _merge_word(old, left, right, new)
            if len(merged) == len(old):
                continue  # the pair left this word in an earlier merge
            for pair in itertools.pairwise(old):
                pair_count[pair] -= weights[k]
                touched.add(pair)
            for pair in itertools.pairwise(merged):
                pair_count[pair] += weights[k]
                where[pair].add(k)
                touched.add(pair)
            words[k] = merged
        for pair in touched:
            if pair_count[pair] > 0:
                heapq.heappush(heap, (-pair_count[pair], pair))
            else:
                del pair_count[pair]
    return tokens[len(specials) :]
