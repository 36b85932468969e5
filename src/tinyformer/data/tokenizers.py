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

Three granularities share this layout: :class:`~tinyformer.data.tokenizers.CharTokenizer`
(one token per character), :class:`~tinyformer.data.tokenizers.WordTokenizer` (one token
per word or punctuation mark) and :class:`~tinyformer.data.tokenizers.BPETokenizer`
(subwords learned by merging pairs, with the WordPiece merge score and the
SentencePiece-style space symbol as options).
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyformer._validation import describe, one_of, positive_int, token_ids

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "N_SPECIAL",
    "PAD_ID",
    "SPACE_SYMBOL",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "BPETokenizer",
    "CharTokenizer",
    "MergeStep",
    "Tokenizer",
    "WordTokenizer",
    "load_tokenizer",
    "tokenizer_from_dict",
]

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
N_SPECIAL = len(SPECIAL_TOKENS)
UNKNOWN_CHAR = "\ufffd"  # how decode shows <unk>: the Unicode replacement character
_UNKNOWN_POLICIES = ("unk", "raise")
#: The character that stands for a space with ``pretokenize="metaspace"`` (U+2581).
SPACE_SYMBOL = "\u2581"
MERGE_SCORES = ("frequency", "wordpiece")
PRETOKENIZERS = ("words", "metaspace")


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


