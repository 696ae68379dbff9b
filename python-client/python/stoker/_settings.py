"""The native loader's settings, defined once: :class:`stoker.Loader` and
``Loader.from_dataset`` fill these frozen dataclasses from their checked arguments (the
arguments both take through one check, :func:`checked_settings`), and
:class:`stoker._native.NativeLoader` reads them by attribute (``NativeLoader(settings, source)``,
``NativeLoader.from_dataset(settings, dataset)``). The native side lists the fields it reads in
``stoker._native.SETTINGS_FIELDS``; ``test_settings.py`` checks them against these.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from stoker import _native
from stoker._arguments import (
    MAX_U64,
    check_bool,
    check_int,
    check_prefetch,
    check_seconds,
    dashboard_address,
    dashboard_credential_path,
    resolve_rank,
)

__all__ = ["DatasetSettings", "LoaderSettings", "SourceSettings", "checked_settings"]

# One source of a mix as the native loader takes it: (uri, ops, weight, format, text column,
# the uris of a source of several names, split); and the mix: (sources, window, epoch rule,
# epoch samples).
MixSource = tuple[str, list[dict[str, Any]], float, str, str, list[str], str]
MixArguments = tuple[list[MixSource], int, str, int]


@dataclass(frozen=True, kw_only=True)
class LoaderSettings:
    """What every loader takes, whatever its source: the plan's order and ranks, the queue,
    the deadline, the dashboard and the slots' page-locking."""

    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    rank: int
    world_size: int
    # Batches prepared ahead; 0: a controller sizes the depth from the stall it observes.
    prefetch: int
    timeout_s: float
    max_held_batches: int
    # The controller's memory budget for batches in flight or waiting.
    max_prefetch_bytes: int = 2 << 30
    # "host:port" of the stall dashboard, and the file of its credential off loopback.
    dashboard: str | None = None
    dashboard_token_file: str | None = None
    # The job's name on the dashboard.
    job_name: str = "python"
    # The CUDA device whose driver page-locks the slots (None: pageable slots); with
    # pin_follow, the device the process uses when the first batch goes out, this one where it
    # uses none; within pinned_budget bytes for this process's loaders together.
    pin_device: int | None = None
    pin_follow: bool = False
    pinned_budget: int = 0
    # Names the streams a released batch is fenced on (stoker.gpu.release_streams).
    release_streams: Callable[[], list[tuple[int, int]]] | None = None


@dataclass(frozen=True, kw_only=True)
class SourceSettings:
    """A source Stoker reads itself: a path, URI or pattern (``uris`` holds every name of a
    source of several, ``source`` being the first), or a mix of sources; its pipeline, decode
    threads and bad-sample policy; the coordinator serving it in the distributed mode; where
    its images are decoded."""

    source: str
    ops: list[dict[str, Any]]
    # Decode threads; 0: all cores.
    num_threads: int
    on_error: Literal["skip", "fail"]
    format: str = "auto"
    shuffle_window: int = 0
    # JSONL's text field; "": "text".
    text_column: str = ""
    # The label column of Parquet, Hugging Face and MDS sets; "": found by name.
    label_column: str = ""
    # The image column of Parquet, Hugging Face and MDS sets; "": found by name or feature.
    image_column: str = ""
    address: str | None = None
    worker_grace_s: float = 120.0
    token: str | None = None
    tls_ca: str | None = None
    tls_server_name: str | None = None
    mix: MixArguments | None = None
    decode: Literal["cpu", "gpu", "auto"] = "cpu"
    gpu_memory: int = _native.DEFAULT_GPU_MEMORY
    library_dirs: list[str] = field(default_factory=list)
    # The device stage's tail, for the lane's kernel to apply when STOKER_GPU_DECODE_FUSED_TAIL=1
    # asks: (dtype, channel planes, (scale, shift) or None); None: no tail.
    gpu_tail: tuple[str, bool, tuple[list[float], list[float]] | None] | None = None
    uris: list[str] = field(default_factory=list)
    # The split to read; "": the only one.
    split: str = ""


@dataclass(frozen=True, kw_only=True)
class DatasetSettings:
    """A Python map-style dataset's source: ``builder.build`` fills each batch's slot,
    ``sample_bytes`` are each field's bytes per sample, and ``lanes`` threads (or worker
    processes, whose slots are then one shared mapping: ``shared_slots``) load at once."""

    builder: Any
    num_samples: int
    sample_bytes: list[int]
    lanes: int
    # What a timeout's message says the loader waits on ("on 4 dataset threads").
    waiting_on: str
    shared_slots: bool = False


def checked_settings(
    *,
    batch_size: object,
    shuffle: object,
    seed: object,
    drop_last: object,
    rank: object,
    world_size: object,
    prefetch: object,
    timeout: object,
    max_held_batches: object,
    dashboard: int | str | None,
    dashboard_token_file: str | os.PathLike[str] | None,
) -> tuple[LoaderSettings, str]:
    """The arguments :class:`stoker.Loader` and ``Loader.from_dataset`` share, checked (a
    ValueError names the first one out of range; rank and world size default as
    :func:`stoker._arguments.resolve_rank` says); the job's name and the pinning are the
    defaults until the constructor knows them (``dataclasses.replace``); with where rank and
    world size came from ("" when both were passed), which the ranks' check reads."""
    rank_, world, rank_origin = resolve_rank(rank, world_size)
    settings = LoaderSettings(
        batch_size=check_int(batch_size, "batch_size", 1, _native.MAX_BATCH_SIZE),
        shuffle=check_bool(shuffle, "shuffle"),
        seed=check_int(seed, "seed", 0, MAX_U64),
        drop_last=check_bool(drop_last, "drop_last"),
        rank=rank_,
        world_size=world,
        prefetch=check_prefetch(prefetch),
        timeout_s=check_seconds(timeout, "timeout"),
        max_held_batches=check_int(max_held_batches, "max_held_batches", 1, 4096),
        dashboard=dashboard_address(dashboard),
        dashboard_token_file=dashboard_credential_path(dashboard, dashboard_token_file),
    )
    return settings, rank_origin
