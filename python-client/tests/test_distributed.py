"""Distributed mode from Python: ``stoker.Loader(..., address=...)`` against a real coordinator
and two real worker processes on 127.0.0.1, compared batch for batch with the in-process mode."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import numpy as np
import pytest

import stoker
from conftest import (
    SMALL_CROP,
    assert_same_batches,
    daemon_binary,
    epoch_batches,
    running_cluster,
    start_daemon,
)


def _options(**overrides: object) -> dict[str, object]:
    options: dict[str, object] = {
        "pipeline": stoker.vision.imagenet_train(SMALL_CROP),
        "batch_size": 16,
        "output": "numpy",
        "timeout": 60,
        "seed": 5,
        "world_size": 2,
    }
    options.update(overrides)
    return options


def test_batches_from_workers_equal_the_in_process_ones(dataset: Path, cluster: str) -> None:
    for rank in (0, 1):
        remote = stoker.Loader(dataset, address=cluster, rank=rank, **_options())
        local = stoker.Loader(dataset, rank=rank, num_threads=1, **_options())
        try:
            assert len(remote) == len(local)
            assert_same_batches(epoch_batches(remote), epoch_batches(local))
        finally:
            remote.close()
            local.close()


def test_resume_mid_epoch_in_distributed_mode(dataset: Path, cluster: str) -> None:
    loader = stoker.Loader(dataset, address=cluster, rank=0, **_options())
    try:
        batches = epoch_batches(loader)
        state = {"epoch": 0, "step": 2}
        loader.load_state_dict({**loader.state_dict(), **state})
        rest = epoch_batches(loader)
        assert_same_batches(rest, batches[2:])
    finally:
        loader.close()


def _outcomes(loader: stoker.Loader) -> tuple[list[str], list[dict[str, np.ndarray]]]:
    """One epoch read by a loop that catches a bad sample's error and goes on: per step
    "batch" or the error's first words, and the batches (copied)."""
    steps: list[str] = []
    batches: list[dict[str, np.ndarray]] = []
    batch_iter = iter(loader)
    while True:
        try:
            batch = next(batch_iter)
        except StopIteration:
            return steps, batches
        except stoker.DecodeError as error:
            assert "bad sample" in str(error), error
            steps.append("DecodeError")
            continue
        steps.append("batch")
        batches.append({name: np.array(value, copy=True) for name, value in batch.items()})


def test_a_bad_sample_under_the_fail_policy_fails_its_step_alone_as_in_process(
    bad_dataset: Path, tmp_path: Path
) -> None:
    """A loop that catches a bad sample's error and goes on gets the same epoch from the
    workers as in process: the same steps fail, the others are the same batches, and the epoch
    ends. Before, the first such error stopped the remote loader's session for good."""
    options = _options(batch_size=2, world_size=1, on_error="fail")
    local = stoker.Loader(bad_dataset, num_threads=1, **options)
    try:
        want = _outcomes(local)
    finally:
        local.close()
    assert want[0].count("DecodeError") == 3, want[0]
    with running_cluster(bad_dataset, tmp_path / "state") as address:
        remote = stoker.Loader(bad_dataset, address=address, **options)
        try:
            got = _outcomes(remote)
        finally:
            remote.close()
    assert got[0] == want[0]
    assert_same_batches(got[1], want[1])


def test_a_dataset_outside_the_workers_roots_is_refused(tmp_path: Path, cluster: str) -> None:
    outside = Path(stoker._native.make_dataset(str(tmp_path / "elsewhere"), 4))
    with pytest.raises(PermissionError, match="outside this worker's --data-root"):
        stoker.Loader(outside, address=cluster, **_options(rank=0))


def test_bad_addresses_are_value_errors(dataset: Path) -> None:
    with pytest.raises(ValueError, match="host:port"):
        stoker.Loader(dataset, address="nowhere", **_options(rank=0))
    with pytest.raises(ValueError, match="worker_grace"):
        stoker.Loader(dataset, address="127.0.0.1:1", worker_grace=0, **_options(rank=0))


