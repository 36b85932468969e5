"""WordPiece: BERT's pre-tokenization, greedy longest-match encoding, decoding, training.

The reference tests at the end (marked ``reference``) exchange ``tokenizer.json``
files with Hugging Face's ``tokenizers`` in both directions and compare the ids of
held-out text, and compare the trained vocabularies; the text is docstrings of
standard-library files, read with :mod:`ast` (the modules are not imported).
"""

from __future__ import annotations

import ast
import json
import sysconfig
import unicodedata
from pathlib import Path

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
    SPECIAL_TOKENS,
    UNK_ID,
    BPETokenizer,
)
from tinyformer.data.wordpiece import (
    MAX_INPUT_CHARS_PER_WORD,
    WordPieceTokenizer,
    bert_pretokenize,
    is_bert_punctuation,
    is_bert_whitespace,
)

# ids:          4     5        6        7         8      9      10      11      12     13      14
VOCABULARY = ["un", "unaff", "##aff", "##able", "##a", "##b", "##le", "##ff", "##f", "able", "a"]


@pytest.fixture(scope="module")
def hand() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCABULARY)


def _docstrings(*files: str) -> list[str]:
    """The docstrings of the module, classes and functions of standard-library files."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in files:
        tree = ast.parse((stdlib / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ):
                doc = ast.get_docstring(node)
                if doc:
                    out.append(doc)
    return out


TRAIN_FILES = ("argparse.py", "textwrap.py", "subprocess.py", "inspect.py", "functools.py")
HELD_OUT_FILES = ("typing.py", "unittest/case.py", "email/message.py", "tarfile.py", "shutil.py")


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return _docstrings(*TRAIN_FILES)


@pytest.fixture(scope="module")
def held_out() -> list[str]:
    return _docstrings(*HELD_OUT_FILES)


@pytest.fixture(scope="module")
def trained(corpus) -> WordPieceTokenizer:
    return WordPieceTokenizer.train(corpus, vocab_size=1200)


# ------------------------------------------------------------------ pre-tokenization
def test_pretokenize_splits_at_whitespace_and_isolates_punctuation():
    assert bert_pretokenize("Hey friend!     How are you?!?") == [
        "Hey", "friend", "!", "How", "are", "you", "?", "!", "?",
    ]  # fmt: skip
    # ASCII symbols that Unicode files under S* ($ + < = > ^ ` | ~) are punctuation for
    # BERT; so are Unicode's P* marks (an em dash, guillemets, the ideographic full
    # stop); a currency sign outside ASCII (S*) and accented letters stay in the word.
    assert bert_pretokenize("a$b+c<d>e^f`g|h~i") == list("a$b+c<d>e^f`g|h~i")
    assert bert_pretokenize("x\u2014y \u00abz\u00bb w\u3002") == [
        "x", "\u2014", "y", "\u00ab", "z", "\u00bb", "w", "\u3002",
    ]  # fmt: skip
    assert bert_pretokenize("5\u20ac caf\u00e9") == ["5\u20ac", "caf\u00e9"]
    assert bert_pretokenize("") == []
    assert bert_pretokenize(" \t\n ") == []


def test_whitespace_is_the_unicode_white_space_property():
    # No-break space, ideographic space, next line: whitespace. The information
    # separators U+001C..U+001F are whitespace to str.isspace but not to Unicode.
    for char in "\u00a0\u3000\u0085\u2028\t\r":
        assert is_bert_whitespace(char)
        assert bert_pretokenize(f"a{char}b") == ["a", "b"]
    assert "\x1c".isspace()
    assert not is_bert_whitespace("\x1c")
    assert bert_pretokenize("a\x1cb") == ["a\x1cb"]
    assert not is_bert_whitespace("\u200b")  # zero-width space: a format character (Cf)


def test_punctuation_is_category_p_or_an_ascii_symbol():
    for code in range(0x3000):
        char = chr(code)
        expected = unicodedata.category(char)[0] == "P" or (
            char.isascii() and char.isprintable() and not char.isalnum() and char != " "
        )
        assert is_bert_punctuation(char) == expected, hex(code)


# ------------------------------------------------------------------ encoding
def test_greedy_longest_match_on_a_hand_made_vocabulary(hand):
    # "unaffable": the longest vocabulary entry at 0 is "unaff" (not "un"), then the
    #   rest "able" is looked up as "##able"                          -> unaff ##able
    # "unable": "unab", "una" are absent, "un" then "##able"          -> un ##able
    # "affable": "a" (no "affable", "affabl", ..., "af"), then "##ff"
    #   (no "##ffable", ..., "##ffa"), then "##able"                  -> a ##ff ##able
    # "able": a word-initial piece, so "able" and not "##able"        -> able
    # "ab": no "ab": "a", then "##b"                                  -> a ##b
    assert hand.tokenize("unaffable unable affable able ab") == [
        "unaff", "##able", "un", "##able", "a", "##ff", "##able", "able", "a", "##b",
    ]  # fmt: skip
    assert hand.encode("unaffable unable").tolist() == [5, 7, 4, 7]


def test_a_word_that_greedy_matching_cannot_finish_is_unk_as_a_whole():
    # "abc": the longest start is "ab", and then no "##c": the word is <unk>, though
    # "a" + "##bc" would spell it (BERT's rule, no backtracking).
    tok = WordPieceTokenizer(["a", "ab", "##bc", "c"])
    assert tok.tokenize("abc") == ["<unk>"]
    assert tok.tokenize("a abc c") == ["a", "<unk>", "c"]
    assert tok.encode("abc c").tolist() == [UNK_ID, 7]


def test_unknown_words_become_unk_or_raise(hand):
    # "unaffx": "unaff", then nothing matches "x"; "xable": nothing starts it.
    assert hand.encode("unaffx able xable").tolist() == [UNK_ID, 13, UNK_ID]
    with pytest.raises(ValueError, match=r"word 'xable' at position 10, which the vocabulary"):
        hand.encode("able able xable", unknown="raise")
    with pytest.raises(ValueError, match="unknown must be one of"):
        hand.encode("able", unknown="skip")


def test_a_word_longer_than_the_limit_is_unk(hand):
    at_limit = "un" + "a" * (MAX_INPUT_CHARS_PER_WORD - 2)  # un ##a ##a ...
    assert len(at_limit) == MAX_INPUT_CHARS_PER_WORD
    assert hand.encode(at_limit).tolist() == [4] + [8] * (MAX_INPUT_CHARS_PER_WORD - 2)
    assert hand.encode(at_limit + "a").tolist() == [UNK_ID]
    with pytest.raises(ValueError, match="longer than max_input_chars_per_word=100"):
        hand.encode("able " + at_limit + "a", unknown="raise")
    short = WordPieceTokenizer(VOCABULARY, max_input_chars_per_word=5)
    assert short.encode("unaff unaffa").tolist() == [5, UNK_ID]


def test_special_token_names_in_the_text_are_text_unless_allowed(hand):
    # By default "<eos>" is the words "<", "eos", ">" (none of which this vocabulary
    # spells); with allow_special=True it is the token, as in Hugging Face's tokenizers.
    assert hand.encode("able<eos>").tolist() == [13, UNK_ID, UNK_ID, UNK_ID]
    assert hand.encode("able<eos>un<pad>", allow_special=True).tolist() == [13, EOS_ID, 4, PAD_ID]
    assert hand.encode("a <unk>", unknown="raise", allow_special=True).tolist() == [14, UNK_ID]
    with pytest.raises(ValueError, match="word '<' at position 2"):
        hand.encode("a <unk>", unknown="raise")


def test_other_special_tokens_and_batches():
    tok = WordPieceTokenizer(
        ["a", "##b"], special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    )
    assert tok.tokens == ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]", "a", "##b")
    assert tok.encode("ab [MASK] c", add_bos=True, allow_special=True).tolist() == [1, 5, 6, 4, 3]
    batch = tok.encode_batch(["ab a", "c"], add_eos=True)
    np.testing.assert_array_equal(batch.ids, [[5, 6, 5, 2], [3, 2, 0, 0]])
    assert tok.decode(batch.ids[1], skip_special=False) == "[UNK] [SEP] [PAD] [PAD]"
    assert tok.decode(batch.ids[0]) == "ab a"


def test_bos_and_eos_are_added_on_request(hand):
    assert hand.encode("able", add_bos=True, add_eos=True).tolist() == [BOS_ID, 13, EOS_ID]
    assert hand.encode("").dtype == np.int64
    assert hand.encode("").shape == (0,)


def _longest_first(vocabulary, word, limit=MAX_INPUT_CHARS_PER_WORD):
    """BERT's rule written plainly: try every end, from the word's end backwards."""
    if len(word) > limit:
        return None
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = ("##" if start else "") + word[start:end]
            if piece in vocabulary:
                pieces.append(piece)
                start = end
                break
        else:
            return None
    return pieces


PIECES = st.text(alphabet="abc", min_size=1, max_size=4)


@given(
    st.lists(st.one_of(PIECES, PIECES.map("##".__add__)), min_size=1, max_size=12, unique=True),
    st.lists(st.text(alphabet="abc", min_size=1, max_size=9), max_size=6),
    st.integers(1, 8),
)
def test_encoding_agrees_with_the_plain_rule(vocabulary, words, limit):
    tok = WordPieceTokenizer(vocabulary, max_input_chars_per_word=limit)
    expected = []
    for word in words:
        pieces = _longest_first(set(vocabulary), word, limit)
        expected.extend(["<unk>"] if pieces is None else pieces)
    assert tok.tokenize(" ".join(words)) == expected
    for word in words:  # when a word is spelled, its pieces put together give it back
        pieces = tok.tokenize(word)
        if pieces != ["<unk>"]:
            assert pieces[0] + "".join(p[2:] for p in pieces[1:]) == word


@given(st.text())
def test_encode_never_fails_and_ids_are_in_range(hand, text):
    ids = hand.encode(text, add_bos=True)
    assert ids.dtype == np.int64
    assert ids.ndim == 1
    assert ((ids >= 0) & (ids < hand.vocab_size)).all()
    assert isinstance(hand.decode(ids), str)
    assert len(hand.tokenize(text)) == len(ids) - 1


@given(st.text(alphabet="ab c\n", max_size=40))
def test_decode_puts_one_space_between_words(text):
    tok = WordPieceTokenizer(["a", "b", "c", "##a", "##b", "##c"])
    assert tok.decode(tok.encode(text)) == " ".join(text.split())


# ------------------------------------------------------------------ decoding
def test_decode_joins_pieces_and_puts_spaces_between_words(hand):
    # unaff ##able | un ##able | a ##b  ->  "unaffable unable ab"
    assert hand.decode([5, 7, 4, 7, 14, 9]) == "unaffable unable ab"
    # A first piece keeps its ##, as in Hugging Face's decoder.
    assert hand.decode([7, 4]) == "##able un"
    assert hand.decode([]) == ""


def test_decode_is_not_the_inverse_of_encode():
    tok = WordPieceTokenizer(["f", "x", "(", ")", "=", ".", ",", "!", "a", "b", "##b"])
    text = "f(x) = a,\n  bb!"
    # Whitespace is not kept and punctuation is a word of its own: spaces appear around
    # "(" and ")"; cleanup removes only those in front of ".", "?", "!" and ",".
    assert tok.decode(tok.encode(text)) == "f ( x ) = a, bb!"
    raw = WordPieceTokenizer(tok.vocabulary, cleanup=False)
    assert raw.decode(raw.encode(text)) == "f ( x ) = a , bb !"


def test_decode_drops_or_names_special_tokens(hand):
    ids = [BOS_ID, 13, UNK_ID, 4, 7, EOS_ID, PAD_ID]
    assert hand.decode(ids) == "able \ufffd unable"
    assert hand.decode(ids, skip_special=False) == "<bos> able <unk> unable <eos> <pad>"


def test_decode_checks_its_ids(hand):
    with pytest.raises(ValueError, match="below the vocabulary size 15"):
        hand.decode([15])
    with pytest.raises(ValueError, match=r"shape \(n,\)"):
        hand.decode([[4, 5]])
    with pytest.raises(TypeError, match="integer array"):
        hand.decode([4.0])


# ------------------------------------------------------------------ training
def test_training_by_hand():
    # Words: "aab" twice, "ab" once. Initial vocabulary (characters by code point, then
    # the "##" characters): a=4 b=5 ##a=6 ##b=7; "aab" = a ##a ##b, "ab" = a ##b.
    # Pair counts: (a, ##a) 2, (##a, ##b) 2, (a, ##b) 1. The tie at 2 goes to the
    # smaller ids, (4, 6): "aa" = 8, and "aab" = aa ##b. Then (aa, ##b) 2: "aab" = 9.
    # Then (a, ##b) 1: "ab" = 10, at min_frequency 1 only.
    tok = WordPieceTokenizer.train("aab aab ab", vocab_size=20, min_frequency=1)
    assert tok.tokens[N_SPECIAL:] == ("a", "b", "##a", "##b", "aa", "aab", "ab")
    assert tok.tokenize("aab ab abab") == ["aab", "ab", "ab", "##a", "##b"]
    assert WordPieceTokenizer.train("aab aab ab", vocab_size=20).tokens[-1] == "aab"
    assert WordPieceTokenizer.train("aab aab ab", vocab_size=9).tokens[-1] == "aa"


def test_continuation_order_sets_the_ids_that_break_ties():
    # "ab ac": a=4 b=5 c=6, then ##b=7 ##c=8 by code point. The pairs (a, ##b) = (4, 7)
    # and (a, ##c) = (4, 8) tie at 1 and the smaller ids win: "ab". With ##c before
    # ##b, (a, ##c) = (4, 7) wins: "ac".
    default = WordPieceTokenizer.train("ab ac", vocab_size=10, min_frequency=1)
    assert default.tokens[N_SPECIAL:] == ("a", "b", "c", "##b", "##c", "ab")
    swapped = WordPieceTokenizer.train(
        "ab ac", vocab_size=10, min_frequency=1, continuation_order="cb"
    )
    assert swapped.tokens[N_SPECIAL:] == ("a", "b", "c", "##c", "##b", "ac")


def test_initial_alphabet_adds_word_initial_characters():
    tok = WordPieceTokenizer.train("ab", vocab_size=8, initial_alphabet="z")
    assert tok.tokens[N_SPECIAL:] == ("a", "b", "z", "##b")  # no ##z: never seen inside a word


def test_training_merges_never_cross_words_or_punctuation(trained, corpus):
    words = {w for doc in corpus for w in bert_pretokenize(doc)}
    for piece in trained.vocabulary:
        body = piece.removeprefix("##")
        assert not any(is_bert_whitespace(c) for c in body)
        assert len(body) == 1 or not any(is_bert_punctuation(c) for c in body)
        # A longer word-initial piece was merged from the start of some word.
        assert len(body) == 1 or piece.startswith("##") or any(w.startswith(piece) for w in words)


def test_trained_wordpiece_compresses_held_out_text_like_bpe(corpus, held_out):
    """At the same vocabulary size, about as many tokens per character as frequency BPE.

    Far from the 0.99 tokens per character the merge-score option of BPETokenizer gave
    (issue 26); WordPiece drops whitespace, so it is a little below BPE on this text.
    """
    wordpiece = WordPieceTokenizer.train(corpus, vocab_size=1000)
    bpe = BPETokenizer.train(corpus, vocab_size=1000)
    n_chars = sum(map(len, held_out))
    wp_rate = sum(len(wordpiece.encode(d)) for d in held_out) / n_chars
    bpe_rate = sum(len(bpe.encode(d)) for d in held_out) / n_chars
    assert wp_rate < 0.45
    assert abs(wp_rate - bpe_rate) < 0.1
    unknown = sum(int((wordpiece.encode(d) == UNK_ID).sum()) for d in held_out)
    assert unknown < 0.001 * n_chars


def test_training_is_deterministic_and_ignores_document_order(corpus):
    a = WordPieceTokenizer.train(corpus[:200], vocab_size=400)
    b = WordPieceTokenizer.train(corpus[:200][::-1], vocab_size=400)
    assert a == b


# ------------------------------------------------------------------ saving
def test_to_dict_rebuilds_the_tokenizer(trained, held_out, tmp_path):
    d = json.loads(json.dumps(trained.to_dict()))
    assert d["kind"] == "wordpiece"
    rebuilt = tokenizer_from_dict(d)
    assert isinstance(rebuilt, WordPieceTokenizer)
    assert rebuilt == trained
    np.testing.assert_array_equal(rebuilt.encode(held_out[0]), trained.encode(held_out[0]))
    assert load_tokenizer(trained.save(tmp_path / "wordpiece.json")) == trained
    other = WordPieceTokenizer(["a"], special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[X]"])
    assert tokenizer_from_dict(other.to_dict()) == other


def test_hf_json_round_trip(trained, tmp_path):
    d = json.loads(json.dumps(trained.to_hf_json()))
    assert d["model"]["type"] == "WordPiece"
    assert d["pre_tokenizer"] == {"type": "BertPreTokenizer"}
    assert d["decoder"] == {"type": "WordPiece", "prefix": "##", "cleanup": True}
    assert [d["model"]["vocab"][t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert WordPieceTokenizer.from_hf_json(d) == trained
    (tmp_path / "tokenizer.json").write_text(json.dumps(d), encoding="utf-8")
    assert load_tokenizer(tmp_path) == trained  # a folder with a tokenizer.json


BERT_ORDER = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b"]


def _bert_file() -> dict:
    """BERT's order, [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, then the pieces, as
    another program writes it: no role but the model's unk_token."""
    bert = WordPieceTokenizer(
        ["a", "##b"], special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    ).to_hf_json()
    bert["model"]["vocab"] = {t: i for i, t in enumerate(BERT_ORDER)}
    bert["added_tokens"] = [
        {k: v for k, v in a.items() if k != "tinyformer_role"}
        | {"id": BERT_ORDER.index(a["content"])}
        for a in bert["added_tokens"]
    ]
    return bert


