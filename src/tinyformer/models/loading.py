"""One call from a checkpoint file to a working model: :func:`load_model`.

A checkpoint (:mod:`tinyformer.checkpoint`) records the model's class name and
its configuration next to the weights, so nothing else is needed to rebuild it:
the class is looked up in :data:`MODEL_CLASSES`, built from the configuration,
and the weights are loaded, after every check the checkpoint makes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tinyformer.checkpoint import Checkpoint, read_checkpoint
from tinyformer.models.config import DecoderOnlyConfig, EncoderDecoderConfig, EncoderOnlyConfig
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.models.encoder_decoder import EncoderDecoder
from tinyformer.models.encoder_only import EncoderOnlyMLM
from tinyformer.module import Module

__all__ = ["MODEL_CLASSES", "load_model", "model_from_checkpoint"]

MODEL_CLASSES: dict[str, tuple[type[Module], Any]] = {
    "EncoderDecoder": (EncoderDecoder, EncoderDecoderConfig),
    "DecoderOnlyLM": (DecoderOnlyLM, DecoderOnlyConfig),
    "EncoderOnlyMLM": (EncoderOnlyMLM, EncoderOnlyConfig),
}
"""Each model class by the name a checkpoint stores, with its configuration class."""


def model_from_checkpoint(checkpoint: Checkpoint) -> Module:
    """Build the model a :class:`~tinyformer.checkpoint.Checkpoint` describes and load its weights.

    The model comes back in evaluation mode (dropout off): a loaded model is
    usually there to be used. Call ``model.train()`` to go on training it (and
    :func:`~tinyformer.checkpoint.load_checkpoint` to restore an optimizer too).
    """
    name = checkpoint.metadata["model"]["class"]
    if name not in MODEL_CLASSES:
        raise ValueError(
            f"checkpoint {checkpoint.path} holds a {name!r}, not one of the models this"
            f" function builds ({', '.join(sorted(MODEL_CLASSES))})"
        )
    if checkpoint.config is None:
        raise ValueError(f"checkpoint {checkpoint.path} has no model configuration")
    model_class, config_class = MODEL_CLASSES[name]
    # The generator only draws the initial weights, which the checkpoint replaces.
    model = model_class(config_class.from_dict(checkpoint.config), rng=np.random.default_rng(0))
    checkpoint.restore(model)
    return model.eval()


def load_model(path: str | os.PathLike[str]) -> Module:
    """Read a checkpoint file and return the model in it, in evaluation mode.

    The tokenizer saved with it, if any, is ``read_checkpoint(path).tokenizer``.

    Examples
    --------
    >>> from tinyformer.checkpoint import save_checkpoint
    >>> config = DecoderOnlyConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=16, n_layers=1)
    >>> model = DecoderOnlyLM(config, rng=np.random.default_rng(0))
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.npz"
    >>> _ = save_checkpoint(path, model)
    >>> load_model(path).state_dict().keys() == model.state_dict().keys()
    True
    """
    return model_from_checkpoint(read_checkpoint(path))