def _describe(loader: stoker.Loader) -> dict[str, object]:
    """What a training script asks a loader, besides its batches."""
    first = next(iter(loader))
    return {
        "classes": loader.classes,
        "len": len(loader),
        "num_samples": loader.num_samples,
        "state_after_one": loader.state_dict(),
        "keys": sorted(first),
        "shapes": {name: tuple(value.shape) for name, value in first.items()},
        "stats_keys": {"samples", "wait_s", "epoch_start_wait_s", "slot_capacity"}
        <= set(loader.stats()),
    }


def test_remote_and_embedded_loaders_answer_alike(dataset: Path, cluster: str) -> None:
    remote = stoker.Loader(dataset, address=cluster, rank=1, **_options())
    local = stoker.Loader(dataset, rank=1, num_threads=1, **_options())
    try:
        described = _describe(remote)
        assert described == _describe(local)
        assert described["classes"], "class names come back from the workers"
        assert remote.stats()["slot_capacity"] > 0, "remote batches land in pooled slots"
    finally:
        remote.close()
        local.close()


@pytest.mark.parametrize(
    ("killed", "said"),
    [("worker", "no worker stream is open"), ("coordinator", "the coordinator does not answer")],
)
def test_no_worker_or_no_coordinator_past_the_grace_raises_worker_unavailable(
    dataset: Path, tmp_path: Path, killed: str, said: str
) -> None:
    """Every worker gone, or the coordinator: with the coordinator killed no session opens, so
    no worker stream, which counts against ``worker_grace`` too (it was waited on until
    ``timeout``, 600 s by default, then blamed on the workers); the error says which."""
    coordinator, address = start_daemon(
        [str(daemon_binary("stoker")), "coordinator", "--listen", "127.0.0.1:0",
         "--state", str(tmp_path / "state")]
    )
    worker, _ = start_daemon(
        [str(daemon_binary("stoker-worker")), "--coordinator", address,
         "--data-root", str(dataset), "--threads", "1"]
    )
    try:
        loader = stoker.Loader(dataset, address=address, worker_grace=2, **_options(rank=0))
        batches = iter(loader)
        next(batches)
        gone = worker if killed == "worker" else coordinator
        gone.kill()
        gone.wait(timeout=10)
        started = time.monotonic()
        expected = f"no worker has served job.*{said}"
        with pytest.raises(stoker.WorkerUnavailableError, match=expected):
            for _ in batches:
                pass
        assert time.monotonic() - started < 30, "well before the 60 s timeout"
        if killed == "worker":
            # A worker back, iterating again reads on: a new session, not the one that stopped.
            worker, _ = start_daemon(
                [str(daemon_binary("stoker-worker")), "--coordinator", address,
                 "--data-root", str(dataset), "--threads", "1"]
            )
            assert sum(1 for _ in loader) > 0
        loader.close()
    finally:
        for process in (worker, coordinator):
            process.kill()
            process.wait(timeout=10)


