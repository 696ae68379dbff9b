"""How a loader hands out its batches: what a batch from the native loader becomes in Python
(its tensors as numpy arrays or torch tensors viewing the batch's slot, no copy), the log of the
samples it replaced, the :class:`BatchFeed` that takes batches from the native loader (staging
the next one ahead on the device, timing the GPU's wait) and the :class:`BatchIterator` an
epoch's ``iter()`` returns.
"""

from __future__ import annotations

import inspect
import logging
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

import numpy as np

from stoker.errors import LoaderTimeoutError, StokerError
from stoker.gpu import GpuIdleMeter, warn_unpinned

if TYPE_CHECKING:
    from stoker._native import BadSample, NativeBatch, NativeLoader
    from stoker._resume import Position
    from stoker.gpu import DeviceStage

__all__ = [
    "BadSampleLog",
    "BatchFeed",
    "BatchIterator",
    "BatchMaker",
    "BatchSpent",
    "Taken",
    "host_batch",
    "weakly",
]

P = ParamSpec("P")
R = TypeVar("R")

# A batch taken from the native loader: its step, its tensors (host arrays, or on the device
# what DeviceStage.stage returned), its samples' dataset indices and the samples it replaced.
Taken = tuple[int, Any, list[int], list["BadSample"]]

_log = logging.getLogger("stoker")

# Per-sample logs are capped: a folder full of bad files should not drown the training log.
MAX_LOGGED_BAD_SAMPLES: Final = 20


class BatchSpent(Exception):
    """What a batch maker raises for an error of the user's code on that batch (its
    ``collate_fn``): the batch is spent, as DataLoader's is, the error raised as it was, and
    the next ``next()`` gives the batch after it. Kept to be made again, as a batch whose
    making met a Ctrl-C is, it raised the same error for good in a loop that catches it and
    goes on."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
        # The spent batch's step, set by the feed that took it.
        self.step = -1


def host_batch(
    tensors: Sequence[tuple[str, str, tuple[int, ...], Any]], torch: Any, pin_small: bool
) -> dict[str, Any]:
    """The batch's tensors (``(name, dtype, shape, Buffer)``) as numpy arrays, or torch tensors
    when ``torch`` is given, viewing the slot; with ``pin_small``, a tensor in pageable memory
    (labels the pool had no page-locked room for) is copied into torch's pinned memory."""
    batch: dict[str, Any] = {}
    for name, dtype, shape, data in tensors:
        count = math.prod(shape)
        # frombuffer keeps a reference to `data`, so the slot stays out of the pool as long
        # as this array, or any view of it, is alive.
        array = np.frombuffer(memoryview(data), dtype=np.dtype(dtype), count=count).reshape(shape)
        if torch is None:
            batch[name] = array
            continue
        tensor = torch.from_numpy(array)
        if pin_small and not data.pinned:
            # A small tensor (labels) the pool had no page-locked room for beside its slots
            # (the consumer holds as many): pinned as DataLoader pins them, by a copy into
            # torch's pinned memory.
            tensor = tensor.pin_memory()
        batch[name] = tensor
    return batch


class BadSampleLog:
    """Logs the samples replaced under ``on_error="skip"``: the first
    :data:`MAX_LOGGED_BAD_SAMPLES` of a loader each with its path, reason and substitute, then
    one line saying the rest are only counted."""

    def __init__(self) -> None:
        self._logged = 0

    def note(self, bad: Sequence[BadSample]) -> None:
        """Logs the replaced samples of one batch."""
        for sample in bad:
            self._logged += 1
            if self._logged <= MAX_LOGGED_BAD_SAMPLES:
                _log.warning(
                    "skipped bad sample %s (index %s): %s; replaced by sample %s",
                    sample.get("path"),
                    sample.get("sample_index"),
                    sample.get("reason"),
                    sample.get("substitute_index"),
                )
            if self._logged == MAX_LOGGED_BAD_SAMPLES:
                _log.warning(
                    "further bad samples are not logged; stats()['bad_samples'] counts them"
                )


