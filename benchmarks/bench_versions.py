"""Time the same workloads under two versions of tinyformer: what a change to the source cost.

Give two source trees (the folders that hold the ``tinyformer`` package), e.g. a
git worktree of an older commit and the working tree::

    git worktree add /tmp/base 94869d3
    python benchmarks/bench_versions.py --old /tmp/base/src --new src

The workloads, at one BLAS thread, in float32 and float64:

- **train**: one training step (zero_grad, forward, cross-entropy, backward,
  AdamW) of each model family at the book's sizes (``_workloads.py``, the
  models of ``bench_training_step.py``);
- **block**: forward and backward of one post-norm encoder block at the two sizes
  of ``bench_encoder_block.py``;
- **generate**: greedy generation with the key/value cache, per token, on the
  model, prompt, batches and lengths of ``bench_generation.py``.

They use only what both versions offer: the model and configuration classes,
``forward`` and ``backward``, ``cross_entropy``, ``AdamW``, ``greedy``,
``save_checkpoint`` and ``load_model``. Where the two need different code (the
block class, the layout of the attention weights) the script asks the module
what it has.

**Same weights, same results.** The old tree's child first builds every model
from a fixed seed and writes it with ``save_checkpoint``, with its batch; both
children then load those files with ``load_model`` (a newer tinyformer reads an
older checkpoint). The block's weights are drawn from a seed in the attention
chapter's terms (W_Q, W_K, W_V, W_O) and written into whichever layout the
version has. Each child saves what it computed while warming up (the first
logits and the losses of the warm-up steps; the block's output and input
gradient; the generated tokens and their log-probabilities), and the table
prints the largest difference between old and new: the ratio compares two
computations of the same function.

**Timing.** Each tree runs in a child process of its own, started with that tree
first on ``PYTHONPATH`` (the child refuses to run if ``tinyformer`` is imported
from elsewhere), one BLAS thread, freed memory kept for reuse
(``tinyformer.runtime.retain_freed_memory``, as ``bench_training_step.py``).
Both children stay alive; for each workload they build and warm it up, then the
parent has them time one call each in turn, ``--repeats`` times, the old one
first in even repeats and the new one first in odd ones, so that slow phases of
a shared machine fall on both (while one child times, the other waits on its
pipe). Each call is timed by the child itself (wall clock and processor time,
after a garbage collection). The table gives the medians over the repeats,
their ratio new / old (above 1: the new code is slower), the same ratio in
processor time (which a busy machine disturbs less), and the middle half
(quartiles) of the ratios of the repeats' pairs of calls.

Run ``python benchmarks/bench_versions.py --old OLD/src --new NEW/src`` (``--quick``
for 3 repeats, ``--only train block generate`` for some groups). ``nox -s
benchmarks`` does not run it: it needs the two trees.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _harness import blas_settings, child_env, cpuinfo
from _workloads import BLOCK_SIZES, FAMILIES, training_batch, training_model, training_step
from bench_kv_cache import BATCHES, MODEL, NEW_TOKENS, PROMPT_LENGTH

# In a child, PYTHONPATH puts the tree under test first: these are that version's modules.
import tinyformer
from tinyformer import blocks
from tinyformer.checkpoint import save_checkpoint
from tinyformer.generation import greedy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM, load_model
from tinyformer.runtime import retain_freed_memory

DTYPES = ["float32", "float64"]
GROUPS = ["train", "block", "generate"]


# ----------------------------------------------------------------- workloads
def workloads(groups: list[str]) -> list[dict]:
    """Every workload of ``groups``, in the order they run: its group, name, dtype and key."""
    kinds: list[dict] = []
    if "train" in groups:
        kinds += [{"group": "train", "name": family, "family": family} for family in FAMILIES]
    if "block" in groups:
        for size in BLOCK_SIZES:
            name = f"B={size['batch']} T={size['seq_len']} d={size['d_model']}"
            kinds.append({"group": "block", "name": name, "size": size})
    if "generate" in groups:
        for batch in BATCHES:
            for n in NEW_TOKENS:
                name = f"batch {batch}, {n} new"
                kinds.append({"group": "generate", "name": name, "batch": batch, "n": n})
    rows = []
    for kind in kinds:
        for dtype_name in DTYPES:
            text = f"{kind['group']}-{kind['name']}-{dtype_name}"
            key = "".join(c if c.isalnum() else "_" for c in text)  # also a file name
            rows.append({**kind, "dtype": dtype_name, "key": key})
    return rows


def prepare(folder: Path, groups: list[str]) -> None:
    """Build every model and batch from its seed and write them to ``folder`` (old tree)."""
    for w in workloads(groups):
        if w["group"] == "train":
            rng = np.random.default_rng(0)
            model = training_model(w["family"], w["dtype"], rng)
            inputs, target = training_batch(w["family"], rng)
            save_checkpoint(folder / f"{w['key']}.npz", model)
            arrays = {f"input{i}": x for i, x in enumerate(inputs)}
            np.savez(folder / f"{w['key']}-batch.npz", target=target, **arrays)
        elif w["group"] == "generate" and not (folder / f"generate-{w['dtype']}.npz").exists():
            config = DecoderOnlyConfig(**MODEL, dtype=w["dtype"])
            model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
            save_checkpoint(folder / f"generate-{w['dtype']}.npz", model)


def _block_weights(size: dict, dtype_name: str) -> dict[str, np.ndarray]:
    """A block's weights in the attention chapter's terms, drawn from a fixed seed."""
    rng = np.random.default_rng(0)
    d, d_ff = size["d_model"], size["d_ff"]

    def draw(shape: tuple[int, ...], scale: float, mean: float = 0.0) -> np.ndarray:
        return (mean + scale * rng.standard_normal(shape)).astype(dtype_name)

    weights = {name: draw((d, d), d**-0.5) for name in ("W_Q", "W_K", "W_V", "W_O")}
    weights |= {name: draw((d,), 0.1) for name in ("b_Q", "b_K", "b_V", "b_O")}
    weights |= {"W_1": draw((d, d_ff), d**-0.5), "b_1": draw((d_ff,), 0.1)}
    weights |= {"W_2": draw((d_ff, d), d_ff**-0.5), "b_2": draw((d,), 0.1)}
    for i in (1, 2):
        weights |= {f"gain_{i}": draw((d,), 0.1, 1.0), f"bias_{i}": draw((d,), 0.1)}
    return weights


def _make_block(size: dict, dtype_name: str):
    """One post-norm ReLU encoder block with :func:`_block_weights`, in this version's classes."""
    block_class = getattr(blocks, "TransformerBlock", None) or blocks.EncoderBlock
    d, h, d_ff = size["d_model"], size["n_heads"], size["d_ff"]
    block = block_class(d, h, d_ff, rng=np.random.default_rng(0), dtype=np.dtype(dtype_name))
    w = _block_weights(size, dtype_name)
    attention, ffn = block.self_attention.layer, block.feed_forward.layer
    if hasattr(attention, "q_proj"):  # four Linear layers, weights (d_in, d_out)
        names = {"Q": "q_proj", "K": "k_proj", "V": "v_proj", "O": "out_proj"}
        pairs = [(getattr(attention, layer), p) for p, layer in names.items()]
        targets = [(layer.weight, w[f"W_{p}"]) for layer, p in pairs]
        targets += [(layer.bias, w[f"b_{p}"]) for layer, p in pairs]
    else:  # one fused projection: columns [W_Q | W_K | W_V], and w_out
        targets = [
            (attention.w_qkv, np.concatenate([w["W_Q"], w["W_K"], w["W_V"]], axis=1)),
            (attention.b_qkv, np.concatenate([w["b_Q"], w["b_K"], w["b_V"]])),
            (attention.w_out, w["W_O"]),
            (attention.b_out, w["b_O"]),
        ]
    targets += [
        (ffn.linear_in.weight, w["W_1"]),
        (ffn.linear_in.bias, w["b_1"]),
        (ffn.linear_out.weight, w["W_2"]),
        (ffn.linear_out.bias, w["b_2"]),
    ]
    for i, residual in enumerate((block.self_attention, block.feed_forward), start=1):
        targets += [(residual.norm.gain, w[f"gain_{i}"]), (residual.norm.bias, w[f"bias_{i}"])]
    if sum(p.value.size for p, _ in targets) != sum(p.value.size for p in block.parameters()):
        raise RuntimeError("the block has parameters this benchmark does not set")
    for parameter, value in targets:
        parameter.value[...] = value
    return block


