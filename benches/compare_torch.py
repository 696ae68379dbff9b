#!/usr/bin/env python3
"""Stoker against torch's DataLoader on the same files, the same cores and the same recipe.

Both loaders run the ImageNet training transform (decode, RandomResizedCrop(224), random
horizontal flip, uint8 HWC/CHW out) over an ImageFolder, one after the other, and the script
prints images/s, CPU milliseconds per image, images per CPU-second and time to first batch for
each, then the stoker / torch ratios.

CPU is counted for the whole process tree of each loader: `stoker bench` reports its own
getrusage; torch runs in a fresh child interpreter (so neither its import nor stoker's CPU is
mixed in) that adds RUSAGE_SELF and RUSAGE_CHILDREN deltas after its worker processes have
been joined, which is when the kernel folds their CPU into RUSAGE_CHILDREN.

Usually started by compare_torch.sh, which prepares the venv, the binary and the image set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from measure import busy_cpu_seconds

PIPELINE = "imagenet-train"
CROP_SIZE = 224


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="ImageFolder root")
    parser.add_argument("--stoker", type=Path, help="path of the stoker binary")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--workers",
        "--threads",
        dest="workers",
        type=int,
        default=2,
        help="torch DataLoader num_workers and stoker decode threads",
    )
    parser.add_argument("--batches", type=int, default=0, help="batches per loader (0: one epoch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each loader, alternating; the table shows the medians",
    )
    parser.add_argument(
        "--cpus",
        help="comma-separated CPU ids both loaders are pinned to (default: inherited)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.workers < 1 or args.repeat < 1 or args.batches < 0:
        parser.error("--batch-size, --workers and --repeat must be >= 1, --batches >= 0")
    if not args.torch_child and args.stoker is None:
        parser.error("--stoker is required")
    return args


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def run_torch(args: argparse.Namespace) -> dict:
    """The DataLoader side; runs inside the fresh child interpreter."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    torch.manual_seed(args.seed)
    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(CROP_SIZE),
            transforms.RandomHorizontalFlip(),
            # uint8 like stoker's output: the float conversion belongs to the GPU side of both.
            transforms.PILToTensor(),
        ]
    )

    # The clock starts before the folder scan because stoker's clock starts before its own.
    wall_start = time.perf_counter()
    self_start = resource.getrusage(resource.RUSAGE_SELF)
    children_start = resource.getrusage(resource.RUSAGE_CHILDREN)
    dataset = datasets.ImageFolder(str(args.data), transform=transform)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=False,
        # Python 3.14 makes forkserver the Linux default; its workers are the forkserver's
        # children, invisible to our RUSAGE_CHILDREN. fork is what every earlier Python uses.
        multiprocessing_context="fork",
    )
    wanted = args.batches or len(loader)
    images = 0
    batches = 0
    first_batch_s = None
    iterator = iter(loader)
    workers = list(getattr(iterator, "_workers", []))
    for pixels, _labels in iterator:
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - wall_start
        images += pixels.shape[0]
        batches += 1
        if batches >= wanted:
            break
    wall_s = time.perf_counter() - wall_start
    shape = list(pixels.shape)
    dtype = str(pixels.dtype)

    # Shut the workers down and reap them before reading RUSAGE_CHILDREN: a child's CPU is
    # only added there once it has been waited for, and DataLoader's own shutdown may leave a
    # terminated worker unjoined.
    del pixels, _labels, iterator, loader
    for worker in workers:
        worker.join()
    self_end = resource.getrusage(resource.RUSAGE_SELF)
    children_end = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_main = cpu_seconds(self_end) - cpu_seconds(self_start)
    cpu_workers = cpu_seconds(children_end) - cpu_seconds(children_start)
    cpu_s = cpu_main + cpu_workers
    return {
        "loader": "torch",
        "versions": {
            "torch": torch.__version__,
            "torchvision": __import__("torchvision").__version__,
            "pillow": __import__("PIL").__version__,
            "python": sys.version.split()[0],
        },
        "workers": args.workers,
        "batch_size": args.batch_size,
        "batches": batches,
        "images": images,
        "last_batch_shape": shape,
        "dtype": dtype,
        "wall_s": wall_s,
        "images_per_s": images / wall_s,
        "cpu_s": cpu_s,
        "cpu_s_main": cpu_main,
        "cpu_s_workers": cpu_workers,
        "cpu_s_per_image": cpu_s / max(images, 1),
        "images_per_cpu_s": images / max(cpu_s, 1e-9),
        "first_batch_ms": (first_batch_s or 0.0) * 1e3,
        # ru_maxrss is in KiB on Linux; the children figure is the largest single worker.
        "peak_rss_mb": self_end.ru_maxrss / 1024,
        "peak_rss_mb_worker": children_end.ru_maxrss / 1024,
    }


def torch_in_child(args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--torch-child",
        "--data",
        str(args.data),
        "--batch-size",
        str(args.batch_size),
        "--workers",
        str(args.workers),
        "--batches",
        str(args.batches),
        "--seed",
        str(args.seed),
    ]
    finished = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(finished.stdout.strip().splitlines()[-1])


def run_stoker(args: argparse.Namespace) -> dict:
    command = [
        str(args.stoker),
        "bench",
        "--data",
        str(args.data),
        "--pipeline",
        PIPELINE,
        "--size",
        str(CROP_SIZE),
        "--batch-size",
        str(args.batch_size),
        "--threads",
        str(args.workers),
        "--batches",
        str(args.batches),
        "--seed",
        str(args.seed),
        "--json",
    ]
    finished = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    report["loader"] = "stoker"
    return report


