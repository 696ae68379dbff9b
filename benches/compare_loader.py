#!/usr/bin/env python3
"""stoker.Loader against torch.utils.data.DataLoader, from Python, side by side.

Both loaders read the same ImageFolder with the same recipe (RandomResizedCrop(224), random
horizontal flip, uint8 tensors out, batches of 64) and hand torch tensors to a Python loop.
Each configuration runs in a fresh child interpreter so that its memory is measured alone:

- images/s: images delivered / seconds from building the loader to the last batch
  (startup included, as a training epoch sees it); "steady" leaves the first batch out.
- first batch: seconds from building the loader (dataset indexing included) to the first
  batch in the loop's hands.
- added memory: peak PSS of the child's whole process tree (itself and any worker processes)
  minus the child's own PSS right after ``import torch``. PSS splits shared pages between the
  processes that map them, so forked workers are not counted twice. The peak is the largest of
  the samples this (parent) process takes of the child's tree once every ``--memory-period``
  seconds and of one the child takes after its clock stops, with the loader still alive:
  reading PSS stalls the process read, so it is read rarely and never from inside the timed
  loop (measure.py says why and how much). Whatever is imported after torch (torchvision,
  stoker) counts as the loader's; imports are done before the clock starts. "loader only" is
  the same peak minus the PSS after those imports, i.e. what building and running the loader
  adds (torchvision's import alone is ~160 MiB with torchvision 0.29).
- background CPU: CPU-seconds the rest of the machine used while a child ran (``/proc/stat``
  less this process tree's own); a warning follows the table when it passes 5% of the child's.

Stoker runs with ``--threads`` decode threads; DataLoader with num_workers 0, 1 and 2,
pin_memory=True and its default prefetch_factor of 2. Stoker gets the same number of batches
in flight as DataLoader with ``--threads`` workers (prefetch = 2 x workers) and room for the
one batch the loop holds (max_held_batches=1).

Usually started by compare_loader.sh, which prepares the venv, the package and the image set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import measure

# Background CPU above this share of the measured run's own CPU makes the table warn.
BACKGROUND_WARN_FRACTION = 0.05


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measure.comparison_arguments(parser)
    parser.add_argument("--threads", type=int, default=2, help="stoker decode threads (default 2)")
    parser.add_argument(
        "--workers",
        default="0,1,2",
        help="DataLoader num_workers values to run, comma-separated (default 0,1,2)",
    )
    args = parser.parse_args(argv)
    measure.check_comparison_arguments(parser, args)
    try:
        args.worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--workers must be comma-separated ints, got {args.workers!r}")
    if args.threads < 1 or any(w < 0 for w in args.worker_counts):
        parser.error("--threads must be >= 1 and --workers >= 0")
    return args


# -- one configuration, in a child interpreter --------------------------------------------


def import_loader(config: str) -> None:
    """Imports what the configuration needs, so the timed part does not include imports."""
    if config == "stoker":
        import stoker  # noqa: F401
    else:
        import torchvision  # noqa: F401


def build_stoker(args: argparse.Namespace) -> Any:
    import stoker

    return stoker.Loader(
        args.data,
        pipeline=stoker.vision.imagenet_train(measure.CROP_SIZE),
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        num_threads=args.threads,
        prefetch=measure.PREFETCH_FACTOR * args.threads,
        max_held_batches=1,
        output="torch",
    )


def build_dataloader(args: argparse.Namespace, workers: int) -> Any:
    import torch
    from torchvision import datasets, transforms

    recipe = transforms.Compose(
        [
            transforms.RandomResizedCrop(measure.CROP_SIZE),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )
    return torch.utils.data.DataLoader(
        datasets.ImageFolder(str(args.data), transform=recipe),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        generator=torch.Generator().manual_seed(args.seed),
    )


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    import warnings

    import torch

    baseline = measure.pss_bytes(os.getpid())
    import_loader(args.child)
    after_imports = measure.pss_bytes(os.getpid())
    # pin_memory without CUDA only warns; the comparison is CPU-side either way.
    warnings.filterwarnings("ignore", message=".*pin_memory.*")

    def build() -> Any:
        if args.child == "stoker":
            return build_stoker(args)
        return build_dataloader(args, int(args.child.removeprefix("torch")))

    run = measure.timed_run(build, args.batches)
    loader = run.loader
    # The clock has stopped, so this read slows nothing measured; the loader is still alive
    # and at its fullest (slots filled, workers running).
    end_tree_pss = measure.tree_pss_bytes(os.getpid())
    extra: dict[str, Any] = {}
    if args.child == "stoker":
        stats = loader.stats()
        extra = {
            "stall_fraction": stats["stall_fraction"],
            "slot_capacity": stats["slot_capacity"],
        }
        loader.close()
    figures = measure.epoch_figures(
        args.child, run.images, run.batches, run.seconds, run.first_batch_s, args.batch_size,
        baseline, after_imports, end_tree_pss,
    )
    del run, loader
    return {**figures, "torch": torch.__version__, **extra}


# -- the parent: run every configuration, print the table ----------------------------------


def run_once(args: argparse.Namespace, config: str, argv: list[str]) -> dict[str, Any]:
    """One fresh child running ``config``, its memory watched from here."""
    return measure.watched_run(__file__, argv, config, args.memory_period)


def run_config(args: argparse.Namespace, config: str, argv: list[str]) -> dict[str, Any]:
    """The configuration's figures, each the median over ``--repeat`` fresh processes."""
    print(f"running {config} ({args.repeat}x) ...", file=sys.stderr, flush=True)
    runs = [run_once(args, config, argv) for _ in range(args.repeat)]
    merged = measure.median_run(runs)
    merged["runs"] = runs
    return merged