def _train(folder: Path, w: dict, warm_up: int = 3):
    """A step function on the prepared model and batch, and what it computed while warming up."""
    model = load_model(folder / f"{w['key']}.npz").train()
    with np.load(folder / f"{w['key']}-batch.npz") as batch:
        inputs = tuple(batch[f"input{i}"] for i in range(len(batch.files) - 1))
        target = batch["target"]
    logits = model.forward(*inputs).copy()
    step = training_step(model, inputs, target)
    losses = [step() for _ in range(warm_up)]
    return step, {"logits": logits, "losses": np.array(losses)}


def _block(w: dict, warm_up: int = 2):
    """Forward and backward of the block, and its first output and input gradient."""
    size = w["size"]
    block = _make_block(size, w["dtype"])
    rng = np.random.default_rng(1)
    shape = (size["batch"], size["seq_len"], size["d_model"])
    x = rng.standard_normal(shape).astype(w["dtype"])
    grad = rng.standard_normal(shape).astype(w["dtype"])

    def step():
        return block.forward(x), block.backward(grad)

    out, grad_x = (a.copy() for a in step())
    for _ in range(warm_up - 1):
        step()
    return step, {"output": out, "grad_x": grad_x}


def _generate(folder: Path, w: dict, models: dict):
    """Greedy generation of ``n`` tokens with the cache, and its first result."""
    if w["dtype"] not in models:  # load_model gives the model in evaluation mode
        models[w["dtype"]] = load_model(folder / f"generate-{w['dtype']}.npz")
    model = models[w["dtype"]]
    prompt = np.random.default_rng(1).integers(4, MODEL["vocab_size"], (w["batch"], PROMPT_LENGTH))

    def step():
        return greedy(model, prompt, max_new_tokens=w["n"], eos_id=None)

    result = step()  # the warm-up
    record = {"tokens": np.stack(result.tokens), "log_probs": np.stack(result.token_log_probs)}
    return step, record


