"""``Loader.from_dataset``: a team's own map-style ``Dataset`` under Stoker's planner.

The dataset's ``__getitem__`` (and an optional ``transform``) runs in Python, on threads of
this process or in worker processes; everything around it is the native loader's: the epoch
plan (shuffle, ranks, ``set_epoch``, exact resume, the same order as a native source of the
same length and seed), the bounded slot pool, the prefetch controller, the stall figures and
the dashboard.

How a sample travels: the first sample (``dataset[0]``) fixes the *layout*: its structure (a
tuple, list, dict or single value, nested) and, for each leaf (a numpy array, a torch tensor,
a PIL image, a Python or numpy scalar), a dtype and shape. Each batch's slot holds one region
per leaf, ``n`` rows of it; a sample's leaves are copied into their rows. Thread mode writes
straight into the slot. In process mode the loader's slots are one shared mapping (a
``memfd``, not ``/dev/shm``, sent to each worker once as a descriptor), and a worker writes
its batch straight into the slot too: no pickled batches, no copy after the worker's.
A batch comes back with the sample's structure, each leaf stacked (``(n, *shape)``), or as
``collate_fn(list_of_samples)`` when one is given.
"""

from __future__ import annotations

import atexit
import os
import weakref
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from stoker import _native
from stoker._arguments import (
    MAX_U32,
    MAX_U64,
    check_bool,
    check_int,
    check_on_error,
    check_prefetch,
    check_seconds,
    dashboard_address,
    dashboard_credential_path,
    default_threads,
    import_torch,
    is_int,
    resolve_output,
    resolve_rank,
)
from stoker._dataset_entry import register_dataset_builder
from stoker._dataset_workers import ProcessBuilder, start_context
from stoker._fork import ForkGuard
from stoker._loader import Loader
from stoker._placement import Placement
from stoker._samples import (
    NO_LAYOUT,
    Layout,
    State,
    ThreadBuilder,
    loading_epoch,
    probe,
    rebuild,
    sample_rng,
    sample_seed,
)
from stoker.errors import DatasetError
from stoker.ops import check_pipeline

__all__ = ["from_dataset", "loading_epoch", "sample_rng", "sample_seed"]


def from_dataset(
    dataset: Any,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    transform: Callable[[Any], Any] | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    num_threads: int | None,
    num_workers: int,
    multiprocessing_context: Literal["forkserver", "spawn", "fork"] | None,
    rank: int | None,
    world_size: int | None,
    prefetch: int | Literal["auto"],
    output: Literal["torch", "numpy"] | None,
    on_error: Literal["skip", "fail"],
    timeout: float,
    max_held_batches: int,
    dashboard: int | str | None,
    dashboard_token_file: str | os.PathLike[str] | None = None,
    pipeline: Any = None,
    pin_memory: bool = False,
    pinned_memory_budget: int | None = None,
) -> Any:
    """Builds the :class:`DatasetLoader` that ``Loader.from_dataset`` returns."""

    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(
            "from_dataset needs a map-style dataset (with __getitem__ and __len__), got "
            f"{type(dataset).__name__}"
        )
    length = len(dataset)
    if not is_int(length) or length < 1:
        raise DatasetError(f"the dataset has {length!r} samples; from_dataset needs at least one")
    for name, value in (("transform", transform), ("collate_fn", collate_fn)):
        if value is not None and not callable(value):
            raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")
    batch_size = check_int(batch_size, "batch_size", 1, MAX_U32)
    shuffle = check_bool(shuffle, "shuffle")
    seed = check_int(seed, "seed", 0, MAX_U64)
    drop_last = check_bool(drop_last, "drop_last")
    workers = check_int(num_workers, "num_workers", 0, 1024)
    if workers and num_threads is not None:
        raise ValueError(
            "give num_threads (threads in this process) or num_workers (worker processes), "
            "not both"
        )
    if workers:
        context = start_context(multiprocessing_context, dataset)
        lanes, rule = workers, "num_workers"
        waiting_on = f"on {workers} dataset worker processes"
    else:
        if multiprocessing_context is not None:
            raise ValueError("multiprocessing_context applies to num_workers >= 1 only")
        if num_threads is None:
            lanes, rule = default_threads()
        else:
            lanes, rule = check_int(num_threads, "num_threads", 1, 4096), "num_threads"
        waiting_on = f"on {lanes} dataset threads"
    prefetch_count = check_prefetch(prefetch)
    error_policy = check_on_error(on_error)
    seconds = check_seconds(timeout, "timeout")
    max_held = check_int(max_held_batches, "max_held_batches", 1, 4096)
    output_kind = resolve_output(output)
    rank_, world = resolve_rank(rank, world_size)
    pinning = Placement.check(pin_memory=pin_memory, pinned_memory_budget=pinned_memory_budget)
    torch = import_torch("output='torch'") if output_kind == "torch" else None
    pinning = pinning.resolve(torch)

    image = None
    if pipeline is not None:
        image = _native.ImagePipeline([op.to_dict() for op in check_pipeline(pipeline)])
    # The first sample fixes the layout: read here in thread mode, by a worker in process mode
    # (so that this process never runs the dataset's code, nor starts what it starts).
    state = State(
        dataset, transform, NO_LAYOUT, seed, error_policy, length, bool(workers), image
    )
    builder: Any
    if workers:
        builder = ProcessBuilder(state, workers, context)
        try:
            layout = builder.probe(seconds)
        except BaseException:
            builder.close()
            raise
    else:
        layout = probe(state)
        state.layout = layout
        builder = ThreadBuilder(state)
    try:
        native = _native.NativeLoader.from_dataset(
            builder,
            length,
            [f.nbytes for f in layout.fields],
            lanes,
            waiting_on,
            batch_size,
            shuffle,
            seed,
            drop_last,
            rank_,
            world,
            prefetch_count,
            seconds,
            max_held,
            dashboard=dashboard_address(dashboard),
            dashboard_token_file=dashboard_credential_path(dashboard, dashboard_token_file),
            job_name=type(dataset).__name__,
            shared_slots=bool(workers),
            **pinning.pinning_arguments(torch),
        )
    except BaseException:
        builder.close()
        raise
    try:
        return DatasetLoader._make(
            native, builder, layout, collate_fn, output_kind,
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank_,
            world_size=world, timeout=seconds, max_held_batches=max_held, thread_rule=rule,
            name=type(dataset).__name__,
        )
    except BaseException:  # its workers, threads and port go now, not with the traceback
        builder.close()
        native.close()
        raise


