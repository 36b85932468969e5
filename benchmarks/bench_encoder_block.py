"""Time forward + backward of one encoder block: tinyformer (NumPy) against PyTorch eager on CPU.

Both sides compute the same function: a post-norm encoder block with ReLU
feed-forward and no dropout (``tinyformer.blocks.TransformerBlock`` with its
defaults, the block every model is made of), with tinyformer's weights copied
into a ``torch.nn.TransformerEncoderLayer``: our ``q_proj``, ``k_proj`` and
``v_proj`` weights ``(d_in, d_out)``, transposed and stacked, are PyTorch's
``in_proj_weight`` ``(3d, d)``. Before timing, the script checks that the two
give the same output and the same gradient with respect to the input. One step
is ``forward`` then ``backward`` of a fixed upstream gradient, including the
gradient with respect to the input; parameter gradients accumulate on both
sides, as they would between two ``zero_grad`` calls.

BLAS settings must be fixed before NumPy and PyTorch load, so each setting
(thread count, ``OPENBLAS_CORETYPE``) runs in a child process of its own. Both
libraries get the same thread count in the same process. At one thread the two
are timed in alternation, repeat after repeat; at two, one after the other with a
pause between, so that neither library's idle threads spin on a core the other
needs (``_harness.time_side_by_side``). The child keeps freed memory for reuse,
as ``bench_training_step.py`` does (``--system-allocator`` leaves glibc's allocator
alone). The medians are reported; the ratio is tinyformer's median over
PyTorch's: below 1 means NumPy is faster.

Run ``python benchmarks/bench_encoder_block.py`` (``nox -s benchmarks``);
``--quick`` takes fewer repeats, ``--threads 1`` skips the 2-thread runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import numpy as np
import torch
from _harness import blas_settings, cpuinfo, matmul_peak, run_setting, time_side_by_side
from _workloads import BLOCK_SIZES as SIZES

from tinyformer.blocks import TransformerBlock
from tinyformer.cost import count_matmuls
from tinyformer.runtime import retain_freed_memory

DTYPES = ["float32", "float64"]


# ------------------------------------------------------------------ settings
def torch_settings() -> dict[str, str]:
    """NumPy's BLAS settings (``_harness.blas_settings``) and PyTorch's version and threads."""
    info = {**blas_settings(), "torch": torch.__version__}
    info["torch.get_num_threads()"] = str(torch.get_num_threads())
    info["torch CPU capability"] = torch.backends.cpu.get_cpu_capability()
    return info


# ----------------------------------------------------------------- weights
def in_proj_weight(attention) -> np.ndarray:
    """PyTorch's ``in_proj_weight`` ``(3d, d)`` of a tinyformer ``MultiHeadAttention``.

    Ours are three ``Linear`` layers with weights ``(d_in, d_out)`` (``y = x W + b``);
    PyTorch stacks the query, key and value weights as ``(d_out, d_in)`` rows.
    """
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    return np.concatenate([p.weight.value.T for p in projections], axis=0)  # (3d, d)


def in_proj_bias(attention) -> np.ndarray:
    """PyTorch's ``in_proj_bias`` ``(3d,)``: the query, key and value biases end to end."""
    return np.concatenate(
        [p.bias.value for p in (attention.q_proj, attention.k_proj, attention.v_proj)]
    )


