"""Tokenizers: text to token ids and back.

Every tokenizer here shares one layout of the vocabulary. The first four ids are
the special tokens, the same in every vocabulary of the book:

====  =========  ==================================================
 id   token      meaning
====  =========  ==================================================
 0    ``<pad>``  padding, ignored by attention and by the loss
 1    ``<bos>``  beginning of sequence (the decoder's first input)
 2    ``<eos>``  end of sequence (the last target)
 3    ``<unk>``  a symbol the vocabulary does not contain
====  =========  ==================================================

The symbols of the base alphabet follow, in order, and then (for
:class:`~tinyformer.data.tokenizers.BPETokenizer`) the merged tokens in the order they were learned.
A :class:`~tinyformer.data.tokenizers.BPETokenizer` may name the four reserved ids otherwise
(``special_tokens=("<|pad|>", "<|bos|>", "<|endoftext|>", "<|unk|>")``) and add further special
tokens after them, which shifts the alphabet up.

Three granularities share this layout: :class:`~tinyformer.data.tokenizers.CharTokenizer`
(one token per character), :class:`~tinyformer.data.tokenizers.WordTokenizer` (one token
per word or punctuation mark) and :class:`~tinyformer.data.tokenizers.BPETokenizer`
(subwords learned by merging pairs: over characters, with the SentencePiece-style space
symbol as an option, or over the UTF-8 bytes of the text as GPT-2 does, with a second merge
score as an option). A :class:`~tinyformer.data.tokenizers.BPETokenizer` is written as, and
read from, the ``tokenizer.json`` file of Hugging Face's ``tokenizers`` library
(:meth:`~tinyformer.data.tokenizers.BPETokenizer.to_hf_json`, :func:`load_tokenizer`).
"""

from __future__ import annotations

import codecs
import functools
import heapq
import itertools
import json
import os
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyformer._validation import describe, one_of, positive_int, token_ids

__all__ = [
    "BOS_ID",
    "BYTE_ALPHABET",
    "BYTE_SYMBOLS",
    "EOS_ID",
    "N_SPECIAL",
    "PAD_ID",
    "SPACE_SYMBOL",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "BPETokenizer",
    "CharTokenizer",
    "EncodedBatch",
    "MergeStep",
    "Tokenizer",
    "WordTokenizer",
    "gpt2_split",
    "load_tokenizer",
    "tokenizer_from_dict",
]

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
N_SPECIAL = len(SPECIAL_TOKENS)
UNKNOWN_CHAR = "\ufffd"  # how decode shows <unk>: the Unicode replacement character
_UNKNOWN_POLICIES = ("unk", "raise")
_ROLES = ("pad", "bos", "eos", "unk")  # what the first four special tokens stand for
_ROLE_FIELD = "tinyformer_role"  # the key of a special token's role in a tokenizer.json
#: The character that stands for a space with ``pretokenize="metaspace"`` (U+2581).
SPACE_SYMBOL = "\u2581"
MERGE_SCORES = ("frequency", "pmi")
PRETOKENIZERS = ("words", "metaspace", "bytes")
TIE_RULES = ("strings", "ids")


def _check_text(text: object, name: str = "text") -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {describe(text)}")
    return text


def _check_alphabet(alphabet: object) -> tuple[str, ...]:
    """The base symbols as a tuple of distinct single characters, in the given order."""
    if isinstance(alphabet, str):
        symbols = tuple(alphabet)
    elif isinstance(alphabet, Iterable):
        symbols = tuple(alphabet)
        for s in symbols:
            if not isinstance(s, str) or len(s) != 1:
                raise TypeError(f"alphabet must hold single characters, got {describe(s)}")
    else:
        raise TypeError(
            f"alphabet must be a str or an iterable of characters, got {describe(alphabet)}"
        )
    if not symbols:
        raise ValueError("alphabet must contain at least one character, got none")
    repeated = sorted(s for s, n in Counter(symbols).items() if n > 1)
    if repeated:
        raise ValueError(f"alphabet must not repeat characters, got {repeated} more than once")
    return symbols


def _check_corpus(corpus: object) -> list[str]:
    """The corpus as a list of documents; at least one character in all."""
    docs = [corpus] if isinstance(corpus, str) else corpus
    if not isinstance(docs, Iterable):
        raise TypeError(f"corpus must be a str or an iterable of str, got {describe(corpus)}")
    docs = list(docs)
    for doc in docs:
        _check_text(doc, "every document of corpus")
    if not any(docs):
        raise ValueError("corpus must contain at least one character, got an empty corpus")
    return docs


def _check_special_tokens(special_tokens: object, *, roles_may_be_absent: bool) -> tuple:
    """The special tokens' names: the four roles (pad, bos, eos, unk), then any extra ones."""
    if isinstance(special_tokens, str) or not isinstance(special_tokens, Iterable):
        raise TypeError(
            "special_tokens must be a sequence of str (pad, bos, eos, unk, then any extra"
            f" special tokens), got {describe(special_tokens)}"
        )
    names = tuple(special_tokens)
    if len(names) < len(_ROLES):
        raise ValueError(
            "special_tokens must name at least the four reserved tokens (pad, bos, eos, unk),"
            f" got {len(names)}: {list(names)}"
        )
    for k, name in enumerate(names):
        absent_allowed = roles_may_be_absent and k < len(_ROLES)
        if name is None and absent_allowed:
            continue
        if not isinstance(name, str) or not name:
            what = "a non-empty str or None" if absent_allowed else "a non-empty str"
            raise TypeError(f"special_tokens[{k}] must be {what}, got {describe(name)}")
    repeated = sorted(n for n, c in Counter(n for n in names if n is not None).items() if c > 1)
    if repeated:
        raise ValueError(f"special_tokens must not repeat, got {repeated} more than once")
    return names


@dataclass(frozen=True)
class EncodedBatch:
    """Several texts' token ids, padded to one length, with the mask of the real tokens.

    Attributes
    ----------
    ids : numpy.ndarray
        ``(B, n)``: row ``b`` holds text ``b``'s ids, then the padding id up to length ``n``.
    mask : numpy.ndarray of bool
        ``(B, n)``, True at real tokens and False at padding.
    """

    ids: np.ndarray
    mask: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """Number of real tokens in each row, shape ``(B,)``, int64."""
        return self.mask.sum(axis=1, dtype=np.int64)


