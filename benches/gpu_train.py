#!/usr/bin/env python3
"""A training loop on the GPU fed by each loader, side by side in one run.

ResNet-18 and ResNet-50 from torchvision, bfloat16 autocast, channels_last, SGD, batches of
256 JPEGs cropped to 224 (RandomResizedCrop and a horizontal flip), for each of:

- ceiling: one synthetic batch already on the GPU, normalised (what the model alone does);
- DataLoader: torchvision ImageFolder, PIL + v2 RandomResizedCrop, ``--workers`` worker
  processes, pin_memory=True; the loop copies with ``.cuda(non_blocking=True)`` and normalises;
- Stoker, CPU output: ``stoker.Loader`` with ``--workers`` decode threads, uint8 NHWC in host
  memory; the loop copies and normalises as for DataLoader;
- Stoker, device="cuda": the same loader delivering normalised bfloat16 channels_last batches
  on the GPU (page-locked slots, the copy and the normalisation on the loader's own stream);
- Stoker, decode="gpu" / decode="auto": the same, with the GPU decode lane taking every row
  the JPEG engines decode, or a share of each batch by the measured rates;
- DALI (``dali``, ``dali-hwNN``): NVIDIA DALI's pipeline in the same process:
  ``fn.readers.file`` over the same folder (shuffled), ``fn.decoders.image`` on the ``mixed``
  device (nvJPEG's hardware decoder taking ``--dali-hw-load`` of each batch, or NN/100 for
  ``dali-hwNN``; the CUDA decoder the rest), ``fn.random_resized_crop`` to 224,
  ``fn.crop_mirror_normalize`` with a random flip to float16 NHWC, which the loop takes as
  channels_last NCHW (bfloat16 autocast casts it as it casts Stoker's bfloat16);
  ``--workers`` CPU threads, ``--dali-prefetch`` batches queued. ``dali-crop`` (and
  ``dali-crop-hwNN``) is the pipeline DALI's own ResNet-50 example builds: the crop window
  drawn by the decoder, which decodes it alone (``fn.decoders.image_random_crop``, with
  RandomResizedCrop's area and aspect ranges and torchvision's 10 attempts), then
  ``fn.resize`` to 224 and the same normalisation. Needs ``nvidia-dali-cuda130`` (or
  ``-cuda120``); without it the row says so and is skipped.

- Stoker in a helper process (``helper-cuda``, ``helper-gpu``, ``helper-auto``): the Stoker
  row of the same name in a process of its own with its own CUDA context, its device batches
  handed to the training process through torch's CUDA IPC (4 in flight): whether the lane
  slows the step from inside the training process (its threads, the driver's locks of one
  context) or on the GPU itself. Run under MPS (``nvidia-cuda-mps-control -d``) the two
  contexts' kernels share the GPU at once rather than in time slices.

A row named ``ROW@N`` runs with N decode threads instead of ``--workers`` (``stoker-auto@7``:
a node with fewer cores per GPU). ``stoker-gpu-smsN`` and ``stoker-auto-smsN`` run the lane's
pipes each in a green context of at least N SMs (``STOKER_GPU_DECODE_SMS``, set for the row
alone; CUDA 12.5 drivers and later), so the lane's kernels keep to those SMs while the step still
has every one: whether the lane slows the step by taking its SMs. ``-fused`` in a Stoker row's
name (``stoker-auto-fused``, ``helper-gpu-fused``) has the lane's crop kernel write the
normalised bfloat16 rows itself (``STOKER_GPU_DECODE_FUSED_TAIL=1``, set for the row alone), so
the loader's stage copies them into place without its own normalising pass for a batch whose
rows all came from the lane (under ``decode="gpu"``, most batches; under ``"auto"``, only at a
split of 16/16: other batches still get the pass): whether the stage's launches on the
training thread matter. ``-roi`` in a Stoker row's name (``stoker-auto-roi``) has the
hardware engines decode only each image's crop window, grown to whole MCUs
(``STOKER_GPU_DECODE_ROI=1``, set for the row alone), into smaller places, so each of the lane's
decode calls takes more images: whether the lane's per-call host work and the engines' full
decodes are what slow the step. ``-laneproc`` in a Stoker row's name (``stoker-auto-laneproc``) runs
the decode lane alone in Stoker's own helper process, ``stoker-lane-helper`` (from
``$STOKER_BIN_DIR``, else as ``STOKER_GPU_DECODE_HELPER=1`` finds the package's command: the
installation's scripts folders, beside ``sys.executable``, then ``PATH``; set for
the row alone): the decode threads stay in the training process and the lane's CUDA calls move
to a context of their own, its rows reaching the loop through CUDA IPC. A row named ``loader:ROW``
runs the loader alone, without the model (its images/s is what decoding and cropping
deliver). ``--side-stream`` runs every row's loop on a stream of its own (set current) instead
of the legacy default stream; ``--gpu-memory`` sets the lane's ``gpu_memory`` in MiB.
``--compile`` runs the model as fast-model users do, ``torch.compile(mode="reduce-overhead")``
(its forward and backward replayed as CUDA graphs, so the step's launches no longer come one by
one from the loop's thread); compiling happens in the first row's warm-up, so give
``--warmup`` room (30 or more).

Per row: images/s over ``--steps`` steps after ``--warmup`` (CUDA synchronised at both ends),
its share of the ceiling, host wait % (time inside ``next()`` and the loop's own copy), GPU
idle % (events on the training stream before ``next()`` and after the batch's copy was queued:
the time the stream had nothing to do but wait for data), ceiling x (1 - GPU idle) against the
measured rate, build (seconds to make the loader) and first batch (seconds from the loader
built to the first batch in the loop's hands; CUDA's own start-up is measured once, apart).
A JSON object with every figure is printed last.
Without a CUDA GPU it says so and exits 0.

    python3 benches/gpu_train.py --data /tmp/imagenet-like --workers 15
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CROP = 224
#: Green contexts of this many SMs for the lane's pipes (read as the lane starts).
SMS_VARIABLE = "STOKER_GPU_DECODE_SMS"
#: The lane's kernel applies the device stage's tail (read as the lane starts).
FUSED_VARIABLE = "STOKER_GPU_DECODE_FUSED_TAIL"
#: The lane decodes only each image's crop window (read as the lane starts).
ROI_VARIABLE = "STOKER_GPU_DECODE_ROI"
#: The lane runs in the stoker-lane-helper process (read as the lane starts).
HELPER_VARIABLE = "STOKER_GPU_DECODE_HELPER"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/stoker-gpu-bench-data"))
    parser.add_argument(
        "--count",
        type=int,
        default=10_000,
        help="images to make when --data is missing",
    )
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1)
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rows", default="ceiling,dataloader,stoker-cpu,stoker-cuda")
    parser.add_argument(
        "--gpu-memory",
        type=int,
        default=None,
        help="the GPU decode lane's gpu_memory in MiB (default: the loader's)",
    )
    parser.add_argument(
        "--dali-hw-load",
        type=float,
        default=0.65,
        help="share of each batch DALI's mixed decoder gives the hardware engines (DALI's default)",
    )
    parser.add_argument(
        "--dali-prefetch", type=int, default=2, help="DALI's prefetch_queue_depth"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help='run the model under torch.compile(mode="reduce-overhead") (CUDA graphs)',
    )
    parser.add_argument(
        "--side-stream",
        action="store_true",
        help="train (and take batches) on a stream of its own instead of the legacy default one",
    )
    args = parser.parse_args()

    try:
        import torch
    except ImportError as error:
        print(f"gpu_train: torch is not importable ({error}); nothing to measure")
        return 0
    if torch.version.cuda is None or not torch.cuda.is_available():
        print(
            f"gpu_train: no CUDA GPU here (torch {torch.__version__}); nothing to measure"
        )
        return 0
    import torchvision

    import stoker

    started = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    cuda_startup_s = time.perf_counter() - started
    if not args.data.exists():
        made = time.perf_counter()
        stoker._native.make_dataset(str(args.data), args.count, seed=0)
        print(
            f"made {args.count} images in {args.data} in {time.perf_counter() - made:.1f} s"
        )
    torch.backends.cudnn.benchmark = True
    device_name = torch.cuda.get_device_name()
    cores = len(os.sched_getaffinity(0))
    print(
        f"{device_name}, {cores} cores, torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}, stoker {stoker.__version__}; batch {args.batch_size}, "
        f"{args.workers} workers/threads, {args.steps} steps after {args.warmup}; CUDA start-up "
        f"{cuda_startup_s:.2f} s{'; on a side stream' if args.side_stream else ''}"
        f"{'; model compiled (reduce-overhead)' if args.compile else ''}",
        flush=True,
    )
    rows = args.rows.split(",")
    results: list[dict[str, Any]] = []
    if args.side_stream:
        torch.cuda.set_stream(torch.cuda.Stream())
    for model_name in args.models.split(","):
        model = Model(torch, torchvision, model_name, args.batch_size, args.compile)
        ceiling = None
        for row in rows:
            result = run_row(torch, torchvision, stoker, model, row, args)
            result["model"] = model_name
            if row == "ceiling":
                ceiling = result["images_per_s"]
            if ceiling and result["trains"]:
                result["share_of_ceiling"] = result["images_per_s"] / ceiling
                result["ceiling_x_busy"] = ceiling * (1.0 - result["gpu_idle_fraction"])
            results.append(result)
            print_row(result, flush=True)
        del model
        torch.cuda.empty_cache()
    print(
        json.dumps(
            {
                "device": device_name,
                "cores": cores,
                "cuda_startup_s": cuda_startup_s,
                "batch_size": args.batch_size,
                "workers": args.workers,
                "steps": args.steps,
                "compiled": args.compile,
                "rows": results,
            }
        )
    )
    return 0


class Model:
    """The network, its optimiser and one bf16 training step on a device batch."""

    def __init__(
        self, torch: Any, torchvision: Any, name: str, batch_size: int, compiled: bool = False
    ) -> None:
        self.torch = torch
        self.net = getattr(torchvision.models, name)(num_classes=1000).cuda()
        self.net = self.net.to(memory_format=torch.channels_last)
        if compiled:
            self.net = torch.compile(self.net, mode="reduce-overhead")
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        self.mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255
        self.batch_size = batch_size

    def normalise(self, images: Any, nhwc: bool) -> Any:
        """uint8 on the device (NHWC or NCHW) -> normalised, channels_last."""
        nchw = images.permute(0, 3, 1, 2) if nhwc else images
        out = (nchw.float() - self.mean) / self.std
        return out.contiguous(memory_format=self.torch.channels_last)

    def step(self, images: Any, labels: Any) -> None:
        torch = self.torch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.net(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def forever(make: Callable[[], Any]) -> Iterator[Any]:
    """Batches epoch after epoch."""
    loader = make()
    while True:
        yield from loader


def row_parts(row: str, workers: int) -> tuple[bool, str, int, str, bool, bool, bool]:
    """What a row's name asks for (see the module doc): whether it trains (not ``loader:``),
    its kind (``stoker-auto``, ``dali``...), its thread count (``@N``, else ``workers``), the
    green context's SMs (``-smsN``, else ""), whether the lane's kernel applies the tail
    (``-fused``), whether the lane runs in ``stoker-lane-helper`` (``-laneproc``) and whether
    it decodes crop windows alone (``-roi``)."""
    alone, _, name = row.rpartition(":")
    lane_process = "-laneproc" in name
    roi = "-roi" in name
    name = name.replace("-laneproc", "").replace("-roi", "")
    kind, _, threads = name.partition("@")
    fused = "-fused" in kind
    kind, _, sms = kind.replace("-fused", "").partition("-sms")
    threads_used = int(threads) if threads else workers
    return alone != "loader", kind, threads_used, sms, fused, lane_process, roi


def run_row(
    torch: Any, torchvision: Any, stoker: Any, model: Model, row: str, args: Any
) -> dict[str, Any]:
    batch = args.batch_size
    train, kind, workers, sms, fused, lane_process, roi = row_parts(row, args.workers)
    closers: list[Callable[[], None]] = []
    folder = os.environ.get("STOKER_BIN_DIR")
    helper = str(Path(folder) / "stoker-lane-helper") if folder else "1"
    # The variables the row's name asks for, set for the row alone; each row starts without
    # the others (a row that failed may not have cleared them).
    asked = {
        HELPER_VARIABLE: helper if lane_process else None,
        SMS_VARIABLE: sms or None,
        FUSED_VARIABLE: "1" if fused else None,
        ROI_VARIABLE: "1" if roi else None,
    }
    for variable, value in asked.items():
        os.environ.pop(variable, None)
        if value is not None:
            os.environ[variable] = value
            closers.append(lambda variable=variable: os.environ.pop(variable, None))
    built = time.perf_counter()
    if kind == "ceiling":
        images = torch.randn(batch, 3, CROP, CROP, device="cuda").contiguous(
            memory_format=torch.channels_last
        )
        labels = torch.randint(0, 1000, (batch,), device="cuda")

        def fetch() -> tuple[Any, Any]:
            return images, labels

        extra = {}
    elif kind == "dataloader":
        from torchvision.transforms import v2

        transform = v2.Compose(
            [
                v2.RandomResizedCrop(CROP, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
            ]
        )
        dataset = torchvision.datasets.ImageFolder(str(args.data), transform=transform)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch,
            shuffle=True,
            num_workers=workers,
            pin_memory=True,
            drop_last=True,
            persistent_workers=True,
        )
        batches = forever(lambda: loader)

        def fetch() -> tuple[Any, Any]:
            x, y = next(batches)
            return model.normalise(x.cuda(non_blocking=True), nhwc=False), y.cuda(
                non_blocking=True
            )

        extra = {}
    elif kind in ("stoker-cpu", "stoker-cuda", "stoker-gpu", "stoker-auto"):
        on_device = kind != "stoker-cpu"
        loader = stoker_loader(stoker, kind, str(args.data), batch, workers, args.gpu_memory)
        closers.append(loader.close)
        batches = forever(lambda: loader)

        def fetch() -> tuple[Any, Any]:
            b = next(batches)
            if on_device:
                return b["image"], b["label"]
            x = b["image"].cuda(non_blocking=True)
            return model.normalise(x, nhwc=True), b["label"].cuda(non_blocking=True)

        extra = {"loader": loader}
    elif kind in ("helper-cuda", "helper-gpu", "helper-auto"):
        helper = Helper(
            torch, kind.replace("helper-", "stoker-"), args.data, batch, workers, args.gpu_memory
        )
        closers.append(helper.close)

        def fetch() -> tuple[Any, Any]:
            return helper.next()

        extra = {"helper": helper}
    elif kind == "dali" or kind.startswith(("dali-hw", "dali-crop")):
        random_crop = kind.startswith("dali-crop")
        hw = kind.removeprefix("dali-crop" if random_crop else "dali").removeprefix("-hw")
        hw_load = int(hw) / 100 if hw else args.dali_hw_load
        made = dali_batches(
            torch, args.data, batch, workers, hw_load, args.dali_prefetch, random_crop
        )
        if isinstance(made, str):
            return {"row": row, "skipped": made, "trains": False}
        dali_fetch = made

        def fetch() -> tuple[Any, Any]:
            return dali_fetch()

        extra = {}
    else:
        raise SystemExit(f"unknown row {row!r}")

    build_s = time.perf_counter() - built
    built = time.perf_counter()
    first = None
    wait_s = 0.0
    pairs = []
    # decode="auto": the split at every 16th step, where it may change (each change once).
    splits: list[int] = []
    for index in range(args.warmup + args.steps):
        if "loader" in extra and index % 16 == 0:
            split = extra["loader"].state_dict().get("decode_split")
            if split is not None and (not splits or splits[-1] != split[1]):
                splits.append(split[1])
        if index == args.warmup:
            torch.cuda.synchronize()
            clock = time.perf_counter()
            wait_s = 0.0
            pairs.clear()
        before = torch.cuda.Event(enable_timing=True)
        after = torch.cuda.Event(enable_timing=True)
        before.record()
        asked = time.perf_counter()
        images, labels = fetch()
        wait_s += time.perf_counter() - asked
        after.record()
        pairs.append((before, after))
        if first is None:
            first = time.perf_counter() - built
        if train:
            model.step(images, labels)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - clock
    idle_ms = sum(b.elapsed_time(a) for b, a in pairs)
    result: dict[str, Any] = {
        "row": row,
        "images_per_s": args.steps * batch / seconds,
        "host_wait_fraction": wait_s / seconds,
        "gpu_idle_fraction": min(1.0, idle_ms / 1e3 / seconds),
        "build_s": build_s,
        "first_batch_s": first,
        "threads": workers,
        "trains": train,
    }
    if "loader" in extra:
        stats = extra["loader"].stats()
        result["stoker_gpu_idle_fraction"] = stats["gpu_idle_fraction"]
        # What the loader counts the lane beside the step to cost the GPU (to set beside the
        # step's time against the ceiling's).
        result["stoker_gpu_lane_cost_fraction"] = stats["gpu_lane_cost_fraction"]
        result["stoker_gpu_lane_quiet_steps"] = stats["gpu_lane_quiet_steps"]
        result["stoker_pinned"] = stats["pinned"]
        result["gpu_decode"] = stats.get("gpu_decode")
        if splits:
            result["decode_splits_sixteenths"] = splits
    for close in closers:
        close()
    helper_stats = extra["helper"].stats if "helper" in extra else None
    if helper_stats is not None:
        # The loader's own figures, from the helper process.
        result["gpu_decode"] = helper_stats.get("gpu_decode")
        result["stoker_gpu_lane_cost_fraction"] = helper_stats.get("gpu_lane_cost_fraction", 0.0)
        result["stoker_gpu_lane_quiet_steps"] = helper_stats.get("gpu_lane_quiet_steps", 0)
    return result


def stoker_loader(
    stoker: Any, kind: str, data: str, batch: int, workers: int, gpu_memory: int | None
) -> Any:
    """The loader of a ``stoker-*`` row: uint8 NHWC in host memory for ``stoker-cpu``, else
    normalised bfloat16 channels_last on the GPU, decoded as the row's name says."""
    pipeline = stoker.vision.imagenet_train(CROP)
    options: dict[str, Any] = {}
    if kind != "stoker-cpu":
        pipeline = [*pipeline[:-1], stoker.ops.Normalize(MEAN, STD)]
        options = {"device": "cuda", "dtype": "bfloat16", "memory_format": "channels_last"}
    if kind in ("stoker-gpu", "stoker-auto"):
        options["decode"] = kind.removeprefix("stoker-")
        if gpu_memory is not None:
            options["gpu_memory"] = gpu_memory << 20
    return stoker.Loader(
        data, pipeline=pipeline, batch_size=batch, num_threads=workers, drop_last=True, **options
    )


