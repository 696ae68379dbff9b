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
import logging

# Imported before `_close_at_exit` is registered below: exit handlers run newest first, so the
# loaders close (and stop their worker processes) before multiprocessing's own handler, which
# SIGTERMs every daemonic child, would end the workers under them (whose lanes would then
# start replacements while the interpreter exits).
import multiprocessing.util  # noqa: F401
import os
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, runtime_checkable

import numpy as np

from stoker import _native
from stoker._arguments import (
    check_int,
    check_on_error,
    import_torch,
    is_int,
    refuse_unexpected_for_dataset,
    resolve_output,
)
from stoker._batches import BatchSpent
from stoker._placement import Placement
from stoker._process_builder import ProcessBuilder
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
from stoker._settings import DatasetSettings, LoaderSettings, checked_settings
from stoker._source import reading_digest
from stoker._start_method import start_context
from stoker.errors import DatasetError
from stoker.ops import Op, check_pipeline

_log = logging.getLogger("stoker")

if TYPE_CHECKING:
    from stoker._native import NativeBatch, NativeLoader

__all__ = [
    "DatasetSide",
    "FromDataset",
    "SavedWithStates",
    "loading_epoch",
    "sample_rng",
    "sample_seed",
]


@runtime_checkable
class SavedWithStates(Protocol):
    """A dataset whose loader's states save more than the loader's own settings: a mix of
    Python datasets (``stoker.mix``) saves its fingerprint, which a resume compares."""

    def saved_with_states(self) -> dict[str, Any]:
        """The entries the loader's ``state_dict()`` adds."""
        ...


class DatasetSide:
    """A Python dataset's part of a :class:`stoker.Loader` made by ``Loader.from_dataset``:
    the threads or worker processes that load its batches (``builder``), the layout a batch
    is rebuilt in (or ``collate_fn``), the name the loader shows, and what its states save
    besides the loader's settings."""

    def __init__(
        self,
        builder: Any,
        layout: Layout,
        collate_fn: Callable[[list[Any]], Any] | None,
        name: str,
        saved: dict[str, Any],
        reading: str | None = None,
        pin_collated: bool = False,
    ) -> None:
        self.builder = builder
        self.layout = layout
        self.collate_fn = collate_fn
        # pin_memory with torch output: what collate_fn returns is memory of its own, not the
        # page-locked slot, and is pinned as DataLoader pins it.
        self.pin_collated = pin_collated and collate_fn is not None
        self.name = name
        self.saved = saved
        # The digest of ``pipeline``, Stoker's ops on the samples' encoded images (a state's
        # "reading"); None without one.
        self.reading = reading

    def batch(self, item: NativeBatch, torch: Any) -> Any:
        """The batch ``item`` holds, in the samples' structure (each leaf stacked to
        ``(n, *shape)``, a view of the slot), or ``collate_fn`` of its samples."""
        tensors, indices = item.tensors, item.sample_indices
        n = len(indices)
        leaves = []
        for (_, _, _, data), field in zip(tensors, self.layout.fields, strict=False):
            array = np.frombuffer(
                memoryview(data), dtype=field.dtype,
                count=n * field.nbytes // field.dtype.itemsize,
            ).reshape((n, *field.shape))
            leaves.append(torch.from_numpy(array) if torch is not None else array)
        if self.collate_fn is not None:
            samples = [rebuild(self.layout.template, [leaf[i] for leaf in leaves])
                       for i in range(n)]
            try:
                batch = self.collate_fn(samples)
            except Exception as error:  # the user's error on this batch: the batch is spent
                raise BatchSpent(error) from None
            if self.pin_collated and torch is not None:
                # DataLoader's own pinning of a collated batch (torch is optional: by name).
                batch = torch.utils.data._utils.pin_memory.pin_memory(batch)
        else:
            batch = rebuild(self.layout.template, leaves)
        return batch

    def loading_now(self) -> str:
        """What the lanes are loading now, for a timeout's message."""
        return str(self.builder.loading_now())

    def close(self) -> None:
        """Stops the worker processes and threads (a lane waiting on a worker returns at
        once). Idempotent."""
        self.builder.close()