# -------------------------------------------------------------------- timing
def _make_pair(size: dict[str, int], dtype_name: str):
    """A tinyformer block and a PyTorch layer with the same weights, inputs and gradient."""
    dtype = np.dtype(dtype_name)
    rng = np.random.default_rng(0)
    d, h, d_ff = size["d_model"], size["n_heads"], size["d_ff"]
    ours = TransformerBlock(d, h, d_ff, rng=rng, dtype=dtype)  # post-norm, ReLU: an encoder's
    for p in ours.parameters():  # non-trivial biases and norms, so that the check means something
        p.value[...] = p.value + 0.1 * rng.standard_normal(p.shape).astype(dtype)
    theirs = torch.nn.TransformerEncoderLayer(
        d,
        h,
        d_ff,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=False,
        dtype=getattr(torch, dtype_name),
    )
    attention, ffn = ours.self_attention.layer, ours.feed_forward.layer
    pairs = [
        (theirs.self_attn.in_proj_weight, in_proj_weight(attention)),
        (theirs.self_attn.in_proj_bias, in_proj_bias(attention)),
        (theirs.self_attn.out_proj.weight, attention.out_proj.weight.value.T),
        (theirs.self_attn.out_proj.bias, attention.out_proj.bias.value),
        (theirs.linear1.weight, ffn.linear_in.weight.value.T),
        (theirs.linear1.bias, ffn.linear_in.bias.value),
        (theirs.linear2.weight, ffn.linear_out.weight.value.T),
        (theirs.linear2.bias, ffn.linear_out.bias.value),
        (theirs.norm1.weight, ours.self_attention.norm.gain.value),
        (theirs.norm1.bias, ours.self_attention.norm.bias.value),
        (theirs.norm2.weight, ours.feed_forward.norm.gain.value),
        (theirs.norm2.bias, ours.feed_forward.norm.bias.value),
    ]
    with torch.no_grad():
        for target, value in pairs:
            target.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    theirs.train()
    shape = (size["batch"], size["seq_len"], d)
    x = rng.standard_normal(shape).astype(dtype)
    grad = rng.standard_normal(shape).astype(dtype)
    x_torch = torch.from_numpy(x.copy()).requires_grad_(True)
    grad_torch = torch.from_numpy(grad.copy())

    def step_ours() -> np.ndarray:
        out = ours.forward(x)
        ours.backward(grad)
        return out

    def step_theirs() -> np.ndarray:
        out = theirs(x_torch)
        out.backward(grad_torch)
        return out.detach().numpy()

    def differences() -> tuple[float, float]:
        """Largest differences of the outputs and of the input gradients, one step each."""
        out, grad_x = ours.forward(x), ours.backward(grad)
        x_torch.grad = None
        out_torch = theirs(x_torch)
        out_torch.backward(grad_torch)
        return (
            float(np.abs(out - out_torch.detach().numpy()).max()),
            float(np.abs(grad_x - x_torch.grad.numpy()).max()),
        )

    return step_ours, step_theirs, differences, ours


def run_child(repeats_small: int, repeats_large: int, *, system_allocator: bool) -> None:
    """Time every size and dtype in this process; print one JSON line each."""
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    settings = torch_settings()
    retained = False if system_allocator else retain_freed_memory()
    settings["freed memory kept for reuse (glibc)"] = str(retained)
    peaks = {dtype_name: matmul_peak(dtype_name) for dtype_name in DTYPES}
    for dtype_name, peak in peaks.items():
        settings[f"matrix-product peak, {dtype_name}"] = f"{peak:.1f} GFLOP/s"
    print(json.dumps({"settings": settings}), flush=True)
    for size in SIZES:
        large = size["seq_len"] * size["batch"] > 2048
        for dtype_name in DTYPES:
            step_ours, step_theirs, differences, block = _make_pair(size, dtype_name)
            with count_matmuls(block) as count:
                step_ours()
            difference, grad_difference = differences()  # also a warm-up
            step_ours(), step_theirs()
            repeats = repeats_large if large else repeats_small
            times_ours, times_theirs = time_side_by_side(
                step_ours, step_theirs, repeats, threads=threads
            )
            row = {
                "size": size,
                "dtype": dtype_name,
                "threads": threads,
                "repeats": len(times_ours),
                "ours_ms": 1e3 * float(np.median(times_ours)),
                "torch_ms": 1e3 * float(np.median(times_theirs)),
                "max_abs_difference": difference,
                "max_abs_grad_difference": grad_difference,
                "matmul_flops": count.matrix,
                "peak_gflops": peaks[dtype_name],
            }
            print(json.dumps(row), flush=True)


