"""Bad input to the layer library raises an error that names the argument at fault.

Each case is one distinct mistake a user can make; the test checks the error
type and that the message names the argument (and, where it helps, what was
expected). None of them may end in NaN or in a bare NumPy traceback.
"""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.blocks import DecoderBlock, EncoderBlock
from tinyformer.efficient import (
    linear_attention,
    linear_attention_backward,
    tiled_attention,
    tiled_attention_backward,
)
from tinyformer.feedforward import FeedForward
from tinyformer.layers import Dropout, Embedding, Linear, TiedOutputProjection
from tinyformer.losses import cross_entropy
from tinyformer.multihead import KVCache, MultiHeadAttention
from tinyformer.norm import LayerNorm, RMSNorm


def _rng():
    return np.random.default_rng(0)


def _x(*shape, dtype=np.float64):
    return np.ones(shape, dtype=dtype)


def _mha(**kwargs):
    return MultiHeadAttention(8, 2, rng=_rng(), **kwargs)


def _after_forward(layer, *args, **kwargs):
    layer.forward(*args, **kwargs)
    return layer


def _nan_q():
    q = _x(1, 3, 4)
    q[0, 1, 2] = np.nan
    return q


# fmt: off
CASES = [
    # ------------------------------------------------------------ constructors
    ("d_model not divisible", lambda: MultiHeadAttention(10, 3, rng=_rng()), ValueError, "d_model"),
    ("n_heads zero", lambda: MultiHeadAttention(8, 0, rng=_rng()), ValueError, "n_heads"),
    ("odd d_k with rotary", lambda: MultiHeadAttention(6, 2, rng=_rng(), rotary=True), ValueError, "d_k"),
    ("Linear d_in zero", lambda: Linear(0, 3, rng=_rng()), ValueError, "d_in"),
    ("Linear d_out float", lambda: Linear(3, 2.5, rng=_rng()), TypeError, "d_out"),
    ("rng is a seed", lambda: Linear(3, 2, rng=0), TypeError, "rng"),
    ("legacy RandomState", lambda: FeedForward(4, 8, rng=np.random.RandomState(0)), TypeError, "rng"),
    ("LayerNorm eps negative", lambda: LayerNorm(4, eps=-1.0), ValueError, "eps"),
    ("integer dtype", lambda: LayerNorm(4, dtype=np.int32), TypeError, "dtype"),
    ("RMSNorm d_model bool", lambda: RMSNorm(True), TypeError, "d_model"),
    ("dropout p = 1", lambda: Dropout(1.0, rng=_rng()), ValueError, "p"),
    ("dropout p string", lambda: Dropout("0.1", rng=_rng()), TypeError, "p"),
    ("unknown activation", lambda: FeedForward(4, 8, rng=_rng(), activation="tanh"), ValueError, "activation"),
    ("vocab_size zero", lambda: Embedding(0, 4, rng=_rng()), ValueError, "vocab_size"),
    ("tie to a Linear", lambda: TiedOutputProjection(Linear(2, 3, rng=_rng())), TypeError, "embedding"),
    ("block d_model vs heads", lambda: EncoderBlock(8, 3, 16, rng=_rng()), ValueError, "d_model"),
    ("block d_ff negative", lambda: DecoderBlock(8, 2, -1, rng=_rng()), ValueError, "d_ff"),
    # ------------------------------------------------------------------ inputs
    ("Linear last dim", lambda: Linear(3, 2, rng=_rng()).forward(_x(4, 5)), ValueError, "x"),
    ("MHA rank 2", lambda: _mha().forward(_x(4, 8)), ValueError, "x"),
    ("MHA last dim", lambda: _mha().forward(_x(1, 4, 6)), ValueError, "x"),
    ("float32 into float64", lambda: _mha().forward(_x(1, 4, 8, dtype=np.float32)), TypeError, "x"),
    ("float64 into float32", lambda: LayerNorm(8, dtype=np.float32).forward(_x(2, 8)), TypeError, "x"),
    ("string array", lambda: LayerNorm(2).forward(np.array([["a", "b"]])), TypeError, "x"),
    ("float16 into dropout", lambda: Dropout(0.1, rng=_rng()).forward(_x(2, dtype=np.float16)), TypeError, "x"),
    ("mask of ints", lambda: _mha().forward(_x(1, 4, 8), mask=np.ones((4, 4), int)), TypeError, "mask"),
    ("mask wrong shape", lambda: _mha().forward(_x(1, 4, 8), mask=np.ones((3, 5), bool)), ValueError, "mask"),
    ("mask with head axis", lambda: _mha().forward(_x(2, 4, 8), mask=np.ones((2, 2, 4, 4), bool)), ValueError, "mask"),
    ("context batch", lambda: _mha().forward(_x(2, 4, 8), _x(3, 5, 8)), ValueError, "context"),
    ("context dtype", lambda: _mha().forward(_x(2, 4, 8), _x(2, 5, 8, dtype=np.float32)), TypeError, "context"),
    ("rotary cross-attention", lambda: _mha(rotary=True).forward(_x(1, 2, 8), _x(1, 3, 8)), ValueError, "context"),
    ("cache not a KVCache", lambda: _mha().forward(_x(1, 2, 8), cache={}), TypeError, "cache"),
    ("negative token id", lambda: Embedding(5, 2, rng=_rng()).forward(np.array([[1, -1]])), ValueError, "ids"),
    ("float token ids", lambda: Embedding(5, 2, rng=_rng()).forward(np.array([1.0, 2.0])), TypeError, "ids"),
    ("token id = vocab", lambda: Embedding(5, 2, rng=_rng()).forward(np.array([0, 5])), ValueError, "ids"),
    ("decoder without memory", lambda: DecoderBlock(8, 2, 8, rng=_rng()).forward(_x(1, 2, 8)), ValueError, "memory"),
    ("memory without cross-attention", lambda: DecoderBlock(8, 2, 8, rng=_rng(), cross_attention=False).forward(_x(1, 2, 8), _x(1, 2, 8)), ValueError, "memory"),
    ("memory last dim", lambda: DecoderBlock(8, 2, 8, rng=_rng()).forward(_x(1, 2, 8), _x(1, 2, 4)), ValueError, "memory"),
    ("decoder cache type", lambda: DecoderBlock(8, 2, 8, rng=_rng()).forward(_x(1, 2, 8), _x(1, 2, 8), cache=KVCache()), TypeError, "cache"),
    ("cache of another batch", lambda: _mha().forward(_x(1, 1, 8), cache=_filled_cache()), ValueError, "cache"),
    ("cache append mismatch", lambda: _filled_cache().append(_x(3, 2, 1, 5), _x(3, 2, 1, 4)), ValueError, "keys"),
    # ---------------------------------------------------------------- backward
    ("backward before forward", lambda: Linear(3, 2, rng=_rng()).backward(_x(1, 2)), RuntimeError, "backward"),
    ("block backward first", lambda: EncoderBlock(8, 2, 8, rng=_rng()).backward(_x(1, 2, 8)), RuntimeError, "backward"),
    ("grad wrong shape", lambda: _after_forward(LayerNorm(4), _x(2, 4)).backward(_x(2, 3)), ValueError, "grad_out"),
    ("grad wrong dtype", lambda: _after_forward(_mha(), _x(1, 2, 8)).backward(_x(1, 2, 8, dtype=np.float32)), TypeError, "grad_out"),
    ("grad not an array", lambda: _after_forward(RMSNorm(2), _x(1, 2)).backward([[1.0, 1.0]]), TypeError, "grad_out"),
    # --------------------------------------------------------------- functions
    ("float targets", lambda: cross_entropy(_x(2, 3), np.array([0.0, 1.0])), TypeError, "targets"),
    ("targets shape", lambda: cross_entropy(_x(2, 3), np.array([0, 1, 2])), ValueError, "targets"),
    ("target out of range", lambda: cross_entropy(_x(2, 3), np.array([0, 3])), ValueError, "targets"),
    ("smoothing above 1", lambda: cross_entropy(_x(2, 3), np.array([0, 1]), label_smoothing=1.5), ValueError, "label_smoothing"),
    ("ignore_index string", lambda: cross_entropy(_x(2, 3), np.array([0, 1]), ignore_index="pad"), TypeError, "ignore_index"),
    ("NaN logits", lambda: cross_entropy(np.array([[np.nan, 0.0]]), np.array([0])), ValueError, "logits"),
    ("unknown feature map", lambda: linear_attention(_x(2, 4), _x(2, 4), _x(2, 4), feature_map="softmax"), ValueError, "feature_map"),
    ("causal with T_q != T_k", lambda: linear_attention(_x(2, 4), _x(3, 4), _x(3, 4), causal=True), ValueError, "causal"),
    ("causal not a bool", lambda: linear_attention(_x(2, 4), _x(2, 4), _x(2, 4), causal="yes"), TypeError, "causal"),
    ("linear grad shape", lambda: linear_attention_backward(_x(2, 3), _x(2, 4), _x(2, 4), _x(2, 4)), ValueError, "grad_output"),
    ("block_size zero", lambda: tiled_attention(_x(2, 4), _x(2, 4), _x(2, 4), block_size=0), ValueError, "block_size"),
    ("NaN query", lambda: tiled_attention(_nan_q(), _x(1, 3, 4), _x(1, 3, 4)), ValueError, "q"),
    ("tiled mask dtype", lambda: tiled_attention(_x(2, 4), _x(2, 4), _x(2, 4), np.ones((2, 2))), TypeError, "mask"),
    ("lse shape", lambda: tiled_attention_backward(_x(2, 4), _x(2, 4), _x(2, 4), _x(2, 4), _x(2, 4), _x(3)), ValueError, "log_sum_exp"),
]
# fmt: on


def _filled_cache():
    cache = KVCache()
    cache.append(_x(3, 2, 1, 4), _x(3, 2, 1, 4))  # a batch of 3, then a batch of 1 arrives
    return cache


@pytest.mark.parametrize(
    ("call", "error", "name"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_raises_an_error_naming_the_argument(call, error, name):
    with pytest.raises(error) as info:
        call()
    assert name in str(info.value), str(info.value)


def test_there_are_at_least_25_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 25