class Tokenizer:
    """The vocabulary shared by every tokenizer: special tokens, then ``symbols``.

    Parameters
    ----------
    symbols : list of str
        The non-special tokens, in id order; they get ids ``4, 5, ...``.
    """

    def __init__(self, symbols: Sequence[str]) -> None:
        self._tokens = (*SPECIAL_TOKENS, *symbols)
        self._ids = {s: i for i, s in enumerate(symbols, start=N_SPECIAL)}

    @property
    def tokens(self) -> tuple[str, ...]:
        """Every token's string, indexed by id (the first four are the special tokens)."""
        return self._tokens

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return len(self._tokens)

    def token_to_id(self, token: str) -> int:
        """The id of a (non-special) token string; use the ``*_ID`` constants for the others."""
        if token not in self._ids:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return self._ids[token]

    def encode(
        self, text: str, *, add_bos: bool = False, add_eos: bool = False, unknown: str = "unk"
    ) -> np.ndarray:
        """Token ids of ``text``, shape ``(n,)``, int64.

        Parameters
        ----------
        text : str
            The text to encode.
        add_bos, add_eos : bool
            Put ``<bos>`` in front, ``<eos>`` at the end.
        unknown : str
            ``"unk"``: a symbol outside the vocabulary becomes ``<unk>``;
            ``"raise"``: it raises :class:`ValueError` naming it and its position.
        """
        text = _check_text(text)
        if unknown not in _UNKNOWN_POLICIES:
            raise ValueError(f"unknown must be one of {_UNKNOWN_POLICIES}, got {unknown!r}")
        ids = []
        position = 0
        for piece in self.tokenize(text):
            token_id = self._ids.get(piece, UNK_ID)
            if token_id == UNK_ID and unknown == "raise":
                raise ValueError(
                    f"text contains {piece!r} at position {position}, which is not in the"
                    " vocabulary (pass unknown='unk' to map it to <unk>)"
                )
            ids.append(token_id)
            position += len(piece)
        ids = [BOS_ID] * bool(add_bos) + ids + [EOS_ID] * bool(add_eos)
        return np.array(ids, dtype=np.int64)

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into token strings (symbols outside the vocabulary included)."""
        raise NotImplementedError

    def decode(self, ids: object, *, skip_special: bool = True) -> str:
        """The text of a sequence of ids, shape ``(n,)``.

        With ``skip_special`` (the default) ``<pad>``, ``<bos>`` and ``<eos>``
        are dropped and ``<unk>`` shows as U+FFFD; otherwise every special
        token shows its name, e.g. ``<eos>``.
        """
        ids = token_ids(ids, "ids", self.vocab_size)
        if ids.ndim != 1:
            raise ValueError(f"ids must be one sequence of shape (n,), got shape {ids.shape}")
        pieces = []
        for i in ids.tolist():
            if skip_special and i < N_SPECIAL:
                pieces.append(UNKNOWN_CHAR if i == UNK_ID else "")
            else:
                pieces.append(self._tokens[i])
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


# A word is a run of non-space characters with the whitespace in front of it; a
# run of whitespace at the very end is a word of its own. Concatenating the
# words gives back the text exactly.
_WORD = re.compile(r"\s*\S+|\s+")
# The same rule once spaces have become SPACE_SYMBOL: the symbol counts as whitespace.
_METASPACE_WORD = re.compile(rf"[\s{SPACE_SYMBOL}]*[^\s{SPACE_SYMBOL}]+|[\s{SPACE_SYMBOL}]+")


def _pretokenize(text: str, pretokenize: str, name: str = "text") -> list[str]:
    """The words of ``text``: as they stand, or with every space shown as SPACE_SYMBOL."""
    if pretokenize == "words":
        return _WORD.findall(text)
    if SPACE_SYMBOL in text:
        raise ValueError(
            f"{name} contains {SPACE_SYMBOL!r} (U+2581), which pretokenize='metaspace' uses"
            " to stand for a space, so it could not be decoded back; remove it or use"
            " pretokenize='words'"
        )
    return _METASPACE_WORD.findall(text.replace(" ", SPACE_SYMBOL))


def _merge_pair(word: Sequence[str], pair: tuple[str, str]) -> list[str]:
    """Replace every occurrence of ``pair`` in ``word``, left to right, by its concatenation."""
    left, right = pair
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            out.append(left + right)
            i += 2
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
        :math:`n_{ab} / (n_a\, n_b)` for ``score="wordpiece"``, with :math:`n_a`
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


class _PairCounts:
    """Frequencies of adjacent symbol pairs, and of the symbols, over a weighted list of words.

    Keeps, for each pair, the words it occurs in, so that a merge touches only
    those words; a heap hands out the most frequent pair, ties broken by the
    pair's strings in lexicographic order.
    """

    def __init__(self, words: list[list[str]], weights: list[int]) -> None:
        self.words, self.weights = words, weights
        self.count: Counter[tuple[str, str]] = Counter()
        self.units: Counter[str] = Counter()  # occurrences of each token
        self.where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
        for i, word in enumerate(words):
            self._add(i, word, +1)
        self.n_tokens = sum(self.units.values())
        self.heap = [(-n, pair) for pair, n in self.count.items()]
        heapq.heapify(self.heap)

    def _add(self, i: int, word: list[str], sign: int) -> None:
        for symbol in word:
            self.units[symbol] += sign * self.weights[i]
        for pair in itertools.pairwise(word):
            self.count[pair] += sign * self.weights[i]
            if sign > 0:
                self.where[pair].add(i)

    def wordpiece_score(self, pair: tuple[str, str]) -> float:
        r"""The pair's count over the product of its parts' counts, :math:`n_{ab}/(n_a n_b)`."""
        return self.count[pair] / (self.units[pair[0]] * self.units[pair[1]])

    def best_wordpiece(self, min_frequency: int) -> tuple[tuple[str, str], int] | None:
        """The pair seen at least ``min_frequency`` times with the highest WordPiece score.

        Ties go to the more frequent pair, then to the pair whose strings come
        first in lexicographic order.
        """
        candidates = [p for p, n in self.count.items() if n >= min_frequency]
        if not candidates:
            return None
        best = min(candidates, key=lambda p: (-self.wordpiece_score(p), -self.count[p], p))
        return best, self.count[best]

    def most_frequent(self) -> tuple[tuple[str, str], int] | None:
        """The most frequent pair and its count, or None when no pair is left."""
        while self.heap:
            neg_count, pair = heapq.heappop(self.heap)
            if self.count.get(pair, 0) == -neg_count > 0:  # else a stale entry
                return pair, -neg_count
        return None

    def merge(self, pair: tuple[str, str]) -> None:
        """Merge ``pair`` in every word that holds it and update the counts."""
        touched: set[tuple[str, str]] = set()
        for i in sorted(self.where.pop(pair, ())):
            old = self.words[i]
            new = _merge_pair(old, pair)
            if len(new) == len(old):
                continue  # the pair left this word in an earlier merge
            self._add(i, old, -1)
            self._add(i, new, +1)
            self.n_tokens -= self.weights[i] * (len(old) - len(new))
            self.words[i] = new
            touched.update(itertools.pairwise(old), itertools.pairwise(new))
        for p in sorted(touched):
            if self.count[p] > 0:
                heapq.heappush(self.heap, (-self.count[p], p))
            else:
                del self.count[p]


class BPETokenizer(Tokenizer):
    r"""Byte-pair encoding over a character alphabet.

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

    **Unknown symbols.** The base alphabet is a set of characters (those of
    the training corpus, or one given explicitly), not the 256 byte values of
    byte-level BPE: a character outside it is encoded as ``<unk>`` (or raises,
    with ``unknown="raise"``). This keeps the vocabularies of the book small
    and the merges readable.

    **Spaces as a symbol.** With ``pretokenize="metaspace"`` every space is
    replaced by the visible symbol ``"\u2581"`` (:data:`SPACE_SYMBOL`) before
    splitting into words, so the symbol starts the word that follows it and
    tokens look like ``"\u2581river"``, as in SentencePiece
    :cite:p:`kudo2018sentencepiece`; :meth:`decode` turns the symbol back into
    spaces. Unlike SentencePiece, no symbol is added in front of the text and
    runs of spaces are kept, so the round trip is exact.

    Parameters
    ----------
    alphabet : str or list of str
        The base characters, in id order (ids ``4, 5, ...``). With
        ``pretokenize="metaspace"`` a space in it stands for :data:`SPACE_SYMBOL`.
    merges : list of (str, str)
        The learned merges in order; each side must be a token that exists
        when the merge is made. Usually made by :meth:`train`.
    pretokenize : str
        ``"words"`` (a word keeps the whitespace in front of it) or
        ``"metaspace"`` (spaces become :data:`SPACE_SYMBOL` first).
    """

    def __init__(
        self,
        alphabet: str | Iterable[str],
        merges: Sequence[tuple[str, str]] = (),
        *,
        pretokenize: str = "words",
    ) -> None:
        self.pretokenize = one_of(pretokenize, PRETOKENIZERS, "pretokenize")
        alphabet = _check_alphabet(alphabet)
        if pretokenize == "metaspace":
            alphabet = _check_alphabet(SPACE_SYMBOL if s == " " else s for s in alphabet)
        self.alphabet = alphabet
        symbols = list(self.alphabet)
        known = set(symbols)
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            pair = self._check_merge(merge, rank, known)
            self._ranks.setdefault(pair, rank)
            if pair[0] + pair[1] not in known:
                known.add(pair[0] + pair[1])
                symbols.append(pair[0] + pair[1])
        self._merges = [(m[0], m[1]) for m in merges]
        self._trace: list[MergeStep] | None = None
        self._cache: dict[str, list[str]] = {}
        super().__init__(symbols)

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
    ) -> BPETokenizer:
        r"""Learn merges from ``corpus`` until the vocabulary has ``vocab_size`` ids.

        Each step merges the adjacent pair :math:`(a, b)` with the highest score:

        .. math:: \text{frequency: } n_{ab}, \qquad
                  \text{wordpiece: } \frac{n_{ab}}{n_a\, n_b},

        where :math:`n_{ab}` counts the pair and :math:`n_a`, :math:`n_b` the
        two tokens in the corpus as currently segmented. The first is byte-pair
        encoding :cite:p:`sennrich2016neural`; the second is the merge score
        commonly used for WordPiece :cite:p:`schuster2012japanese,wu2016google`,
        which prefers pairs whose parts rarely occur apart.

        Parameters
        ----------
        corpus : str or list of str
            Training text (one string, or several documents).
        vocab_size : int
            Target number of ids: 4 special tokens + the alphabet + the merged
            tokens. Training stops earlier if no pair occurs ``min_frequency``
            times.
        alphabet : str or list of str, optional
            The base characters; defaults to the corpus's characters, sorted.
            Every character of the corpus must belong to it.
        min_frequency : int
            A pair seen fewer times than this is never merged (whatever its score).
        score : str
            ``"frequency"`` or ``"wordpiece"``, as above.
        pretokenize : str
            ``"words"`` or ``"metaspace"`` (spaces become :data:`SPACE_SYMBOL`),
            as in the class description.

        Returns
        -------
        BPETokenizer
            Its :attr:`merges` lists the learned pairs in order, :attr:`trace`
            each merge with its count, score and the corpus's length after it,
            and :attr:`merge_counts` the counts alone. Ties between equal
            scores go to the more frequent pair, then to the pair whose
            ``(left, right)`` strings come first in lexicographic order, so
            training is deterministic.
        """
        docs = _check_corpus(corpus)
        score = one_of(score, MERGE_SCORES, "score")
        pretokenize = one_of(pretokenize, PRETOKENIZERS, "pretokenize")
        words = [w for doc in docs for w in _pretokenize(doc, pretokenize, "corpus")]
        seen = set().union(*words)
        if alphabet is not None and pretokenize == "metaspace":
            alphabet = [SPACE_SYMBOL if s == " " else s for s in _check_alphabet(alphabet)]
        base = _check_alphabet(sorted(seen) if alphabet is None else alphabet)
        outside = sorted(seen - set(base))
        if outside:
            raise ValueError(f"corpus contains characters outside the alphabet: {outside[:10]}")
        vocab_size = positive_int(vocab_size, "vocab_size")
        smallest = N_SPECIAL + len(base)
        if vocab_size < smallest:
            raise ValueError(
                f"vocab_size must be at least {smallest} ({N_SPECIAL} special tokens +"
                f" {len(base)} base characters), got {vocab_size}"
            )
        min_frequency = positive_int(min_frequency, "min_frequency")
        word_counts = Counter(words)
        pairs = _PairCounts([list(w) for w in word_counts], list(word_counts.values()))
        trace: list[MergeStep] = []
        made = set(base)
        while len(made) < vocab_size - N_SPECIAL:
            if score == "frequency":
                best = pairs.most_frequent()
                if best is None or best[1] < min_frequency:
                    break
                value = float(best[1])
            else:
                best = pairs.best_wordpiece(min_frequency)
                if best is None:
                    break
                value = pairs.wordpiece_score(best[0])
            pairs.merge(best[0])
            trace.append(MergeStep(len(trace), best[0], best[1], value, pairs.n_tokens))
            made.add(best[0][0] + best[0][1])
        tokenizer = cls(base, [step.pair for step in trace], pretokenize=pretokenize)
        tokenizer._trace = trace
        return tokenizer

    @property
    def merges(self) -> list[tuple[str, str]]:
        """The learned merges, first learned first."""
        return list(self._merges)

    kind = "bpe"

    def _arguments(self) -> dict[str, Any]:
        return {
            "alphabet": list(self.alphabet),
            "merges": [list(pair) for pair in self._merges],
            "pretokenize": self.pretokenize,
        }

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
        turns them into ``<unk>``). Growing ``n_merges`` from 0 shows the
        segmentation coarsen merge by merge. With ``pretokenize="metaspace"``
        the spaces of ``text`` come out as :data:`SPACE_SYMBOL`.
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
        words = _pretokenize(text, self.pretokenize)
        return [t for word in words for t in self._segment(word, limit)]

    def decode(self, ids: object, *, skip_special: bool = True) -> str:
        """The text of a sequence of ids, shape ``(n,)``; :data:`SPACE_SYMBOL` becomes a space.

        See :meth:`Tokenizer.decode` for ``skip_special``.
        """
        text = super().decode(ids, skip_special=skip_special)
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
            if self._ranks.get(pair, never) >= limit:
                break
            pieces = _merge_pair(pieces, pair)
        if full:
            self._cache[word] = list(pieces)
        return pieces


_KINDS: dict[str, type[Tokenizer]] = {
    cls.kind: cls for cls in (CharTokenizer, WordTokenizer, BPETokenizer)
}


def tokenizer_from_dict(d: Mapping[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict`'s output.

    Raises
    ------
    ValueError
        If ``d`` names no known ``kind`` or its arguments do not make a tokenizer.
    """
    if not isinstance(d, Mapping) or d.get("kind") not in _KINDS:
        kind = d.get("kind") if isinstance(d, Mapping) else None
        raise ValueError(
            f"d must be a tokenizer's to_dict() with kind one of {sorted(_KINDS)}, got"
            f" kind {kind!r}"
        )
    arguments = {k: v for k, v in d.items() if k != "kind"}
    if d["kind"] == "bpe":
        merges = [tuple(pair) for pair in arguments.pop("merges", [])]
        return BPETokenizer(arguments.pop("alphabet"), merges, **arguments)
    return _KINDS[d["kind"]](**arguments)


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Read a tokenizer from the JSON file its ``save`` method wrote.

    Any tokenizer kind comes back as the class that saved it (:meth:`Tokenizer.save`).
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not a saved tokenizer (not JSON: {error})") from None
    return tokenizer_from_dict(d)
