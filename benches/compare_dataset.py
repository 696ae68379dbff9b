#!/usr/bin/env python3
"""One torchvision-style Dataset through DataLoader and through ``Loader.from_dataset``.

The dataset is torchvision's ``ImageFolder`` with a v2 recipe (PIL decode,
``RandomResizedCrop(224)``, random horizontal flip, uint8 tensor out), the same object for
every loader, on the same files, batches of 64:

- ``DataLoader, N workers``: torch's loader, ``num_workers=N`` (default N = 2), default
  prefetch (2 batches per worker).
- ``from_dataset, N threads``: Stoker's planner, the dataset's code on N threads here.
- ``from_dataset, N processes``: Stoker's planner, N worker processes (forkserver), each
  loading whole batches into its shared buffer.

Each runs in a fresh child interpreter (imports done before the clock starts) and is
measured as compare_loader.py measures: images/s from building the loader to the last batch,
"steady" leaves the first batch (and with it the workers' start) out, the first batch's time,
CPU-seconds per image of the child's whole tree (a fork server's workers are not the child's
children, so their CPU is missing from that figure), and the peak PSS of
that tree above the interpreter's after its imports ("loader memory"; measure.py says how it
is read without slowing the run). Stoker gets as many batches requested as DataLoader has
outstanding (``prefetch = 2 x N``; ``--prefetch`` sets another) and room for the one batch
the loop holds. A request holds its batch slot from the start, while DataLoader makes a
batch's buffer only once a worker has loaded it: with N lanes building, ``--prefetch N`` is
the setting whose slots match DataLoader's live batches.

Usage: benches/compare_dataset.sh [--count N] [--batches K] [--workers N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import measure


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measure.comparison_arguments(parser)
    parser.add_argument("--workers", type=int, default=2, help="workers, processes and threads")
    parser.add_argument(
        "--prefetch", type=int, default=0,
        help="from_dataset's prefetch (0: 2 x workers, DataLoader's batches outstanding)",
    )
    args = parser.parse_args(argv)
    measure.check_comparison_arguments(parser, args)
    if args.workers < 1 or args.prefetch < 0:
        parser.error("--workers must be >= 1 and --prefetch >= 0")
    return args


def dataset(args: argparse.Namespace) -> Any:
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2

    recipe = v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(measure.CROP_SIZE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.uint8),
        ]
    )
    return datasets.ImageFolder(str(args.data), transform=recipe)


def build(args: argparse.Namespace, config: str) -> Any:
    import torch

    kind, _, count = config.partition(":")
    n = int(count)
    if kind == "torch":
        return torch.utils.data.DataLoader(
            dataset(args),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=n,
            generator=torch.Generator().manual_seed(args.seed),
            persistent_workers=False,
        )
    import stoker

    mode: dict[str, Any] = {"num_threads": n}
    if kind.startswith("processes"):
        method = kind.partition("-")[2] or None
        mode = {"num_workers": n, "multiprocessing_context": method}
    return stoker.Loader.from_dataset(
        dataset(args),
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        prefetch=args.prefetch or measure.PREFETCH_FACTOR * n,
        max_held_batches=1,
        output="torch",
        **mode,
    )


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    import stoker  # noqa: F401

    after_imports = measure.pss_bytes(os.getpid())
    run = measure.timed_run(lambda: build(args, args.child), args.batches)
    end_tree_pss = measure.tree_pss_bytes(os.getpid())
    if hasattr(run.loader, "close"):
        run.loader.close()
    images, elapsed, first_batch_s = run.images, run.seconds, run.first_batch_s
    del run
    return {
        "config": args.child,
        "images": images,
        "seconds": elapsed,
        "images_per_s": images / elapsed,
        "steady_images_per_s": (images - args.batch_size) / (elapsed - first_batch_s),
        "first_batch_s": first_batch_s,
        "after_imports_pss_mib": after_imports / measure.MIB,
        "end_tree_pss_mib": end_tree_pss / measure.MIB,
    }


def run_once(args: argparse.Namespace, config: str, argv: list[str]) -> dict[str, Any]:
    run = measure.run_watched(__file__, argv, config, args.memory_period)
    result = run.result
    result.update(
        loader_mib=run.peak_mib - result["after_imports_pss_mib"],
        peak_tree_pss_mib=run.peak_mib,
        cpu_s=run.cpu_s,
        cpu_ms_per_image=1000 * run.cpu_s / result["images"],
    )
    return result


def label(config: str) -> str:
    kind, _, n = config.partition(":")
    if kind == "torch":
        return f"DataLoader, {n} workers"
    if kind == "threads":
        return f"from_dataset, {n} threads"
    return f"from_dataset, {n} proc. ({kind.partition('-')[2]})"


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """The parent: every configuration run in fresh children (given ``argv``), then the table."""
    configs = [
        f"{kind}:{args.workers}"
        for kind in (
            "torch", "threads", "processes-forkserver", "processes-fork", "processes-spawn"
        )
    ]
    results = {}
    for config in configs:
        print(f"running {label(config)} ({args.repeat}x) ...", file=sys.stderr, flush=True)
        runs = [run_once(args, config, argv) for _ in range(args.repeat)]
        results[config] = measure.median_run(runs)
    reference = results[configs[0]]
    if args.json:
        print(json.dumps({"data": str(args.data), "results": results}))
        return 0
    print(
        f"{args.data}, batch {args.batch_size}, {reference['images']} images per run, "
        f"median of {args.repeat} run(s), from_dataset prefetch "
        f"{args.prefetch or measure.PREFETCH_FACTOR * args.workers}"
    )
    columns = [("loader", 34), ("images/s", 10), ("vs DL", 7), ("steady", 8), ("vs DL", 7),
               ("CPU ms/img", 12), ("first batch", 13), ("loader MiB", 12), ("vs DL", 7)]

    def vs(r: dict[str, Any], key: str) -> str:
        return f"{r[key] / reference[key]:.2f}x"

    measure.print_table(columns, [
        [label(config), f"{r['images_per_s']:.0f}", vs(r, "images_per_s"),
         f"{r['steady_images_per_s']:.0f}", vs(r, "steady_images_per_s"),
         f"{r['cpu_ms_per_image']:.2f}", f"{r['first_batch_s']:.2f}s",
         f"{r['loader_mib']:.0f}", vs(r, "loader_mib")]
        for config, r in results.items()
    ])
    return 0


if __name__ == "__main__":
    sys.exit(measure.main(sys.argv[1:], parse_args, run_child, compare))
