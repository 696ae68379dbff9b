"""Loader.from_dataset: a Python map-style dataset under the native planner, run on threads
or in worker processes."""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker

Pair = collections.namedtuple("Pair", ["features", "index"])


class Squares:
    """Sample i: (a float32 vector derived from i, i) — easy to check after batching."""

    def __init__(self, length: int = 50) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return np.arange(3, dtype=np.float32) + index * index, index


class Failing(Squares):
    """Sample 13 raises."""

    def __getitem__(self, index: int):
        if index == 13:
            return 1 // (index - 13)
        return super().__getitem__(index)


class Drawing(Squares):
    """Each sample draws from stoker.sample_rng()."""

    def __getitem__(self, index: int):
        return {"noise": stoker.sample_rng().random(4), "index": index}


class GlobalDrawing(Squares):
    """Each sample draws from numpy's global RNG (as many transforms do)."""

    def __getitem__(self, index: int):
        return np.random.rand(4), index


class Ragged(Squares):
    def __getitem__(self, index: int):
        return np.zeros(index % 3 + 1, dtype=np.float32)


class Slow(Squares):
    def __getitem__(self, index: int):
        time.sleep(0.02)
        return super().__getitem__(index)


def epoch_of(loader) -> tuple[list[list[int]], list]:
    """The sample indices of each batch of one epoch, and the batches."""
    it = iter(loader)
    order, batches = [], []
    for batch in it:
        order.append(list(it.sample_indices))
        batches.append(batch)
    return order, batches


def check_squares(batch, indices) -> None:
    features, index = batch
    assert list(index) == indices
    expected = np.stack([np.arange(3, dtype=np.float32) + i * i for i in indices])
    np.testing.assert_array_equal(np.asarray(features), expected)


@pytest.mark.parametrize(
    "mode",
    [
        {"num_threads": 3},
        {"num_workers": 2},
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 1, "multiprocessing_context": "spawn"},
    ],
)
def test_every_index_once_per_epoch_with_the_samples_structure(mode) -> None:
    with stoker.Loader.from_dataset(
        Squares(50), batch_size=8, shuffle=True, seed=3, output="numpy", **mode
    ) as loader:
        assert len(loader) == 7
        for _ in range(2):
            order, batches = epoch_of(loader)
            flat = [i for step in order for i in step]
            assert sorted(flat) == list(range(50))
            assert [len(step) for step in order] == [8] * 6 + [2]
            for batch, indices in zip(batches, order, strict=True):
                assert isinstance(batch, tuple)
                assert batch[0].dtype == np.float32 and batch[0].shape == (len(indices), 3)
                assert batch[1].dtype == np.int64
                check_squares(batch, indices)
        assert loader.stats()["batches"] == 14


def test_the_order_is_the_native_loaders_for_the_same_seed(tmp_path) -> None:
    root = stoker._native.make_dataset(str(tmp_path / "images"), 40)
    settings = dict(batch_size=6, shuffle=True, seed=11, rank=1, world_size=2)
    native = stoker.Loader(
        root,
        pipeline=[stoker.ops.DecodeImage(), stoker.ops.Resize(8), stoker.ops.CenterCrop(8)],
        output="numpy",
        **settings,
    )
    wrapped = stoker.Loader.from_dataset(Squares(40), output="numpy", num_threads=2, **settings)
    with native, wrapped:
        for epoch in range(2):
            native.set_epoch(epoch)
            wrapped.set_epoch(epoch)
            assert epoch_of(native)[0] == epoch_of(wrapped)[0]


class OneFile(Squares):
    """A DataLoader-era dataset: one open file it seeks then reads (safe one call at a time,
    not from two threads at once), or one per thread with ``per_thread``."""

    def __init__(self, path: Path, length: int, per_thread: bool = False) -> None:
        super().__init__(length)
        self.path, self.per_thread = path, per_thread
        self.local = threading.local()
        self.opened = 0
        self.lock = threading.Lock()
        self.shared = open(path, "rb")  # noqa: SIM115 (kept open, as such datasets do)

    def handle(self):
        if not self.per_thread:
            return self.shared
        if not hasattr(self.local, "file"):
            with self.lock:
                self.opened += 1
            self.local.file = open(self.path, "rb")  # noqa: SIM115
        return self.local.file

    def __getitem__(self, index: int):
        file = self.handle()
        file.seek(index * 8)
        time.sleep(0.0005)  # another thread seeking here moves this one's read
        return np.frombuffer(file.read(8), dtype="<i8")[0]


def each_row_is_its_sample(loader) -> None:
    """One epoch of ``OneFile`` batches: each row holds its own index (batches not kept)."""
    it = iter(loader)
    for batch in it:
        assert batch.tolist() == list(it.sample_indices)


def test_threads_default_to_one_so_a_dataset_is_called_one_sample_at_a_time(
    tmp_path: Path,
) -> None:
    """``num_threads=None`` calls ``dataset[i]`` one at a time, as DataLoader's
    ``num_workers=0`` does: a dataset with one open file gives its own rows. More threads keep
    their ``threading.local()`` for the loader's life (one file each, not one per batch)."""
    path = tmp_path / "values.bin"
    np.arange(400, dtype="<i8").tofile(path)
    one_file, per_thread = OneFile(path, 400), OneFile(path, 400, per_thread=True)
    with stoker.Loader.from_dataset(one_file, batch_size=16, shuffle=True,
                                    output="numpy") as loader:
        assert loader.num_threads == 1
        assert "one thread unless num_threads is given" in loader.stats()["thread_rule"]
        for _ in range(2):
            each_row_is_its_sample(loader)
    with stoker.Loader.from_dataset(per_thread, batch_size=8, shuffle=True, num_threads=3,
                                    output="numpy") as loader:
        for _ in range(2):
            each_row_is_its_sample(loader)
    one_file.shared.close()
    per_thread.shared.close()
    # dataset[0] read here for the layout, then one file per lane thread: not one per batch.
    assert per_thread.opened <= 4, per_thread.opened


def test_resume_mid_epoch_is_exact() -> None:
    settings = dict(batch_size=4, shuffle=True, seed=5, output="numpy", num_threads=2)
    with stoker.Loader.from_dataset(Squares(30), **settings) as full:
        full.set_epoch(1)
        whole, _ = epoch_of(full)
    with stoker.Loader.from_dataset(Squares(30), **settings) as first:
        first.set_epoch(1)
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
    assert state["step"] == 3 and state["epoch"] == 1
    assert "dataset" not in state  # a Python dataset has no fingerprint Stoker could read
    with stoker.Loader.from_dataset(Squares(30), **settings) as resumed:
        resumed.load_state_dict(state)
        rest, batches = epoch_of(resumed)
    assert rest == whole[3:]
    for batch, indices in zip(batches, rest, strict=True):
        check_squares(batch, indices)


@pytest.mark.parametrize("mode", [{"num_threads": 1}, {"num_workers": 2}])
def test_resume_on_another_world_size_follows_the_native_loader(tmp_path, mode) -> None:
    root = stoker._native.make_dataset(str(tmp_path / "images"), 40)
    pipeline = [stoker.ops.DecodeImage(), stoker.ops.Resize(8), stoker.ops.CenterCrop(8)]
    settings = dict(batch_size=3, shuffle=True, seed=9, output="numpy")

    def native(rank, world):
        return stoker.Loader(root, pipeline=pipeline, rank=rank, world_size=world, **settings)

    def wrapped(rank, world):
        return stoker.Loader.from_dataset(
            Squares(40), rank=rank, world_size=world, **mode, **settings
        )

    states, seen = [], []
    for rank in range(2):
        with wrapped(rank, 2) as old:
            it = iter(old)
            for _ in range(2):
                next(it)
                seen.extend(it.sample_indices)
            states.append(old.state_dict())
    # The native loader reads the same positions (a state of the other kind of loader, which
    # its "source" refuses unless left out, as here, where it is the reference order).
    as_native = [{k: v for k, v in state.items() if k != "source"} for state in states]
    for rank in range(3):
        with wrapped(rank, 3) as new, native(rank, 3) as reference:
            new.load_state_dict(states)
            reference.load_state_dict(as_native)
            order, batches = epoch_of(new)
            assert order == epoch_of(reference)[0]
            seen.extend(i for step in order for i in step)
            for batch, indices in zip(batches, order, strict=True):
                check_squares(batch, indices)
    assert set(seen) == set(range(40))


