"""Parameters and modules: the two building blocks of every layer.

A :class:`Parameter` is an array together with the gradient accumulated for it.
A :class:`Module` computes ``forward``, keeps exactly what its backward pass
needs, and in ``backward(grad_out)`` returns the gradient with respect to its
input while *adding* into the gradients of its parameters. Adding (rather than
overwriting) is what makes weight tying and repeated use of a layer correct.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tinyformer._validation import describe, float_dtype

__all__ = ["Module", "Parameter", "grad_enabled", "no_grad"]


class _GradMode(threading.local):
    enabled = True


_grad_mode = _GradMode()
_NO_BACKWARD = object()  # what ``_save`` keeps under no_grad: backward must refuse


def grad_enabled() -> bool:
    """Whether layers keep what their backward pass needs (False inside :func:`no_grad`)."""
    return _grad_mode.enabled


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Run the ``with`` block without keeping anything for a backward pass.

    Inside it every layer computes the same forward values but skips what only
    ``backward`` would need (the feed-forward network's activation derivative,
    for instance); a ``backward`` after such a forward raises. The models'
    cached decoding step runs this way. Nesting is allowed; the previous mode
    comes back when the block ends, also when it raises.
    """
    previous, _grad_mode.enabled = _grad_mode.enabled, False
    try:
        yield
    finally:
        _grad_mode.enabled = previous