def label(config: str, args: argparse.Namespace) -> str:
    if config == "stoker":
        return f"stoker.Loader, {args.threads} threads"
    return f"DataLoader, {config.removeprefix('torch')} workers"


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """The parent: every configuration run in fresh children (given ``argv``), then the table."""
    configs = ["stoker", *(f"torch{w}" for w in args.worker_counts)]
    results = {config: run_config(args, config, argv) for config in configs}
    reference_name = f"torch{args.threads}" if f"torch{args.threads}" in results else configs[-1]
    reference, ours = results[reference_name], results["stoker"]
    ratios = {
        "reference": reference_name,
        "images_per_s": ours["images_per_s"] / reference["images_per_s"],
        "steady_images_per_s": ours["steady_images_per_s"] / reference["steady_images_per_s"],
        "added_memory": ours["added_mib"] / reference["added_mib"]
        if reference["added_mib"] > 0
        else math.nan,
        "loader_only_memory": (
            ours["loader_only_mib"] / reference["loader_only_mib"]
            if reference["loader_only_mib"] > 0
            else math.nan
        ),
        "first_batch_speedup": reference["first_batch_s"] / ours["first_batch_s"],
    }
    if args.json:
        print(
            json.dumps(
                {
                    "data": str(args.data),
                    "batch_size": args.batch_size,
                    "results": results,
                    "ratios": ratios,
                }
            )
        )
        return 0

    print(
        f"{args.data}, batch {args.batch_size}, {results['stoker']['images']} images per run, "
        f"median of {args.repeat} run(s) each"
    )
    columns = [("loader", 28), ("images/s", 10), ("steady", 10), ("first batch", 13),
               ("added MiB", 11), ("loader only", 13), ("peak MiB", 10)]
    measure.print_table(columns, [
        [label(config, args), f"{r['images_per_s']:.0f}", f"{r['steady_images_per_s']:.0f}",
         f"{r['first_batch_s']:.3f}s", f"{r['added_mib']:.0f}", f"{r['loader_only_mib']:.0f}",
         f"{r['peak_tree_pss_mib']:.0f}"]
        for config, r in results.items()
    ])
    print(
        f"\nstoker vs {label(reference_name, args)}: {ratios['images_per_s']:.2f}x images/s "
        f"({ratios['steady_images_per_s']:.2f}x steady), "
        f"{ratios['added_memory']:.2f}x the added memory "
        f"({ratios['loader_only_memory']:.2f}x loader only), "
        f"first batch {ratios['first_batch_speedup']:.1f}x sooner"
    )
    for config, result in results.items():
        if result["background_cpu_s"] > BACKGROUND_WARN_FRACTION * result["cpu_s"]:
            print(
                f"warning: other processes used {result['background_cpu_s']:.1f} CPU-s during "
                f"the run of {label(config, args)} ({result['cpu_s']:.1f} CPU-s): figures "
                "are disturbed"
            )
    return 0


if __name__ == "__main__":
    sys.exit(measure.main(sys.argv[1:], parse_args, run_child, compare))