class CountsCallers(Squares):
    """Squares that records the most ``__getitem__`` calls in progress at once."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __getitem__(self, index: int):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(0.02)
            return super().__getitem__(index)
        finally:
            with self.lock:
                self.now -= 1


def test_a_resume_on_another_world_size_mid_run_still_calls_the_dataset_one_at_a_time() -> None:
    """The resized epoch's lane waits for the plain lane's batch in progress: with one thread
    (the default, for datasets that are not thread-safe) ``dataset[i]`` is never called from
    two threads at once, even when the state is loaded into a loader that is prefetching."""
    settings = dict(batch_size=4, shuffle=True, seed=3, output="numpy")
    with stoker.Loader.from_dataset(Squares(40), rank=0, world_size=2, **settings) as old:
        it = iter(old)
        next(it), next(it)
        state = old.state_dict()
    dataset = CountsCallers(40)
    with stoker.Loader.from_dataset(dataset, **settings) as loader:
        it = iter(loader)
        next(it)
        loader.load_state_dict(state)
        it = iter(loader)
        for _ in range(3):
            next(it)
    assert dataset.most == 1, dataset.most


@pytest.mark.parametrize("mode", [{"num_threads": 2}, {"num_workers": 1}])
def test_a_raising_getitem_names_its_index_exception_and_traceback(mode) -> None:
    with (
        stoker.Loader.from_dataset(Failing(20), batch_size=5, output="numpy", **mode) as loader,
        pytest.raises(stoker.DecodeError) as raised,
    ):
        epoch_of(loader)
    message = str(raised.value)
    assert "dataset[13]" in message
    assert "ZeroDivisionError" in message
    assert "Traceback" in message and "__getitem__" in message


def test_skip_replaces_a_raising_sample_by_the_next_one() -> None:
    with stoker.Loader.from_dataset(
        Failing(20), batch_size=5, on_error="skip", output="numpy", num_threads=2
    ) as loader:
        it = iter(loader)
        batches = list(it)
        assert len(batches) == 4
        third = batches[2]
        assert list(third[1]) == [10, 11, 12, 14, 14]
    with stoker.Loader.from_dataset(
        Failing(20), batch_size=5, on_error="skip", output="numpy", num_threads=2
    ) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        (bad,) = it.bad_samples
        assert bad["sample_index"] == 13 and bad["substitute_index"] == 14
        assert "ZeroDivisionError" in bad["reason"]
        assert loader.stats()["bad_samples"] == 1


class LongBadRun(Squares):
    """Samples 0 to 40 raise: a run of bad files longer than the next 16 (a folder's ``._*``
    copies sorted ahead of its images)."""

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if index <= 40:
            raise ValueError(f"not an image: ._{index}")
        return super().__getitem__(index)


def test_skip_passes_over_a_run_of_bad_samples_longer_than_sixteen() -> None:
    """The run ended under skip: none of the next 16 samples could replace sample 0; now 32,
    64, 128... on are tried too, as the native policy does."""
    with stoker.Loader.from_dataset(
        LongBadRun(100), batch_size=4, on_error="skip", output="numpy", shuffle=False
    ) as loader:
        it = iter(loader)
        first = next(it)
        replaced = {bad["sample_index"]: bad["substitute_index"] for bad in it.bad_samples}
    assert replaced == {0: 64, 1: 65, 2: 66, 3: 67}
    assert list(first[1]) == [64, 65, 66, 67]


class RetryingThenChaining(Squares):
    """Every third sample fails after retries, raising ``from`` the last failure: the
    exception chain (kept in a cycle with the dataset's frame) reaches the loader's frames."""

    def __getitem__(self, index: int):
        if index % 3 != 1:
            return super().__getitem__(index)
        last = None
        for _ in range(2):
            try:
                raise OSError(f"cannot read {index}")
            except OSError as error:
                last = error
        raise RuntimeError(f"gave up on {index}") from last


@pytest.mark.parametrize("mode", [{"num_threads": 2}, {"num_workers": 2}])
def test_a_chained_failure_is_a_bad_sample_whatever_its_chain_keeps(mode: dict) -> None:
    import gc

    gc.disable()  # the cycles stay until the loader is done with the batch
    try:
        with stoker.Loader.from_dataset(
            RetryingThenChaining(60), batch_size=6, on_error="skip", output="numpy",
            timeout=30, **mode,
        ) as loader:
            for _ in range(3):  # more epochs than the pool has slots for its steps
                it = iter(loader)
                bad = 0
                for _batch in it:
                    bad += len(it.bad_samples)
                    assert all("gave up on" in b["reason"] for b in it.bad_samples)
                assert bad == 20
    finally:
        gc.enable()


def test_sample_rng_gives_the_same_batches_for_any_thread_or_process_count() -> None:
    runs = []
    for mode in ({"num_threads": 1}, {"num_threads": 4}, {"num_workers": 2}):
        with stoker.Loader.from_dataset(
            Drawing(24), batch_size=4, shuffle=True, seed=21, output="numpy", **mode
        ) as loader:
            runs.append([b["noise"].copy() for b in epoch_of(loader)[1]])
    assert [len(run) for run in runs] == [6, 6, 6]
    for run in runs[1:]:
        for a, b in zip(runs[0], run, strict=True):
            np.testing.assert_array_equal(a, b)
    # Different samples draw differently.
    assert not np.array_equal(runs[0][0][0], runs[0][0][1])


def test_worker_processes_seed_the_global_rngs_per_sample() -> None:
    runs = []
    for workers in (1, 3):
        with stoker.Loader.from_dataset(
            GlobalDrawing(18), batch_size=3, seed=4, output="numpy", num_workers=workers
        ) as loader:
            runs.append(np.concatenate([b[0] for b in epoch_of(loader)[1]]))
    np.testing.assert_array_equal(runs[0], runs[1])


class Images(Squares):
    """PIL images in a namedtuple, as a torchvision-style dataset without ToTensor gives."""

    def __getitem__(self, index: int):
        from PIL import Image

        pixels = np.full((4, 5, 3), index, dtype=np.uint8)
        return Pair(Image.fromarray(pixels), index)


def test_pil_images_batch_as_arrays_in_the_samples_namedtuple() -> None:
    pytest.importorskip("PIL")
    with stoker.Loader.from_dataset(
        Images(6), batch_size=3, output="numpy", num_workers=1
    ) as loader:
        batch = next(iter(loader))
    assert isinstance(batch, Pair)
    assert batch.features.shape == (3, 4, 5, 3) and batch.features.dtype == np.uint8
    assert [int(b[0, 0, 0]) for b in batch.features] == [0, 1, 2]


def test_worker_processes_write_into_the_slots_without_dev_shm() -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    with stoker.Loader.from_dataset(
        Squares(40), batch_size=4, output="numpy", num_workers=2, max_held_batches=2
    ) as loader:
        it = iter(loader)
        batches = [next(it) for _ in range(4)]
        during = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        assert loader.stats()["slot_capacity"] >= 4
        # Every batch lies in the loader's shared slot mapping, which the process maps.
        maps = Path(f"/proc/{os.getpid()}/maps").read_text()
        assert "memfd:stoker-slots" in maps
        for batch, step in zip(batches, range(4), strict=True):
            check_squares(batch, list(range(step * 4, step * 4 + 4)))
    assert during - before == set()


def test_sample_rng_outside_a_sample_says_where_it_works() -> None:
    with pytest.raises(RuntimeError, match="from_dataset"):
        stoker.sample_rng()


def test_collate_fn_and_transform_see_single_samples() -> None:
    seen = []

    def collate(samples):
        seen.append(len(samples))
        return [int(s.index) for s in samples]

    with stoker.Loader.from_dataset(
        Squares(10), batch_size=4, output="numpy", num_threads=2,
        transform=lambda s: Pair(s[0] * 2, s[1]), collate_fn=collate,
    ) as loader:
        batches = list(loader)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert seen == [4, 4, 2]


def test_a_collate_fn_that_fails_on_one_batch_spends_that_batch_only() -> None:
    """A ``collate_fn`` raising on one batch, in a loop that catches the error and goes on:
    the next ``next()`` gives the batch after it, as DataLoader does, and a state saved then
    resumes after it. Before, the failed batch was kept to be made again, and raised the same
    error on every call for good."""

    def collate(samples: list[Any]) -> list[int]:
        indices = [int(s[1]) for s in samples]
        if 4 in indices:
            raise ValueError("no batch holding sample 4")
        return indices

    def run() -> tuple[list[Any], dict[str, Any]]:
        with stoker.Loader.from_dataset(
            Squares(12), batch_size=4, output="numpy", num_threads=1, collate_fn=collate,
        ) as loader:
            iterator = iter(loader)
            outcomes: list[Any] = []
            state: dict[str, Any] = {}
            while len(outcomes) < 6:
                try:
                    outcomes.append(next(iterator))
                except ValueError as error:
                    outcomes.append(str(error))
                    state = loader.state_dict()
                except StopIteration:
                    break
            return outcomes, state

    outcomes, state = run()
    assert outcomes == [[0, 1, 2, 3], "no batch holding sample 4", [8, 9, 10, 11]]
    assert state["step"] == 2, state


def test_a_spent_batchs_replaced_samples_are_still_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch whose ``collate_fn`` raised is spent, never made again: the samples it replaced
    under ``on_error="skip"`` are logged all the same (they were logged only once a batch was
    made)."""

    def collate(samples: list[Any]) -> list[int]:
        raise ValueError("no batch at all")

    with (
        caplog.at_level(logging.WARNING, logger="stoker"),
        stoker.Loader.from_dataset(
            Failing(20), batch_size=5, on_error="skip", output="numpy", num_threads=1,
            collate_fn=collate,
        ) as loader,
    ):
        iterator = iter(loader)
        for _ in range(4):
            with pytest.raises(ValueError, match="no batch at all"):
                next(iterator)
        with pytest.raises(StopIteration):
            next(iterator)
    assert "skipped bad sample" in caplog.text and "(index 13)" in caplog.text, caplog.text


def test_pin_memory_with_a_collate_fn_where_nothing_pins_warns_and_loads() -> None:
    """``pin_memory=True`` where no driver can page-lock (a CPU machine) is one warning and
    pageable batches, as DataLoader runs without an accelerator; with a ``collate_fn`` too
    (pinning its batch there raised on every batch)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: pinning works")
    data = [np.full((4, 4), i, dtype=np.float32) for i in range(8)]
    with (
        pytest.warns(UserWarning),
        stoker.Loader.from_dataset(
            data, batch_size=4, pin_memory=True, output="torch",
            collate_fn=torch.utils.data.default_collate,
        ) as loader,
    ):
        batches = list(loader)
    assert [b[:, 0, 0].tolist() for b in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


def test_torch_output_keeps_the_structure() -> None:
    torch = pytest.importorskip("torch")
    with stoker.Loader.from_dataset(
        Squares(9), batch_size=3, output="torch", num_threads=1,
        transform=lambda s: {"x": torch.from_numpy(s[0]), "y": s[1], "flag": s[1] % 2 == 0},
    ) as loader:
        batch = next(iter(loader))
    assert set(batch) == {"x", "y", "flag"}
    assert batch["x"].dtype == torch.float32 and tuple(batch["x"].shape) == (3, 3)
    assert batch["y"].tolist() == [0, 1, 2]
    assert batch["flag"].tolist() == [True, False, True]


def test_samples_of_another_shape_are_refused_by_name() -> None:
    with (
        stoker.Loader.from_dataset(Ragged(9), batch_size=3, output="numpy") as loader,
        pytest.raises(stoker.DecodeError, match=r"dataset\[1\].*float32 \(2,\).*\(1,\)"),
    ):
        list(loader)


class OneOddShape(Squares):
    """Sample 5 has another shape than the rest."""

    def __getitem__(self, index: int):
        return np.zeros(2 if index == 5 else 4, dtype=np.float32)


def test_under_skip_an_odd_shape_is_replaced_but_a_batch_mostly_of_other_shapes_fails() -> None:
    """A sample of another shape is a bad sample under skip, replaced; but when most of a
    batch (of 8 or more) is of other shapes the dataset's samples differ in layout (a transform
    that does not resize), which skip would otherwise quietly replace by the few that match."""
    with stoker.Loader.from_dataset(OneOddShape(12), batch_size=4, on_error="skip",
                                    output="numpy") as loader:
        batches = list(loader)
        assert loader.stats()["bad_samples"] == 1
    assert all(batch.shape == (4, 4) for batch in batches)
    with (
        stoker.Loader.from_dataset(Ragged(30), batch_size=8, on_error="skip",
                                   output="numpy") as loader,
        pytest.raises(stoker.DecodeError, match="of this batch's 8 samples have another"),
    ):
        list(loader)


class KeysInAnyOrder(Squares):
    """Dicts whose keys come in another order every other sample (as JSON records may)."""

    def __getitem__(self, index: int):
        value, square = np.int64(index), np.float32(index * index)
        return {"i": value, "sq": square} if index % 2 else {"sq": square, "i": value}


def test_the_same_keys_in_another_order_are_the_same_structure() -> None:
    with stoker.Loader.from_dataset(KeysInAnyOrder(10), batch_size=5, output="numpy") as loader:
        batches = list(loader)
    assert [list(batch) for batch in batches] == [["sq", "i"]] * 2, "dataset[0]'s order"
    for batch in batches:
        np.testing.assert_array_equal(batch["sq"], batch["i"].astype(np.float32) ** 2)


def test_a_value_numpy_cannot_hold_is_refused_naming_its_place() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"sample\['x'\] \(torch.bfloat16\) cannot be batched"):
        stoker.Loader.from_dataset([{"x": torch.zeros(2, dtype=torch.bfloat16)}])
    with pytest.raises(TypeError, match=r"sample\[0\] \(int\) cannot be batched"):
        stoker.Loader.from_dataset([(2**63,)])


def _divide_by_zero(sample):
    return 1 / 0


def _with_text(sample):
    return sample[0], "text"


def test_arguments_are_checked_before_any_work() -> None:
    with pytest.raises(TypeError, match="map-style"):
        stoker.Loader.from_dataset(iter([1, 2]))
    with pytest.raises(stoker.DatasetError, match="at least one"):
        stoker.Loader.from_dataset(Squares(0))
    with pytest.raises(ValueError, match="not both"):
        stoker.Loader.from_dataset(Squares(4), num_threads=2, num_workers=2)
    with pytest.raises(ValueError, match=r"forkserver.*spawn.*fork"):
        stoker.Loader.from_dataset(Squares(4), num_workers=1, multiprocessing_context="vfork")
    with pytest.raises(stoker.DatasetError, match=r"dataset\[0\].*ZeroDivisionError"):
        stoker.Loader.from_dataset(Failing(20), transform=lambda s: 1 / 0)
    with pytest.raises(TypeError, match=r"sample\[1\] is a str"):
        stoker.Loader.from_dataset(Squares(4), transform=lambda s: (s[0], "text"))
    # In process mode a worker reads dataset[0]; its refusals arrive the same way.
    with pytest.raises(stoker.DatasetError, match=r"dataset\[0\].*ZeroDivisionError"):
        stoker.Loader.from_dataset(Failing(20), transform=_divide_by_zero, num_workers=1)
    with pytest.raises(TypeError, match=r"sample\[1\] is a str"):
        stoker.Loader.from_dataset(Squares(4), transform=_with_text, num_workers=1)
    # DataLoader's arguments from_dataset has no use for: what to do instead, by name.
    for name, hint in [("worker_init_fn", "get_worker_info"), ("sampler", "stoker.mix"),
                       ("generator", "sample_rng"), ("persistent_workers", "close()")]:
        with pytest.raises(ValueError, match=rf"from_dataset does not take DataLoader's "
                           rf"{name}=.*{re.escape(hint)}"):
            stoker.Loader.from_dataset(Squares(4), **{name: None})
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*bogus"):
        stoker.Loader.from_dataset(Squares(4), bogus=1)


class FirstFails(Squares):
    """dataset[0] raises on every call; the rest load."""

    def __getitem__(self, index: int):
        if index == 0:
            raise ValueError("sample 0 is corrupt")
        return super().__getitem__(index)


class FirstFlaky(Squares):
    """dataset[0]'s first read fails as a storage error does (EIO); the next succeeds."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.failed = False

    def __getitem__(self, index: int):
        if index == 0 and not self.failed:
            self.failed = True
            raise OSError(errno.EIO, "Input/output error")
        return super().__getitem__(index)


