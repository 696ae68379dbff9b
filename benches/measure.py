"""How the Python comparisons measure a loader's process without slowing it down.

Shared by compare_loader.py, compare_streaming.py and compare_dataset.py (memory, CPU, medians
of runs) and compare_torch.py (background CPU).

Memory: the figure wanted is the peak memory of a loader's whole process tree (the interpreter
and any worker processes it forks), each page counted once. PSS (proportional set size) splits
a shared page between the processes that map it, so a forked worker adds only the pages it has
copied or made, where summed RSS would count the parent's ~700 MiB again for every worker.

Reading PSS is not free. For ``/proc/PID/smaps_rollup`` the kernel walks every page table of
the process under its memory-map lock: 8.5-19 ms of CPU for an interpreter with torch loaded,
during which the process's own page faults and mmap/munmap calls contend with the walk. Read
every 50 ms from inside the loader's process, that took a fifth to a third of a core from two
decode threads on a 2-core machine, and the benchmark measured a slower loader than the one
users get. So the tree is read from the parent process, rarely (``PeakWatch``, once a second by
default: 1-2% of a core), plus once by the loader's process after its clock has stopped, with
the loader still alive and at its fullest. A peak shorter than the period between two samples
can be missed; the final sample catches the steady state, which is where both loaders peak.

Not cgroups: a cgroup's peak (``memory.peak``, cgroup v2) would be exact and free to read, but
it needs a delegated cgroup v2 subtree with the memory controller (the dev machines mount the
memory controller on cgroup v1), and it charges the page cache of the images read to whichever
cgroup first reads them, which PSS leaves out.
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

KIB = 1024
MIB = 1024 * 1024

# The comparisons' common settings: the crop every loader makes, and the batches in flight per
# worker (DataLoader's default prefetch_factor), which Stoker's prefetch is set from.
CROP_SIZE = 224
PREFETCH_FACTOR = 2


def pss_bytes(pid: int) -> int:
    """The process's proportional set size, or 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * KIB
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid``, from every thread's ``children`` list."""
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return children
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                children.extend(int(c) for c in listing.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return children


def tree_pss_bytes(root: int) -> int:
    """Summed PSS of ``root`` and all its descendants."""
    total, pending, seen = 0, [root], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += pss_bytes(pid)
        pending.extend(child_pids(pid))
    return total


class PeakWatch:
    """Samples the PSS of another process's tree every ``period_s`` seconds, keeping the peak.

    Runs in the process that started the measured one, so the reads cost the measured process
    only the mmap lock they hold, ``period_s`` apart. ``period_s`` 0 takes no samples at all.
    """

    def __init__(self, root: int, period_s: float) -> None:
        self.peak = 0
        self.samples = 0
        self._root = root
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.peak = max(self.peak, tree_pss_bytes(self._root))
            self.samples += 1

    def __enter__(self) -> Self:
        if self._period_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def comparison_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments compare_loader.py and compare_dataset.py both take (checked by
    :func:`check_comparison_arguments`)."""
    parser.add_argument("--data", type=Path, required=True, help="an ImageFolder tree")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=0, help="batches per run (0: one epoch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per configuration; each figure is the median"
    )
    parser.add_argument(
        "--memory-period",
        type=float,
        default=1.0,
        help="seconds between PSS samples of a running child (default 1; 0: only the final one)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)


def check_comparison_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits through ``parser.error`` when an argument of :func:`comparison_arguments` is out
    of range or ``--data`` is not a folder."""
    if args.batch_size < 1 or args.repeat < 1 or args.batches < 0 or args.memory_period < 0:
        parser.error("--batch-size and --repeat must be >= 1, --batches and --memory-period >= 0")
    if not args.data.is_dir():
        parser.error(f"--data {args.data} is not a folder")


@dataclass
class ChildRun:
    """What :func:`run_watched` saw of one child."""

    #: The JSON object of the child's last output line.
    result: dict[str, Any]
    #: The peak PSS of the child's tree, in MiB: the highest sample, or what the child
    #: reported at its end (``end_tree_pss_mib``) when that is higher.
    peak_mib: float
    #: CPU-seconds the child and the children it joined used.
    cpu_s: float
    #: PSS samples taken, counting the child's own end-of-run one.
    pss_samples: int


def main(
    argv: list[str],
    parse_args: Callable[[list[str]], argparse.Namespace],
    run_child: Callable[[argparse.Namespace], dict[str, Any]],
    compare: Callable[[argparse.Namespace, list[str]], int],
) -> int:
    """A comparison script's entry: its arguments parsed; in a child that ``run_watched``
    started (``--child``), the measured loader run and its figures printed as one JSON line;
    else ``compare``, the parent that starts the children with ``argv``."""
    args = parse_args(argv)
    if not args.child:
        return compare(args, argv)
    print(json.dumps(run_child(args)))
    return 0


def run_watched(script: str, argv: list[str], config: str, period_s: float) -> ChildRun:
    """Runs ``script *argv --child config`` in a fresh interpreter, the PSS of its tree sampled
    every ``period_s`` seconds from here (:class:`PeakWatch`); SystemExit when it fails."""
    before = cpu_seconds(resource.RUSAGE_CHILDREN)
    with (
        subprocess.Popen(
            [sys.executable, script, *argv, "--child", config], stdout=subprocess.PIPE, text=True
        ) as child,
        PeakWatch(child.pid, period_s) as watch,
    ):
        stdout, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"{config} failed with exit code {child.returncode}")
    # The child's CPU reaches RUSAGE_CHILDREN once it is reaped, its forked workers' once the
    # child has joined them (DataLoader does on shutdown).
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - before
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    peak = max(watch.peak / MIB, result["end_tree_pss_mib"])
    return ChildRun(result, peak, cpu, watch.samples + 1)