class Helper:
    """A ``helper-*`` row's feed: the ``stoker-*`` loader of the same name in a process of its
    own, with its own CUDA context (the experiment that tells contention inside the training
    process, its threads and its one context, from contention on the GPU itself). Each device
    batch crosses to the training process through torch's CUDA IPC (a memory handle per block
    and an IPC event; torch keeps the block alive in the helper until the trainer drops it),
    ``HELPER_DEPTH`` batches in flight at most."""

    def __init__(
        self, torch: Any, kind: str, data: Path, batch: int, workers: int, gpu_memory: int | None
    ) -> None:
        context = torch.multiprocessing.get_context("spawn")
        self.batches = context.Queue(maxsize=HELPER_DEPTH)
        self.results = context.Queue()
        self.stop = context.Event()
        self.stats: dict[str, Any] | None = None
        self.process = context.Process(
            target=helper_main,
            args=(
                *(kind, str(data), batch, workers, gpu_memory),
                *(self.batches, self.results, self.stop),
            ),
            daemon=True,
        )
        self.process.start()

    def next(self) -> tuple[Any, Any]:
        while True:
            try:
                return self.batches.get(timeout=5)
            except queue.Empty:
                if not self.process.is_alive():
                    raise SystemExit(
                        f"the helper process ended (exit {self.process.exitcode})"
                    ) from None

    def close(self) -> None:
        self.stop.set()
        try:
            self.stats = self.results.get(timeout=60)
        except queue.Empty:
            print("helper: no figures came back", flush=True)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()


