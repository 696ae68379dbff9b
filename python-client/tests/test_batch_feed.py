"""``BatchFeed``'s hand-out rules, checked on the CPU: with device delivery the next batch is
staged as soon as it is built, handed out by the next call of the same iterator only, and an
error taking it ahead is raised by that call, after the batch before it went out. The native
loader and the device stage are stand-ins here (the real ones need a GPU: ``test_gpu.py`` runs
the same path end to end there). Last, with real loaders: the feed does not keep its loader
alive."""

from __future__ import annotations

import gc
import weakref
from collections import deque
from pathlib import Path
from typing import Any

import pytest

import stoker
from stoker import vision
from stoker._batches import BatchFeed, Taken


class Native:
    """Stands in for the native loader: ``next_batch`` waits for a batch (here: takes the next
    one), ``try_next_batch`` takes one only when it is already built (``ready`` of them)."""

    def __init__(self, steps: int, ready: int = 99, fail_ahead_at: int | None = None) -> None:
        self.steps = steps
        self.queue = deque(range(steps))
        self.ready = ready
        self.fail_ahead_at = fail_ahead_at
        self.waited: list[int] = []
        self.ahead: list[int] = []
        self.handed_out: int | None = None
        self.restarts: list[int] = []

    def _item(self, step: int) -> Any:
        self.handed_out = step
        return (0, step, [], [step], [], None)

    def start_epoch(self, epoch: int, step: int) -> None:
        self.restarts.append(step)
        self.queue = deque(range(step, self.steps))
        self.handed_out = None

    def next_batch(self) -> Any:
        if not self.queue:
            return None
        step = self.queue.popleft()
        self.waited.append(step)
        return self._item(step)

    def try_next_batch(self) -> Any:
        if not self.queue or self.ready <= 0:
            return None
        if self.queue[0] == self.fail_ahead_at:
            raise RuntimeError(f"step {self.fail_ahead_at} failed")
        self.ready -= 1
        step = self.queue.popleft()
        self.ahead.append(step)
        return self._item(step)


class Stage:
    """Stands in for ``gpu.DeviceStage``: records what it hands out."""

    index = 0

    def __init__(self) -> None:
        self.handed_out: list[int] = []

    def hand_out(self, staged: Any) -> Any:
        self.handed_out.append(staged["step"])
        return staged


def make_batch(item: Any) -> Taken:
    _, step, _, indices, bad, _ = item
    return step, {"step": step}, list(indices), list(bad)


def feed_of(native: Native, stage: Stage | None) -> BatchFeed:
    return BatchFeed(lambda: native, make_batch, stage, None)  # type: ignore[arg-type]


def steps(feed: BatchFeed, generation: int, count: int, start: int = 0) -> list[int | None]:
    """What ``count`` calls of an iterator of ``generation`` get, its position at ``start``."""
    out: list[int | None] = []
    expected = start
    for _ in range(count):
        taken = feed.next(generation, 0, expected)
        out.append(None if taken is None else taken[0])
        if taken is not None:
            expected = taken[0] + 1
    return out


def test_on_the_device_the_next_batch_is_staged_while_this_one_goes_out() -> None:
    native, stage = Native(4), Stage()
    feed = feed_of(native, stage)
    assert steps(feed, 1, 5) == [0, 1, 2, 3, None]
    # Only the first batch was waited for; each later one was staged by the call before it.
    assert native.waited == [0] and native.ahead == [1, 2, 3]
    assert stage.handed_out == [0, 1, 2, 3]


def test_a_batch_not_built_yet_is_waited_for_by_the_call_that_needs_it() -> None:
    native = Native(3, ready=0)
    assert steps(feed_of(native, Stage()), 1, 4) == [0, 1, 2, None]
    assert native.waited == [0, 1, 2] and native.ahead == []


def test_a_batch_staged_for_an_older_iterator_is_not_handed_to_a_newer_one() -> None:
    native = Native(4)
    feed = feed_of(native, Stage())
    assert steps(feed, 1, 1) == [0]  # staged step 1 for generation 1
    # Generation 2 (a new iter(), set_epoch or load_state_dict) does not get it.
    assert steps(feed, 2, 1, start=2) == [2]
    assert native.waited == [0, 2]


def test_dropping_the_staged_batch_forgets_it() -> None:
    native = Native(3)
    feed = feed_of(native, Stage())
    assert steps(feed, 1, 1) == [0]
    feed.drop_staged()
    assert steps(feed, 1, 2, start=2) == [2, None]


def test_an_error_taking_a_batch_ahead_is_raised_by_the_call_that_would_return_it() -> None:
    native = Native(4, fail_ahead_at=1)
    feed = feed_of(native, Stage())
    assert steps(feed, 1, 1) == [0]  # this batch goes out although taking the next failed
    with pytest.raises(RuntimeError, match="step 1 failed"):
        feed.next(1, 0, 1)


@pytest.mark.parametrize("device", [False, True])
def test_batches_handed_out_that_the_loop_never_got_are_taken_again(device: bool) -> None:
    # The loop's position stayed at step 1 while the native side handed step 1 out (and, on
    # the device, step 2 ahead): an exception took them as the calls returned. The epoch
    # starts again at step 1 rather than go on at the step after the last handed out.
    native = Native(4)
    feed = feed_of(native, Stage() if device else None)
    assert steps(feed, 1, 1) == [0]
    native.next_batch()
    if device:
        feed.drop_staged()
        native.try_next_batch()
    assert steps(feed, 1, 4, start=1) == [1, 2, 3, None]
    assert native.restarts == [1]


def test_on_the_host_nothing_is_taken_ahead() -> None:
    native = Native(3)
    assert steps(feed_of(native, None), 1, 4) == [0, 1, 2, None]
    assert native.waited == [0, 1, 2] and native.ahead == []


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_a_loader_dropped_without_close_is_freed_at_once(dataset: Path, output: str) -> None:
    # The feed holds the loader's methods weakly: no reference cycle, so dropping the last
    # reference frees the loader (and stops its threads) without waiting for the collector.
    if output == "torch":
        pytest.importorskip("torch")
    gc.collect()
    gc.disable()
    try:
        loader = stoker.Loader(
            dataset,
            pipeline=vision.imagenet_train(32),
            batch_size=4,
            num_threads=1,
            output=output,
        )
        epoch = iter(loader)
        next(epoch)
        del epoch
        wrapped = stoker.Loader.from_dataset(list(range(8)), batch_size=4, output=output)
        next(iter(wrapped))
        refs = [weakref.ref(loader), weakref.ref(wrapped)]
        del loader, wrapped
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()
