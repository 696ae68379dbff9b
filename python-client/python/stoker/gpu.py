"""The GPU side of :class:`stoker.Loader`: page-locked batch slots, delivery on the device, and
the time the GPU sat idle waiting for a batch.

- **Pinned slots** (``pin_memory=True``, implied by ``device="cuda"``): the native slot pool
  registers its memory with the CUDA driver once per slot (never per batch), so torch tensors
  of a batch report ``is_pinned()`` and ``.cuda(non_blocking=True)`` copies them by DMA. A slot
  whose batch was released goes back to the pool only after fences on the streams that may
  still be copying from it have completed: on each device the process uses, the legacy default
  stream and every stream of torch's pool (``torch.cuda.Stream()``), fenced by the native fence
  thread after the release whichever thread queued a copy there, and the releasing thread's
  current stream (:func:`release_streams`); or the loader's own copy stream.
- **Device delivery** (``device="cuda"``): :class:`DeviceStage` copies each finished batch to
  the device on a stream of its own and runs the pipeline's tail there (the image's
  ``Normalize`` and ``ToTensor`` layout and dtype, or bfloat16 / float16 and channels_last),
  then makes the consumer's current stream wait on an event: the host never blocks on the
  device. Device memory comes from torch's caching allocator, tagged with the consumer's
  stream (``record_stream``) so it is not reused under the consumer's work.
- **GPU idle** (:class:`GpuIdleMeter`): events on the consumer's stream around each
  ``next()`` give how long the GPU sat idle waiting for a batch, which differs from the host's
  wait inside ``next()`` when the training loop runs ahead of the GPU; and, beside a GPU
  decode lane, how much longer the stream took over steps beside the lane's work than over
  steps with the lane quiet (``stats()["gpu_lane_cost_s"]``).
- **GPU decode lane** (``decode="gpu"`` or ``"auto"`` with ``device="cuda"``): the native
  loader decodes part of each image batch with nvJPEG and crops it with one kernel, leaving
  those rows on the GPU; :meth:`DeviceStage.stage` merges them into the device batch after
  copying the slot's rows, before the tail. :func:`cuda_library_dirs` tells it where the pip
  wheels' CUDA libraries are.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker import _native
from stoker._gpu_idle import GpuIdleMeter
from stoker._lane_helper import lane_helper
from stoker.errors import GpuUnavailableError
from stoker.ops import Normalize, Op, ToTensor

__all__ = [
    "DeviceStage",
    "DeviceTail",
    "GpuIdleMeter",
    "default_pinned_budget",
    "lane_helper",
    "parse_device",
    "pin_device",
    "pool_streams",
    "release_streams",
    "split_tail",
    "warn_unpinned",
]

# Output dtypes the device tail makes, by name.
_FLOAT_DTYPES = ("float32", "bfloat16", "float16")
_MEMORY_FORMATS = ("contiguous", "channels_last")


def parse_device(device: object) -> int | None:
    """``None`` for host delivery (``None`` or ``"cpu"``); the index for ``"cuda"`` (-1: the
    current device) or ``"cuda:N"``; ValueError for anything else."""
    if device is None or device == "cpu":
        return None
    if not isinstance(device, str) and type(device).__name__ == "device":
        device = str(device)  # a torch.device
    if device == "cuda":
        return -1
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def default_pinned_budget() -> tuple[int, str]:
    """The pinned budget of one rank in bytes, and the rule: a quarter of the node's memory (or
    of the container's cgroup limit where lower), divided by ``LOCAL_WORLD_SIZE``."""
    memory, whose = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "node's"
    for path in CGROUP_MEMORY_LIMITS:  # cgroup v2, then v1 ("max" or a huge number: none)
        with contextlib.suppress(OSError, ValueError):
            with open(path) as file:
                limit = int(file.read().strip())
            memory, whose = (limit, "cgroup limit's") if limit < memory else (memory, whose)
            break
    text = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    local = int(text) if text.isdigit() and int(text) > 0 else 1
    rule = f"a quarter of the {whose} {memory} bytes / LOCAL_WORLD_SIZE={local}"
    return memory // 4 // local, rule


CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def check_budget(budget: object) -> int:
    """``pinned_memory_budget`` as a positive int of bytes; ValueError otherwise."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(
            "pinned_memory_budget must be a positive number of bytes (this process's own), "
            f"got {budget!r}"
        )
    return budget


_log = logging.getLogger("stoker")

# What ``decode="auto"`` fell back to the CPU for, said once each per process.
_AUTO_SAID: set[str] = set()


def _auto_on_the_cpu(why: str) -> None:
    """Says once per process (a warning on logger ``stoker``) why ``decode="auto"`` decodes
    on the CPU: a user who asked for the GPU lane learns it does not run."""
    if why not in _AUTO_SAID:
        _AUTO_SAID.add(why)
        _log.warning("decode='auto' decodes on the CPU: %s", why)

_DECODES = ("cpu", "gpu", "auto")

# The least gpu_memory taken: the lane needs room for two batches of rows and its decoding.
_MIN_GPU_MEMORY = 64 << 20


def check_decode(
    decode: object, gpu_memory: object, device_index: int | None, address: str | None
) -> tuple[str, int]:
    """Checks ``decode`` and ``gpu_memory``; returns the decode to ask for (``"auto"`` without
    a device to deliver to is ``"cpu"``) and the lane's memory in bytes."""
    if decode not in _DECODES:
        raise ValueError(f"decode must be 'cpu', 'gpu' or 'auto', got {decode!r}")
    memory = _native.DEFAULT_GPU_MEMORY
    if gpu_memory is not None:
        if (
            not isinstance(gpu_memory, int)
            or isinstance(gpu_memory, bool)
            or gpu_memory < _MIN_GPU_MEMORY
        ):
            raise ValueError(
                f"gpu_memory must be an int of at least {_MIN_GPU_MEMORY} bytes (the GPU "
                f"decode lane's device memory), got {gpu_memory!r}"
            )
        memory = gpu_memory
    if decode == "cpu":
        if gpu_memory is not None:
            raise ValueError("gpu_memory sizes the GPU decode lane: give decode='gpu' or 'auto'")
        return "cpu", memory
    if address is not None:
        raise ValueError(
            f"decode={decode!r} runs beside the decode threads of the embedded mode; a "
            "coordinator's workers decode on their CPUs: leave decode unset with address="
        )
    if device_index is None:
        if decode == "gpu":
            raise ValueError(
                "decode='gpu' decodes on the GPU the batches are delivered to: give "
                "device='cuda' (or 'cuda:N')"
            )
        _auto_on_the_cpu("the GPU lane decodes on the GPU the batches are delivered to, and "
                         "no device= was given")
        return "cpu", memory
    return str(decode), memory


def cuda_library_dirs() -> list[str]:
    """Folders of NVIDIA's pip wheels that may hold nvJPEG and NVRTC (``nvidia/*/lib`` on
    ``sys.path``), searched before the CUDA toolkit's."""
    found: list[str] = []
    for entry in sys.path:
        for lib in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib"))):
            if os.path.isdir(lib) and lib not in found:
                found.append(lib)
    return found


def lane_decode(decode: str, index: int) -> str:
    """``decode`` when the GPU decode lane can run on device ``index``; for ``"auto"`` where
    it cannot, ``"cpu"`` (a warning, once per reason); for ``"gpu"`` a
    :class:`~stoker.GpuUnavailableError` naming what is missing."""
    problem = _native.gpu_decode_unavailable(index, cuda_library_dirs())
    if problem is None:
        return decode
    if decode == "gpu":
        raise GpuUnavailableError(f"decode='gpu' cannot run on cuda:{index}: {problem}")
    _auto_on_the_cpu(f"the GPU lane cannot run ({problem})")
    return "cpu"


def pool_streams(make: Callable[[int], Any], priorities: Sequence[int]) -> list[int]:
    """The handles of every stream torch's pool on one device can hand out, as
    ``make(priority)`` (``torch.cuda.Stream(device=..., priority=...)``) returns them: each
    priority's pool is asked until its first stream comes round again, then as many more
    times as return its round-robin counter to where it was (the pool hands streams out in
    turn), so the streams the program asks for next are those it would have had."""
    handles: set[int] = set()
    for priority in priorities:
        first = int(make(priority).cuda_stream)
        seen = [first]
        while len(seen) < _POOL_LIMIT:
            handle = int(make(priority).cuda_stream)
            if handle == first:
                break
            seen.append(handle)
        # len(seen) + 1 asked so far: len(seen) - 1 more make a whole number of turns.
        for _ in range(len(seen) - 1):
            make(priority)
        handles.update(seen)
    return sorted(handles)