def test_the_layout_probe_retries_storage_errors_and_skips_a_bad_first_sample(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """dataset[0] is read for the layout as a batch's sample is: a storage error tried again,
    and under skip a bad first sample passed over (replaced in its batch, as any other)."""
    with stoker.Loader.from_dataset(FirstFlaky(8), batch_size=4, output="numpy") as loader:
        batches, _ = epoch_of(loader)
    assert sorted(i for step in batches for i in step) == list(range(8))
    with pytest.raises(stoker.DatasetError, match="sample 0 is corrupt"):
        stoker.Loader.from_dataset(FirstFails(8), batch_size=4)
    # In worker processes too: the note is logged in the loader's process.
    for mode in ({"num_threads": 1}, {"num_workers": 1}):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="stoker"), stoker.Loader.from_dataset(
            FirstFails(8), batch_size=4, on_error="skip", output="numpy", **mode
        ) as loader:
            first = next(iter(loader))
            assert loader.stats()["bad_samples"] == 1
        assert "layout from dataset[1]" in caplog.text, mode
        assert "sample 0 is corrupt" in caplog.text, mode
        check_squares(first, [1, 1, 2, 3])


def test_a_multiprocessing_context_object_is_taken_as_dataloader_takes_it() -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with stoker.Loader.from_dataset(Squares(8), batch_size=4, num_workers=1, output="numpy",
                                    multiprocessing_context=context) as loader:
        batches, _ = epoch_of(loader)
    assert sorted(i for step in batches for i in step) == list(range(8))


def test_a_start_interrupted_after_its_process_started_leaves_no_worker_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C (or any error) while started workers load their state ends those processes
    and their pipes. Before, they were left waiting on the pipe (they pass on SIGINT) until
    the interpreter exited: more per interrupted attempt in a notebook."""
    import multiprocessing

    from stoker import _dataset_workers

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_dataset_workers.Worker, "_answered", interrupted)
    for method in ("fork", "spawn"):
        with pytest.raises(KeyboardInterrupt):
            stoker.Loader.from_dataset(Squares(8), batch_size=4, num_workers=2, output="numpy",
                                       multiprocessing_context=method)
        left = [p.name for p in multiprocessing.active_children()
                if p.name.startswith("stoker-dataset-worker-")]
        assert left == [], (method, left)


def test_a_killed_worker_process_is_replaced_and_its_batch_built_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def read(kill: bool) -> list[tuple[int, list[int], list[float]]]:
        with stoker.Loader.from_dataset(
            Slow(120), batch_size=4, output="numpy", num_workers=2, timeout=30, seed=4
        ) as loader:
            batches = []
            for epoch in range(2):
                it = iter(loader)
                for taken, (features, _) in enumerate(it):
                    batches.append((epoch, list(it.sample_indices), features.ravel().tolist()))
                    if kill and epoch == 0 and taken == 0:
                        # Mid-batch, as the OOM killer would.
                        os.kill(loader._side.builder._workers[1].process.pid, signal.SIGKILL)
                if kill and epoch == 0:
                    # Between epochs: whatever it was doing, the next epoch still comes whole.
                    os.kill(loader._side.builder._workers[0].process.pid, signal.SIGKILL)
            return batches

    # Every batch comes, once, with the bytes of a run where nothing died.
    with caplog.at_level("WARNING", logger="stoker"):
        killed = read(kill=True)
    replaced = [r.getMessage() for r in caplog.records if "replaced by pid" in r.getMessage()]
    assert len(replaced) == 2, replaced
    assert "process 1 (exit code -9)" in replaced[0]
    assert "process 0 (exit code -9)" in replaced[1]
    assert killed == read(kill=False)


class StartsAProcess(Slow):
    """A dataset that starts a process of its own in each worker (a decoder, a reader), at
    its first sample; its pid goes to ``pids``."""

    def __init__(self, length: int, pids: Path) -> None:
        super().__init__(length)
        self.pids, self.started = pids, False

    def start(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int):
        if not self.started:
            self.started = True
            pid = self.start()
            with open(self.pids, "a") as out:
                out.write(f"{pid}\n")
        return super().__getitem__(index)


class StartsAHelper(StartsAProcess):
    """The process forked: it inherits the worker's pipe to the loader and outlives it."""

    def start(self) -> int:
        pid = os.fork()
        if pid == 0:  # the helper: holds every inherited descriptor until killed
            time.sleep(60)
            os._exit(0)
        return pid


