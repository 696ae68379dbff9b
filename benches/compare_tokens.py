#!/usr/bin/env python3
"""stoker.Loader against torch.utils.data.DataLoader on a token file, side by side.

Both read the same nanoGPT-style token file as shuffled, non-overlapping windows of
``seq_len + 1`` tokens (window i = tokens [i * seq_len, i * seq_len + seq_len + 1)) and hand a
``(batch, seq_len + 1)`` tensor in the file's dtype to a Python loop:

- stoker: ``stoker.Loader(file, pipeline=[ops.TokenWindows(seq_len)])`` with ``--threads``
  threads, in process; the tensor is a zero-copy view of a Rust batch slot.
- torch: a map-style Dataset over ``numpy.memmap`` whose ``__getitem__`` copies one window
  into a tensor (kept in the file's dtype, the cheapest form for torch), DataLoader with
  ``num_workers=--workers``, shuffle=True and the default collate (``torch.stack``).

tokens/s counts ``batch x seq_len`` training tokens per batch over the wall time from building
the loader to the last batch (startup included); "steady" leaves the first batch out. The file
is read once before the runs so both find it in the page cache. Configurations alternate, and
with ``--repeat R`` each figure is the median of R runs.

Usually started by compare_tokens.sh, which prepares the venv, the package and the file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="token file (*.bin)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader num_workers (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="stoker threads (default 2)")
    parser.add_argument("--batches", type=int, default=400, help="batches per run (default 400)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per loader (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if min(args.seq_len, args.batch_size, args.threads, args.batches, args.repeat) < 1:
        parser.error("--seq-len, --batch-size, --threads, --batches and --repeat must be >= 1")
    if args.workers < 0:
        parser.error("--workers must be >= 0")
    if not args.data.is_file():
        parser.error(f"--data {args.data} is not a file")
    return args


def file_dtype(path: Path) -> str:
    """The token dtype by stoker's file-name rule (job.proto): *.u32.bin / *.uint32.bin."""
    name = path.name.lower()
    return "uint32" if name.endswith((".u32.bin", ".uint32.bin")) else "uint16"


def timed_run(make: Any, batches: int, seq_len: int) -> dict[str, float]:
    """Builds a loader with ``make()``, pulls ``batches`` batches, returns the figures."""
    started = time.perf_counter()
    loader = make()
    first = None
    tokens = 0
    pulled = 0
    checksum = 0
    for batch in loader:
        now = time.perf_counter()
        if first is None:
            first = now
            first_tokens = batch.shape[0] * seq_len
        # Touch the data as a training step would when it copies it to the device.
        checksum ^= int(batch[0, 0])
        tokens += batch.shape[0] * seq_len
        pulled += 1
        if pulled == batches:
            break
    ended = time.perf_counter()
    del loader
    assert first is not None, "the loader yielded nothing"
    steady_s = max(ended - first, 1e-9)
    return {
        "batches": pulled,
        "tokens": tokens,
        "wall_s": ended - started,
        "first_batch_s": first - started,
        "tokens_per_s": tokens / (ended - started),
        "steady_tokens_per_s": (tokens - first_tokens) / steady_s,
    }


def stoker_loader(args: argparse.Namespace, epoch_seed: int) -> Any:
    import stoker

    loader = stoker.Loader(
        args.data,
        pipeline=[stoker.ops.TokenWindows(args.seq_len)],
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed + epoch_seed,
        drop_last=True,
        num_threads=args.threads,
        output="torch",
    )
    return (batch["tokens"] for batch in loader)


def torch_loader(args: argparse.Namespace, epoch_seed: int) -> Any:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    seq_len = args.seq_len
    dtype = file_dtype(args.data)

    class Windows(Dataset):  # type: ignore[type-arg]
        def __init__(self, path: Path) -> None:
            self.path = path
            self.tokens = np.memmap(path, dtype=dtype, mode="r")
            self.count = (len(self.tokens) - 1) // seq_len

        def __len__(self) -> int:
            return self.count

        def __getitem__(self, index: int) -> torch.Tensor:
            start = index * seq_len
            return torch.from_numpy(np.array(self.tokens[start : start + seq_len + 1]))

    generator = torch.Generator()
    generator.manual_seed(args.seed + epoch_seed)
    return DataLoader(
        Windows(args.data),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
        generator=generator,
        persistent_workers=False,
    )


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as file:
        while file.read(64 << 20):
            pass


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    warm_page_cache(args.data)
    runs: dict[str, list[dict[str, float]]] = {"stoker": [], "torch": []}
    for repeat in range(args.repeat):
        runs["stoker"].append(
            timed_run(partial(stoker_loader, args, repeat), args.batches, args.seq_len)
        )
        runs["torch"].append(
            timed_run(partial(torch_loader, args, repeat), args.batches, args.seq_len)
        )
        print(
            f"run {repeat + 1}/{args.repeat}: stoker "
            f"{runs['stoker'][-1]['tokens_per_s'] / 1e6:.1f} M tokens/s, torch "
            f"{runs['torch'][-1]['tokens_per_s'] / 1e6:.1f} M tokens/s",
            file=sys.stderr,
        )

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    report: dict[str, Any] = {
        "data": str(args.data),
        "dtype": file_dtype(args.data),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "batches": args.batches,
        "stoker_threads": args.threads,
        "torch_workers": args.workers,
        "repeat": args.repeat,
    }
    for name in ("stoker", "torch"):
        for key in ("tokens_per_s", "steady_tokens_per_s", "first_batch_s"):
            report[f"{name}_{key}"] = median(name, key)
    report["ratio"] = report["stoker_tokens_per_s"] / report["torch_tokens_per_s"]
    report["steady_ratio"] = (
        report["stoker_steady_tokens_per_s"] / report["torch_steady_tokens_per_s"]
    )
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"token file {args.data} ({report['dtype']}), seq_len {args.seq_len}, batch "
        f"{args.batch_size}, {args.batches} batches, median of {args.repeat}"
    )
    print(f"{'loader':<28}{'M tokens/s':>12}{'steady':>10}{'first batch':>14}")
    for name, label in (
        ("stoker", f"stoker ({args.threads} threads)"),
        ("torch", f"DataLoader (workers {args.workers})"),
    ):
        print(
            f"{label:<28}{report[f'{name}_tokens_per_s'] / 1e6:>12.1f}"
            f"{report[f'{name}_steady_tokens_per_s'] / 1e6:>10.1f}"
            f"{report[f'{name}_first_batch_s'] * 1e3:>11.0f} ms"
        )
    print(f"stoker / DataLoader: {report['ratio']:.1f}x ({report['steady_ratio']:.1f}x steady)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
