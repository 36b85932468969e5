"""Merge traces, the WordPiece score, the SentencePiece-style space symbol and word tokens."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.data.tokenizers import (
    SPACE_SYMBOL,
    UNK_ID,
    BPETokenizer,
    MergeStep,
    WordTokenizer,
)

CORPUS = (
    "the baker baked bread and the bakers sold the bread\n"
    "a walker walked by the river and walkers talked\n"
    "the talker talked and the baker walked home slowly"
)


def _replay(words: list[list[str]], pair: tuple[str, str]) -> None:
    """Merge ``pair`` in every word, left to right, in place."""
    for w in words:
        i = 0
        while i < len(w) - 1:
            if (w[i], w[i + 1]) == pair:
                w[i : i + 2] = [pair[0] + pair[1]]
            i += 1


def _pair_counts(words: list[list[str]]) -> Counter:
    return Counter((w[i], w[i + 1]) for w in words for i in range(len(w) - 1))


@pytest.mark.parametrize("score", ["frequency", "wordpiece"])
@pytest.mark.parametrize("pretokenize", ["words", "metaspace"])
def test_trace_matches_the_merges(score, pretokenize):
    tok = BPETokenizer.train(CORPUS, vocab_size=60, score=score, pretokenize=pretokenize)
    trace = tok.trace
    assert all(isinstance(step, MergeStep) for step in trace)
    assert [step.pair for step in trace] == tok.merges
    assert [step.rank for step in trace] == list(range(len(trace)))
    assert [step.count for step in trace] == tok.merge_counts
    assert [step.token for step in trace] == [a + b for a, b in tok.merges]
    if score == "frequency":
        assert [step.score for step in trace] == [float(step.count) for step in trace]
    # the corpus's length after each merge is what encoding with that many merges gives
    lengths = [len(tok.tokenize(CORPUS, n_merges=r + 1)) for r in range(len(trace))]
    assert [step.n_tokens for step in trace] == lengths
    assert trace[-1].n_tokens == len(tok.encode(CORPUS))


def test_wordpiece_score_picks_the_pair_the_formula_says():
    # (a, b) and (a, c) occur 4 times each, (z, q) only twice; but z and q never
    # occur apart: n_zq / (n_z n_q) = 2 / (2 * 2) = 0.5 beats 4 / (8 * 4) = 0.125.
    docs = ["ab"] * 4 + ["ac"] * 4 + ["zq"] * 2
    bpe = BPETokenizer.train(docs, vocab_size=20)
    wordpiece = BPETokenizer.train(docs, vocab_size=20, score="wordpiece")
    assert bpe.merges[0] == ("a", "b")
    assert wordpiece.merges == [("z", "q"), ("a", "b"), ("a", "c")]
    # after zq: (a, b) and (a, c) tie at 4 / (8 * 4) and (a, b) comes first;
    # after ab: only the four a's of "ac" are left, 4 / (4 * 4)
    assert [s.score for s in wordpiece.trace] == [0.5, 0.125, 0.25]
    assert [s.count for s in wordpiece.trace] == [2, 4, 4]


@pytest.mark.parametrize("pretokenize", ["words", "metaspace"])
def test_every_wordpiece_merge_has_the_highest_score_at_its_time(pretokenize):
    tok = BPETokenizer.train(CORPUS, vocab_size=70, score="wordpiece", pretokenize=pretokenize)
    text = CORPUS.replace(" ", SPACE_SYMBOL) if pretokenize == "metaspace" else CORPUS
    words = [list(w) for w in re.findall(rf"[\s{SPACE_SYMBOL}]*[^\s{SPACE_SYMBOL}]+", text)]
    for step in tok.trace:
        pairs = _pair_counts(words)
        units = Counter(t for w in words for t in w)
        scores = {p: n / (units[p[0]] * units[p[1]]) for p, n in pairs.items() if n >= 2}
        assert step.count == pairs[step.pair]
        assert step.score == pytest.approx(scores[step.pair], rel=1e-15)
        assert step.score == max(scores.values())
        _replay(words, step.pair)
    assert [t for w in words for t in w] == tok.tokenize(CORPUS)


def test_wordpiece_prefers_pairs_whose_parts_rarely_occur_apart():
    bpe = BPETokenizer.train(CORPUS, vocab_size=50)
    wordpiece = BPETokenizer.train(CORPUS, vocab_size=50, score="wordpiece")
    assert bpe.merges != wordpiece.merges
    # the WordPiece score of BPE's first merge is below that of WordPiece's first merge
    first = wordpiece.trace[0]
    a, b = bpe.merges[0]
    units = Counter(CORPUS)
    assert bpe.trace[0].count / (units[a] * units[b]) < first.score


def test_wordpiece_respects_min_frequency():
    docs = ["ab"] * 4 + ["zq"]  # (z, q) has the best score but occurs once
    assert BPETokenizer.train(docs, vocab_size=20, score="wordpiece").merges == [("a", "b")]
    every = BPETokenizer.train(docs, vocab_size=20, score="wordpiece", min_frequency=1)
    assert every.merges[0] == ("z", "q")


def test_training_with_either_score_is_deterministic():
    for score in ("frequency", "wordpiece"):
        docs = CORPUS.split("\n")
        a = BPETokenizer.train(docs, vocab_size=55, score=score)
        b = BPETokenizer.train(docs[::-1], vocab_size=55, score=score)
        assert a.trace == b.trace


def test_metaspace_shows_spaces_as_a_symbol_attached_to_the_next_word():
    tok = BPETokenizer.train(CORPUS, vocab_size=70, pretokenize="metaspace")
    assert SPACE_SYMBOL in tok.alphabet
    assert " " not in tok.alphabet
    pieces = tok.tokenize("the baker walked")
    assert all(" " not in p for p in pieces)
    assert pieces[0].startswith("t")
    assert "".join(pieces) == "the▁baker▁walked"
    for piece in pieces:  # the symbol only ever opens a token
        assert SPACE_SYMBOL not in piece.lstrip(SPACE_SYMBOL)
    assert tok.decode(tok.encode("the baker walked")) == "the baker walked"


@given(st.text(alphabet="ab c\nr", max_size=50))
def test_metaspace_round_trip(text):
    tok = BPETokenizer.train(
        "a bar a crab a car\nbar  crab", vocab_size=25, pretokenize="metaspace"
    )
    ids = tok.encode(text, add_bos=True, add_eos=True, unknown="raise")
    assert tok.decode(ids) == text
    assert "".join(tok.tokenize(text)).replace(SPACE_SYMBOL, " ") == text


@given(st.text(alphabet="abcrz \t", max_size=30))
def test_metaspace_unknown_characters_become_unk(text):
    tok = BPETokenizer.train("a bar a crab", vocab_size=20, pretokenize="metaspace")
    expected = "".join(ch if ch in "abcr " else "\ufffd" for ch in text)
    assert tok.decode(tok.encode(text)) == expected


def test_metaspace_tokenizer_rebuilt_from_alphabet_and_merges_encodes_the_same():
    tok = BPETokenizer.train(CORPUS, vocab_size=50, pretokenize="metaspace")
    rebuilt = BPETokenizer(tok.alphabet, tok.merges, pretokenize="metaspace")
    text = "the walker baked bread slowly"
    np.testing.assert_array_equal(rebuilt.encode(text), tok.encode(text))
    assert rebuilt.trace is None
    assert rebuilt.merge_counts is None
    with_space = BPETokenizer(["a", " "], [(SPACE_SYMBOL, "a")], pretokenize="metaspace")
    assert with_space.tokenize("a a") == ["a", "▁a"]


def test_an_explicit_alphabet_may_name_the_space_itself():
    tok = BPETokenizer.train("ab ab", vocab_size=12, alphabet="ab c", pretokenize="metaspace")
    assert tok.alphabet == ("a", "b", SPACE_SYMBOL, "c")


def test_bpe_run_to_completion_ends_at_whole_words():
    tok = BPETokenizer.train(CORPUS, vocab_size=10_000, min_frequency=1)
    assert tok.tokenize(CORPUS) == re.findall(r"\s*\S+|\s+", CORPUS)


def test_word_tokenizer_ranks_words_by_frequency_and_marks_unknown_words():
    tok = WordTokenizer.from_corpus("the cat. the dog, the cat")
    # " cat" and " the" occur twice (ties go by string), the others once
    assert tok.tokens[4:] == (" cat", " the", " dog", ",", ".", "the")
    assert tok.tokenize("the cat, sat.") == ["the", " cat", ",", " sat", "."]
    ids = tok.encode("the cat, sat.")
    assert ids.tolist().count(UNK_ID) == 1  # " sat" is lost as a whole
    assert tok.decode(ids) == "the cat,\ufffd."
    assert tok.decode(tok.encode("the dog, the cat.")) == "the dog, the cat."


def test_word_tokenizer_min_count():
    tok = WordTokenizer.from_corpus(["a b a", "a c b"], min_count=2)
    assert tok.tokens[4:] == (" b", "a")  # " a" and " c" occur once


@given(st.text(alphabet="ab .,\n", max_size=40))
def test_word_tokenizer_round_trip_over_its_vocabulary(text):
    tok = WordTokenizer.from_corpus(text) if text else WordTokenizer(["a"])
    assert "".join(tok.tokenize(text)) == text
    if text:
        assert tok.decode(tok.encode(text, unknown="raise")) == text


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda: BPETokenizer.train("abab", 10, score="likelihood"),
            ValueError,
            "score must be one of 'frequency', 'wordpiece', got 'likelihood'",
        ),
        (lambda: BPETokenizer.train("abab", 10, score=None), ValueError, "score must be one of"),
        (
            lambda: BPETokenizer.train("abab", 10, pretokenize="bytes"),
            ValueError,
            "pretokenize must be one of 'words', 'metaspace', got 'bytes'",
        ),
        (lambda: BPETokenizer("ab", pretokenize=1), ValueError, "pretokenize must be one of"),
        (
            lambda: BPETokenizer.train("a\u2581b", 10, pretokenize="metaspace"),
            ValueError,
            "corpus contains '\u2581'",
        ),
        (
            lambda: BPETokenizer("ab", pretokenize="metaspace").encode("a\u2581b"),
            ValueError,
            "text contains '\u2581'",
        ),
        (
            lambda: BPETokenizer("ab ", pretokenize="metaspace").tokenize("a\u2581"),
            ValueError,
            "pretokenize='words'",
        ),
        (
            lambda: BPETokenizer("a \u2581", pretokenize="metaspace"),
            ValueError,
            "must not repeat characters",
        ),
        (lambda: WordTokenizer("abc"), TypeError, "words must be an iterable of str"),
        (lambda: WordTokenizer(["a", ""]), TypeError, "non-empty strings"),
        (lambda: WordTokenizer(["a", 3]), TypeError, "non-empty strings"),
        (lambda: WordTokenizer(["a", "a"]), ValueError, "must not repeat, got ['a']"),
        (lambda: WordTokenizer.from_corpus("a b", min_count=0), ValueError, "min_count"),
        (lambda: WordTokenizer.from_corpus(""), ValueError, "corpus must contain"),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