# Dataset loaders not closed yet: closed at exit, before the interpreter tears down, so no
# worker process outlives it and no thread of theirs calls into a dying interpreter.
_OPEN: weakref.WeakSet[DatasetLoader] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for loader in list(_OPEN):
        loader.close()


class DatasetLoader(Loader):
    """A :class:`stoker.Loader` over a Python dataset (see :meth:`Loader.from_dataset`).

    Iteration, ``len``, ``set_epoch``, ``state_dict``/``load_state_dict``, ``stats`` and
    the dashboard behave as for a native source; batches have the samples' structure.
    """

    _builder: Any
    _layout: Layout
    _collate_fn: Callable[[list[Any]], Any] | None
    # The mix of Python datasets this loader reads (stoker.mix), saved with its states.
    _mix_fingerprint: dict[str, Any] | None = None

    @classmethod
    def _make(cls, native: Any, builder: Any, layout: Layout,
              collate_fn: Any, output: str, **settings: Any) -> DatasetLoader:
        self = cls.__new__(cls)
        self._native = native
        self._fork = ForkGuard()
        self._closed = False  # set after _fork, which __del__ reads once this is set
        self._builder = builder
        self._layout = layout
        self._collate_fn = collate_fn
        self._batch_size = settings["batch_size"]
        self._shuffle = settings["shuffle"]
        self._seed = settings["seed"]
        self._drop_last = settings["drop_last"]
        self._shuffle_window = 0  # a Python dataset has no shards to shuffle by window
        self._rank = settings["rank"]
        self._world_size = settings["world_size"]
        self._timeout = settings["timeout"]
        self._max_held_batches = settings["max_held_batches"]
        self._thread_rule = settings["thread_rule"]
        self._source = settings["name"]
        self._ops = []
        self._output = output
        self._torch = import_torch("output='torch'") if output == "torch" else None
        self._finish_init()
        _OPEN.add(self)
        return self

    def __del__(self) -> None:
        # Closing here lets go of the interpreter while the threads finish; a drop of the native
        # loader by the collector would wait for them holding it.
        if not getattr(self, "_closed", True) and not self._fork.forked:
            self.close()

    def close(self) -> None:
        """Stops the worker processes and threads. Idempotent; batches already yielded
        stay valid."""
        if self._closed:
            return
        try:
            if self._native is not None and not self._fork.forked:
                self._native.interrupt()  # a next() waiting in another thread ends now
            builder = getattr(self, "_builder", None)
            if builder is not None and not self._fork.forked:
                builder.close()  # a lane waiting on a worker then returns at once
        finally:
            # Also when interrupted (Ctrl-C in the workers' grace period): the threads stop.
            super().close()
            _OPEN.discard(self)

    def state_dict(self) -> dict[str, Any]:
        """As :meth:`stoker.Loader.state_dict`; for a mix of Python datasets also the mix
        (each dataset's length and weight, the window, the rule, the shuffle), which
        :meth:`load_state_dict` compares."""
        state = super().state_dict()
        if self._mix_fingerprint is not None:
            state["mix"] = self._mix_fingerprint
        return state

    def __repr__(self) -> str:
        position = self._position
        state = "closed" if self._closed else f"epoch={position.epoch}, step={position.step}"
        return (
            f"DatasetLoader({self._source}, batch_size={self._batch_size}, "
            f"rank={self._rank}, world_size={self._world_size}, {state})"
        )

    def _loading_now(self) -> str:
        builder = self._builder
        return builder.loading_now() if builder is not None else ""

    def _to_batch(self, item: _native.NativeBatch) -> tuple[int, Any, list[int], list[Any]]:
        step, tensors = item.step, item.tensors
        indices, bad = item.sample_indices, item.bad_samples
        if self._pin_unsettled:
            self._settle_pinning()
        n = len(indices)
        leaves = []
        for (_, _, _, data), field in zip(tensors, self._layout.fields, strict=False):
            array = np.frombuffer(
                memoryview(data), dtype=field.dtype,
                count=n * field.nbytes // field.dtype.itemsize,
            ).reshape((n, *field.shape))
            leaves.append(self._torch.from_numpy(array) if self._torch is not None else array)
        if self._collate_fn is not None:
            samples = [rebuild(self._layout.template, [leaf[i] for leaf in leaves])
                       for i in range(n)]
            batch = self._collate_fn(samples)
        else:
            batch = rebuild(self._layout.template, leaves)
        self._bad_log.note(bad)
        return step, batch, list(indices), list(bad)


register_dataset_builder(from_dataset)
