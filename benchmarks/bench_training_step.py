"""Time one full training step of each model family: tinyformer (NumPy) against PyTorch on CPU.

One step is what the training loop does per batch: forward, mean cross-entropy
(padding ignored), backward, and an AdamW update, after clearing the
gradients. PyTorch runs the same model, built from ``nn.TransformerEncoderLayer``
and ``nn.TransformerDecoderLayer`` (no dropout, batch first), with tinyformer's
initial weights copied in (our ``q_proj``, ``k_proj`` and ``v_proj`` weights
``(d_in, d_out)``, transposed and stacked, are PyTorch's ``in_proj_weight``),
the same batch, the same dtype and the same thread count, in the same process.
The script checks that both give the same logits before timing and again after
all the timed steps (which also checks that the two AdamW updates agree). In
float64 the two stay within about 1e-13 after all the steps; in float32 they
drift apart by order 1 after some 50 updates, and each library drifts as far
from its own float64 run: rounding differences amplified by training on one
fixed batch, not a difference in the computation.

The models, batches and losses are the book's sizes, in ``_workloads.py``:
the encoder-decoder, the decoder-only model (exact GELU, and as a diagnostic
with the tanh approximation on both sides: "decoder-only tanh") and the
encoder-only masked language model.

BLAS threads must be fixed before NumPy loads, so each thread count runs in a
child process with ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS``
set and ``torch.set_num_threads`` called. The child process keeps freed memory
for reuse (``tinyformer.runtime.retain_freed_memory``, what
``Trainer(..., retain_memory=True)`` asks for), which serves both libraries alike;
``--system-allocator`` leaves glibc's allocator as it is, as the ``Trainer`` does
by default. At one thread
the two are timed in alternation, repeat after repeat; at more, one after the
other with a pause between, so that neither library's idle threads spin on a core
the other needs (``_harness.time_side_by_side``). Medians are reported, and the
ratio is tinyformer's median over PyTorch's (below 1: NumPy is faster).

The distance to the physical limit is printed too. The step's matrix products are
counted (``tinyformer.cost.count_matmuls``; both libraries compute the same
products), and each library's achieved rate, products' FLOPs over the step's
time, is set against this machine's matrix-product peak, measured in the same
process as the median rate of a 1024 x 1024 x 1024 product in the same dtype and
thread count. "floor" is the ratio a library would reach if it spent nothing but
the products' time at that peak: no step can be faster than that against this
PyTorch run.

Run ``python benchmarks/bench_training_step.py`` (``--quick`` for fewer repeats,
``--threads 1 2`` for more thread counts, ``--profile`` to print where
tinyformer's time goes in one family and dtype).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import platform
import pstats
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from tinyformer.cost import count_matmuls
from tinyformer.models import DecoderOnlyLM, EncoderDecoder, EncoderOnlyMLM
from tinyformer.positional import sinusoidal_encoding
from tinyformer.runtime import retain_freed_memory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import cpuinfo, matmul_peak, run_or_profile, time_side_by_side
from _workloads import FAMILIES, LEARNING_RATE, PAD, training_batch, training_model, training_step
from bench_encoder_block import in_proj_bias, in_proj_weight, torch_settings

DTYPES = ["float32", "float64"]


# ------------------------------------------------------------ PyTorch models
def _copy(target: torch.Tensor, value: np.ndarray) -> None:
    with torch.no_grad():
        target.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def _copy_attention(theirs: torch.nn.MultiheadAttention, residual) -> None:
    """Our ``q_proj``, ``k_proj``, ``v_proj`` ``(d, d)`` transposed and stacked: ``in_proj_weight``."""
    layer = residual.layer
    _copy(theirs.in_proj_weight, in_proj_weight(layer))
    _copy(theirs.in_proj_bias, in_proj_bias(layer))
    _copy(theirs.out_proj.weight, layer.out_proj.weight.value.T)
    _copy(theirs.out_proj.bias, layer.out_proj.bias.value)


def _copy_block(theirs: torch.nn.Module, ours) -> None:
    """Copy a ``TransformerBlock`` (norm1/2/3 follow the sub-layers' order)."""
    residuals = [ours.self_attention]
    _copy_attention(theirs.self_attn, ours.self_attention)
    if ours.cross_attention is not None:
        _copy_attention(theirs.multihead_attn, ours.cross_attention)
        residuals.append(ours.cross_attention)
    residuals.append(ours.feed_forward)
    ffn = ours.feed_forward.layer
    _copy(theirs.linear1.weight, ffn.linear_in.weight.value.T)
    _copy(theirs.linear1.bias, ffn.linear_in.bias.value)
    _copy(theirs.linear2.weight, ffn.linear_out.weight.value.T)
    _copy(theirs.linear2.bias, ffn.linear_out.bias.value)
    for i, residual in enumerate(residuals, start=1):
        norm = getattr(theirs, f"norm{i}")
        _copy(norm.weight, residual.norm.gain.value)
        _copy(norm.bias, residual.norm.bias.value)


_TORCH_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def _layer_options(config, dtype: torch.dtype) -> dict:
    return {
        "d_model": config.d_model,
        "nhead": config.n_heads,
        "dim_feedforward": config.d_ff,
        "dropout": 0.0,
        "activation": _TORCH_ACTIVATIONS[config.activation],
        "batch_first": True,
        "norm_first": config.norm_first,
        "dtype": dtype,
    }


class TorchEncoderDecoder(torch.nn.Module):
    """The post-norm encoder-decoder of the benchmark, sinusoidal and tied, in PyTorch."""

    def __init__(self, ours: EncoderDecoder) -> None:
        super().__init__()
        c = ours.config
        dtype = getattr(torch, c.dtype)
        self.scale = math.sqrt(c.d_model)
        self.source_embedding = torch.nn.Embedding(c.src_vocab_size, c.d_model, dtype=dtype)
        self.target_embedding = torch.nn.Embedding(c.tgt_vocab_size, c.d_model, dtype=dtype)
        options = _layer_options(c, dtype)
        self.encoder = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(**options) for _ in range(c.n_encoder_layers)
        )
        self.decoder = torch.nn.ModuleList(
            torch.nn.TransformerDecoderLayer(**options) for _ in range(c.n_decoder_layers)
        )
        table = sinusoidal_encoding(c.context_length, c.d_model, dtype=c.dtype)
        self.register_buffer("positions", torch.from_numpy(table))
        _copy(self.source_embedding.weight, ours.encoder.embedding.weight.value)
        _copy(self.target_embedding.weight, ours.decoder.embedding.weight.value)
        for theirs_block, ours_block in zip(self.encoder, ours.encoder.layers, strict=True):
            _copy_block(theirs_block, ours_block)
        for theirs_block, ours_block in zip(self.decoder, ours.decoder.layers, strict=True):
            _copy_block(theirs_block, ours_block)

    def forward(self, source: torch.Tensor, decoder_input: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, V)``; causal decoder, no padding in the benchmark's batch."""
        s, t = source.shape[1], decoder_input.shape[1]
        x = self.source_embedding(source) * self.scale + self.positions[:s]
        for layer in self.encoder:
            x = layer(x)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True = may NOT attend
        y = self.target_embedding(decoder_input) * self.scale + self.positions[:t]
        for layer in self.decoder:
            y = layer(y, x, tgt_mask=causal)
        return y @ self.target_embedding.weight.T