HELPER_DEPTH = 4


def helper_main(
    kind: str,
    data: str,
    batch: int,
    workers: int,
    gpu_memory: int | None,
    batches: Any,
    results: Any,
    stop: Any,
) -> None:
    """The helper process of :class:`Helper`: sends the loader's batches until told to stop,
    then its figures."""
    import torch  # noqa: F401 (CUDA tensors cross the queue through torch's reductions)

    import stoker

    loader = stoker_loader(stoker, kind, data, batch, workers, gpu_memory)
    for b in forever(lambda: loader):
        item = (b["image"], b["label"])
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.5)
                break
            except queue.Full:
                continue
        if stop.is_set():
            break
    results.put(loader.stats())
    loader.close()


def dali_batches(
    torch: Any,
    data: Path,
    batch: int,
    threads: int,
    hw_load: float,
    prefetch: int,
    random_crop: bool = False,
) -> Callable[[], tuple[Any, Any]] | str:
    """DALI's pipeline for the row (see the module doc; ``random_crop``: the decoder draws and
    decodes the crop window alone, as DALI's ResNet-50 example does), as a function giving the
    next (images, labels) on the GPU, epoch after epoch; or why the row is skipped: DALI is not
    installed, or its pipeline did not build (the other rows still run)."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError as error:
        print(f"dali: not importable ({error}); row skipped", flush=True)
        return f"nvidia.dali is not importable ({error})"

    @pipeline_def(
        batch_size=batch,
        num_threads=threads,
        device_id=torch.cuda.current_device(),
        prefetch_queue_depth=prefetch,
        seed=0,
    )
    def pipeline() -> tuple[Any, Any]:
        jpegs, labels = fn.readers.file(
            file_root=str(data), random_shuffle=True, name="Reader"
        )
        if random_crop:
            images = fn.decoders.image_random_crop(
                jpegs,
                device="mixed",
                output_type=types.RGB,
                hw_decoder_load=hw_load,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
                num_attempts=10,
            )
            images = fn.resize(images, resize_x=CROP, resize_y=CROP)
        else:
            images = fn.decoders.image(
                jpegs, device="mixed", output_type=types.RGB, hw_decoder_load=hw_load
            )
            images = fn.random_resized_crop(images, size=CROP)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT16,
            output_layout="HWC",
            mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD],
            mirror=fn.random.coin_flip(probability=0.5),
        )
        return images, labels.gpu()

    try:
        # nvImageCodec and nvJPEG load as the pipeline builds and the iterator's first
        # batches run.
        pipe = pipeline()
        pipe.build()
        iterator = DALIGenericIterator(
            pipe,
            ["images", "labels"],
            reader_name="Reader",
            last_batch_policy=LastBatchPolicy.DROP,
            auto_reset=True,
        )
    except Exception as error:
        print(f"dali: the pipeline did not build ({error!r}); row skipped", flush=True)
        return f"DALI's pipeline did not build: {error!r}"
    batches = forever(lambda: iterator)

    def fetch() -> tuple[Any, Any]:
        out = next(batches)[0]
        # NHWC in memory is channels_last NCHW: a view, no copy.
        return out["images"].permute(0, 3, 1, 2), out["labels"].view(-1).long()

    return fetch


def print_row(r: dict[str, Any], flush: bool) -> None:
    if "skipped" in r:
        print(f"{r['model']:9} {r['row']:16} skipped: {r['skipped']}", flush=flush)
        return
    share = (
        f"{100 * r['share_of_ceiling']:5.1f}%" if "share_of_ceiling" in r else "   -  "
    )
    busy = f"{r['ceiling_x_busy']:8.0f}" if "ceiling_x_busy" in r else "       -"
    lane = r.get("gpu_decode")
    lane_text = ""
    if lane:
        by_region = f"{lane['roi_rows']} by region, " if lane.get("roi") else ""
        lane_text = (
            f"  lane {lane['rows']} {lane.get('rows_dtype', 'uint8')} rows, "
            f"declined {lane['declined_rows']}, "
            f"fell back {lane['fallback_rows']}, {by_region}"
            f"GPU {lane['gpu_rows_per_s']:.0f} / CPU {lane['cpu_rows_per_s']:.0f} rows/s, "
            f"split {'>'.join(map(str, r.get('decode_splits_sixteenths', [])))}/16, "
            f"{lane['memory_bytes'] >> 20} MiB, "
            f"{lane.get('nvjpeg_allocations', '-')} nvJPEG allocations, "
            f"lane cost {100 * r.get('stoker_gpu_lane_cost_fraction', 0.0):.1f}% of the GPU "
            f"({r.get('stoker_gpu_lane_quiet_steps', 0)} quiet steps)"
        )
    print(
        f"{r['model']:9} {r['row']:16} {r['images_per_s']:8.0f} img/s {share} of ceiling  "
        f"host wait {100 * r['host_wait_fraction']:5.1f}%  "
        f"GPU idle {100 * r['gpu_idle_fraction']:5.1f}%  "
        f"ceiling x busy {busy}  build {r['build_s']:.3f} s  "
        f"first batch {r['first_batch_s']:.3f} s{lane_text}",
        flush=flush,
    )


if __name__ == "__main__":
    sys.exit(main())
