"""The standard library's docstrings as a corpus (tinyformer.data.corpus): files, order, split, digest."""

from __future__ import annotations

import hashlib
import sys
import textwrap

import pytest

from tinyformer.data.corpus import (
    SEPARATOR,
    SPLITS,
    doctest_bytes,
    excluded,
    module_name,
    source_digest,
    stdlib_docstrings,
)


def _write(root, relative, source):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")


@pytest.fixture
def library(tmp_path):
    """A small folder laid out like the standard library, with every case the rules name."""
    root = tmp_path / "lib"
    _write(root, "alpha.py", '''
        """Alpha module.

        Second paragraph.
        """

        class Box:
            """A box.\tWith a tab."""

            def open(self):
                """Open the box."""

                def inner():
                    """Inner helper."""

            async def close(self):
                """Internal function."""

        def helper():
            """Internal function."""  # a duplicate of Box.close's: dropped here

        if True:
            def late():
                """Defined inside an if."""
    ''')  # fmt: skip
    alpha = root / "alpha.py"  # trailing spaces on a line of the module's docstring
    alpha.write_text(alpha.read_text().replace("paragraph.\n", "paragraph.   \n"))
    _write(root, "beta/__init__.py", '"""The beta package."""\n')
    _write(
        root,
        "beta/gamma.py",
        '''
        """Gamma: part of beta."""

        def empty():
            """   """

        def surrogate():
            """Bad \\udc80 text."""
    ''',
    )
    _write(root, "delta.py", '"""Delta, a module of its own, with some more words in it."""\n')
    _write(root, "epsilon.py", '"""Epsilon.\n\n>>> 1 + 1\n2\n\nDone."""\n')
    _write(root, "zeta.py", "x = 1  # no docstring at all\n")
    _write(root, "broken.py", 'def f(:\n    """Never read."""\n')
    _write(root, "site-packages/third.py", '"""Third-party."""\n')
    _write(root, "idlelib/editor.py", '"""The IDLE editor."""\n')
    _write(root, "turtledemo/demo.py", '"""A demonstration."""\n')
    _write(root, "__phello__/__init__.py", '"""Frozen fixture."""\n')
    _write(root, "__hello__.py", '"""Hello fixture."""\n')
    _write(root, "beta/test/test_gamma.py", '"""Tests of gamma."""\n')
    _write(root, "unittest/tests/test_x.py", '"""Tests of x."""\n')
    return root


def test_files_are_read_in_sorted_order_and_the_excluded_ones_are_left_out(library):
    corpus = stdlib_docstrings(library, heldout_fraction=0.4)
    assert corpus.files == (
        "alpha.py", "beta/__init__.py", "beta/gamma.py", "delta.py", "epsilon.py", "zeta.py",
    )  # fmt: skip
    assert corpus.unparsable == ("broken.py",)


def test_docstrings_come_in_source_order_cleaned_and_without_duplicates(library):
    corpus = stdlib_docstrings(library, heldout_fraction=0.4)
    found = [(d.module, d.owner, d.kind) for d in corpus.documents]
    assert found == [
        ("alpha", "", "module"),
        ("alpha", "Box", "class"),
        ("alpha", "Box.open", "function"),
        ("alpha", "Box.open.inner", "function"),
        ("alpha", "Box.close", "function"),  # its twin in helper() comes later: dropped
        ("alpha", "late", "function"),
        ("beta", "", "module"),
        ("beta.gamma", "", "module"),  # the empty and the surrogate docstrings are left out
        ("delta", "", "module"),
        ("epsilon", "", "module"),
    ]
    assert corpus.documents[0].text == "Alpha module.\n\nSecond paragraph."  # trailing spaces
    assert corpus.documents[1].text == "A box.  With a tab."  # the tab expanded to column 8
    assert corpus.n_found == 11
    assert corpus.n_duplicates == 1


def test_the_split_holds_out_whole_top_level_packages_by_a_rule_anyone_can_recompute(library):
    corpus = stdlib_docstrings(library, heldout_fraction=0.4, validation_fraction=0.3)
    sizes = {}
    for d in corpus.documents:
        sizes[d.top_level] = sizes.get(d.top_level, 0) + len(d.text.encode()) + len(SEPARATOR)
    total = sum(sizes.values())
    held, validation, used = set(), set(), {"h": 0, "v": 0}
    for name in sorted(sizes, key=lambda n: hashlib.sha256(n.encode()).hexdigest()):
        if used["h"] + sizes[name] <= 0.4 * total:
            held.add(name)
            used["h"] += sizes[name]
        elif used["v"] + sizes[name] <= 0.3 * total:
            validation.add(name)
            used["v"] += sizes[name]
    assert corpus.heldout_modules == held
    assert corpus.validation_modules == validation
    assert held
    assert validation
    assert held | validation != set(sizes)
    by_split = {name: corpus.split(name) for name in SPLITS}
    assert {d.top_level for d in by_split["heldout"]} == held
    assert {d.top_level for d in by_split["validation"]} == validation
    assert not {d.top_level for d in by_split["train"]} & (held | validation)
    assert sum(len(docs) for docs in by_split.values()) == len(corpus.documents)
    for name, docs in by_split.items():
        assert corpus.text(name) == SEPARATOR.join(d.text for d in docs)
    assert corpus.n_bytes("heldout") <= 0.4 * total
    assert corpus.n_bytes("validation") <= 0.3 * total
    # the held-out packages do not depend on the validation share
    alone = stdlib_docstrings(library, heldout_fraction=0.4, validation_fraction=0.0)
    assert alone.heldout_modules == held
    assert not alone.split("validation")