# The loaders over Python datasets, closed at exit (a no-op for one closed before), before the
# interpreter tears down, so no worker process outlives it and no thread of theirs calls into
# a dying interpreter.
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for loader in list(_OPEN):
        loader.close()


class FromDataset:
    """Gives :class:`stoker.Loader` its second constructor, ``from_dataset``, over the same
    settings (:class:`stoker._settings.LoaderSettings`) as the first; the loader finishes it
    (``_over_dataset``)."""

    @classmethod
    def from_dataset(
        cls,
        dataset: Any,
        *,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        transform: Any = None,
        collate_fn: Any = None,
        num_threads: int | None = None,
        num_workers: int = 0,
        multiprocessing_context: Literal["forkserver", "spawn", "fork"] | Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int | Literal["auto"] = "auto",
        output: Literal["torch", "numpy"] | None = None,
        on_error: Literal["skip", "fail"] = "fail",
        timeout: float = 600.0,
        max_held_batches: int = 4,
        dashboard: int | str | None = None,
        dashboard_token_file: str | os.PathLike[str] | None = None,
        pipeline: Iterable[Op] | None = None,
        pin_memory: bool = False,
        pinned_memory_budget: int | None = None,
        **unsupported: Any,
    ) -> Self:
        """A loader over a map-style dataset (``__getitem__`` and ``__len__``, such as a
        ``torch.utils.data.Dataset``), run under Stoker's planner.

        The order is the native loader's for a source of ``len(dataset)`` samples with the same
        ``seed``, ``shuffle``, ``rank`` and ``world_size``: each index once per epoch, the same
        whatever ``num_threads`` or ``num_workers``; ``set_epoch``, ``state_dict`` and
        ``load_state_dict`` (also on another world size), ``stats()`` and ``dashboard=`` work
        as on a native source. Defaults follow DataLoader (``batch_size=1``,
        ``shuffle=False``).

        ``transform``, when given, is called on each sample as ``dataset[index]`` returns it,
        where that sample is loaded (a loader thread or a worker process), before it is
        batched; its result is the sample.

        Samples: ``dataset[0]`` is read once here to learn the layout; every sample must
        have its structure (a value, or tuples, lists and dicts of them) and, for each
        numpy array, torch tensor, PIL image or number in it, the same dtype and shape (a
        sample that differs fails; under ``on_error="skip"`` it is replaced, unless most of
        its batch, of 8 or more, differs too: then :class:`~stoker.DecodeError`, the dataset
        being of several layouts). A
        batch has that structure with each value stacked to ``(batch, *shape)`` (numbers
        become int64, float64 or bool arrays), like DataLoader's default collation; with
        ``collate_fn``, the batch is ``collate_fn(samples)`` over the batch's samples,
        called in the training loop's thread.

        Two ways to run the dataset's code:

        - ``num_workers=0`` (default): ``num_threads`` threads of this process each load
          whole batches (default 1: the dataset's code is called one sample at a time, as
          DataLoader's ``num_workers=0`` calls it, ahead of the training loop). More threads
          call ``dataset[i]`` at the same time, so the dataset must be safe to call from
          several threads (an open file it seeks and reads is not: keep one per thread in a
          ``threading.local()``, which lasts the loader's life on each of its threads, or
          use ``num_workers`` with each worker opening its own at its first ``dataset[i]``:
          one opened before the workers fork is shared by them, offset and all). Fast when
          the code releases the GIL (PIL decoding and resizing, numpy); pure-Python code runs
          one thread at a time.
        - ``num_workers=N``: N worker processes (``multiprocessing_context``: a start method's
          name or a ``multiprocessing.get_context(...)`` context; by default the
          start method the program set with ``multiprocessing.set_start_method``, as
          DataLoader takes it, else: ``"fork"``, the default on Linux (inherited; fastest to
          start and leanest;
          started before any of the loader's own threads, see the package README for the
          caveat of forking a process with threads), ``"forkserver"`` (the default elsewhere
          where available) or ``"spawn"`` (the dataset pickled once to each; a dataset class
          defined in a script read from stdin cannot be loaded there and is refused by
          name)). A worker loads a whole batch straight into its batch slot: the slots are
          one shared mapping (``memfd``, not ``/dev/shm``), so there are no pickled batches,
          no copy after the worker's, and the batches' memory stays bounded by the slots
          (each worker's own is the dataset's: under fork, the Python objects it touches
          are copied into it as DataLoader's workers copy them). Workers live as long as the
          loader (as DataLoader's with ``persistent_workers=True``) and hold the dataset as
          it was when they started: later changes to it do not reach them. A worker that
          cannot load the dataset (its module failing to import there, say) raises
          :class:`~stoker.DatasetError` with the end of its traceback; one that dies as it
          starts (a script without a ``__main__`` guard under spawn), a ``DatasetError`` saying
          so, its own error on stderr; one that has not loaded the dataset within ``timeout``
          seconds (a fresh interpreter hung importing the main module again, say), a
          :class:`~stoker.LoaderTimeoutError` saying so, the workers ended. They start side
          by side.

        Determinism: :func:`stoker.sample_rng` (a numpy generator) and
        :func:`stoker.sample_seed` give the code a seed of (seed, epoch, index), the same for
        any thread or process count. Code drawing from the global RNGs (``random``,
        ``numpy.random``, ``torch``; torchvision's v2 transforms do) is deterministic only
        with worker processes, where each sample starts with those three seeded from
        :func:`stoker.sample_seed`; threads share the global RNGs, so draws there depend on
        timing: use ``sample_rng()`` or a ``torch.Generator`` seeded from ``sample_seed()``.

        Native ops after Python: with ``pipeline=[stoker.ops.DecodeImage(), ...]`` (or
        ``stoker.vision.imagenet_train(224)``), a ``bytes`` value in the sample (an encoded
        image the dataset read) is decoded and augmented by Stoker's pipeline into that field
        (its output shape and dtype), with the GIL released and the native per-sample random
        stream: the same bytes at the same (seed, epoch, index) give the same pixels as a
        native source. Without ``pipeline``, ``bytes`` in a sample is refused.

        Errors in the dataset's code follow ``on_error``: ``"fail"`` (default, as DataLoader)
        raises :class:`~stoker.DecodeError` naming the index, the exception and its traceback;
        ``"skip"`` replaces the sample by the next one that loads (as native sources do),
        logged and listed in the iterator's ``bad_samples``. A failure of this machine or its
        storage rather than of the sample (``MemoryError`` itself, an ``OSError`` of I/O,
        descriptors or memory, or one such an error was raised ``from``) is tried again after
        0.1, 0.5 and 2 s, then raised as a ``DecodeError`` under either policy: never replaced
        by another sample. One of the network (``ConnectionError``, ``TimeoutError``, an
        unreachable host) is tried again the same way, then it is the sample's.

        ``pin_memory`` and ``pinned_memory_budget`` are :class:`Loader`'s: the slots (with
        worker processes, the shared mapping they write into) are page-locked once, so the
        batch's tensors report ``is_pinned()``; with ``collate_fn`` and ``output="torch"``, the
        tensors of the batch it returns are copied into pinned memory, as DataLoader does.

        Raises:
            TypeError: ``dataset`` is not map-style, or a sample holds a value that cannot be
                batched (the message names where in the sample).
            ValueError: an argument is out of range.
            stoker.DatasetError: the dataset is empty, or ``dataset[0]`` raised (under
                ``on_error="skip"``: and the next samples tried in its place).
        """
        torch_data = sys.modules.get("torch.utils.data")
        if torch_data is not None and isinstance(dataset, torch_data.IterableDataset):
            # Its __getitem__ is torch's, which raises: it is read through __iter__ alone.
            raise TypeError(
                f"from_dataset needs a map-style dataset; {type(dataset).__name__} is a torch "
                "IterableDataset (read in order through __iter__, with no sample at an index), "
                "even with a __len__"
            )
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(
                "from_dataset needs a map-style dataset (with __getitem__ and __len__), got "
                f"{type(dataset).__name__}"
            )
        length = len(dataset)
        if not is_int(length) or length < 1:
            raise DatasetError(
                f"the dataset has {length!r} samples; from_dataset needs at least one"
            )
        saved = dataset.saved_with_states() if isinstance(dataset, SavedWithStates) else {}
        refuse_unexpected_for_dataset(unsupported)
        for name, value in (("transform", transform), ("collate_fn", collate_fn)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")
        settings, rank_origin = checked_settings(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
            world_size=world_size, prefetch=prefetch, timeout=timeout,
            max_held_batches=max_held_batches, dashboard=dashboard,
            dashboard_token_file=dashboard_token_file,
        )
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
                # One by default: a DataLoader-era dataset may keep state that is not safe to
                # use from two threads at once (an open file it seeks and reads), which several
                # threads would turn into rows of other samples, silently.
                lanes, rule = 1, "one thread unless num_threads is given (a dataset's code " \
                    "is called one sample at a time, as DataLoader's num_workers=0 calls it)"
            else:
                lanes, rule = check_int(num_threads, "num_threads", 1, 4096), "num_threads"
            waiting_on = f"on {lanes} dataset threads"
        error_policy = check_on_error(on_error)
        output_kind = resolve_output(output)
        pinning = Placement.check(pin_memory=pin_memory, pinned_memory_budget=pinned_memory_budget)
        torch = import_torch("output='torch'") if output_kind == "torch" else None
        pinning = pinning.resolve(torch)

        image = reading = None
        if pipeline is not None:
            ops = [op.to_dict() for op in check_pipeline(pipeline)]
            image, reading = _native.ImagePipeline(ops), reading_digest({"ops": ops})
        # The first sample fixes the layout: read here in thread mode, by a worker in process
        # mode (so that this process never runs the dataset's code, nor starts what it starts).
        state = State(
            dataset, transform, NO_LAYOUT, settings.seed, error_policy, length, bool(workers), image
        )
        builder: Any
        if workers:
            builder = ProcessBuilder(state, workers, context, settings.timeout_s)
            try:
                layout = builder.probe(settings.timeout_s)
            except BaseException:
                builder.close()
                raise
        else:
            layout, note = probe(state)
            if note:
                _log.warning("%s", note)
            state.layout = layout
            builder = ThreadBuilder(state)
        try:
            settings = replace(
                settings, job_name=type(dataset).__name__, **pinning.pinning_arguments(torch)
            )
            native = _native.NativeLoader.from_dataset(
                settings,
                DatasetSettings(
                    builder=builder,
                    num_samples=length,
                    sample_bytes=[f.nbytes for f in layout.fields],
                    lanes=lanes,
                    waiting_on=waiting_on,
                    shared_slots=bool(workers),
                ),
            )
        except BaseException:
            builder.close()
            raise
        try:
            loader = cls._over_dataset(
                native,
                DatasetSide(
                    builder, layout, collate_fn, settings.job_name, saved, reading,
                    # Where pinning works here (with no driver it is one warning and
                    # pageable slots, as DataLoader runs without an accelerator).
                    pin_collated=(
                        pinning.pin_memory and pinning.pinned_on is not None and torch is not None
                    ),
                ),
                settings, output_kind, rule, rank_origin,
            )
            _OPEN.add(loader)
            return loader
        except BaseException:  # its workers, threads and port go now, not with the traceback
            builder.close()
            native.close()
            raise

    @classmethod
    def _over_dataset(
        cls, native: NativeLoader, side: DatasetSide, settings: LoaderSettings, output: str,
        thread_rule: str, rank_origin: str,
    ) -> Self:
        """The loader over ``native``, the native loader of the Python dataset ``side``
        loads (made by :class:`stoker.Loader`)."""
        raise NotImplementedError