class Tokenizer:
    """The vocabulary shared by every tokenizer: special tokens, then ``symbols``.

    Parameters
    ----------
    symbols : list of str
        The non-special tokens, in id order; they get ids ``4, 5, ...`` (after
        the special tokens).
    special_tokens : list of str, optional
        The names of the special tokens: the first four stand for padding,
        beginning of sequence, end of sequence and an unknown symbol, and any
        further ones are extra special tokens. In the default layout they take
        ids ``0, 1, 2, ...`` in this order. Special tokens are never split, and
        :meth:`encode` recognizes their names in a text only with
        ``allow_special=True``.
    vocab : list of str, optional
        An explicit order of every token, special ones included (``vocab[i]``
        gets id ``i``), for a vocabulary laid out by another library (read by
        :func:`load_tokenizer`). Then any of the first four ``special_tokens``
        may be None: the vocabulary has no token in that role.
    """

    def __init__(
        self,
        symbols: Sequence[str],
        *,
        special_tokens: Sequence[str | None] = SPECIAL_TOKENS,
        vocab: Sequence[str] | None = None,
    ) -> None:
        specials = _check_special_tokens(special_tokens, roles_may_be_absent=vocab is not None)
        names = [s for s in specials if s is not None]
        if vocab is None:
            tokens = (*names, *symbols)
            special_ids = dict(zip(names, range(len(names)), strict=True))
        else:
            tokens = self._check_vocab(vocab, names, symbols)
            special_ids = {t: tokens.index(t) for t in names}
        self._tokens = tokens
        self._vocab_given = vocab is not None
        self._special_tokens = specials
        self._special_ids = special_ids  # name -> id
        self._is_special = frozenset(special_ids.values())
        self._ids = {s: i for i, s in enumerate(tokens) if i not in self._is_special}
        self._role_ids = tuple(
            None if name is None else special_ids[name] for name in specials[: len(_ROLES)]
        )
        self._special_pattern: re.Pattern[str] | None = None

    @staticmethod
    def _check_vocab(vocab: object, names: list[str], symbols: Sequence[str]) -> tuple[str, ...]:
        if isinstance(vocab, str) or not isinstance(vocab, Iterable):
            raise TypeError(f"vocab must be a sequence of str, got {describe(vocab)}")
        tokens = tuple(vocab)
        repeated = sorted(t for t, n in Counter(tokens).items() if n > 1)
        if repeated:
            raise ValueError(f"vocab must not repeat tokens, got {repeated[:10]} more than once")
        expected = set(names) | set(symbols)
        if len(expected) != len(names) + len(symbols):
            both = sorted(set(names) & set(symbols))
            raise ValueError(f"special tokens {both[:10]} are also ordinary tokens of vocab")
        if set(tokens) != expected:
            missing = sorted(expected - set(tokens))[:10]
            extra = sorted(set(tokens) - expected)[:10]
            raise ValueError(
                "vocab must hold exactly the special tokens and the tokens the alphabet and"
                f" merges make; it lacks {missing} and has {extra} besides"
            )
        return tokens

    @property
    def tokens(self) -> tuple[str, ...]:
        """Every token's string, indexed by id (the special tokens show their names)."""
        return self._tokens

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return len(self._tokens)

    @property
    def special_tokens(self) -> tuple[str | None, ...]:
        """The names of the special tokens (pad, bos, eos, unk, None if absent), then any extra ones."""
        return self._special_tokens

    @property
    def pad_id(self) -> int | None:
        """The padding token's id (``PAD_ID`` in the default layout), or None."""
        return self._role_ids[0]

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence token's id (``BOS_ID`` by default), or None."""
        return self._role_ids[1]

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence token's id (``EOS_ID`` by default), or None."""
        return self._role_ids[2]

    @property
    def unk_id(self) -> int | None:
        """The unknown token's id (``UNK_ID`` by default), or None."""
        return self._role_ids[3]

    def _role_id(self, role: str, argument: str) -> int:
        token_id = self._role_ids[_ROLES.index(role)]
        if token_id is None:
            raise ValueError(
                f"{argument} needs a {role} token, but this tokenizer has none (its"
                f" special_tokens are {list(self._special_tokens)}); name the special token"
                " that plays each role when reading a tokenizer.json, with"
                " special_tokens=(pad, bos, eos, unk) (None for a role nothing plays), e.g."
                " load_tokenizer(path, special_tokens=...)"
            )
        return token_id

    def token_to_id(self, token: str) -> int:
        """The id of a (non-special) token string; :meth:`special_id` gives the others."""
        if token not in self._ids:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return self._ids[token]

    def special_id(self, name: str) -> int:
        """The id of the special token called ``name``."""
        if name not in self._special_ids:
            raise ValueError(
                f"{name!r} is not a special token of this tokenizer; they are"
                f" {sorted(self._special_ids)}"
            )
        return self._special_ids[name]

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
            ``"unk"``: a symbol outside the vocabulary becomes ``<unk>`` (or,
            in a vocabulary read from elsewhere that has no unknown token, is
            left out, as Hugging Face's ``tokenizers`` does); ``"raise"``: it
            raises :class:`ValueError` naming it and its position.
        allow_special : bool
            False (the default): the names of special tokens are ordinary
            text, encoded like any other characters, so a text from a user
            cannot smuggle in an ``<eos>``. True: every occurrence of a
            special token's name becomes that token's id (the longest name
            wins where several start at the same place), which is what
            ``tokenizers`` always does.
        """
        text = _check_text(text)
        if unknown not in _UNKNOWN_POLICIES:
            raise ValueError(f"unknown must be one of {_UNKNOWN_POLICIES}, got {unknown!r}")
        ids = [self._role_id("bos", "add_bos")] if add_bos else []
        offset = 0
        for segment, special_id in self._split_special(text, allow_special):
            if special_id is not None:
                ids.append(special_id)
            else:
                if unknown == "raise":
                    self._raise_on_unknown(segment, offset)
                ids.extend(self._segment_ids(segment))
            offset += len(segment)
        if add_eos:
            ids.append(self._role_id("eos", "add_eos"))
        return np.array(ids, dtype=np.int64)

    def _split_special(self, text: str, allow: bool) -> Iterator[tuple[str, int | None]]:
        """``text`` cut at the special tokens' names: (piece, None) or (name, its id)."""
        if not allow or not self._special_ids:
            yield text, None
            return
        if self._special_pattern is None:
            longest_first = sorted(self._special_ids, key=len, reverse=True)
            self._special_pattern = re.compile("|".join(map(re.escape, longest_first)))
        start = 0
        for match in self._special_pattern.finditer(text):
            if match.start() > start:
                yield text[start : match.start()], None
            yield match.group(), self._special_ids[match.group()]
            start = match.end()
        if start < len(text):
            yield text[start:], None

    def _segment_ids(self, text: str) -> list[int]:
        """The ids of a text without special tokens (unknown symbols become <unk> or go)."""
        unk = self.unk_id
        ids = []
        for piece in self.tokenize(text):
            token_id = self._ids.get(piece, unk)
            if token_id is not None:
                ids.append(token_id)
        return ids

    def _raise_on_unknown(self, text: str, offset: int) -> None:
        """Raise ValueError at the first piece of ``text`` outside the vocabulary."""
        position = offset
        for piece in self.tokenize(text):
            if piece not in self._ids:
                _unknown_error(piece, position)
            position += len(piece)

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        pad_to: int | None = None,
        unknown: str = "unk",
        allow_special: bool = False,
    ) -> EncodedBatch:
        """Encode several texts and pad them into one ``(B, n)`` array.

        Each text is encoded as by :meth:`encode` (with the same options) and
        padded at the end with the padding token's id.

        Parameters
        ----------
        texts : list of str
            The texts, ``B`` of them.
        add_bos, add_eos, unknown, allow_special
            As in :meth:`encode`.
        pad_to : int, optional
            The length ``n`` of every row; by default that of the longest
            encoded text. A text longer than ``pad_to`` raises
            :class:`ValueError` (nothing is cut off silently).

        Returns
        -------
        EncodedBatch
            ``ids`` ``(B, n)`` int64 and ``mask`` ``(B, n)`` bool, True at real tokens.
        """
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise TypeError(
                f"texts must be a list of str (use encode for one text), got {describe(texts)}"
            )
        texts = list(texts)
        for k, text in enumerate(texts):
            _check_text(text, f"texts[{k}]")
        if pad_to is not None:
            pad_to = positive_int(pad_to, "pad_to")
        pad_id = self._role_id("pad", "encode_batch")
        rows = [
            self.encode(
                t, add_bos=add_bos, add_eos=add_eos, unknown=unknown, allow_special=allow_special
            )
            for t in texts
        ]
        longest = max((len(r) for r in rows), default=0)
        width = longest if pad_to is None else pad_to
        if longest > width:
            k = next(k for k, r in enumerate(rows) if len(r) > width)
            raise ValueError(
                f"texts[{k}] encodes to {len(rows[k])} tokens, more than pad_to={width}"
                " (pass a larger pad_to, or None to pad to the longest text)"
            )
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)  # (B, n)
        mask = np.zeros((len(rows), width), dtype=bool)  # (B, n)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = row
            mask[b, : len(row)] = True
        return EncodedBatch(ids, mask)

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into token strings (symbols outside the vocabulary included)."""
        raise NotImplementedError

    def decode(self, ids: object, *, skip_special: bool = True) -> str:
        """The text of a sequence of ids, shape ``(n,)``.

        With ``skip_special`` (the default) the special tokens are dropped,
        except ``<unk>``, which shows as U+FFFD; otherwise every special token
        shows its name, e.g. ``<eos>``.
        """
        if isinstance(ids, list | tuple) and not ids:
            ids = np.zeros(0, dtype=np.int64)  # an empty list would come out as floats
        ids = token_ids(ids, "ids", self.vocab_size)
        if ids.ndim != 1:
            raise ValueError(f"ids must be one sequence of shape (n,), got shape {ids.shape}")
        parts: list[str] = []
        run: list[str] = []  # ordinary tokens since the last special token shown
        for i in ids.tolist():
            if i not in self._is_special:
                run.append(self._tokens[i])
                continue
            if skip_special and i != self.unk_id:
                continue
            parts.append(self._join(run))
            run = []
            parts.append(UNKNOWN_CHAR if skip_special else self._tokens[i])
        parts.append(self._join(run))
        return "".join(parts)

    def _join(self, pieces: list[str]) -> str:
        """The text of consecutive ordinary tokens."""
        return "".join(pieces)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"

    # ----------------------------------------------------------- saving
    kind = ""
    """The name :func:`tokenizer_from_dict` knows this class by."""

    def _arguments(self) -> dict[str, Any]:
        """The constructor's arguments as JSON-able values."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the tokenizer, as JSON-able values (with its ``kind``)."""
        return {"kind": self.kind, **self._arguments()}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` to ``path`` as JSON; :func:`load_tokenizer` reads it back."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")
        return path

    def __eq__(self, other: object) -> bool:
        """Equal when of the same class and rebuilt from the same arguments."""
        if not isinstance(other, Tokenizer):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def _unknown_error(symbol: str, position: int) -> None:
    raise ValueError(
        f"text contains {symbol!r} at position {position}, which is not in the"
        " vocabulary (pass unknown='unk' to map it to <unk>)"
    )


class CharTokenizer(Tokenizer):
    """One token per character of a fixed alphabet.

    Parameters
    ----------
    alphabet : str or list of str
        Distinct characters; the ``i``-th gets id ``4 + i``, so the order
        given is the order of the ids.

    Examples
    --------
    >>> tok = CharTokenizer("abc")
    >>> tok.encode("cab", add_eos=True).tolist()
    [6, 4, 5, 2]
    >>> tok.decode(tok.encode("cab"))
    'cab'
    """

    kind = "char"

    def __init__(self, alphabet: str | Iterable[str]) -> None:
        self.alphabet = _check_alphabet(alphabet)
        super().__init__(self.alphabet)

    def _arguments(self) -> dict[str, Any]:
        return {"alphabet": list(self.alphabet)}

    @classmethod
    def from_corpus(cls, corpus: str | Iterable[str]) -> CharTokenizer:
        """A tokenizer whose alphabet is every character of ``corpus``, sorted."""
        docs = _check_corpus(corpus)
        return cls(sorted(set().union(*docs)))

    def tokenize(self, text: str) -> list[str]:
        """The characters of ``text``."""
        return list(_check_text(text))


# For WordTokenizer: a run of letters/digits, or a single punctuation mark, each with
# the whitespace in front of it; a run of whitespace at the very end stands alone.
_WORD_OR_MARK = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


class WordTokenizer(Tokenizer):
    """One token per word or punctuation mark, from a vocabulary counted on a corpus.

    A token is a run of letters and digits, or a single punctuation mark, with
    the whitespace in front of it (so ``" river"`` and ``"river"`` are two
    tokens); concatenating the tokens gives back the text. A word the
    vocabulary lacks becomes ``<unk>`` as a whole: this is the weakness that
    subword tokenizers remove.

    Parameters
    ----------
    words : list of str
        The vocabulary, in id order (ids ``4, 5, ...``); distinct, non-empty.
    """

    def __init__(self, words: Iterable[str]) -> None:
        if isinstance(words, str) or not isinstance(words, Iterable):
            raise TypeError(f"words must be an iterable of str, got {describe(words)}")
        self.words = tuple(words)
        for w in self.words:
            if not isinstance(w, str) or not w:
                raise TypeError(f"words must hold non-empty strings, got {describe(w)}")
        repeated = sorted(w for w, n in Counter(self.words).items() if n > 1)
        if repeated:
            raise ValueError(f"words must not repeat, got {repeated[:10]} more than once")
        super().__init__(self.words)

    kind = "word"

    def _arguments(self) -> dict[str, Any]:
        return {"words": list(self.words)}

    @classmethod
    def from_corpus(cls, corpus: str | Iterable[str], *, min_count: int = 1) -> WordTokenizer:
        """The words of ``corpus`` seen at least ``min_count`` times, most frequent first.

        Ties in frequency are broken by the word's string, so the ids are deterministic.
        """
        docs = _check_corpus(corpus)
        min_count = positive_int(min_count, "min_count")
        counts = Counter(w for doc in docs for w in _WORD_OR_MARK.findall(doc))
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        return cls(w for w, n in ranked if n >= min_count)

    def tokenize(self, text: str) -> list[str]:
        """The words, punctuation marks and trailing whitespace of ``text``."""
        return _WORD_OR_MARK.findall(_check_text(text))


# ------------------------------------------------------------ pre-tokenization
# A word is a run of non-space characters with the whitespace in front of it; a
# run of whitespace at the very end is a word of its own. Concatenating the
# words gives back the text exactly.
_WORD = re.compile(r"\s*\S+|\s+")
# The same rule once spaces have become SPACE_SYMBOL: the symbol counts as whitespace.
_METASPACE_WORD = re.compile(rf"[\s{SPACE_SYMBOL}]*[^\s{SPACE_SYMBOL}]+|[\s{SPACE_SYMBOL}]+")
# What Python's \s matches in a str pattern (str.isspace): the same characters, spelled
# out, let tokenizer.json files carry the two rules above to another regex engine.
_PYTHON_SPACES = "".join(c for c in map(chr, range(0x3001)) if c.isspace())


def _byte_symbols() -> tuple[str, ...]:
    """GPT-2's printable character for each byte value, indexed by the byte.

    The bytes that print as themselves in Latin-1 (``!`` to ``~``, ``¡`` to
    ``¬``, ``®`` to ``ÿ``) keep their character; the other 68 (controls,
    space, DEL, no-break space, soft hyphen) take U+0100, U+0101, ... in the
    order of their values, so the space byte shows as ``Ġ`` and newline as ``Ċ``.
    """
    keeps_itself = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    symbols, moved = [], 0
    for byte in range(256):
        if byte in keeps_itself:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(0x100 + moved))
            moved += 1
    return tuple(symbols)


BYTE_SYMBOLS = _byte_symbols()
"""The character that stands for each byte value with ``pretokenize="bytes"`` (GPT-2's map)."""
BYTE_ALPHABET = tuple(sorted(BYTE_SYMBOLS))
"""The 256 byte symbols sorted by code point, which is the order of GPT-2's ids and of the base alphabet."""
_BYTE_SYMBOL_SET = frozenset(BYTE_SYMBOLS)
_SYMBOL_OF_LATIN1 = str.maketrans({chr(b): s for b, s in enumerate(BYTE_SYMBOLS)})
_LATIN1_OF_SYMBOL = str.maketrans({s: chr(b) for b, s in enumerate(BYTE_SYMBOLS)})


def _text_to_byte_symbols(text: str) -> str:
    """The UTF-8 bytes of ``text`` as byte symbols.

    A lone surrogate takes the 3 bytes that would encode it (Python's
    ``"surrogatepass"``), so every str has bytes.
    """
    return text.encode("utf-8", "surrogatepass").decode("latin-1").translate(_SYMBOL_OF_LATIN1)


_SURROGATEPASS = codecs.lookup_error("surrogatepass")


def _surrogate_or_replacement(error: UnicodeError) -> tuple[str, int]:
    """Decoding error handler: a lone surrogate's 3 bytes give it back, other bad bytes U+FFFD."""
    try:
        return _SURROGATEPASS(error)
    except UnicodeDecodeError:
        return codecs.replace_errors(error)


_BYTES_ERRORS = "tinyformer.surrogate_or_replacement"
codecs.register_error(_BYTES_ERRORS, _surrogate_or_replacement)


def _byte_symbols_to_text(symbols: str) -> str:
    """Inverse of :func:`_text_to_byte_symbols`; bytes that are not UTF-8 become U+FFFD."""
    return symbols.translate(_LATIN1_OF_SYMBOL).encode("latin-1").decode("utf-8", _BYTES_ERRORS)


# Unicode's White_Space characters: what \s matches in Oniguruma, the regex engine inside
# Hugging Face's tokenizers (Python's \s also matches U+001C to U+001F, which are not).
_WHITE_SPACE = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# No letter or number lies above this code point (plane 3 holds the last CJK ideographs;
# planes 4 to 13 are unassigned, 14 holds tags and variation selectors, 15 and 16 are
# private use); a test checks it against the whole of unicodedata.
_LAST_LETTER_OR_NUMBER = 0x3FFFF


def _category_class(major: str) -> str:
    r"""The characters of general category ``major`` (``"L"`` or ``"N"``) as ``re`` ranges."""
    ranges: list[list[int]] = []
    for code in range(_LAST_LETTER_OR_NUMBER + 1):
        if unicodedata.category(chr(code))[0] == major:
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return "".join(rf"\U{lo:08x}" if lo == hi else rf"\U{lo:08x}-\U{hi:08x}" for lo, hi in ranges)


def gpt2_split(text: str) -> list[str]:
    r"""Cut ``text`` into pieces by GPT-2's pre-tokenization rule, emulated with Python's ``re``.

    GPT-2 :cite:p:`radford2019language` cuts text into pieces with
    ``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``:
    the English contractions; a run of letters, a run of digits or a run of
    other symbols, each with at most one space in front; and whitespace, whose
    last space stays for the word that follows (``\s+(?!\S)`` backs off one
    character when a non-space follows). No merge crosses a piece's edges.

    Python's ``re`` has no ``\p{L}`` (letters, general category L*) or
    ``\p{N}`` (numbers, N*), so the classes are spelled out from
    ``unicodedata``, and ``\s`` as Unicode's White_Space characters, which
    is what Oniguruma (the engine inside Hugging Face's ``tokenizers``)
    matches; Python's own ``\s`` would add U+001C to U+001F. What can still
    differ from ``tokenizers``' ByteLevel pre-tokenizer is the Unicode version:
    a character that Python's ``unicodedata.unidata_version`` does not
    know yet (14.0 in Python 3.11) but Oniguruma's tables do is a letter or
    number there and an "other symbol" here. Lone surrogates, which a Python
    str may hold and a Rust string may not, count as other symbols.

    The pattern is built on first use (about 0.1 s) and kept. Concatenating
    the pieces gives back ``text``.

    Examples
    --------
    >>> gpt2_split("It's 2024:  café!")
    ['It', "'s", ' 2024', ':', ' ', ' café', '!']
    """
    return _gpt2_pattern().findall(_check_text(text))


@functools.cache
def _gpt2_pattern() -> re.Pattern[str]:
    """The compiled pattern of :func:`gpt2_split`."""
    letters, numbers = _category_class("L"), _category_class("N")
    return re.compile(
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+"
        rf"| ?[^{_WHITE_SPACE}{letters}{numbers}]+|[{_WHITE_SPACE}]+(?![^{_WHITE_SPACE}])"
        rf"|[{_WHITE_SPACE}]+"
    )


def _pretokenize(text: str, pretokenize: str, name: str = "text") -> list[str]:
    """The words of ``text`` as strings of base symbols, for the given ``pretokenize``."""
    if pretokenize == "words":
        return _WORD.findall(text)
    if pretokenize == "bytes":
        return [_text_to_byte_symbols(piece) for piece in _gpt2_pattern().findall(text)]
    if SPACE_SYMBOL in text:
        raise ValueError(
            f"{name} contains {SPACE_SYMBOL!r} (U+2581), which pretokenize='metaspace' uses"
            " to stand for a space, so it could not be decoded back; remove it or use"
            " pretokenize='words'"
        )
    return _METASPACE_WORD.findall(text.replace(" ", SPACE_SYMBOL))


def _merge_pair(word: Sequence[str], pair: tuple[str, str], *, every: bool = True) -> list[str]:
    """Replace the occurrences of ``pair`` in ``word``, left to right, by its concatenation.

    With ``every=False`` only the first (leftmost) occurrence is replaced.
    """
    left, right = pair
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            out.append(left + right)
            i += 2
            if not every:
                return out + list(word[i:])
        else:
            out.append(word[i])
            i += 1
    return out


@dataclass(frozen=True)
class MergeStep:
    r"""One merge made by :meth:`BPETokenizer.train`, as it was chosen.

    Attributes
    ----------
    rank : int
        Position in the list of merges (0 for the first).
    pair : tuple of str
        The two adjacent tokens ``(left, right)`` that were merged.
    count : int
        How often the pair occurred over the corpus's words when it was chosen.
    score : float
        The value training maximized: ``count`` for ``score="frequency"``;
        :math:`n_{ab} / (n_a\, n_b)` for ``score="pmi"``, with :math:`n_a`
        and :math:`n_b` the counts of the two tokens in the corpus at that moment.
    n_tokens : int
        Number of tokens in the training corpus after this merge.
    """

    rank: int
    pair: tuple[str, str]
    count: int
    score: float
    n_tokens: int

    @property
    def token(self) -> str:
        """The new token, ``left + right``."""
        return self.pair[0] + self.pair[1]


_SHIFT = 32  # a pair of token numbers (a, b) is kept as the one integer a << 32 | b
_LOW = (1 << _SHIFT) - 1


class _PairCounts:
    """Frequencies of adjacent token pairs over a weighted list of words, kept up to date.

    Tokens are numbers (``strings[t]`` is token ``t``'s text) and a pair ``(a, b)``
    is the integer ``a << 32 | b``. For each pair the counts hold its number of
    occurrences (weighted by the words' counts) and the words it occurs in, so a
    merge visits only those words and changes only the counts of the pairs next to
    each occurrence. A heap hands out the most frequent pair; an entry whose count
    has changed since it was pushed is pushed again with the new count when it
    comes up (lazy deletion), so the heap is never searched. Equal counts go to the
    pair whose ``(left, right)`` strings come first (``ties="strings"``) or whose
    token numbers do (``ties="ids"``).
    """

    def __init__(
        self,
        words: list[list[int]],
        weights: list[int],
        strings: list[str],
        *,
        ties: str,
        count_tokens: bool,
    ) -> None:
        self.words, self.weights, self.strings, self.ties = words, weights, strings, ties
        self.count: defaultdict[int, int] = defaultdict(int)
        self.where: defaultdict[int, set[int]] = defaultdict(set)
        # occurrences of each token, for the pmi score only
        self.units: Counter[int] | None = Counter() if count_tokens else None
        for i, word in enumerate(words):
            n = weights[i]
            for a, b in itertools.pairwise(word):
                key = a << _SHIFT | b
                self.count[key] += n
                self.where[key].add(i)
            if self.units is not None:
                for t in word:
                    self.units[t] += n
        self.n_tokens = sum(len(w) * n for w, n in zip(words, weights, strict=True))
        self.heap = [self._entry(key, n) for key, n in self.count.items()]
        heapq.heapify(self.heap)

    def _entry(self, key: int, n: int) -> tuple:
        """The heap entry of pair ``key`` seen ``n`` times: smallest is best."""
        if self.ties == "ids":
            return (-n, key)
        return (-n, self.strings[key >> _SHIFT], self.strings[key & _LOW], key)

    def pair(self, key: int) -> tuple[int, int]:
        """The two token numbers of pair ``key``."""
        return key >> _SHIFT, key & _LOW

    def most_frequent(self) -> tuple[int, int] | None:
        """The most frequent pair and its count, or None when no pair is left."""
        while self.heap:
            entry = heapq.heappop(self.heap)
            key, n = entry[-1], -entry[0]
            current = self.count.get(key, 0)
            if current == n:
                return key, n
            if current > 0:  # stale: its count has changed since it was pushed
                heapq.heappush(self.heap, self._entry(key, current))
        return None

    def pmi(self, key: int) -> float:
        r"""The pair's count over the product of its parts' counts, :math:`n_{ab}/(n_a n_b)`."""
        a, b = self.pair(key)
        return self.count[key] / (self.units[a] * self.units[b])

    def highest_pmi(self, min_frequency: int) -> tuple[int, int] | None:
        """The pair seen at least ``min_frequency`` times with the highest :meth:`pmi`.

        Ties go to the more frequent pair, then by the tie rule. The score of a
        pair changes whenever either part's count does, so every pair is scored
        again at every merge.
        """
        candidates = [key for key, n in self.count.items() if n >= min_frequency]
        if not candidates:
            return None
        best = min(candidates, key=lambda k: (-self.pmi(k), *self._entry(k, self.count[k])))
        return best, self.count[best]

    def merge(self, key: int, new: int) -> None:
        """Merge pair ``key`` into token ``new`` in every word that holds it; update the counts.

        As the occurrences are replaced left to right, an occurrence with token
        ``p`` before it turns the pair ``(p, a)`` into ``(p, new)``, and one with
        ``q`` after it turns ``(b, q)`` into ``(new, q)``; nothing else changes.
        """
        a, b = self.pair(key)
        count, where, grown = self.count, self.where, set()
        for i in self.where.pop(key, ()):
            word, n = self.words[i], self.weights[i]
            out: list[int] = []
            k, length, merged = 0, len(word), 0
            while k < length:
                if word[k] == a and k + 1 < length and word[k + 1] == b:
                    if out:  # the token before, possibly made by this merge a moment ago
                        p = out[-1]
                        count[p << _SHIFT | a] -= n
                        grown.add(p << _SHIFT | new)
                        count[p << _SHIFT | new] += n
                        where[p << _SHIFT | new].add(i)
                    if k + 2 < length:
                        q = word[k + 2]
                        count[b << _SHIFT | q] -= n
                        grown.add(new << _SHIFT | q)
                        count[new << _SHIFT | q] += n
                        where[new << _SHIFT | q].add(i)
                    out.append(new)
                    merged += 1
                    k += 2
                else:
                    out.append(word[k])
                    k += 1
            if merged:
                self.words[i] = out
                self.n_tokens -= merged * n
                if self.units is not None:
                    self.units[a] -= merged * n
                    self.units[b] -= merged * n
                    self.units[new] += merged * n
        self.count.pop(key, None)
        for g in grown:
            if count[g] > 0:
                heapq.heappush(self.heap, self._entry(g, count[g]))


class BPETokenizer(Tokenizer):
    r"""Byte-pair encoding over a character alphabet or over the UTF-8 bytes of the text.

    As in :cite:t:`sennrich2016neural`, training starts from single characters and repeatedly merges the most
    frequent adjacent pair of tokens into a new token, until the vocabulary
    holds ``vocab_size`` ids. Encoding replays the merges: in each word, the
    adjacent pair that was learned earliest is merged, until no learned pair
    is left.

    Text is first split into words (a run of non-space characters with the
    whitespace in front of it, as in GPT-2 :cite:p:`radford2019language`), and
    no merge crosses a word boundary; concatenating the tokens always gives
    back the text, so ``decode(encode(text)) == text`` for every text made of
    the alphabet's characters.

    **Unknown symbols.** With ``pretokenize="words"`` or ``"metaspace"`` the
    base alphabet is a set of characters (those of the training corpus, or one
    given explicitly): a character outside it is encoded as ``<unk>`` (or
    raises, with ``unknown="raise"``). This keeps the vocabularies of the book
    small and the merges readable.

    **Spaces as a symbol.** With ``pretokenize="metaspace"`` every space is
    replaced by the visible symbol ``"\u2581"`` (:data:`SPACE_SYMBOL`) before
    splitting into words, so the symbol starts the word that follows it and
    tokens look like ``"\u2581river"``, as in SentencePiece
    :cite:p:`kudo2018sentencepiece`; :meth:`decode` turns the symbol back into
    spaces. Unlike SentencePiece, no symbol is added in front of the text and
    runs of spaces are kept, so the round trip is exact.

    **Bytes.** With ``pretokenize="bytes"`` the base alphabet is the 256 byte
    values, as in GPT-2 :cite:p:`radford2019language`: a text is cut into
    pieces by GPT-2's rule (:func:`gpt2_split`), each piece is written as its
    UTF-8 bytes, and merges join bytes. Every byte has a token, so no text is
    ever unknown and ``decode(encode(text)) == text`` for every str. A byte is
    shown by GPT-2's printable character for it (:data:`BYTE_SYMBOLS`: ``Ġ``
    for the space, ``Ċ`` for a newline), so tokens read like ``"Ġriver"`` and
    are the strings of Hugging Face's ByteLevel BPE; the alphabet is in the
    order of GPT-2's ids (:data:`BYTE_ALPHABET`). A lone surrogate (a str may
    hold one, UTF-8 may not) is written as the three bytes that would encode
    it, so it too comes back; :meth:`decode` turns bytes that are not UTF-8
    (which a model can produce) into U+FFFD, as ``tokenizers`` does.

    Parameters
    ----------
    alphabet : str or list of str, optional
        The base characters, in id order (ids ``4, 5, ...``). With
        ``pretokenize="metaspace"`` a space in it stands for :data:`SPACE_SYMBOL`.
        Required, except with ``pretokenize="bytes"``, where it defaults to
        the 256 byte symbols (:data:`BYTE_ALPHABET`).
    merges : list of (str, str)
        The learned merges in order; each side must be a token that exists
        when the merge is made. Usually made by :meth:`train`.
    pretokenize : str
        ``"words"`` (a word keeps the whitespace in front of it),
        ``"metaspace"`` (spaces become :data:`SPACE_SYMBOL` first) or
        ``"bytes"`` (GPT-2's pieces, written in bytes).
    special_tokens : list of str, optional
        The names of the four reserved ids (padding, beginning of sequence,
        end of sequence, unknown), then any extra special tokens, which take
        the ids after them; see :class:`Tokenizer`.
    vocab : list of str, optional
        An explicit id order, for a vocabulary read from a ``tokenizer.json``
        whose ids are laid out otherwise (:meth:`from_hf_json`).
    ignore_merges : bool
        Encode a word that is itself a token as that token without replaying
        the merges, as ``tokenizers`` does with its option of that name
        (:meth:`from_hf_json` sets it from the file).
    """

    def __init__(
        self,
        alphabet: str | Iterable[str] | None = None,
        merges: Iterable[tuple[str, str]] = (),
        *,
        pretokenize: str = "words",
        special_tokens: Sequence[str | None] = SPECIAL_TOKENS,
        vocab: Sequence[str] | None = None,
        ignore_merges: bool = False,
    ) -> None:
        self.pretokenize = one_of(pretokenize, PRETOKENIZERS, "pretokenize")
        self.alphabet = self._base_alphabet(alphabet, pretokenize)
        if not isinstance(ignore_merges, bool):
            raise TypeError(f"ignore_merges must be a bool, got {describe(ignore_merges)}")
        self.ignore_merges = ignore_merges
        if isinstance(merges, str) or not isinstance(merges, Iterable):
            raise TypeError(f"merges must be a list of (str, str) pairs, got {describe(merges)}")
        symbols = list(self.alphabet)
        known = set(symbols)
        self._ranks: dict[tuple[str, str], int] = {}
        self._makes_new: set[int] = set()  # the ranks of the merges that first make their token
        self._merges: list[tuple[str, str]] = []
        for rank, merge in enumerate(merges):
            pair = self._check_merge(merge, rank, known)
            self._merges.append(pair)
            self._ranks.setdefault(pair, rank)
            if pair[0] + pair[1] not in known:
                known.add(pair[0] + pair[1])
                symbols.append(pair[0] + pair[1])
                self._makes_new.add(rank)
        self._trace: list[MergeStep] | None = None
        self._cache: dict[str, list[str]] = {}
        self._in_alphabet = frozenset(self.alphabet)
        super().__init__(symbols, special_tokens=special_tokens, vocab=vocab)

    @staticmethod
    def _base_alphabet(alphabet: object, pretokenize: str) -> tuple[str, ...]:
        if pretokenize == "bytes":
            if alphabet is None:
                return BYTE_ALPHABET
            symbols = _check_alphabet(alphabet)
            outside = [s for s in symbols if s not in _BYTE_SYMBOL_SET]
            if outside:
                raise ValueError(
                    "with pretokenize='bytes' the alphabet must hold byte symbols"
                    f" (BYTE_SYMBOLS), got {outside[:10]}"
                )
            return symbols
        if alphabet is None:
            raise TypeError(
                f"alphabet is required with pretokenize={pretokenize!r} (only 'bytes' has a"
                " fixed alphabet)"
            )
        symbols = _check_alphabet(alphabet)
        if pretokenize == "metaspace":
            symbols = _check_alphabet(SPACE_SYMBOL if s == " " else s for s in symbols)
        return symbols

    @staticmethod
    def _check_merge(merge: object, rank: int, known: set[str]) -> tuple[str, str]:
        if not (
            isinstance(merge, tuple | list)
            and len(merge) == 2
            and all(isinstance(s, str) for s in merge)
        ):
            raise TypeError(f"merges[{rank}] must be a pair of str, got {describe(merge)}")
        for side in merge:
            if side not in known:
                raise ValueError(
                    f"merges[{rank}] = {tuple(merge)!r} uses {side!r}, which is neither in the"
                    " alphabet nor made by an earlier merge"
                )
        return merge[0], merge[1]

    @classmethod
    def train(
        cls,
        corpus: str | Iterable[str],
        vocab_size: int,
        *,
        alphabet: str | Iterable[str] | None = None,
        min_frequency: int = 2,
        score: str = "frequency",
        pretokenize: str = "words",
        ties: str = "strings",
        special_tokens: Sequence[str] = SPECIAL_TOKENS,
    ) -> BPETokenizer:
        r"""Learn merges from ``corpus`` until the vocabulary has ``vocab_size`` ids.

        Each step merges the adjacent pair :math:`(a, b)` with the highest score:

        .. math:: \text{frequency: } n_{ab}, \qquad
                  \text{pmi: } \frac{n_{ab}}{n_a\, n_b},

        where :math:`n_{ab}` counts the pair and :math:`n_a`, :math:`n_b` the
        two tokens in the corpus as currently segmented. The first is byte-pair
        encoding :cite:p:`sennrich2016neural`. The second ranks pairs as
        their pointwise mutual information does (Church and Hanks, 1990), the
        log of p(ab) / (p(a) p(b)): with the probabilities estimated by counts
        over the N tokens of the corpus, that ratio is N times the score, and N
        is the same for every pair of a step, so the order is the same. It prefers pairs whose parts
        rarely occur apart, however rare they are. It is the merge score
        commonly given for WordPiece :cite:p:`schuster2012japanese,wu2016google`,
        but merging by it is not WordPiece, which marks continuations with
        ``##`` and encodes by greedy longest match; that tokenizer is
        :class:`~tinyformer.data.wordpiece.WordPieceTokenizer`. (This option was
        called ``score="wordpiece"`` before.)

        Parameters
        ----------
        corpus : str or list of str
            Training text (one string, or several documents).
        vocab_size : int
            Target number of ids: the special tokens + the alphabet + the
            merged tokens. Training stops earlier if no pair occurs
            ``min_frequency`` times.
        alphabet : str or list of str, optional
            The base characters; defaults to the corpus's characters, sorted.
            Every character of the corpus must belong to it. Not with
            ``pretokenize="bytes"``, whose alphabet is the 256 byte values.
        min_frequency : int
            A pair seen fewer times than this is never merged (whatever its score).
        score : str
            ``"frequency"`` or ``"pmi"``, as above.
        pretokenize : str
            ``"words"``, ``"metaspace"`` (spaces become :data:`SPACE_SYMBOL`)
            or ``"bytes"``, as in the class description.
        ties : str
            How two pairs with the same score (and, for ``"pmi"``, the same
            count) are ordered. ``"strings"``: the pair whose ``(left,
            right)`` strings come first in code-point order, the book's rule.
            ``"ids"``: the pair whose ``(left, right)`` ids come first, so the
            older tokens win; this is the rule of the ``BpeTrainer`` of
            Hugging Face's ``tokenizers``, whose queue orders equal counts by
            the pair of ids. Its ids are laid out as ours (special tokens,
            then the alphabet in code-point order, then each new token), so
            on the same corpus, with the same ``vocab_size``, special tokens
            and ``min_frequency`` (and, for bytes, ``initial_alphabet`` set to
            all 256 bytes and the ByteLevel pre-tokenizer), training with
            ``ties="ids"`` learns the same merges.
        special_tokens : list of str, optional
            The names of the reserved ids and any extra special tokens, as in
            the class description; the corpus is read as plain text, even
            where it holds their names.

        Returns
        -------
        BPETokenizer
            Its :attr:`merges` lists the learned pairs in order, :attr:`trace`
            each merge with its count, score and the corpus's length after it,
            and :attr:`merge_counts` the counts alone. With either tie rule
            training is deterministic and ignores the order of the documents.
        """
        docs = _check_corpus(corpus)
        if score == "wordpiece":
            raise ValueError(
                "score='wordpiece' is now called score='pmi': it ranks pairs by"
                " n_ab / (n_a n_b), WordPiece's usual merge score, but merging by it is not"
                " WordPiece; true WordPiece (## continuations, greedy longest-match"
                " encoding) is tinyformer.data.wordpiece.WordPieceTokenizer"
            )
        score = one_of(score, MERGE_SCORES, "score")
        ties = one_of(ties, TIE_RULES, "ties")
        pretokenize = one_of(pretokenize, PRETOKENIZERS, "pretokenize")
        special_tokens = _check_special_tokens(special_tokens, roles_may_be_absent=False)
        word_counts: Counter[str] = Counter()
        for doc in docs:
            word_counts.update(_pretokenize(doc, pretokenize, "corpus"))
        base = cls._training_alphabet(word_counts, alphabet, pretokenize)
        vocab_size = positive_int(vocab_size, "vocab_size")
        smallest = len(special_tokens) + len(base)
        if vocab_size < smallest:
            raise ValueError(
                f"vocab_size must be at least {smallest} ({len(special_tokens)} special tokens +"
                f" {len(base)} base characters), got {vocab_size}"
            )
        min_frequency = positive_int(min_frequency, "min_frequency")
        strings = list(base)  # token number -> its text; merged tokens are appended
        number = {s: t for t, s in enumerate(strings)}
        pairs = _PairCounts(
            [[number[s] for s in w] for w in word_counts],
            list(word_counts.values()),
            strings,
            ties=ties,
            count_tokens=score == "pmi",
        )
        trace: list[MergeStep] = []
        while len(number) < vocab_size - len(special_tokens):
            best = (
                pairs.most_frequent() if score == "frequency" else pairs.highest_pmi(min_frequency)
            )
            if best is None or best[1] < min_frequency:
                break
            key, count = best
            value = float(count) if score == "frequency" else pairs.pmi(key)
            a, b = pairs.pair(key)
            token = strings[a] + strings[b]
            if token not in number:
                number[token] = len(strings)
                strings.append(token)
            pairs.merge(key, number[token])
            trace.append(
                MergeStep(len(trace), (strings[a], strings[b]), count, value, pairs.n_tokens)
            )
        tokenizer = cls(
            base,
            [step.pair for step in trace],
            pretokenize=pretokenize,
            special_tokens=special_tokens,
        )
        tokenizer._trace = trace
        return tokenizer

    @staticmethod
    def _training_alphabet(
        word_counts: Counter[str], alphabet: object, pretokenize: str
    ) -> tuple[str, ...]:
        if pretokenize == "bytes":
            if alphabet is not None:
                raise ValueError(
                    "alphabet must be None with pretokenize='bytes', whose alphabet is the"
                    f" 256 byte values; got {describe(alphabet)}"
                )
            return BYTE_ALPHABET
        seen = set().union(*word_counts)
        if alphabet is not None and pretokenize == "metaspace":
            alphabet = [SPACE_SYMBOL if s == " " else s for s in _check_alphabet(alphabet)]
        base = _check_alphabet(sorted(seen) if alphabet is None else alphabet)
        outside = sorted(seen - set(base))
        if outside:
            raise ValueError(f"corpus contains characters outside the alphabet: {outside[:10]}")
        return base

    @property
    def merges(self) -> list[tuple[str, str]]:
        """The learned merges, first learned first."""
        return list(self._merges)

    kind = "bpe"

    def _arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "alphabet": list(self.alphabet),
            "merges": [list(pair) for pair in self._merges],
            "pretokenize": self.pretokenize,
        }
        if self.special_tokens != SPECIAL_TOKENS:
            arguments["special_tokens"] = list(self.special_tokens)
        if self._vocab_given:
            arguments["vocab"] = list(self.tokens)
        if self.ignore_merges:
            arguments["ignore_merges"] = True
        return arguments

    @property
    def merge_counts(self) -> list[int] | None:
        """How often each merged pair occurred when training chose it (None if not trained).

        A count is the number of adjacent occurrences over the corpus's words,
        so a run ``aaa`` holds the pair ``(a, a)`` twice though one merge
        replaces only one of them.
        """
        return None if self._trace is None else [step.count for step in self._trace]

    @property
    def trace(self) -> list[MergeStep] | None:
        """Every merge of training, in order, with its count and score (None if not trained)."""
        return None if self._trace is None else list(self._trace)

    def tokenize(self, text: str, *, n_merges: int | None = None) -> list[str]:
        """Split ``text`` into token strings, using the first ``n_merges`` merges (default all).

        Characters outside the alphabet come out as themselves (``encode``
        turns them into ``<unk>``; a vocabulary without an unknown token,
        read from elsewhere, leaves them out, as ``tokenizers`` does). Growing
        ``n_merges`` from 0 shows the segmentation coarsen merge by merge.
        With ``pretokenize="metaspace"`` the spaces of ``text`` come out as
        :data:`SPACE_SYMBOL`; with ``"bytes"`` the tokens are strings of byte
        symbols (:data:`BYTE_SYMBOLS`).
        """
        text = _check_text(text)
        if n_merges is None:
            limit = len(self._merges)
        else:
            if isinstance(n_merges, bool) or not isinstance(n_merges, int):
                raise TypeError(f"n_merges must be an integer or None, got {describe(n_merges)}")
            if not 0 <= n_merges <= len(self._merges):
                raise ValueError(f"n_merges must be in [0, {len(self._merges)}], got {n_merges}")
            limit = n_merges
        pieces: list[str] = []
        for word in _pretokenize(text, self.pretokenize):
            if self.ignore_merges and limit == len(self._merges) and word in self._ids:
                pieces.append(word)
                continue
            if self.unk_id is None and not self._in_alphabet.issuperset(word):
                known = "".join(s for s in word if s in self._in_alphabet)
                pieces.extend(self._segment(known, limit))
            else:
                pieces.extend(self._segment(word, limit))
        return pieces

    def _raise_on_unknown(self, text: str, offset: int) -> None:
        for k, char in enumerate(text):
            if self.pretokenize == "bytes":
                symbols = _text_to_byte_symbols(char)
            else:
                symbols = SPACE_SYMBOL if self.pretokenize == "metaspace" and char == " " else char
            if not self._in_alphabet.issuperset(symbols):
                _unknown_error(char, offset + k)

    def decode(self, ids: object, *, skip_special: bool = True) -> str:
        """The text of a sequence of ids, shape ``(n,)``.

        :data:`SPACE_SYMBOL` becomes a space again; with ``pretokenize="bytes"``
        the bytes of consecutive tokens are read together as UTF-8, so a
        character split across tokens comes back whole, and bytes that are not
        UTF-8 show as U+FFFD. See :meth:`Tokenizer.decode` for ``skip_special``.
        """
        return super().decode(ids, skip_special=skip_special)

    def _join(self, pieces: list[str]) -> str:
        """Concatenate tokens; spaces come back from :data:`SPACE_SYMBOL`, text from bytes."""
        text = "".join(pieces)
        if self.pretokenize == "bytes":
            return _byte_symbols_to_text(text)
        return text.replace(SPACE_SYMBOL, " ") if self.pretokenize == "metaspace" else text

    def _segment(self, word: str, limit: int) -> list[str]:
        """Apply the merges of rank below ``limit`` to one word, earliest learned first."""
        full = limit == len(self._merges)
        if full and word in self._cache:
            return list(self._cache[word])
        pieces = list(word)
        never = len(self._merges)
        while len(pieces) > 1:
            pair = min(itertools.pairwise(pieces), key=lambda p: self._ranks.get(p, never))
            rank = self._ranks.get(pair, never)
            if rank >= limit:
                break
            # A token that an earlier merge already made from other parts may begin
            # pairs that rank before this one: then merge only the leftmost occurrence
            # and look again (what Hugging Face's tokenizers does for every merge).
            pieces = _merge_pair(pieces, pair, every=rank in self._makes_new)
        if full:
            self._cache[word] = list(pieces)
        return pieces

    # ------------------------------------------------ Hugging Face's tokenizer.json
    def to_hf_json(self) -> dict[str, Any]:
        r"""Write the tokenizer as the contents of a ``tokenizer.json`` file of Hugging Face's ``tokenizers``.

        ``tokenizers.Tokenizer.from_str(json.dumps(d))`` reads the result, and
        encodes every text to the ids :meth:`Tokenizer.encode` gives with
        ``allow_special=True`` (``tokenizers`` always recognizes the special
        tokens' names) and no ``<bos>``/``<eos>`` (which tinyformer adds per
        call); its ``decode`` gives our :meth:`decode`. The ids keep their
        layout. Each way of pre-tokenizing is written exactly:

        - ``"bytes"``: the ByteLevel pre-tokenizer (GPT-2's rule, no prefix
          space) and decoder, as in GPT-2's own file. Exact for every text
          (see :func:`gpt2_split` for the Unicode version).
        - ``"words"``: a Split pre-tokenizer with our word rule, Python's
          ``\s`` spelled out as the characters it matches, and the Fuse
          decoder (concatenation).
        - ``"metaspace"``: a Replace normalizer (space to :data:`SPACE_SYMBOL`),
          the same Split on the symbol too, and a decoder that turns the
          symbol back into spaces before concatenating. A text holding
          :data:`SPACE_SYMBOL` itself, which :meth:`Tokenizer.encode` refuses, is
          encoded by ``tokenizers`` as if it held a space.

        Two differences remain outside these: ``decode`` there drops
        ``<unk>`` (a special token) where ours shows U+FFFD, and for bytes
        that encode a lone surrogate ours gives the surrogate back where
        ``tokenizers`` gives three U+FFFD.

        The file has no field for the role a special token plays, so each
        added token that plays one carries a ``"tinyformer_role"`` entry
        (``"pad"``, ``"bos"``, ``"eos"`` or ``"unk"``), which ``tokenizers``
        and ``transformers`` ignore and :meth:`from_hf_json` reads: the
        roles come back whatever the tokens are called. (``tokenizers``
        drops the entry when it saves the file again; then only the default
        names, a ``tokenizer_config.json`` or ``special_tokens=`` give the
        roles.)

        Raises
        ------
        ValueError
            If the file could not say the same thing: a special token's name
            is also an ordinary token (the file has one id per string), or a
            pair is merged twice.
        """
        names = set(self._special_ids)
        clash = sorted(names & self._ids.keys())
        if clash:
            raise ValueError(
                f"cannot write a tokenizer.json: the special tokens {clash} are also ordinary"
                " tokens of the vocabulary, and the file gives each string one id; rename them"
                " with special_tokens"
            )
        repeated = sorted(p for p, n in Counter(self._merges).items() if n > 1)
        if repeated:
            raise ValueError(f"cannot write a tokenizer.json: merges repeat {repeated[:5]}")
        added = _hf_added_tokens(self)
        model = {
            "type": "BPE",
            "dropout": None,
            "unk_token": self.special_tokens[3],
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": self.ignore_merges,
            "vocab": {token: i for i, token in enumerate(self._tokens)},
            "merges": [list(pair) for pair in self._merges],
        }
        normalizer, pre_tokenizer, decoder = _hf_pipeline(self.pretokenize)
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": None,
            "decoder": decoder,
            "model": model,
        }

    @classmethod
    def from_hf_json(
        cls,
        d: Mapping[str, Any],
        *,
        special_tokens: Sequence[str | None] | None = None,
        tokenizer_config: Mapping[str, Any] | None = None,
    ) -> BPETokenizer:
        """Read the contents of a ``tokenizer.json`` file holding a BPE model.

        Reads the files :meth:`to_hf_json` writes and those that
        ``tokenizers`` writes for a byte-level BPE (the ByteLevel
        pre-tokenizer without prefix space and the ByteLevel decoder, as
        ``ByteLevelBPETokenizer`` or GPT-2's file has), with their ids as they
        are: the result encodes every text as ``tokenizers`` does with that
        file (with ``allow_special=True``). Anything else is refused by name:
        another normalizer, pre-tokenizer, post-processor or decoder,
        truncation or padding settings, dropout, continuing-subword prefixes
        or end-of-word suffixes, byte fallback, added tokens that are not
        special or that strip spaces.

        Parameters
        ----------
        d : dict
            The parsed JSON.
        special_tokens : list of str or None, optional
            The names of the padding, beginning, end and unknown tokens (None
            where the file has none); the file's other special tokens follow
            as extras. By default each role goes to a special token only on
            evidence (see :func:`load_tokenizer`), never by its id.
        tokenizer_config : dict, optional
            The parsed ``tokenizer_config.json`` that sits next to the file:
            its ``pad_token``, ``bos_token``, ``eos_token`` and ``unk_token``
            (strings, or dicts with a ``"content"``) name the roles. Ignored
            when ``special_tokens`` is given.
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"d must be a dict read from a tokenizer.json, got {describe(d)}")
        model = d.get("model")
        if not isinstance(model, Mapping) or model.get("type") != "BPE":
            kind = model.get("type") if isinstance(model, Mapping) else None
            raise ValueError(f"tokenizer.json holds a {kind!r} model; BPETokenizer reads 'BPE'")
        pretokenize = _hf_pretokenize(d)
        _check_hf_model(model)
        tokens, specials, recorded = _hf_tokens(d, model)
        merges = _hf_merges(model["merges"])
        single = [t for t in tokens if t not in specials and len(t) == 1]
        unk = model.get("unk_token")
        if unk is not None and unk not in specials:
            raise ValueError(f"tokenizer.json's unk_token {unk!r} is not a special added token")
        # Without an unk_token, tokenizers leaves unknown symbols out; a role for <unk> would
        # change that, unless the alphabet holds every byte and nothing can be unknown.
        unk_unused = unk is None and pretokenize == "bytes" and len(single) == len(BYTE_SYMBOLS)
        roles = _hf_roles(
            special_tokens,
            specials,
            unk,
            recorded=recorded,
            config=tokenizer_config,
            unk_unused=unk_unused,
        )
        names = (*roles, *(s for s in specials if s not in roles))
        options = {"pretokenize": pretokenize, "ignore_merges": bool(model.get("ignore_merges"))}
        if None not in roles:
            native = cls(single, merges, special_tokens=names, **options)
            if native.tokens == tokens:
                return native
        return cls(single, merges, special_tokens=names, vocab=tokens, **options)


def _hf_split_pattern(pretokenize: str) -> str:
    r"""Our word rule in the regex syntax of tokenizers' Split, with ``\s`` spelled out."""
    spaces = _PYTHON_SPACES + (SPACE_SYMBOL if pretokenize == "metaspace" else "")
    return f"[{spaces}]*[^{spaces}]+|[{spaces}]+"


def _hf_pipeline(pretokenize: str) -> tuple[Any, Any, Any]:
    """The normalizer, pre-tokenizer and decoder of a tokenizer.json for ``pretokenize``."""
    if pretokenize == "bytes":
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
        return None, {**byte_level, "use_regex": True}, {**byte_level, "use_regex": True}
    split = {
        "type": "Split",
        "pattern": {"Regex": _hf_split_pattern(pretokenize)},
        "behavior": "Isolated",
        "invert": False,
    }
    if pretokenize == "words":
        return None, split, {"type": "Fuse"}
    to_symbol = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_SYMBOL}
    to_space = {"type": "Replace", "pattern": {"String": SPACE_SYMBOL}, "content": " "}
    return to_symbol, split, {"type": "Sequence", "decoders": [to_space, {"type": "Fuse"}]}


def _adds_nothing(post: object) -> bool:
    """Whether a tokenizer.json post-processor leaves a single text's ids as they are.

    GPT-2's ``ByteLevel`` one changes offsets only; the ``TemplateProcessing`` that
    ``transformers`` writes for a tokenizer with no tokens to add is the text alone.
    """
    if not isinstance(post, Mapping):
        return False
    if post.get("type") == "ByteLevel":
        return True
    alone = [{"Sequence": {"id": "A", "type_id": 0}}]
    return (
        post.get("type") == "TemplateProcessing"
        and post.get("single") == alone
        and not post.get("special_tokens")
    )


def _hf_pretokenize(d: Mapping[str, Any]) -> str:
    """Which of our ``pretokenize`` the file's pipeline is; refuse it by name if none."""
    for key in ("truncation", "padding"):
        if d.get(key) is not None:
            raise ValueError(
                f"tokenizer.json sets {key} ({d[key]!r}), which tinyformer does not read;"
                f" set it to null (tinyformer pads with encode_batch)"
            )
    post = d.get("post_processor")
    if post is not None and not _adds_nothing(post):
        kind = post.get("type") if isinstance(post, Mapping) else post
        raise ValueError(
            f"tokenizer.json has a {kind!r} post-processor, which adds tokens; tinyformer adds"
            " <bos>/<eos> per call (encode's add_bos, add_eos) and reads only files without one"
        )
    found = (d.get("normalizer"), d.get("pre_tokenizer"), d.get("decoder"))
    pre = found[1]
    if isinstance(pre, Mapping) and pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            raise ValueError(
                "tokenizer.json's ByteLevel pre-tokenizer has add_prefix_space=true or"
                " use_regex=false; tinyformer reads GPT-2's setting (false, true)"
            )
        if found[0] is not None:
            raise ValueError(
                f"tokenizer.json has a normalizer ({found[0]!r}); tinyformer reads none"
            )
        decoder = found[2]
        if not (isinstance(decoder, Mapping) and decoder.get("type") == "ByteLevel"):
            raise ValueError(f"tokenizer.json's decoder {decoder!r} is not the ByteLevel decoder")
        return "bytes"
    for pretokenize in ("words", "metaspace"):
        if list(found) == list(_hf_pipeline(pretokenize)):
            return pretokenize
    kind = pre.get("type") if isinstance(pre, Mapping) else pre
    raise ValueError(
        f"tokenizer.json's pre-tokenizer {kind!r} (with its normalizer and decoder) is not one"
        " tinyformer reads: ByteLevel (GPT-2's), or the Split rules that"
        " BPETokenizer.to_hf_json writes"
    )


def _check_hf_model(model: Mapping[str, Any]) -> None:
    """Refuse by name the BPE options whose encoding tinyformer does not reproduce."""
    unread = {
        "dropout": model.get("dropout") not in (None, 0, 0.0),
        "continuing_subword_prefix": model.get("continuing_subword_prefix") not in (None, ""),
        "end_of_word_suffix": model.get("end_of_word_suffix") not in (None, ""),
        "byte_fallback": bool(model.get("byte_fallback")),
        "fuse_unk": bool(model.get("fuse_unk")),
    }
    named = [k for k, v in unread.items() if v]
    if named:
        raise ValueError(
            f"tokenizer.json's BPE model sets {', '.join(named)}, which tinyformer's"
            " BPETokenizer does not implement"
        )
    if not isinstance(model.get("vocab"), Mapping) or not isinstance(model.get("merges"), list):
        raise TypeError("tokenizer.json's BPE model must hold a vocab object and a merges list")


def _hf_added_tokens(tokenizer: Tokenizer) -> list[dict[str, Any]]:
    """The ``added_tokens`` of a tokenizer.json: the special tokens, each with its role if any."""
    roles = dict(zip(tokenizer.special_tokens, _ROLES, strict=False))
    added = []
    for i in sorted(tokenizer._is_special):
        content = tokenizer.tokens[i]
        entry = {
            "id": i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        if content in roles:
            entry[_ROLE_FIELD] = roles[content]
        added.append(entry)
    return added


def _hf_tokens(
    d: Mapping[str, Any], model: Mapping[str, Any]
) -> tuple[tuple[str, ...], list[str], dict[str, str]]:
    """Every token in id order, the special tokens in id order, and the roles recorded."""
    by_id: dict[int, str] = {}
    for token, i in model["vocab"].items():
        if i in by_id:
            raise ValueError(f"tokenizer.json gives id {i} to both {by_id[i]!r} and {token!r}")
        by_id[i] = token
    specials = []
    recorded: dict[str, str] = {}  # role -> name, as to_hf_json writes them
    for entry in d.get("added_tokens") or []:
        content, i = entry.get("content"), entry.get("id")
        if not entry.get("special"):
            raise ValueError(
                f"tokenizer.json adds the token {content!r} (id {i}) as an ordinary token;"
                " tinyformer reads special added tokens only"
            )
        strips = [k for k in ("single_word", "lstrip", "rstrip") if entry.get(k)]
        if strips or (entry.get("normalized") and d.get("normalizer") is not None):
            raise ValueError(
                f"tokenizer.json's special token {content!r} sets"
                f" {', '.join(strips) or 'normalized'}, which tinyformer does not implement"
            )
        if by_id.get(i, content) != content:
            raise ValueError(f"tokenizer.json gives id {i} to both {by_id[i]!r} and {content!r}")
        by_id[i] = content
        specials.append((i, content))
        role = entry.get(_ROLE_FIELD)
        if role is not None:
            if role not in _ROLES or role in recorded:
                raise ValueError(
                    f"tokenizer.json's special token {content!r} has {_ROLE_FIELD} {role!r};"
                    f" expected one of {list(_ROLES)}, each at most once"
                )
            recorded[role] = content
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError("tokenizer.json's ids must run from 0 without gaps")
    tokens = tuple(by_id[i] for i in range(len(by_id)))
    return tokens, [c for _, c in sorted(specials)], recorded


def _hf_merges(merges: list[Any]) -> list[tuple[str, str]]:
    """The merges as pairs, from either spelling (``["a", "b"]`` or the older ``"a b"``)."""
    pairs = []
    for k, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else merge
        if not (isinstance(parts, list) and len(parts) == 2):
            raise ValueError(f"tokenizer.json's merges[{k}] must be a pair, got {merge!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def _hf_roles(
    given: Sequence[str | None] | None,
    specials: list[str],
    unk: str | None,
    *,
    recorded: Mapping[str, str],
    config: Mapping[str, Any] | None,
    unk_unused: bool,
) -> tuple[str | None, ...]:
    """The names of the pad, bos, eos and unk tokens of a tokenizer.json (None if absent).

    A role goes to a special token only on evidence, never by its id: ``given``
    (the caller's ``special_tokens``) decides alone; otherwise the model's
    ``unk_token`` is the unknown token, ``config`` (a tokenizer_config.json)
    names roles (a token it names for several keeps the first of eos, bos, pad and
    unk: GPT-2's ``<|endoftext|>`` becomes the end-of-sequence token), and then the
    roles recorded by :meth:`BPETokenizer.to_hf_json`
    (or, in a file without them, tinyformer's default names) fill the roles
    still free.
    """
    if given is not None:
        roles = _check_special_tokens(given, roles_may_be_absent=True)
        if len(roles) != len(_ROLES):
            raise ValueError(
                f"special_tokens must name exactly pad, bos, eos and unk, got {roles}"
            )
        missing = [r for r in roles if r is not None and r not in specials]
        if missing:
            raise ValueError(f"special_tokens {missing} are not special tokens of the file")
        if unk is not None and roles[3] != unk:
            raise ValueError(f"the file's unk_token is {unk!r}, so special_tokens[3] must be too")
        return roles
    found: dict[str, str] = {} if unk is None else {"unk": unk}
    named = _config_roles(config, specials)
    for role in _CONFIG_ROLE_ORDER:
        name = named.get(role)
        if name is None:
            continue
        if found.get(role, name) != name:
            raise ValueError(
                f"tokenizer_config.json's unk_token is {name!r} but tokenizer.json's is"
                f" {unk!r}; name the roles with special_tokens=(pad, bos, eos, unk)"
            )
        if name not in found.values():
            # one token may play several roles in transformers (GPT-2's <|endoftext|> is
            # bos, eos and unk); a tinyformer tokenizer gives each special token one role,
            # the first of _CONFIG_ROLE_ORDER, and leaves the others empty
            found[role] = name
    if recorded:
        weaker = dict(recorded)
    else:
        weaker = {r: n for r, n in zip(_ROLES, SPECIAL_TOKENS, strict=True) if n in specials}
    for role, name in weaker.items():
        if role not in found and name not in found.values():
            found[role] = name
    if unk is None and not unk_unused:
        # tokenizers leaves unknown symbols out; an unknown token would change the ids
        found.pop("unk", None)
    return tuple(found.get(role) for role in _ROLES)


_CONFIG_ROLE_ORDER = ("eos", "bos", "pad", "unk")
"""The order in which a tokenizer_config.json's roles are taken when one token plays several."""


def _config_roles(config: Mapping[str, Any] | None, specials: list[str]) -> dict[str, str]:
    """The roles a tokenizer_config.json names (``pad_token`` ...), each a special token."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TypeError(
            f"tokenizer_config must be a dict read from a tokenizer_config.json, got"
            f" {describe(config)}"
        )
    roles: dict[str, str] = {}
    for role in _ROLES:
        key = f"{role}_token"
        value = config.get(key)
        if value is None:
            continue
        name = value.get("content") if isinstance(value, Mapping) else value
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"tokenizer_config.json's {key} must be a non-empty str or a dict with one in"
                f" 'content', got {describe(value)}"
            )
        if name not in specials:
            raise ValueError(
                f"tokenizer_config.json's {key} is {name!r}, which is not a special token of"
                f" the tokenizer.json (they are {specials[:10]}); name the roles with"
                " special_tokens=(pad, bos, eos, unk)"
            )
        roles[role] = name
    return roles


_KINDS: dict[str, type[Tokenizer]] = {
    cls.kind: cls for cls in (CharTokenizer, WordTokenizer, BPETokenizer)
}
_LAZY_KINDS = {"wordpiece": ("tinyformer.data.wordpiece", "WordPieceTokenizer")}


def _lazy_class(kind: str) -> type[Tokenizer]:
    """The class of a ``kind`` that lives in a module of its own, imported on first use."""
    module, name = _LAZY_KINDS[kind]
    return getattr(__import__(module, fromlist=[name]), name)


def tokenizer_from_dict(d: Mapping[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict`'s output.

    Raises
    ------
    ValueError
        If ``d`` names no known ``kind`` or its arguments do not make a tokenizer.
    """
    known = sorted({*_KINDS, *_LAZY_KINDS})
    if not isinstance(d, Mapping) or d.get("kind") not in known:
        kind = d.get("kind") if isinstance(d, Mapping) else None
        raise ValueError(
            f"d must be a tokenizer's to_dict() with kind one of {known}, got kind {kind!r}"
        )
    arguments = {k: v for k, v in d.items() if k != "kind"}
    if d["kind"] == "bpe":
        merges = [tuple(pair) for pair in arguments.pop("merges", [])]
        return BPETokenizer(arguments.pop("alphabet"), merges, **arguments)
    if d["kind"] in _LAZY_KINDS:
        return _lazy_class(d["kind"])(**arguments)
    return _KINDS[d["kind"]](**arguments)


def load_tokenizer(
    path: str | os.PathLike[str], *, special_tokens: Sequence[str | None] | None = None
) -> Tokenizer:
    """Read a tokenizer from a file: the JSON its ``save`` method wrote, or a ``tokenizer.json``.

    A tokenizer saved by :meth:`Tokenizer.save` comes back as the class that
    saved it. A ``tokenizer.json`` of Hugging Face's ``tokenizers`` (or a
    folder holding one, as ``save_pretrained`` writes) comes back as a
    :class:`BPETokenizer` for a BPE model (:meth:`BPETokenizer.from_hf_json`)
    and as :class:`~tinyformer.data.wordpiece.WordPieceTokenizer` for a WordPiece
    model; other models (Unigram, WordLevel) are refused by name.

    A ``tokenizer.json`` does not say which special token pads, begins or
    ends a sequence, so a role goes to a token only on evidence, never by
    its id, strongest first: ``special_tokens``; the model's ``unk_token``
    (the unknown token); the ``pad_token``, ``bos_token``, ``eos_token`` and
    ``unk_token`` of a ``tokenizer_config.json`` in the same folder (read
    when ``path`` is a folder or a file called ``tokenizer.json``); the roles
    :meth:`BPETokenizer.to_hf_json` records in the file; in a file without
    them, tinyformer's default names ``<pad>``, ``<bos>``, ``<eos>``,
    ``<unk>``. A role without evidence is left out (its id is None, and
    :meth:`Tokenizer.encode` says so when it needs it). An unknown token is
    also left out when the model has no ``unk_token`` and could meet an
    unknown symbol, since ``tokenizers`` drops those.

    Parameters
    ----------
    path : str or path-like
        The file, or a folder holding a ``tokenizer.json``.
    special_tokens : list of str or None, optional
        For a ``tokenizer.json`` only: the names of the padding, beginning,
        end and unknown tokens, None where no token plays the role
        (e.g. ``("<pad>", "<s>", "</s>", "<unk>")`` for RoBERTa's file).
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"{path} is a folder without a tokenizer.json")
        path = path / "tokenizer.json"
    d = _read_json(path, "is not a saved tokenizer")
    if isinstance(d, Mapping) and "kind" not in d and isinstance(d.get("model"), Mapping):
        kind = d["model"].get("type")
        config_path = path.with_name("tokenizer_config.json")
        config = None
        if path.name == "tokenizer.json" and config_path.is_file():
            config = _read_json(config_path, "is not a tokenizer_config.json")
            if not isinstance(config, Mapping):
                raise ValueError(f"{config_path} must hold a JSON object, got {describe(config)}")
        options = {"special_tokens": special_tokens, "tokenizer_config": config}
        if kind == "BPE":
            return BPETokenizer.from_hf_json(d, **options)
        if kind == "WordPiece":
            return _lazy_class("wordpiece").from_hf_json(d, **options)
        raise ValueError(
            f"{path} holds a tokenizers {kind!r} model; tinyformer reads 'BPE' and 'WordPiece'"
        )
    if special_tokens is not None:
        raise ValueError(
            f"special_tokens names the roles in a tokenizer.json, but {path} is a tokenizer"
            " saved by tinyformer, which keeps its own special tokens; leave special_tokens"
            " out"
        )
    return tokenizer_from_dict(d)


def _read_json(path: Path, what: str) -> Any:
    """The parsed contents of a JSON file; a ValueError naming it if it is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} {what} (not JSON: {error})") from None