def test_the_digest_names_the_text_of_every_split(library, tmp_path):
    corpus = stdlib_docstrings(library, heldout_fraction=0.4)
    joined = b"".join(corpus.text(name).encode() + b"\0" for name in SPLITS)
    assert corpus.digest == hashlib.sha256(joined).hexdigest()
    assert stdlib_docstrings(library, heldout_fraction=0.4).digest == corpus.digest
    other = stdlib_docstrings(library, heldout_fraction=0.6)  # another split, another digest
    if other.heldout_modules != corpus.heldout_modules:
        assert other.digest != corpus.digest


def test_the_source_digest_names_the_files_the_corpus_reads(library, tmp_path):
    first = source_digest(library)
    assert first == source_digest(library)
    _write(library, "idlelib/editor.py", '"""Left out: no change."""\n')
    assert source_digest(library) == first
    _write(library, "zeta.py", "x = 1\n")  # read (no docstring, but it is a source file)
    assert source_digest(library) != first
    with pytest.raises(ValueError, match="root"):
        source_digest(tmp_path / "missing")


def test_files_are_parsed_once_per_process_and_folder(library):
    first = stdlib_docstrings(library, heldout_fraction=0.4)
    _write(library, "delta.py", '"""Changed after the first parse."""\n')
    again = stdlib_docstrings(library, heldout_fraction=0.4)
    assert again.documents == first.documents  # the cached parse, as documented


def test_the_summary_counts_what_the_text_is(library):
    corpus = stdlib_docstrings(library, heldout_fraction=0.4)
    s = corpus.summary()
    assert s["files"] == 6
    assert s["unparsable"] == 1
    assert s["docstrings"] == 10
    assert s["duplicates_dropped"] == 1
    assert sum(s[f"{name}_docstrings"] for name in SPLITS) == 10
    assert s["train_bytes"] == len(corpus.text("train").encode())
    assert s["with_doctests"] == pytest.approx(1 / 10)  # epsilon's
    everything = sum(len(d.text.encode()) for d in corpus.documents)
    assert s["doctest_share"] == pytest.approx(len(">>> 1 + 1\n2\n") / everything)
    assert s["ascii_share"] == 1.0


def test_doctest_bytes_counts_examples_and_their_output_up_to_a_blank_line():
    text = "Sum.\n\n    >>> x = [1,\n    ...      2]\n    >>> sum(x)\n    3\n\nAfter.\n>>> 'é'\n"
    example = "    >>> x = [1,\n    ...      2]\n    >>> sum(x)\n    3\n"
    assert doctest_bytes(text) == len(example.encode()) + len(">>> 'é'\n".encode())
    assert doctest_bytes("No example here; 3 >>> 2 is not one.") == 0
    assert doctest_bytes("") == 0
    with pytest.raises(TypeError, match="text"):
        doctest_bytes(b">>> 1")


def test_paths_and_module_names():
    assert not excluded("json/decoder.py")
    assert excluded("site-packages/numpy/core.py")
    assert excluded("unittest/test/test_case.py")
    assert excluded("idlelib/idle_test/test_x.py")
    assert excluded("idlelib/editor.py")
    assert excluded("turtledemo/clock.py")
    assert not excluded("test.py")  # only folders named test are test suites
    assert module_name("email/mime/text.py") == "email.mime.text"
    assert module_name("json/__init__.py") == "json"
    with pytest.raises(ValueError, match="relative_path"):
        module_name("json/decoder.pyc")
    with pytest.raises(TypeError, match="relative_path"):
        excluded(3)


def test_bad_arguments_are_refused_by_name(library, tmp_path):
    with pytest.raises(ValueError, match="root"):
        stdlib_docstrings(tmp_path / "missing")
    with pytest.raises(TypeError, match="root"):
        stdlib_docstrings(3)
    with pytest.raises(ValueError, match="heldout_fraction"):
        stdlib_docstrings(library, heldout_fraction=0.0)
    with pytest.raises(ValueError, match="heldout_fraction"):
        stdlib_docstrings(library, heldout_fraction=1.0)
    with pytest.raises(ValueError, match="empty"):
        stdlib_docstrings(library, heldout_fraction=0.01)  # no package is that small
    with pytest.raises(ValueError, match="validation_fraction"):
        stdlib_docstrings(library, validation_fraction=-0.1)
    with pytest.raises(ValueError, match=r"heldout_fraction \+ validation_fraction"):
        stdlib_docstrings(library, heldout_fraction=0.5, validation_fraction=0.5)
    (tmp_path / "bare").mkdir()
    _write(tmp_path / "bare", "a.py", "x = 1\n")
    with pytest.raises(ValueError, match="no docstring"):
        stdlib_docstrings(tmp_path / "bare")
    (tmp_path / "compiled" / "__pycache__").mkdir(parents=True)
    (tmp_path / "compiled" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"no \.py source file.*\.pyc"):
        stdlib_docstrings(tmp_path / "compiled")
    doc = stdlib_docstrings(library, heldout_fraction=0.4)
    with pytest.raises(ValueError, match="name"):
        doc.split("test")


@pytest.mark.slow
def test_the_running_interpreters_library_parses_without_importing_anything():
    before = set(sys.modules)
    corpus = stdlib_docstrings()  # about 6 s, once per process
    assert not {"antigravity", "this", "turtledemo"} & (set(sys.modules) - before)
    assert len(corpus.files) > 500
    assert not any(excluded(f) for f in corpus.files)
    texts = [d.text for d in corpus.documents]
    assert len(set(texts)) == len(texts) > 5000
    summary = corpus.summary()
    assert 0.08 < summary["heldout_share"] <= 0.1
    assert summary["train_bytes"] > 1_000_000
    assert "json" in {d.top_level for d in corpus.documents}