class TorchStackLM(torch.nn.Module):
    """A pre-norm stack with learned positions and a tied output, in PyTorch.

    Causal, it is the benchmark's decoder-only model; with every position
    seeing every other, its encoder-only model.
    """

    def __init__(self, ours: DecoderOnlyLM | EncoderOnlyMLM, *, causal: bool) -> None:
        super().__init__()
        c, stack = ours.config, ours.decoder if causal else ours.encoder
        dtype = getattr(torch, c.dtype)
        self.causal = causal
        self.embedding = torch.nn.Embedding(c.vocab_size, c.d_model, dtype=dtype)
        self.positions = torch.nn.Parameter(torch.empty(c.context_length, c.d_model, dtype=dtype))
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(**_layer_options(c, dtype)) for _ in range(c.n_layers)
        )
        self.final_norm = torch.nn.LayerNorm(c.d_model, dtype=dtype)
        _copy(self.embedding.weight, stack.embedding.weight.value)
        _copy(self.positions, stack.positions.weight.value)
        for theirs_block, ours_block in zip(self.layers, stack.layers, strict=True):
            _copy_block(theirs_block, ours_block)
        _copy(self.final_norm.weight, stack.final_norm.gain.value)
        _copy(self.final_norm.bias, stack.final_norm.bias.value)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, V)``."""
        t = ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1) if self.causal else None
        x = self.embedding(ids) + self.positions[:t]
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.final_norm(x) @ self.embedding.weight.T


# -------------------------------------------------------------------- setups
def _make_pair(family: str, dtype_name: str):
    """Two step functions (ours, theirs) over the same model, batch and optimizer settings."""
    rng = np.random.default_rng(0)
    ours = training_model(family, dtype_name, rng)
    inputs, target = training_batch(family, rng)
    if family == "encoder-decoder":
        theirs = TorchEncoderDecoder(ours)
    else:
        theirs = TorchStackLM(ours, causal=family.startswith("decoder-only"))
    step_ours = training_step(ours, inputs, target)
    theirs_optimizer = torch.optim.AdamW(theirs.parameters(), lr=LEARNING_RATE)
    inputs_torch = tuple(torch.from_numpy(x) for x in inputs)
    target_torch = torch.from_numpy(target.reshape(-1))

    def step_theirs() -> float:
        theirs_optimizer.zero_grad()
        logits = theirs(*inputs_torch)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target_torch, ignore_index=PAD
        )
        loss.backward()
        theirs_optimizer.step()
        return loss.detach().item()

    def difference() -> float:
        with torch.no_grad():
            theirs_logits = theirs(*inputs_torch).numpy()
        return float(np.abs(ours.forward(*inputs) - theirs_logits).max())

    return step_ours, step_theirs, difference, ours


def run_child(repeats: int, profile: str | None, *, system_allocator: bool) -> None:
    """Time every family and dtype in this process; print one JSON line each."""
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    retained = False if system_allocator else retain_freed_memory()
    if profile:
        _profile(*profile.split(":"))
        return
    settings = torch_settings()
    settings["freed memory kept for reuse (glibc)"] = str(retained)
    peaks = {dtype_name: matmul_peak(dtype_name) for dtype_name in DTYPES}
    for dtype_name, peak in peaks.items():
        settings[f"matrix-product peak, {dtype_name}"] = f"{peak:.1f} GFLOP/s"
    print(json.dumps({"settings": settings}), flush=True)
    for family in FAMILIES:
        for dtype_name in DTYPES:
            step_ours, step_theirs, difference, model = _make_pair(family, dtype_name)
            before = difference()
            with count_matmuls(model) as count:  # the step's products, counted once
                step_ours()
            step_theirs()
            for _ in range(3):  # warm-up, the same number of updates on both sides
                step_ours(), step_theirs()
            times_ours, times_theirs = time_side_by_side(
                step_ours, step_theirs, repeats, threads=threads
            )
            row = {
                "family": family,
                "dtype": dtype_name,
                "threads": threads,
                "repeats": repeats,
                "ours_ms": 1e3 * float(np.median(times_ours)),
                "torch_ms": 1e3 * float(np.median(times_theirs)),
                "diff_before": before,
                "diff_after": difference(),
                "matmul_flops": count.matrix,
                "peak_gflops": peaks[dtype_name],
            }
            print(json.dumps(row), flush=True)


def _profile(family: str, dtype_name: str) -> None:
    """Profile 200 tinyformer steps; print the functions by their own time."""
    step_ours, _, _, _ = _make_pair(family, dtype_name)
    step_ours()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        step_ours()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


# -------------------------------------------------------------------- parent
def _run_setting(threads: int, args: argparse.Namespace) -> list[dict]:
    child_args = ["--repeats", str(args.repeats)]
    child_args += ["--system-allocator"] if args.system_allocator else []
    return run_or_profile(__file__, child_args, threads=threads, profile=args.profile)


def _print_table(rows: list[dict]) -> None:
    header = (
        f"{'model':<17} {'dtype':<8} {'thr':>3} {'tinyformer ms':>13} {'torch ms':>9}"
        f" {'ratio':>6} {'floor':>6} {'GFLOP/s ours':>12} {'torch':>6} {'peak':>6}"
        f" {'|diff| before':>13} {'after':>8}"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in rows:
        gflop = r["matmul_flops"] / 1e9
        floor_ms = 1e3 * gflop / r["peak_gflops"]
        print(
            f"{r['family']:<17} {r['dtype']:<8} {r['threads']:>3} {r['ours_ms']:>13.2f}"
            f" {r['torch_ms']:>9.2f} {r['ours_ms'] / r['torch_ms']:>6.2f}"
            f" {floor_ms / r['torch_ms']:>6.2f} {1e3 * gflop / r['ours_ms']:>12.1f}"
            f" {1e3 * gflop / r['torch_ms']:>6.1f} {r['peak_gflops']:>6.1f}"
            f" {r['diff_before']:>13.1e} {r['diff_after']:>8.1e}"
        )
    print(
        "ratio = tinyformer median / PyTorch median (below 1: NumPy is faster); floor = the"
        " ratio if the step were its\nmatrix products at the measured peak and nothing else;"
        " GFLOP/s = the step's matrix-product FLOPs / its time;\n|diff| = max |logits"
        " difference| before and after the timed steps"
    )


def main() -> None:
    """Parse the options; run the children (parent) or the timings (child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=51)
    parser.add_argument("--quick", action="store_true", help="7 repeats")
    parser.add_argument(
        "--system-allocator",
        action="store_true",
        help="leave glibc's allocator alone (the Trainer's default) instead of keeping freed memory",
    )
    parser.add_argument(
        "--profile",
        metavar="FAMILY:DTYPE",
        help="profile tinyformer instead of timing, e.g. decoder-only:float32",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats = 7
    if args.child:
        run_child(args.repeats, args.profile, system_allocator=args.system_allocator)
        return
    print("One training step (forward, cross-entropy, backward, AdamW): tinyformer vs PyTorch")
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    rows = []
    for threads in args.threads:
        rows += _run_setting(threads, args)
    if rows:
        _print_table(rows)


if __name__ == "__main__":
    main()
