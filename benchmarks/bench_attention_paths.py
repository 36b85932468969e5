"""Is multihead.py's own attention code worth keeping? Its fused path against one built on attention.py.

``tinyformer.attention`` holds the readable attention, forward and backward, that
the book derives. ``MultiHeadAttention`` does not call it: it keeps a second,
fused path (queries pre-scaled, a softmax without row maxima when the scores'
range allows, the softmax term of the backward pass from the head outputs, the
gradients written straight into the layout of the fused projection). This script
measures what that path buys: one training step of the benchmark's decoder-only
model (``bench_training_step.py``) with the layer as it is, and with its forward
and backward replaced by the same computation through
``scaled_dot_product_attention`` and ``scaled_dot_product_attention_backward``,
alternating the two in one process, one BLAS thread.

Run ``python benchmarks/bench_attention_paths.py`` (``--quick`` for fewer repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import cpuinfo, run_setting, time_alternately
from bench_training_step import _make_pair

from tinyformer import multihead
from tinyformer.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
)
from tinyformer.layers import sum_rows
from tinyformer.runtime import retain_freed_memory

FUSED = (multihead.MultiHeadAttention.forward, multihead.MultiHeadAttention.backward)


def plain_forward(self, x, context=None, mask=None, cache=None):  # noqa: ARG001
    """Self-attention through attention.py (no dropout, no cache: what the benchmark needs)."""
    b, t, d = x.shape
    qkv = x.reshape(b * t, d) @ self.w_qkv.value + self.b_qkv.value  # (B T, 3 d)
    qkv = qkv.reshape(b, t, 3, self.n_heads, self.d_k).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]  # (B, h, T, d_k)
    allowed = None if mask is None else mask[None, None]
    heads, weights = scaled_dot_product_attention(q, k, v, allowed, scale=self.scale)
    merged = heads.transpose(0, 2, 1, 3).reshape(b * t, d)
    self._save(x, q, k, v, weights, merged)
    return (merged @ self.w_out.value + self.b_out.value).reshape(b, t, d)


def plain_backward(self, grad_out):
    """The matching backward pass through attention.py."""
    x, q, k, v, weights, merged = self._saved()
    b, t, d = x.shape
    grad = grad_out.reshape(b * t, d)
    self.w_out.grad += merged.T @ grad
    self.b_out.grad += sum_rows(grad)
    grad_heads = (grad @ self.w_out.value.T).reshape(b, t, self.n_heads, self.d_k)
    grads = scaled_dot_product_attention_backward(
        grad_heads.transpose(0, 2, 1, 3), q, k, v, weights, scale=self.scale
    )
    grad_qkv = np.stack(grads).transpose(1, 3, 0, 2, 4).reshape(b * t, 3 * d)
    x2 = x.reshape(b * t, d)
    self.w_qkv.grad += x2.T @ grad_qkv
    self.b_qkv.grad += sum_rows(grad_qkv)
    return (grad_qkv @ self.w_qkv.value.T).reshape(x.shape)


def _use(path: str) -> None:
    layer = multihead.MultiHeadAttention
    layer.forward, layer.backward = FUSED if path == "fused" else (plain_forward, plain_backward)


def run_child(repeats: int) -> None:
    """Time both paths, alternating, after checking both against PyTorch; print JSON rows."""
    print(json.dumps({"settings": {"freed memory kept": str(retain_freed_memory())}}))
    for dtype_name in ("float32", "float64"):
        step, _, difference, _ = _make_pair("decoder-only", dtype_name)
        against_torch = {}
        for path in ("fused", "plain"):  # the same logits as PyTorch's, either way
            _use(path)
            against_torch[path] = difference()
        _use("fused")
        step_fused = step

        def step_plain(step=step):
            _use("plain")
            try:
                step()
            finally:
                _use("fused")

        for _ in range(2):
            step_fused(), step_plain()
        times_fused, times_plain = time_alternately(step_fused, step_plain, repeats)
        row = {
            "dtype": dtype_name,
            "fused_ms": 1e3 * float(np.median(times_fused)),
            "plain_ms": 1e3 * float(np.median(times_plain)),
            "against_torch": [against_torch["fused"], against_torch["plain"]],
        }
        print(json.dumps(row), flush=True)


def main() -> None:
    """Run the child and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="7 repeats")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 7
    if args.child:
        run_child(args.repeats)
        return
    print(
        "Training step of the decoder-only benchmark model: multihead.py's path vs attention.py's"
    )
    print(f"CPU: {cpuinfo('model name') or platform.machine()}, {os.cpu_count()} logical cores")
    rows = run_setting(__file__, ["--repeats", str(args.repeats)], threads=1)
    print(f"\n{'dtype':<8} {'fused ms':>9} {'attention.py ms':>15} {'saved':>6}  |logits - torch|")
    for r in rows:
        saved = 1 - r["fused_ms"] / r["plain_ms"]
        first = ", ".join(f"{v:.1e}" for v in r["against_torch"])
        print(
            f"{r['dtype']:<8} {r['fused_ms']:>9.2f} {r['plain_ms']:>15.2f} {saved:>6.1%}  {first}"
        )
    print(
        "saved = the share of the step's time the fused path saves; |logits - torch| = the"
        " largest difference\nfrom PyTorch's logits before timing, fused path then attention.py's"
    )


if __name__ == "__main__":
    main()
