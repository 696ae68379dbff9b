"""Batches are views of Rust-owned slots: no copy, bounded memory, the GIL free while waiting."""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import stoker
from conftest import assert_same_batches, epoch_batches
from stoker import _native


def buffer_behind(array: np.ndarray) -> _native.Buffer:
    """The native Buffer at the end of the array's ``base`` chain."""
    owner: Any = array
    while owner is not None and not isinstance(owner, _native.Buffer):
        # ndarray views point at their base; np.frombuffer's base is a memoryview of the Buffer.
        owner = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
    assert isinstance(owner, _native.Buffer), "the array does not view a stoker Buffer"
    return owner


def test_arrays_view_the_slot_without_a_copy(make_loader: Callable[..., stoker.Loader]) -> None:
    batch = next(iter(make_loader()))
    for name, array in batch.items():
        buffer = buffer_behind(array)
        assert array.ctypes.data == buffer.address, name
        assert array.nbytes <= buffer.nbytes
        assert array.flags.writeable
        assert not array.flags.owndata


def test_writing_into_a_batch_does_not_corrupt_later_ones(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    expected = epoch_batches(make_loader(seed=11))
    # Two slots only, so every slot is reused several times in the epoch.
    loader = make_loader(seed=11, prefetch=1, max_held_batches=1)
    got = []
    for batch in loader:
        got.append({name: array.copy() for name, array in batch.items()})
        batch["image"][...] = 0
        batch["label"][...] = -1
        del batch
    assert_same_batches(got, expected)


def test_holding_batches_is_bounded_and_says_so(make_loader: Callable[..., stoker.Loader]) -> None:
    loader = make_loader(prefetch=1, max_held_batches=1, timeout=1, batch_size=8)
    iterator = iter(loader)
    held = []
    started = time.monotonic()
    with pytest.raises(stoker.LoaderTimeoutError, match="held") as raised:
        for _ in range(len(loader)):
            held.append(next(iterator))
    assert time.monotonic() - started < 10
    assert isinstance(raised.value, TimeoutError)
    assert len(held) == 2  # prefetch + max_held_batches slots, all in the caller's hands
    assert loader.stats()["slots_in_use"] == loader.stats()["slot_capacity"] == 2
    assert iterator.step == 1
    held.clear()
    gc.collect()
    # Dropping the batches gives the slots back; the epoch goes on where it stopped.
    rest = sum(1 for _ in iterator)
    assert rest == len(loader) - 2


def test_a_slot_returns_only_when_its_last_view_is_gone(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader(prefetch=1, max_held_batches=1, timeout=1, batch_size=8)
    iterator = iter(loader)
    kept = next(iterator)["image"][:2]  # a view of a view still holds the slot
    second = next(iterator)
    with pytest.raises(stoker.LoaderTimeoutError):
        next(iterator)
    del kept, second
    gc.collect()
    assert next(iterator)["image"].shape[0] == 8


def test_the_gil_is_released_while_waiting(make_loader: Callable[..., stoker.Loader]) -> None:
    # One thread, full-scale decodes and big crops: each batch takes a while to make.
    pipeline = [stoker.ops.DecodeImage(), stoker.ops.RandomResizedCrop(448)]
    loader = make_loader(num_threads=1, prefetch=1, batch_size=24, pipeline=pipeline)
    counter = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counter
        while not stop.is_set():
            counter += 1
            # Sleeping hands the GIL back at once, so the main thread never waits on us.
            time.sleep(0.0005)

    # With a long switch interval the counter can only run while the main thread has let go
    # of the GIL by itself, which is what the loader must do while it waits.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    thread = threading.Thread(target=count, daemon=True)
    thread.start()
    try:
        iterator = iter(loader)
        advanced = 0
        waited = 0.0
        for _ in range(len(loader)):
            before, started = counter, time.perf_counter()
            next(iterator)
            waited += time.perf_counter() - started
            advanced += counter - before
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(previous)
    assert waited > 0.05, "the config is too fast to tell"
    assert advanced >= 10, (
        f"a Python thread ran only {advanced} times in {waited:.2f} s inside next()"
    )
