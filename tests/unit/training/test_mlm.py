"""The masked-language-model objective: cross-entropy at the chosen positions only."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import encoder_only

from tinyformer.data.masking import MaskingScheme
from tinyformer.gradcheck import max_relative_error, numerical_gradient
from tinyformer.losses import cross_entropy
from tinyformer.training import mlm_loss


def model_and_batch(seed: int = 1):
    model = encoder_only(seed, vocab_size=7, context_length=6, d_model=4, n_heads=2, d_ff=6)
    scheme = MaskingScheme(6, mask_id=6, select_prob=0.5)
    batch = scheme.corrupt(
        np.random.default_rng(seed).integers(0, 6, (3, 6)), np.random.default_rng(seed + 1)
    )
    assert batch.chosen.any()
    assert not batch.chosen.all()
    return model, batch


def test_the_loss_is_the_cross_entropy_of_the_chosen_positions():
    model, batch = model_and_batch()
    result = mlm_loss(model, batch, backward=False)
    assert result.n_tokens == batch.chosen.sum()
    logits = model.forward(batch.inputs)
    chosen = batch.chosen
    expected, _ = cross_entropy(logits[chosen][None], batch.labels[chosen][None])
    assert result.loss == pytest.approx(expected, rel=1e-12)
    assert result.n_correct == int((logits.argmax(-1) == batch.labels)[chosen].sum())


def test_the_gradient_through_the_model_matches_finite_differences():
    model, batch = model_and_batch()
    model.zero_grad()
    mlm_loss(model, batch)
    table = model.encoder.embedding.weight  # read by the embedding and the tied output

    def loss() -> float:
        return mlm_loss(model, batch, backward=False).loss

    assert max_relative_error(table.grad, numerical_gradient(loss, table.value)) < 1e-6


def test_positions_that_were_not_chosen_get_no_gradient():
    model, batch = model_and_batch(2)
    captured = {}
    backward = model.backward

    def spy(grad):
        captured["grad"] = grad.copy()
        return backward(grad)

    model.backward = spy
    mlm_loss(model, batch)
    assert np.all(captured["grad"][~batch.chosen] == 0)
    assert np.abs(captured["grad"][batch.chosen]).min() > 0


def test_a_batch_that_is_not_masked_tokens_is_refused():
    model, _ = model_and_batch()
    with pytest.raises(
        TypeError, match=r"batch must be a tinyformer\.data\.masking\.MaskedTokens"
    ):
        mlm_loss(model, (np.ones((1, 3), dtype=np.int64),))