# ------------------------------------------------------------------ children
def serve(args: argparse.Namespace) -> None:
    """A child: check where tinyformer comes from, then answer the parent's commands.

    One JSON line in per command, one out per answer: ``prepare`` writes the
    models; ``setup`` builds and warms up a workload and saves what it computed;
    ``time`` runs it once and answers its wall-clock and processor seconds.
    """
    tree = Path(args.tree).resolve()
    origin = Path(tinyformer.__file__).resolve()
    if tree not in origin.parents:
        raise SystemExit(f"tinyformer was imported from {origin}, not from {tree}")
    folder, record = Path(args.data), Path(args.record)
    settings = {**blas_settings(), "tinyformer": str(origin.parent)}
    settings["freed memory kept for reuse (glibc)"] = str(retain_freed_memory())
    print(json.dumps({"settings": settings}), flush=True)
    by_key = {w["key"]: w for w in workloads(GROUPS)}
    models: dict = {}
    step = None
    for line in sys.stdin:
        command = json.loads(line)
        if "prepare" in command:
            prepare(folder, command["prepare"])
            answer = {"prepared": len(list(folder.iterdir()))}
        elif "setup" in command:
            w = by_key[command["setup"]]
            step = None  # the last workload's arrays go before the next one's are made
            if w["group"] == "train":
                step, computed = _train(folder, w)
            elif w["group"] == "block":
                step, computed = _block(w)
            else:
                step, computed = _generate(folder, w, models)
            np.savez(record / f"{w['key']}.npz", **computed)
            answer = {"ready": w["key"]}
        else:
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            answer = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
        print(json.dumps(answer), flush=True)


class Child:
    """A child process running one tree's tinyformer, driven through its standard input."""

    def __init__(self, side: str, tree: Path, scratch: Path) -> None:
        self.side, self.tree = side, tree
        self.record = scratch / side
        self.record.mkdir()
        self.errors = (scratch / f"{side}.stderr").open("w+")
        command = [sys.executable, __file__, "--child", "--tree", str(tree)]
        command += ["--data", str(scratch / "data"), "--record", str(self.record)]
        env = child_env(1) | {
            "PYTHONPATH": str(tree)
        }  # this tree's tinyformer, not the installed one
        self.process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )
        self.settings = self._answer()["settings"]

    def ask(self, **command) -> dict:
        """Send one command and wait for its answer."""
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        while line and not line.startswith("{"):  # anything else the library printed
            line = self.process.stdout.readline()
        if not line:
            self.errors.seek(0)
            last = (self.errors.read().strip().splitlines() or ["no error output"])[-1]
            sys.exit(f"the {self.side} tree's child stopped: {last}")
        return json.loads(line)

    def close(self) -> None:
        """End the child (it leaves its loop when its input closes)."""
        self.process.stdin.close()
        self.process.wait()
        self.errors.close()