def test_hf_json_with_another_layout_keeps_its_ids():
    # Only the unknown token has a role unless special_tokens (or a tokenizer_config.json)
    # names the others: [PAD] at id 0 is not padding by position.
    bert = _bert_file()
    tok = WordPieceTokenizer.from_hf_json(bert)
    assert tok.tokens == tuple(BERT_ORDER)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (None, None, None, 1)
    assert tok.encode("ab [CLS] x", allow_special=True).tolist() == [5, 6, 2, 1]
    with pytest.raises(ValueError, match=r"encode_batch needs a pad token.*special_tokens="):
        tok.encode_batch(["a", "ab"])
    named = WordPieceTokenizer.from_hf_json(
        bert, special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    )
    assert named.encode("a", add_bos=True, add_eos=True).tolist() == [2, 5, 3]
    assert named.encode_batch(["a", "ab"]).ids.tolist() == [[5, 0], [5, 6]]
    # tinyformer's own file records the roles, whatever the names
    assert WordPieceTokenizer.from_hf_json(named.to_hf_json()) == named


def test_a_bert_folder_takes_its_roles_from_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(_bert_file()), encoding="utf-8")
    alone = load_tokenizer(tmp_path)
    assert (alone.pad_id, alone.bos_id, alone.eos_id, alone.unk_id) == (None, None, None, 1)
    config = {
        "tokenizer_class": "BertTokenizer",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "unk_token": {"content": "[UNK]", "special": True},
        "mask_token": "[MASK]",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    padded = load_tokenizer(tmp_path / "tokenizer.json")
    assert (padded.pad_id, padded.bos_id, padded.eos_id, padded.unk_id) == (0, None, None, 1)
    assert padded.encode_batch(["a", "ab"]).ids.tolist() == [[5, 0], [5, 6]]
    named = load_tokenizer(tmp_path, special_tokens=("[PAD]", "[CLS]", "[SEP]", "[UNK]"))
    assert named.encode("ab", add_bos=True, add_eos=True).tolist() == [2, 5, 6, 3]
    with pytest.raises(ValueError, match="the file's unk_token is '\\[UNK\\]'"):
        load_tokenizer(tmp_path, special_tokens=("[PAD]", "[CLS]", "[SEP]", "[MASK]"))


def _edited(d, path, value):
    d = json.loads(json.dumps(d))
    *keys, last = path
    target = d
    for key in keys:
        target = target[key]
    target[last] = value
    return d


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (
            ("normalizer",),
            {"type": "BertNormalizer", "lowercase": True},
            "normalizer 'BertNormalizer'",
        ),
        (
            ("post_processor",),
            {"type": "TemplateProcessing"},
            "post_processor 'TemplateProcessing'",
        ),
        (("truncation",), {"max_length": 8}, "truncation"),
        (("pre_tokenizer",), {"type": "Whitespace"}, "pre_tokenizer 'Whitespace'"),
        (("pre_tokenizer",), None, "pre_tokenizer None"),
        (("decoder",), {"type": "ByteLevel"}, "WordPiece decoder"),
        (("model", "type"), "BPE", "WordPiece model, got type 'BPE'"),
        (("model", "continuing_subword_prefix"), "@@", "continuing_subword_prefix is '@@'"),
        (("model", "unk_token"), "[UNK]", "unk_token '\\[UNK\\]' is not one of its special"),
        (
            ("model", "vocab"),
            {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, "a": 5},
            "without gaps",
        ),
        (("added_tokens", 0, "lstrip"), True, "sets lstrip"),
        (("added_tokens", 0, "special"), False, "as an ordinary token"),
    ],
)
def test_from_hf_json_refuses_what_it_cannot_express(hand, path, value, words):
    with pytest.raises(ValueError, match=words):
        WordPieceTokenizer.from_hf_json(_edited(hand.to_hf_json(), path, value))


