"""A loader's GPU arguments as one value, :class:`Placement`: where batches are delivered
(``device``), whether the batch slots are page-locked and within what budget (``pin_memory``,
``pinned_memory_budget``), how the device shapes the image (``dtype``, ``memory_format``) and
where images are decoded (``decode``, ``gpu_memory``). Checked before any work starts, then
settled against torch and the driver into what the native loader and :mod:`stoker.gpu`'s
device stage take. ``Loader`` and ``Loader.from_dataset`` share it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from stoker import _native
from stoker._arguments import check_bool
from stoker.gpu import (
    DeviceStage,
    DeviceTail,
    check_budget,
    check_decode,
    cuda_library_dirs,
    default_pinned_budget,
    lane_decode,
    lane_tail,
    parse_device,
    pin_device,
    release_streams,
    require_device,
    split_tail,
)
from stoker.ops import Op

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """A loader's GPU arguments, checked before any work starts (:meth:`check`): where batches
    are delivered, whether the slots are page-locked and within what budget, and where images
    are decoded. :meth:`resolve` then settles them against torch and the driver, and
    :meth:`pinning_arguments` and :meth:`lane_arguments` give what the native loader takes."""

    #: ``device`` as the caller gave it, for messages.
    device: str | None
    #: The GPU batches are delivered on (-1: torch's current one until resolved); None: host.
    index: int | None
    pin_memory: bool
    #: Bytes of page-locked slots this process may hold.
    budget: int
    dtype: object = None
    memory_format: object = None
    #: "cpu", "gpu" or "auto" (resolved: what the lane can do here).
    decode: str = "cpu"
    #: The GPU decode lane's device memory, in bytes.
    lane_memory: int = _native.DEFAULT_GPU_MEMORY
    #: Once resolved: the device whose driver page-locks the slots, or None.
    pinned_on: int | None = None

    @classmethod
    def check(
        cls,
        *,
        device: object = None,
        pin_memory: object = False,
        pinned_memory_budget: object = None,
        dtype: object = None,
        memory_format: object = None,
        decode: object = "cpu",
        gpu_memory: object = None,
        address: str | None = None,
    ) -> Placement:
        """The arguments checked (ValueError naming what is wrong); nothing is loaded yet."""
        index = parse_device(device)
        pin = check_bool(pin_memory, "pin_memory")
        if index is None and (dtype is not None or memory_format is not None):
            raise ValueError(
                "dtype and memory_format shape the batch on the GPU: give device='cuda' (on "
                "the CPU, ops.ToTensor and ops.Normalize choose layout and dtype)"
            )
        decode_on, lane_memory = check_decode(decode, gpu_memory, index, address)
        budget = (
            default_pinned_budget()[0]
            if pinned_memory_budget is None
            else check_budget(pinned_memory_budget)
        )
        if index is None and not pin and pinned_memory_budget is not None:
            raise ValueError(
                "pinned_memory_budget bounds page-locked memory, which only pin_memory=True "
                "or device='cuda' uses: give one of them, or leave the budget out"
            )
        shown = None if device is None else str(device)
        return cls(shown, index, pin, budget, dtype, memory_format, decode_on, lane_memory)

    def check_output(self, output: str) -> None:
        """Device delivery hands out torch tensors: ValueError for another ``output``."""
        if self.index is not None and output != "torch":
            raise ValueError(
                f"device={self.device!r} delivers torch tensors: leave output unset or 'torch'"
            )

    def split(self, ops: Sequence[Op]) -> tuple[list[Op], DeviceTail | None]:
        """The ops the CPU threads run and the tail the device runs (:func:`split_tail`); on
        the host, all of them and no tail."""
        if self.index is None:
            return list(ops), None
        return split_tail(ops, self.dtype, self.memory_format)

    def refuse_mix(self) -> None:
        """Device delivery does not take a :func:`stoker.mix` yet: ValueError with ``device``."""
        if self.index is not None:
            raise ValueError(
                f"device={self.device!r} does not take a stoker.mix yet: use pin_memory=True "
                "and move the batches with .cuda(non_blocking=True)"
            )

    def resolve(self, torch: Any) -> Placement:
        """Settled against torch (None, or torch without CUDA, for host delivery) and the
        driver: the delivery device's index (a :class:`~stoker.GpuUnavailableError` naming
        what is missing), the device that page-locks the slots (with ``pin_memory`` where no
        driver can: one warning and pageable slots), and
        the decode the lane can do (:func:`lane_decode`)."""
        if self.index is None:
            torch = torch or sys.modules.get("torch")
            pinned_on = pin_device(torch, self.pin_memory)
            return replace(self, pinned_on=pinned_on)
        index = require_device(torch, str(self.device), self.index)
        decode = lane_decode(self.decode, index) if self.decode != "cpu" else "cpu"
        return replace(self, index=index, pinned_on=index, decode=decode)

    def pinning_arguments(self, torch: Any) -> dict[str, Any]:
        """The native loader's keyword arguments for the slots' pinning (once resolved): a
        released slot is fenced on torch's streams whenever torch was imported by the time the
        loader was made, whatever ``output``. With ``pin_memory`` (no ``device``) the slots are
        locked through the device the process uses when the first batch goes out, as
        DataLoader pins on the device current when it is iterated: a loader made before
        ``torch.cuda.set_device`` starts no context on device 0."""
        pinned_on = self.pinned_on
        fences = None
        if pinned_on is not None:
            fences = release_streams(torch or sys.modules.get("torch"))
        return {
            "pin_device": pinned_on,
            "pin_follow": self.index is None,
            "pinned_budget": self.budget,
            "release_streams": fences,
        }

    def lane_arguments(self, tail: DeviceTail | None) -> dict[str, Any]:
        """The native loader's keyword arguments for the GPU decode lane (once resolved), with
        the device stage's ``tail`` for its kernel to apply when asked."""
        return {
            "decode": self.decode,
            "gpu_memory": self.lane_memory,
            "library_dirs": cuda_library_dirs() if self.decode != "cpu" else [],
            "gpu_tail": lane_tail(tail) if self.decode != "cpu" else None,
        }

    def stage(self, torch: Any, tail: DeviceTail | None) -> DeviceStage | None:
        """The stage that delivers batches on the device (once resolved), or None on the host."""
        return None if self.index is None else DeviceStage(torch, self.index, tail)