class Parameter:
    """A trainable array and the gradient accumulated for it.

    Parameters
    ----------
    value : numpy.ndarray
        Initial value; float32 or float64. The parameter owns this array.
    requires_grad : bool
        Whether training computes a gradient for it. ``False`` marks a frozen
        parameter (the base weights under a low-rank adapter,
        :mod:`tinyformer.lora`, or :meth:`Module.freeze`): its layer skips
        adding into ``grad``, the optimizers of :mod:`tinyformer.optim`
        refuse it, and the gradient checks of :mod:`tinyformer.gradcheck`
        leave it out. It may be changed at any time.
    """

    __slots__ = ("grad", "requires_grad", "value")

    def __init__(self, value: np.ndarray, *, requires_grad: bool = True) -> None:
        if not isinstance(value, np.ndarray):
            raise TypeError(f"value must be a numpy.ndarray, got {describe(value)}")
        float_dtype(value.dtype, "value.dtype")
        if not isinstance(requires_grad, bool):
            raise TypeError(f"requires_grad must be True or False, got {describe(requires_grad)}")
        self.value = value
        self.grad = np.zeros_like(value)
        self.requires_grad = requires_grad

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the value."""
        return self.value.shape

    @property
    def dtype(self) -> np.dtype:
        """Dtype of the value."""
        return self.value.dtype

    def zero_grad(self) -> None:
        """Set the accumulated gradient to zero."""
        self.grad.fill(0)

    def __repr__(self) -> str:
        frozen = "" if self.requires_grad else ", frozen"
        return f"Parameter(shape={self.shape}, dtype={self.dtype}{frozen})"


class Module:
    """Base class of every layer: forward, backward, parameters and mode.

    Subclasses set their :class:`Parameter` and sub-:class:`Module` attributes in
    ``__init__`` (lists and tuples of modules are found too) and implement
    :meth:`forward` and :meth:`backward`. What ``forward`` saves for ``backward``
    goes through ``_save`` and comes back through ``_saved``, which raises a
    clear error when ``backward`` is called before ``forward``.
    """

    def __init__(self) -> None:
        self.training = True
        self._cache: Any = None

    # ----------------------------------------------------------------- compute
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Compute the output and keep what :meth:`backward` needs."""
        raise NotImplementedError

    def backward(self, grad_out: np.ndarray) -> Any:
        """Return the gradient with respect to the input; add into parameter gradients."""
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Same as :meth:`forward`."""
        return self.forward(*args, **kwargs)

    def _save(self, *values: Any) -> None:
        """Keep ``values`` for :meth:`backward` (nothing is kept inside :func:`no_grad`)."""
        self._cache = values if _grad_mode.enabled else _NO_BACKWARD

    def _saved(self) -> Any:
        if self._cache is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward was called before forward:"
                " run forward first (each forward allows one backward)"
            )
        if self._cache is _NO_BACKWARD:
            self._cache = None
            raise RuntimeError(
                f"{type(self).__name__}.backward after a forward run under no_grad()"
                " (as the cached decoding step runs): run forward outside no_grad to train"
            )
        cache, self._cache = self._cache, None
        return cache

    def _checked_gradient(self, grad_out: object) -> np.ndarray:
        """A model's output gradient, checked against the output shape its forward saved.

        Checked before the saved shape is released, so a wrong gradient raises
        and a right one can still be passed afterwards. Needs ``self.dtype``.
        """
        if isinstance(self._cache, tuple):
            self._check_grad(grad_out, self._cache[0], self.dtype)  # type: ignore[attr-defined]
        (shape,) = self._saved()
        return self._check_grad(grad_out, shape, self.dtype)  # type: ignore[attr-defined]

    @staticmethod
    def _check_grad(grad_out: object, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Check that ``grad_out`` has the forward output's shape and dtype."""
        if not isinstance(grad_out, np.ndarray):
            raise TypeError(f"grad_out must be a numpy.ndarray, got {describe(grad_out)}")
        if grad_out.shape != shape:
            raise ValueError(
                f"grad_out must have the forward output's shape {shape}, got {grad_out.shape}"
            )
        if grad_out.dtype != dtype:
            raise TypeError(
                f"grad_out must have the forward output's dtype {dtype}, got {grad_out.dtype}"
            )
        return grad_out

    # -------------------------------------------------------------- parameters
    def _children(self) -> Iterator[tuple[str, Parameter | Module]]:
        for name, value in vars(self).items():
            if isinstance(value, Parameter | Module):
                yield name, value
            elif isinstance(value, list | tuple):
                for i, item in enumerate(value):
                    if isinstance(item, Parameter | Module):
                        yield f"{name}.{i}", item

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Yield ``(name, parameter)`` pairs; a parameter shared by two layers appears once."""
        seen: set[int] = set()
        yield from self._named_parameters(prefix, seen)

    def _named_parameters(self, prefix: str, seen: set[int]) -> Iterator[tuple[str, Parameter]]:
        for name, child in self._children():
            full = f"{prefix}{name}"
            if isinstance(child, Parameter):
                if id(child) not in seen:
                    seen.add(id(child))
                    yield full, child
            else:
                yield from child._named_parameters(f"{full}.", seen)

    def parameters(self) -> list[Parameter]:
        """All distinct parameters of this module and its sub-modules."""
        return [p for _, p in self.named_parameters()]

    def trainable_parameters(self) -> list[Parameter]:
        """The parameters that are not frozen (``requires_grad`` True), in :meth:`parameters` order.

        What to give an optimizer once part of a model is frozen (:meth:`freeze`,
        :func:`tinyformer.lora.apply_lora`): the optimizers refuse frozen parameters.
        """
        return [p for p in self.parameters() if p.requires_grad]

    def freeze(self) -> Module:
        """Mark every parameter of this module and its sub-modules frozen; return the module.

        Frozen parameters (``requires_grad`` False) get no gradient: their
        layers skip that work in ``backward``, while still returning the
        gradient for their input, so the layers before them keep training. A
        parameter shared with a module outside this one (a tied embedding) is
        frozen for both.
        """
        for p in self.parameters():
            p.requires_grad = False
        return self

    def unfreeze(self) -> Module:
        """Undo :meth:`freeze`: mark every parameter of this module trainable; return the module."""
        for p in self.parameters():
            p.requires_grad = True
        return self

    def num_parameters(self) -> int:
        """Number of scalars in the parameters (shared ones counted once), frozen ones included."""
        return sum(p.value.size for p in self.parameters())

    def zero_grad(self) -> None:
        """Set every parameter gradient to zero."""
        for p in self.parameters():
            p.zero_grad()

    def modules(self) -> Iterator[Module]:
        """Yield this module and every sub-module, depth first."""
        yield self
        for _, child in self._children():
            if isinstance(child, Module):
                yield from child.modules()

    # -------------------------------------------------------------------- mode
    def train(self, mode: bool = True) -> Module:
        """Switch this module and its sub-modules to training (or evaluation) mode."""
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self) -> Module:
        """Switch to evaluation mode (dropout off); same as ``train(False)``."""
        return self.train(False)

    def __repr__(self) -> str:
        """The class, its configuration if it has one, its parameter count and its mode.

        For example ``DecoderOnlyLM(DecoderOnlyConfig(vocab_size=10, ...), 1,234 parameters,
        evaluation mode)``.
        """
        config = getattr(self, "config", None)
        parts = [] if config is None else [repr(config)]
        parts.append(f"{self.num_parameters():,} parameters")
        parts.append("training mode" if self.training else "evaluation mode")
        return f"{type(self).__name__}({', '.join(parts)})"

    # ------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter value, keyed by dotted name."""
        return {name: p.value.copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Load parameter values from ``state``, all or nothing.

        Every entry is checked before any is copied, so a dict with missing,
        extra or wrongly shaped entries raises and leaves the module unchanged.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping of names to arrays, got {describe(state)}")
        params = dict(self.named_parameters())
        missing = sorted(params.keys() - state.keys())
        extra = sorted(state.keys() - params.keys())
        if missing or extra:
            raise ValueError(f"state does not match the module: missing {missing}, extra {extra}")
        arrays = {}
        for name, p in params.items():
            value = np.asarray(state[name])
            if value.shape != p.shape:
                raise ValueError(f"state[{name!r}] must have shape {p.shape}, got {value.shape}")
            if value.dtype.kind != "f":
                raise TypeError(
                    f"state[{name!r}] must be a floating-point array, got dtype {value.dtype}"
                )
            if not np.isfinite(value).all():
                raise ValueError(f"state[{name!r}] contains NaN or infinite values")
            arrays[name] = value
        for name, p in params.items():
            p.value[...] = arrays[name]