# ------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: WordPieceTokenizer("abc"), TypeError, "vocabulary must be an iterable"),
        (lambda: WordPieceTokenizer(["a", ""]), TypeError, "non-empty strings"),
        (lambda: WordPieceTokenizer(["a", 3]), TypeError, "non-empty strings, got int 3"),
        (lambda: WordPieceTokenizer(["a", "a"]), ValueError, "must not repeat tokens"),
        (lambda: WordPieceTokenizer(["a", "<unk>"]), ValueError, "special tokens' names"),
        (
            lambda: WordPieceTokenizer(
                ["a"], special_tokens=[None, "b", "e", None], vocab=["b", "e", "a"]
            ),
            ValueError,
            "needs an unknown token",
        ),
        (
            lambda: WordPieceTokenizer(["a"], special_tokens=["p", "b"]),
            ValueError,
            "four reserved",
        ),
        (
            lambda: WordPieceTokenizer.train("ab", 9, special_tokens=["p", "b", "e", "a"]),
            ValueError,
            "must not be characters of the alphabet",
        ),
        (lambda: WordPieceTokenizer(["a"], max_input_chars_per_word=0), ValueError, "max_input"),
        (lambda: WordPieceTokenizer(["a"], max_input_chars_per_word=True), TypeError, "max_inp"),
        (lambda: WordPieceTokenizer(["a"], cleanup=1), TypeError, "cleanup must be a bool"),
        (lambda: WordPieceTokenizer(["a"]).encode(b"a"), TypeError, "text must be a str"),
        (lambda: WordPieceTokenizer.train("ab", 6), ValueError, "vocab_size must be at least 7"),
        (lambda: WordPieceTokenizer.train("ab", 0), ValueError, "vocab_size must be a positive"),
        (lambda: WordPieceTokenizer.train("ab", 9, min_frequency=0), ValueError, "min_frequency"),
        (lambda: WordPieceTokenizer.train(" \n", 9), ValueError, "at least one word"),
        (lambda: WordPieceTokenizer.train(3, 9), TypeError, "corpus must be a str"),
        (lambda: WordPieceTokenizer.train(["a", 3], 9), TypeError, "every document of corpus"),
        (
            lambda: WordPieceTokenizer.train("ab", 9, initial_alphabet=["xy"]),
            TypeError,
            "initial_alphabet must hold single characters",
        ),
        (
            lambda: WordPieceTokenizer.train("ab ac", 9, continuation_order="bd"),
            ValueError,
            r"lacks \['c'\] and has \['d'\]",
        ),
        (lambda: WordPieceTokenizer.from_hf_json("{}"), TypeError, "parsed into a dict"),
    ],
)
def test_bad_arguments_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