def weakly(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, or for a bound method the method called through a weak reference to its
    object, so that what holds it does not keep that object alive; once the object is gone, a
    call raises a :class:`~stoker.StokerError` saying the loader is closed."""
    if not inspect.ismethod(function):
        return function
    reference = weakref.WeakMethod(function)

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = reference()
        if bound is None:
            raise StokerError("this Loader is closed; make a new one")
        result: R = bound(*args, **kwargs)
        return result

    return call


class BatchMaker:
    """What a batch from the native loader becomes in Python: on the device, what ``stage``
    made of it; on the host, its tensors viewing the slot (:func:`host_batch`), or a Python
    dataset's batch as ``rebuild`` makes it. With page-locked slots, torch tensors outside them
    are pinned by a copy once the driver context that locks the slots is known to open (with
    the first batch); where it does not, one warning (as where no driver is there), and they are
    not. Logs the samples each batch replaced. ``handle`` is held :func:`weakly`."""

    def __init__(
        self,
        handle: Callable[[], NativeLoader],
        torch: Any,
        stage: DeviceStage | None,
        rebuild: Callable[[NativeBatch, Any], Any] | None = None,
    ) -> None:
        stats = handle().stats()
        self._handle = weakly(handle)
        self._torch = torch
        self._stage = stage
        self._rebuild = rebuild
        self._pin_small = bool(stats["pinned"]) and torch is not None
        self._pin_unsettled = bool(stats["pinned"]) and stats["pinned_device"] is None
        self._bad_log = BadSampleLog()

    def make(self, item: NativeBatch) -> Taken:
        """The batch ``item`` holds, with its step, indices and replaced samples."""
        batch: Any
        if self._stage is not None:
            # The tensors on the device and the event that says they are ready.
            batch = self._stage.stage(item.tensors, item.device_rows, item.row_places)
        else:
            if self._pin_unsettled:
                self._settle_pinning()
            if self._rebuild is not None:
                try:
                    batch = self._rebuild(item, self._torch)
                except BatchSpent:
                    # Spent, never made again: the samples it replaced are told now.
                    self._bad_log.note(item.bad_samples)
                    raise
            else:
                batch = host_batch(item.tensors, self._torch, self._pin_small)
        self._bad_log.note(item.bad_samples)
        return item.step, batch, list(item.sample_indices), list(item.bad_samples)

    def _settle_pinning(self) -> None:
        stats = self._handle().stats()
        if stats["pinned_device"] is not None:
            self._pin_unsettled = False
        elif stats["pin_error"] is not None:
            self._pin_unsettled = self._pin_small = False
            warn_unpinned(stats["pin_error"])


class BatchFeed:
    """Takes one loader's batches from its native loader and makes them Python batches
    (``make_batch``). With device delivery (``stage``) it hands out each staged batch and, when
    the next one is already built, stages that one at once, so its copy runs while the GPU
    still works on this one; with ``torch``, a :class:`~stoker.gpu.GpuIdleMeter` times the
    consumer stream's wait around each batch. ``handle`` and ``make_batch`` are held
    :func:`weakly`: given a loader's own methods, the feed does not keep the loader alive, so a
    loader dropped without ``close()`` is freed at once (threads stopped, slots let go)."""

    def __init__(
        self,
        handle: Callable[[], NativeLoader],
        make_batch: Callable[[NativeBatch], Taken],
        stage: DeviceStage | None,
        torch: Any,
        loading_now: Callable[[], str] | None = None,
    ) -> None:
        # The native loader, or a StokerError saying why it cannot be used (closed, forked).
        self.handle = weakly(handle)
        self._make_batch = weakly(make_batch)
        # What the source's lanes are loading, added to a timeout's message (from_dataset).
        self._loading_now = weakly(loading_now) if loading_now is not None else None
        self.stage = stage
        # Whenever torch tensors are handed out (it only records once torch has started CUDA).
        self._meter: GpuIdleMeter | None = None
        if torch is not None:
            index = stage.index if stage is not None else None
            native = handle()
            self._meter = GpuIdleMeter(torch, index, native.record_gpu_idle, native.lane_busy_s)
        # (the iterator generation it was taken for, the batch, or the error taking it raised).
        self._staged: tuple[int, Taken | Exception] | None = None
        # A batch taken from the native loader whose making raised (a Ctrl-C caught by a loop
        # that goes on, a failed pin): the next call makes it again rather than take the one
        # after it, so no step is skipped.
        self._unmade: tuple[int, Any] | None = None

    def drop_staged(self) -> None:
        """Forgets the batch staged ahead (a new iterator starts, or the loader closes)."""
        self._staged = self._unmade = None

    def next(self, generation: int, epoch: int, expected: int) -> Taken | None:
        """The next batch for the iterator of ``generation``, which runs ``epoch`` and yielded
        every step before ``expected``; None at the end of the epoch."""
        native = self.handle()
        meter = self._meter
        if meter is not None:
            meter.before()
        try:
            taken = self._take_staged(generation)
            if taken is None:
                unmade, self._unmade = self._unmade, None
                if unmade is not None and unmade[0] == generation:
                    item = unmade[1]
                else:
                    handed = native.handed_out
                    if handed is not None and handed >= expected:
                        # Batches were handed out that the loop never got: an exception (a
                        # Ctrl-C a loop catches and goes on after) raised as the native call
                        # returned, or while the batch was made or staged. The epoch starts
                        # again there, so no step is skipped.
                        _log.debug(
                            "steps %d..%d were handed out but not yielded; epoch %d goes on "
                            "from step %d",
                            expected,
                            handed,
                            epoch,
                            expected,
                        )
                        native.start_epoch(epoch, expected)
                    try:
                        item = native.next_batch()
                    except LoaderTimeoutError as error:
                        raise self._explained(error) from None
                if item is None:
                    if meter is not None:
                        meter.cancel()
                    return None
                try:
                    taken = self._make_batch(item)
                except BatchSpent as spent:
                    spent.step = item.step
                    raise
                except BaseException:
                    self._unmade = (generation, item)
                    raise
            stage = self.stage
            if stage is not None:
                step, staged, indices, bad = taken
                taken = step, stage.hand_out(staged), indices, bad
                try:
                    ahead = native.try_next_batch()
                    if ahead is not None:
                        self._staged = (generation, self._make_batch(ahead))
                except BatchSpent as spent:  # raised by the next call, this batch goes out
                    spent.step = ahead.step if ahead is not None else -1
                    self._staged = (generation, spent)
                except Exception as error:  # raised by the next call, this batch goes out
                    self._staged = (generation, error)
        except BaseException:
            if meter is not None:
                meter.cancel()
            raise
        if meter is not None:
            meter.after()
        return taken

    def _explained(self, error: LoaderTimeoutError) -> LoaderTimeoutError:
        """``error`` with what the source's lanes are loading added, when it says."""
        if self._loading_now is None:
            return error
        try:
            loading = self._loading_now()
        except Exception as failed:  # the timeout is what the caller must see
            loading = f"(what the lanes are loading could not be read: {failed})"
        return LoaderTimeoutError(f"{error}; {loading}") if loading else error

    def _take_staged(self, generation: int) -> Taken | None:
        staged, self._staged = self._staged, None
        if staged is None or staged[0] != generation:
            return None
        taken = staged[1]
        if isinstance(taken, Exception):
            raise taken
        return taken


class BatchIterator(Iterator[dict[str, Any]]):
    """One epoch of a :class:`stoker.Loader`; what ``iter(loader)`` returns.

    Besides yielding batches it tells where the last one came from, which is handy for
    debugging and for checking coverage: :attr:`epoch`, :attr:`step`,
    :attr:`sample_indices` (dataset indices of the batch's samples, in order) and
    :attr:`bad_samples` (samples of that batch replaced under ``on_error="skip"``).
    """

    def __init__(
        self, feed: BatchFeed, position: Position, epoch: int, length: Callable[[], int]
    ) -> None:
        self._feed = feed
        self._position = position
        self._generation = position.generation
        self._length = length
        self._done = False
        self.epoch: int = epoch
        """The epoch this iterator runs."""
        self.step: int | None = None
        """The step of the last batch yielded."""
        self.sample_indices: list[int] = []
        """Dataset indices of the last batch's samples."""
        self.bad_samples: list[BadSample] = []
        """Samples of the last batch that were replaced (``sample_index``, ``path``, ``reason``,
        ``substitute_index``)."""

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._done:
            raise StopIteration
        self._feed.handle()
        position = self._position
        with position.held("next()"):
            if position.generation != self._generation:
                raise StokerError(
                    "this iterator is stale: iter(), set_epoch() or load_state_dict() was "
                    "called on its Loader since; iterate the Loader again"
                )
            expected = position.step if position.resume_step is None else position.resume_step
            spent: Exception | None = None
            try:
                taken = self._feed.next(self._generation, self.epoch, expected)
            except BatchSpent as error:
                # Counted as handed out, so the next call goes on after it (and a state saved
                # now resumes after it).
                position.yielded(error.step)
                spent = error.error
            if spent is not None:
                raise spent
            if taken is None:
                self._done = True
                position.finish_epoch(self.epoch)
                raise StopIteration
            step, batch, self.sample_indices, self.bad_samples = taken
            self.step = step
            position.yielded(step)
        out: dict[str, Any] = batch
        return out

    def __len__(self) -> int:
        return self._length()