# Streams asked of one priority's pool before the enumeration stops (torch's holds 32).
_POOL_LIMIT = 1024


def release_streams(torch: Any) -> Callable[[], list[tuple[int, int]]]:
    """What a page-locked slot is fenced on when the user lets go of its batch, as ``(device,
    stream)`` pairs: the releasing thread's current stream on every device the process has
    started CUDA on, the one that locked the slot among them (the slots are locked for all
    devices, so a batch pinned through device 0 may be copied to device 1); none on a device
    nothing started (no copy can be queued there, and fencing it would start its context), so
    none before torch has started CUDA. Each device named is also swept by the native fence
    thread: the first time a device is named here its pool streams (:func:`pool_streams`, every
    priority) are registered for that, so a copy queued on any of them by any thread before
    the release finishes before the slot is reused, as is one on the legacy default stream."""
    watched: set[int] = set()

    def streams() -> list[tuple[int, int]]:
        if torch is None or not torch.cuda.is_initialized():
            return []
        named = []
        for device in _native.cuda_active_devices():
            if device not in watched:
                least, greatest = torch.cuda.Stream.priority_range()
                priorities = range(least, greatest - 1, -1) if greatest <= least else [least]

                def make(priority: int, device: int = device) -> Any:
                    return torch.cuda.Stream(device=device, priority=priority)

                _native.cuda_watch_streams(device, pool_streams(make, priorities))
                watched.add(device)
            named.append((device, int(torch.cuda.current_stream(device).cuda_stream)))
        return named

    return streams


def cuda_problem(torch: Any, index: int) -> str | None:
    """What keeps device ``index`` from working with torch here, or None."""
    if torch is not None and torch.version.cuda is None:
        return f"torch {torch.__version__} was built without CUDA"
    if not _native.cuda_driver_present():
        return _native.cuda_unavailable(max(index, 0))
    if torch is not None and not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU visible to this process)"
    if torch is not None and index >= torch.cuda.device_count():
        return f"no CUDA device {index}: torch sees {torch.cuda.device_count()}"
    return _native.cuda_unavailable(max(index, 0))