def test_a_killed_worker_whose_helper_holds_its_pipe_is_still_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's death is seen by asking for the process, not from its pipe's end or its
    sentinel, which a helper process holding them delays: replaced at once, where it used to
    be a timeout."""
    pids = tmp_path / "helpers"
    try:
        with caplog.at_level("WARNING", logger="stoker"), stoker.Loader.from_dataset(
            StartsAHelper(40, pids), batch_size=4, output="numpy", num_workers=1, timeout=15
        ) as loader:
            started = time.monotonic()
            it = iter(loader)
            seen = []
            for taken, _ in enumerate(it):
                seen.extend(it.sample_indices)
                if taken == 0:
                    os.kill(loader._side.builder._workers[0].process.pid, signal.SIGKILL)
            assert sorted(seen) == list(range(40))
            assert time.monotonic() - started < 10
        assert any("replaced by pid" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


class StartsAProgram(StartsAProcess):
    """The process a program (``sleep``) run, as a dataset starting a decoder runs one."""

    def start(self) -> int:
        return subprocess.Popen(["sleep", "60"]).pid


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("ignored_here", [False, True])
def test_programs_a_worker_process_starts_are_ended_by_ctrl_c(
    tmp_path: Path, method: str, ignored_here: bool
) -> None:
    """The workers pass on Ctrl-C (the loader's process acts on it), by a handler, not by
    ignoring it: an ignored signal stays ignored across exec, so the programs the dataset's
    code starts outlived Ctrl-C in the terminal. Where the loader's process ignores it (a
    background job of a shell script), so do they."""
    pids = tmp_path / "programs"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignored_here else None
    try:
        with stoker.Loader.from_dataset(
            StartsAProgram(16, pids), batch_size=4, output="numpy", num_workers=2,
            multiprocessing_context=method, timeout=30,
        ) as loader:
            assert sorted(i for _, indices in loader for i in indices.tolist()) == list(range(16))
            started = [int(pid) for pid in pids.read_text().split()]
            assert len(started) == 2
            for pid in started:
                status = Path(f"/proc/{pid}/status").read_text()
                ignored = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
                assert bool(ignored & (1 << (signal.SIGINT - 1))) == ignored_here, pid
            # The worker itself still passes on Ctrl-C, and reads on.
            for worker in loader._side.builder._workers:
                os.kill(worker.process.pid, signal.SIGINT)
            time.sleep(0.2)
            assert all(w.process.is_alive() for w in loader._side.builder._workers)
            assert sorted(i for _, indices in loader for i in indices.tolist()) == list(range(16))
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def test_a_worker_taken_for_dead_while_it_runs_is_ended_before_its_replacement(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A descriptor that cannot be passed to a worker (EMFILE, say) takes it for dead: the
    process is killed before one starts in its place, not left running beside it."""
    import multiprocessing.reduction

    send_handle = multiprocessing.reduction.send_handle
    sent: list[int] = []
    refused: list[int] = []

    def refusing_once(conn, handle, destination_pid):  # type: ignore[no-untyped-def]
        sent.append(destination_pid)
        if len(sent) == 2:  # the slots' mapping, after the sample index word at its start
            refused.append(destination_pid)
            raise OSError(errno.EMFILE, "Too many open files")
        return send_handle(conn, handle, destination_pid)

    monkeypatch.setattr(multiprocessing.reduction, "send_handle", refusing_once)
    with caplog.at_level("WARNING", logger="stoker"), stoker.Loader.from_dataset(
        Squares(12), batch_size=4, output="numpy", num_workers=1, timeout=30
    ) as loader:
        first = loader._side.builder._workers[0].process.pid
        assert sorted(i for _, indices in loader for i in indices.tolist()) == list(range(12))
        assert refused == [first]
        assert loader._side.builder._workers[0].process.pid != first
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # ended, and reaped
    assert any("replaced by pid" in r.getMessage() for r in caplog.records), caplog.text


def test_a_batch_buffer_the_dataset_code_keeps_goes_back_with_its_last_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stoker._samples import ThreadBuilder

    kept: list[memoryview] = []
    build = ThreadBuilder.build

    def keeping(self, lane, epoch, step, indices, view, shared):  # type: ignore[no-untyped-def]
        if step == 0 and not keeping.done:  # type: ignore[attr-defined]
            keeping.done = True  # type: ignore[attr-defined]
            kept.append(memoryview(view))  # as a frame kept by an exception chain would
        return build(self, lane, epoch, step, indices, view, shared)

    keeping.done = False  # type: ignore[attr-defined]

    monkeypatch.setattr(ThreadBuilder, "build", keeping)
    with stoker.Loader.from_dataset(
        Squares(40), batch_size=4, num_threads=1, prefetch=2, output="numpy", timeout=30
    ) as loader:
        with pytest.raises(stoker.StokerError, match="kept 1 view"):
            for _ in loader:
                pass
        time.sleep(0.5)  # the batches asked for ahead land
        held = loader.stats()["slots_in_use"]
        kept.clear()
        # The slot stays out of the pool while viewed, and comes back with its last view.
        assert loader.stats()["slots_in_use"] == held - 1
        assert sum(1 for _ in loader) == len(loader)


class KillsItself(Squares):
    """Sample 9 kills the process that loads it."""

    def __getitem__(self, index: int):
        if index == 9:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def test_a_batch_whose_worker_dies_twice_is_an_error_naming_it() -> None:
    with stoker.Loader.from_dataset(
        KillsItself(40), batch_size=4, output="numpy", num_workers=2, timeout=30, shuffle=False
    ) as loader, pytest.raises(
        stoker.StokerError,
        match=r"worker process \d .*exited with code -9, SIGKILL while loading step 2 of epoch "
        r"0 \(dataset indices 8, 9, 10, 11\) \(on dataset\[9\]\), as did the process started "
        r"in its place",
    ):
        for _ in loader:
            pass


def test_under_skip_a_sample_that_ends_two_worker_processes_is_a_bad_sample() -> None:
    """A sample that crashes native code (here: kills its process) ends the worker loading it
    and the one started in its place: under on_error="skip" it is then a bad sample, and a
    third process builds the batch without it."""
    with stoker.Loader.from_dataset(
        KillsItself(16), batch_size=4, output="numpy", num_workers=1, timeout=60,
        shuffle=False, on_error="skip",
    ) as loader:
        it = iter(loader)
        seen = []
        for _ in range(4):
            rows = next(it)[1].tolist()
            seen.append((rows, [(b["sample_index"], b["substitute_index"], b["reason"])
                                for b in it.bad_samples]))
        assert seen[2][0] == [8, 10, 10, 11]
        ((index, substitute, reason),) = seen[2][1]
        assert (index, substitute) == (9, 10)
        assert "ended the worker process loading it, twice" in reason and "SIGKILL" in reason
        assert [rows for rows, _ in seen[:2] + seen[3:]] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                             [12, 13, 14, 15]]
        assert loader.stats()["bad_samples"] == 1


class VerySlow(Squares):
    def __getitem__(self, index: int):
        time.sleep(0.2)
        return super().__getitem__(index)


def test_close_during_a_slow_batch_stops_at_the_next_sample() -> None:
    loader = stoker.Loader.from_dataset(VerySlow(400), batch_size=100, num_threads=2)
    iter(loader)  # two lanes start 20 s batches
    time.sleep(0.5)
    started = time.monotonic()
    loader.close()
    assert time.monotonic() - started < 5


_FORKS_A_CHILD = """
import os, sys
import numpy as np
import stoker

class Squares:
    def __len__(self):
        return 40
    def __getitem__(self, i):
        return np.arange(3, dtype=np.float32) + i, i

loader = stoker.Loader.from_dataset(Squares(), batch_size=4, num_workers=2, output="numpy",
                                    multiprocessing_context="fork", timeout=30)
it = iter(loader)
next(it)
processes = [w.process for w in loader._side.builder._workers]
child = os.fork()
if child == 0:
    sys.exit(0)  # exits normally: the exit handlers run, multiprocessing's among them
os.waitpid(child, 0)
rest = sum(1 for _ in it)
same = [w.process for w in loader._side.builder._workers] == processes
print("alive", all(p.is_alive() for p in processes), "same", same, "rest", rest)
loader.close()
"""


