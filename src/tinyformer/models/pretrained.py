"""A decoder-only model as a Hugging Face checkpoint folder, and back.

:func:`save_pretrained` writes the folder ``transformers``' own ``save_pretrained``
writes for a ``GPT2LMHeadModel`` or a ``LlamaForCausalLM``, so that
``AutoModelForCausalLM.from_pretrained(folder)`` loads the model; :func:`from_pretrained`
reads such a folder, written by either library, into a
:class:`~tinyformer.models.decoder_only.DecoderOnlyLM`. The folder holds

- ``config.json``: the sizes and options, in ``transformers``' names
  (:func:`~tinyformer.models.hf.config_to_hf`);
- ``model.safetensors``: every tensor under the name and in the shape
  ``transformers`` gives it (:func:`~tinyformer.models.hf.to_hf_state_dict` says
  which are transposed, split, joined or left out), in the model's dtype, written
  and read with the NumPy API of the ``safetensors`` package (``pip install
  'tinyformer[hf]'``; PyTorch is not needed);
- ``tokenizer.json``, when a tokenizer is given: its ``to_hf_json()``, the file
  Hugging Face's ``tokenizers`` reads; and ``tokenizer_config.json``, which tells
  ``transformers.AutoTokenizer`` to build a ``PreTrainedTokenizerFast`` on it with the
  tokenizer's pad, bos, eos and unk tokens.

Which of the two layouts a model takes follows from its configuration
(:func:`~tinyformer.models.hf.hf_layout`); a model neither can express is refused
by name before anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from tinyformer._validation import describe, one_of
from tinyformer.lora import lora_layers
from tinyformer.models.config import DTYPES
from tinyformer.models.decoder_only import DecoderOnlyLM
from tinyformer.models.hf import config_from_hf, config_to_hf, from_hf_state_dict, to_hf_state_dict

__all__ = ["from_pretrained", "save_pretrained"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_OTHER_FORMATS = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
)


def _safetensors() -> ModuleType:
    """``safetensors.numpy``, imported when first needed (an optional dependency)."""
    try:
        import safetensors.numpy  # noqa: PLC0415 - optional: only these two functions need it
    except ImportError as error:
        raise ImportError(
            "Hugging Face checkpoints need the safetensors package: pip install 'tinyformer[hf]'"
        ) from error
    return safetensors.numpy


def _folder(folder: object) -> Path:
    if not isinstance(folder, str | os.PathLike):
        raise TypeError(f"folder must be a str or path-like, got {describe(folder)}")
    return Path(folder)


def _model_tensors(model: DecoderOnlyLM) -> dict[str, np.ndarray]:
    """The model's parameters by name; a merged LoRA layer gives its merged base weight."""
    state = model.state_dict()
    layers = lora_layers(model)
    unmerged = [name for name, layer in layers.items() if not layer.merged]
    if unmerged:
        raise ValueError(
            f"model has LoRA layers that are not merged: {unmerged}; a Hugging Face checkpoint"
            " has no place for adapters: merge_lora(model) or remove_lora(model) first"
        )
    for name in layers:  # merged: the base weight holds W + (alpha / r) A B
        for key in [key for key in state if key.startswith(f"{name}.")]:
            value = state.pop(key)
            if key.startswith(f"{name}.base."):
                state[f"{name}.{key.removeprefix(f'{name}.base.')}"] = value
    wrong = {k: str(v.dtype) for k, v in state.items() if v.dtype != model.dtype}
    if wrong:
        raise ValueError(
            f"every parameter must be {model.dtype} (the model's dtype; a checkpoint holds"
            f" float32 or float64), got {dict(list(wrong.items())[:3])}"
        )
    return state