def warm_page_cache(root: Path) -> None:
    """Reads every file once so neither loader pays for cold storage the other does not."""
    for directory, _subdirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                while handle.read(1 << 20):
                    pass


def count_class_files(root: Path) -> int:
    """Files below the class folders: what ImageFolder indexes, leaving out the set's manifest."""
    return sum(
        len(files) for directory, _subdirs, files in os.walk(root) if Path(directory) != root
    )


def measured(run, args: argparse.Namespace) -> dict:
    """Runs one loader and adds how much CPU the rest of the machine used meanwhile.

    Other processes on the same cores slow both loaders' wall clock and, through cache and
    frequency effects, their CPU time too; `background_cpu_s` says when a run was disturbed.
    """
    busy_before = busy_cpu_seconds()
    children_before = cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN))
    report = run(args)
    children = cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN)) - children_before
    report["background_cpu_s"] = max(0.0, busy_cpu_seconds() - busy_before - children)
    return report


def median_report(runs: list[dict]) -> dict:
    """The median of every per-run figure; the rest (names, versions) from the first run."""
    summary = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            summary[key] = statistics.median(run[key] for run in runs)
    return summary


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def print_table(stoker: dict, torch_: dict, ratios: dict, config: dict) -> None:
    print(
        f"{config['images_in_set']} images in {config['data']}, batch {config['batch_size']}, "
        f"{config['workers']} workers/threads, {config['cpus']} CPUs available, "
        f"pipeline {PIPELINE} ({CROP_SIZE}x{CROP_SIZE} uint8)"
    )
    header = (
        f"{'loader':<8} {'images':>7} {'wall s':>8} {'images/s':>9} "
        f"{'CPU ms/image':>13} {'images/CPU-s':>13} {'first batch ms':>15} {'peak RSS MiB':>20}"
    )
    if config["repeat"] > 1:
        print(f"medians of {config['repeat']} alternating runs per loader")
    print(header)
    print("-" * len(header))
    for row in (stoker, torch_):
        rss = f"{row['peak_rss_mb']:.0f}"
        if "peak_rss_mb_worker" in row:
            rss += f" +{row['peak_rss_mb_worker']:.0f}/worker"
        print(
            f"{row['loader']:<8} {row['images']:>7} {row['wall_s']:>8.2f} "
            f"{row['images_per_s']:>9.1f} {row['cpu_s_per_image'] * 1e3:>13.3f} "
            f"{row['images_per_cpu_s']:>13.1f} {row['first_batch_ms']:>15.1f} {rss:>20}"
        )
    print()
    print(f"ratio images per CPU-second (stoker / torch): {ratios['images_per_cpu_s']:.2f}x")
    print(f"ratio images/s (stoker / torch): {ratios['images_per_s']:.2f}x")
    print(f"first-batch speedup (torch ms / stoker ms): {ratios['first_batch_speedup']:.2f}x")
    for row in (stoker, torch_):
        if row["background_cpu_s"] > 0.05 * row["cpu_s"]:
            print(
                f"warning: other processes used {row['background_cpu_s']:.1f} CPU-s during "
                f"the {row['loader']} run ({row['cpu_s']:.1f} CPU-s): figures are disturbed"
            )
    print(
        "(forked workers share pages with the main process, so torch's RSS figures overlap; "
        f"torch {torch_['versions']['torch']}, torchvision {torch_['versions']['torchvision']}, "
        f"pillow {torch_['versions']['pillow']})"
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.data = args.data.resolve()
    if args.torch_child:
        print(json.dumps(run_torch(args)))
        return 0
    if not args.data.is_dir():
        print(f"compare_torch: {args.data} is not a folder", file=sys.stderr)
        return 2
    if args.cpus:
        # Children inherit the affinity, so both loaders get exactly these cores.
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})

    warm_page_cache(args.data)
    stoker_runs, torch_runs = [], []
    for _ in range(args.repeat):
        stoker_runs.append(measured(run_stoker, args))
        torch_runs.append(measured(torch_in_child, args))
    stoker, torch_ = median_report(stoker_runs), median_report(torch_runs)
    if stoker["images"] != torch_["images"]:
        print(
            f"compare_torch: warning: stoker ran {stoker['images']} images, "
            f"torch {torch_['images']}",
            file=sys.stderr,
        )
    ratios = {
        "images_per_cpu_s": ratio(stoker["images_per_cpu_s"], torch_["images_per_cpu_s"]),
        "images_per_s": ratio(stoker["images_per_s"], torch_["images_per_s"]),
        "first_batch_speedup": ratio(torch_["first_batch_ms"], stoker["first_batch_ms"]),
    }
    config = {
        "data": str(args.data),
        "images_in_set": count_class_files(args.data),
        "batch_size": args.batch_size,
        "workers": args.workers,
        "batches": args.batches,
        "repeat": args.repeat,
        "cpus": len(os.sched_getaffinity(0)),
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.json:
        runs = {"stoker": stoker_runs, "torch": torch_runs}
        print(
            json.dumps(
                {
                    "config": config,
                    "stoker": stoker,
                    "torch": torch_,
                    "ratios": ratios,
                    "runs": runs,
                }
            )
        )
    else:
        print_table(stoker, torch_, ratios, config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
