#!/usr/bin/env python3
"""nvJPEG's hardware decoder alone and beside a training step: what bounds the GPU decode lane.

Decodes one batch of baseline JPEGs from ``--data`` (progressive ones and PNGs left out: the
engines decline them) with nvJPEG's batched hardware decoder, called directly through ctypes
(no Stoker code), for each output format in ``--formats`` (``rgbi``: interleaved RGB, what the
lane asks for; ``yuv``: planar YUV). Prints, per format: the GPU work one batch queues (from
torch's profiler), batches per second decoded alone, then the decode rate and ResNet-18's
training rate (as in ``benches/gpu_train.py``: bfloat16, channels_last, batch 256, synthetic
data on the GPU) while a thread decodes beside the training loop. The ceiling (training alone)
is printed first. ``--states 1,2,4`` then measures, for interleaved RGB, that many decode states
at once (a thread each, as the lane's pipes), alone and beside training; ``--side-stream``
trains on a stream of its own rather than the legacy default stream. Without a CUDA GPU or
nvJPEG it says so and exits 0.

    python3 benches/gpu/nvjpeg_beside_training.py --data /tmp/stoker-gpu-bench-data
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_train import Model

BACKEND_HARDWARE = 3
FORMATS = {"rgbi": 5, "yuv": 1}


class NvImage(ctypes.Structure):
    """``nvjpegImage_t``."""

    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--formats", default="rgbi,yuv")
    parser.add_argument("--states", default="", help="counts of decode states at once, e.g. 1,2,4")
    parser.add_argument(
        "--side-stream",
        action="store_true",
        help="train on a stream of its own instead of the legacy default stream",
    )
    args = parser.parse_args()
    import torch
    import torchvision

    if not torch.cuda.is_available():
        print("nvjpeg_beside_training: no CUDA GPU here; nothing to measure")
        return 0
    nvjpeg = load_nvjpeg()
    if nvjpeg is None:
        print("nvjpeg_beside_training: libnvjpeg.so.13 not found; nothing to measure")
        return 0
    torch.empty(1, device="cuda")
    handle = new_handle(nvjpeg)
    files = baseline_jpegs(args.data, args.images)
    print(
        f"{torch.cuda.get_device_name()}, {len(os.sched_getaffinity(0))} cores: "
        f"{len(files)} JPEGs of {sum(map(len, files)) // max(1, len(files))} bytes on average; "
        f"training on {'a side stream' if args.side_stream else 'the default stream'}",
        flush=True,
    )

    if args.side_stream:
        torch.cuda.set_stream(torch.cuda.Stream())
    model = Model(torch, torchvision, "resnet18", 256)
    images = torch.randn(256, 3, 224, 224, device="cuda").contiguous(
        memory_format=torch.channels_last
    )
    labels = torch.randint(0, 1000, (256,), device="cuda")

    def train(seconds: float) -> float:
        torch.cuda.synchronize()
        started, steps = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            model.step(images, labels)
            steps += 1
        torch.cuda.synchronize()
        return steps * 256 / (time.perf_counter() - started)

    train(1.0)
    print(f"ResNet-18 alone: {train(args.seconds):.0f} img/s", flush=True)
    for name in filter(None, args.formats.split(",")):
        batch = Batch(torch, nvjpeg, handle, files, FORMATS[name])
        batch.decode()
        started = time.perf_counter()
        for _ in range(6):
            batch.decode()
        alone = 6 * len(files) / (time.perf_counter() - started)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            batch.decode()
        work: dict[str, int] = {}
        for event in profile.events():
            if str(event.device_type).endswith("CUDA"):
                work[event.name[:50]] = work.get(event.name[:50], 0) + 1
        print(f"{name}: one batch queues {work}", flush=True)
        print(f"{name}: decoded alone {alone:.0f} img/s", flush=True)
        rate, training = decode_at_once([batch], lambda: train(args.seconds))
        print(
            f"{name}: beside training, decoded {rate:.0f} img/s while ResNet-18 trained at "
            f"{training:.0f} img/s",
            flush=True,
        )
    for count in [int(n) for n in args.states.split(",") if n]:
        batches = [
            Batch(torch, nvjpeg, new_handle(nvjpeg), files, FORMATS["rgbi"]) for _ in range(count)
        ]
        for each in batches:
            each.decode()
        alone = decode_at_once(batches, lambda: time.sleep(args.seconds) or 0.0)
        beside = decode_at_once(batches, lambda: train(args.seconds))
        print(
            f"rgbi, {count} states at once: decoded alone {alone[0]:.0f} img/s; beside "
            f"training, decoded {beside[0]:.0f} img/s while ResNet-18 trained at "
            f"{beside[1]:.0f} img/s",
            flush=True,
        )
    return 0


def decode_at_once(batches: list[Batch], during: Any) -> tuple[float, float]:
    """Images per second that ``batches`` decode, a thread each, while ``during()`` runs, and
    what ``during()`` returned."""
    stop = threading.Event()
    decoded = [0] * len(batches)
    failures: list[BaseException] = []

    def decode_until_stopped(k: int) -> None:
        try:
            while not stop.is_set():
                batches[k].decode()
                decoded[k] += batches[k].count
        except BaseException as error:  # SystemExit from check() too: a thread hides it
            failures.append(error)

    threads = [
        threading.Thread(target=decode_until_stopped, args=(k,)) for k in range(len(batches))
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    before, started = sum(decoded), time.perf_counter()
    result = during()
    rate = (sum(decoded) - before) / (time.perf_counter() - started)
    stop.set()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"a decode thread failed: {failures[0]!r}")
    return rate, result


def load_nvjpeg() -> Any:
    """nvJPEG 13 from NVIDIA's wheels on ``sys.path``, the toolkit, or the loader's search."""
    dirs = [
        lib
        for entry in sys.path
        for lib in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib")))
    ]
    dirs.append("/usr/local/cuda/lib64")
    for path in [os.path.join(d, "libnvjpeg.so.13") for d in dirs] + ["libnvjpeg.so.13"]:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def new_handle(nvjpeg: Any) -> Any:
    """A handle on nvJPEG's hardware backend."""
    handle = ctypes.c_void_p()
    check(
        nvjpeg.nvjpegCreateEx(BACKEND_HARDWARE, None, None, 0, ctypes.byref(handle)),
        "create",
    )
    return handle


