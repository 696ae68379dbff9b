#!/usr/bin/env python3
"""Where the GPU's time goes while the decode lane feeds a training loop.

Trains ResNet-18 (as ``benches/gpu_train.py`` does) on synthetic data (the ceiling), then fed by
``stoker.Loader`` with each ``--decode`` mode, and profiles ``--steps`` steps of each with
torch's profiler (CUPTI: every kernel, copy and CUDA call of the process, the lane's threads
included). Prints per run: images/s, the model's kernel time per step, GPU time per stream
(kernels, copies, memsets), the kernels that are not the model's, and the CUDA calls by
thread with their counts and time. With ``--side-stream`` each loader run is repeated with the
training step on a non-blocking side stream instead of torch's default (legacy) stream.
Chrome traces go to ``$OUT`` when it is set.

    python3 benches/gpu/lane_profile.py --data /tmp/stoker-gpu-bench-data --decode gpu,auto
"""

from __future__ import annotations

import argparse
import collections
import gzip
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_train import MEAN, STD, Model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--decode", default="gpu")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--side-stream", action="store_true")
    args = parser.parse_args()

    import torch
    import torchvision

    import stoker

    if not torch.cuda.is_available():
        print("lane_profile: no CUDA GPU here; nothing to measure")
        return 0
    torch.backends.cudnn.benchmark = True
    model = Model(torch, torchvision, "resnet18", 256)
    print(torch.cuda.get_device_name(), len(os.sched_getaffinity(0)), "cores", flush=True)

    images = torch.randn(256, 3, 224, 224, device="cuda").contiguous(
        memory_format=torch.channels_last
    )
    labels = torch.randint(0, 1000, (256,), device="cuda")
    runs: list[tuple[str, str | None, bool]] = [("ceiling", None, False)]
    for decode in args.decode.split(","):
        runs.append((f"decode={decode}", decode, False))
        if args.side_stream:
            runs.append((f"decode={decode} side stream", decode, True))
    model_kernels: set[str] = set()
    for name, decode, side_stream in runs:
        loader = None
        batches: Any = None
        if decode is not None:
            pipeline = [
                *stoker.vision.imagenet_train(224)[:-1],
                stoker.ops.Normalize(MEAN, STD),
            ]
            loader = stoker.Loader(
                str(args.data),
                pipeline=pipeline,
                batch_size=256,
                num_threads=args.threads,
                drop_last=True,
                device="cuda",
                dtype="bfloat16",
                memory_format="channels_last",
                decode=decode,  # type: ignore[arg-type]
            )
            batches = forever(loader)

        def fetch(batches: Any = batches) -> tuple[Any, Any]:
            if batches is None:
                return images, labels
            b = next(batches)
            return b["image"], b["label"]

        side = torch.cuda.Stream() if side_stream else None  # type: ignore[no-untyped-call]
        with torch.cuda.stream(side) if side is not None else nullcontext():
            for _ in range(args.warmup):
                model.step(*fetch())
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(args.steps * 3):
                model.step(*fetch())
            torch.cuda.synchronize()
            rate = args.steps * 3 * 256 / (time.perf_counter() - started)
            with torch.profiler.profile(
                activities=[
                    torch.profiler.ProfilerActivity.CPU,
                    torch.profiler.ProfilerActivity.CUDA,
                ]
            ) as profile:
                for _ in range(args.steps):
                    model.step(*fetch())
                torch.cuda.synchronize()
        print(f"\n== {name}: {rate:.0f} img/s unprofiled", flush=True)
        if loader is not None:
            print("   lane:", loader.stats().get("gpu_decode"))
            loader.close()
        events = trace_events(profile, name)
        if name == "ceiling":
            model_kernels = {e["name"] for e in events if e.get("cat") == "kernel"}
        summarise(events, args.steps, model_kernels)
    return 0


class nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def forever(loader: Any) -> Any:
    while True:
        yield from loader


def trace_events(profile: Any, name: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        profile.export_chrome_trace(str(path))
        text = path.read_text()
    out = os.environ.get("OUT")
    if out:
        slug = name.replace("=", "-").replace(" ", "-")
        with gzip.open(Path(out) / f"trace-{slug}.json.gz", "wt") as f:
            f.write(text)
    data = json.loads(text)
    return [e for e in data.get("traceEvents", []) if e.get("ph") == "X"]


def summarise(events: list[dict[str, Any]], steps: int, model_kernels: set[str]) -> None:
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        print("   no GPU events")
        return
    start = min(e["ts"] for e in gpu)
    end = max(e["ts"] + e["dur"] for e in gpu)
    print(f"   GPU span {(end - start) / 1e3:.1f} ms for {steps} steps")
    model_us = sum(e["dur"] for e in gpu if e.get("cat") == "kernel" and e["name"] in model_kernels)
    print(f"   model kernels {model_us / 1e3 / steps:.2f} ms per step")
    per_stream: dict[Any, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for e in gpu:
        per_stream[e.get("args", {}).get("stream", e.get("tid"))][e["cat"]] += e["dur"]
    for stream, kinds in sorted(per_stream.items(), key=lambda kv: -sum(kv[1].values())):
        text = ", ".join(f"{k} {v / 1e3:.1f} ms" for k, v in kinds.items())
        print(f"   stream {stream}: {text}")
    others: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for e in gpu:
        if e.get("cat") != "kernel" or e["name"] not in model_kernels:
            key = f"{e['cat']}: {e['name'][:90]}"
            others[key] += e["dur"]
            counts[key] += 1
    for key, us in others.most_common(14):
        print(f"   not the model's: {us / 1e3:8.2f} ms x{counts[key]:5}  {key}")
    late_launches(events, gpu, model_kernels)
    calls: collections.Counter[tuple[Any, str]] = collections.Counter()
    call_counts: collections.Counter[tuple[Any, str]] = collections.Counter()
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            call = (e.get("tid"), e["name"])
            calls[call] += e["dur"]
            call_counts[call] += 1
    for (tid, name), us in calls.most_common(22):
        print(f"   call thread {tid}: {name:36} x{call_counts[(tid, name)]:6} {us / 1e3:9.2f} ms")


def late_launches(
    events: list[dict[str, Any]], gpu: list[dict[str, Any]], model_kernels: set[str]
) -> None:
    """The training stream's idle gaps (over 20 us between two of its operations), split by
    cause: the CPU queued the next operation only after the gap began (a late launch, by
    thread), or it was queued before and waited for another stream."""
    busy: collections.Counter[Any] = collections.Counter()
    for e in gpu:
        if e["name"] in model_kernels:
            busy[e.get("args", {}).get("stream")] += e["dur"]
    if not busy:
        return
    stream = busy.most_common(1)[0][0]
    ops = sorted(
        (e for e in gpu if e.get("args", {}).get("stream") == stream),
        key=lambda e: e["ts"],
    )
    launches = {
        e.get("args", {}).get("correlation"): e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
    }
    causes: collections.Counter[str] = collections.Counter()
    for previous, op in itertools.pairwise(ops):
        free = previous["ts"] + previous["dur"]
        gap = op["ts"] - free
        if gap <= 20:
            continue
        launch = launches.get(op.get("args", {}).get("correlation"))
        if launch is None:
            causes["no launch found"] += gap
        elif launch["ts"] + launch["dur"] > free:
            causes[f"launched late by thread {launch.get('tid')}"] += gap
        else:
            causes["queued in time, waited for another stream"] += gap
    total = sum(causes.values())
    print(f"   training stream {stream}: idle gaps {total / 1e3:.1f} ms")
    for cause, us in causes.most_common():
        print(f"     {cause}: {us / 1e3:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
