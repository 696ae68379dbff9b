"""Resuming mid-epoch on another world size: every sample of the epoch exactly once overall,
from one rank's state or all of them, and the plain next epoch afterwards."""

from __future__ import annotations

import contextlib
import gc
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stoker
from conftest import SAMPLE_COUNT, read_indices

BATCH = 4


def _read(loader: stoker.Loader, steps: int | None = None) -> tuple[list[int], dict[str, Any]]:
    """Sample indices of ``steps`` batches (all: None) of the current epoch, and the state
    after them."""
    return read_indices(loader, steps), loader.state_dict()


def _saved_in_epoch_1(
    make_loader: Callable[..., stoker.Loader], world_size: int, steps: int
) -> dict[str, Any]:
    """The state rank 0 of ``world_size`` ranks saves after ``steps`` batches of epoch 1."""
    loader = make_loader(batch_size=BATCH, rank=0, world_size=world_size, seed=9)
    loader.set_epoch(1)
    state = _read(loader, steps)[1]
    loader.close()
    return state


def _run(
    make_loader: Callable[..., stoker.Loader], old: int, steps: list[int], new: int, merged: bool
) -> list[int]:
    """``old`` ranks read ``steps[r]`` batches of epoch 1; ``new`` ranks resume from one state
    (all ranks at the same step) or all of them; returns every index read."""
    read: list[int] = []
    states = []
    for rank in range(old):
        loader = make_loader(batch_size=BATCH, rank=rank, world_size=old, seed=9)
        loader.set_epoch(1)
        indices, state = _read(loader, steps[rank])
        read.extend(indices)
        states.append(state)
        loader.close()
    for rank in range(new):
        loader = make_loader(batch_size=BATCH, rank=rank, world_size=new, seed=9)
        # One dict is enough when all ranks saved at the same step; any rank's will do.
        loader.load_state_dict(states if merged else states[(rank + 1) % old])
        assert loader.epoch == 1
        steps = len(loader)
        indices, state = _read(loader)
        read.extend(indices)
        assert 0 < steps < 120 // new // BATCH + 1
        assert state["epoch"] == 2 and state["step"] == 0 and state["resizes"] == []
        # The next epoch is the plain one of the new world size.
        plain = make_loader(batch_size=BATCH, rank=rank, world_size=new, seed=9)
        plain.set_epoch(2)
        assert _read(loader)[0] == _read(plain)[0]
    return read


@pytest.mark.parametrize(("old", "stop", "new"), [(4, 3, 2), (2, 3, 3)])
def test_a_resumed_epoch_reads_each_sample_once(
    make_loader: Callable[..., stoker.Loader], old: int, stop: int, new: int
) -> None:
    # 120 samples: 4 ranks read 48, 2 ranks then 36 each; 2 ranks read 24, 3 ranks 32 each.
    read = _run(make_loader, old, [stop] * old, new, merged=False)
    assert sorted(read) == list(range(SAMPLE_COUNT))