def check(status: int, call: str) -> None:
    if status != 0:
        raise SystemExit(f"nvjpeg {call} failed with status {status}")


def baseline_jpegs(data: Path, count: int) -> list[bytes]:
    """Up to ``count`` baseline RGB or grey JPEGs under ``data``."""
    from PIL import Image

    found: list[bytes] = []
    for path in sorted(data.rglob("*")):
        if len(found) == count:
            break
        if not path.is_file():
            continue
        try:
            with Image.open(path) as image:
                baseline = (
                    image.format == "JPEG"
                    and not image.info.get("progressive")
                    and not image.info.get("progression")
                    and image.mode in ("RGB", "L")
                )
        except OSError:
            continue
        if baseline:
            found.append(path.read_bytes())
    if not found:
        raise SystemExit(f"no baseline JPEG under {data}")
    return found


class Batch:
    """One batch of encoded images, its decode state, and device outputs for one format."""

    def __init__(
        self, torch: Any, nvjpeg: Any, handle: Any, files: list[bytes], output: int
    ) -> None:
        self._nvjpeg = nvjpeg
        self._handle = handle
        self._output = output
        self.count = len(files)
        self._state = ctypes.c_void_p()
        check(nvjpeg.nvjpegJpegStateCreate(handle, ctypes.byref(self._state)), "state")
        self._outputs = (NvImage * len(files))()
        self._buffers: list[Any] = []
        for k, data in enumerate(files):
            components, widths, heights = self._info(data)
            planes = 1 if output == FORMATS["rgbi"] else 3
            for plane in range(planes):
                own = plane < components and widths[plane] > 0
                width = widths[plane] if own else widths[0]
                height = heights[plane] if own else heights[0]
                pitch = width * 3 if planes == 1 else width
                buffer = torch.empty(pitch * height, dtype=torch.uint8, device="cuda")
                self._buffers.append(buffer)
                self._outputs[k].channel[plane] = buffer.data_ptr()
                self._outputs[k].pitch[plane] = pitch
        self._data = (ctypes.c_char_p * len(files))(*files)
        self._lengths = (ctypes.c_size_t * len(files))(*map(len, files))
        self._stream = torch.cuda.Stream(priority=-1)

    def _info(self, data: bytes) -> tuple[int, list[int], list[int]]:
        components, subsampling = ctypes.c_int(), ctypes.c_int()
        widths, heights = (ctypes.c_int * 4)(), (ctypes.c_int * 4)()
        check(
            self._nvjpeg.nvjpegGetImageInfo(
                self._handle,
                data,
                ctypes.c_size_t(len(data)),
                ctypes.byref(components),
                ctypes.byref(subsampling),
                widths,
                heights,
            ),
            "GetImageInfo",
        )
        return components.value, list(widths), list(heights)

    def decode(self) -> None:
        """Decodes the batch and waits for it."""
        nvjpeg = self._nvjpeg
        check(
            nvjpeg.nvjpegDecodeBatchedInitialize(
                self._handle, self._state, self.count, 1, self._output
            ),
            "DecodeBatchedInitialize",
        )
        check(
            nvjpeg.nvjpegDecodeBatched(
                self._handle,
                self._state,
                self._data,
                self._lengths,
                self._outputs,
                ctypes.c_void_p(self._stream.cuda_stream),
            ),
            "DecodeBatched",
        )
        self._stream.synchronize()


if __name__ == "__main__":
    sys.exit(main())
