"""Generation as a new user meets it: modes, defaults, equality and inputs that used to reach NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tinyformer.data.tokenizers import EOS_ID
from tinyformer.generation import beam_search, greedy, sample, speculative_decode
from tinyformer.generation.decoding import evaluation_mode
from tinyformer.models import (
    DecoderOnlyConfig,
    DecoderOnlyLM,
    EncoderDecoder,
    EncoderDecoderConfig,
)


def dropout_lm(seed: int = 0) -> DecoderOnlyLM:
    config = DecoderOnlyConfig(
        vocab_size=11, d_model=16, n_heads=2, d_ff=32, n_layers=2, context_length=24, dropout=0.5
    )
    return DecoderOnlyLM(config, rng=np.random.default_rng(seed))


def dropout_ed(seed: int = 0) -> EncoderDecoder:
    config = EncoderDecoderConfig(
        src_vocab_size=11,
        tgt_vocab_size=11,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=1,
        context_length=16,
        dropout=0.5,
    )
    return EncoderDecoder(config, rng=np.random.default_rng(seed))


PROMPT = np.array([[3, 4, 5], [6, 7, 8]])


def test_greedy_is_deterministic_with_dropout_and_gives_the_mode_back():
    lm = dropout_lm()
    assert lm.training  # models are built in training mode
    runs = [greedy(lm, PROMPT, max_new_tokens=8) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert all(m.training for m in lm.modules())  # still training afterwards
    lm.eval()
    assert greedy(lm, PROMPT, max_new_tokens=8) == runs[0]  # the same as in evaluation mode
    ed = dropout_ed()
    first = greedy(ed, PROMPT, max_new_tokens=6)
    assert greedy(ed, PROMPT, max_new_tokens=6) == first
    assert ed.training
    hyps = [beam_search(ed, PROMPT[0], beam_size=3, max_new_tokens=6).best for _ in range(2)]
    assert np.array_equal(hyps[0].tokens, hyps[1].tokens)
    assert ed.training


def test_sampling_and_speculative_decoding_run_without_dropout():
    lm = dropout_lm()
    draws = [sample(lm, PROMPT, rng=np.random.default_rng(4), max_new_tokens=8) for _ in range(2)]
    assert draws[0] == draws[1]
    spec = speculative_decode(lm, dropout_lm(1), PROMPT[0], max_new_tokens=8)
    np.testing.assert_array_equal(spec.tokens, greedy(lm, PROMPT[0], max_new_tokens=8).tokens[0])
    assert lm.training


def test_evaluation_mode_restores_mixed_modes_even_after_an_error():
    lm = dropout_lm()
    lm.layers[0].train(False)  # a caller's mixed state: one block frozen in eval mode
    before = [m.training for m in lm.modules()]
    seen = []

    def fails_inside() -> None:
        with evaluation_mode(lm):
            seen.extend(m.training for m in lm.modules())
            raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        fails_inside()
    assert not any(seen)
    assert [m.training for m in lm.modules()] == before
    assert True in before
    assert False in before


def test_eos_default_depends_on_the_family():
    lm = dropout_lm().eval()
    # An untrained language model must not stop at token 2 unless asked to.
    free = greedy(lm, PROMPT, max_new_tokens=10)
    assert free == greedy(lm, PROMPT, max_new_tokens=10, eos_id=None)
    assert [len(t) for t in free.tokens] == [10, 10]
    assert not free.finished.any()
    early = int(free.tokens[0][3])
    stopped = greedy(lm, PROMPT, max_new_tokens=10, eos_id=early)
    assert stopped.finished[0]
    assert len(stopped.tokens[0]) <= 4
    # An encoder-decoder stops at EOS unless told otherwise.
    ed = dropout_ed().eval()
    assert greedy(ed, PROMPT, max_new_tokens=6) == greedy(
        ed, PROMPT, max_new_tokens=6, eos_id=EOS_ID
    )


def test_generation_results_compare_by_value():
    lm = dropout_lm().eval()
    a = greedy(lm, PROMPT, max_new_tokens=5)
    b = greedy(lm, PROMPT, max_new_tokens=5, use_cache=False)
    assert [x.tolist() for x in a.tokens] == [x.tolist() for x in b.tokens]
    assert a == greedy(lm, PROMPT, max_new_tokens=5)
    c = greedy(lm, PROMPT[:1], max_new_tokens=5)
    assert a != c
    assert a != "a string"


def test_bad_inputs_name_the_argument():
    lm, ed = dropout_lm(), dropout_ed()
    with pytest.raises(ValueError, match=r"prompt must be a rectangular array.*lengths 3, 1"):
        greedy(lm, [[1, 2, 3], [4]], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"source must be a rectangular array.*lengths 2, 3"):
        greedy(ed, [[1, 2], [4, 5, 6]], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"ids must be a rectangular array.*lengths 3, 1"):
        lm.forward([[1, 2, 3], [4]])
    with pytest.raises(ValueError, match="bos_id=0 is the model's pad_id"):
        greedy(ed, PROMPT, max_new_tokens=2, bos_id=0)


def test_a_tiny_temperature_is_greedy_not_an_overflow():
    lm = dropout_lm().eval()
    cold = sample(lm, PROMPT, rng=np.random.default_rng(0), max_new_tokens=6, temperature=1e-308)
    assert cold == greedy(lm, PROMPT, max_new_tokens=6)
