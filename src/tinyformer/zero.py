r"""ZeRO: data parallelism with the model states sharded across the devices, simulated.

Plain data parallelism keeps a whole copy of the model states on each of :math:`N_d`
devices: with mixed-precision Adam, :math:`(2 + 2 + K)\Psi` bytes, :math:`K = 12`
(:mod:`tinyformer.memory_budget`). :cite:t:`rajbhandari2020zero` (Section 5) remove
the copies in three stages, each device keeping only its :math:`1/N_d` share of

- stage 1 (:math:`P_{os}`): the optimizer states (float32 master weights and the two
  moments), :math:`4\Psi + K\Psi/N_d`;
- stage 2 (:math:`P_{os+g}`): also the gradients, :math:`2\Psi + (2 + K)\Psi/N_d`;
- stage 3 (:math:`P_{os+g+p}`): also the 16-bit weights, :math:`(2 + 2 + K)\Psi/N_d`.

:class:`ZeroDataParallel` runs such a step on simulated devices (each a set of arrays),
with the parameters flattened into one vector and cut into :math:`N_d` equal shards
(the last one padded with zeros, so a shard holds :math:`\lceil \Psi / N_d \rceil`
numbers). Each device runs forward and backward on its slice of the batch with its
bfloat16 weights (computed in float32, :func:`~tinyformer.training.mixed_precision.round_to`),
the bfloat16 gradients are averaged (an all-reduce, or under stages 2 and 3 a
reduce-scatter that leaves each device the average of its shard only), each device
updates its shard of the float32 master weights with :class:`~tinyformer.optim.AdamW`,
and the new bfloat16 weights are all-gathered (stages 1 and 2) or kept sharded (stage 3,
which all-gathers them for each forward and backward pass instead). The update is
element-wise, so where it runs changes nothing: every stage gives the same bits here,
because the average is computed once and only sliced. (A real reduce-scatter and all-reduce
sum in other orders, so real ZeRO agrees with plain data parallelism to rounding. And during
the step this simulation holds each device's whole bfloat16 gradient, which real stage 2
avoids by reduce-scattering each bucket of gradients as the backward pass produces it.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tinyformer._optional import ml_dtypes
from tinyformer._validation import describe, non_negative_int, positive_int
from tinyformer.memory_budget import bytes_per_parameter
from tinyformer.module import Module, Parameter
from tinyformer.optim import AdamW

__all__ = ["SHARDED_PARTS", "ZeroDataParallel", "ZeroDevice", "zero_bytes_per_device"]

SHARDED_PARTS: dict[int, tuple[str, ...]] = {
    0: (),
    1: ("master weights", "first moment", "second moment"),
    2: ("master weights", "first moment", "second moment", "gradients"),
    3: ("master weights", "first moment", "second moment", "gradients", "weights"),
}
"""The parts of the model states each ZeRO stage shards (stage 0 is plain data parallelism)."""


def _stage(stage: object) -> int:
    s = non_negative_int(stage, "stage")
    if s not in SHARDED_PARTS:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {s}")
    return s


def zero_bytes_per_device(n_parameters: int, n_devices: int, stage: int) -> dict[str, int]:
    r"""Bytes of each part of mixed-precision Adam's model states on one device.

    A sharded part holds :math:`\lceil \Psi / N_d \rceil` numbers, the others :math:`\Psi`:

    .. math::
        \text{stage 0: } 16\Psi, \quad
        \text{1: } 4\Psi + \tfrac{12\Psi}{N_d}, \quad
        \text{2: } 2\Psi + \tfrac{14\Psi}{N_d}, \quad
        \text{3: } \tfrac{16\Psi}{N_d}

    (with :math:`\Psi/N_d` rounded up).
    """
    n = positive_int(n_parameters, "n_parameters")
    shard = -(-n // positive_int(n_devices, "n_devices"))
    sharded = SHARDED_PARTS[_stage(stage)]
    per_parameter = bytes_per_parameter("mixed", "adam")
    return {part: (shard if part in sharded else n) * b for part, b in per_parameter.items()}


@dataclass
class ZeroDevice:
    r"""The model states one simulated device holds between steps.

    Attributes
    ----------
    weights, gradients : numpy.ndarray
        bfloat16 (``ml_dtypes``), whole (:math:`\Psi` numbers) or the device's shard.
    master : Parameter
        float32 master weights, whole (stage 0) or the device's shard. Its ``grad`` is
        set only during the update (a float32 copy of the averaged gradient's shard).
    optimizer : AdamW
        Over ``master``: its two moments are the device's first and second moments.
    """

    weights: np.ndarray
    gradients: np.ndarray
    master: Parameter
    optimizer: AdamW

    def held_bytes(self) -> dict[str, int]:
        """Bytes of each array the device holds, by part (measured with ``nbytes``)."""
        buffers = self.optimizer.buffers
        return {
            "weights": self.weights.nbytes,
            "gradients": self.gradients.nbytes,
            "master weights": self.master.value.nbytes,
            "first moment": buffers["exp_avg"][0].nbytes,
            "second moment": buffers["exp_avg_sq"][0].nbytes,
        }


class ZeroDataParallel:
    r"""Mixed-precision AdamW data parallelism over ``n_devices`` simulated devices, ZeRO ``stage``.

    Parameters
    ----------
    model : Module
        The architecture and the initial (float32) weights. It is the devices' shared
        calculator: each device loads its weights into it for its forward and backward
        pass, so its parameters are overwritten (pass a copy).
    n_devices : int
        :math:`N_d`.
    stage : int
        0 (no sharding), 1, 2 or 3.
    **adamw : float
        ``lr``, ``betas``, ``eps``, ``weight_decay`` of :class:`~tinyformer.optim.AdamW`.
    """

    def __init__(self, model: Module, n_devices: int, stage: int, **adamw: float) -> None:
        if not isinstance(model, Module):
            raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
        self.model, self.params = model, model.parameters()
        if any(p.dtype != np.float32 for p in self.params):
            raise ValueError("model must have float32 parameters (the master weights' format)")
        self.n_devices, self.stage = positive_int(n_devices, "n_devices"), _stage(stage)
        master = np.concatenate([p.value.ravel() for p in self.params])  # (Psi,)
        self.n_parameters = master.size
        self.shard = -(-master.size // self.n_devices)
        padded = self._padded(master)  # (N_d * shard,)
        self.devices = [self._device(padded, d, adamw) for d in range(self.n_devices)]

    def _padded(self, flat: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [flat, np.zeros(self.n_devices * self.shard - flat.size, flat.dtype)]
        )

    def _own(self, d: int) -> slice:
        return slice(d * self.shard, (d + 1) * self.shard)

    def _device(self, padded: np.ndarray, d: int, adamw: dict) -> ZeroDevice:
        sharded = SHARDED_PARTS[self.stage]
        whole = padded[: self.n_parameters]

        def part(name: str, values: np.ndarray) -> np.ndarray:  # a copy: whole or own shard
            return (values[self._own(d)] if name in sharded else whole).copy()

        master = Parameter(part("master weights", padded))
        optimizer = AdamW([master], **adamw)
        master.grad = None  # no float32 gradient is held between steps
        weights = part("weights", padded).astype(ml_dtypes().bfloat16)
        gradients = np.zeros_like(part("gradients", padded), dtype=ml_dtypes().bfloat16)
        return ZeroDevice(weights, gradients, master, optimizer)

    # ------------------------------------------------------------------ one step
    def step(
        self, loss_and_backward: Callable[[Module, np.ndarray], object], batch: np.ndarray
    ) -> None:
        """One training step on ``batch``, cut into ``n_devices`` equal slices.

        ``loss_and_backward(model, rows)`` runs the forward and backward pass of a loss
        that is a mean over ``rows`` (as for
        :func:`~tinyformer.parallel.data_parallel_gradients`).
        """
        if len(batch) % self.n_devices:
            raise ValueError(
                f"n_devices={self.n_devices} must divide the batch size, got {len(batch)}"
            )
        local = []  # each device's bfloat16 gradient, whole: transient
        for d, rows in enumerate(np.split(batch, self.n_devices)):
            weights = self.weights() if self.stage == 3 else self.devices[d].weights
            self._load(weights.astype(np.float32))  # stage 3: all-gathered for this pass
            self.model.zero_grad()
            loss_and_backward(self.model, rows)
            grad = np.concatenate([p.grad.ravel() for p in self.params])  # (Psi,) float32
            local.append(self._padded(grad).astype(ml_dtypes().bfloat16))
        total = local[0].astype(np.float32)
        for g in local[1:]:  # the all-reduce (or reduce-scatter): devices added in order
            total += g.astype(np.float32)
        average = (total / np.float32(self.n_devices)).astype(ml_dtypes().bfloat16)  # (N_d shard,)
        for d, device in enumerate(self.devices):
            sharded = "gradients" in SHARDED_PARTS[self.stage]
            device.gradients[...] = (
                average[self._own(d)] if sharded else average[: self.n_parameters]
            )
            self._update(d, device, average)
        if self.stage in (1, 2):  # all-gather the new weights into every device's whole copy
            shards = [dev.master.value.astype(ml_dtypes().bfloat16) for dev in self.devices]
            gathered = np.concatenate(shards)[: self.n_parameters]
            for device in self.devices:
                device.weights[...] = gathered

    def _update(self, d: int, device: ZeroDevice, average: np.ndarray) -> None:
        """AdamW on the device's master weights (whole or shard), then its own weights."""
        owned = average[self._own(d)] if self.stage else average[: self.n_parameters]
        device.master.grad = owned.astype(np.float32)  # a float32 copy, for the update only
        device.optimizer.step()
        device.master.grad = None
        if self.stage in (0, 3):  # the weights it holds are exactly the ones it updated
            device.weights[...] = device.master.value.astype(ml_dtypes().bfloat16)

    def _load(self, flat: np.ndarray) -> None:
        offset = 0
        for p in self.params:
            p.value[...] = flat[offset : offset + p.value.size].reshape(p.shape)
            offset += p.value.size

    # ------------------------------------------------------------------ results
    def master_weights(self) -> np.ndarray:
        """The float32 master weights, gathered from the devices: shape ``(Psi,)``."""
        if self.stage == 0:
            return self.devices[0].master.value.copy()
        return np.concatenate([dev.master.value for dev in self.devices])[: self.n_parameters]

    def weights(self) -> np.ndarray:
        """The bfloat16 weights, gathered from the devices (stage 3) or device 0's: ``(Psi,)``."""
        if self.stage == 3:
            return np.concatenate([dev.weights for dev in self.devices])[: self.n_parameters]
        return self.devices[0].weights.copy()

    def held_bytes(self) -> list[dict[str, int]]:
        """:meth:`ZeroDevice.held_bytes` of every device."""
        return [device.held_bytes() for device in self.devices]