def test_a_forked_child_that_exits_leaves_the_parents_worker_processes_alone() -> None:
    """A child made by os.fork() (a subprocess helper, a checkpoint writer) that exits normally
    does not end the parent's worker processes (multiprocessing's exit handler SIGTERMs every
    daemonic child it lists, and the child inherits the parent's list)."""
    done = subprocess.run(
        [sys.executable, "-c", _FORKS_A_CHILD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "alive True same True rest 9" in done.stdout, (done.stdout, done.stderr)
    assert "replaced" not in done.stderr, done.stderr


_A_CHILD_DROPS_ITS_COPY_OF_A_BATCH = """
import gc, os, sys
import numpy as np
import stoker

class Squares:
    def __len__(self):
        return 40
    def __getitem__(self, i):
        return np.arange(1024, dtype=np.float32) + i + 1, i

def fork_a_writer(how, batch):
    child = os.fork()
    if child == 0:
        if how == "exit":
            sys.exit(0)  # unwinds this frame and the loop's: the child's copies of batch drop
        del batch
        gc.collect()
        os._exit(0)
    os.waitpid(child, 0)

loader = stoker.Loader.from_dataset(Squares(), batch_size=4, num_workers=2, output="numpy",
                                    multiprocessing_context="fork", timeout=30)
for how in ["exit", "del"]:
    for step, batch in enumerate(loader):
        if step == 1:
            before = batch[0].copy()
            fork_a_writer(how, batch)
            print(how, "intact", bool(np.array_equal(batch[0], before)))
loader.close()
"""


def test_a_forked_child_dropping_its_copy_of_a_batch_leaves_the_parents_batch_intact() -> None:
    """A child made by os.fork() that drops its copy of a batch (exiting through sys.exit, or
    deleting it) leaves the parent's batch as it was: the batch's slot lies in memory shared
    with the worker processes, and the child's drop used to release its pages (the parent's
    batch then read as zeros)."""
    done = subprocess.run(
        [sys.executable, "-c", _A_CHILD_DROPS_ITS_COPY_OF_A_BATCH],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "exit intact True" in done.stdout, (done.stdout, done.stderr)
    assert "del intact True" in done.stdout, (done.stdout, done.stderr)


_EXITS_WITHOUT_CLOSING = """
import sys, time
import numpy as np
import stoker

class Slow:
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.05)
        return np.full((4,), i, dtype=np.int64)

if __name__ == "__main__":
    loader = stoker.Loader.from_dataset(Slow(), batch_size=4, num_workers=2, output="numpy",
                                        prefetch=4, multiprocessing_context=sys.argv[1])
    next(iter(loader))
    print("exiting without close", flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_script_that_exits_without_closing_stops_its_workers_without_replacing_them(
    method: str, tmp_path: Path
) -> None:
    """A script that ends with a loader still open (no close(), work in flight) closes it at
    exit before multiprocessing's exit handler SIGTERMs the worker processes: no worker is taken
    for dead and replaced while the interpreter exits."""
    script = tmp_path / "exits.py"  # a file: spawned workers import the dataset's class
    script.write_text(_EXITS_WITHOUT_CLOSING)
    done = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "exiting without close" in done.stdout, (done.stdout, done.stderr)
    assert "replaced" not in done.stderr, done.stderr



def test_a_close_on_a_lanes_own_thread_does_not_wait_for_its_exchange(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The collector may finalise a loader in a reference cycle on any thread, its own lane's
    mid-exchange with a worker among them: close() there waited 5 s for the worker (never told
    to stop, the lane holding its pipe), 5 s more for the lane to let the pipe go, and left it
    open. It stops the worker and closes the pipe at once now; the lane's exchange ends on it."""
    import multiprocessing

    from stoker import _dataset_workers

    loader = stoker.Loader.from_dataset(Squares(64), batch_size=4, num_workers=1,
                                        output="numpy", multiprocessing_context="fork")
    worker = loader._side.builder._workers[0]
    build = _dataset_workers.Worker._build
    took: list[float] = []

    def closing_first(self: Any, *args: Any) -> Any:
        if not took:
            started = time.monotonic()
            try:
                loader.close()  # as the collector would, on this lane's thread
            finally:
                took.append(time.monotonic() - started)
        return build(self, *args)

    monkeypatch.setattr(_dataset_workers.Worker, "_build", closing_first)
    with caplog.at_level("WARNING", logger="stoker"):
        with pytest.raises(stoker.StokerError, match="closed"):
            for _ in loader:
                pass
        # next() raises as the close begins; the lane's close ends on its own thread.
        deadline = time.monotonic() + 15
        while not took and time.monotonic() < deadline:
            time.sleep(0.05)
    assert took and took[0] < 3.0, took
    assert worker.conn.closed
    assert not [r for r in caplog.records if "left open" in r.getMessage()]
    assert [p.name for p in multiprocessing.active_children()
            if p.name.startswith("stoker-dataset-worker-")] == []

_SLOW_TO_START = """
import os, sys, time
if __name__ == "__mp_main__":
    # A spawn or forkserver worker imports this script again, and its top level waits: as a script's
    # unguarded work would (a download, a barrier).
    with open(os.environ["STARTS"], "a") as starts:
        print(time.time(), file=starts)
    time.sleep(float(sys.argv[1]))
import multiprocessing
import numpy as np
import stoker

class Big:
    def __init__(self):
        self.blob = bytes(4 << 20)  # more than a pipe's buffer holds
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return np.full(3, i, dtype=np.float32)

if __name__ == "__main__":
    began = time.monotonic()
    try:
        with stoker.Loader.from_dataset(Big(), batch_size=4, num_workers=3, output="numpy",
                                        multiprocessing_context=sys.argv[3],
                                        timeout=float(sys.argv[2])) as loader:
            print("batches", sum(1 for _ in loader))
    except stoker.LoaderTimeoutError as error:
        print("timeout after", round(time.monotonic() - began, 1), "s:", error)
    print("left", [p.name for p in multiprocessing.active_children()])
"""


def _slow_to_start(
    tmp_path: Path, sleep: float, timeout: float, method: str = "spawn"
) -> tuple[str, list[float]]:
    """Runs `_SLOW_TO_START`: its stdout and when each worker began to start."""
    script = tmp_path / "slow_start.py"  # a file: spawned workers import it again
    script.write_text(_SLOW_TO_START)
    starts = tmp_path / "starts"
    done = subprocess.run(
        [sys.executable, str(script), str(sleep), str(timeout), method], capture_output=True,
        text=True, timeout=90, env={**os.environ, "STARTS": str(starts)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, [float(line) for line in starts.read_text().split()]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_that_does_not_start_raises_a_timeout_instead_of_hanging(
    method: str, tmp_path: Path
) -> None:
    """A worker that never gets to read its state (its import of the main module waits): the
    loader raises LoaderTimeoutError after ``timeout`` and ends the workers. Before, the
    parent waited forever to hand it a state larger than the pipe's buffer."""
    out, _ = _slow_to_start(tmp_path, sleep=3600, timeout=3, method=method)
    assert "timeout after" in out, out
    assert "did not start within 3.0 s" in out and "__mp_main__" in out, out
    seconds = float(out.split("timeout after ")[1].split()[0])
    assert 3 <= seconds < 30, out
    assert "left []" in out, out


def test_worker_processes_start_side_by_side(tmp_path: Path) -> None:
    """Each worker's start takes 2 s (its import of the main module): the workers begin to
    start together, not each after the one before has loaded its state."""
    out, starts = _slow_to_start(tmp_path, sleep=2, timeout=60)
    assert "batches 2" in out and "left []" in out, out
    assert len(starts) == 3, starts
    assert max(starts) - min(starts) < 1.5, starts


_PARENT_KILLED_MID_SAMPLE = """
import re, sys, time
import numpy as np
import stoker

class Hangs:
    def __len__(self):
        return 40
    def __getitem__(self, i):
        if i >= 8:
            time.sleep(3600)  # a sample that never finishes
        if i >= 4:
            # Nor does this one, in C code that holds the interpreter's lock all along.
            re.match(r"(a+)+$", "a" * 64 + "b")
        return np.zeros(3, dtype=np.float32), i

if __name__ == "__main__":
    loader = stoker.Loader.from_dataset(Hangs(), batch_size=4, num_workers=2, output="numpy",
                                        shuffle=False, multiprocessing_context=sys.argv[1],
                                        timeout=3600)
    it = iter(loader)
    next(it)
    print(" ".join(str(w.process.pid) for w in loader._side.builder._workers), flush=True)
    next(it)  # waits on a hung sample until killed
"""


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_worker_processes_end_with_their_killed_parent_even_mid_sample(
    method: str, tmp_path: Path
) -> None:
    script = tmp_path / "parent.py"  # a file: a fresh interpreter finds the dataset's class
    script.write_text(_PARENT_KILLED_MID_SAMPLE)
    # The killed loader cannot remove its workers' stack folder: it goes under tmp_path.
    parent = subprocess.Popen(
        [sys.executable, str(script), method], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        assert parent.stdout is not None
        started, _, _ = select.select([parent.stdout], [], [], 120)
        assert started, "the loader did not start its workers"
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(0.5)  # both workers are in a hung sample now
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    finally:
        parent.kill()  # as the OOM killer does: no handler runs
        parent.wait(timeout=10)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.1)
        assert not any(_running(pid) for pid in pids), pids
    finally:
        for pid in pids:  # left running only when the test fails
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def test_close_stops_the_worker_processes() -> None:
    loader = stoker.Loader.from_dataset(Squares(20), batch_size=4, num_workers=2, output="numpy")
    processes = [w.process for w in loader._side.builder._workers]
    next(iter(loader))
    loader.close()
    assert all(not p.is_alive() for p in processes)
    with pytest.raises(stoker.StokerError, match="closed"):
        iter(loader)


class SlowFirst(Squares):
    """dataset[0] takes 3 s (a lazy download, say); the rest are quick."""

    def __getitem__(self, index: int):
        if index == 0:
            time.sleep(3)
        return super().__getitem__(index)


def test_a_worker_process_slower_than_the_timeout_on_dataset_0_is_a_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(stoker.LoaderTimeoutError, match=r"reading dataset\[0\] within 1"):
        stoker.Loader.from_dataset(
            SlowFirst(10), batch_size=2, num_workers=1, timeout=1, output="numpy"
        )
    assert time.monotonic() - started < 10


class HangsOn(Squares):
    """Sample 9 waits (a stalled network read, say) until the file ``release`` exists."""

    def __init__(self, length: int, release: Path) -> None:
        super().__init__(length)
        self.release = release

    def __getitem__(self, index: int):
        if index == 9:
            self.wait_for_release()
        return super().__getitem__(index)

    def wait_for_release(self) -> None:
        deadline = time.monotonic() + 60
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)


@pytest.mark.parametrize(
    "mode, who",
    [
        ({"num_threads": 2}, r"lane thread \d \(on dataset\[9\]\)"),
        ({"num_workers": 2}, r"dataset worker process \d \(pid \d+\) \(on dataset\[9\]\)"),
        (
            {"num_workers": 1, "multiprocessing_context": "spawn"},
            r"dataset worker process 0 \(pid \d+\) \(on dataset\[9\]\)",
        ),
    ],
)
def test_a_timeout_names_the_batch_a_lane_is_stuck_on_and_its_python_line(
    tmp_path: Path, mode: dict, who: str
) -> None:
    release = tmp_path / "release"
    loader = stoker.Loader.from_dataset(
        HangsOn(40, release), batch_size=4, shuffle=False, timeout=1.5, output="numpy", **mode
    )
    try:
        with pytest.raises(stoker.LoaderTimeoutError) as timed_out:
            for _ in loader:
                pass
        message = str(timed_out.value)
        assert "waiting for epoch 0 step 2" in message  # the native part: the batch waited for
        stuck = re.search(
            who + r" has been loading step 2 of epoch 0 \(dataset indices 8, 9, 10, 11\) for "
            r"(\d+\.\d) s, at [^;]*test_from_dataset\.py:\d+ in wait_for_release",
            message,
        )
        assert stuck is not None, message
        assert float(stuck.group(1)) >= 1.0
    finally:
        release.touch()
        loader.close()
    stacks = getattr(loader._side.builder, "_dumps", None)  # process mode: the workers' stack files
    assert stacks is None or not Path(stacks).exists()


def test_a_faulthandler_dump_is_read_to_the_loading_threads_dataset_lines() -> None:
    from stoker import _busy as busy

    ours = busy._PACKAGE
    dump = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.12/threading.py", line 355 in wait\n'
        "\n"
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{ours}/samples.py", line 120 in sample_rng\n'
        '  File "/data/code/my_data.py", line ??? in fetch\n'
        '  File "/data/code/my_data.py", line 20 in __getitem__\n'
        f'  File "{ours}/samples.py", line 255 in _load\n'
        f'  File "{ours}/samples.py", line 330 in fill_batch\n'
        '  File "/usr/lib/python3.12/multiprocessing/process.py", line 108 in run\n'
    )
    # The loading thread (through fill_batch), its dataset frames only, innermost first.
    assert busy._loading_stack(dump) == "my_data.py:??? in fetch <- my_data.py:20 in __getitem__"
    assert busy._loading_stack("  <no Python frame>\n") == ""


def test_a_stack_is_asked_only_of_a_process_that_catches_the_signal(tmp_path: Path) -> None:
    """The dump signal ends a process that does not catch it: such a process is not sent it."""
    from stoker import _busy as busy

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)  # started; SIGUSR1 left at its default
        path = tmp_path / f"{sleeper.pid}.stacks"
        path.write_text("")
        assert busy.read_dumps([(sleeper.pid, str(path))], wait=0.3) == {sleeper.pid: ""}
        time.sleep(0.2)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_layout_a_worker_process_cannot_send_is_an_error_naming_why() -> None:
    import collections as local

    Pair = local.namedtuple("Pair", "x y")  # a class pickle cannot find by name

    class LocalPairs(Squares):
        def __getitem__(self, index: int):
            return Pair(np.float32(index), index)

    with pytest.raises(stoker.StokerError, match=r"(?s)handling 'probe'.*Pickl"):
        stoker.Loader.from_dataset(
            LocalPairs(8), batch_size=2, num_workers=1, timeout=10, output="numpy",
            multiprocessing_context="fork",
        )


class SlowBatches(Squares):
    """Each sample takes 4 s: a batch of 4 keeps a worker busy for 16 s."""

    def __getitem__(self, index: int):
        time.sleep(4)
        return super().__getitem__(index)


def test_close_with_busy_worker_processes_waits_one_grace_period_for_all() -> None:
    loader = stoker.Loader.from_dataset(
        SlowBatches(64), batch_size=4, num_workers=3, prefetch=3, output="numpy", timeout=60
    )
    processes = [w.process for w in loader._side.builder._workers]
    iter(loader)  # the three workers start on their first batches
    time.sleep(1.5)
    started = time.monotonic()
    loader.close()
    # One grace period of 5 s for the three (each busy 14.5 s more), then killed: not 5 s each.
    assert time.monotonic() - started < 9
    assert all(not p.is_alive() for p in processes)


def test_a_close_interrupted_in_its_grace_period_still_stops_every_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second Ctrl-C while close() waits for busy workers: they are killed at once, not
    left running with nothing left to stop them, and the loader is closed."""
    from stoker import _dataset_workers as dataset_workers

    loader = stoker.Loader.from_dataset(
        SlowBatches(64), batch_size=4, num_workers=2, prefetch=2, output="numpy", timeout=60
    )
    processes = [w.process for w in loader._side.builder._workers]
    iter(loader)  # both workers start on their first batches (16 s each)
    time.sleep(1.5)

    def interrupted(self: object, deadline: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset_workers.Worker, "end", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loader.close()
    monkeypatch.undo()
    deadline = time.monotonic() + 5
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.is_alive() for p in processes)
    assert loader._closed


def test_close_leaves_a_workers_pipe_to_the_lane_in_an_exchange_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close() while lanes wait on busy workers: it kills them, and closes each pipe only once
    the lane using it has let go. A pipe closed under a lane frees its descriptor's number for
    the next file opened, which that lane could then read, write or close."""
    from multiprocessing import connection

    from stoker import _dataset_workers as dataset_workers

    under_a_lane: list[str] = []
    workers: list[Any] = []

    class WatchedLock:
        """A worker's lock that knows which thread holds it."""

        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.owner: int | None = None

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            got = self.lock.acquire(blocking, timeout)
            if got:
                self.owner = threading.get_ident()
            return got

        def release(self) -> None:
            self.owner = None
            self.lock.release()

        def __enter__(self) -> bool:
            return self.acquire()

        def __exit__(self, *_: object) -> None:
            self.release()

    close = connection.Connection.close

    def watched_close(self: Any) -> None:
        for worker in workers:
            owner = worker.lock.owner
            if worker.conn is self and owner not in (None, threading.get_ident()):
                under_a_lane.append(threading.current_thread().name)
        close(self)

    died = dataset_workers.Worker._died

    def slow_to_let_go(self: Any, doing: str) -> Any:
        # A lane that takes its time once its worker is gone: a close that does not wait for
        # it closes the pipe under it every time, not only when the threads interleave so.
        time.sleep(0.3)
        return died(self, doing)

    monkeypatch.setattr(connection.Connection, "close", watched_close)
    monkeypatch.setattr(dataset_workers.Worker, "_died", slow_to_let_go)
    loader = stoker.Loader.from_dataset(
        SlowBatches(64), batch_size=4, num_workers=2, prefetch=2, output="numpy", timeout=60
    )
    workers.extend(loader._side.builder._workers)
    for worker in workers:
        worker.lock = WatchedLock()
    processes = [w.process for w in workers]
    iter(loader)  # both workers start on their first batches (16 s each)
    time.sleep(1.5)
    loader.close()
    assert not any(p.is_alive() for p in processes)
    assert under_a_lane == []
    assert all(w.conn.closed for w in workers), "every pipe closed once its lane let go"


class JpegFiles:
    """Reads an image folder's files as bytes, in the native ImageFolder's index order."""

    def __init__(self, root: str) -> None:
        self.files = []
        for label, name in enumerate(sorted(os.listdir(root))):
            folder = os.path.join(root, name)
            if os.path.isdir(folder):
                self.files += [(os.path.join(folder, f), label) for f in sorted(os.listdir(folder))]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        path, label = self.files[index]
        with open(path, "rb") as file:
            return file.read(), label


@pytest.mark.parametrize("mode", [{"num_threads": 2}, {"num_workers": 2}])
def test_native_ops_decode_the_bytes_python_read_like_a_native_source(tmp_path, mode) -> None:
    root = stoker._native.make_dataset(str(tmp_path / "images"), 30)
    # One corrupt file: both loaders substitute the next sample, drawing from the stream of
    # the one it replaces.
    corrupt = JpegFiles(root).files[7][0]
    with open(corrupt, "r+b") as file:
        file.truncate(100)
    settings_skip = dict(on_error="skip")
    settings = dict(batch_size=4, shuffle=True, seed=3, output="numpy", **settings_skip)
    with stoker.Loader(root, pipeline=stoker.vision.imagenet_train(32), **settings) as native:
        expected = [(b["image"].copy(), b["label"].copy()) for b in native]
        assert native.stats()["bad_samples"] == 1
    with stoker.Loader.from_dataset(
        JpegFiles(root), pipeline=stoker.vision.imagenet_train(32), **settings, **mode
    ) as wrapped:
        got = [(images.copy(), labels.copy()) for images, labels in wrapped]
        assert wrapped.stats()["bad_samples"] == 1
    assert len(got) == len(expected) == 8
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        assert images.shape == want_images.shape and images.dtype == want_images.dtype
        np.testing.assert_array_equal(labels, want_labels)
        np.testing.assert_array_equal(images, want_images)


def test_bytes_that_do_not_decode_follow_on_error(tmp_path) -> None:
    root = stoker._native.make_dataset(str(tmp_path / "images"), 8)

    class Broken(JpegFiles):
        def __getitem__(self, index: int):
            data, label = super().__getitem__(index)
            return (b"not a jpeg" if index == 2 else data), label

    pipeline = stoker.vision.imagenet_train(16)
    with (
        stoker.Loader.from_dataset(Broken(root), pipeline=pipeline, batch_size=4) as loader,
        pytest.raises(stoker.DecodeError, match=r"dataset\[2\]"),
    ):
        list(loader)
    with stoker.Loader.from_dataset(
        Broken(root), pipeline=pipeline, batch_size=4, on_error="skip", output="numpy"
    ) as loader:
        it = iter(loader)
        next(it)
        assert [b["substitute_index"] for b in it.bad_samples] == [3]
    with pytest.raises(TypeError, match="pipeline="):
        stoker.Loader.from_dataset(Broken(root), batch_size=4)
    with pytest.raises(TypeError, match="holds no bytes"):
        stoker.Loader.from_dataset(Squares(4), pipeline=pipeline)


def test_the_dashboard_and_stats_show_a_wrapped_dataset() -> None:
    import json
    import urllib.request

    with stoker.Loader.from_dataset(
        Squares(40), batch_size=4, output="numpy", num_workers=2, dashboard=0
    ) as loader:
        url = loader.dashboard_url
        assert url is not None
        assert sum(1 for _ in loader) == 10
        stats = loader.stats()
        assert stats["samples"] == 40 and stats["batches"] == 10
        assert stats["thread_rule"] == "num_workers" and stats["bad_samples"] == 0
        deadline = time.monotonic() + 10
        jobs: list = []
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url.rstrip("/") + "/api/jobs", timeout=5) as response:
                jobs = json.loads(response.read())["jobs"]
            if jobs and jobs[0]["current"] and jobs[0]["current"]["samples_total"] >= 40:
                break
            time.sleep(0.3)
        assert jobs and jobs[0]["name"] == "Squares"
        assert jobs[0]["current"]["samples_total"] == 40


# -- worker processes that start like DataLoader's -------------------------------------------

_STDIN_SCRIPT = """
import sys
import numpy as np
import stoker

class Squares:
    def __len__(self):
        return 12
    def __getitem__(self, index):
        return np.full(3, index * index, dtype=np.int64)

context = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "default" else None
data = Squares() if sys.argv[2] == "script-class" else [np.full(3, i * i) for i in range(12)]
with stoker.Loader.from_dataset(
    data, batch_size=4, num_workers=2, multiprocessing_context=context, output="numpy"
) as loader:
    print(sorted(int(v) for batch in loader for v in batch[:, 0]))
"""


def _run_script(source: str, *args: str, via: str = "stdin") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-"] if via == "stdin" else [sys.executable, "-c", source]
    return subprocess.run(
        [*command, *args],
        input=source if via == "stdin" else None,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("via", ["stdin", "-c"])
def test_a_script_fed_to_python_runs_with_worker_processes(via: str) -> None:
    """The default start method (fork on Linux) inherits what the script defined."""
    done = _run_script(_STDIN_SCRIPT, "default", "script-class", via=via)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([i * i for i in range(12)])


def test_the_programs_own_start_method_is_the_default() -> None:
    """A program that set its start method (``multiprocessing.set_start_method``) gets its
    workers started so, as DataLoader's are; only a program that set none gets fork."""
    script = (
        "import multiprocessing, stoker\n"
        "multiprocessing.set_start_method('spawn')\n"
        "if __name__ == '__main__':\n"
        "    with stoker.Loader.from_dataset(list(range(8)), batch_size=4, num_workers=1,\n"
        "                                    output='numpy') as loader:\n"
        "        rows = [int(v) for batch in loader for v in batch]\n"
        "        print(loader._side.builder._workers[0].start_method, rows)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "spawn [0, 1, 2, 3, 4, 5, 6, 7]"


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_script_read_from_stdin_runs_under_each_start_method(method: str) -> None:
    """A dataset of importable classes loads under every start method from a `python -`
    script: the fresh interpreters are not asked to run `<stdin>` again."""
    done = _run_script(_STDIN_SCRIPT, method, "list")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([i * i for i in range(12)])


@pytest.mark.parametrize("via", ["stdin", "-c"])
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_class_defined_in_a_stdin_script_is_refused_by_name_in_a_fresh_interpreter(
    method: str, via: str
) -> None:
    """Also from ``python -c`` (and an interactive session), whose main module has no file:
    it was let through, and each worker failed to find the class."""
    done = _run_script(_STDIN_SCRIPT, method, "script-class", via=via)
    assert done.returncode != 0
    assert "ValueError" in done.stderr and "cannot be run again" in done.stderr, done.stderr
    assert "multiprocessing_context='fork'" in done.stderr


_FLAKY_MODULE = """
import os
import numpy as np

if os.getpid() != {pid}:
    raise ImportError("flaky_dataset will not load in a worker process")

class Flaky:
    def __len__(self):
        return 8
    def __getitem__(self, index):
        return np.zeros(2)
"""


@pytest.mark.parametrize(
    ("method", "workers"), [("forkserver", 1), ("spawn", 1), ("forkserver", 8)]
)
def test_a_dataset_whose_module_fails_to_import_in_the_worker_names_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, workers: int
) -> None:
    """With many workers the first has failed and exited before it is asked for anything:
    its failure, left on its pipe, is read (it was lost, and the error blamed a missing main
    guard)."""
    # Importable in this process only (a fork server or a spawned worker is another one).
    (tmp_path / "flaky_dataset.py").write_text(_FLAKY_MODULE.replace("{pid}", str(os.getpid())))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    import flaky_dataset

    with pytest.raises(stoker.DatasetError) as raised:
        stoker.Loader.from_dataset(
            flaky_dataset.Flaky(), batch_size=2, num_workers=workers,
            multiprocessing_context=method,
        )
    message = str(raised.value)
    assert f"could not load the dataset sent to it ({method})" in message
    assert "ImportError: flaky_dataset will not load in a worker process" in message


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_dataset_of_torch_tensors_reaches_every_fresh_worker(method: str) -> None:
    """A dataset holding torch tensors (a TensorDataset) is sent to each fresh interpreter by
    value: pickled for torch's own process handover, its storage would go through a handle
    only one process can take, and every worker but the first would fail to load it."""
    torch = pytest.importorskip("torch")
    data = torch.utils.data.TensorDataset(
        torch.arange(24, dtype=torch.int64).reshape(12, 2), torch.arange(12)
    )
    with stoker.Loader.from_dataset(
        data, batch_size=4, num_workers=2, multiprocessing_context=method, output="numpy"
    ) as loader:
        got = sorted(int(v) for batch in loader for v in batch[1])
    assert got == list(range(12))


class Locked(Squares):
    """Holds a lock, which does not pickle."""

    def __init__(self, length: int = 8) -> None:
        super().__init__(length)
        self.lock = threading.Lock()


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_dataset_that_does_not_pickle_is_refused_naming_fork(method: str) -> None:
    refused = r"does not pickle.*multiprocessing_context='fork'"
    with pytest.raises(stoker.DatasetError, match=f"the dataset cannot.*{refused}"):
        stoker.Loader.from_dataset(
            Locked(), batch_size=2, num_workers=1, multiprocessing_context=method
        )
    # A picklable dataset with a transform that is not (a lambda): the transform is named.
    with pytest.raises(stoker.DatasetError, match=f"the transform cannot.*{refused}"):
        stoker.Loader.from_dataset(
            Squares(4), batch_size=2, num_workers=1, multiprocessing_context=method,
            transform=lambda sample: sample,
        )


def test_a_state_saved_with_other_native_ops_is_refused(tmp_path) -> None:
    """The ops Stoker runs on the samples' images decide the batches like a native source's:
    a state saved with other ones is refused naming them, as ``Loader``'s is."""
    root = stoker._native.make_dataset(str(tmp_path / "images"), 12)
    settings = dict(batch_size=4, output="numpy", num_threads=1)
    crop = stoker.ops.RandomResizedCrop
    with stoker.Loader.from_dataset(
        JpegFiles(root), pipeline=[stoker.ops.DecodeImage(), crop(16)], **settings
    ) as first:
        next(iter(first))
        state = first.state_dict()
    with stoker.Loader.from_dataset(
        JpegFiles(root), pipeline=[stoker.ops.DecodeImage(), crop(16)], **settings
    ) as same:
        same.load_state_dict(state)
    with stoker.Loader.from_dataset(
        JpegFiles(root), pipeline=[stoker.ops.DecodeImage(), crop(16, scale=(0.9, 1.0))],
        **settings,
    ) as other, pytest.raises(ValueError, match="reading: saved"):
        other.load_state_dict(state)


class FlakyStorage(Squares):
    """Sample 5 fails to connect twice, then loads; sample 9's disk fails every time (EIO);
    with ``memory``, sample 9 raises MemoryError instead; without, sample 2's address never
    answers (a dead URL)."""

    def __init__(self, length: int, memory: bool = False) -> None:
        super().__init__(length)
        self.memory = memory
        self.tries: dict[int, int] = {}

    def __getitem__(self, index: int):
        self.tries[index] = self.tries.get(index, 0) + 1
        if index == 5 and self.tries[index] <= 2:
            raise ConnectionResetError("the object store hung up")
        if index == 2 and not self.memory:
            raise TimeoutError("the URL did not answer")
        if index == 9:
            if self.memory:
                raise MemoryError
            raise OSError(errno.EIO, "Input/output error")
        return super().__getitem__(index)


@pytest.mark.parametrize("mode", [{"num_threads": 1}, {"num_workers": 1}])
def test_a_failing_machine_is_retried_and_never_replaced_as_a_bad_sample(mode) -> None:
    """Under ``on_error="skip"`` a sample whose storage failed is not swapped for its
    neighbour (a duplicate in the epoch, silently): tried again, then the batch fails. A
    network failure is tried again too, then it is the sample's (a dead address)."""
    settings = dict(batch_size=4, shuffle=False, on_error="skip", output="numpy", timeout=60)
    for memory in (False, True):
        with stoker.Loader.from_dataset(FlakyStorage(12, memory), **settings, **mode) as loader:
            it = iter(loader)
            first = next(it)
            if not memory:
                assert list(first[1]) == [0, 1, 3, 3]
                (dead,) = it.bad_samples
                assert "TimeoutError" in dead["reason"] and "(tried 4 times)" in dead["reason"]
            second = next(it)  # sample 5 loads at its third try
            assert list(second[1]) == [4, 5, 6, 7] and it.bad_samples == []
            with pytest.raises(stoker.DecodeError, match="not replaced by another sample"):
                next(it)
            assert loader.stats()["bad_samples"] == (0 if memory else 1)


_IMPORTS_TORCH = r"""
import sys
import numpy as np
import stoker

class TorchInside:
    def __len__(self):
        return 8

    def __getitem__(self, index):
        import torch  # first imported by the sample itself, in the worker
        return torch.rand(3).numpy(), index

if sys.argv[1] == "before":
    import torch
with stoker.Loader.from_dataset(TorchInside(), batch_size=4, seed=2, output="numpy",
                                num_workers=2, multiprocessing_context="fork") as loader:
    print(np.concatenate([batch[0] for batch in loader]).ravel().tolist())
"""


def test_a_sample_that_imports_torch_itself_draws_seeded() -> None:
    """A worker seeds torch's generator per sample only once torch is imported: a sample that
    imports it draws like one whose process had imported it before (loaded again, seeded)."""
    from conftest import torch_or_skip

    torch_or_skip()
    runs = [
        subprocess.run([sys.executable, "-c", _IMPORTS_TORCH, when], capture_output=True,
                       text=True, timeout=120, check=True).stdout
        for when in ("inside", "before")
    ]
    assert runs[0] == runs[1] and runs[0].strip()


class ArgumentsKept(Squares):
    """Each sample: the bytes its worker process's arguments still hold (multiprocessing keeps
    a process's arguments for its whole life)."""

    def __getitem__(self, index: int):
        import multiprocessing

        kept = getattr(multiprocessing.current_process(), "_args", ())
        held = sum(len(a) for a in kept if isinstance(a, (bytes, bytearray)))
        return np.array([held], dtype=np.int64), index


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_spawned_worker_holds_one_copy_of_the_dataset(method: str) -> None:
    """Under spawn and forkserver the pickled dataset comes over the pipe and is dropped once
    loaded: not a process argument, kept beside the loaded copy for the worker's life."""
    with stoker.Loader.from_dataset(
        ArgumentsKept(8), batch_size=4, output="numpy", num_workers=1,
        multiprocessing_context=method, timeout=60,
    ) as loader:
        held = [int(v) for batch in loader for v in batch[0].ravel()]
    assert held == [0] * 8


def _workers_inside_a_daemon(report: Any) -> None:
    try:
        stoker.Loader.from_dataset(Squares(8), batch_size=4, num_workers=1).close()
        report.put("made")
    except Exception as error:
        report.put(f"{type(error).__name__}: {error}")


def test_worker_processes_inside_a_daemonic_process_are_refused_naming_the_way_out() -> None:
    """A DataLoader worker is daemonic: multiprocessing refuses it children with a bare
    AssertionError; the loader says what to use instead."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    report = context.Queue()
    daemon = context.Process(target=_workers_inside_a_daemon, args=(report,), daemon=True)
    daemon.start()
    try:
        said = report.get(timeout=60)
    finally:
        daemon.join(30)
    assert said.startswith("ValueError") and "num_threads" in said, said


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


class RaisesUnprintable(Squares):
    def __getitem__(self, index: int):
        if index == 2:
            raise Unprintable
        return super().__getitem__(index)


def test_an_exception_whose_str_raises_is_still_a_bad_sample() -> None:
    with stoker.Loader.from_dataset(
        RaisesUnprintable(8), batch_size=4, on_error="skip", output="numpy", shuffle=False
    ) as loader:
        it = iter(loader)
        assert list(next(it)[1]) == [0, 1, 3, 3]
        (bad,) = it.bad_samples
        assert "Unprintable: <its str() raised>" in bad["reason"]


class Trainer:
    """Holds its loader, whose transform is one of its own methods: a reference cycle through
    the native loader."""

    def __init__(self, mode: dict) -> None:
        self.loader = stoker.Loader.from_dataset(
            Squares(16), batch_size=4, output="numpy", transform=self.augment, **mode
        )
        next(iter(self.loader))

    def augment(self, sample):
        return sample


@pytest.mark.parametrize("mode", [{"num_threads": 2}, {"num_workers": 1}])
def test_a_loader_in_a_reference_cycle_is_collected_with_its_threads_and_workers(mode) -> None:
    import gc
    import weakref

    threads_before = threading.active_count()
    trainer = Trainer(mode)
    loader = weakref.ref(trainer.loader)
    workers = [w.process for w in trainer.loader._side.builder._workers] \
        if "num_workers" in mode else []
    del trainer
    # A batch still being built ahead holds the dataset from its thread's frame until done.
    deadline = time.monotonic() + 30
    while gc.collect() >= 0 and loader() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loader() is None, "the cycle through the native loader was not collected"
    deadline = time.monotonic() + 30
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads_before
    for process in workers:
        process.join(30)
        assert not process.is_alive()


class Scaled(Squares):
    """Samples scaled by an attribute the training loop may change."""

    scale = 1

    def __getitem__(self, index: int):
        return np.full(1, index * self.scale, dtype=np.int64), index


@pytest.mark.parametrize(("mode", "sees_the_change"),
                         [({"num_threads": 1}, True), ({"num_workers": 1}, False)])
def test_worker_processes_hold_the_dataset_as_it_was_when_they_started(
    mode, sees_the_change
) -> None:
    """As the README says: a worker process (like DataLoader's persistent workers) keeps the
    dataset it started with; threads read the live one."""
    dataset = Scaled(8)
    with stoker.Loader.from_dataset(dataset, batch_size=4, shuffle=False, prefetch=1,
                                    output="numpy", **mode) as loader:
        next(iter(loader))
        dataset.scale = 10
        loader.set_epoch(3)  # not the next epoch, whose first batch may be built already
        values = [int(v) for batch in loader for v in batch[0].ravel()]
    expected = [i * (10 if sees_the_change else 1) for i in range(8)]
    assert sorted(values) == expected


def test_the_native_loader_watch_ends_its_process_once_the_loader_is_gone() -> None:
    """The watch a worker process starts (``_native.exit_with_loader``) runs without the
    interpreter's lock: it ends the process while the process sleeps, once the loader's
    process is gone."""
    loader_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    watched = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from stoker import _native; "
         f"_native.exit_with_loader({loader_process.pid}); time.sleep(120); print('not ended')"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(1.0)
        assert watched.poll() is None, "the watch ended its process with the loader alive"
        loader_process.kill()
        loader_process.wait(timeout=10)  # reaped: its /proc entry is gone
        out, _ = watched.communicate(timeout=15)
        assert watched.returncode == 0 and "not ended" not in out
    finally:
        for process in (loader_process, watched):
            process.kill()
            process.wait(timeout=10)


def test_a_torch_iterable_dataset_with_a_len_is_refused_by_name() -> None:
    from conftest import torch_or_skip

    torch = torch_or_skip()

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

        def __len__(self) -> int:
            return 8

    with pytest.raises(TypeError, match="Stream is a torch IterableDataset"):
        stoker.Loader.from_dataset(Stream(), batch_size=4)


def test_samples_whose_seeds_share_their_low_half_draw_apart() -> None:
    """Samples 17629 and 39982 of seed 4, epoch 0, have seeds equal in their low 32 bits:
    numpy's global generator is seeded with both halves, so they draw differently."""
    low = [stoker._native.sample_seed(4, 0, i) & 0xFFFF_FFFF for i in (17629, 39982)]
    assert low[0] == low[1]
    with stoker.Loader.from_dataset(
        GlobalDrawing(40_000), batch_size=1, seed=4, shuffle=False, output="numpy",
        num_workers=1,
    ) as loader:
        state = loader.state_dict()
        draws = []
        for index in (17629, 39982):
            loader.load_state_dict(dict(state, step=index))
            draws.append(next(iter(loader))[0].copy())
    assert not np.array_equal(draws[0], draws[1])


_UNGUARDED_SCRIPT = """
import sys
import numpy as np
import stoker

class Squares:
    def __len__(self):
        return 12
    def __getitem__(self, index):
        return np.full(3, index * index, dtype=np.int64)

try:
    stoker.Loader.from_dataset(Squares(), batch_size=4, num_workers=1,
                               multiprocessing_context="spawn", output="numpy", timeout=60)
except stoker.DatasetError as error:
    print("DatasetError:", error)
"""


def test_a_script_without_a_main_guard_under_spawn_is_told_what_to_do(tmp_path: Path) -> None:
    """A spawned worker re-runs the script, whose loader it cannot start: the private
    ``_WorkerDied`` reached the user, naming neither the cause nor the fix."""
    script = tmp_path / "train.py"
    script.write_text(_UNGUARDED_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    said = done.stdout.strip()
    assert said.startswith("DatasetError: dataset worker process 0"), (said, done.stderr)
    assert "if __name__ == \"__main__\":" in said and "'spawn'" in said, said


def test_stack_folders_a_killed_loader_left_are_removed_by_the_next() -> None:
    """The workers' stack folder of a loader killed before its ``close()`` (SIGKILL, the OOM
    killer) stayed in the temp folder for good; the next loader with workers removes the
    folders of processes that are gone, and keeps those of live ones."""
    import tempfile

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(gone.stdout)
    left = Path(tempfile.mkdtemp(prefix=f"stoker-stacks-{dead}-"))
    (left / "stack-0").write_text("a stack file")
    live = Path(tempfile.mkdtemp(prefix=f"stoker-stacks-{os.getpid()}-"))
    try:
        with stoker.Loader.from_dataset(Squares(8), batch_size=4, output="numpy",
                                        num_workers=1) as loader:
            assert len(list(loader)) == 2
        assert not left.exists()
        assert live.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


def test_a_worker_that_cannot_map_its_index_word_stops_and_never_answers_out_of_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Worker 1 fails to map the word it tells the sample it loads in (out of descriptors,
    say): its failure answers the batch sent next, and it stops. Before, it went on: the
    reply came on top of the one its first batch gave, and every later batch of it took the
    batch before's reply as its own, its slot handed on unwritten (rows of zeros)."""
    # Its replacements too fail each time.
    _index_word_failing_in_worker_1(monkeypatch, lambda: True)
    with _slow_counts_loader() as loader:
        for _ in range(4):
            rows: list[int] = []
            with contextlib.suppress(stoker.StokerError):
                for batch in loader:
                    rows.extend(int(v) for v in batch[:, 0])
            # Whatever came is what was asked, in order: no slot read before it was written
            # (zeros, or the batch it held before).
            assert rows == list(range(rows[0], rows[0] + len(rows))) if rows else True, rows


def test_a_worker_replaced_after_failing_alone_is_named_with_its_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker 1 fails once, outside the dataset's code, and exits before its first batch: its
    replacement serves, and the warning that names the replacement says what the first one
    said (it said only "exit code 0")."""
    failed_once = tmp_path / "failed-once"

    def first_time() -> bool:
        try:
            failed_once.touch(exist_ok=False)
        except FileExistsError:
            return False
        return True

    _index_word_failing_in_worker_1(monkeypatch, first_time)
    with _slow_counts_loader() as loader:
        deadline = time.monotonic() + 10
        while not failed_once.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # worker 1 has exited
        with caplog.at_level(logging.WARNING, logger="stoker"):
            rows = [int(v) for batch in loader for v in batch[:, 0]]
    assert rows == list(range(1, 41))
    replaced = [r.getMessage() for r in caplog.records if "replaced by pid" in r.getMessage()]
    assert replaced and "Too many open files" in replaced[0], replaced


def _index_word_failing_in_worker_1(monkeypatch: pytest.MonkeyPatch, fails: Any) -> None:
    """Worker 1's mapping of its sample-index word fails (out of descriptors) whenever
    ``fails()`` says so; forked workers, and their replacements, inherit the patch."""
    import multiprocessing

    import stoker._busy

    mapped = stoker._busy.IndexWord.mapped

    def mapping(fd: int) -> Any:
        if multiprocessing.current_process().name == "stoker-dataset-worker-1" and fails():
            os.close(fd)
            raise OSError(errno.EMFILE, "Too many open files")
        return mapped(fd)

    monkeypatch.setattr(stoker._busy.IndexWord, "mapped", staticmethod(mapping))


def _slow_counts_loader() -> stoker.Loader:
    """Two forked workers over :class:`_SlowCounts`, in order."""
    return stoker.Loader.from_dataset(
        _SlowCounts(), batch_size=4, num_workers=2, multiprocessing_context="fork",
        shuffle=False, output="numpy",
    )


class _SlowCounts:
    """Sample i is [i + 1, i + 1], 5 ms in the making."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> Any:
        time.sleep(0.005)
        return np.full(2, index + 1, dtype=np.int64)
