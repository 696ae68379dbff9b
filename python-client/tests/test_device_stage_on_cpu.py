"""The device stage (``stoker.gpu.DeviceStage``) run on the CPU: torch's CUDA streams and
events stood in for by recorders, tensors on the CPU, and the GPU decode lane's rows given as
host arrays. What runs is the stage's own logic, which otherwise runs only on a GPU: the slot's
image copied and put through the tail (``Normalize``, dtype, layout), the lane's rows copied
over their places, rows the lane's kernel already made as the tail makes them copied into the
tail's tensor as they are (all of a batch's, or beside rows of the slot's put through the tail),
bfloat16 rows taken from their bit patterns, and each host buffer and the lane's rows fenced on
the stage's stream."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from stoker import gpu

torch = pytest.importorskip("torch")

STREAM = 7
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class Stream:
    """Stands in for ``torch.cuda.Stream``."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.cuda_stream = STREAM

    def synchronize(self) -> None:
        pass


class Event:
    """Stands in for ``torch.cuda.Event``."""

    def record(self, stream: Any) -> None:
        self.stream = stream


class Cuda:
    Stream = Stream
    Event = Event

    @staticmethod
    def stream(stream: Any) -> Any:
        return contextlib.nullcontext()


class CpuTorch:
    """torch, with CUDA devices, streams and events on the CPU, and ``as_tensor`` of lane
    rows giving their host array."""

    cuda = Cuda

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def device(self, kind: str, index: int = 0) -> Any:
        return torch.device("cpu")

    def as_tensor(self, rows: Any, device: Any = None) -> Any:
        return torch.from_numpy(rows.array.copy())


class Buffer(np.ndarray):
    """A host buffer of the batch (a slot's tensor, or the places), recording its fences."""

    fenced: list[int]

    @staticmethod
    def of(array: np.ndarray) -> Buffer:
        buffer = np.ascontiguousarray(array).view(np.uint8).reshape(-1).view(Buffer)
        buffer.fenced = []
        return buffer

    def release_after(self, stream: int) -> None:
        self.fenced.append(stream)


@dataclass
class Rows:
    """Stands in for the lane's ``DeviceRows``: the rows as the array interface gives them
    (bfloat16 as int16 bit patterns), their batch rows, and the fences asked of them."""

    array: np.ndarray
    positions: list[int]
    dtype: str
    tail_applied: bool
    waited: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def wait(self, stream: int) -> None:
        self.waited.append(stream)

    def keep_until(self, stream: int) -> None:
        self.kept.append(stream)


def tail_of(layout: str, memory_format: str, dtype: str, normalize: bool) -> gpu.DeviceTail:
    return gpu.DeviceTail(
        normalize=(MEAN, STD) if normalize else None,
        layout=layout,
        dtype=dtype,
        memory_format=memory_format,
    )


def expected_image(tail: gpu.DeviceTail, nhwc: Any) -> Any:
    """What the tail makes of uint8 NHWC images, as plain torch computes it."""
    source = nhwc if tail.layout == "NHWC" else nhwc.permute(0, 3, 1, 2)
    affine = tail.affine()
    if affine is None:
        values = source.clone()
    else:
        shape = (1, 1, 1, 3) if tail.layout == "NHWC" else (1, 3, 1, 1)
        scale = torch.tensor(affine[0], dtype=torch.float32).view(shape)
        shift = torch.tensor(affine[1], dtype=torch.float32).view(shape)
        values = torch.addcmul(shift, source.float(), scale)
    values = values.to(getattr(torch, tail.dtype))
    if tail.layout == "NCHW" and tail.memory_format == "channels_last":
        return values.contiguous(memory_format=torch.channels_last)
    return values.contiguous()


def lane_rows(tail: gpu.DeviceTail, nhwc: Any, positions: list[int], fused: bool) -> Rows:
    """The lane's rows of ``positions`` as its kernel leaves them: uint8 NHWC, or with the
    tail fused, the tail's values in its memory order (planes, or interleaved)."""
    chosen = nhwc[positions]
    if not fused:
        return Rows(chosen.numpy().copy(), positions, "uint8", False)
    made = expected_image(tail, chosen)
    if tail.layout == "NCHW" and not tail.planar():
        made = made.permute(0, 2, 3, 1)  # channels_last: the interleaved memory
    made = made.contiguous()
    array = made.view(torch.int16).numpy() if tail.dtype == "bfloat16" else made.numpy()
    return Rows(array.copy(), positions, tail.dtype, True)


TAILS = [
    ("NCHW", "channels_last", "bfloat16", True),
    ("NCHW", "contiguous", "float32", True),
    ("NHWC", "contiguous", "float16", True),
    ("NCHW", "contiguous", "float32", False),
    ("NCHW", "contiguous", "uint8", False),
]


@pytest.mark.parametrize(("layout", "memory_format", "dtype", "normalize"), TAILS)
@pytest.mark.parametrize("lane_share", ["none", "some", "all"])
@pytest.mark.parametrize("fused", [False, True])
def test_the_stage_builds_the_tails_batch_from_the_slot_and_the_lanes_rows(
    layout: str, memory_format: str, dtype: str, normalize: bool, lane_share: str, fused: bool
) -> None:
    tail = tail_of(layout, memory_format, dtype, normalize)
    stage = gpu.DeviceStage(CpuTorch(), 0, tail)
    generator = torch.Generator().manual_seed(3)
    batch, height, width = 6, 5, 4
    truth = torch.randint(0, 256, (batch, height, width, 3), dtype=torch.uint8, generator=generator)
    positions = {"none": [], "some": [4, 1, 3], "all": [5, 0, 2, 1, 4, 3]}[lane_share]
    # The slot holds the CPU's rows; those the lane built are left as zeros there.
    slot = truth.clone()
    slot[positions] = 0
    image = Buffer.of(slot.numpy())
    labels = Buffer.of(np.arange(batch, dtype=np.int64))
    places = Buffer.of(np.array(positions, dtype=np.int64)) if positions else None
    rows = lane_rows(tail, truth, positions, fused) if positions else None
    tensors = [
        ("image", "uint8", (batch, height, width, 3), image),
        ("label", "int64", (batch,), labels),
    ]
    out, ready = stage.stage(tensors, rows, places)

    want = expected_image(tail, truth)
    got = out["image"]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.stride() == want.stride(), (got.stride(), want.stride())
    assert torch.equal(got, want)
    assert torch.equal(out["label"], torch.arange(batch))
    assert ready.stream.cuda_stream == STREAM
    assert image.fenced == [STREAM] and labels.fenced == [STREAM]
    if rows is not None:
        assert rows.waited == [STREAM] and rows.kept == [STREAM]
        assert places is not None and places.fenced == [STREAM]


def test_lane_rows_without_their_places_go_where_their_positions_say() -> None:
    """Places that found no page-locked room come as the rows' own positions."""
    tail = tail_of("NHWC", "contiguous", "uint8", False)
    stage = gpu.DeviceStage(CpuTorch(), 0, tail)
    truth = torch.arange(4 * 2 * 2 * 3, dtype=torch.uint8).view(4, 2, 2, 3)
    slot = truth.clone()
    slot[[2, 0]] = 0
    rows = lane_rows(tail, truth, [2, 0], fused=False)
    out, _ = stage.stage([("image", "uint8", (4, 2, 2, 3), Buffer.of(slot.numpy()))], rows, None)
    assert torch.equal(out["image"], truth)
    assert rows.kept == [STREAM]
