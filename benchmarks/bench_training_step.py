"""Time one full training step of both model families: tinyformer (NumPy) against PyTorch on CPU.

One step is what the training loop does per batch: forward, mean cross-entropy
(padding ignored), backward, and an AdamW update, after clearing the
gradients. PyTorch runs the same model: built from ``nn.TransformerEncoderLayer``
and ``nn.TransformerDecoderLayer`` (no dropout, batch first), with tinyformer's
initial weights copied in, the same batch, the same dtype and the same thread
count, in the same process. The script checks that both give the same logits
before timing and again after all the timed steps (which also checks that the
two AdamW updates agree). In float64 the two stay within about 1e-13 after all
the steps; in float32 they drift apart by order 1 after some 50 updates, and
each library drifts as far from its own float64 run: rounding differences
amplified by training on one fixed batch, not a difference in the computation.

Sizes are the book's:

- encoder-decoder: vocabularies of 14 (10 symbols + 4 specials), d_model=64,
  4 heads, d_ff=256, 2 + 2 post-norm layers, sinusoidal positions, tied output,
  batch 64, source length 8, decoder length 9;
- decoder-only: vocabulary 16, d_model=64, 4 heads, d_ff=256, 2 pre-norm layers
  with a final LayerNorm, GELU, learned positions, tied output, context 64, batch 32;
- and, as a diagnostic, the same decoder-only model with the tanh approximation
  of GELU on both sides ("decoder-only tanh"): NumPy has no error function, so
  tinyformer's exact GELU evaluates erf with its own vectorized Taylor table
  (``tinyformer.functional``), the dearest elementwise step of the model; this
  row shows what the rest of the step costs.

BLAS threads must be fixed before NumPy loads, so each thread count runs in a
child process with ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS``
set and ``torch.set_num_threads`` called. The child process is set up as
tinyformer's ``Trainer`` sets up its own (``tinyformer.runtime.retain_freed_memory``:
freed memory is kept for reuse), which serves both libraries alike. At one thread
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
from tinyformer.losses import cross_entropy
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
)
from tinyformer.optim import AdamW
from tinyformer.positional import sinusoidal_encoding
from tinyformer.runtime import retain_freed_memory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import cpuinfo, matmul_peak, run_or_profile, time_side_by_side
from bench_encoder_block import blas_settings

PAD, BOS = 0, 1
DTYPES = ["float32", "float64"]
FAMILIES = ["encoder-decoder", "decoder-only", "decoder-only tanh"]


# ------------------------------------------------------------ PyTorch models
def _copy(target: torch.Tensor, value: np.ndarray) -> None:
    with torch.no_grad():
        target.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def _copy_attention(theirs: torch.nn.MultiheadAttention, residual) -> None:
    """Our fused ``w_qkv`` (d, 3d) is PyTorch's ``in_proj_weight`` (3d, d) transposed."""
    layer = residual.layer
    _copy(theirs.in_proj_weight, layer.w_qkv.value.T)
    _copy(theirs.in_proj_bias, layer.b_qkv.value)
    _copy(theirs.out_proj.weight, layer.w_out.value.T)
    _copy(theirs.out_proj.bias, layer.b_out.value)


def _copy_block(theirs: torch.nn.Module, ours) -> None:
    """Copy an encoder or decoder block (norm1/2/3 follow the sub-layers' order)."""
    residuals = [ours.self_attention]
    _copy_attention(theirs.self_attn, ours.self_attention)
    if getattr(ours, "cross_attention", None) is not None:
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
        _copy(self.source_embedding.weight, ours.source_embedding.weight.value)
        _copy(self.target_embedding.weight, ours.target_embedding.weight.value)
        for theirs_block, ours_block in zip(self.encoder, ours.encoder_layers, strict=True):
            _copy_block(theirs_block, ours_block)
        for theirs_block, ours_block in zip(self.decoder, ours.decoder_layers, strict=True):
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


