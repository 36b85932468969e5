"""Measure when a second BLAS thread pays: one training step at 1 thread against all cores.

``tinyformer.runtime.threads_for`` gives a step one BLAS thread when its largest
matrix product costs fewer than ``MULTI_THREAD_MIN_FLOPS`` floating-point
operations, and otherwise every core that other processes leave free. This
script measures the first half of that rule, on an idle machine (run it on one;
the second half is seen by running it while something else keeps a core busy): for
decoder-only models from the book's size upwards it times one training step
(forward, cross-entropy, backward, AdamW) with one thread and with every core,
alternating the two within one process (``threadpoolctl`` switches OpenBLAS's
thread count between repeats), and prints the speed-up against the size of the
step's largest product, ``2 N d_model d_ff`` for ``N`` tokens. The rule is right
when more threads gain little or nothing below the threshold and are faster
above it.

Run ``python benchmarks/bench_threads.py`` (``--quick`` for fewer repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import cpuinfo, run_setting, time_alternately

from tinyformer.losses import cross_entropy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM
from tinyformer.optim import AdamW
from tinyformer.runtime import MULTI_THREAD_MIN_FLOPS, retain_freed_memory, threads_for

# (d_model, n_heads, batch, context): d_ff = 4 d_model, 2 layers, vocabulary 64, float32
SIZES = [
    (32, 4, 8, 16),
    (64, 4, 16, 16),
    (64, 4, 16, 32),
    (64, 4, 16, 64),
    (64, 4, 32, 64),
    (128, 4, 32, 64),
    (128, 4, 32, 128),
    (256, 8, 16, 128),
    (256, 8, 32, 128),
    (384, 8, 32, 128),
    (512, 8, 32, 128),
]


def _step(d_model: int, n_heads: int, batch: int, context: int, dtype: str):
    rng = np.random.default_rng(0)
    config = DecoderOnlyConfig(
        vocab_size=64,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=4 * d_model,
        n_layers=2,
        context_length=context,
        activation="gelu",
        dtype=dtype,
    )
    model = DecoderOnlyLM(config, rng=rng)
    optimizer = AdamW(model.parameters(), lr=1e-4)
    tokens = rng.integers(0, 64, (batch, context + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        optimizer.zero_grad()
        logits = model.forward(inputs)
        _, grad = cross_entropy(logits, targets)
        model.backward(grad)
        optimizer.step()

    return step


def run_child(repeats: int, dtype: str) -> None:
    """Time every size at one thread and at every core, alternating; print JSON rows."""
    retain_freed_memory()  # as bench_training_step.py, and Trainer(retain_memory=True)
    cores = os.cpu_count() or 1
    pools = [f"{p['internal_api']} {p.get('architecture')}" for p in threadpool_info()]
    print(json.dumps({"settings": {"BLAS": ", ".join(pools), "cores": str(cores)}}), flush=True)
    for d_model, n_heads, batch, context in SIZES:
        step = _step(d_model, n_heads, batch, context, dtype)

        def one(step=step) -> None:
            with threadpool_limits(1, user_api="blas"):
                step()

        def every(step=step) -> None:
            with threadpool_limits(cores, user_api="blas"):
                step()

        one(), every()  # warm-up
        times_one, times_all = time_alternately(one, every, repeats)
        flops = 2.0 * batch * context * d_model * 4 * d_model
        row = {
            "size": f"d={d_model} B={batch} T={context}",
            "flops": flops,
            "one_ms": 1e3 * float(np.median(times_one)),
            "all_ms": 1e3 * float(np.median(times_all)),
            "cores": cores,
        }
        print(json.dumps(row), flush=True)


def main() -> None:
    """Run the child (which times) and print the table and the rule's verdict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="5 repeats")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args()
    if args.quick:
        args.repeats = 5
    if args.child:
        run_child(args.repeats, args.dtype)
        return
    print("One training step at one BLAS thread against every core (decoder-only, 2 layers)")
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    threads = os.cpu_count() or 1
    rows = run_setting(
        __file__,
        ["--repeats", str(args.repeats), "--dtype", args.dtype],
        threads=threads,
        label=f"{threads} threads allowed, switched per repeat",
    )
    header = (
        f"{'size':<22} {'largest matmul':>14} {'1 thread ms':>11} {'all ms':>8} {'speed-up':>8}"
    )
    print("\n" + header + "  rule")
    print("-" * (len(header) + 12))
    wrong = 0
    for r in rows:
        speedup = r["one_ms"] / r["all_ms"]
        chosen = threads_for(r["flops"], r["cores"], load=0.0)  # as on an idle machine
        right = (chosen > 1) == (speedup > 1.0)
        wrong += not right
        print(
            f"{r['size']:<22} {r['flops']:>14.2e} {r['one_ms']:>11.2f} {r['all_ms']:>8.2f}"
            f" {speedup:>8.2f}  {chosen} thread(s){'' if right else '  <- the slower choice'}"
        )
    print(
        f"speed-up = 1-thread median / all-cores median; the rule (threads_for) uses every core"
        f" from {MULTI_THREAD_MIN_FLOPS:.1e} FLOPs in the largest product;"
        f" it picks the slower setting in {wrong} of {len(rows)} rows"
    )


if __name__ == "__main__":
    main()
