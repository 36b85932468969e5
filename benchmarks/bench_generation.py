"""Time greedy generation per token with the key/value cache: tinyformer (NumPy) against PyTorch.

The model is the decoder-only model of ``bench_kv_cache.py`` (vocabulary 256,
d_model 128, 4 heads, d_ff 512, 4 pre-norm layers with a final LayerNorm,
exact GELU, learned positions, context 512, tied output). The PyTorch side is
the same model written as a small eager module here (``TorchDecoderLM``;
``nn.TransformerEncoderLayer`` has no cache), with a key/value cache of its
own: one preallocated ``(B, h, context, d_k)`` tensor per layer for the keys
and one for the values, the new positions written in place, attention by
``F.scaled_dot_product_attention``. tinyformer's weights are copied in (our
``Linear`` weights are ``(in, out)``, a torch ``Linear`` weight is ``(out, in)``;
PyTorch's side projects queries, keys and values with one ``Linear`` whose
weight stacks our three, as ``nn.MultiheadAttention`` does).

tinyformer decodes with ``DecoderOnlyLM.step``: the decoder stack's own
``forward`` with each block's key/value cache, under ``no_grad`` (no state kept
for a backward pass), the same layers training runs.

Both sides do the same work per generated token: feed the prompt (16 tokens)
once, then one token at a time; take the argmax of the last position's logits
(ties to the smaller id) and the log-probability of the chosen token (a
log-softmax over the vocabulary), as ``tinyformer.generation.greedy`` returns
it. PyTorch runs under ``torch.inference_mode()``. Before timing, the script
checks that both produce the same tokens (in float32 it reports the first
step where they part, if they do) and prints the largest logit difference of
the first step (the prompt).

Time per generated token is the median time of one whole generation (prompt
included) over the repeats, divided by the number of new tokens; the ratio is
tinyformer's over PyTorch's (below 1: NumPy is faster). The two are timed in
the same child process per BLAS thread count: in alternation at one thread, one
after the other at more (``_harness.time_side_by_side``). The last table
gives tinyformer's cache speed-up over recomputing the prefix at every step
(``use_cache=False``) at 256 new tokens, batch 1, measured by
``bench_kv_cache.compare``, and the call floor: the same cached generation by a
model 4 wide (``d_model = d_ff = 4``, everything else the same), whose time is
what the step's NumPy and Python calls cost with next to no arithmetic. Uncached
time over that floor bounds the speed-up any cached step making the same calls
could show.

Run ``python benchmarks/bench_generation.py`` (``--quick`` for fewer repeats,
``--threads 1 2`` for two BLAS thread counts, ``--profile float32:8:256`` to
print where tinyformer's time goes in one row).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from tinyformer.generation import greedy
from tinyformer.models import DecoderOnlyConfig, DecoderOnlyLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import cpuinfo, run_or_profile, time_side_by_side
from bench_encoder_block import in_proj_bias, in_proj_weight, torch_settings
from bench_kv_cache import BATCHES, MODEL, NEW_TOKENS, PROMPT_LENGTH, compare

DTYPES = ["float32", "float64"]
SPEED_UP_ROW = {"batch": 1, "new_tokens": 256}


# ------------------------------------------------------------- PyTorch model
def _copy(target: torch.Tensor, value: np.ndarray) -> None:
    with torch.no_grad():
        target.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def _copy_linear(theirs: torch.nn.Linear, weight: np.ndarray, bias: np.ndarray) -> None:
    """Our weights are ``(in, out)`` (``y = x W + b``); torch's are ``(out, in)``."""
    _copy(theirs.weight, weight.T)
    _copy(theirs.bias, bias)


