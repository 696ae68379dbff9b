#!/usr/bin/env python3
"""stoker.Loader against Mosaic Streaming's own StreamingDataset on the same MDS shards.

The image folder given (``--data``) is written once as MDS shards by Streaming's ``MDSWriter``
(``{"image": "jpeg", "label": "int"}``, its default 64 MiB shards; ``--compression zstd`` for
compressed ones) beside it, in ``<data>-mds[-zstd]``. Then, each in a fresh child interpreter
(``measure.py``, as ``compare_loader.py`` runs its loaders), one epoch of:

- ``StreamingDataset(local=mds, shuffle=True, batch_size=B)`` whose samples go through
  torchvision's ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``, ``PILToTensor()``, in a
  ``StreamingDataLoader`` with ``--workers`` workers (pin_memory, prefetch_factor 2);
- ``stoker.Loader(mds, pipeline=imagenet_train(224))`` with ``--threads`` decode threads, the
  same batches in flight, torch tensors out;
- ``stoker.Loader`` over the image folder itself, for the cost of the format.

Reported: images/s, steady images/s, first batch, CPU-seconds per image (the child's tree),
added memory, and Stoker on MDS against Streaming; a JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import measure


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measure.comparison_arguments(parser)
    parser.add_argument("--threads", type=int, default=2, help="stoker decode threads")
    parser.add_argument("--workers", type=int, default=2, help="Streaming's DataLoader workers")
    parser.add_argument("--compression", default="", help="MDS shards' compression (zstd) or none")
    parser.add_argument("--mds", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    measure.check_comparison_arguments(parser, args)
    if args.threads < 1 or args.workers < 0:
        parser.error("--threads must be >= 1 and --workers >= 0")
    if args.mds is None:
        suffix = f"-{args.compression}" if args.compression else ""
        args.mds = args.data.with_name(f"{args.data.name}-mds{suffix}")
    return args


def write_mds(data: Path, out: Path, compression: str) -> None:
    """The image folder's images, in torchvision's order, as ``MDSWriter`` writes them."""
    from PIL import Image
    from streaming import MDSWriter
    from torchvision import datasets

    folder = datasets.ImageFolder(str(data))
    part = out.with_name(out.name + ".part")
    with MDSWriter(out=str(part), columns={"image": "jpeg", "label": "int"},
                   compression=compression or None) as writer:
        for path, label in folder.samples:
            # An opened JPEG keeps its file's own bytes in the shard.
            writer.write({"image": Image.open(path), "label": label})
    part.rename(out)


# -- one configuration, in a child interpreter --------------------------------------------


def build_streaming(args: argparse.Namespace) -> Any:
    import torch
    from streaming import StreamingDataLoader, StreamingDataset
    from torchvision import transforms

    recipe = transforms.Compose(
        [
            transforms.RandomResizedCrop(measure.CROP_SIZE),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )

    class Images(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: int) -> tuple[Any, int]:
            sample = super().__getitem__(index)
            return recipe(sample["image"].convert("RGB")), sample["label"]

    dataset = Images(local=str(args.mds), shuffle=True, shuffle_seed=args.seed + 1,
                     batch_size=args.batch_size)
    return StreamingDataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        pin_memory=True,
        prefetch_factor=measure.PREFETCH_FACTOR if args.workers else None,
        generator=torch.Generator().manual_seed(args.seed),
    )


def build_stoker(args: argparse.Namespace, root: Path) -> Any:
    import stoker

    return stoker.Loader(
        root,
        pipeline=stoker.vision.imagenet_train(measure.CROP_SIZE),
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        num_threads=args.threads,
        prefetch=measure.PREFETCH_FACTOR * max(args.threads, 1),
        max_held_batches=1,
        output="torch",
    )


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    import warnings

    import torch

    baseline = measure.pss_bytes(os.getpid())
    if args.child == "streaming":
        import streaming  # noqa: F401
        import torchvision  # noqa: F401
    else:
        import stoker  # noqa: F401
    after_imports = measure.pss_bytes(os.getpid())
    warnings.filterwarnings("ignore", message=".*pin_memory.*")

    def build() -> Any:
        if args.child == "streaming":
            return build_streaming(args)
        return build_stoker(args, args.mds if args.child == "stoker-mds" else args.data)

    run = measure.timed_run(build, args.batches)
    end_tree_pss = measure.tree_pss_bytes(os.getpid())
    if args.child != "streaming":
        run.loader.close()
    figures = measure.epoch_figures(
        args.child, run.images, run.batches, run.seconds, run.first_batch_s, args.batch_size,
        baseline, after_imports, end_tree_pss,
    )
    del run
    return {**figures, "torch": torch.__version__}


# -- the parent ----------------------------------------------------------------------------


LABELS = {
    "streaming": "StreamingDataset, {workers} workers",
    "stoker-mds": "stoker.Loader on MDS, {threads} threads",
    "stoker-folder": "stoker.Loader on the folder, {threads} threads",
}


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """The parent: every configuration run in fresh children (given ``argv``), then the table."""
    if not (args.mds / "index.json").is_file():
        print(f"writing {args.mds} with MDSWriter ...", file=sys.stderr, flush=True)
        write_mds(args.data, args.mds, args.compression)
    argv = [*argv, "--mds", str(args.mds)]
    configs = list(LABELS)
    runs: dict[str, list[dict[str, Any]]] = {config: [] for config in configs}
    # Rounds alternate the configurations, so none always runs on a warmer machine.
    for _ in range(args.repeat):
        for config in configs:
            print(f"running {config} ...", file=sys.stderr, flush=True)
            runs[config].append(measure.watched_run(__file__, argv, config, args.memory_period))
    results = {config: {**measure.median_run(r), "runs": r} for config, r in runs.items()}
    ours, theirs = results["stoker-mds"], results["streaming"]
    ratios = {
        "images_per_s": ours["images_per_s"] / theirs["images_per_s"],
        "cpu_per_image": ours["cpu_ms_per_image"] / theirs["cpu_ms_per_image"],
        "added_memory": ours["added_mib"] / theirs["added_mib"] if theirs["added_mib"] > 0
        else math.nan,
        "first_batch_speedup": theirs["first_batch_s"] / ours["first_batch_s"],
    }
    if args.json:
        print(json.dumps({"data": str(args.data), "mds": str(args.mds),
                          "batch_size": args.batch_size, "results": results, "ratios": ratios}))
        return 0
    print(f"{'loader':<40} {'images/s':>9} {'steady':>9} {'first s':>8} {'CPU ms/img':>11} "
          f"{'added MiB':>10}")
    for config in configs:
        r = results[config]
        name = LABELS[config].format(workers=args.workers, threads=args.threads)
        print(f"{name:<40} {r['images_per_s']:>9.0f} {r['steady_images_per_s']:>9.0f} "
              f"{r['first_batch_s']:>8.2f} {r['cpu_ms_per_image']:>11.2f} {r['added_mib']:>10.0f}")
    print(f"stoker on MDS vs StreamingDataset: {ratios['images_per_s']:.2f}x images/s, "
          f"{ratios['cpu_per_image']:.2f}x CPU per image, {ratios['added_memory']:.2f}x the added "
          f"memory, first batch {ratios['first_batch_speedup']:.1f}x sooner")
    return 0


if __name__ == "__main__":
    sys.exit(measure.main(sys.argv[1:], parse_args, run_child, compare))
