"""Time greedy generation of a float32 model and of its int8 copy; compare their weight memory.

:func:`tinyformer.quantization.quantize_model` stores every weight matrix as
int8 integers and float scales. NumPy has no int8 matrix product, so the
quantized model converts its integers back to float32 for every product: the
memory of the weights drops about four times, the time does not (it usually
rises by the cost of the conversions). The script measures both, in the same
process, as ratios against float32, and reports how far the logits move and
how many greedy tokens stay the same.

BLAS threads must be fixed before NumPy loads, so each thread count runs in a
child process of its own (see ``_harness.py``). Float and int8 runs alternate,
repeat after repeat, and the medians are reported.

Run ``python benchmarks/bench_quantized.py``; ``--quick`` takes fewer repeats,
``--threads 1 2`` also times two BLAS threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import numpy as np
from _harness import blas_settings, cpuinfo, run_setting, time_alternately
from bench_kv_cache import MODEL, PROMPT_LENGTH

from tinyformer.generation import greedy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.quantization import quantize_model, weight_nbytes

NEW_TOKENS = [64, 256]
BATCHES = [1, 8]


def run_child(repeats: int, per_channel: bool) -> None:
    """Time every batch size and length in this process; print one JSON line each."""
    print(json.dumps({"settings": blas_settings()}), flush=True)
    model = DecoderOnlyLM(
        DecoderOnlyConfig(**MODEL, dtype="float32"), rng=np.random.default_rng(0)
    )
    model.eval()
    quantized = quantize_model(model, per_channel=per_channel)
    memory_ratio = weight_nbytes(quantized) / weight_nbytes(model)
    for batch in BATCHES:
        prompt = np.random.default_rng(1).integers(4, MODEL["vocab_size"], (batch, PROMPT_LENGTH))
        logit_gap = float(np.abs(model.forward(prompt) - quantized.forward(prompt)).max())
        for new_tokens in NEW_TOKENS:

            def generate(m, n: int = new_tokens, prompt: np.ndarray = prompt):
                return greedy(m, prompt, max_new_tokens=n, eos_id=None)

            float_tokens, int8_tokens = generate(model), generate(quantized)  # warm-up
            same = np.mean(
                [
                    np.mean(a == b)
                    for a, b in zip(float_tokens.tokens, int8_tokens.tokens, strict=True)
                ]
            )
            float_times, int8_times = time_alternately(
                lambda: generate(model), lambda: generate(quantized), repeats, collect_each=True
            )
            row = {
                "batch": batch,
                "new_tokens": new_tokens,
                "threads": int(os.environ["OMP_NUM_THREADS"]),
                "repeats": repeats,
                "float32_ms": 1e3 * float(np.median(float_times)),
                "int8_ms": 1e3 * float(np.median(int8_times)),
                "memory_ratio": memory_ratio,
                "weight_bytes_float32": weight_nbytes(model),
                "weight_bytes_int8": weight_nbytes(quantized),
                "max_logit_gap": logit_gap,
                "same_tokens": float(same),
            }
            print(json.dumps(row), flush=True)


def _print_table(rows: list[dict]) -> None:
    if rows:
        r = rows[0]
        print(
            f"\nWeights: float32 {r['weight_bytes_float32']:,} bytes, int8"
            f" {r['weight_bytes_int8']:,} bytes (int8 / float32 = {r['memory_ratio']:.3f})"
        )
    header = (
        f"{'batch':>5} {'new tokens':>10} {'threads':>7} {'repeats':>7} {'float32 ms':>10}"
        f" {'int8 ms':>8} {'time int8/f32':>13} {'max |Δ logit|':>13} {'same tokens':>11}"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['batch']:>5} {r['new_tokens']:>10} {r['threads']:>7} {r['repeats']:>7}"
            f" {r['float32_ms']:>10.1f} {r['int8_ms']:>8.1f}"
            f" {r['int8_ms'] / r['float32_ms']:>12.2f}x {r['max_logit_gap']:>13.1e}"
            f" {r['same_tokens']:>11.1%}"
        )
    print(
        "time int8/f32 = int8 median / float32 median (above 1: int8 is slower; NumPy has no"
        " int8 matrix product, so the weights are converted to float32 on use)"
    )


def main() -> None:
    """Parse the options; run the children (parent) or the timings (child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-tensor", action="store_true", help="one scale per matrix")
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 3
    if args.child:
        run_child(args.repeats, per_channel=not args.per_tensor)
        return
    print("Greedy generation, float32 against int8 weights: tinyformer DecoderOnlyLM (NumPy)")
    model = ", ".join(f"{k}={v}" for k, v in MODEL.items())
    scheme = "per tensor" if args.per_tensor else "per output channel"
    print(f"Model: {model}; int8 {scheme}; prompt of {PROMPT_LENGTH} tokens, no EOS stop")
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    child_args = ["--repeats", str(args.repeats)] + (["--per-tensor"] if args.per_tensor else [])
    rows = []
    for threads in args.threads:
        rows += run_setting(__file__, child_args, threads=threads)
    _print_table(rows)


if __name__ == "__main__":
    main()