def _outside_stoker() -> int:
    """The ``stacklevel`` of the caller's first frame outside this package: where a warning
    points, whichever of the package's entry points (``Loader``, ``Loader.from_dataset``,
    ``stoker.mix``) the user called."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def pin_device(torch: Any, pin_memory: bool) -> int | None:
    """The fallback device whose driver page-locks the slots for ``pin_memory=True`` (torch's
    current one now, else 0; the loader takes the device in use when the first batch goes
    out: ``pin_follow``), or None: with one warning naming what is
    missing (pointing at the user's line that made the loader), as DataLoader runs without an
    accelerator. Starts no CUDA context."""
    if not pin_memory:
        return None
    index = 0
    if torch is not None and torch.version.cuda is not None and torch.cuda.is_available():
        index = int(torch.cuda.current_device())
    # Names the missing driver itself, without loading anything it cannot.
    problem = _native.cuda_unavailable(index)
    if problem is not None:
        warn_unpinned(problem)
        return None
    return index


def warn_unpinned(problem: str) -> None:
    """The one warning of ``pin_memory=True`` without page-locked slots, naming ``problem``
    and pointing at the user's line (the loader's making, or the loop's first batch, when the
    driver context that locks them opens then and fails)."""
    warnings.warn(
        f"pin_memory=True, but the batch slots cannot be page-locked: {problem}. They stay "
        "in pageable memory (stats()['pinned'] is False).",
        stacklevel=_outside_stoker(),
    )


def require_device(torch: Any, device: str, index: int) -> int:
    """The device index ``device`` names (the current one for ``"cuda"``), or a
    :class:`~stoker.GpuUnavailableError` naming what is missing."""
    problem = cuda_problem(torch, index)
    if problem is not None:
        raise GpuUnavailableError(f"device={device!r}: {problem}")
    return int(torch.cuda.current_device()) if index < 0 else index


@dataclass(frozen=True)
class DeviceTail:
    """What the device does to the uint8 NHWC image after copying it: the pipeline's
    ``Normalize`` (``(v / 255 - mean) / std`` per channel, as ``v * scale + shift`` in float32)
    or ``ToTensor``'s ``/ 255``, then the layout and dtype."""

    #: Per-channel (mean, std), or None.
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None
    #: "NHWC" or "NCHW".
    layout: str
    #: "uint8", "float32", "bfloat16" or "float16".
    dtype: str
    #: "contiguous" or "channels_last" (NCHW shape, NHWC memory).
    memory_format: str

    def describe(self) -> str:
        """The tail in a few words, for repr and stats."""
        norm = "normalise, " if self.normalize is not None else ""
        return f"{norm}{self.dtype} {self.layout} {self.memory_format}"

    def affine(self) -> tuple[list[float], list[float]] | None:
        """The tail's values as ``v * scale + shift`` per channel of byte values ``v``, in
        float64 here, to be rounded once to float32: ``Normalize``'s
        ``(v / 255 - mean) / std == v * (1 / (255 std)) + (-mean / std)``, or without it, for a
        float dtype, ``ToTensor``'s ``v / 255``; None for uint8, whose values stay."""
        if self.normalize is None and self.dtype == "uint8":
            return None
        mean, std = self.normalize if self.normalize is not None else ((0.0,) * 3, (1.0,) * 3)
        scale = [1.0 / (255.0 * s) for s in std]
        shift = [-m / s for m, s in zip(mean, std, strict=True)]
        return scale, shift

    def planar(self) -> bool:
        """Whether the image's memory holds channel planes (contiguous NCHW) rather than
        interleaved channels (NHWC, or NCHW ``channels_last``)."""
        return self.layout == "NCHW" and self.memory_format == "contiguous"


def lane_tail(
    tail: DeviceTail | None,
) -> tuple[str, bool, tuple[list[float], list[float]] | None] | None:
    """The device stage's ``tail`` as the native GPU decode lane takes it, for its kernel to
    apply when ``STOKER_GPU_DECODE_FUSED_TAIL=1`` asks: (dtype, channel planes, per-channel
    scale and shift or None)."""
    if tail is None:
        return None
    return tail.dtype, tail.planar(), tail.affine()


def split_tail(
    ops: Sequence[Op], dtype: object, memory_format: object
) -> tuple[list[Op], DeviceTail | None]:
    """The ops the CPU threads run (the image left uint8 NHWC) and the tail the device runs,
    for an image pipeline; token and column pipelines have no tail (``dtype`` and
    ``memory_format`` must then be None)."""
    names = [type(op).__name__ for op in ops]
    if "DecodeImage" not in names:
        if dtype is not None or memory_format is not None:
            raise ValueError("dtype and memory_format apply to image pipelines only")
        return list(ops), None
    cpu = list(ops)
    to_tensor = cpu[-1] if cpu and isinstance(cpu[-1], ToTensor) else None
    if to_tensor is not None:
        cpu.pop()
    normalize = cpu[-1] if cpu and isinstance(cpu[-1], Normalize) else None
    if normalize is not None:
        cpu.pop()
    # ToTensor's layout and dtype in any case, as the native check takes them (None: the
    # defaults), in the form the device stage compares.
    given_layout = None if to_tensor is None else to_tensor.layout
    given_dtype = None if to_tensor is None else to_tensor.dtype
    if normalize is not None:
        layout = str(given_layout or "NCHW").upper()
        out_dtype = "float32"
    else:
        layout = str(given_layout or "NHWC").upper()
        out_dtype = str(given_dtype or "uint8").lower()
    if dtype is not None:
        name = str(dtype).removeprefix("torch.")
        if name not in (*_FLOAT_DTYPES, "uint8"):
            raise ValueError(
                f"dtype must be one of 'float32', 'bfloat16', 'float16' (or torch's), or "
                f"'uint8' without Normalize, got {dtype!r}"
            )
        if name == "uint8" and normalize is not None:
            raise ValueError("dtype='uint8' contradicts Normalize, which gives floats")
        out_dtype = name
    fmt = "contiguous"
    if memory_format is not None:
        fmt = str(memory_format).removeprefix("torch.")
        if fmt not in _MEMORY_FORMATS:
            raise ValueError(
                f"memory_format must be 'contiguous' or 'channels_last' (or torch's), got "
                f"{memory_format!r}"
            )
        if fmt == "channels_last":
            layout = "NCHW"
    tail = DeviceTail(
        normalize=None if normalize is None else (tuple(normalize.mean), tuple(normalize.std)),
        layout=layout,
        dtype=out_dtype,
        memory_format=fmt,
    )
    cpu.append(ToTensor())
    return cpu, tail


