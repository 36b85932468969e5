"""Character and byte-pair-encoding tokenizers: vocabulary layout, merges, round trips, bad input."""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    N_SPECIAL,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    BPETokenizer,
    CharTokenizer,
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
    for (left, right), count in zip(bpe.merges, bpe.merge_counts, strict=True):
        pairs = [(w[i], w[i + 1]) for w in words for i in range(len(w) - 1)]
        assert pairs.count((left, right)) == count
        assert count == max(pairs.count(p) for p in set(pairs))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == (left, right):
                    w[i : i + 2] = [left + right]
                i += 1
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


def test_bpe_trains_fast_on_a_larger_corpus(rng):
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