def save_pretrained(
    model: DecoderOnlyLM, folder: str | os.PathLike[str], tokenizer: Any = None
) -> Path:
    """Write ``model`` (and ``tokenizer``) as a Hugging Face checkpoint folder.

    ``transformers.AutoModelForCausalLM.from_pretrained(folder)`` then builds a
    ``GPT2LMHeadModel`` or a ``LlamaForCausalLM`` with the same logits (the reference
    tests compare them: ``tests/unit/models/test_pretrained.py``). Everything is
    checked and converted first and the files are written into a temporary folder
    beside ``folder``, then moved into place: a refused or failed save leaves
    no half-written folder. Files of an existing ``folder`` that this call does not
    write are kept, as ``transformers`` keeps them.

    Parameters
    ----------
    model : DecoderOnlyLM
        A model whose configuration has a Hugging Face layout
        (:func:`~tinyformer.models.hf.hf_layout`); LoRA layers must be merged.
    folder : str or path-like
        The folder to write (created, with its parents, if needed).
    tokenizer : optional
        Any object with ``to_hf_json()``, the ``tokenizer.json`` content as a dict
        (tinyformer's tokenizers); at most ``vocab_size`` tokens.

    Returns
    -------
    pathlib.Path
        The folder.

    Raises
    ------
    ValueError
        If the model has no Hugging Face layout (every option in the way named),
        holds unmerged LoRA layers, the tokenizer has more tokens than the model,
        or ``folder`` holds the weights of a checkpoint in another format.
    """
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a DecoderOnlyLM, got {describe(model)}")
    folder = _folder(folder)
    special_ids = None
    if tokenizer is not None:  # the ids the tokenizer gives each role, None where it has none
        special_ids = {
            role: getattr(tokenizer, f"{role}_id", None) for role in ("pad", "bos", "eos")
        }
    hf_config = config_to_hf(
        model.config, special_ids=special_ids
    )  # refuses what neither layout expresses
    tensors = to_hf_state_dict(_model_tensors(model), model.config)
    files = {CONFIG_FILE: json.dumps(hf_config, indent=2, sort_keys=True) + "\n"}
    if tokenizer is not None:
        files[TOKENIZER_FILE] = _tokenizer_json(tokenizer, model.config.vocab_size)
        files[TOKENIZER_CONFIG_FILE] = _tokenizer_config(tokenizer, model.context_length)
    if folder.exists():
        if not folder.is_dir():
            raise ValueError(f"folder must be a directory, got the file {folder}")
        stale = [name for name in (INDEX_FILE, *_OTHER_FORMATS) if (folder / name).exists()]
        if stale:
            raise ValueError(
                f"folder {folder} holds another checkpoint's weights ({stale}), which"
                " transformers might read instead: choose another folder"
            )
    save_file = _safetensors().save_file
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".partial")
    )
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        # the metadata transformers writes (and some of its versions check when loading):
        # the tensors are laid out as PyTorch's would be, so the format is "pt"
        save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        if not folder.exists():
            staging.rename(folder)
            return folder
        for path in staging.iterdir():
            path.replace(folder / path.name)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def _tokenizer_json(tokenizer: Any, vocab_size: int) -> str:
    if not callable(getattr(tokenizer, "to_hf_json", None)):
        raise TypeError(
            f"tokenizer must have a to_hf_json() method (tinyformer's tokenizers do), got"
            f" {describe(tokenizer)}"
        )
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int) and size > vocab_size:
        raise ValueError(
            f"tokenizer has {size} tokens but the model's vocab_size is {vocab_size}: its ids"
            " would fall outside the embedding table"
        )
    content = tokenizer.to_hf_json()
    if not isinstance(content, Mapping):
        raise TypeError(f"tokenizer.to_hf_json() must return a dict, got {describe(content)}")
    return json.dumps(content, ensure_ascii=False, indent=2) + "\n"


def _tokenizer_config(tokenizer: Any, context_length: int) -> str:
    """``tokenizer_config.json``: which class ``transformers.AutoTokenizer`` builds and the roles.

    Without it ``AutoTokenizer`` falls back on the model type's own tokenizer class and
    its default special tokens (GPT-2's ``<|endoftext|>``), not the ones ``tokenizer``
    gives each role.
    """
    roles = ("pad", "bos", "eos", "unk")
    tokens = getattr(tokenizer, "tokens", ())
    ids = {role: getattr(tokenizer, f"{role}_id", None) for role in roles}
    names = {role: tokens[i] for role, i in ids.items() if i is not None and i < len(tokens)}
    content: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_length,
    }
    content.update({f"{role}_token": name for role, name in names.items() if name is not None})
    return json.dumps(content, ensure_ascii=False, indent=2, sort_keys=True) + "\n"


# ------------------------------------------------------------------ reading


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: each tensor's dtype, shape and byte range.

    The format is an 8-byte little-endian header length, the header, then the data.
    """
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    header["__data_start__"] = 8 + length
    return header


def _bfloat16(path: Path, entry: Mapping[str, Any], start: int) -> np.ndarray:
    """A bfloat16 tensor widened to float32, exactly (NumPy has no bfloat16).

    bfloat16 is the upper half of a float32: its 16 bits, shifted left by 16,
    are the float32 of the same value.
    """
    begin, end = entry["data_offsets"]
    raw = np.fromfile(path, dtype="<u2", count=(end - begin) // 2, offset=start + begin)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _read_weights(path: Path) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file; bfloat16 and float16 ones widened to float32."""
    header = _header(path)
    start = header.pop("__data_start__")
    narrow = {name for name, entry in header.items() if entry["dtype"] == "BF16"}
    if narrow:  # safetensors' NumPy API cannot make bfloat16 arrays: those are read here
        _safetensors()  # the install hint, if the package is missing
        from safetensors import safe_open  # noqa: PLC0415 - optional dependency

        with safe_open(str(path), framework="numpy") as f:
            tensors = {name: f.get_tensor(name) for name in header if name not in narrow}
        tensors.update({name: _bfloat16(path, header[name], start) for name in narrow})
    else:
        tensors = _safetensors().load_file(str(path))
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in tensors.items()}