# -------------------------------------------------------------------- parent
def _run_setting(threads: int, coretype: str | None, args: argparse.Namespace) -> list[dict]:
    child_args = ["--repeats", str(args.repeats), "--repeats-large", str(args.repeats_large)]
    child_args += ["--system-allocator"] if args.system_allocator else []
    label = f"threads={threads}, OPENBLAS_CORETYPE={coretype or '(unset: default)'}"
    rows = run_setting(__file__, child_args, threads=threads, coretype=coretype, label=label)
    return [dict(row, coretype=coretype or "default") for row in rows]


def _print_table(rows: list[dict]) -> None:
    header = (
        f"{'size':<30} {'dtype':<8} {'thr':>3} {'CORETYPE':<9} {'tinyformer ms':>13}"
        f" {'torch ms':>9} {'ratio':>6} {'floor':>6} {'GFLOP/s ours':>12} {'torch':>6}"
        f" {'peak':>6} {'|Δ out|':>8} {'|Δ grad x|':>10}"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in rows:
        s = r["size"]
        size = f"B={s['batch']} T={s['seq_len']} d={s['d_model']} ff={s['d_ff']}"
        gflop = r["matmul_flops"] / 1e9
        floor_ms = 1e3 * gflop / r["peak_gflops"]
        print(
            f"{size:<30} {r['dtype']:<8} {r['threads']:>3} {r['coretype']:<9}"
            f" {r['ours_ms']:>13.2f} {r['torch_ms']:>9.2f} {r['ours_ms'] / r['torch_ms']:>6.2f}"
            f" {floor_ms / r['torch_ms']:>6.2f} {1e3 * gflop / r['ours_ms']:>12.1f}"
            f" {1e3 * gflop / r['torch_ms']:>6.1f} {r['peak_gflops']:>6.1f}"
            f" {r['max_abs_difference']:>8.1e} {r['max_abs_grad_difference']:>10.1e}"
        )
    print(
        "ratio = tinyformer median / PyTorch median (below 1: NumPy is faster); floor = the"
        " ratio if the step were its\nmatrix products at the measured peak and nothing else;"
        " GFLOP/s = the step's matrix-product FLOPs / its time;\n|Δ out|, |Δ grad x| = the"
        " largest differences from PyTorch's output and input gradient, checked before timing"
    )


def main() -> None:
    """Parse the options; run the children (parent) or the timings (child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=41, help="repeats at the small size")
    parser.add_argument("--repeats-large", type=int, default=9, help="repeats at the large size")
    parser.add_argument("--quick", action="store_true", help="5 and 3 repeats")
    parser.add_argument(
        "--system-allocator",
        action="store_true",
        help="leave glibc's allocator alone instead of keeping freed memory for reuse",
    )
    parser.add_argument(
        "--coretypes",
        nargs="+",
        help="OPENBLAS_CORETYPE values to run ('default' = unset, OpenBLAS's own choice for"
        " this CPU, the only one by default); forcing SkylakeX on a CPU without AVX-512"
        " stops with an illegal instruction",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.repeats_large = 5, 3
    if args.child:
        run_child(args.repeats, args.repeats_large, system_allocator=args.system_allocator)
        return
    flags = set(cpuinfo("flags").split())
    print("Encoder block forward + backward: tinyformer (NumPy) vs PyTorch eager, on CPU")
    print(
        f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores;"
        f" AVX2: {'avx2' in flags}, AVX-512F: {'avx512f' in flags}"
    )
    coretypes: list[str | None] = [None]  # OpenBLAS chooses its kernels for this CPU
    if args.coretypes:
        coretypes = [None if c == "default" else c for c in args.coretypes]
    rows = []
    for threads in args.threads:
        for coretype in coretypes:
            rows += _run_setting(threads, coretype, args)
    _print_table(rows)


if __name__ == "__main__":
    main()