def test_a_coordinator_out_of_reach_or_without_a_worker_at_the_start_raises_past_the_grace(
    dataset: Path, tmp_path: Path
) -> None:
    """The constructor waits ``worker_grace`` for the coordinator to answer and have a worker
    for the job, as a run does mid-way, then raises ``WorkerUnavailableError`` saying which:
    before, it waited a fixed 60 s, raised a plain ``StokerError``, and said the coordinator
    could not be reached when it answered with no worker."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{probe.getsockname()[1]}"
    started = time.monotonic()
    unreachable = f"could not reach coordinator {nobody} after [0-9]+ s"
    with pytest.raises(stoker.WorkerUnavailableError, match=unreachable):
        stoker.Loader(dataset, address=nobody, worker_grace=2, **_options(rank=0))
    assert time.monotonic() - started < 30
    coordinator, address = start_daemon(
        [str(daemon_binary("stoker")), "coordinator", "--listen", "127.0.0.1:0",
         "--state", str(tmp_path / "state")]
    )
    try:
        expected = f"coordinator {address} answers, but had no worker for the job after [0-9]+ s"
        with pytest.raises(stoker.WorkerUnavailableError, match=expected):
            stoker.Loader(dataset, address=address, worker_grace=2, **_options(rank=0))
    finally:
        coordinator.kill()
        coordinator.wait(timeout=10)


def test_two_runs_of_identical_settings_read_right_and_are_told_why_they_reopen(
    dataset: Path, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two loaders of identical settings are one job, one session per rank, to a coordinator:
    each reopens the other's session. Both still read the embedded batches, and a reopen's
    warning says what causes it (it named nothing)."""
    options = _options(rank=0, prefetch=4)
    local = stoker.Loader(dataset, num_threads=1, **options)
    expected = epoch_batches(local)
    local.close()
    first = stoker.Loader(dataset, address=cluster, **options)
    second = stoker.Loader(dataset, address=cluster, **options)
    try:
        with caplog.at_level(logging.WARNING, logger="stoker"):
            got: tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]] = ([], [])
            for a, b in zip(iter(first), iter(second), strict=True):
                got[0].append({name: np.array(value) for name, value in a.items()})
                got[1].append({name: np.array(value) for name, value in b.items()})
        for batches in got:
            assert_same_batches(batches, expected)
        reopened = [r.getMessage() for r in caplog.records if "was opened again" in r.getMessage()]
        assert reopened, "the two runs shared sessions (a reopen each time the other opened)"
        assert all("another client reads the same job" in m for m in reopened), reopened
    finally:
        first.close()
        second.close()


def test_distributed_batches_are_zero_copy_views(dataset: Path, cluster: str) -> None:
    loader = stoker.Loader(dataset, address=cluster, **_options(world_size=1))
    try:
        batch = next(iter(loader))
        image = batch["image"]
        assert isinstance(image, np.ndarray)
        assert not image.flags.owndata
        assert image.shape == (16, SMALL_CROP, SMALL_CROP, 3)
    finally:
        loader.close()


def test_jobs_sharded_over_two_coordinators_equal_the_in_process_ones(
    dataset: Path, tmp_path: Path
) -> None:
    # Two coordinators, each owning the jobs that hash to it, and workers serving both; the
    # clients are given the same list. Jobs of several seeds land on both shards.
    processes = []
    try:
        addresses = []
        for shard in range(2):
            coordinator, address = start_daemon(
                [str(daemon_binary("stoker")), "coordinator", "--listen", "127.0.0.1:0",
                 "--state", str(tmp_path / f"state-{shard}"), "--shard", f"{shard}/2"]
            )
            processes.append(coordinator)
            addresses.append(address)
        fleet = ",".join(addresses)
        for _ in range(2):
            worker, _ = start_daemon(
                [str(daemon_binary("stoker-worker")), "--coordinator", fleet,
                 "--data-root", str(dataset), "--threads", "1"]
            )
            processes.append(worker)
        # A job's shard is a hash of its spec, whose dataset path is this run's temporary
        # folder: seeds are taken until each shard owns three jobs, whichever seeds those are.
        served = {0: 0, 1: 0}
        for seed in range(64):
            # The job goes to one coordinator only: the other refuses it by name.
            owners = []
            for shard, address in enumerate(addresses):
                try:
                    stoker.Loader(dataset, address=address, rank=1, **_options(seed=seed)).close()
                    owners.append(shard)
                except ValueError as error:
                    assert "--shard" in str(error)
            assert len(owners) == 1, owners
            if served[owners[0]] == 3:
                continue
            served[owners[0]] += 1
            remote = stoker.Loader(dataset, address=fleet, rank=1, **_options(seed=seed))
            local = stoker.Loader(dataset, rank=1, num_threads=1, **_options(seed=seed))
            try:
                assert_same_batches(epoch_batches(remote), epoch_batches(local))
            finally:
                remote.close()
                local.close()
            if min(served.values()) == 3:
                break
        assert served == {0: 3, 1: 3}, served
        with pytest.raises(ValueError, match="empty entry"):
            stoker.Loader(dataset, address=f"{addresses[0]},,{addresses[1]}", **_options(rank=0))
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)