class TorchDecoderOnly(torch.nn.Module):
    """The pre-norm decoder-only model of the benchmark (learned positions, tied), in PyTorch."""

    def __init__(self, ours: DecoderOnlyLM) -> None:
        super().__init__()
        c = ours.config
        dtype = getattr(torch, c.dtype)
        self.embedding = torch.nn.Embedding(c.vocab_size, c.d_model, dtype=dtype)
        self.positions = torch.nn.Parameter(torch.empty(c.context_length, c.d_model, dtype=dtype))
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(**_layer_options(c, dtype)) for _ in range(c.n_layers)
        )
        self.final_norm = torch.nn.LayerNorm(c.d_model, dtype=dtype)
        _copy(self.embedding.weight, ours.embedding.weight.value)
        _copy(self.positions, ours.positions.weight.value)
        for theirs_block, ours_block in zip(self.layers, ours.layers, strict=True):
            _copy_block(theirs_block, ours_block)
        _copy(self.final_norm.weight, ours.final_norm.gain.value)
        _copy(self.final_norm.bias, ours.final_norm.bias.value)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Causal logits ``(B, T, V)``."""
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = self.embedding(ids) + self.positions[:t]
        for layer in self.layers:
            x = layer(x, src_mask=causal)
        return self.final_norm(x) @ self.embedding.weight.T


# -------------------------------------------------------------------- setups
def _make_pair(family: str, dtype_name: str):
    """Two step functions (ours, theirs) over the same model, batch and optimizer settings."""
    rng = np.random.default_rng(0)
    if family == "encoder-decoder":
        config = EncoderDecoderConfig(
            src_vocab_size=14,
            tgt_vocab_size=14,
            d_model=64,
            n_heads=4,
            d_ff=256,
            n_encoder_layers=2,
            n_decoder_layers=2,
            norm_first=False,
            dtype=dtype_name,
        )
        ours = EncoderDecoder(config, rng=rng)
        theirs = TorchEncoderDecoder(ours)
        source = rng.integers(4, 14, (64, 8))
        target = rng.integers(4, 14, (64, 9))  # labels; the decoder reads them shifted right
        decoder_input = np.concatenate([np.full((64, 1), BOS), target[:, :-1]], axis=1)
        inputs = (source, decoder_input)
    else:
        config = DecoderOnlyConfig(
            vocab_size=16,
            d_model=64,
            n_heads=4,
            d_ff=256,
            n_layers=2,
            context_length=64,
            norm_first=True,
            activation="gelu_tanh" if family.endswith("tanh") else "gelu",
            dtype=dtype_name,
        )
        ours = DecoderOnlyLM(config, rng=rng)
        theirs = TorchDecoderOnly(ours)
        tokens = rng.integers(0, 16, (32, 65))
        inputs, target = (tokens[:, :-1],), tokens[:, 1:]
    ours_optimizer = AdamW(ours.parameters(), lr=1e-3)
    theirs_optimizer = torch.optim.AdamW(theirs.parameters(), lr=1e-3)
    inputs_torch = tuple(torch.from_numpy(x) for x in inputs)
    target_torch = torch.from_numpy(target.reshape(-1))

    def step_ours() -> float:
        ours_optimizer.zero_grad()
        logits = ours.forward(*inputs)
        loss, grad = cross_entropy(logits, target, ignore_index=PAD)
        ours.backward(grad)
        ours_optimizer.step()
        return loss

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


def run_child(repeats: int, profile: str | None) -> None:
    """Time every family and dtype in this process; print one JSON line each."""
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    retained = retain_freed_memory()
    if profile:
        _profile(*profile.split(":"))
        return
    settings = blas_settings()
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
        "--profile",
        metavar="FAMILY:DTYPE",
        help="profile tinyformer instead of timing, e.g. decoder-only:float32",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats = 7
    if args.child:
        run_child(args.repeats, args.profile)
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