def busy_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy, from the first line of /proc/stat."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    # user nice system idle iowait irq softirq steal: everything but idle and iowait.
    ticks = [int(value) for value in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def cpu_seconds(who: int) -> float:
    """User and system CPU-seconds of ``who`` (``resource.RUSAGE_SELF`` or ``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's figures with every float replaced by its median over ``runs``."""
    merged = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            merged[key] = statistics.median(run[key] for run in runs)
    return merged


@dataclass
class TimedRun:
    """One loader run on one clock, started before the loader was built (:func:`timed_run`)."""

    loader: Any
    # Kept past the last batch: a DataLoader's workers live as long as its iterator.
    iterator: Any
    images: int
    batches: int
    seconds: float
    first_batch_s: float


def timed_run(build: Callable[[], Any], limit: int) -> TimedRun:
    """Builds a loader and iterates it for ``limit`` batches (0: one epoch, ``len(loader)``
    batches where it has a length, else until it ends), counting a batch's images as the rows
    of its labels (Stoker's ``"label"``, or the second of a DataLoader's pair); the clock
    starts before the build, so the first batch's time includes it. The iterator is not asked
    past the last batch and is kept (``iterator``): a PSS read once this returns sees every
    process of the run. DataLoader's iterator ends its workers as it raises StopIteration, or
    as it is dropped."""
    images = batches = 0
    started = time.perf_counter()
    loader = build()
    length = _length(loader)
    last = min(limit, length) if limit and length else limit or length
    first_batch_s = math.nan
    iterator = iter(loader)
    for batch in iterator:
        labels = batch["label"] if isinstance(batch, dict) else batch[1]
        images += int(labels.shape[0])
        batches += 1
        if batches == 1:
            first_batch_s = time.perf_counter() - started
        if batches == last:
            break
    elapsed = time.perf_counter() - started
    return TimedRun(loader, iterator, images, batches, elapsed, first_batch_s)


def _length(loader: Any) -> int:
    """The loader's batches per epoch; 0 where it has no length."""
    try:
        return len(loader)
    except TypeError:
        return 0


def print_table(columns: list[tuple[str, int]], rows: list[list[str]]) -> None:
    """Prints ``rows`` of formatted cells under a header of ``columns`` (title, width) and a
    rule: the first column left-aligned, the others right-aligned."""

    def line(cells: list[str]) -> str:
        first, *rest = zip(cells, (width for _, width in columns), strict=True)
        return first[0].ljust(first[1]) + "".join(cell.rjust(width) for cell, width in rest)

    header = line([title for title, _ in columns])
    print(header)
    print("-" * len(header))
    for row in rows:
        print(line(row))


def epoch_figures(
    config: str, images: int, batches: int, elapsed: float, first_batch_s: float,
    batch_size: int, baseline_pss: int, after_imports_pss: int, end_tree_pss: int,
) -> dict[str, Any]:
    """What a child reports of one run: images/s with and without the first batch, the first
    batch's time and the PSS it read before its clock started and after it stopped."""
    steady_images = images - batch_size
    return {
        "config": config,
        "images": images,
        "batches": batches,
        "seconds": elapsed,
        "images_per_s": images / elapsed,
        "steady_images_per_s": steady_images / (elapsed - first_batch_s)
        if steady_images > 0
        else float("nan"),
        "first_batch_s": first_batch_s,
        "baseline_pss_mib": baseline_pss / MIB,
        "after_imports_pss_mib": after_imports_pss / MIB,
        "end_tree_pss_mib": end_tree_pss / MIB,
    }


def watched_run(script: str, argv: list[str], config: str, period_s: float) -> dict[str, Any]:
    """One fresh child running ``config`` (:func:`run_watched`): its figures, with its peak
    PSS, the memory it added over the interpreter and over its imports, its CPU, and the CPU the
    rest of the machine used meanwhile."""
    busy_before = busy_cpu_seconds()
    self_before = cpu_seconds(resource.RUSAGE_SELF)
    run = run_watched(script, argv, config, period_s)
    # Our own share is mostly the PSS reads; neither is the rest of the machine's.
    own_cpu = run.cpu_s + cpu_seconds(resource.RUSAGE_SELF) - self_before
    result = run.result
    result.update(
        peak_tree_pss_mib=run.peak_mib,
        added_mib=run.peak_mib - result["baseline_pss_mib"],
        loader_only_mib=run.peak_mib - result["after_imports_pss_mib"],
        pss_samples=run.pss_samples,
        cpu_s=run.cpu_s,
        cpu_ms_per_image=run.cpu_s * 1e3 / max(result["images"], 1),
        background_cpu_s=max(0.0, busy_cpu_seconds() - busy_before - own_cpu),
    )
    return result
