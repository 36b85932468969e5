"""The tokenizers: characters, byte-pair encoding and its variants, words; round trips, bad input.

The second half covers merge traces, the WordPiece score, the SentencePiece-style space
symbol and word tokens.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.data import load_tokenizer, tokenizer_from_dict
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
    WordTokenizer,
)

CORPUS = (
    "the cat sat on the mat\n"
    "the dog sat on the log\n"
    "a cat and a dog met on the mat\n"
    "that cat is the fattest cat"
)


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=32)


def test_special_tokens_have_fixed_ids():
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID, N_SPECIAL) == (0, 1, 2, 3, 4)
    for tok in (CharTokenizer("xyz"), BPETokenizer("xyz")):
        assert tok.tokens[:N_SPECIAL] == SPECIAL_TOKENS


def test_char_tokenizer_ids_follow_the_alphabet_order():
    tok = CharTokenizer("bac")
    assert tok.vocab_size == 7
    assert tok.encode("abc").tolist() == [5, 4, 6]
    assert tok.token_to_id("c") == 6
    assert tok.encode("ab", add_bos=True, add_eos=True).tolist() == [BOS_ID, 5, 4, EOS_ID]
    assert tok.encode("").dtype == np.int64


def test_char_tokenizer_from_corpus_sorts_the_characters():
    tok = CharTokenizer.from_corpus(["hello", "world"])
    assert "".join(tok.tokens[N_SPECIAL:]) == "dehlorw"


def test_unknown_characters_become_unk_or_raise():
    tok = CharTokenizer("ab")
    assert tok.encode("abz").tolist() == [4, 5, UNK_ID]
    assert tok.decode(tok.encode("abz")) == "ab\ufffd"
    with pytest.raises(ValueError, match=r"'z' at position 2"):
        tok.encode("abz", unknown="raise")


def test_decode_drops_or_names_special_tokens():
    tok = CharTokenizer("ab")
    ids = np.array([BOS_ID, 4, 5, EOS_ID, PAD_ID, PAD_ID])
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, skip_special=False) == "<bos>ab<eos><pad><pad>"


@given(st.text(alphabet="ab c\n", max_size=40))
def test_char_round_trip(text):
    tok = CharTokenizer("ab c\n")
    assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == text


def test_bpe_learns_the_textbook_example_by_hand():
    # "aaabdaaabac": aa occurs 4 times (overlaps counted) -> merge it;
    # then (a, b) and (aa, a) tie at 2 and (a, b) comes first; then (aa, ab) at 2.
    tok = BPETokenizer.train("aaabdaaabac", vocab_size=20)
    assert tok.merges == [("a", "a"), ("a", "b"), ("aa", "ab")]
    assert tok.merge_counts == [4, 2, 2]
    assert tok.vocab_size == N_SPECIAL + 4 + 3  # training stopped: every pair left occurs once
    assert tok.tokenize("aaabdaaabac") == ["aaab", "d", "aaab", "a", "c"]
    assert tok.tokens[-3:] == ("aa", "ab", "aaab")


def test_bpe_stops_at_vocab_size_and_min_frequency():
    small = BPETokenizer.train("aaabdaaabac", vocab_size=9)
    assert small.merges == [("a", "a")]
    assert small.vocab_size == 9
    every = BPETokenizer.train("aaabdaaabac", vocab_size=20, min_frequency=1)
    assert len(every.merges) > 3
    assert every.tokenize("aaabdaaabac") == ["aaabdaaabac"]


def test_bpe_merges_never_cross_words(bpe):
    for left, right in bpe.merges:
        assert not any(ch.isspace() for ch in (left + right).lstrip())
    assert bpe.tokenize("cat the", n_merges=0) == list("cat the")


def test_bpe_segmentation_coarsens_merge_by_merge(bpe):
    text = "the fat cat sat on the mat"
    sizes = [len(bpe.tokenize(text, n_merges=m)) for m in range(len(bpe.merges) + 1)]
    assert sizes[0] == len(text)
    assert all(a >= b for a, b in itertools.pairwise(sizes))
    assert sizes[-1] < len(text) / 2
    assert bpe.tokenize(text, n_merges=0) == list(text)


def test_bpe_merged_tokens_get_ids_in_the_order_learned(bpe):
    n_base = len(bpe.alphabet)
    made = [a + b for a, b in bpe.merges]
    assert list(bpe.tokens[N_SPECIAL + n_base :]) == list(dict.fromkeys(made))
    assert bpe.vocab_size == 32


def test_bpe_rebuilt_from_alphabet_and_merges_encodes_the_same(bpe):
    rebuilt = BPETokenizer(bpe.alphabet, bpe.merges)
    text = "the dog and the cat met a fat log"
    np.testing.assert_array_equal(rebuilt.encode(text), bpe.encode(text))
    assert rebuilt.merge_counts is None


def test_bpe_training_is_deterministic_and_ignores_document_order():
    docs = CORPUS.split("\n")
    shuffled = docs[:]
    random.Random(3).shuffle(shuffled)
    a = BPETokenizer.train(docs, vocab_size=40)
    b = BPETokenizer.train(shuffled, vocab_size=40)
    assert a.merges == b.merges
    assert a.merge_counts == b.merge_counts


def test_bpe_counts_are_the_pair_frequencies_at_merge_time(bpe):
    """Replaying the merges on the corpus by brute force gives the recorded counts."""
    words = [list(w) for w in re.findall(r"\s*\S+|\s+", CORPUS)]
    for pair, count in zip(bpe.merges, bpe.merge_counts, strict=True):
        pairs = _pair_counts(words)
        assert pairs[pair] == count
        assert count == max(pairs.values())
        _replay(words, pair)
    assert [t for w in words for t in w] == bpe.tokenize(CORPUS)


@given(st.text(alphabet="the cat sond\nmgl", max_size=60))
def test_bpe_round_trip_over_the_base_alphabet(bpe, text):
    ids = bpe.encode(text, add_bos=True, add_eos=True, unknown="raise")
    assert bpe.decode(ids) == text
    assert "".join(bpe.tokenize(text)) == text


@given(st.text(max_size=30))
def test_bpe_unknown_characters_become_unk(bpe, text):
    known = set(bpe.alphabet)
    expected = "".join(ch if ch in known else "\ufffd" for ch in text)
    assert bpe.decode(bpe.encode(text)) == expected


def test_bpe_on_a_larger_corpus_fills_its_vocabulary_and_compresses(rng):
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu"]
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 5))) for _ in range(3000)]
    tok = BPETokenizer.train(" ".join(words), vocab_size=300)
    assert tok.vocab_size == 300
    text = " ".join(words[:50])
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) < len(text) / 3


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda: BPETokenizer.train("abc", vocab_size=6),
            ValueError,
            "vocab_size must be at least 7",
        ),
        (
            lambda: BPETokenizer.train("abc", vocab_size=0),
            ValueError,
            "vocab_size must be a positive",
        ),
        (lambda: BPETokenizer.train("abc", vocab_size="9"), TypeError, "vocab_size"),
        (lambda: BPETokenizer.train("", vocab_size=10), ValueError, "corpus must contain"),
        (lambda: BPETokenizer.train(["", ""], vocab_size=10), ValueError, "empty corpus"),
        (lambda: BPETokenizer.train(42, vocab_size=10), TypeError, "corpus must be a str"),
        (lambda: BPETokenizer.train(["ab", 3], vocab_size=10), TypeError, "document of corpus"),
        (
            lambda: BPETokenizer.train("abz", vocab_size=10, alphabet="ab"),
            ValueError,
            "outside the alphabet: ['z']",
        ),
        (lambda: BPETokenizer.train("ab", 10, min_frequency=0), ValueError, "min_frequency"),
        (lambda: CharTokenizer("abca"), ValueError, "must not repeat characters, got ['a']"),
        (lambda: CharTokenizer(["a", "bc"]), TypeError, "single characters"),
        (lambda: CharTokenizer(""), ValueError, "at least one character"),
        (lambda: CharTokenizer(5), TypeError, "alphabet must be a str"),
        (lambda: CharTokenizer.from_corpus(""), ValueError, "corpus must contain"),
        (lambda: BPETokenizer("ab", [("a", "c")]), ValueError, "merges[0] = ('a', 'c') uses 'c'"),
        (lambda: BPETokenizer("ab", [("a", "b"), ("ab", "ba")]), ValueError, "merges[1]"),
        (lambda: BPETokenizer("ab", ["ab"]), TypeError, "merges[0] must be a pair of str"),
        (
            lambda: CharTokenizer("ab").decode(np.array([0, 6])),
            ValueError,
            "below the vocabulary size 6",
        ),
        (lambda: CharTokenizer("ab").decode(np.array([-1])), ValueError, "non-negative"),
        (lambda: CharTokenizer("ab").decode(np.array([4.0])), TypeError, "ids must be an integer"),
        (
            lambda: CharTokenizer("ab").decode(np.array([[4]])),
            ValueError,
            "ids must be one sequence",
        ),
        (lambda: CharTokenizer("ab").encode(b"ab"), TypeError, "text must be a str"),
        (
            lambda: CharTokenizer("ab").encode("ab", unknown="skip"),
            ValueError,
            "unknown must be one of",
        ),
        (lambda: CharTokenizer("ab").token_to_id("<pad>"), ValueError, "not in the vocabulary"),
        (
            lambda: BPETokenizer("ab", [("a", "b")]).tokenize("ab", n_merges=2),
            ValueError,
            "n_merges",
        ),
        (lambda: BPETokenizer("ab").tokenize("ab", n_merges=1.0), TypeError, "n_merges"),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


# ------------------------------------------- merge traces, WordPiece, metaspace, words
SUBWORD_CORPUS = (
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
    tok = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=60, score=score, pretokenize=pretokenize)
    trace = tok.trace
    assert all(isinstance(step, MergeStep) for step in trace)
    assert [step.pair for step in trace] == tok.merges
    assert [step.rank for step in trace] == list(range(len(trace)))
    assert [step.count for step in trace] == tok.merge_counts
    assert [step.token for step in trace] == [a + b for a, b in tok.merges]
    if score == "frequency":
        assert [step.score for step in trace] == [float(step.count) for step in trace]
    # the corpus's length after each merge is what encoding with that many merges gives
    lengths = [len(tok.tokenize(SUBWORD_CORPUS, n_merges=r + 1)) for r in range(len(trace))]
    assert [step.n_tokens for step in trace] == lengths
    assert trace[-1].n_tokens == len(tok.encode(SUBWORD_CORPUS))


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
    tok = BPETokenizer.train(
        SUBWORD_CORPUS, vocab_size=70, score="wordpiece", pretokenize=pretokenize
    )
    text = (
        SUBWORD_CORPUS.replace(" ", SPACE_SYMBOL) if pretokenize == "metaspace" else SUBWORD_CORPUS
    )
    words = [list(w) for w in re.findall(rf"[\s{SPACE_SYMBOL}]*[^\s{SPACE_SYMBOL}]+", text)]
    for step in tok.trace:
        pairs = _pair_counts(words)
        units = Counter(t for w in words for t in w)
        scores = {p: n / (units[p[0]] * units[p[1]]) for p, n in pairs.items() if n >= 2}
        assert step.count == pairs[step.pair]
        assert step.score == pytest.approx(scores[step.pair], rel=1e-15)
        assert step.score == max(scores.values())
        _replay(words, step.pair)
    assert [t for w in words for t in w] == tok.tokenize(SUBWORD_CORPUS)


def test_wordpiece_prefers_pairs_whose_parts_rarely_occur_apart():
    bpe = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=50)
    wordpiece = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=50, score="wordpiece")
    assert bpe.merges != wordpiece.merges
    # the WordPiece score of BPE's first merge is below that of WordPiece's first merge
    first = wordpiece.trace[0]
    a, b = bpe.merges[0]
    units = Counter(SUBWORD_CORPUS)
    assert bpe.trace[0].count / (units[a] * units[b]) < first.score


def test_wordpiece_respects_min_frequency():
    docs = ["ab"] * 4 + ["zq"]  # (z, q) has the best score but occurs once
    assert BPETokenizer.train(docs, vocab_size=20, score="wordpiece").merges == [("a", "b")]
    every = BPETokenizer.train(docs, vocab_size=20, score="wordpiece", min_frequency=1)
    assert every.merges[0] == ("z", "q")


def test_training_with_either_score_is_deterministic():
    for score in ("frequency", "wordpiece"):
        docs = SUBWORD_CORPUS.split("\n")
        a = BPETokenizer.train(docs, vocab_size=55, score=score)
        b = BPETokenizer.train(docs[::-1], vocab_size=55, score=score)
        assert a.trace == b.trace


def test_metaspace_shows_spaces_as_a_symbol_attached_to_the_next_word():
    tok = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=70, pretokenize="metaspace")
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
    tok = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=50, pretokenize="metaspace")
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
    tok = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=10_000, min_frequency=1)
    assert tok.tokenize(SUBWORD_CORPUS) == re.findall(r"\s*\S+|\s+", SUBWORD_CORPUS)


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
def test_bad_subword_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


# ---------------------------------------------------------- saved on their own
TEXT = "the river bank and the bank of the river"


@pytest.mark.parametrize(
    "tokenizer",
    [
        CharTokenizer.from_corpus(TEXT),
        WordTokenizer.from_corpus(TEXT),
        BPETokenizer.train([TEXT], vocab_size=30),
        BPETokenizer.train([TEXT], vocab_size=30, pretokenize="metaspace"),
    ],
    ids=["char", "word", "bpe", "bpe-metaspace"],
)
def test_tokenizers_round_trip_through_json_and_files(tmp_path, tokenizer):
    text = "the bank river"
    rebuilt = tokenizer_from_dict(json.loads(json.dumps(tokenizer.to_dict())))
    assert rebuilt == tokenizer
    assert type(rebuilt) is type(tokenizer)
    np.testing.assert_array_equal(rebuilt.encode(text), tokenizer.encode(text))
    assert load_tokenizer(tokenizer.save(tmp_path / "tok.json")) == tokenizer


def test_tokenizer_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="kind one of \\['bpe', 'char', 'word'\\], got kind 'sp'"):
        tokenizer_from_dict({"kind": "sp"})
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json is not a saved tokenizer"):
        load_tokenizer(tmp_path / "bad.json")
    assert CharTokenizer("ab") != CharTokenizer("ba")  # ids differ