class TorchBlock(torch.nn.Module):
    """One pre-norm decoder block with a key/value cache: ``x + MHA(LN(x))``, ``x + FFN(LN(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.norm1 = torch.nn.LayerNorm(d_model, dtype=dtype)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, dtype=dtype)
        self.out = torch.nn.Linear(d_model, d_model, dtype=dtype)
        self.norm2 = torch.nn.LayerNorm(d_model, dtype=dtype)
        self.fc1 = torch.nn.Linear(d_model, d_ff, dtype=dtype)
        self.fc2 = torch.nn.Linear(d_ff, d_model, dtype=dtype)

    def copy_from(self, ours) -> None:
        """Copy a tinyformer ``TransformerBlock`` (pre-norm, no cross-attention)."""
        attention, ffn = ours.self_attention.layer, ours.feed_forward.layer
        _copy(self.qkv.weight, in_proj_weight(attention))  # (3d, d)
        _copy(self.qkv.bias, in_proj_bias(attention))
        _copy_linear(self.out, attention.out_proj.weight.value, attention.out_proj.bias.value)
        _copy_linear(self.fc1, ffn.linear_in.weight.value, ffn.linear_in.bias.value)
        _copy_linear(self.fc2, ffn.linear_out.weight.value, ffn.linear_out.bias.value)
        for norm, residual in ((self.norm1, ours.self_attention), (self.norm2, ours.feed_forward)):
            _copy(norm.weight, residual.norm.gain.value)
            _copy(norm.bias, residual.norm.bias.value)

    def forward(
        self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> torch.Tensor:
        """``x`` ``(B, n, d)`` at positions ``start ..``; writes its keys and values at them."""
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, n, 3, self.n_heads, self.d_k)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, n, d_k)
        stop = start + n
        keys[:, :, start:stop] = k
        values[:, :, start:stop] = v
        mask = None
        if n > 1:  # query i (position start + i) sees keys 0 .. start + i
            mask = torch.ones(n, stop, dtype=torch.bool).tril(start)
        heads = F.scaled_dot_product_attention(
            q, keys[:, :, :stop], values[:, :, :stop], attn_mask=mask
        )  # (B, h, n, d_k)
        x = x + self.out(heads.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TorchDecoderLM(torch.nn.Module):
    """The benchmark's decoder-only model in eager PyTorch, with tinyformer's weights."""

    def __init__(self, ours: DecoderOnlyLM) -> None:
        super().__init__()
        c = ours.config
        self.dtype = getattr(torch, c.dtype)
        self.n_heads, self.d_k, self.context = c.n_heads, c.d_model // c.n_heads, c.context_length
        self.embedding = torch.nn.Embedding(c.vocab_size, c.d_model, dtype=self.dtype)
        self.positions = torch.nn.Parameter(
            torch.empty(c.context_length, c.d_model, dtype=self.dtype)
        )
        self.layers = torch.nn.ModuleList(
            TorchBlock(c.d_model, c.n_heads, c.d_ff, self.dtype) for _ in range(c.n_layers)
        )
        self.final_norm = torch.nn.LayerNorm(c.d_model, dtype=self.dtype)
        stack = ours.decoder
        _copy(self.embedding.weight, stack.embedding.weight.value)
        _copy(self.positions, stack.positions.weight.value)
        for theirs_block, ours_block in zip(self.layers, stack.layers, strict=True):
            theirs_block.copy_from(ours_block)
        _copy(self.final_norm.weight, stack.final_norm.gain.value)
        _copy(self.final_norm.bias, stack.final_norm.bias.value)

    def new_cache(self, batch: int) -> list:
        """Keys and values ``(B, h, context, d_k)`` per layer, and the number of positions held."""
        shape = (batch, self.n_heads, self.context, self.d_k)
        tensors = [
            (torch.empty(shape, dtype=self.dtype), torch.empty(shape, dtype=self.dtype))
            for _ in self.layers
        ]
        return [tensors, 0]

    def forward(self, ids: torch.Tensor, cache: list) -> torch.Tensor:
        """Logits ``(B, n, V)`` of ``ids`` ``(B, n)`` fed after the cached positions."""
        start, n = cache[1], ids.shape[1]
        x = self.embedding(ids) + self.positions[start : start + n]
        for layer, (keys, values) in zip(self.layers, cache[0], strict=True):
            x = layer(x, keys, values, start)
        cache[1] = start + n
        return self.final_norm(x) @ self.embedding.weight.T


def torch_greedy(model: TorchDecoderLM, prompt: torch.Tensor, new_tokens: int):
    """Greedy decoding with the cache: tokens and their log-probabilities, ``(B, new_tokens)``."""
    with torch.inference_mode():
        cache = model.new_cache(prompt.shape[0])
        pending, tokens, log_probs = prompt, [], []
        for _ in range(new_tokens):
            logits = model(pending, cache)[:, -1]  # (B, V)
            chosen = logits.argmax(-1)  # (B,)
            log_probs.append(torch.log_softmax(logits, -1).gather(1, chosen[:, None])[:, 0])
            tokens.append(chosen)
            pending = chosen[:, None]
        return torch.stack(tokens, 1).numpy(), torch.stack(log_probs, 1).numpy()


# ------------------------------------------------------------------- timing
def _make_pair(dtype_name: str, batch: int):
    """The tinyformer model, PyTorch's copy of it, and the prompt of ``batch`` rows."""
    ours = DecoderOnlyLM(
        DecoderOnlyConfig(**MODEL, dtype=dtype_name), rng=np.random.default_rng(0)
    )
    ours.eval()
    theirs = TorchDecoderLM(ours).eval()
    prompt = np.random.default_rng(1).integers(4, MODEL["vocab_size"], (batch, PROMPT_LENGTH))
    return ours, theirs, prompt