def test_all_states_account_for_ranks_ahead_of_the_slowest(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    # 120 samples, 3 ranks of 40: rank 1 is 2 steps ahead, rank 2 one; 4 new ranks read the
    # 120 - 3 * 2 * 4 - 3 * 4 = 84 left, 21 each.
    read = _run(make_loader, 3, [2, 4, 3], 4, merged=True)
    assert sorted(read) == list(range(SAMPLE_COUNT))


def test_the_resized_epoch_saves_its_resizes_and_resumes_again(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    state = _saved_in_epoch_1(make_loader, 2, 5)
    resumed = make_loader(batch_size=BATCH, rank=0, world_size=3, seed=9)
    resumed.load_state_dict(state)
    assert len(resumed) == (SAMPLE_COUNT - 40) // 3 // BATCH + 1
    head, mid_state = _read(resumed, 2)
    assert mid_state["step"] == 2 and mid_state["world_size"] == 3
    assert mid_state["resizes"] == [[40, []]]
    again = make_loader(batch_size=BATCH, rank=0, world_size=3, seed=9)
    again.load_state_dict(mid_state)
    rest, _ = _read(again)
    whole, _ = _read(make_loader_resumed(make_loader, state))
    assert head + rest == whole


def make_loader_resumed(
    make_loader: Callable[..., stoker.Loader], state: dict[str, Any], world_size: int = 3
) -> stoker.Loader:
    loader = make_loader(batch_size=BATCH, rank=0, world_size=world_size, seed=9)
    loader.load_state_dict(state)
    return loader


def test_states_that_disagree_or_leave_ranks_out_are_refused(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    states = [
        make_loader(batch_size=BATCH, rank=rank, world_size=3, seed=9).state_dict()
        for rank in range(3)
    ]
    loader = make_loader(batch_size=BATCH, rank=0, world_size=2, seed=9)
    with pytest.raises(ValueError, match="all 3 ranks"):
        loader.load_state_dict(states[:2])
    with pytest.raises(ValueError, match="disagree on epoch"):
        loader.load_state_dict([states[0], states[1], dict(states[2], epoch=4)])
    for malformed in ([[1]], [[0, 5]], [[0, "12"]]):
        with pytest.raises(ValueError, match="resizes"):
            loader.load_state_dict(dict(states[0], resizes=malformed))
    # Every rank once: a rank twice (and so a state too many) is refused.
    with pytest.raises(ValueError, match="each once"):
        loader.load_state_dict([*states, states[2]])
    # A world size no job has: refused before a step is held for each of its ranks (a list of
    # 2^32 - 1 steps, 32 GiB, was built first).
    started = time.monotonic()
    with pytest.raises(ValueError, match="world_size"):
        loader.load_state_dict(dict(states[0], world_size=2**32 - 1))
    assert time.monotonic() - started < 5
    with pytest.raises(ValueError, match="world_size"):
        make_loader(batch_size=BATCH, rank=0, world_size=2**20 + 1, seed=9)


def test_a_later_resume_on_the_same_world_size_leaves_the_resized_epoch(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    # Rank 0 of 4 saves in epoch 1; rank 0 of 2 resumes that epoch (a loader of its own for
    # it), then is sent back to a state of its own world size in epoch 0: once epoch 0 is
    # read, epoch 1 is the plain one of 2 ranks again, not the rest of the resized one.
    resized_state = _saved_in_epoch_1(make_loader, 4, 2)
    loader = make_loader(batch_size=BATCH, rank=0, world_size=2, seed=9)
    plain_state = loader.state_dict()
    loader.load_state_dict(resized_state)
    assert loader.epoch == 1
    loader.load_state_dict(plain_state)
    assert loader.epoch == 0
    _read(loader)
    plain = make_loader(batch_size=BATCH, rank=0, world_size=2, seed=9)
    plain.set_epoch(1)
    assert len(loader) == len(plain)
    assert _read(loader)[0] == _read(plain)[0]


def test_a_refused_state_leaves_the_resized_epoch_as_it_was(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    resized_state = _saved_in_epoch_1(make_loader, 4, 2)
    loader = make_loader_resumed(make_loader, resized_state, world_size=2)
    before = loader.state_dict()
    # A state of this world size, past the end of its epoch: refused before anything changes.
    with pytest.raises(ValueError, match="past the end"):
        loader.load_state_dict(dict(before, resizes=[], step=10**6))
    assert loader.state_dict() == before
    rest = _read(loader)[0]
    again = make_loader_resumed(make_loader, resized_state, world_size=2)
    assert rest == _read(again)[0]


def test_a_state_past_the_resized_epochs_end_is_refused_and_the_epoch_goes_on(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    """Its own resized state, past the end of the resized epoch, is refused before the
    resized epoch's loader goes (it went first: the epoch could not be read until a state was
    loaded again, and len() counted the plain epoch)."""
    resized_state = _saved_in_epoch_1(make_loader, 4, 2)
    loader = make_loader_resumed(make_loader, resized_state, world_size=2)
    steps = len(loader)
    head, mid_state = _read(loader, 1)
    with pytest.raises(ValueError, match="past the end"):
        loader.load_state_dict(dict(mid_state, step=10**6))
    assert loader.state_dict() == mid_state and len(loader) == steps
    again = make_loader_resumed(make_loader, resized_state, world_size=2)
    assert head + _read(loader)[0] == _read(again)[0]


def test_past_the_resized_epoch_a_state_no_longer_carries_its_resizes(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    resized_state = _saved_in_epoch_1(make_loader, 4, 2)
    loader = make_loader_resumed(make_loader, resized_state, world_size=2)
    _read(loader)
    _read(loader, 1)  # epoch 2: the resized epoch's loader is let go
    # Back to epoch 1: it is the plain epoch of 2 ranks now, and its states say so.
    loader.set_epoch(1)
    head, state = _read(loader, 1)
    assert state["resizes"] == []
    plain = make_loader(batch_size=BATCH, rank=0, world_size=2, seed=9)
    plain.set_epoch(1)
    assert head == _read(plain, 1)[0]


def test_reading_a_resized_epoch_lets_go_of_what_the_plain_loader_started_ahead(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader(batch_size=BATCH, rank=0, world_size=3, seed=9, prefetch=4)
    read_indices(loader)  # epoch 0 to its end: the plain loader starts epoch 1 ahead
    loader.load_state_dict(_saved_in_epoch_1(make_loader, 2, 5))
    assert loader.epoch == 1
    # The resized epoch 1 comes from the resumed loader; the plain one's early start of
    # epoch 1 (4 slots of its pool) is cancelled rather than parked until close().
    steps = len(loader)
    assert sum(1 for _ in loader) == steps
    assert loader.stats()["slots_in_use"] == 0


def _decode_threads() -> int:
    """Decode threads alive in this process (each loader's pool names its threads; Linux)."""
    names = []
    for comm in Path("/proc/self/task").glob("*/comm"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            names.append(comm.read_text().strip())
    return sum(name.startswith("stoker-decode") for name in names)


def _settled_decode_threads() -> int:
    """The decode thread count once it has stayed the same for half a second (the threads of
    a closed loader end after it returns)."""
    deadline = time.monotonic() + 20
    seen, since = _decode_threads(), time.monotonic()
    while time.monotonic() - since < 0.5 and time.monotonic() < deadline:
        time.sleep(0.02)
        now = _decode_threads()
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


def test_a_resized_epoch_is_built_on_the_loaders_own_threads_and_slots(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    """The epoch resumed on another world size runs on the loader's decode threads and in its
    slot pool: no second set of threads, no second pool (with pinned slots, a second pool
    would have to fit the pinned budget beside the first)."""
    state = _saved_in_epoch_1(make_loader, 2, 5)
    gc.collect()  # loaders other tests dropped take their threads with them
    before = _settled_decode_threads()
    loader = make_loader(batch_size=BATCH, rank=0, world_size=3, seed=9, prefetch=2)
    # A thread names itself once it runs: the loader's two show once they have settled.
    threads = _settled_decode_threads()
    assert threads == before + 2
    loader.load_state_dict(state)
    held = list(itertools.islice(iter(loader), 3))
    assert _decode_threads() == threads
    # The batches held are the resized epoch's, in the loader's own pool (stats() reads it).
    stats = loader.stats()
    assert stats["slots_in_use"] >= len(held), stats
    del held


def test_a_finished_resized_epoch_stays_finished_through_an_iter_before_its_first_batch(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    """2 ranks read all of epoch 1 (stopping at its last batch); 3 ranks load their states:
    nothing of epoch 1 is left, so the position is epoch 2. A state saved after an ``iter()``
    and before its first batch (an emergency checkpoint) says epoch 1 is done: it said epoch
    1 from its start with no resizes, and a run restarted on it read epoch 1 again; and
    ``set_epoch(1)`` after that ``iter()`` runs epoch 1 empty (it read it plain)."""
    states = []
    for rank in range(2):
        loader = make_loader(batch_size=BATCH, rank=rank, world_size=2, seed=9)
        loader.set_epoch(1)
        states.append(_read(loader, len(loader))[1])
        loader.close()
    resumed = make_loader(batch_size=BATCH, rank=0, world_size=3, seed=9)
    resumed.load_state_dict(states)
    assert resumed.epoch == 2
    iter(resumed)
    checkpoint = resumed.state_dict()
    restarted = make_loader(batch_size=BATCH, rank=0, world_size=3, seed=9)
    restarted.load_state_dict(checkpoint)
    assert restarted.epoch == 2, checkpoint
    plain = make_loader(batch_size=BATCH, rank=0, world_size=3, seed=9)
    plain.set_epoch(2)
    assert _read(restarted, 1)[0] == _read(plain, 1)[0]
    resumed.set_epoch(1)
    assert _read(resumed)[0] == []
    assert resumed.epoch == 2
