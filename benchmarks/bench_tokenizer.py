"""Time BPE training: tinyformer's BPETokenizer.train against Hugging Face's tokenizers.

Both train on the same text with the same settings: the docstrings of the standard
library, read with ``ast`` from the top-level modules in sorted order until the corpus
has the size asked for (English prose with code examples, nothing downloaded); the same
vocabulary size, ``min_frequency=2``, the four special tokens of tinyformer's layout.
Byte level: tinyformer's ``pretokenize="bytes"``, and on the other side the ByteLevel
pre-tokenizer with all 256 bytes as the initial alphabet (GPT-2's recipe). Words:
tinyformer's ``pretokenize="words"``, and on the other side its own ``tokenizer.json``
pre-tokenization (``BPETokenizer.to_hf_json``). tinyformer trains with ``ties="ids"``,
Hugging Face's tie rule, so both learn the same merges, which the script checks (the
last column). Reading the text into words is part of both timings.

The Rust trainer runs its loops on a thread pool (rayon): the first setting holds it to
one thread (``RAYON_NUM_THREADS=1``), as tinyformer, which is pure Python, always is;
the second leaves it at its default, one thread per logical core. At one thread the two
alternate call by call (``_harness.time_side_by_side``); with more, each runs in a block
of its own after a pause. Times are medians over the repeats; the ratio is tinyformer's
over Hugging Face's.

Run ``python benchmarks/bench_tokenizer.py`` (``--quick`` for fewer repeats).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import sysconfig
from pathlib import Path

import numpy as np
from _harness import blas_settings, cpuinfo, run_setting, time_side_by_side

from tinyformer.data.tokenizers import SPECIAL_TOKENS, BPETokenizer

# (pre-tokenization, corpus size in characters, vocabulary size); the row first
ROWS = [
    ("words", 300_000, 1_000),
    ("bytes", 300_000, 1_000),
    ("bytes", 300_000, 4_000),
    ("bytes", 800_000, 1_000),
]


def stdlib_docstrings(size: int) -> list[str]:
    """Docstrings of the standard library's top-level modules, in sorted order, ``size`` chars."""
    docs, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(doc[: size - total])
                    total += len(docs[-1])
                    if total >= size:
                        return docs
    return docs


def hugging_face_trainer(pretokenize: str, vocab_size: int):
    """A function that trains tokenizers' BPE on a corpus the way tinyformer is set up."""
    import tokenizers  # noqa: PLC0415 (a reference library, imported in the child only)

    def train(docs: list[str]):
        if pretokenize == "bytes":
            hf = tokenizers.Tokenizer(tokenizers.models.BPE())
            hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
            alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
        else:
            empty = BPETokenizer("a", pretokenize=pretokenize).to_hf_json()
            hf = tokenizers.Tokenizer.from_str(json.dumps(empty))
            hf.model = tokenizers.models.BPE(unk_token="<unk>")
            alphabet = []
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=alphabet,
            show_progress=False,
        )
        hf.train_from_iterator(docs, trainer)
        return hf

    return train


def run_child(repeats: int, rayon_threads: int) -> None:
    """Time every row in this process; print the settings, then one JSON line per row."""
    import tokenizers  # noqa: PLC0415

    settings = blas_settings()
    settings["tokenizers"] = tokenizers.__version__
    settings["RAYON_NUM_THREADS"] = os.environ.get("RAYON_NUM_THREADS", "(unset)")
    print(json.dumps({"settings": settings}), flush=True)
    for pretokenize, size, vocab_size in ROWS:
        docs = stdlib_docstrings(size)
        hf_train = hugging_face_trainer(pretokenize, vocab_size)

        def ours(docs=docs, pretokenize=pretokenize, vocab_size=vocab_size):
            return BPETokenizer.train(docs, vocab_size, pretokenize=pretokenize, ties="ids")

        mine, theirs = ours(), hf_train(docs)  # warm-up (the byte pattern is built once), check
        their_merges = [tuple(m) for m in json.loads(theirs.to_str())["model"]["merges"]]
        ours_s, hf_s = time_side_by_side(
            ours, lambda docs=docs, t=hf_train: t(docs), repeats, threads=rayon_threads
        )
        row = {
            "pretokenize": pretokenize,
            "chars": sum(map(len, docs)),
            "vocab_size": vocab_size,
            "merges": len(mine.merges),
            "rayon_threads": rayon_threads,
            "repeats": repeats,
            "ours_s": float(np.median(ours_s)),
            "hf_s": float(np.median(hf_s)),
            "same_merges": mine.merges == their_merges,
        }
        print(json.dumps(row), flush=True)


def _print_table(rows: list[dict]) -> None:
    header = (
        f"{'pretokenize':<11} {'corpus KB':>9} {'vocab':>6} {'merges':>6} {'HF threads':>10}"
        f" {'repeats':>7} {'tinyformer s':>12} {'tokenizers s':>12} {'ratio':>6}"
        f" {'same merges':>11}"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['pretokenize']:<11} {r['chars'] / 1000:>9.0f} {r['vocab_size']:>6}"
            f" {r['merges']:>6} {r['rayon_threads']:>10} {r['repeats']:>7}"
            f" {r['ours_s']:>12.3f} {r['hf_s']:>12.3f} {r['ours_s'] / r['hf_s']:>6.1f}"
            f" {r['same_merges']!s:>11}"
        )
    print(
        "s = median seconds of one training (reading the text into words included);"
        " ratio = tinyformer / tokenizers;\nsame merges: tinyformer with ties='ids' learned"
        " exactly the merges of tokenizers' BpeTrainer"
    )


def main() -> None:
    """Parse the options; run the children (parent) or the timings (child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rayon-threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 3
    if args.child:
        run_child(args.repeats, args.rayon_threads)
        return
    print("BPE training: tinyformer BPETokenizer.train (Python) vs Hugging Face tokenizers (Rust)")
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    rows = []
    cores = os.cpu_count() or 1
    for rayon, label in ((1, "1"), (cores, f"default ({cores}, one per logical core)")):
        child_args = ["--repeats", str(args.repeats), "--rayon-threads", str(rayon)]
        env = {"RAYON_NUM_THREADS": "1"} if rayon == 1 else {}
        rows += run_setting(
            __file__, child_args, threads=1, label=f"tokenizers threads {label}", extra_env=env
        )
    if rows:
        _print_table(rows)


if __name__ == "__main__":
    main()