def _shard_files(folder: Path) -> list[Path]:
    """The weight files of ``folder``: ``model.safetensors``, or the shards its index lists."""
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    if (folder / INDEX_FILE).is_file():
        weight_map = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8")).get(
            "weight_map"
        )
        if not isinstance(weight_map, Mapping) or not weight_map:
            raise ValueError(f"{folder / INDEX_FILE} has no weight_map of tensor names to files")
        names = sorted(set(weight_map.values()))
        outside = [n for n in names if not isinstance(n, str) or Path(n).name != n]
        if outside:
            raise ValueError(f"{folder / INDEX_FILE} names shards outside the folder: {outside}")
        return [folder / name for name in names]
    other = [name for name in _OTHER_FORMATS if (folder / name).exists()]
    if other:
        raise ValueError(
            f"folder {folder} holds {other}: only safetensors weights are read (PyTorch's"
            " pickle files can run code when loaded); in transformers,"
            " model.save_pretrained(folder) writes model.safetensors"
        )
    raise FileNotFoundError(f"folder {folder} has no {WEIGHTS_FILE} (nor {INDEX_FILE})")


def _file_dtype(tensors: Mapping[str, np.ndarray]) -> str:
    """float64 if every tensor is, float32 if none is; a mixture is refused."""
    dtypes = {v.dtype for v in tensors.values()}
    if dtypes == {np.dtype(np.float64)}:
        return "float64"
    if np.dtype(np.float64) not in dtypes:
        return "float32"
    raise ValueError(
        f"the checkpoint mixes tensor dtypes {sorted(map(str, dtypes))}: pass dtype="
        " 'float32' or 'float64'"
    )


def from_pretrained(
    folder: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    rotary_layout: str | None = None,
    dropout: float | None = None,
) -> DecoderOnlyLM:
    """Read a decoder-only model from a Hugging Face checkpoint folder (GPT-2 or Llama layout).

    The folder is one that ``transformers``' ``save_pretrained`` wrote for a
    ``GPT2LMHeadModel`` or a ``LlamaForCausalLM`` (or that :func:`save_pretrained`
    wrote): ``config.json`` and ``model.safetensors``, or the shards that
    ``model.safetensors.index.json`` lists. ``pytorch_model.bin`` files are refused:
    unpickling them can run arbitrary code. The configuration is built from
    ``config.json`` (:func:`~tinyformer.models.hf.config_from_hf`), the tensors
    converted by :func:`~tinyformer.models.hf.from_hf_state_dict`, and the model
    comes back in evaluation mode.

    Parameters
    ----------
    folder : str or path-like
        The checkpoint folder.
    dtype : str, optional
        ``"float32"`` or ``"float64"``. By default the file's: float64 if every
        tensor is float64, else float32. bfloat16 and float16 tensors (how most
        released checkpoints are stored) are widened to float32, exactly: NumPy
        computes in neither.
    rotary_layout : str, optional
        Llama only: the model's rotary layout, ``"adjacent"`` or ``"halves"``; by
        default the layout :func:`save_pretrained` recorded, else ``"adjacent"``.
    dropout : float, optional
        GPT-2 only: the dropout probability, needed when the file's three differ
        (:func:`~tinyformer.models.hf.config_from_hf_gpt2`).

    Raises
    ------
    FileNotFoundError
        If ``folder``, its ``config.json`` or its weights are missing.
    ValueError
        If the configuration has no tinyformer counterpart (named), the weights are
        not safetensors, or the tensors do not match the configuration.
    ImportError
        If the ``safetensors`` package is not installed.
    """
    folder = _folder(folder)
    if dtype is not None:
        try:
            name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
        except TypeError:
            raise TypeError(
                f"dtype must be one of {DTYPES} or None, got {describe(dtype)}"
            ) from None
        dtype = one_of(name, DTYPES, "dtype")
    if not folder.is_dir():
        raise FileNotFoundError(f"folder {folder} is not a directory")
    if not (folder / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"folder {folder} has no {CONFIG_FILE}")
    try:
        hf_config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{folder / CONFIG_FILE} is not valid JSON: {error}") from error
    tensors: dict[str, np.ndarray] = {}
    for path in _shard_files(folder):
        tensors.update(_read_weights(path))
    config = config_from_hf(
        hf_config,
        dtype=dtype or _file_dtype(tensors),
        rotary_layout=rotary_layout,
        dropout=dropout,
    )
    model = DecoderOnlyLM(config, rng=np.random.default_rng(0))  # weights replaced below
    model.load_state_dict(from_hf_state_dict(tensors, config))
    return model.eval()