# ------------------------------------------------------------------ reference: tokenizers
@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("tokenizers")


def _hf_wordpiece(
    hf, corpus, vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS, unk="<unk>"
):
    """A WordPiece trained by Hugging Face's tokenizers (by default with tinyformer's specials)."""
    tok = hf.Tokenizer(hf.models.WordPiece(unk_token=unk))
    tok.pre_tokenizer = hf.pre_tokenizers.BertPreTokenizer()
    tok.decoder = hf.decoders.WordPiece()
    trainer = hf.trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def _assert_same_encoding(ours, theirs, texts):
    n_tokens = 0
    for text in texts:
        ids = ours.encode(text, allow_special=True)
        encoding = theirs.encode(text)
        assert ids.tolist() == encoding.ids, text[:80]
        assert theirs.decode(encoding.ids, skip_special_tokens=False) == ours.decode(
            ids, skip_special=False
        )
        n_tokens += len(ids)
    return n_tokens


@pytest.mark.reference
def test_tokenizers_reads_our_tokenizer_json(hf, trained, held_out, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(trained.to_hf_json()), encoding="utf-8")
    theirs = hf.Tokenizer.from_file(str(path))
    assert theirs.get_vocab() == {t: i for i, t in enumerate(trained.tokens)}
    n_tokens = _assert_same_encoding(trained, theirs, held_out)
    assert n_tokens > 20_000


