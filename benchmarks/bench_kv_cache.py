"""Time greedy generation with and without the key/value cache for a decoder-only model.

With the cache (``use_cache=True``) the prompt is fed once and every later step
feeds one token through the same layers (``DecoderOnlyLM.step``: the stack's
``forward`` with each block's cache, under ``no_grad``), attending to the cached
keys and values: step ``t`` costs
:math:`O(t)` attention and :math:`O(1)` everything else. Without it
(``use_cache=False``) every step runs the model over the whole prefix again, so
generating :math:`n` tokens costs :math:`O(n^2)` projections and feed-forward
work and :math:`O(n^3)` attention. Both give the same tokens; the script checks
that they do, and how far apart their log-probabilities are.

BLAS threads must be fixed before NumPy loads, so each thread count runs in a
child process of its own. Cached and uncached runs alternate, repeat after
repeat, and the medians are reported; the speed-up is the uncached median over
the cached one.

Run ``python benchmarks/bench_kv_cache.py``; ``--quick`` takes fewer repeats,
``--threads 1 2`` also times two BLAS threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import numpy as np
from _harness import blas_settings, cpuinfo, run_setting, time_alternately

from tinyformer.generation import greedy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM

MODEL = {
    "vocab_size": 256,
    "d_model": 128,
    "n_heads": 4,
    "d_ff": 512,
    "n_layers": 4,
    "context_length": 512,
}
PROMPT_LENGTH = 16
NEW_TOKENS = [64, 128, 256]
BATCHES = [1, 8]


def compare(model: DecoderOnlyLM, prompt: np.ndarray, new_tokens: int, repeats: int) -> dict:
    """Greedy decoding of ``prompt`` with and without the cache: medians (ms) and the check.

    Also used by ``bench_generation.py`` for the cache's speed-up next to PyTorch.
    """

    def generate(use_cache: bool):
        return greedy(model, prompt, max_new_tokens=new_tokens, eos_id=None, use_cache=use_cache)

    cached, uncached = generate(True), generate(False)  # warm-up, and the check
    same = all(np.array_equal(a, b) for a, b in zip(cached.tokens, uncached.tokens, strict=True))
    gap = max(
        float(np.abs(a - b).max())
        for a, b in zip(cached.token_log_probs, uncached.token_log_probs, strict=True)
    )
    cached_times, uncached_times = time_alternately(
        lambda: generate(True), lambda: generate(False), repeats, collect_each=True
    )
    return {
        "cached_ms": 1e3 * float(np.median(cached_times)),
        "uncached_ms": 1e3 * float(np.median(uncached_times)),
        "same_tokens": same,
        "max_log_prob_gap": gap,
    }


def run_child(repeats: int, dtype: str) -> None:
    """Time every batch size and length in this process; print one JSON line each."""
    print(json.dumps({"settings": blas_settings()}), flush=True)
    config = DecoderOnlyConfig(**MODEL, dtype=dtype)
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    model.eval()
    for batch in BATCHES:
        prompt = np.random.default_rng(1).integers(4, MODEL["vocab_size"], (batch, PROMPT_LENGTH))
        for new_tokens in NEW_TOKENS:
            row = {
                "batch": batch,
                "new_tokens": new_tokens,
                "threads": int(os.environ["OMP_NUM_THREADS"]),
                "repeats": repeats,
                **compare(model, prompt, new_tokens, repeats),
            }
            print(json.dumps(row), flush=True)


def _run_setting(threads: int, args: argparse.Namespace) -> list[dict]:
    child_args = ["--repeats", str(args.repeats), "--dtype", args.dtype]
    return run_setting(__file__, child_args, threads=threads)


def _print_table(rows: list[dict]) -> None:
    header = (
        f"{'batch':>5} {'new tokens':>10} {'threads':>7} {'repeats':>7} {'cached ms':>10}"
        f" {'uncached ms':>11} {'speed-up':>8} {'same tokens':>11} {'max |Δ log p|':>13}"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['batch']:>5} {r['new_tokens']:>10} {r['threads']:>7} {r['repeats']:>7}"
            f" {r['cached_ms']:>10.1f} {r['uncached_ms']:>11.1f}"
            f" {r['uncached_ms'] / r['cached_ms']:>7.1f}x {r['same_tokens']!s:>11}"
            f" {r['max_log_prob_gap']:>13.1e}"
        )
    print("speed-up = uncached median / cached median (medians over the repeats)")


def main() -> None:
    """Parse the options; run the children (parent) or the timings (child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 3
    if args.child:
        run_child(args.repeats, args.dtype)
        return
    print("Greedy generation with and without the KV cache: tinyformer DecoderOnlyLM (NumPy)")
    model = ", ".join(f"{k}={v}" for k, v in MODEL.items())
    print(f"Model: {model}, dtype={args.dtype}; prompt of {PROMPT_LENGTH} tokens, no EOS stop")
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    rows = []
    for threads in args.threads:
        rows += _run_setting(threads, args)
    _print_table(rows)


if __name__ == "__main__":
    main()
