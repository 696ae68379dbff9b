"""Resuming on another world size in distributed mode: four remote loaders (``address=``) of a
real coordinator and two real workers read part of epoch 0 and save their states; two new remote
loaders on the same daemons load them and read the rest. Every sample of the epoch arrives
exactly once overall (by sample index), the same as the in-process resume, and the next epoch is
the plain one of world size 2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stoker
from conftest import SAMPLE_COUNT, SMALL_CROP, read_indices, running_cluster

BATCH = 4
OLD, NEW = 4, 2


@pytest.fixture
def resize_cluster(dataset: Path, tmp_path: Path) -> Iterator[str]:
    """The daemons. The old loaders stop mid-epoch: batches the workers built for them wait for
    a stream that never comes, and a short delivery timeout frees the workers sooner."""
    with running_cluster(dataset, tmp_path / "state", ["--delivery-timeout-ms", "1000"]) as address:
        yield address


def _loader(dataset: Path, rank: int, world_size: int, address: str | None) -> stoker.Loader:
    options: dict[str, Any] = {"address": address} if address else {"num_threads": 1}
    return stoker.Loader(
        dataset,
        pipeline=stoker.vision.imagenet_train(SMALL_CROP),
        batch_size=BATCH,
        output="numpy",
        timeout=60,
        seed=9,
        rank=rank,
        world_size=world_size,
        **options,
    )


@pytest.mark.parametrize(
    ("steps", "merged"),
    [
        # Every rank's state: ranks ahead of the slowest one are accounted for too.
        ([2, 4, 3, 3], True),
        # All ranks at the same step (synchronous training): any one rank's state will do.
        ([3, 3, 3, 3], False),
    ],
    ids=["all-states", "one-state"],
)
def test_four_remote_ranks_resumed_on_two_read_each_sample_once(
    dataset: Path, resize_cluster: str, steps: list[int], merged: bool
) -> None:
    read: list[int] = []
    states = []
    # 120 samples, 4 ranks of 30 (8 steps of 4 each).
    for rank in range(OLD):
        loader = _loader(dataset, rank, OLD, resize_cluster)
        read.extend(read_indices(loader, steps[rank]))
        state = loader.state_dict()
        assert (state["epoch"], state["step"], state["resizes"]) == (0, steps[rank], [])
        states.append(state)
        loader.close()
    assert len(read) == sum(steps) * BATCH < SAMPLE_COUNT

    left = SAMPLE_COUNT - len(read)
    next_epoch: list[int] = []
    for rank in range(NEW):
        remote = _loader(dataset, rank, NEW, resize_cluster)
        local = _loader(dataset, rank, NEW, None)
        try:
            saved = states if merged else states[rank]
            remote.load_state_dict(saved)
            local.load_state_dict(saved)
            assert remote.epoch == 0
            assert len(remote) == len(local) == (left // NEW + BATCH - 1) // BATCH
            resumed = read_indices(remote)
            assert resumed == read_indices(local), f"rank {rank}: as the in-process resume"
            read.extend(resumed)
            state = remote.state_dict()
            assert (state["epoch"], state["step"], state["resizes"]) == (1, 0, [])
            # The next epoch is the plain one of the new world size, from the same loader.
            assert len(remote) == (SAMPLE_COUNT // NEW + BATCH - 1) // BATCH
            plain = read_indices(remote)
            assert plain == read_indices(local), f"rank {rank}: the plain epoch 1"
            next_epoch.extend(plain)
        finally:
            remote.close()
            local.close()
    assert sorted(read) == list(range(SAMPLE_COUNT)), "epoch 0: every sample exactly once"
    assert sorted(next_epoch) == list(range(SAMPLE_COUNT)), "epoch 1: the whole epoch"


def test_remote_ranks_resumed_on_two_after_the_epochs_last_batch_start_the_next_epoch(
    dataset: Path, resize_cluster: str
) -> None:
    """States saved right after an epoch's last batch leave nothing of it: the remote loaders
    on the new world size go on with the next epoch, as the in-process ones do (the resumed
    epoch's job of no steps was refused by the coordinator, and the load with it)."""
    states = []
    for rank in range(OLD):
        loader = _loader(dataset, rank, OLD, resize_cluster)
        steps = len(loader)
        read_indices(loader, steps)
        state = loader.state_dict()
        assert (state["epoch"], state["step"]) == (0, steps)
        states.append(state)
        loader.close()
    for rank in range(NEW):
        remote = _loader(dataset, rank, NEW, resize_cluster)
        local = _loader(dataset, rank, NEW, None)
        try:
            remote.load_state_dict(states)
            local.load_state_dict(states)
            assert remote.epoch == local.epoch == 1
            # The finished epoch, asked for again (as a loop that calls set_epoch first does),
            # runs empty rather than whole.
            for loader in (remote, local):
                loader.set_epoch(0)
                assert len(loader) == 0 and read_indices(loader) == []
                loader.set_epoch(1)
            assert read_indices(remote) == read_indices(local), f"rank {rank}: the plain epoch 1"
        finally:
            remote.close()
            local.close()
