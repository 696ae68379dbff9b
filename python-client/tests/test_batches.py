"""What the loader yields: shapes, dtypes, labels, epochs, determinism, resume and sharding."""

from __future__ import annotations

import itertools
import logging
import math
import threading
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import stoker
from conftest import (
    SAMPLE_COUNT,
    SMALL_CROP,
    assert_same_batches,
    class_index_of,
    epoch_batches,
    read_indices,
)
from stoker import ops, vision


def test_default_batch_is_uint8_nhwc_images_and_int64_labels(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader(batch_size=16)
    batches = list(loader)
    assert len(batches) == len(loader) == math.ceil(SAMPLE_COUNT / 16)
    for batch in batches:
        assert list(batch) == ["image", "label"]
    for batch in batches[:-1]:
        assert batch["image"].shape == (16, SMALL_CROP, SMALL_CROP, 3)
        assert batch["image"].dtype == np.uint8
        assert batch["label"].shape == (16,)
        assert batch["label"].dtype == np.int64
    assert batches[-1]["image"].shape == (SAMPLE_COUNT % 16, SMALL_CROP, SMALL_CROP, 3)
    # Real pictures, not a zeroed buffer.
    assert batches[0]["image"].std() > 10


@pytest.mark.parametrize(
    ("pipeline", "shape", "dtype"),
    [
        (vision.imagenet_eval(24), (8, 24, 24, 3), np.uint8),
        ([ops.RandomResizedCrop((20, 30)), ops.ToTensor("NCHW")], (8, 3, 20, 30), np.uint8),
        ([ops.CenterCrop(16), ops.ToTensor("NHWC", "float32")], (8, 16, 16, 3), np.float32),
        (
            [ops.RandomResizedCrop(16), ops.Normalize(vision.IMAGENET_MEAN, vision.IMAGENET_STD)],
            (8, 3, 16, 16),
            np.float32,
        ),
        (
            [
                ops.Resize(20),
                ops.CenterCrop(16),
                ops.Normalize((0.5,) * 3, (0.5,) * 3),
                ops.ToTensor("NHWC", "float32"),
            ],
            (8, 16, 16, 3),
            np.float32,
        ),
    ],
)
def test_pipelines_give_their_layout_and_dtype(
    make_loader: Callable[..., stoker.Loader],
    pipeline: list[ops.Op],
    shape: tuple[int, ...],
    dtype: type,
) -> None:
    image = next(iter(make_loader(pipeline=pipeline, batch_size=8)))["image"]
    assert image.shape == shape
    assert image.dtype == dtype


def test_normalize_gives_standardised_values(make_loader: Callable[..., stoker.Loader]) -> None:
    unit_scaled = make_loader(
        pipeline=[ops.CenterCrop(16), ops.ToTensor("NCHW", "float32")], shuffle=False, batch_size=8
    )
    normalized = make_loader(
        pipeline=[ops.CenterCrop(16), ops.Normalize((0.5, 0.25, 0.0), (0.5, 0.25, 0.75))],
        shuffle=False,
        batch_size=8,
    )
    unit = next(iter(unit_scaled))["image"]
    assert unit.min() >= 0.0 and unit.max() <= 1.0  # float32 is unit-scaled, like torchvision
    expected = (unit - np.array([0.5, 0.25, 0.0]).reshape(1, 3, 1, 1)) / np.array(
        [0.5, 0.25, 0.75]
    ).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(next(iter(normalized))["image"], expected, atol=1e-5)


def test_labels_are_the_sorted_class_folder_index(
    make_loader: Callable[..., stoker.Loader], dataset: Path
) -> None:
    expected = class_index_of(dataset)
    loader = make_loader(batch_size=16)
    assert loader.num_samples == len(expected) == SAMPLE_COUNT
    assert loader.classes == sorted(p.name for p in dataset.iterdir() if p.is_dir())
    iterator = iter(loader)
    seen = []
    for batch in iterator:
        assert batch["label"].tolist() == [expected[i] for i in iterator.sample_indices]
        seen.extend(iterator.sample_indices)
    assert sorted(seen) == list(range(SAMPLE_COUNT))


def test_no_shuffle_is_dataset_order(make_loader: Callable[..., stoker.Loader]) -> None:
    iterator = iter(make_loader(shuffle=False, batch_size=50))
    order = [index for _ in iterator for index in iterator.sample_indices]
    assert order == list(range(SAMPLE_COUNT))


def test_drop_last(make_loader: Callable[..., stoker.Loader]) -> None:
    loader = make_loader(batch_size=50, drop_last=True)
    assert len(loader) == SAMPLE_COUNT // 50
    assert [len(batch["label"]) for batch in loader] == [50] * (SAMPLE_COUNT // 50)
    assert [len(batch["label"]) for batch in make_loader(batch_size=50)] == [50, 50, 20]


def _order(loader: stoker.Loader) -> list[int]:
    iterator = iter(loader)
    return [index for _ in iterator for index in iterator.sample_indices]


def test_each_epoch_reshuffles_and_set_epoch_replays_one(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader(batch_size=40)
    assert loader.epoch == 0
    first = _order(loader)
    assert loader.epoch == 1
    second = _order(loader)
    assert sorted(first) == sorted(second) == list(range(SAMPLE_COUNT))
    assert first != second
    loader.set_epoch(0)
    assert _order(loader) == first
    loader.set_epoch(1)
    assert _order(loader) == second
    # The epoch, not the number of iterations, decides: a fresh loader at epoch 1 agrees.
    fresh = make_loader(batch_size=40)
    fresh.set_epoch(1)
    assert _order(fresh) == second


def test_seed_changes_the_order(make_loader: Callable[..., stoker.Loader]) -> None:
    assert _order(make_loader(seed=1)) != _order(make_loader(seed=2))


def test_batches_are_identical_whatever_the_thread_count(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    runs = [
        epoch_batches(make_loader(num_threads=threads, prefetch=prefetch, seed=7))
        for threads, prefetch in ((1, 1), (2, "auto"), (3, 5))
    ]
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])


@pytest.mark.parametrize("stop_after", [1, 4])
def test_resume_mid_epoch_is_exact(
    make_loader: Callable[..., stoker.Loader], stop_after: int
) -> None:
    reference = make_loader(batch_size=16, seed=3)
    reference.set_epoch(1)
    expected = epoch_batches(reference)

    interrupted = make_loader(batch_size=16, seed=3)
    interrupted.set_epoch(1)
    iterator = iter(interrupted)
    for _ in range(stop_after):
        next(iterator)
    state = interrupted.state_dict()
    assert state["epoch"] == 1 and state["step"] == stop_after
    interrupted.close()

    resumed = make_loader(batch_size=16, seed=3, num_threads=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the usual `for epoch in ...: set_epoch(epoch)` keeps the position
    assert_same_batches(epoch_batches(resumed), expected[stop_after:])
    # The resumed epoch completed, so the next one starts at its beginning.
    assert resumed.state_dict()["epoch"] == 2 and resumed.state_dict()["step"] == 0


def test_state_after_an_epoch_points_at_the_next(make_loader: Callable[..., stoker.Loader]) -> None:
    loader = make_loader(batch_size=40)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["step"] == 0
    for _ in loader:
        pass
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (1, 0)
    saved_at_end = dict(state, epoch=0, step=len(loader))
    other = make_loader(batch_size=40)
    other.load_state_dict(saved_at_end)
    assert other.epoch == 1


def test_set_epoch_of_a_state_saved_at_an_epochs_end_runs_it_empty(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    # The README's `load_state_dict(s)` then `set_epoch(s["epoch"])`, with `s` saved after the
    # last batch of epoch 0: epoch 0 yields nothing (it was read), then epoch 1 is the plain one.
    loader = make_loader(batch_size=40)
    read_indices(loader)
    saved = dict(loader.state_dict(), epoch=0, step=len(loader))
    resumed = make_loader(batch_size=40)
    resumed.load_state_dict(saved)
    resumed.set_epoch(saved["epoch"])
    assert resumed.state_dict()["step"] == len(resumed)
    assert read_indices(resumed) == []
    assert resumed.epoch == 1
    resumed.set_epoch(1)
    plain = make_loader(batch_size=40)
    plain.set_epoch(1)
    assert read_indices(resumed) == read_indices(plain)


def test_a_state_loaded_and_saved_again_before_a_batch_is_the_same_state(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    """A checkpoint taken right after a resume (before any batch) resumes like the state it
    loaded: saved after epoch 0's last batch, set_epoch(0) then runs epoch 0 empty, not
    again."""
    loader = make_loader(batch_size=40)
    read_indices(loader)
    saved = dict(loader.state_dict(), epoch=0, step=len(loader))
    resumed = make_loader(batch_size=40)
    resumed.load_state_dict(saved)
    again = resumed.state_dict()
    assert (again["epoch"], again["step"]) == (0, len(loader))
    twice = make_loader(batch_size=40)
    twice.load_state_dict(again)
    twice.set_epoch(0)
    assert read_indices(twice) == []
    # Unset by the first batch: then the position is the batch's.
    next(iter(resumed))
    assert (resumed.state_dict()["epoch"], resumed.state_dict()["step"]) == (1, 1)


def test_an_iter_that_goes_on_with_a_pass_left_early_says_so_once(
    make_loader: Callable[..., stoker.Loader], caplog: pytest.LogCaptureFixture
) -> None:
    """Unlike DataLoader's, a new ``iter()`` goes on where the last pass over the epoch stopped
    (a peek, a sanity check, a loop left early): said once per loader on logger ``stoker``, not
    for a resume from a state or a new epoch."""
    caplog.set_level(logging.WARNING, logger="stoker")
    loader = make_loader(batch_size=16)
    next(iter(loader))
    rest = read_indices(loader)
    said = [r.getMessage() for r in caplog.records if "goes on with epoch" in r.getMessage()]
    assert len(said) == 1 and "at step 1" in said[0] and "set_epoch(0)" in said[0], said
    assert len(rest) == loader.num_samples - 16
    next(iter(loader))  # epoch 1, left after a batch
    read_indices(loader)
    assert len([r for r in caplog.records if "goes on with epoch" in r.getMessage()]) == 1
    caplog.clear()
    resumed = make_loader(batch_size=16)
    resumed.load_state_dict(loader.state_dict())
    read_indices(resumed)
    assert "goes on with epoch" not in caplog.text


def test_iter_after_every_batch_without_stop_iteration_starts_the_next_epoch(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    # A loop that stops at the last batch (zip with a range, islice, a break at the last step)
    # never sees StopIteration; the next iter() runs the next epoch, as the state says.
    loader = make_loader(batch_size=40)
    first = read_indices(loader, len(loader))
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (0, len(loader))
    resumed = make_loader(batch_size=40)
    resumed.load_state_dict(state)
    plain = make_loader(batch_size=40)
    plain.set_epoch(1)
    second = read_indices(plain)
    assert second != first
    assert loader.epoch == 0, "the epoch read, until an iter() moves on"
    assert iter(loader).epoch == 1
    assert loader.epoch == 1
    assert read_indices(loader) == second
    assert read_indices(resumed) == second


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 99}, "seed"),
        ({"batch_size": 8}, "batch_size"),
        ({"num_samples": 7}, "num_samples"),
        ({"version": 2}, "version"),
        ({"version": True}, "version"),
        ({"step": 1000}, "past the end"),
        ({"shuffle_window": 3}, "shuffle_window"),
        # An epoch with none after it (at its end it resumed at 2**64 and failed with an
        # OverflowError at iter()), a rank its world does not hold (both taken before).
        ({"epoch": 2**64 - 1}, "epoch"),
        ({"rank": 7}, "rank"),
        ({"rank": "x"}, "rank"),
    ],
)
def test_load_state_dict_names_the_mismatch(
    make_loader: Callable[..., stoker.Loader], change: dict[str, int], message: str
) -> None:
    loader = make_loader()
    with pytest.raises(ValueError, match=message):
        loader.load_state_dict(dict(loader.state_dict(), **change))


def test_a_state_saved_when_to_tensor_spelled_out_uint8_resumes(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    """``ToTensor()`` sent uint8 as its dtype before it defaulted to unset (float32 after a
    Normalize): a state saved then, over ``vision.imagenet_eval``'s pipeline say, resumes; and
    one whose numbers are numpy's (read back from an array) too."""
    eval_ops = stoker.vision.imagenet_eval(32)
    spelled = [*eval_ops[:-1], ops.ToTensor("NHWC", "uint8")]
    saved = make_loader(pipeline=spelled).state_dict()
    make_loader(pipeline=eval_ops).load_state_dict(saved)
    np = pytest.importorskip("numpy")
    as_numpy = {k: np.int64(v) if type(v) is int else v for k, v in saved.items()}
    make_loader(pipeline=eval_ops).load_state_dict(as_numpy)


def test_a_state_of_another_pipeline_or_kind_of_loader_is_refused(
    make_loader: Callable[..., stoker.Loader], dataset: Path
) -> None:
    """The pipeline (and the columns, format, split) decide a batch's bytes as much as the
    plan: a state saved with another one is refused, as is one a Python dataset's loader
    saved (its positions are another kind's), and the reverse."""
    state = dict(make_loader(batch_size=8).state_dict(), step=2)
    other = stoker.Loader(dataset, pipeline=stoker.vision.imagenet_train(48), batch_size=8,
                          output="numpy", seed=state["seed"])
    with other, pytest.raises(ValueError, match="reading: saved 'sha256:"):
        other.load_state_dict(state)
    count = state["num_samples"]
    with stoker.Loader.from_dataset(list(range(count)), batch_size=8, seed=state["seed"],
                                    shuffle=state["shuffle"], output="numpy") as python:
        with pytest.raises(ValueError, match="source: saved 'stoker source'"):
            python.load_state_dict(state)
        python_state = dict(python.state_dict(), step=2)
    with pytest.raises(ValueError, match="source: saved 'python dataset'"):
        make_loader(batch_size=8).load_state_dict(python_state)
    # A state from before these keys resumes as it did.
    older = {k: v for k, v in state.items() if k not in ("source", "reading")}
    make_loader(batch_size=8).load_state_dict(older)


def test_an_iterator_started_again_before_its_first_batch_keeps_the_resume_step(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    plain = epoch_batches(make_loader(batch_size=8))
    loader = make_loader(batch_size=8)
    loader.load_state_dict(dict(loader.state_dict(), step=2))
    iter(loader)  # a first next() that never came back (interrupted, timed out)
    assert loader.state_dict()["step"] == 2

    def first(loader: stoker.Loader) -> dict[str, np.ndarray]:
        return {name: np.array(value, copy=True) for name, value in next(iter(loader)).items()}

    assert_same_batches([first(loader)], plain[2:3])
    # Once a batch was handed out the resume is used: a new iteration goes on at the next.
    assert_same_batches([first(loader)], plain[3:4])


def test_passes_left_early_go_on_through_the_epoch_where_a_state_would_resume(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    """Loops left after a few batches (islice, a break, a fixed number of batches a pass) each
    take up the epoch at the next batch, as a loader loaded with the state saved between them
    does; the epoch then ends and the next starts. Before, each pass started the epoch over:
    the same first batches every pass, and a checkpoint resumed elsewhere than the run went."""
    plain = make_loader(batch_size=8)
    epochs = [epoch_batches(plain), epoch_batches(plain)]
    steps = len(epochs[0])
    assert steps >= 6
    loader = make_loader(batch_size=8)

    def take(loader: stoker.Loader, count: int) -> list[dict[str, np.ndarray]]:
        return [
            {name: np.array(value, copy=True) for name, value in batch.items()}
            for batch in itertools.islice(loader, count)
        ]

    assert_same_batches(take(loader, 2), epochs[0][:2])
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (0, 2)
    assert_same_batches(take(loader, 3), epochs[0][2:5])
    resumed = make_loader(batch_size=8)
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, 3), epochs[0][2:5])
    # The rest of the epoch, then the next one from its first batch.
    assert_same_batches(epoch_batches(loader), epochs[0][5:])
    assert loader.state_dict()["epoch"] == 1
    assert_same_batches(take(loader, 1), epochs[1][:1])
    # set_epoch starts an epoch from its first batch.
    loader.set_epoch(1)
    assert_same_batches(take(loader, 2), epochs[1][:2])


class _Counting:
    """A map-style dataset counting its reads (threads only: one process)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.reads = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        with self.lock:
            self.reads += 1
        return np.full(4, index, dtype=np.int64)


def test_passes_left_early_keep_the_batches_built_ahead() -> None:
    """A loop taken up again in a new iterator goes on with the batches already built ahead
    of it: each iter() cancelled them and built them again (1,040 reads of a 400-sample epoch
    read in passes of 5 batches, 432 in one pass)."""
    dataset = _Counting(400)
    with stoker.Loader.from_dataset(dataset, batch_size=4, prefetch=8, num_threads=2,
                                    shuffle=False, output="numpy") as loader:
        read = []
        for _ in range(20):
            read.extend(int(b[0]) for batch in itertools.islice(loader, 5) for b in batch)
        assert read == list(range(400))
        # The epoch, and what the next one's start and the loader's look-ahead read besides.
        assert dataset.reads <= 400 + 2 * 8 * 4 + 8, dataset.reads


def test_a_state_without_a_shuffle_window_still_loads(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    # States saved before the shuffle window was part of them lack the key.
    loader = make_loader()
    state = dict(loader.state_dict(), step=2)
    del state["shuffle_window"]
    loader.load_state_dict(state)
    assert loader.state_dict()["step"] == 2
    with pytest.raises(ValueError, match="missing"):
        loader.load_state_dict({"epoch": 0})


def test_a_partition_replaced_by_another_of_the_same_size_is_another_dataset(
    tmp_path: Path,
) -> None:
    """Files of the same names in folders below the dataset's own (hive partitions): a
    partition replaced by another of the same size is refused, not resumed over other rows."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    import shutil

    root = tmp_path / "sales"

    def partition(name: str, start: int) -> None:
        (root / name).mkdir(parents=True)
        pq.write_table(pa.table({"x": list(range(start, start + 100))}),
                       root / name / "part-0.parquet")

    partition("year=2022", 0)
    partition("year=2023", 1000)

    def loader() -> stoker.Loader:
        return stoker.Loader(f"{root}/**/*.parquet", pipeline=[stoker.ops.SelectColumns(["x"])],
                             batch_size=10, output="numpy")

    with loader() as first:
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
    shutil.rmtree(root / "year=2022")
    partition("year=2024", 2000)
    with loader() as second, pytest.raises(ValueError, match="saved over another dataset"):
        second.load_state_dict(state)


def test_a_state_saved_over_another_dataset_of_the_same_size_is_refused(
    make_loader: Callable[..., stoker.Loader], dataset: Path, tmp_path: Path
) -> None:
    """The datasets' fingerprint: the dataset moved elsewhere resumes; one file renamed (the
    same sample count) is refused, naming why and how to resume anyway."""
    import shutil

    state = dict(make_loader(batch_size=8).state_dict(), step=2)
    assert str(state["dataset"]).startswith("v3:")
    moved = tmp_path / "moved"
    shutil.copytree(dataset, moved)
    assert make_loader(moved, batch_size=8).state_dict()["dataset"] == state["dataset"]
    make_loader(moved, batch_size=8).load_state_dict(state)

    first = sorted(p for p in moved.rglob("*") if p.is_file() and p.parent != moved)[0]
    first.rename(first.with_name("renamed-" + first.name))
    renamed = make_loader(moved, batch_size=8)
    assert renamed.state_dict()["num_samples"] == state["num_samples"]
    with pytest.raises(ValueError, match=r"saved over another dataset.*delete state\['dataset'\]"):
        renamed.load_state_dict(state)
    assert renamed.state_dict()["step"] == 0
    del state["dataset"]  # changed on purpose: resumed without the check
    renamed.load_state_dict(state)
    assert renamed.state_dict()["step"] == 2


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_cover_the_epoch_disjointly_and_completely(
    make_loader: Callable[..., stoker.Loader], world_size: int
) -> None:
    parts = []
    for rank in range(world_size):
        loader = make_loader(batch_size=8, rank=rank, world_size=world_size, seed=5)
        parts.append(_order(loader))
        assert len(loader) == math.ceil(SAMPLE_COUNT / world_size / 8)
    for a in range(world_size):
        for b in range(a + 1, world_size):
            assert not set(parts[a]) & set(parts[b]), f"ranks {a} and {b} overlap"
    assert sorted(index for part in parts for index in part) == list(range(SAMPLE_COUNT))


def test_uneven_ranks_get_the_same_number_of_batches(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    world_size = 7  # 120 samples do not divide by 7
    parts = [
        _order(make_loader(batch_size=8, rank=rank, world_size=world_size))
        for rank in range(world_size)
    ]
    assert len({len(part) for part in parts}) == 1
    assert set(index for part in parts for index in part) == set(range(SAMPLE_COUNT))


def test_rank_and_world_size_come_from_the_environment(
    make_loader: Callable[..., stoker.Loader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = make_loader()
    assert (loader.rank, loader.world_size) == (2, 4)
    assert (make_loader(rank=1, world_size=8).rank, make_loader(rank=2).world_size) == (1, 4)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="environment"):
        make_loader()
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(ValueError, match="RANK"):
        make_loader()


def test_defaults_are_rank_0_of_1(make_loader: Callable[..., stoker.Loader]) -> None:
    loader = make_loader()
    assert (loader.rank, loader.world_size) == (0, 1)


def test_rank_and_world_size_come_from_torch_distributed_first(
    make_loader: Callable[..., stoker.Loader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for an initialised process group: the loader only reads these four functions.
    fake = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        get_rank=lambda: 3,
        get_world_size=lambda: 5,
    )
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed", fake)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = make_loader()
    assert (loader.rank, loader.world_size) == (3, 5)
    fake.is_initialized = lambda: False
    assert (make_loader().rank, make_loader().world_size) == (0, 2)
