r"""Low-rank adapters (LoRA): fine-tune a frozen model through a few small matrices.

LoRA :cite:p:`hu2022lora`
leaves a trained weight :math:`W` (``(d_in, d_out)``) unchanged and learns a
correction of rank :math:`r` beside it:

.. math:: y = x W + b + \frac{\alpha}{r}\, (x A) B, \qquad
          A \in \mathbb{R}^{d_\text{in} \times r},\ B \in \mathbb{R}^{r \times d_\text{out}}.

:math:`B` starts at zero, so the adapted model starts exactly equal to the base
model, and only :math:`r (d_\text{in} + d_\text{out})` numbers per layer are
trained instead of :math:`d_\text{in} d_\text{out}`. After training,
:math:`\frac{\alpha}{r} A B` can be added into :math:`W` (:func:`merge_lora`),
so the adapted model costs nothing extra at inference, and taken out again
(:func:`unmerge_lora`).

Use:

.. code-block:: python

    names = apply_lora(model, rank=4, alpha=8, rng=rng)  # q_proj and v_proj of every attention
    optimizer = AdamW(model.trainable_parameters(), lr=1e-3)  # the adapters, nothing else
    ...  # train as usual
    np.savez(path, **lora_state_dict(model))  # the adapters alone
    remove_lora(model)  # or: merge them in for good, leaving an ordinary model

Freezing. :func:`apply_lora` freezes every other parameter of the model
(``requires_grad = False``, :class:`~tinyformer.module.Parameter`), so
:meth:`~tinyformer.module.Module.trainable_parameters` gives the adapters
alone. No gradient is computed for a frozen parameter: every layer skips it
(still passing the gradient on to its input), and the optimizers refuse them, so
none keeps moment estimates for the base model. Each frozen parameter still holds
a zero gradient array of its size, which ``zero_grad`` keeps writing.
:func:`remove_lora` merges the adapters into their base weights, puts the
plain :class:`~tinyformer.layers.Linear` layers back and unfreezes what
:func:`apply_lora` froze.

Checkpoints. :func:`~tinyformer.checkpoint.save_checkpoint` saves an adapted
model whole (base weights and adapters, with each adapter's rank, alpha and
merged state), and :func:`~tinyformer.checkpoint.load_checkpoint` loads it
back into a model adapted the same way, optimizer state included, to resume
fine-tuning. :func:`~tinyformer.models.loading.load_model` builds models
without adapters and refuses such a file, saying to use :func:`lora_state_dict`
or :func:`remove_lora`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from tinyformer._validation import (
    describe,
    generator,
    layer_input,
    one_of,
    positive_float,
    probability,
)
from tinyformer.layers import Dropout, Linear
from tinyformer.module import Module, Parameter, no_grad

__all__ = [
    "LoRALinear",
    "apply_lora",
    "load_lora_state_dict",
    "lora_layers",
    "lora_state_dict",
    "merge_lora",
    "remove_lora",
    "unmerge_lora",
]

_FROZEN = "_lora_frozen"
"""The model attribute where apply_lora keeps, by name, the parameters it froze."""

INITS = ("uniform", "gaussian")
"""How :class:`LoRALinear` draws :math:`A`: PEFT's default, or PEFT's Gaussian option."""


def _rank(rank: object, d_in: int, d_out: int) -> int:
    """``rank`` as an int in ``[1, min(d_in, d_out)]``, else a clear error."""
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError(f"rank must be a positive integer, got {describe(rank)}")
    limit = min(d_in, d_out)
    if not 1 <= rank <= limit:
        raise ValueError(
            f"rank must be in [1, min(d_in, d_out)] = [1, {limit}] for a ({d_in}, {d_out})"
            f" layer, got {rank} (A B has rank at most {limit}: a larger r adds parameters,"
            " not expressiveness)"
        )
    return int(rank)


class LoRALinear(Module):
    r"""A frozen :class:`~tinyformer.layers.Linear` plus a trainable low-rank term.

    .. math:: y = x W + b + s\, (\operatorname{drop}(x)\, A)\, B, \qquad s = \alpha / r

    Parameters
    ----------
    base : Linear
        The layer to adapt; kept as ``self.base`` (its parameters keep their
        values and stay in the model's state). Its weight and bias are frozen
        (``requires_grad = False``): :meth:`backward` computes no gradient for
        them unless they are unfrozen again, as it computes none for a frozen
        ``lora_A`` or ``lora_B``.
    rank : int
        :math:`r`, in ``[1, min(d_in, d_out)]``. A larger rank is refused: the
        product :math:`A B` cannot have rank above :math:`\min(d_\text{in},
        d_\text{out})`, so the extra columns would add parameters and no
        expressiveness (and cost more than training :math:`W` itself).
    alpha : float
        :math:`\alpha > 0`; the update is scaled by :math:`\alpha / r`, so that
        changing :math:`r` at a fixed :math:`\alpha` needs no new learning rate.
    rng : numpy.random.Generator
        Draws :math:`A` (and the dropout masks).
    dropout : float
        Probability in ``[0, 1)`` of zeroing an entry of :math:`x` on the
        adapter's path only (in training mode); the base path sees all of :math:`x`.
    init : str
        How :math:`A` is drawn; :math:`B` always starts at zero, so the
        adapted layer starts equal to ``base``. ``"uniform"`` draws
        :math:`A_{ij} \sim \mathcal{U}(-d_\text{in}^{-1/2}, d_\text{in}^{-1/2})`,
        what PEFT's and Microsoft's ``loralib``'s default
        (``kaiming_uniform_`` with :math:`a = \sqrt 5`) gives; ``"gaussian"``
        draws :math:`A_{ij} \sim \mathcal{N}(0, 1/r^2)`, PEFT's
        ``init_lora_weights="gaussian"``. :cite:t:`hu2022lora` say only that A is
        initialized from a random Gaussian.

    Attributes
    ----------
    lora_A : Parameter
        :math:`A`, ``(d_in, r)``.
    lora_B : Parameter
        :math:`B`, ``(r, d_out)``.
    scale : float
        :math:`s = \alpha / r`.
    merged : bool
        Whether :math:`s A B` is currently added into ``base.weight``
        (:meth:`merge`); the forward pass then runs the base layer alone.

    Notes
    -----
    With :math:`G = \partial L / \partial y`, :math:`X` the (dropped-out) input
    rows and :math:`H = s X A`, the gradients are

    .. math:: \frac{\partial L}{\partial B} = H^\top G, \qquad
              \frac{\partial L}{\partial A} = X^\top (s\, G B^\top), \qquad
              \frac{\partial L}{\partial x} = G W^\top + \big(s\, G B^\top A^\top\big)
              \odot m,

    with :math:`m` the dropout multiplier (1 without dropout). :math:`W` and
    :math:`b` get none while frozen. While :math:`B = 0` the gradient of :math:`A` is
    exactly zero; :math:`B`'s is not, and training moves :math:`B` first.
    """

    def __init__(
        self,
        base: Linear,
        rank: int,
        *,
        alpha: float,
        rng: np.random.Generator,
        dropout: float = 0.0,
        init: str = "uniform",
    ) -> None:
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"base must be a tinyformer Linear layer, got {describe(base)}")
        self.base = base
        self.d_in, self.d_out, self.dtype = base.d_in, base.d_out, base.dtype
        self.rank = _rank(rank, self.d_in, self.d_out)
        self.alpha = positive_float(alpha, "alpha")
        self.scale = self.alpha / self.rank
        rng = generator(rng)
        p = probability(dropout, "dropout")
        init = one_of(init, INITS, "init")
        if init == "uniform":
            bound = 1.0 / math.sqrt(self.d_in)
            a = rng.uniform(-bound, bound, (self.d_in, self.rank))
        else:
            a = rng.normal(0.0, 1.0 / self.rank, (self.d_in, self.rank))
        self.lora_A = Parameter(a.astype(self.dtype))  # (d_in, r)
        self.lora_B = Parameter(np.zeros((self.rank, self.d_out), dtype=self.dtype))  # (r, d_out)
        self.dropout = Dropout(p, rng=rng) if p > 0.0 else None
        self.merged = False
        # what remove_lora restores: the base's flags before they were frozen here
        self._base_requires_grad = tuple(q.requires_grad for q in base.parameters())
        base.freeze()  # no gradient is computed for the base weights

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Map ``x`` of shape ``(..., d_in)`` to ``(..., d_out)``."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_in)
        if self.merged:
            with no_grad():  # no backward through a merged layer: keep nothing
                y = self.base.forward(x)  # (..., d_out)
            self._save(None, x.shape)
            return y
        y = self.base.forward(x)  # (..., d_out), a fresh array; keeps x for its backward
        rows = x.reshape(-1, self.d_in)  # (N, d_in)
        keep = None if self.dropout is None else self.dropout.mask(rows.shape, self.dtype)
        if keep is not None:
            rows = rows * keep
        h = rows @ self.lora_A.value  # (N, r)
        h *= self.dtype.type(self.scale)
        y = y.reshape(-1, self.d_out)  # (N, d_out)
        y += h @ self.lora_B.value
        self._save(rows, x.shape, h, keep)
        return y.reshape((*x.shape[:-1], self.d_out))  # (..., d_out)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Add into the gradients of ``lora_A`` and ``lora_B``; return the gradient for ``x``."""
        rows, shape, *rest = self._saved()
        if rows is None:
            raise RuntimeError(
                "LoRALinear.backward after a forward with the adapter merged into the base"
                " weight: call unmerge_lora(model) (or layer.unmerge()) before training"
            )
        h, keep = rest
        grad = self._check_grad(grad_out, (*shape[:-1], self.d_out), self.dtype)
        # G W^T, and the gradients of W and b only if they were unfrozen
        grad_x = self.base.backward(grad).reshape(-1, self.d_in)  # (N, d_in)
        grad = grad.reshape(-1, self.d_out)  # (N, d_out)
        if self.lora_B.requires_grad:
            self.lora_B.grad += h.T @ grad  # (r, d_out)
        grad_h = grad @ self.lora_B.value.T  # (N, r)
        grad_h *= self.dtype.type(self.scale)
        if self.lora_A.requires_grad:
            self.lora_A.grad += rows.T @ grad_h  # (d_in, r)
        grad_rows = grad_h @ self.lora_A.value.T  # (N, d_in)
        if keep is not None:
            grad_rows *= keep
        grad_x += grad_rows
        return grad_x.reshape(shape)  # (..., d_in)

    def delta(self) -> np.ndarray:
        r"""The update :math:`s A B` the adapter makes to the base weight, ``(d_in, d_out)``."""
        return (self.lora_A.value * self.dtype.type(self.scale)) @ self.lora_B.value

    def merge(self) -> None:
        r"""Add :math:`s A B` into ``base.weight``; the forward pass then runs the base alone.

        The merged layer computes the same function to rounding, at the cost of
        the base layer. It is for inference: :meth:`backward` after a merged
        forward raises, and so does loading adapters into a merged layer.
        """
        if self.merged:
            raise RuntimeError("this LoRALinear is already merged: unmerge it first")
        self.base.weight.value += self.delta()
        self.merged = True

    def unmerge(self) -> None:
        r"""Subtract :math:`s A B` from ``base.weight`` again, to rounding.

        The same product is subtracted that :meth:`merge` added (``A`` and
        ``B`` cannot change while merged through this module's methods), so each
        weight entry comes back within one unit in the last place of
        :math:`|W| + |s A B|`.
        """
        if not self.merged:
            raise RuntimeError("this LoRALinear is not merged: there is nothing to unmerge")
        self.base.weight.value -= self.delta()
        self.merged = False

    def __repr__(self) -> str:
        return (
            f"LoRALinear(d_in={self.d_in}, d_out={self.d_out}, rank={self.rank},"
            f" alpha={self.alpha:g}, merged={self.merged})"
        )


# ---------------------------------------------------------------- whole models
def _named_modules(module: Module, prefix: str = "") -> Iterator[tuple[str, Module]]:
    """``(dotted name, module)`` for every sub-module, depth first, named as its parameters are.

    The root has the name ``""``. The frozen ``base`` inside a :class:`LoRALinear`
    is not visited: it belongs to its adapter.
    """
    yield prefix.rstrip("."), module
    if isinstance(module, LoRALinear):
        return
    for name, child in module._children():
        if isinstance(child, Module):
            yield from _named_modules(child, f"{prefix}{name}.")


def _slots(model: Module) -> Iterator[tuple[str, Module, str, int | None, Module]]:
    """Every sub-module with where it hangs: ``(name, parent, attribute, list index, child)``.

    A module in a list is the attribute's entry ``index`` (else ``index`` is
    None). The inside of a :class:`LoRALinear` is not visited.
    """
    for parent_name, parent in _named_modules(model):
        if isinstance(parent, LoRALinear):
            continue
        for attr, child in parent._children():
            if isinstance(child, Module):
                name = f"{parent_name}.{attr}" if parent_name else attr
                field, _, index = attr.partition(".")  # a module in a list is "<list>.<i>"
                yield name, parent, field, int(index) if index else None, child


def _put(parent: Module, attr: str, index: int | None, module: Module) -> None:
    """Hang ``module`` where :func:`_slots` found another."""
    if index is None:
        setattr(parent, attr, module)
    else:
        getattr(parent, attr)[index] = module


def _check_model(model: object) -> Module:
    if not isinstance(model, Module):
        raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
    return model


def lora_layers(model: Module) -> dict[str, LoRALinear]:
    """The model's :class:`LoRALinear` layers by dotted name (``"...q_proj"``), in module order."""
    return {
        name: m for name, m in _named_modules(_check_model(model)) if isinstance(m, LoRALinear)
    }


def _require_layers(model: Module) -> dict[str, LoRALinear]:
    layers = lora_layers(model)
    if not layers:
        raise ValueError("model has no LoRA layers: call apply_lora(model, ...) first")
    return layers


def _check_targets(targets: object) -> tuple[str, ...]:
    if isinstance(targets, str) or not isinstance(targets, Iterable):
        raise TypeError(
            "targets must be a sequence of layer names such as ('q_proj', 'v_proj'),"
            f" got {describe(targets)}"
        )
    names = tuple(targets)
    if not names:
        raise ValueError("targets must name at least one layer, got none")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise TypeError(f"targets[{i}] must be a non-empty str, got {describe(name)}")
    return names


def _matches(name: str, targets: tuple[str, ...]) -> str | None:
    """The target that ``name`` (dotted) matches: its last part or the whole name."""
    last = name.rsplit(".", 1)[-1]
    for target in targets:
        if target in (last, name):
            return target
    return None


def apply_lora(
    model: Module,
    rank: int,
    alpha: float,
    *,
    targets: Iterable[str] = ("q_proj", "v_proj"),
    rng: np.random.Generator,
    dropout: float = 0.0,
    init: str = "uniform",
) -> list[str]:
    """Wrap the model's ``Linear`` layers named in ``targets`` in :class:`LoRALinear`, in place.

    The attention layers' projections are ``q_proj``, ``k_proj``, ``v_proj``
    and ``out_proj``; the feed-forward network's are ``linear_in`` and
    ``linear_out``. The default adapts queries and values, the choice of
    :cite:t:`hu2022lora`. Every parameter of the model that is not an adapter is frozen
    (``requires_grad = False``; those frozen already are left so), so
    ``model.trainable_parameters()`` returns the adapters alone;
    :func:`remove_lora` unfreezes what this call froze. Calling it again for
    other targets adapts more layers and keeps the earlier adapters trainable.

    Parameters
    ----------
    model : Module
        Any tinyformer model; changed in place. Its outputs do not change
        (every :math:`B` starts at zero).
    rank, alpha, dropout, init
        As for :class:`LoRALinear`, the same for every adapted layer.
    targets : sequence of str
        Attribute names (``"q_proj"``: every layer of that name) or full
        dotted names (``"decoder.layers.0.self_attention.layer.q_proj"``).
        Each must match at least one ``Linear``.
    rng : numpy.random.Generator
        Draws every :math:`A`, layer after layer in module order.

    Returns
    -------
    list of str
        The dotted names of the adapted layers, in module order.

    Raises
    ------
    ValueError
        If a target matches no ``Linear`` (the message lists the names there
        are), matches a layer that already has an adapter, or ``rank`` does not
        fit a matched layer; nothing is changed then.
    """
    model = _check_model(model)
    targets = _check_targets(targets)
    generator(rng)  # and the settings every LoRALinear checks, before anything changes
    positive_float(alpha, "alpha")
    probability(dropout, "dropout")
    one_of(init, INITS, "init")
    found: list[tuple[str, Module, str, int | None, Linear]] = []
    used: set[str] = set()
    available: set[str] = set()
    for name, parent, attr, index, child in _slots(model):
        target = _matches(name, targets)
        if isinstance(child, LoRALinear) and target is not None:
            raise ValueError(f"layer {name!r} (target {target!r}) already has a LoRA adapter")
        if not isinstance(child, Linear):
            continue
        available.add(name.rsplit(".", 1)[-1])
        if target is not None:
            used.add(target)
            found.append((name, parent, attr, index, child))
    unused = [t for t in targets if t not in used]
    if unused:
        raise ValueError(
            f"targets {unused} match no Linear layer of the model; its Linear layers are"
            f" named {sorted(available)} (or give a full dotted name)"
        )
    for name, _, _, _, linear in found:  # check every rank before changing anything
        try:
            _rank(rank, linear.d_in, linear.d_out)
        except ValueError as err:
            raise ValueError(f"layer {name!r}: {err}") from None
    adapters = {
        id(p) for layer in lora_layers(model).values() for p in (layer.lora_A, layer.lora_B)
    }
    frozen: dict[str, Parameter] = getattr(model, _FROZEN, {})
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in adapters:
            p.requires_grad = False
            frozen[name] = p
    setattr(model, _FROZEN, frozen)  # what remove_lora unfreezes
    for _, parent, attr, index, linear in found:
        adapted = LoRALinear(linear, rank, alpha=alpha, rng=rng, dropout=dropout, init=init)
        adapted.train(linear.training)  # the model's mode (dropout on or off)
        _put(parent, attr, index, adapted)
    return [name for name, *_ in found]


def remove_lora(model: Module) -> list[str]:
    r"""Merge every adapter into its base weight for good and put the plain ``Linear`` back.

    Afterwards the model has its original structure and parameter names (the
    adapted weights :math:`W + \frac{\alpha}{r} A B` in place of :math:`W`), so
    it saves as an ordinary checkpoint and loads with
    :func:`~tinyformer.models.loading.load_model`; its logits are the adapted
    model's to rounding (the adapters themselves are dropped: save them first
    with :func:`lora_state_dict` to keep them apart). Adapters already merged
    (:func:`merge_lora`) are not added twice. Every parameter that :func:`apply_lora` (or a
    :class:`LoRALinear`) froze is trainable again; parameters frozen before
    stay frozen.

    Returns
    -------
    list of str
        The dotted names of the layers put back, in module order.

    Raises
    ------
    ValueError
        If the model has no LoRA layers, or is itself a :class:`LoRALinear`
        (its ``base`` is the plain layer).
    """
    layers = _require_layers(model)
    if "" in layers:
        raise ValueError("model is itself a LoRALinear: merge() it and use its .base instead")
    for _, parent, attr, index, layer in list(_slots(model)):
        if isinstance(layer, LoRALinear):
            if not layer.merged:
                layer.merge()
            for p, flag in zip(layer.base.parameters(), layer._base_requires_grad, strict=True):
                p.requires_grad = flag
            _put(parent, attr, index, layer.base)
    for p in getattr(model, _FROZEN, {}).values():
        p.requires_grad = True
    if hasattr(model, _FROZEN):
        delattr(model, _FROZEN)
    return list(layers)


def merge_lora(model: Module) -> list[str]:
    r"""Add every adapter's :math:`\frac{\alpha}{r} A B` into its base weight; return the names.

    Afterwards the model computes the same logits to rounding (about
    :math:`10^{-15}` relative in float64) at the base model's cost. Raises,
    changing nothing, if any adapter is already merged.
    """
    layers = _require_layers(model)
    merged = [name for name, layer in layers.items() if layer.merged]
    if merged:
        raise RuntimeError(f"LoRA layers {merged} are already merged: unmerge_lora(model) first")
    for layer in layers.values():
        layer.merge()
    return list(layers)


def unmerge_lora(model: Module) -> list[str]:
    """Take every merged adapter out of its base weight again (to rounding); return the names.

    Raises, changing nothing, if any adapter is not merged.
    """
    layers = _require_layers(model)
    unmerged = [name for name, layer in layers.items() if not layer.merged]
    if unmerged:
        raise RuntimeError(f"LoRA layers {unmerged} are not merged: there is nothing to unmerge")
    for layer in layers.values():
        layer.unmerge()
    return list(layers)


def lora_state_dict(model: Module) -> dict[str, np.ndarray]:
    r"""Copies of the adapters alone: ``"<layer>.lora_A"`` and ``"<layer>.lora_B"`` per layer.

    The names are the model's own parameter names, so the dict can be saved with
    ``np.savez(path, **state)``. It holds neither the base weights nor
    :math:`\alpha`: load it into the same base model adapted with the same
    ``rank`` (checked, by the shapes) and ``alpha`` (not checked).
    """
    state = {}
    for name, layer in _require_layers(model).items():
        state[f"{name}.lora_A"] = layer.lora_A.value.copy()
        state[f"{name}.lora_B"] = layer.lora_B.value.copy()
    return state


def load_lora_state_dict(model: Module, state: Mapping[str, np.ndarray]) -> None:
    """Load adapters saved by :func:`lora_state_dict` (or ``np.load`` of them), all or nothing.

    Every entry is checked first (names, shapes, floating-point and finite
    values) and the model is changed only if all pass. Values are converted to
    each layer's dtype.

    Raises
    ------
    ValueError
        If names are missing or unexpected (both are listed), a shape differs
        (another rank) or a value is not finite.
    TypeError
        If ``state`` is not a mapping or a value is not a floating-point array.
    RuntimeError
        If an adapter is merged (its base weight holds the old :math:`A B`).
    """
    layers = _require_layers(model)
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of names to arrays, got {describe(state)}")
    params = {}
    for name, layer in layers.items():
        params[f"{name}.lora_A"], params[f"{name}.lora_B"] = layer.lora_A, layer.lora_B
    missing = sorted(params.keys() - state.keys())
    unexpected = sorted(state.keys() - params.keys())
    if missing or unexpected:
        raise ValueError(
            f"state does not match the model's adapters: missing {missing}, unexpected"
            f" {unexpected}"
        )
    merged = [name for name, layer in layers.items() if layer.merged]
    if merged:
        raise RuntimeError(f"LoRA layers {merged} are merged: unmerge_lora(model) before loading")
    arrays = {}
    for name, p in params.items():
        value = np.asarray(state[name])
        if value.dtype.kind != "f":
            raise TypeError(
                f"state[{name!r}] must be a floating-point array, got dtype {value.dtype}"
            )
        if value.shape != p.shape:
            raise ValueError(
                f"state[{name!r}] must have shape {p.shape}, got {value.shape}"
                " (adapters of another rank?)"
            )
        if not np.isfinite(value).all():
            raise ValueError(f"state[{name!r}] contains NaN or infinite values")
        arrays[name] = value
    for name, p in params.items():
        p.value[...] = arrays[name]