def _ours(model: DecoderOnlyLM, prompt: np.ndarray, new_tokens: int):
    result = greedy(model, prompt, max_new_tokens=new_tokens, eos_id=None)
    return np.stack(result.tokens), np.stack(result.token_log_probs)


def _call_floor_ms(dtype_name: str, prompt: np.ndarray, new_tokens: int, repeats: int) -> float:
    """Median ms of cached greedy decoding by a model 4 wide: the cost of the calls alone.

    Same code, layers, heads, vocabulary, prompt and number of tokens, with
    ``d_model = d_ff = 4``: the matrix products and elementwise work shrink to
    next to nothing, and what is left is what NumPy and Python charge per call.
    A cached step cannot be cheaper than that without making fewer calls.
    """
    config = DecoderOnlyConfig(**{**MODEL, "d_model": 4, "d_ff": 4}, dtype=dtype_name)
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0)).eval()
    _ours(model, prompt, new_tokens)  # warm-up
    seconds = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        _ours(model, prompt, new_tokens)
        seconds.append(time.perf_counter() - start)
    return 1e3 * float(np.median(seconds))


def _check(ours, theirs, prompt: np.ndarray, new_tokens: int) -> dict:
    """First-step logit gap; same tokens, or the first step where they differ."""
    state = ours.start(prompt.shape[0])
    first_ours = ours.step(prompt, state)
    with torch.inference_mode():
        first_theirs = theirs(torch.from_numpy(prompt), theirs.new_cache(prompt.shape[0])).numpy()
    tokens_ours, log_p_ours = _ours(ours, prompt, new_tokens)
    tokens_theirs, log_p_theirs = torch_greedy(theirs, torch.from_numpy(prompt), new_tokens)
    differ = np.flatnonzero((tokens_ours != tokens_theirs).any(axis=0))
    same_upto = int(differ[0]) if differ.size else new_tokens
    return {
        "first_step_logit_gap": float(np.abs(first_ours - first_theirs).max()),
        "first_divergence": None if not differ.size else int(differ[0]),
        "log_prob_gap": float(np.abs(log_p_ours - log_p_theirs)[:, :same_upto].max()),
    }


def run_child(repeats: int, speed_up_repeats: int, profile: str | None) -> None:
    """Time every dtype, batch and length in this process; print one JSON line each."""
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    if profile:
        _profile(*profile.split(":"))
        return
    print(json.dumps({"settings": torch_settings()}), flush=True)
    for dtype_name in DTYPES:
        for batch in BATCHES:
            ours, theirs, prompt = _make_pair(dtype_name, batch)
            prompt_torch = torch.from_numpy(prompt)
            for new_tokens in NEW_TOKENS:
                check = _check(ours, theirs, prompt, new_tokens)  # also the warm-up
                times_ours, times_theirs = time_side_by_side(
                    lambda m=ours, p=prompt, n=new_tokens: _ours(m, p, n),
                    lambda m=theirs, p=prompt_torch, n=new_tokens: torch_greedy(m, p, n),
                    repeats,
                    threads=threads,
                    collect_each=True,
                )
                row = {
                    "table": "torch",
                    "dtype": dtype_name,
                    "batch": batch,
                    "new_tokens": new_tokens,
                    "threads": threads,
                    "repeats": repeats,
                    "ours_ms": 1e3 * float(np.median(times_ours)) / new_tokens,
                    "torch_ms": 1e3 * float(np.median(times_theirs)) / new_tokens,
                    **check,
                }
                print(json.dumps(row), flush=True)
            if batch == SPEED_UP_ROW["batch"]:
                n = SPEED_UP_ROW["new_tokens"]
                row = {
                    "table": "cache",
                    "dtype": dtype_name,
                    "batch": batch,
                    "new_tokens": n,
                    "threads": threads,
                    "repeats": speed_up_repeats,
                    **compare(ours, prompt, n, speed_up_repeats),
                    "floor_ms": _call_floor_ms(dtype_name, prompt, n, speed_up_repeats),
                }
                print(json.dumps(row), flush=True)


