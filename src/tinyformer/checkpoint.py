"""Checkpoints: everything needed to stop a training run and resume it bit for bit.

A checkpoint is one ``.npz`` file (NumPy's zip of arrays, read back with
``allow_pickle=False``) holding

- the model's parameters (``model/<name>``) and its configuration
  (``config.to_dict()``, when the model has a ``config``);
- the optimizer's state: buffers as arrays (``optimizer/<key>``), and its
  step count, hyperparameters and constant learning rate in the metadata;
- the training step, the :class:`~tinyformer.training.history.History` so far, any
  extra arrays and values of the caller (``extra/<name>``);
- the bit-generator state of every :class:`numpy.random.Generator` involved:
  those the caller names (e.g. the one that shuffles the data) and those the
  model holds for dropout, found by :func:`model_generators`;

plus a JSON metadata entry with a format name and version and the SHA-256 of
the array payload. A model with low-rank adapters (:mod:`tinyformer.lora`) is
saved whole, base weights and adapters, and its metadata records each
adapter's rank, alpha and merged state: it loads back into a model adapted the
same way, and is refused, with a message saying what to do, by a model without
adapters (:func:`~tinyformer.models.loading.load_model` builds those). The file is written to a temporary file beside the target
and moved into place with ``os.replace``, so a crash leaves either the old
file or the new one, never half of one.

Loading checks everything first (that the file is a readable zip, the format
and version, the checksum, that the configuration, parameter names, shapes and
dtypes match the model, the optimizer state, the generator states) and only
then assigns anything: a bad checkpoint raises :class:`ValueError` naming the
file and the problem, and leaves the model, optimizer and generators as they were.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tinyformer._validation import describe, non_negative_int
from tinyformer.data.tokenizers import Tokenizer, tokenizer_from_dict
from tinyformer.lora import lora_layers
from tinyformer.module import Module
from tinyformer.optim import Optimizer

__all__ = [
    "FORMAT",
    "VERSION",
    "Checkpoint",
    "load_checkpoint",
    "model_generators",
    "read_checkpoint",
    "save_checkpoint",
    "write_atomically",
]

FORMAT = "tinyformer-checkpoint"
VERSION = 2
"""The format version written. Version 1 files (models with fused attention projections,
``w_qkv``, and flat attribute names) are read too, and upgraded as they are read."""
_METADATA = "__metadata__"
_GROUPS = ("model", "optimizer", "extra")


def model_generators(model: Module) -> list[np.random.Generator]:
    """The distinct random generators the model's layers hold as ``.rng`` (dropout), in module order.

    Several layers usually share one generator; each appears once (compared by
    identity), at its first use in :meth:`~tinyformer.module.Module.modules`.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    found: list[np.random.Generator] = []
    seen: set[int] = set()
    for module in model.modules():
        rng = getattr(module, "rng", None)
        if isinstance(rng, np.random.Generator) and id(rng) not in seen:
            seen.add(id(rng))
            found.append(rng)
    return found


def _all_generators(
    model: Module, generators: Mapping[str, np.random.Generator] | None
) -> dict[str, np.random.Generator]:
    """The caller's named generators and the model's, as ``model.<i>``."""
    named = dict(generators or {})
    for name, gen in named.items():
        if not isinstance(name, str) or name.startswith("model."):
            raise ValueError(
                f"generator names must be strings not starting 'model.', got {name!r}"
            )
        if not isinstance(gen, np.random.Generator):
            raise TypeError(f"generators[{name!r}] must be a numpy Generator, got {describe(gen)}")
    named.update({f"model.{i}": g for i, g in enumerate(model_generators(model))})
    return named


