"""The tokenizers: characters, byte-pair encoding and its variants, words; round trips, bad input.

The second half covers merge traces, the pmi score (formerly "wordpiece"), the
SentencePiece-style space symbol and word tokens; the third byte-level BPE, the tie rules, an
independent trainer that recounts every pair, special tokens, batches and explicit id layouts.
The exchange with Hugging Face's tokenizer.json is in test_tokenizer_json.py.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import unicodedata
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyformer.data import load_tokenizer, tokenizer_from_dict
from tinyformer.data import tokenizers as module
from tinyformer.data.tokenizers import (
    BOS_ID,
    BYTE_ALPHABET,
    BYTE_SYMBOLS,
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
    _merge_pair,
    _pretokenize,
    gpt2_split,
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


# ------------------------------------------- merge traces, pmi, metaspace, words
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


@pytest.mark.parametrize("score", ["frequency", "pmi"])
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


def test_pmi_score_picks_the_pair_the_formula_says():
    # (a, b) and (a, c) occur 4 times each, (z, q) only twice; but z and q never
    # occur apart: n_zq / (n_z n_q) = 2 / (2 * 2) = 0.5 beats 4 / (8 * 4) = 0.125.
    docs = ["ab"] * 4 + ["ac"] * 4 + ["zq"] * 2
    bpe = BPETokenizer.train(docs, vocab_size=20)
    pmi = BPETokenizer.train(docs, vocab_size=20, score="pmi")
    assert bpe.merges[0] == ("a", "b")
    assert pmi.merges == [("z", "q"), ("a", "b"), ("a", "c")]
    # after zq: (a, b) and (a, c) tie at 4 / (8 * 4) and (a, b) comes first;
    # after ab: only the four a's of "ac" are left, 4 / (4 * 4)
    assert [s.score for s in pmi.trace] == [0.5, 0.125, 0.25]
    assert [s.count for s in pmi.trace] == [2, 4, 4]


@pytest.mark.parametrize("pretokenize", ["words", "metaspace"])
def test_every_pmi_merge_has_the_highest_score_at_its_time(pretokenize):
    tok = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=70, score="pmi", pretokenize=pretokenize)
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


def test_pmi_prefers_pairs_whose_parts_rarely_occur_apart():
    bpe = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=50)
    pmi = BPETokenizer.train(SUBWORD_CORPUS, vocab_size=50, score="pmi")
    assert bpe.merges != pmi.merges
    # the pmi score of BPE's first merge is below that of the pmi trainer's first merge
    first = pmi.trace[0]
    a, b = bpe.merges[0]
    units = Counter(SUBWORD_CORPUS)
    assert bpe.trace[0].count / (units[a] * units[b]) < first.score


def test_pmi_respects_min_frequency():
    docs = ["ab"] * 4 + ["zq"]  # (z, q) has the best score but occurs once
    assert BPETokenizer.train(docs, vocab_size=20, score="pmi").merges == [("a", "b")]
    every = BPETokenizer.train(docs, vocab_size=20, score="pmi", min_frequency=1)
    assert every.merges[0] == ("z", "q")


def test_training_with_either_score_is_deterministic():
    for score in ("frequency", "pmi"):
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
            "score must be one of 'frequency', 'pmi', got 'likelihood'",
        ),
        (lambda: BPETokenizer.train("abab", 10, score=None), ValueError, "score must be one of"),
        (
            lambda: BPETokenizer.train("abab", 10, pretokenize="chars"),
            ValueError,
            "pretokenize must be one of 'words', 'metaspace', 'bytes', got 'chars'",
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
    with pytest.raises(
        ValueError, match=r"kind one of \['bpe', 'char', 'word', 'wordpiece'\], got kind 'sp'"
    ):
        tokenizer_from_dict({"kind": "sp"})
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json is not a saved tokenizer"):
        load_tokenizer(tmp_path / "bad.json")
    assert CharTokenizer("ab") != CharTokenizer("ba")  # ids differ


def test_the_old_score_name_says_what_it_is_now():
    with pytest.raises(ValueError, match="is now called") as info:
        BPETokenizer.train("abab", 10, score="wordpiece")
    message = str(info.value)
    assert "score='pmi'" in message
    assert "tinyformer.data.wordpiece.WordPieceTokenizer" in message


# ------------------------------------------------------------------ byte level
def test_byte_symbols_are_gpt2s_printable_map():
    assert len(set(BYTE_SYMBOLS)) == 256
    assert all(s.isprintable() and not s.isspace() for s in BYTE_SYMBOLS)
    assert (BYTE_SYMBOLS[ord(" ")], BYTE_SYMBOLS[ord("\n")]) == ("Ġ", "Ċ")
    assert (BYTE_SYMBOLS[0], BYTE_SYMBOLS[0xAD]) == ("\u0100", "\u0143")  # 0xAD moves 68th
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or (0xA1 <= b <= 0xFF and b != 0xAD)]
    assert all(BYTE_SYMBOLS[b] == chr(b) for b in printable)
    assert sum(ord(s) >= 0x100 for s in BYTE_SYMBOLS) == 68
    assert list(BYTE_ALPHABET) == sorted(BYTE_SYMBOLS)
    assert BYTE_ALPHABET[:3] == ("!", '"', "#")  # GPT-2's ids 0, 1, 2


@pytest.fixture(scope="module")
def byte_bpe() -> BPETokenizer:
    return BPETokenizer.train(SUBWORD_CORPUS + "\n" + CORPUS, vocab_size=290, pretokenize="bytes")


TRICKY_TEXTS = [
    "",
    "héllo ☃",  # the example
    "e\u0301 a\u0308\u0304",  # combining marks after their base letters
    "日本語のテキスト、中文。",
    "emoji 👍🏽 and a family 👨‍👩‍👧",  # a skin tone and zero-width joiners
    "windows\r\nline\rends\n",
    "\x00\x1c\x7f\ufeff\u200b",  # NUL, a file separator, DEL, BOM, zero-width space
    "tabs\t\tand   spaces  ",
    "lone \ud800 and \udfff surrogates",
    "don't, I'LL; 2024-01-01: x² ½ Ⅻ",
]


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_byte_level_round_trips_any_text_without_unknown(byte_bpe, text):
    ids = byte_bpe.encode(text, add_bos=True, add_eos=True, unknown="raise")
    assert UNK_ID not in ids
    assert byte_bpe.decode(ids) == text
    assert "".join(byte_bpe.tokenize(text)) == "".join(
        BYTE_SYMBOLS[b] for b in text.encode("utf-8", "surrogatepass")
    )


@given(st.text(st.characters(exclude_categories=()), max_size=40))
def test_byte_level_round_trip_property(byte_bpe, text):
    ids = byte_bpe.encode(text)
    assert ids.dtype == np.int64
    assert (ids >= N_SPECIAL).all()
    assert (ids < byte_bpe.vocab_size).all()
    assert byte_bpe.decode(ids) == text


def test_byte_level_without_merges_is_one_token_per_byte():
    tok = BPETokenizer(pretokenize="bytes")
    assert tok.vocab_size == N_SPECIAL + 256
    text = "aé☃"
    expected = [N_SPECIAL + BYTE_ALPHABET.index(BYTE_SYMBOLS[b]) for b in text.encode()]
    assert tok.encode(text).tolist() == expected
    assert len(expected) == 1 + 2 + 3


def test_byte_level_decode_mends_characters_split_across_tokens_and_marks_bad_bytes():
    tok = BPETokenizer(pretokenize="bytes")

    def ids(data: bytes) -> list[int]:
        return [tok.token_to_id(BYTE_SYMBOLS[b]) for b in data]

    snowman = "☃".encode()
    # a skipped special token between the bytes of one character does not split it
    assert tok.decode([*ids(snowman[:1]), EOS_ID, *ids(snowman[1:])]) == "☃"
    assert tok.decode([*ids(snowman[:1]), EOS_ID], skip_special=False) == "\ufffd<eos>"
    assert tok.decode(ids(b"\xff")) == "\ufffd"  # never a UTF-8 byte
    assert tok.decode(ids(snowman[:2] + b"a")) == "\ufffda"  # a truncated character
    assert tok.decode(ids("\udc80".encode("utf-8", "surrogatepass"))) == "\udc80"


def test_byte_level_training_learns_space_led_words(byte_bpe):
    assert byte_bpe.alphabet == BYTE_ALPHABET
    assert byte_bpe.vocab_size == 290
    assert {"Ġthe", "Ġbaker"} <= set(byte_bpe.tokens)
    assert byte_bpe.tokenize(" the baker") == ["Ġthe", "Ġbaker"]
    # pieces never merge across GPT-2's split: a letter never joins a digit or a mark
    for left, right in byte_bpe.merges:
        piece = _byte_text(left + right)
        assert gpt2_split(piece) == [piece]


def _byte_text(symbols: str) -> str:
    return bytes(BYTE_SYMBOLS.index(s) for s in symbols).decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("Hello world", ["Hello", " world"]),
        ("it's they're I'LL", ["it", "'s", " they", "'re", " I", "'", "LL"]),  # case-sensitive
        ("a   b", ["a", "  ", " b"]),  # a whitespace run leaves its last space to the word
        ("a \n\nb", ["a", " \n", "\n", "b"]),  # ... which only a space can join
        ("end   ", ["end", "   "]),
        ("x2024 x²½Ⅻ", ["x", "2024", " x", "²½Ⅻ"]),  # numbers: Nd, No and Nl alike
        ("café naïve", ["café", " naïve"]),
        ("e\u0301!?", ["e", "\u0301!?"]),  # a combining mark is neither letter nor number
        ("a\x1cb", ["a", "\x1c", "b"]),  # U+001C is \s in Python, not in Unicode
        ("日本語 text", ["日本語", " text"]),
    ],
)
def test_gpt2_split_by_hand(text, pieces):
    assert gpt2_split(text) == pieces


@given(st.text(st.characters(exclude_categories=()), max_size=60))
def test_gpt2_split_covers_the_text(text):
    assert "".join(gpt2_split(text)) == text


def test_unicode_classes_of_the_split_match_unicodedata():
    everything = "".join(map(chr, range(0x110000)))
    assert "".join(re.findall(r"\s", everything)) == module._PYTHON_SPACES
    white = "".join(
        c
        for c in everything[:0x3001]
        if c in "\t\n\x0b\x0c\r\x85" or unicodedata.category(c) in ("Zs", "Zl", "Zp")
    )
    assert "".join(re.findall(f"[{module._WHITE_SPACE}]", everything)) == white
    high = everything[module._LAST_LETTER_OR_NUMBER + 1 :]
    assert not any(unicodedata.category(c)[0] in "LN" for c in high)
    sample = everything[:0x3000] + everything[0x1F000:0x20100]
    pattern = module._gpt2_pattern()
    for c in sample:
        kind = unicodedata.category(c)[0]
        piece = pattern.match(" " + c + c)
        if kind in "LN":
            assert piece.group() == " " + c + c, c  # the letter or number run takes the space
        elif c not in white:
            assert piece.group() == " " + c + c, c  # so does a run of other symbols


def test_byte_level_bad_input_is_named():
    with pytest.raises(ValueError, match="alphabet must be None with pretokenize='bytes'"):
        BPETokenizer.train("abc", 300, pretokenize="bytes", alphabet="abc")
    with pytest.raises(ValueError, match="must hold byte symbols"):
        BPETokenizer("aé☃", pretokenize="bytes")
    with pytest.raises(TypeError, match="alphabet is required with pretokenize='words'"):
        BPETokenizer()
    with pytest.raises(ValueError, match="vocab_size must be at least 260"):
        BPETokenizer.train("abc", 259, pretokenize="bytes")


def test_a_byte_alphabet_without_unknown_token_leaves_missing_bytes_out():
    """As tokenizers does when a file lacks some bytes and names no unk_token."""
    alphabet = [BYTE_SYMBOLS[b] for b in b"abc"]
    vocab = ["<|endoftext|>", *alphabet, "ab", "abc"]
    tok = BPETokenizer(
        alphabet,
        [("a", "b"), ("ab", "c")],
        pretokenize="bytes",
        special_tokens=(None, None, "<|endoftext|>", None),
        vocab=vocab,
    )
    # x is not in the alphabet: it goes, and a + b + c merge across the gap
    assert tok.tokenize("axbc") == ["abc"]
    assert tok.encode("axbc").tolist() == [vocab.index("abc")]
    with pytest.raises(ValueError, match="'x' at position 1"):
        tok.encode("axbc", unknown="raise")


# ------------------------------------------------------------------ tie rules
def test_ties_by_strings_or_by_ids():
    # (a, b) is merged first (5 times); then (ab, x) and (b, y) tie at 3. By strings
    # "ab" < "b"; by ids "ab", a merged token, comes after the single character b.
    docs = ["abx"] * 3 + ["by"] * 3 + ["ab"] * 2
    by_strings = BPETokenizer.train(docs, vocab_size=20, ties="strings")
    by_ids = BPETokenizer.train(docs, vocab_size=20, ties="ids")
    assert by_strings.merges[:2] == [("a", "b"), ("ab", "x")]
    assert by_ids.merges[:2] == [("a", "b"), ("b", "y")]
    assert BPETokenizer.train(docs, vocab_size=20).merges == by_strings.merges  # the default
    with pytest.raises(ValueError, match="ties must be one of 'strings', 'ids', got 'id'"):
        BPETokenizer.train(docs, vocab_size=20, ties="id")


def _naive_train(
    docs: list[str], vocab_size: int, *, score: str, ties: str, pretokenize: str
) -> list[tuple[tuple[str, str], int]]:
    """Byte-pair encoding by recounting every pair of every word at every step."""
    words = Counter(w for d in docs for w in _pretokenize(d, pretokenize))
    segmented = {w: list(w) for w in words}
    alphabet = BYTE_ALPHABET if pretokenize == "bytes" else sorted(set().union(*words))
    order = {s: k for k, s in enumerate(alphabet)}
    merges = []
    while len(order) < vocab_size - N_SPECIAL:
        pairs, units = Counter(), Counter()
        for w, n in words.items():
            for p in itertools.pairwise(segmented[w]):
                pairs[p] += n
            for t in segmented[w]:
                units[t] += n
        pairs = {p: n for p, n in pairs.items() if n >= 2}
        if not pairs:
            break

        def rank(p, pairs=pairs, units=units):
            value = pairs[p] if score == "frequency" else pairs[p] / (units[p[0]] * units[p[1]])
            tie = p if ties == "strings" else (order[p[0]], order[p[1]])
            return (-value, -pairs[p], tie)

        best = min(pairs, key=rank)
        merges.append((best, pairs[best]))
        order.setdefault(best[0] + best[1], len(order))
        for w in words:
            segmented[w] = _merge_pair(segmented[w], best)
    return merges


@pytest.mark.parametrize("score", ["frequency", "pmi"])
@pytest.mark.parametrize("ties", ["strings", "ids"])
@given(docs=st.lists(st.text(alphabet="abcab cé\n", max_size=30), min_size=1, max_size=6))
def test_incremental_training_equals_recounting_everything(score, ties, docs):
    if not "".join(docs):
        docs = ["a"]
    pretokenize = "bytes" if "é" in "".join(docs) else "words"
    size = (N_SPECIAL + 256 if pretokenize == "bytes" else 0) + 30
    tok = BPETokenizer.train(docs, size, score=score, ties=ties, pretokenize=pretokenize)
    naive = _naive_train(docs, size, score=score, ties=ties, pretokenize=pretokenize)
    assert list(zip(tok.merges, tok.merge_counts, strict=True)) == naive


def test_a_token_made_twice_segments_as_tokenizers_does():
    # "abcd" is made by merge 3 (a + bcd) and again by merge 5 (ab + cd). In "abcdabcd",
    # after (a, b) and (c, d) the lowest rank is 5 at two places; merging the leftmost
    # one lets merge 4 (abcd + ab), which ranks before 5, take the second "ab":
    # [ab, cd, ab, cd] -> [abcd, ab, cd] -> [abcdab, cd]. Merging both at once would
    # give [abcd, abcd].
    merges = [("a", "b"), ("c", "d"), ("b", "cd"), ("a", "bcd"), ("abcd", "ab"), ("ab", "cd")]
    tok = BPETokenizer("abcd", merges)
    assert tok.tokenize("abcdabcd") == ["abcdab", "cd"]
    assert tok.tokenize("abcd") == ["abcd"]


# --------------------------------------------------------------- special tokens
GPT_STYLE = ("<|pad|>", "<|bos|>", "<|endoftext|>", "<|unk|>", "<|sep|>")


@pytest.fixture(scope="module")
def named() -> BPETokenizer:
    alphabet = sorted(set(SUBWORD_CORPUS + "".join(GPT_STYLE)))
    return BPETokenizer.train(SUBWORD_CORPUS, 45, alphabet=alphabet, special_tokens=GPT_STYLE)


def test_special_tokens_can_be_named_and_extended(named):
    assert named.tokens[:5] == GPT_STYLE
    assert named.special_tokens == GPT_STYLE
    assert (named.pad_id, named.bos_id, named.eos_id, named.unk_id) == (0, 1, 2, 3)
    assert named.special_id("<|sep|>") == 4
    assert named.alphabet[0] == named.tokens[5]
    assert named.vocab_size == 45
    ids = named.encode("the baker", add_bos=True, add_eos=True)
    assert (ids[0], ids[-1]) == (1, 2)
    assert named.decode(ids) == "the baker"
    assert named.decode(ids, skip_special=False) == "<|bos|>the baker<|endoftext|>"
    assert tokenizer_from_dict(json.loads(json.dumps(named.to_dict()))) == named


def test_special_names_in_text_are_text_unless_allowed(named):
    text = "the baker<|sep|>walked<|endoftext|>"
    plain = named.encode(text)
    assert not set(plain.tolist()) & set(range(5))
    assert named.decode(plain) == text  # spelled out in characters, so it comes back
    allowed = named.encode(text, allow_special=True).tolist()
    assert (allowed.count(4), allowed[-1]) == (1, 2)
    assert named.decode(allowed) == "the bakerwalked"
    assert named.decode(allowed, skip_special=False) == text
    assert allowed[: allowed.index(4)] == named.encode("the baker").tolist()


def test_the_longest_special_name_wins():
    tok = BPETokenizer("ab<>|", special_tokens=(*SPECIAL_TOKENS, "<|", "<|a|>"))
    ids = tok.encode("b<|a|>a<|", allow_special=True).tolist()
    assert ids == [tok.token_to_id("b"), 5, tok.token_to_id("a"), 4]


@pytest.mark.parametrize(
    ("special_tokens", "error", "words"),
    [
        (("<pad>", "<bos>", "<eos>"), ValueError, "at least the four reserved tokens"),
        (("<pad>", "<bos>", "<eos>", "<pad>"), ValueError, "must not repeat, got ['<pad>']"),
        (("<pad>", "<bos>", None, "<unk>"), TypeError, "special_tokens[2] must be a non-empty"),
        (("<pad>", "<bos>", "<eos>", "<unk>", ""), TypeError, "special_tokens[4]"),
        ("<pad>", TypeError, "special_tokens must be a sequence of str"),
    ],
)
def test_bad_special_tokens_are_named(special_tokens, error, words):
    with pytest.raises(error) as info:
        BPETokenizer.train("abab", 20, special_tokens=special_tokens)
    assert words in str(info.value)


def test_special_id_names_unknown_special_tokens(named):
    with pytest.raises(ValueError, match="'<sep>' is not a special token"):
        named.special_id("<sep>")


# --------------------------------------------------------------------- batches
def test_encode_batch_pads_and_masks(bpe):
    texts = ["the cat", "", "the dog sat on the mat"]
    batch = bpe.encode_batch(texts, add_eos=True)
    rows = [bpe.encode(t, add_eos=True) for t in texts]
    n = max(len(r) for r in rows)
    assert batch.ids.shape == batch.mask.shape == (3, n)
    assert (batch.ids.dtype, batch.mask.dtype) == (np.int64, bool)
    for b, row in enumerate(rows):
        np.testing.assert_array_equal(batch.ids[b, : len(row)], row)
        assert (batch.ids[b, len(row) :] == PAD_ID).all()
        assert batch.mask[b].tolist() == [True] * len(row) + [False] * (n - len(row))
    assert batch.lengths.tolist() == [len(r) for r in rows]
    wide = bpe.encode_batch(texts, add_eos=True, pad_to=n + 3)
    assert wide.ids.shape == (3, n + 3)
    np.testing.assert_array_equal(wide.ids[:, :n], batch.ids)
    assert bpe.encode_batch([]).ids.shape == (0, 0)


@given(st.lists(st.text(alphabet="the cat sond\nmgl<>pad", max_size=20), max_size=5))
def test_encode_batch_rows_are_encode(bpe, texts):
    batch = bpe.encode_batch(texts, add_bos=True, allow_special=True)
    for b, text in enumerate(texts):
        ids = bpe.encode(text, add_bos=True, allow_special=True)
        np.testing.assert_array_equal(batch.ids[b][batch.mask[b]], ids)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda t: t.encode_batch("the cat"), TypeError, "use encode for one text"),
        (lambda t: t.encode_batch(["a", 3]), TypeError, "texts[1] must be a str"),
        (lambda t: t.encode_batch(["a", "the cat"], pad_to=1), ValueError, "texts[1] encodes to"),
        (lambda t: t.encode_batch(["a"], pad_to=0), ValueError, "pad_to must be a positive"),
        (lambda t: t.encode_batch(["a"], pad_to=2.0), TypeError, "pad_to"),
        (lambda t: t.encode_batch(["a"], unknown="skip"), ValueError, "unknown must be one of"),
    ],
)
def test_encode_batch_errors_are_named(bpe, call, error, words):
    with pytest.raises(error) as info:
        call(bpe)
    assert words in str(info.value)


# ---------------------------------------------------------- explicit id layouts
def test_an_explicit_vocab_lays_out_the_ids():
    # GPT-2's layout: bytes and merges first, the end-of-text token last
    alphabet = [BYTE_SYMBOLS[b] for b in b" ab"]
    vocab = [*alphabet, "ab", "Ġab", "<|endoftext|>"]
    tok = BPETokenizer(
        alphabet,
        [("a", "b"), ("Ġ", "ab")],
        pretokenize="bytes",
        special_tokens=(None, None, "<|endoftext|>", None),
        vocab=vocab,
    )
    assert tok.tokens == tuple(vocab)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (None, None, 5, None)
    assert tok.encode("ab ab", add_eos=True).tolist() == [3, 4, 5]
    assert tok.decode([3, 4, 5]) == "ab ab"
    with pytest.raises(ValueError, match="add_bos needs a bos token, but this tokenizer has none"):
        tok.encode("ab", add_bos=True)
    with pytest.raises(ValueError, match=r"load_tokenizer\(path, special_tokens=\.\.\.\)"):
        tok.encode("ab", add_bos=True)  # the error says how to name the role
    with pytest.raises(ValueError, match="encode_batch needs a pad token"):
        tok.encode_batch(["ab"])
    assert tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))) == tok


@pytest.mark.parametrize(
    ("vocab", "words"),
    [
        (["a", "b", "<pad>", "<bos>", "<eos>"], "it lacks ['<unk>']"),
        (["a", "b", "<pad>", "<bos>", "<eos>", "<unk>", "c"], "has ['c'] besides"),
        (["a", "a", "b", "<pad>", "<bos>", "<eos>", "<unk>"], "must not repeat tokens"),
        ("ab", "vocab must be a sequence of str"),
    ],
)
def test_bad_explicit_vocab_is_named(vocab, words):
    with pytest.raises((ValueError, TypeError)) as info:
        BPETokenizer("ab", vocab=vocab)
    assert words in str(info.value)