def _profile(dtype_name: str, batch: str, new_tokens: str) -> None:
    """Profile tinyformer's greedy decoding of one row, 5 times; functions by own time."""
    ours, _, prompt = _make_pair(dtype_name, int(batch))
    _ours(ours, prompt, int(new_tokens))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        _ours(ours, prompt, int(new_tokens))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


# -------------------------------------------------------------------- parent
def _run_setting(threads: int, args: argparse.Namespace) -> list[dict]:
    child_args = ["--repeats", str(args.repeats), "--speed-up-repeats", str(args.speed_up_repeats)]
    return run_or_profile(__file__, child_args, threads=threads, profile=args.profile)


def _print_tables(rows: list[dict]) -> None:
    header = (
        f"{'dtype':<8} {'batch':>5} {'new tokens':>10} {'threads':>7} {'tinyformer ms/tok':>17}"
        f" {'torch ms/tok':>12} {'ratio':>6} {'same tokens':>11} {'|Δ logits| step 1':>17}"
        f" {'|Δ log p|':>9}"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in (r for r in rows if r["table"] == "torch"):
        same = "yes" if r["first_divergence"] is None else f"to step {r['first_divergence']}"
        print(
            f"{r['dtype']:<8} {r['batch']:>5} {r['new_tokens']:>10} {r['threads']:>7}"
            f" {r['ours_ms']:>17.3f} {r['torch_ms']:>12.3f} {r['ours_ms'] / r['torch_ms']:>6.2f}"
            f" {same:>11} {r['first_step_logit_gap']:>17.1e} {r['log_prob_gap']:>9.1e}"
        )
    print(
        "ms/tok = median time of one generation (prompt included) / new tokens;"
        " ratio = tinyformer / PyTorch (below 1: NumPy is faster);\n|Δ log p| = max"
        " |log-probability difference| of the chosen tokens while the tokens agree"
    )
    header = (
        f"{'dtype':<8} {'batch':>5} {'new tokens':>10} {'threads':>7} {'cached ms':>10}"
        f" {'uncached ms':>11} {'speed-up':>8} {'same tokens':>11} {'call floor ms':>13}"
        f" {'bound':>6}"
    )
    print("\ntinyformer's KV cache against recomputing the prefix (use_cache=False)")
    print(header)
    print("-" * len(header))
    for r in (r for r in rows if r["table"] == "cache"):
        print(
            f"{r['dtype']:<8} {r['batch']:>5} {r['new_tokens']:>10} {r['threads']:>7}"
            f" {r['cached_ms']:>10.1f} {r['uncached_ms']:>11.1f}"
            f" {r['uncached_ms'] / r['cached_ms']:>7.1f}x {r['same_tokens']!s:>11}"
            f" {r['floor_ms']:>13.1f} {r['uncached_ms'] / r['floor_ms']:>5.1f}x"
        )
    print(
        "call floor = the same cached generation by the same code with d_model = d_ff = 4:"
        " what its NumPy and Python\ncalls cost with next to no arithmetic; bound = uncached /"
        " call floor, the most the cache could gain without fewer calls"
    )


def main() -> None:
    """Parse the options; run the children (parent) or the timings (child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--speed-up-repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument(
        "--profile",
        metavar="DTYPE:BATCH:NEW_TOKENS",
        help="profile tinyformer instead of timing, e.g. float32:8:256",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats = args.speed_up_repeats = 3
    if args.child:
        run_child(args.repeats, args.speed_up_repeats, args.profile)
        return
    print("Greedy generation per token with the KV cache: tinyformer vs PyTorch eager")
    model = ", ".join(f"{k}={v}" for k, v in MODEL.items())
    print(f"Model: {model}, pre-norm, GELU, learned positions, tied output")
    print(f"Prompt of {PROMPT_LENGTH} tokens, no EOS stop; batches {BATCHES}")
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    rows = []
    for threads in args.threads:
        rows += _run_setting(threads, args)
    if rows:
        _print_tables(rows)


if __name__ == "__main__":
    main()