@pytest.mark.reference
def test_we_read_a_tokenizer_json_that_tokenizers_trained_and_saved(
    hf, corpus, held_out, tmp_path
):
    theirs = _hf_wordpiece(hf, corpus, vocab_size=1500)
    path = tmp_path / "tokenizer.json"
    theirs.save(str(path))
    ours = WordPieceTokenizer.from_hf_json(json.loads(path.read_text(encoding="utf-8")))
    assert ours.vocab_size == theirs.get_vocab_size() == 1500
    n_tokens = _assert_same_encoding(ours, theirs, held_out)
    assert n_tokens > 20_000


@pytest.mark.reference
def test_we_read_a_bert_style_layout_that_tokenizers_trained(hf, corpus, held_out, tmp_path):
    bert = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    theirs = _hf_wordpiece(hf, corpus, vocab_size=1000, special_tokens=bert, unk="[UNK]")
    theirs.save(str(tmp_path / "tokenizer.json"))
    ours = load_tokenizer(tmp_path)
    assert isinstance(ours, WordPieceTokenizer)
    assert ours.tokens[:5] == tuple(bert)
    assert ours.unk_id == 1
    _assert_same_encoding(ours, theirs, [*held_out[:200], "[CLS] a [MASK] b [SEP]"])


@pytest.mark.reference
def test_training_learns_the_vocabulary_of_tokenizers_wordpiece_trainer(hf, corpus):
    """Same corpus, same settings: the same vocabulary, id for id.

    tokenizers numbers the "##" characters in a hash map's order, different in every
    run; its order, read from its vocabulary, is passed as ``continuation_order``.
    """
    for vocab_size, min_frequency in [(800, 2), (3000, 1)]:
        theirs = _hf_wordpiece(hf, corpus, vocab_size, min_frequency)
        vocab = theirs.get_vocab()
        by_id = sorted(vocab, key=vocab.get)
        order = [t[2:] for t in by_id if t.startswith("##") and len(t) == 3]
        ours = WordPieceTokenizer.train(
            corpus, vocab_size, min_frequency=min_frequency, continuation_order=order
        )
        assert {t: i for i, t in enumerate(ours.tokens)} == vocab
        assert ours.vocab_size == vocab_size


