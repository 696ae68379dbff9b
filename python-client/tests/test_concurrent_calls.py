"""A Loader used from more than one thread: ``stats()`` from a monitoring thread while another
iterates, ``close()`` from another thread while ``next()`` waits, and ``iter()`` meanwhile; and
``close()`` from a signal handler that runs while ``next()`` waits on the same thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

import stoker


def test_stats_from_another_thread_while_iterating(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader(batch_size=8, num_threads=1)
    failures: list[BaseException] = []
    polls = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal polls
        while not done.is_set():
            try:
                stats = loader.stats()
                assert stats["slot_capacity"] > 0
                len(loader)
                loader.dashboard_url  # noqa: B018 (a getter of the native loader)
                polls += 1
            except BaseException as error:
                failures.append(error)
                return
            time.sleep(0.0002)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        counts = [_epoch(loader, epoch) for epoch in range(3)]
    finally:
        done.set()
        watcher.join(10)
    assert failures == []
    assert polls > 10
    assert counts == [(len(loader), loader.num_samples)] * 3


def _epoch(loader: stoker.Loader, epoch: int) -> tuple[int, int]:
    """The batches and samples of one epoch."""
    loader.set_epoch(epoch)
    sizes = [batch["label"].shape[0] for batch in loader]
    return len(sizes), sum(sizes)


class SlowSquares:
    """Each sample takes 1 s."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        time.sleep(1)
        return np.full(3, index, dtype=np.float32), index


@pytest.mark.parametrize("lanes", [{"num_threads": 1}, {"num_workers": 1}])
def test_close_from_another_thread_ends_a_waiting_next(lanes: dict[str, int]) -> None:
    loader = stoker.Loader.from_dataset(
        SlowSquares(), batch_size=4, prefetch=1, output="numpy", timeout=60, **lanes
    )
    iterator = iter(loader)
    closed_at: list[float] = []
    failures: list[BaseException] = []

    def close_soon() -> None:
        time.sleep(0.3)
        closed_at.append(time.monotonic())
        try:
            loader.close()
        except BaseException as error:
            failures.append(error)

    closer = threading.Thread(target=close_soon)
    closer.start()
    # The first batch takes 4 s to build; close() comes 0.3 s into the wait and ends it.
    with pytest.raises(stoker.StokerError, match="closed"):
        next(iterator)
    raised_at = time.monotonic()
    closer.join(30)
    assert not closer.is_alive()
    assert failures == []
    assert closed_at and raised_at - closed_at[0] < 1.0
    assert loader.closed
    with pytest.raises(stoker.StokerError, match="closed"):
        loader.stats()


SIGNAL_HANDLER_CLOSES = """
import os, signal, sys, threading
import stoker
root = stoker._native.make_dataset(sys.argv[1], 32)
loader = stoker.Loader(root, pipeline=stoker.vision.imagenet_eval(16), batch_size=8,
                       output="numpy", num_threads=1, prefetch=1, max_held_batches=1, timeout=60)
def stop(*_):
    loader.close()
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
iterator = iter(loader)
kept = [next(iterator), next(iterator)]  # every slot held: the next next() waits
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
next(iterator)
"""


def test_close_from_a_signal_handler_during_next_ends_the_wait(tmp_path) -> None:
    """A SIGTERM handler that closes the loader, run while ``next()`` waits on the same thread
    (Python runs handlers there): the wait ends and the process exits as the handler says.
    Before, ``close()`` waited for the lock that very ``next()`` held, for good."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_HANDLER_CLOSES, str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr


SIGNAL_HANDLER_SETS_EPOCH = """
import os, signal, sys, threading
import stoker
root = stoker._native.make_dataset(sys.argv[1], 32)
loader = stoker.Loader(root, pipeline=stoker.vision.imagenet_eval(16), batch_size=8,
                       output="numpy", num_threads=1, prefetch=1, max_held_batches=1, timeout=60)
signal.signal(signal.SIGUSR1, lambda *_: loader.set_epoch(3))
iterator = iter(loader)
kept = [next(iterator), next(iterator)]  # every slot held: the next next() waits
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
try:
    next(iterator)
except stoker.StokerError as error:
    print(error)
    sys.exit(4)
"""


def test_set_epoch_from_a_signal_handler_during_next_is_refused_not_waited_for(tmp_path) -> None:
    """A handler calling ``set_epoch()`` (``iter()`` and ``load_state_dict()`` alike) while
    ``next()`` waits on the same thread: an error naming the call, where before it waited for
    the lock that very ``next()`` held, for good."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_HANDLER_SETS_EPOCH, str(tmp_path / "data")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert "set_epoch() was called while this thread's next() waits" in done.stdout, done.stdout


class Indexed:
    """Samples that are their index, 0.2 s each."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> np.ndarray:
        time.sleep(0.2)
        return np.full(1, index, dtype=np.int64)


def test_iter_while_another_thread_waits_in_next_starts_after_that_batch() -> None:
    loader = stoker.Loader.from_dataset(
        Indexed(), batch_size=4, num_threads=1, prefetch=1, shuffle=False, output="numpy",
        timeout=60,
    )
    with loader:
        first = iter(loader)
        next(first)
        taken: list[list[int]] = []

        asking = threading.Event()

        def take() -> None:
            asking.set()
            next(first)
            taken.append(sorted(first.sample_indices))

        waiting = threading.Thread(target=take)
        waiting.start()
        asking.wait(10)
        time.sleep(0.3)  # the other thread now waits for step 1, built in 0.8 s
        second = iter(loader)
        next(second)
        waiting.join(30)
        # Step 1 went to the thread that asked first; the new iterator starts at step 2.
        assert taken == [[4, 5, 6, 7]]
        assert sorted(second.sample_indices) == [8, 9, 10, 11]