# ------------------------------------------------------------------ JSON helpers
def _to_json(value: Any) -> Any:
    """Bit-generator states and optimizer settings as JSON values (arrays tagged with their dtype)."""
    if isinstance(value, np.ndarray):
        return {"__array__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_json(value: Any) -> Any:
    """Undo :func:`_to_json`."""
    if isinstance(value, dict):
        if set(value) == {"__array__", "dtype"}:
            return np.array(value["__array__"], dtype=np.dtype(value["dtype"]))
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over every array's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _config_dict(model: Module) -> dict[str, Any] | None:
    """``model.config.to_dict()`` normalized through JSON, or None for a model without config."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    return json.loads(json.dumps(config.to_dict()))


def _lora_settings(model: Module) -> dict[str, dict[str, Any]]:
    """Each LoRA layer's rank, alpha and merged state by its name; empty without adapters."""
    return {
        name: {"rank": layer.rank, "alpha": layer.alpha, "merged": layer.merged}
        for name, layer in lora_layers(model).items()
    }


def _lora_mismatch(saved: dict[str, Any], model: dict[str, Any]) -> str:
    """What to tell a user whose model and checkpoint differ in their adapters."""
    if not model:
        first = next(iter(saved))
        return (
            f"it holds a model with LoRA adapters ({len(saved)} layers, e.g. {first!r} with"
            f" {saved[first]}) and the model has none (load_model builds models without"
            " adapters). Adapt the model with apply_lora, with the same targets, rank and"
            " alpha, and load it with load_checkpoint; or, from the adapted model, save the"
            " adapters alone with lora_state_dict, or merge them in with remove_lora and"
            " save an ordinary checkpoint"
        )
    if not saved:
        return (
            f"the model has LoRA adapters ({len(model)} layers) and the checkpoint has none:"
            " load it before apply_lora (adapters saved alone load with load_lora_state_dict)"
        )
    differ = sorted(k for k in saved.keys() | model.keys() if saved.get(k) != model.get(k))
    details = "; ".join(f"{k}: saved {saved.get(k)}, model {model.get(k)}" for k in differ[:3])
    more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
    return f"its LoRA adapters do not match the model's ({details}{more})"


def _current_names(saved: dict[str, Any] | None, model: Module) -> dict[str, Any] | None:
    """The saved config with renamed fields under today's names (``max_len`` -> ``context_length``).

    Goes through the model's config class (``from_dict`` reads old names), so this module
    needs to know no field name; a saved config that class refuses is returned unchanged,
    for the comparison to name what differs.
    """
    config = getattr(model, "config", None)
    if saved is None or config is None or not hasattr(type(config), "from_dict"):
        return saved
    try:
        return json.loads(json.dumps(type(config).from_dict(saved).to_dict()))
    except (TypeError, ValueError):
        return saved


# ------------------------------------------------------------------------- save
def save_checkpoint(
    path: str | os.PathLike[str],
    model: Module,
    optimizer: Optimizer | None = None,
    *,
    step: int = 0,
    history: Any = None,
    generators: Mapping[str, np.random.Generator] | None = None,
    extra: Mapping[str, Any] | None = None,
    extra_arrays: Mapping[str, np.ndarray] | None = None,
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write a checkpoint to ``path`` atomically.

    Parameters
    ----------
    path : str or path-like
        The file to write (conventionally ``*.npz``; no suffix is added). Its
        folder must exist. An existing file is replaced only once the new one
        is complete.
    model : Module
    optimizer : Optimizer, optional
    step : int
        The training step reached.
    history : History, optional
        Anything with ``to_dict()`` returning JSON-able data.
    generators : dict of str to numpy.random.Generator, optional
        Named generators whose states to save besides the model's own.
    extra : dict, optional
        JSON-able values of the caller (e.g. a data stream's position).
    extra_arrays : dict of str to numpy.ndarray, optional
        Arrays of the caller (numeric, not object arrays).
    tokenizer : Tokenizer, optional
        The tokenizer the model reads, stored with it (:attr:`Checkpoint.tokenizer`
        gives it back).

    Returns
    -------
    pathlib.Path
        The path written.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or path-like, got {describe(path)}")
    path = Path(path)
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"optimizer must be a tinyformer Optimizer or None, got {describe(optimizer)}"
        )
    step = non_negative_int(step, "step")
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            f"tokenizer must be a tinyformer Tokenizer or None, got {describe(tokenizer)}"
        )
    named = _all_generators(model, generators)

    arrays = {f"model/{name}": value for name, value in model.state_dict().items()}
    optimizer_scalars = None
    if optimizer is not None:
        optimizer_scalars = {}
        for key, value in optimizer.state_dict().items():
            if isinstance(value, np.ndarray):
                arrays[f"optimizer/{key}"] = value
            else:
                optimizer_scalars[key] = _to_json(value)
    for name, given in (extra_arrays or {}).items():
        value = np.asarray(given)
        if value.dtype.kind not in "biuf":
            raise TypeError(f"extra_arrays[{name!r}] must be numeric, got {describe(value)}")
        arrays[f"extra/{name}"] = value

    model_entry: dict[str, Any] = {"class": type(model).__name__, "config": _config_dict(model)}
    lora = _lora_settings(model)
    if lora:  # only then: files without adapters stay as they were
        model_entry["lora"] = lora
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "sha256": _digest(arrays),
        "model": model_entry,
        "optimizer": optimizer_scalars,
        "step": step,
        "history": None if history is None else history.to_dict(),
        "generators": {name: _to_json(g.bit_generator.state) for name, g in named.items()},
        "extra": _to_json(dict(extra or {})),
        "tokenizer": None if tokenizer is None else tokenizer.to_dict(),
    }
    blob = np.frombuffer(json.dumps(metadata).encode("utf-8"), dtype=np.uint8)
    write_atomically(path, lambda file: np.savez(file, **{_METADATA: blob}, **arrays))
    return path


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then move it into place.

    A crash or an exception leaves either the old file or the new one, never half of one.
    """
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        Path(temp).replace(path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------- load
@dataclass
class Checkpoint:
    """A checkpoint read from disk and checked as a file, not yet applied to anything.

    Made by :func:`read_checkpoint`. :meth:`check` says whether it fits a
    model and optimizer; :meth:`restore` checks, then assigns.

    Attributes
    ----------
    path : pathlib.Path
    metadata : dict
        The decoded JSON metadata.
    arrays : dict of str to numpy.ndarray
        Every array, keyed ``model/...``, ``optimizer/...``, ``extra/...``.
    """

    path: Path
    metadata: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(repr=False)
    _pieces: list[list[tuple[str, slice]]] | None = field(default=None, repr=False)
    """For a version 1 file: what each old parameter (by its index) became."""

    @property
    def step(self) -> int:
        """The training step saved."""
        return int(self.metadata["step"])

    @property
    def config(self) -> dict[str, Any] | None:
        """The model configuration saved (``config.to_dict()``), or None."""
        return self.metadata["model"]["config"]

    @property
    def history(self) -> dict[str, Any] | None:
        """The saved history as a plain dict (rebuild it with ``History.from_dict``)."""
        return self.metadata["history"]

    @property
    def extra(self) -> dict[str, Any]:
        """The caller's extra values."""
        return _from_json(self.metadata["extra"])

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer saved with the model, rebuilt, or None."""
        saved = self.metadata.get("tokenizer")
        return None if saved is None else tokenizer_from_dict(saved)

    def group(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays of one group (``"model"``, ``"optimizer"`` or ``"extra"``), without the prefix."""
        start = f"{prefix}/"
        return {k[len(start) :]: v for k, v in self.arrays.items() if k.startswith(start)}

    def _fail(self, problem: str) -> ValueError:
        return ValueError(f"checkpoint {self.path}: {problem}")

    # ------------------------------------------------------------------ check
    def check(
        self,
        model: Module,
        optimizer: Optimizer | None = None,
        *,
        generators: Mapping[str, np.random.Generator] | None = None,
    ) -> None:
        """Raise ValueError unless this checkpoint can be loaded into these objects; change nothing."""
        if not isinstance(model, Module):
            raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
        self._check_model(model)
        if optimizer is not None:
            self._optimizer_trial(model, optimizer)
        self._generator_states(model, generators)

    def _check_model(self, model: Module) -> None:
        saved_class = self.metadata["model"]["class"]
        if saved_class != type(model).__name__:
            raise self._fail(f"it holds a {saved_class}, not a {type(model).__name__}")
        expected, saved_config = _config_dict(model), _current_names(self.config, model)
        if expected != saved_config:
            if expected is None or saved_config is None:
                raise self._fail("one of the model and the checkpoint has a config, the other not")
            differ = sorted(
                k
                for k in expected.keys() | saved_config.keys()
                if expected.get(k) != saved_config.get(k)
            )
            details = ", ".join(
                f"{k}: saved {saved_config.get(k)!r}, model {expected.get(k)!r}" for k in differ
            )
            raise self._fail(f"its config does not match the model's ({details})")
        saved_lora, model_lora = self.metadata["model"].get("lora", {}), _lora_settings(model)
        if saved_lora != model_lora:
            raise self._fail(_lora_mismatch(saved_lora, model_lora))
        saved = self.group("model")
        params = dict(model.named_parameters())
        missing, extra = sorted(params.keys() - saved.keys()), sorted(saved.keys() - params.keys())
        if missing or extra:
            raise self._fail(
                f"parameters do not match the model: missing {missing}, extra {extra}"
            )
        for name, p in params.items():
            value = saved[name]
            if value.shape != p.shape or value.dtype != p.dtype:
                raise self._fail(
                    f"parameter {name!r} must have shape {p.shape} and dtype {p.dtype},"
                    f" got {describe(value)}"
                )
            if not np.isfinite(value).all():
                raise self._fail(f"parameter {name!r} contains NaN or infinite values")

    def _optimizer_state(self, model: Module, optimizer: Optimizer) -> dict[str, Any]:
        scalars = self.metadata["optimizer"]
        if scalars is None:
            raise self._fail("it holds no optimizer state, but an optimizer was given")
        state = {k: _from_json(v) for k, v in scalars.items()}
        if isinstance(state.get("betas"), list):
            state["betas"] = tuple(state["betas"])
        buffers = self.group("optimizer")
        if self._pieces is not None:
            buffers = self._upgraded_buffers(buffers, model, optimizer)
        state.update(buffers)
        return state

    def _upgraded_buffers(
        self, buffers: dict[str, np.ndarray], model: Module, optimizer: Optimizer
    ) -> dict[str, np.ndarray]:
        """A version 1 file's optimizer buffers, split and renumbered like the model's parameters."""
        pieces = self._pieces or []
        by_name: dict[str, dict[str, np.ndarray]] = {}
        for key, value in buffers.items():
            buffer, index = key.rsplit(".", 1)
            if not index.isdigit() or int(index) >= len(pieces):
                raise self._fail(f"optimizer entry {key!r} names no saved parameter")
            for new_name, columns in pieces[int(index)]:
                by_name.setdefault(new_name, {})[buffer] = value[..., columns]
        names = {id(p): name for name, p in model.named_parameters()}
        upgraded = {}
        for i, parameter in enumerate(optimizer.parameters):
            name = names.get(id(parameter))
            if name is None or name not in by_name:
                raise self._fail(
                    "the optimizer's parameters are not the model's, so the state of this"
                    " version 1 file cannot be matched to them"
                )
            upgraded.update({f"{buffer}.{i}": a for buffer, a in by_name[name].items()})
        return upgraded

    def _optimizer_trial(self, model: Module, optimizer: Optimizer) -> Optimizer:
        """Load the optimizer state into a copy of ``optimizer`` (sharing only its parameters)."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a tinyformer Optimizer, got {describe(optimizer)}")
        trial = copy.copy(optimizer)
        trial.buffers = {k: [b.copy() for b in v] for k, v in optimizer.buffers.items()}
        try:
            trial.load_state_dict(self._optimizer_state(model, optimizer))
        except (TypeError, ValueError) as err:
            raise self._fail(f"the optimizer state does not fit: {err}") from err
        return trial

    def _generator_states(
        self, model: Module, generators: Mapping[str, np.random.Generator] | None
    ) -> dict[str, tuple[np.random.Generator, dict[str, Any]]]:
        """Pair each generator with its saved state, each state tried on a scratch bit generator."""
        named = _all_generators(model, generators)
        saved = self.metadata["generators"]
        wanted_model = sorted(k for k in named if k.startswith("model."))
        saved_model = sorted(k for k in saved if k.startswith("model."))
        if wanted_model != saved_model:
            raise self._fail(
                f"it has {len(saved_model)} model generators, the model has {len(wanted_model)}"
            )
        missing = sorted(named.keys() - saved.keys())
        if missing:
            raise self._fail(f"it has no state for the generators {missing}")
        pairs = {}
        for name, gen in named.items():
            state = _from_json(saved[name])
            kind = type(gen.bit_generator)
            if not isinstance(state, dict) or state.get("bit_generator") != kind.__name__:
                raise self._fail(
                    f"generator {name!r} was saved from another bit generator than {kind.__name__}"
                )
            try:
                kind().state = state
            except (TypeError, ValueError, KeyError) as err:
                raise self._fail(f"the state of generator {name!r} is invalid: {err}") from err
            pairs[name] = (gen, state)
        return pairs

    # ---------------------------------------------------------------- restore
    def restore(
        self,
        model: Module,
        optimizer: Optimizer | None = None,
        *,
        generators: Mapping[str, np.random.Generator] | None = None,
    ) -> None:
        """Load weights, optimizer state and generator states, after checking all of them."""
        if not isinstance(model, Module):
            raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
        self._check_model(model)
        trial = None if optimizer is None else self._optimizer_trial(model, optimizer)
        states = self._generator_states(model, generators)
        # everything is checked: now assign
        model.load_state_dict(self.group("model"))
        if optimizer is not None and trial is not None:
            optimizer.load_state_dict(trial.state_dict())
        for gen, state in states.values():
            gen.bit_generator.state = state


# ------------------------------------------------------------ reading version 1
# Version 1 files hold models whose attention stored W_Q, W_K, W_V side by side as one
# (d, 3d) matrix ``w_qkv`` (and ``b_qkv``, ``w_out``, ``b_out``), and whose layers hung off
# the model itself (``layers.0...``, ``encoder_layers.0...``, ``source_embedding``).
_V1_PREFIXES = {
    "DecoderOnlyLM": {"embedding": "decoder.embedding", "positions": "decoder.positions",
                      "layers": "decoder.layers", "final_norm": "decoder.final_norm"},
    "EncoderOnlyMLM": {"embedding": "encoder.embedding", "positions": "encoder.positions",
                       "layers": "encoder.layers", "final_norm": "encoder.final_norm"},
    "EncoderDecoder": {"source_embedding": "encoder.embedding",
                       "target_embedding": "decoder.embedding",
                       "source_positions": "encoder.positions",
                       "target_positions": "decoder.positions",
                       "encoder_layers": "encoder.layers", "decoder_layers": "decoder.layers",
                       "encoder_norm": "encoder.final_norm", "decoder_norm": "decoder.final_norm"},
}  # fmt: skip
_V1_ATTENTION = {"w_qkv": "weight", "b_qkv": "bias"}
_V1_OUTPUT = {"w_out": "out_proj.weight", "b_out": "out_proj.bias"}


def _v1_pieces(name: str, value: np.ndarray, model_class: str) -> list[tuple[str, slice]]:
    """The parameters that one version 1 parameter became, each with its columns."""
    head, _, rest = name.partition(".")
    prefix = _V1_PREFIXES.get(model_class, {}).get(head)
    name = name if prefix is None else f"{prefix}.{rest}" if rest else prefix
    owner, _, leaf = name.rpartition(".")
    if leaf in _V1_OUTPUT:
        return [(f"{owner}.{_V1_OUTPUT[leaf]}", slice(None))]
    if leaf in _V1_ATTENTION:
        d = value.shape[-1] // 3
        return [
            (f"{owner}.{part}_proj.{_V1_ATTENTION[leaf]}", slice(i * d, (i + 1) * d))
            for i, part in enumerate("qkv")
        ]
    return [(name, slice(None))]


def _upgrade_version_1(
    arrays: dict[str, np.ndarray], model_class: str
) -> tuple[dict[str, np.ndarray], list[list[tuple[str, slice]]]]:
    """A version 1 file's arrays under today's parameter names, and what each old one became."""
    upgraded, pieces = {}, []
    for key, value in arrays.items():
        group, _, name = key.partition("/")
        if group != "model":
            upgraded[key] = value
            continue
        parts = _v1_pieces(name, value, model_class)
        pieces.append(parts)
        for new_name, columns in parts:
            upgraded[f"model/{new_name}"] = np.ascontiguousarray(value[..., columns])
    return upgraded, pieces


def _decode_metadata(path: Path, raw: np.ndarray) -> dict[str, Any]:
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"checkpoint {path}: the metadata entry is not a byte string")
    try:
        metadata = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"checkpoint {path}: the metadata is not valid JSON ({err})") from err
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tinyformer checkpoint (format is not {FORMAT!r})")
    if metadata.get("version") not in (1, VERSION):
        raise ValueError(
            f"checkpoint {path}: format version {metadata.get('version')!r} is not supported"
            f" (this tinyformer reads versions 1 and {VERSION})"
        )
    kinds = {
        "sha256": str,
        "model": dict,
        "optimizer": (dict, type(None)),
        "step": int,
        "history": (dict, type(None)),
        "generators": dict,
        "extra": dict,
    }
    for key, kind in kinds.items():
        if not isinstance(metadata.get(key), kind) or isinstance(metadata.get(key), bool):
            raise ValueError(  # noqa: TRY004 (a bad file is a ValueError, whatever is wrong in it)
                f"checkpoint {path}: the metadata entry {key!r} is missing or malformed"
            )
    tokenizer = metadata.get("tokenizer")  # absent from files written before it was kept
    if not isinstance(tokenizer, dict | None):
        raise ValueError(  # noqa: TRY004 (a bad file is a ValueError)
            f"checkpoint {path}: the metadata entry 'tokenizer' is malformed"
        )
    if not {"class", "config"} <= metadata["model"].keys():
        raise ValueError(
            f"checkpoint {path}: the metadata entry 'model' lacks 'class' or 'config'"
        )
    lora = metadata["model"].get("lora", {})  # present only for models with adapters
    if not isinstance(lora, dict) or not all(
        isinstance(v, dict) and v.keys() == {"rank", "alpha", "merged"} for v in lora.values()
    ):
        raise ValueError(f"checkpoint {path}: the metadata entry 'model.lora' is malformed")
    return metadata


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and check a checkpoint file (zip, format, version, checksum) without applying it.

    Raises
    ------
    FileNotFoundError
        If there is no file at ``path``.
    ValueError
        If the file is truncated, corrupted, not a checkpoint, of another
        format version, or its arrays do not match their checksum.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or path-like, got {describe(path)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        with path.open("rb") as file:  # our own handle: closed whatever np.load makes of it
            loaded = np.load(file, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise ValueError("it holds a single array, not a zip of arrays")  # noqa: TRY004
            with loaded:
                arrays = {name: loaded[name] for name in loaded.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError) as err:
        raise ValueError(f"{path} is not a readable checkpoint file: {err}") from err
    if _METADATA not in arrays:
        raise ValueError(f"{path} is not a tinyformer checkpoint (no {_METADATA} entry)")
    metadata = _decode_metadata(path, arrays.pop(_METADATA))
    groups = {name.split("/", 1)[0] for name in arrays}
    if not groups <= set(_GROUPS) or any("/" not in name for name in arrays):
        raise ValueError(f"checkpoint {path}: unexpected array names {sorted(arrays)[:5]}")
    if _digest(arrays) != metadata["sha256"]:
        raise ValueError(f"checkpoint {path}: the arrays do not match their SHA-256 (corrupted)")
    if metadata["version"] == 1:
        arrays, pieces = _upgrade_version_1(arrays, metadata["model"]["class"])
        return Checkpoint(path, metadata, arrays, pieces)
    return Checkpoint(path, metadata, arrays)


def load_checkpoint(
    path: str | os.PathLike[str],
    model: Module,
    optimizer: Optimizer | None = None,
    *,
    generators: Mapping[str, np.random.Generator] | None = None,
) -> Checkpoint:
    """Read a checkpoint and load it into ``model`` (and ``optimizer``, and the generators).

    All or nothing: on any problem a :class:`ValueError` naming the file is
    raised before anything is assigned. The returned :class:`Checkpoint`
    gives the step, history and extra values for the caller to use.
    """
    checkpoint = read_checkpoint(path)
    checkpoint.restore(model, optimizer, generators=generators)
    return checkpoint