@pytest.mark.reference
def test_pretokenization_agrees_with_bert_pretokenizer(hf):
    """Every character of the Latin, Greek, Cyrillic, Hebrew and punctuation blocks.

    (Punctuation added to Unicode from version 9.0 on, in other blocks, is split by this
    module and not by tokenizers 0.23, whose tables are older: see the module's notes.)
    """
    pre = hf.pre_tokenizers.BertPreTokenizer()
    blocks = [*range(0x0600), *range(0x2000, 0x2E43), *range(0x3000, 0x3040), 0xFEFF]
    for code in blocks:
        text = f"a{chr(code)}b c"
        assert [w for w, _ in pre.pre_tokenize_str(text)] == bert_pretokenize(text), hex(code)


TEXT = st.text(
    alphabet=st.sampled_from(
        "abcdefghijklmnopqrstuvwxyz ABCXYZ 0123 .,;:!?'\"()[]-_/\\#@$%&*+=<>~^`|{} \t\n"
        "\u00e9\u00fc\u00df\u00a0\u2014\u2019\u201c\u3000\u4e2d\u6587\U0001f600"
    ),
    max_size=80,
)


@pytest.fixture(scope="module")
def trained_in_tokenizers(hf, trained):
    return hf.Tokenizer.from_str(json.dumps(trained.to_hf_json()))


@pytest.mark.reference
@given(text=TEXT | st.sampled_from(["<eos>", "a<pad>b", "<bos><unk>"]))
def test_ids_agree_with_tokenizers_on_any_text(trained, trained_in_tokenizers, text):
    ids = trained.encode(text, allow_special=True)
    assert ids.tolist() == trained_in_tokenizers.encode(text).ids