# -------------------------------------------------------------------- parent
def _describe_tree(tree: Path) -> str:
    """The tree's path and, inside a git checkout, its commit and whether it has local changes."""

    def git(*command: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(tree), *command], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return str(tree)
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return f"{tree} (commit {commit}{', with uncommitted changes' if changed else ''})"


def _difference(old: Path, new: Path) -> str:
    """The largest difference between what the two versions computed, array by array."""
    with np.load(old) as a, np.load(new) as b:
        parts = []
        for key in a.files:
            if a[key].dtype.kind in "iu":
                parts.append(f"{key} {'same' if np.array_equal(a[key], b[key]) else 'DIFFER'}")
            else:
                parts.append(f"{key} {float(np.abs(a[key] - b[key]).max()):.1e}")
        return ", ".join(parts)


def _time(children: dict[str, Child], w: dict, repeats: int) -> dict:
    """Set the workload up in both children, then time it in turns; the row of the table."""
    for child in children.values():
        child.ask(setup=w["key"])
    seconds: dict[str, dict[str, list[float]]] = {
        side: {"wall": [], "cpu": []} for side in children
    }
    for r in range(repeats):
        for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
            answer = children[side].ask(time=w["key"])
            for clock in ("wall", "cpu"):
                seconds[side][clock].append(answer[clock])
    per = w.get("n", 1)  # generation: per token
    old, new = (np.array(seconds[side]["wall"]) * 1e3 / per for side in ("old", "new"))
    cpu_old, cpu_new = (np.median(seconds[side]["cpu"]) for side in ("old", "new"))
    pairs = np.quantile(new / old, [0.25, 0.75])
    return {
        "old_ms": float(np.median(old)),
        "new_ms": float(np.median(new)),
        "cpu_ratio": float(cpu_new / cpu_old),
        "pairs": [float(q) for q in pairs],
        "check": _difference(*(children[s].record / f"{w['key']}.npz" for s in ("old", "new"))),
    }


def main() -> None:
    """Parse the options; drive the two children (parent) or serve one (child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="the older tree, the folder holding tinyformer/")
    parser.add_argument("--new", type=Path, help="the newer tree")
    parser.add_argument(
        "--repeats", type=int, default=15, help="timed calls per workload and tree"
    )
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=GROUPS)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 3
    if args.child:
        serve(args)
        return
    if args.old is None or args.new is None:
        parser.error("give both --old and --new: the source trees (folders holding tinyformer/)")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for side, tree in trees.items():
        if not (tree / "tinyformer" / "__init__.py").is_file():
            parser.error(f"--{side} {tree} holds no tinyformer package")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    print("The same workloads under two versions of tinyformer, one BLAS thread")
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    with tempfile.TemporaryDirectory(prefix="bench_versions_") as folder:
        scratch = Path(folder)
        (scratch / "data").mkdir()
        children = {side: Child(side, tree, scratch) for side, tree in trees.items()}
        try:
            for side, child in children.items():
                print(f"\nSettings: {side}, {_describe_tree(child.tree)}")
                for key, value in child.settings.items():
                    print(f"  {key}: {value}")
            children["old"].ask(prepare=args.only)
            rows = [(w, _time(children, w, args.repeats)) for w in workloads(args.only)]
        finally:
            for child in children.values():
                child.close()
    _print_table(rows, args.repeats)


def _print_table(rows: list[tuple[dict, dict]], repeats: int) -> None:
    header = (
        f"{'workload':<32} {'dtype':<8} {'old ms':>8} {'new ms':>8} {'new/old':>7}"
        f" {'CPU time':>8} {'quartiles':>10}  largest |new - old|"
    )
    print("\n" + header)
    print("-" * (len(header) + 24))
    for w, r in rows:
        name = f"{w['group']} {w['name']}" + (" /token" if w["group"] == "generate" else "")
        low, high = r["pairs"]
        print(
            f"{name:<32} {w['dtype']:<8} {r['old_ms']:>8.3f} {r['new_ms']:>8.3f}"
            f" {r['new_ms'] / r['old_ms']:>7.2f} {r['cpu_ratio']:>8.2f} {low:>4.2f}-{high:<5.2f}"
            f"  {r['check']}"
        )
    print(
        f"old ms, new ms = median wall-clock time of {repeats} calls in turn (generation: per"
        " token); new/old = their ratio (above 1: the\nnew code is slower); CPU time = the same"
        " ratio in processor time; quartiles = of the ratios of the repeats' pairs of\ncalls;"
        " |new - old| = what the two computed while warming up, from the same weights and inputs"
    )


if __name__ == "__main__":
    main()