class DeviceStage:
    """Copies batches to device ``index`` on a stream of its own and runs the image's tail
    there; :meth:`hand_out` then makes the consumer's current stream wait for them."""

    def __init__(self, torch: Any, index: int, tail: DeviceTail | None) -> None:
        self._torch = torch
        self.index = index
        self.device = torch.device("cuda", index)
        # The highest priority: the copy and the tail are short and the training step waits
        # for them, so their blocks go ahead of the step's queued ones.
        self.stream = torch.cuda.Stream(device=self.device, priority=-1)
        self.tail = tail
        # uint8 NHWC stays as the CPU made it: nothing to run.
        self._changes_image = tail is not None and (
            tail.normalize is not None or tail.dtype != "uint8" or tail.layout != "NHWC"
        )
        self._scale: Any = None
        self._shift: Any = None
        affine = tail.affine() if tail is not None else None
        if tail is not None and affine is not None:
            scale, shift = affine
            shape = (1, 1, 1, 3) if tail.layout == "NHWC" else (1, 3, 1, 1)
            self._scale = torch.tensor(scale, dtype=torch.float32, device=self.device).view(shape)
            self._shift = torch.tensor(shift, dtype=torch.float32, device=self.device).view(shape)
        self._warm_up()

    def _warm_up(self) -> None:
        """Runs the stage once on a tiny batch, so that loading CUDA's kernels for the copy
        and the tail (and torch's stream memory pool) happens while the loader is built, not in
        the first ``next()``. The tiny batch is pageable: the stage page-locks nothing of its
        own (the slots and the room beside them are the pool's, within the pinned budget)."""
        torch = self._torch
        with torch.cuda.stream(self.stream):
            tiny = torch.zeros((1, 2, 2, 3), dtype=torch.uint8)
            device = torch.empty_like(tiny, device=self.device)
            device.copy_(tiny, non_blocking=True)
            if self._changes_image:
                self._apply_tail(device)
        self.stream.synchronize()

    def stage(
        self,
        tensors: Sequence[tuple[str, str, tuple[int, ...], Any]],
        rows: Any = None,
        places: Any = None,
    ) -> tuple[dict[str, Any], Any]:
        """Queues the copy of every tensor of a batch (``(name, dtype, shape, Buffer)``), and
        the image's tail, on the stage's stream; returns the device tensors and the event
        that says they are ready. ``rows`` (a native ``DeviceRows``): the image rows the GPU
        decode lane left on the device, copied over their places after the slot's rows;
        ``places`` (a ``Buffer``, int64): the batch row of each. Rows the lane's kernel already
        made as the tail makes them (``rows.tail_applied``) are copied into the tail's tensor
        as they are: the tail runs over the batch only when some of its rows are the slot's
        (and then over all of it, the lane's rows copied over their places after). Each
        host slot is fenced on the stream after its copies, so it returns to the pool only once
        they have read it; the lane's rows are kept until the copy of them is done."""
        torch = self._torch
        out: dict[str, Any] = {}
        with torch.cuda.stream(self.stream):
            for name, dtype, shape, data in tensors:
                count = math.prod(shape)
                host = torch.from_numpy(
                    np.frombuffer(memoryview(data), dtype=np.dtype(dtype), count=count).reshape(
                        shape
                    )
                )
                # Labels come page-locked too, from the pool's room beside its slots; where
                # that room had no slot free (or the pool does not pin) they are copied from
                # pageable memory, never page-locked outside the pinned budget.
                lane_rows = rows if name == "image" else None
                if lane_rows is not None and lane_rows.tail_applied:
                    out[name] = self._fused_image(host, lane_rows, places)
                    data.release_after(self.stream.cuda_stream)
                    continue
                device = torch.empty(shape, dtype=host.dtype, device=self.device)
                if lane_rows is None or len(lane_rows.positions) < shape[0]:
                    device.copy_(host, non_blocking=True)
                if lane_rows is not None:
                    self._merge_rows(device, lane_rows, places)
                data.release_after(self.stream.cuda_stream)
                if name == "image" and self._changes_image and len(shape) == 4:
                    device = self._apply_tail(device)
                out[name] = device
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return out, ready

    def _fused_image(self, host: Any, rows: Any, places: Any) -> Any:
        """The tail's image tensor for a batch whose lane rows the lane's kernel made as the
        tail makes them: the slot's image copied and put through the tail when some rows are
        the slot's, then the lane's rows copied over their places."""
        torch = self._torch
        tail = self.tail
        assert tail is not None
        if len(rows.positions) < host.shape[0]:
            device = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            device.copy_(host, non_blocking=True)
            image = self._apply_tail(device)
        else:
            image = self._tail_output(host.shape)
        # The rows' memory order: channel planes, or interleaved (NHWC, and channels_last's).
        target = image if tail.planar() or tail.layout == "NHWC" else image.permute(0, 2, 3, 1)
        self._merge_rows(target, rows, places)
        return image

    def _merge_rows(self, image: Any, rows: Any, places: Any) -> None:
        """Copies the lane's rows over their places in ``image`` (on the device, of the rows'
        shape and dtype past the first dimension), on the stage's stream once the lane's
        events have passed; ``places`` (a ``Buffer`` of int64, page-locked beside the slots
        where there was room) says where."""
        torch = self._torch
        rows.wait(self.stream.cuda_stream)
        decoded = torch.as_tensor(rows, device=self.device)
        element = getattr(torch, rows.dtype)
        if decoded.dtype != element:
            # bfloat16 comes as its bit patterns (the array interface has no type for it).
            decoded = decoded.view(element)
        if places is None:
            host = torch.tensor(rows.positions, dtype=torch.long)
        else:
            host = torch.from_numpy(np.frombuffer(memoryview(places), dtype=np.int64))
        image.index_copy_(0, host.to(self.device, non_blocking=True), decoded)
        if places is not None:
            places.release_after(self.stream.cuda_stream)
        # The lane reuses the rows' buffer only after this copy, whoever lets go of the rows
        # first.
        rows.keep_until(self.stream.cuda_stream)

    def _tail_output(self, shape: Sequence[int]) -> Any:
        """An empty tensor of the tail's layout, dtype and memory format for images of NHWC
        ``shape``."""
        torch = self._torch
        tail = self.tail
        assert tail is not None
        batch, height, width, channels = shape
        dtype = getattr(torch, tail.dtype)
        if tail.layout == "NHWC":
            return torch.empty((batch, height, width, channels), dtype=dtype, device=self.device)
        fmt = (
            torch.channels_last
            if tail.memory_format == "channels_last"
            else torch.contiguous_format
        )
        return torch.empty(
            (batch, channels, height, width), dtype=dtype, device=self.device, memory_format=fmt
        )

    def _apply_tail(self, image: Any) -> Any:
        """uint8 NHWC on the device -> the tail's layout, values and dtype, in one pass."""
        tail = self.tail
        assert tail is not None
        out = self._tail_output(image.shape)
        # For NCHW, the NHWC bytes seen as NCHW: a channels_last view, no copy.
        source = image if tail.layout == "NHWC" else image.permute(0, 3, 1, 2)
        if self._scale is None:
            out.copy_(source)
        else:
            self._torch.addcmul(self._shift, source, self._scale, out=out)
        return out

    def hand_out(self, staged: tuple[dict[str, Any], Any]) -> dict[str, Any]:
        """The batch for the consumer: its current stream waits on the batch's event (the host
        does not), and each tensor is marked as used by that stream for torch's allocator."""
        tensors, ready = staged
        consumer = self._torch.cuda.current_stream(self.device)
        consumer.wait_event(ready)
        for tensor in tensors.values():
            tensor.record_stream(consumer)
        return tensors
