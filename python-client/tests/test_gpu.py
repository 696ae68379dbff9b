"""The GPU stage: page-locked slots, batches delivered on the device, the fences that keep a
slot out of the pool until the copies reading it are done, and GPU idle seen from the GPU.

Every test here needs a CUDA GPU and torch built with CUDA (``pytest -m gpu``); where there is
none they are skipped with a message. What runs without a GPU (the errors and the warning
that name what is missing, the split of the pipeline's tail) is in ``test_gpu_absent.py``.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from conftest import RecordingNative, require_cuda_torch, running_cluster
from stoker import ops, vision

pytestmark = pytest.mark.gpu

MEAN = vision.IMAGENET_MEAN
STD = vision.IMAGENET_STD
CROP = 32


@pytest.fixture(scope="module")
def torch() -> Any:
    """torch with a usable CUDA device, or a skip naming what is missing."""
    return require_cuda_torch("the GPU tests")


def train_pipeline(normalize: bool) -> list[ops.Op]:
    crop = [
        ops.DecodeImage(dct_scaling=True),
        ops.RandomResizedCrop(CROP),
        ops.RandomHorizontalFlip(),
    ]
    return [*crop, ops.Normalize(MEAN, STD)] if normalize else [*crop, ops.ToTensor()]


def loader(dataset: Path, **overrides: Any) -> stoker.Loader:
    options: dict[str, Any] = {
        "pipeline": train_pipeline(False),
        "batch_size": 8,
        "num_threads": 2,
        "timeout": 60,
        "output": "torch",
    }
    options.update(overrides)
    return stoker.Loader(dataset, **options)


def reference_epoch(dataset: Path, normalize: bool, **overrides: Any) -> list[np.ndarray]:
    """The CPU pipeline's images of one epoch, copied out."""
    with loader(dataset, pipeline=train_pipeline(normalize), output="numpy", **overrides) as cpu:
        return [np.array(batch["image"], copy=True) for batch in cpu]


def test_pin_memory_gives_pinned_tensors(torch: Any, dataset: Path) -> None:
    with loader(dataset, pin_memory=True) as pinned:
        batches = list(iter(pinned))
        assert all(b["image"].is_pinned() and b["label"].is_pinned() for b in batches)
        stats = pinned.stats()
        assert stats["pinned"] is True and stats["pinned_bytes"] > 0
    with loader(dataset) as plain:
        assert not next(iter(plain))["image"].is_pinned()
        assert plain.stats()["pinned"] is False


def test_labels_are_page_locked_beside_the_slots_not_by_torch(torch: Any, dataset: Path) -> None:
    """A batch's labels come in the pool's page-locked room beside its slots, within the pinned
    budget: the label tensor handed out is that memory, not a copy into torch's pinned pool."""

    def label(item: Any) -> tuple[bool, int]:
        data = {name: data for name, _, _, data in item.tensors}["label"]
        return data.pinned, data.address

    with loader(dataset, pin_memory=True) as pinned:
        recorder = RecordingNative(pinned._native, label)
        pinned._native = recorder  # type: ignore[assignment]
        batches = list(iter(pinned))
        assert len(recorder.notes) == len(batches) > 0
        for batch, (in_stokers_memory, address) in zip(batches, recorder.notes, strict=True):
            assert in_stokers_memory, "in Stoker's page-locked memory"
            assert batch["label"].data_ptr() == address, "not a copy made by torch"
            assert batch["label"].is_pinned()
        assert pinned.stats()["pinned_bytes"] > 0


def test_pinned_slots_of_a_wrapped_dataset_and_of_worker_processes(torch: Any) -> None:
    data = [np.full((4, 4), i, dtype=np.float32) for i in range(32)]
    for workers in (0, 2):
        with stoker.Loader.from_dataset(
            data,
            batch_size=4,
            num_workers=workers,
            pin_memory=True,
            multiprocessing_context="fork" if workers else None,
            output="torch",
        ) as wrapped:
            batch = next(iter(wrapped))
            assert batch.is_pinned(), f"num_workers={workers}"
            assert batch[:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
            assert wrapped.stats()["pinned"] is True
    # What a collate_fn returns is its own memory: pinned as DataLoader pins it (it was not).
    with stoker.Loader.from_dataset(
        data, batch_size=4, pin_memory=True, output="torch",
        collate_fn=torch.utils.data.default_collate,
    ) as collated:
        batch = next(iter(collated))
        assert batch.is_pinned()
        assert batch[:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_remote_batches_land_in_pinned_slots(torch: Any, dataset: Path, tmp_path: Path) -> None:
    with (
        running_cluster(dataset, tmp_path / "state") as address,
        loader(dataset, address=address, pin_memory=True) as remote,
    ):
        batch = next(iter(remote))
        assert batch["image"].is_pinned()
        assert remote.stats()["pinned"] is True


@pytest.mark.parametrize(
    ("normalize", "dtype", "memory_format"),
    [
        (True, None, None),
        (True, "bfloat16", "channels_last"),
        (True, "float16", None),
        (False, None, None),
        (False, "float32", "channels_last"),
    ],
)
def test_device_batches_equal_the_cpu_pipeline(
    torch: Any, dataset: Path, normalize: bool, dtype: str | None, memory_format: str | None
) -> None:
    reference = reference_epoch(dataset, normalize)
    if not normalize and dtype is not None:
        # ToTensor's float32 on the CPU is v / 255, NHWC; as the device's NCHW.
        reference = [r.astype(np.float32) / np.float32(255) for r in reference]
        reference = [r.transpose(0, 3, 1, 2) for r in reference]
    with loader(
        dataset,
        pipeline=train_pipeline(normalize),
        device="cuda",
        dtype=dtype,
        memory_format=memory_format,
    ) as gpu_loader:
        got = list(iter(gpu_loader))
        assert gpu_loader.stats()["device"] == f"cuda:{torch.cuda.current_device()}"
        assert gpu_loader.stats()["pinned"] is True
    assert len(got) == len(reference)
    for step, (batch, expected) in enumerate(zip(got, reference, strict=True)):
        image = batch["image"]
        assert image.is_cuda and batch["label"].is_cuda
        assert tuple(image.shape) == expected.shape, step
        if memory_format == "channels_last":
            assert image.is_contiguous(memory_format=torch.channels_last)
        values = image.float().cpu().numpy()
        if dtype in ("bfloat16", "float16"):
            # One rounding to the narrow type: within half its unit in the last place.
            eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
            np.testing.assert_allclose(values, expected, rtol=eps, atol=1e-6, err_msg=str(step))
        elif expected.dtype == np.uint8:
            assert np.array_equal(values.astype(np.uint8), expected), step
        else:
            np.testing.assert_allclose(values, expected, rtol=0, atol=2e-6, err_msg=str(step))


def test_a_consumer_on_another_stream_gets_correct_batches(torch: Any, dataset: Path) -> None:
    reference = reference_epoch(dataset, True)
    side = torch.cuda.Stream()
    got = []
    with (
        loader(dataset, pipeline=train_pipeline(True), device="cuda", prefetch=2) as gpu_loader,
        torch.cuda.stream(side),
    ):
        for batch in gpu_loader:
            # A slow consumer: the stream is busy for a while before it reads the batch.
            torch.cuda._sleep(2_000_000)
            got.append((batch["image"] * 1).cpu())  # .cpu() syncs the side stream
    for expected, image in zip(reference, got, strict=True):
        np.testing.assert_allclose(image.numpy(), expected, atol=2e-6)


def digest(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("where", ["current stream", "side stream", "default stream"])
def test_no_slot_is_reused_under_a_users_running_copy(
    torch: Any, dataset: Path, where: str
) -> None:
    """Pinned CPU batches copied with non_blocking=True behind a long kernel and dropped at
    once: a slot reused before its copy ran would show the next batch's pixels."""
    expected = reference_epoch(dataset, False)
    side = torch.cuda.Stream()
    copies = []
    with loader(dataset, pin_memory=True, prefetch=2, max_held_batches=1) as pinned:
        for epoch in range(2):
            pinned.set_epoch(0)
            for batch in pinned:
                if where == "side stream":
                    with torch.cuda.stream(side):
                        torch.cuda._sleep(50_000_000)
                        copies.append(batch["image"].to("cuda", non_blocking=True))
                        del batch  # released on the side stream: fenced there
                else:
                    stream = (
                        torch.cuda.current_stream()
                        if where == "current stream"
                        else torch.cuda.default_stream()
                    )
                    torch.cuda._sleep(50_000_000)
                    with torch.cuda.stream(stream):
                        copies.append(batch["image"].to("cuda", non_blocking=True))
                    del batch
            del epoch
    torch.cuda.synchronize()
    got = [c.cpu().numpy() for c in copies]
    assert [digest(g) for g in got] == [digest(e) for e in expected * 2]


def test_device_batches_dropped_at_once_with_a_slow_consumer(torch: Any, dataset: Path) -> None:
    """The loader's own copies: slots fenced on its stream, batches dropped at once, consumer
    stream slow; every batch still carries its own pixels."""
    expected = reference_epoch(dataset, False)
    sums = []
    with loader(dataset, device="cuda", prefetch=2, max_held_batches=1) as gpu_loader:
        for batch in gpu_loader:
            torch.cuda._sleep(20_000_000)
            sums.append(batch["image"].sum(dtype=torch.int64))
            del batch
    assert [int(s) for s in sums] == [int(e.sum(dtype=np.int64)) for e in expected]


def test_device_memory_is_flat_over_2000_batches(torch: Any, dataset: Path) -> None:
    torch.cuda.synchronize()
    with loader(
        dataset,
        pipeline=train_pipeline(True),
        device="cuda",
        dtype="bfloat16",
        memory_format="channels_last",
        num_threads=4,
    ) as gpu_loader:
        seen = 0
        after_warmup = None
        while seen < 2000:
            for batch in gpu_loader:
                batch["image"].float().mean()  # use it on the consumer's stream
                seen += 1
                if seen == 100:
                    torch.cuda.synchronize()
                    after_warmup = torch.cuda.memory_allocated()
                if seen >= 2000:
                    break
        torch.cuda.synchronize()
        at_end = torch.cuda.memory_allocated()
        assert after_warmup is not None
        batch_bytes = 8 * 3 * CROP * CROP * 2
        # The same few batches' worth of device memory at the end as after the warm-up.
        assert abs(at_end - after_warmup) <= 4 * batch_bytes, (after_warmup, at_end)
        assert gpu_loader.stats()["slots_in_use"] <= gpu_loader.stats()["slot_capacity"]


def test_gpu_idle_is_measured_on_the_gpu(torch: Any, dataset: Path) -> None:
    """A loop that runs ahead of the GPU: the host never waits for the slow loader long, but
    the GPU, fed one slow batch after another, sits idle; the figure says so. With a fast
    loader and a slow GPU step the GPU is hardly idle."""
    with loader(dataset, device="cuda", num_threads=1, prefetch=1) as slow:
        for batch in slow:
            batch["image"].float().mean()
        stats = slow.stats()
        assert stats["gpu_span_s"] > 0
        assert 0.3 < stats["gpu_idle_fraction"] <= 1.0, stats
    with loader(dataset, device="cuda", num_threads=4) as fast:
        for batch in fast:
            torch.cuda._sleep(20_000_000)  # a long step on the GPU
            batch["image"].float().mean()
        torch.cuda.synchronize()
        for _ in fast:  # a second epoch reads the events of the first
            torch.cuda._sleep(20_000_000)
        stats = fast.stats()
        assert stats["gpu_span_s"] > 0
        assert stats["gpu_idle_fraction"] < 0.2, stats


def test_gpu_idle_shows_on_the_dashboard(torch: Any, dataset: Path) -> None:
    import json
    import urllib.request

    with loader(dataset, device="cuda", num_threads=1, dashboard=0) as watched:
        url = watched.dashboard_url
        assert url is not None
        deadline = time.monotonic() + 20
        idle_pct = None
        while idle_pct is None and time.monotonic() < deadline:
            for batch in watched:
                batch["image"].float().mean()
            jobs = json.loads(urllib.request.urlopen(f"{url}api/jobs", timeout=10).read())
            window = jobs["jobs"][0]["window"]
            idle_pct = window and window.get("gpu_idle_pct")
        text = urllib.request.urlopen(f"{url}metrics", timeout=10).read().decode()
    assert idle_pct is not None and idle_pct > 0, jobs
    totals = [
        line for line in text.splitlines() if line.startswith("stoker_gpu_idle_seconds_total")
    ]
    assert totals and float(totals[0].split()[-1]) > 0, text


def test_closing_with_batches_on_the_device_keeps_them_valid(torch: Any, dataset: Path) -> None:
    gpu_loader = loader(dataset, device="cuda")
    batch = next(iter(gpu_loader))
    gpu_loader.close()
    assert batch["image"].is_cuda and int(batch["image"].sum()) > 0


def test_no_slot_is_reused_under_a_copy_to_another_device(torch: Any, dataset: Path) -> None:
    """Slots page-locked through device 0 (current when the first batch went out) and copied
    to device 1 behind a long kernel there: the release fences device 1's streams too, else
    the next batch's pixels would show in the copy."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices, torch sees {torch.cuda.device_count()}")
    expected = reference_epoch(dataset, False)
    copies = []

    def copy_to_device_1(batch: dict[str, Any]) -> None:
        with torch.cuda.device(1):
            torch.cuda._sleep(50_000_000)
            copies.append(batch["image"].to("cuda:1", non_blocking=True))

    with loader(dataset, pin_memory=True, prefetch=2, max_held_batches=1) as pinned:
        batches = iter(pinned)
        with torch.cuda.device(0):
            torch.cuda.synchronize()  # device 0 started and current: the slots lock through it
            copy_to_device_1(next(batches))
        assert pinned.stats()["pinned"] and pinned.stats()["pinned_device"] == 0
        for batch in batches:
            copy_to_device_1(batch)
            del batch
    torch.cuda.synchronize(1)
    got = [c.cpu().numpy() for c in copies]
    assert [digest(g) for g in got] == [digest(e) for e in expected]


PIN_BEFORE_SET_DEVICE = """
import sys
import stoker, torch
from stoker import _native, ops

torch.cuda.current_device()  # what pin_memory's check asks of torch
before = _native.cuda_active_devices()
pipeline = [ops.DecodeImage(), ops.CenterCrop(32), ops.ToTensor()]
loader = stoker.Loader(sys.argv[1], pipeline=pipeline, batch_size=8, num_threads=2,
                       pin_memory=True, output="torch", timeout=60)
assert _native.cuda_active_devices() == before, (before, _native.cuda_active_devices())
assert loader.stats()["pinned_device"] is None
last = torch.cuda.device_count() - 1
torch.cuda.set_device(last)
torch.zeros(1, device="cuda")  # the model moved to its GPU
batch = next(iter(loader))
assert batch["image"].is_pinned() and loader.stats()["pinned_device"] == last
assert _native.cuda_active_devices() == sorted({*before, last}), _native.cuda_active_devices()
del batch
loader.close()
print("followed", last)
"""


def test_pin_memory_locks_through_the_device_in_use_at_the_first_batch(
    torch: Any, dataset: Path
) -> None:
    """A loader made before ``set_device`` (as a DDP rank may make it) starts no CUDA context
    when built, and its slots are locked through the device the rank then uses: with several
    GPUs, none on device 0 for a rank on another one. In a process of its own, where nothing
    started CUDA before."""
    done = subprocess.run(
        [sys.executable, "-c", PIN_BEFORE_SET_DEVICE, str(dataset)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "followed" in done.stdout


def pinned_held_and_stride(dataset: Path) -> tuple[int, int]:
    """What the pools of this process hold of the pinned budget (pools other loaders still
    hold, freed once their fences pass, count against it) and one slot's stride, read from
    the refusal of a loader of a budget of one byte."""
    gc.collect()
    with pytest.raises(stoker.GpuUnavailableError, match=r"slots of \d+ bytes") as refused:
        loader(dataset, pin_memory=True, pinned_memory_budget=1, prefetch=2, max_held_batches=1)
    found = re.search(r"(\d+) of them held by .* slots of (\d+) bytes", str(refused.value))
    assert found is not None, refused.value
    return int(found.group(1)), int(found.group(2))


def test_a_resize_resume_fits_the_pinned_budget_of_one_pool(torch: Any, dataset: Path) -> None:
    """The epoch resumed on another world size is built in the loader's own page-locked
    slots: a budget that holds one pool is enough (a second pool would be refused)."""
    held, stride = pinned_held_and_stride(dataset)
    with loader(dataset, rank=0, world_size=2, seed=9) as old:
        old.set_epoch(1)
        for _, _batch in zip(range(2), old, strict=False):
            pass
        state = old.state_dict()
    options = {"pin_memory": True, "prefetch": 2, "max_held_batches": 1, "seed": 9}
    budget = held + 3 * stride
    with loader(dataset, rank=0, world_size=3, pinned_memory_budget=budget, **options) as pinned:
        pinned.load_state_dict(state)
        assert pinned.epoch == 1 and pinned.stats()["slot_capacity"] == 3
        # Taken before the run: a finished epoch advances the loader, and len() with it.
        resized_steps = len(pinned)
        assert sum(1 for _ in pinned) == resized_steps > 0
        assert pinned.stats()["pinned"]


def test_a_closed_loader_whose_batch_is_kept_holds_one_slot_of_the_budget(
    torch: Any, dataset: Path
) -> None:
    """A view of one batch kept past ``close()`` (an image kept for logging) held the closed
    loader's whole pool: its page-locked slots and their share of the pinned budget, so a
    loader made next within the same budget was refused. Only the kept batch's slot is held
    now; dropped, that goes too."""
    held, stride = pinned_held_and_stride(dataset)
    options = {"pin_memory": True, "prefetch": 2, "max_held_batches": 1}
    # Room for one pool of three slots and one slot more.
    budget = held + 4 * stride
    with loader(dataset, pinned_memory_budget=budget, **options) as first:
        kept = next(iter(first))["image"][0]
    with loader(dataset, pinned_memory_budget=budget, **options) as second:
        assert sum(1 for _ in second) > 0
    del kept
    gc.collect()


def test_slots_come_back_from_many_threads(torch: Any, dataset: Path) -> None:
    """Batches released from other Python threads are fenced and come back too."""
    with loader(dataset, pin_memory=True, prefetch=2, max_held_batches=2) as pinned:
        held: list[Any] = []
        for batch in pinned:
            held.append(batch["image"].to("cuda", non_blocking=True))
            thread = threading.Thread(target=lambda b=batch: b.clear())
            thread.start()
            thread.join()
            del batch
        torch.cuda.synchronize()
        # Every slot comes back once its fence has passed (on the fence thread, soon after).
        deadline = time.monotonic() + 10
        while pinned.stats()["slots_in_use"] > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pinned.stats()["slots_in_use"] <= 2, pinned.stats()


RACE_BATCHES = 2000


def copies_checked(expected: list[np.ndarray], copies: list[Any], torch: Any) -> None:
    """Every device copy holds the batch it was made from (the reference epoch in turn): a
    slot refilled under a copy would show another batch's pixels."""
    torch.cuda.synchronize()
    assert len(copies) == RACE_BATCHES
    want = [digest(e) for e in expected]
    bad = [i for i, c in enumerate(copies) if digest(c.cpu().numpy()) != want[i % len(want)]]
    assert bad == [], f"{len(bad)} of {len(copies)} copies read a refilled slot, first {bad[:5]}"


def race_batches(pinned: stoker.Loader) -> Any:
    """RACE_BATCHES batches of epoch 0 over and over (the same order every pass)."""
    handed = 0
    while True:
        pinned.set_epoch(0)
        for batch in pinned:
            yield batch
            handed += 1
            if handed == RACE_BATCHES:
                return


def prefetch_thread(
    torch: Any, pinned: stoker.Loader, copies: list[Any], failures: list[BaseException]
) -> threading.Thread:
    """A prefetcher as users write one, started: a thread takes each batch, copies it on a
    stream of its own behind a slow kernel inside ``with torch.cuda.stream(s)``, and drops the
    batch after leaving the block (its current stream is the default one then). What it raises
    lands in ``failures``."""

    def prefetch() -> None:
        try:
            stream = torch.cuda.Stream()
            for batch in race_batches(pinned):
                with torch.cuda.stream(stream):
                    torch.cuda._sleep(2_000_000)
                    copies.append(batch["image"].to("cuda", non_blocking=True))
                del batch
        except BaseException as error:  # reported by the test's thread
            failures.append(error)

    thread = threading.Thread(target=prefetch)
    thread.start()
    return thread


def test_a_prefetch_thread_copying_on_its_own_stream_never_reads_a_refilled_slot(
    torch: Any, dataset: Path
) -> None:
    """The prefetcher of :func:`prefetch_thread`, its copies checked."""
    expected = reference_epoch(dataset, False)
    copies: list[Any] = []
    failures: list[BaseException] = []
    with loader(dataset, pin_memory=True, prefetch=2, max_held_batches=1) as pinned:
        thread = prefetch_thread(torch, pinned, copies, failures)
        thread.join(timeout=600)
        assert not thread.is_alive() and failures == [], failures
    copies_checked(expected, copies, torch)


def test_a_side_stream_copy_dropped_before_the_main_stream_waits_is_fenced(
    torch: Any, dataset: Path
) -> None:
    """The copy is queued on a side stream behind a slow kernel, the batch dropped outside the
    ``with`` block, and only then does the main stream wait for the side stream."""
    expected = reference_epoch(dataset, False)
    side = torch.cuda.Stream()
    copies: list[Any] = []
    with loader(dataset, pin_memory=True, prefetch=2, max_held_batches=1) as pinned:
        for batch in race_batches(pinned):
            with torch.cuda.stream(side):
                torch.cuda._sleep(2_000_000)
                copy = batch["image"].to("cuda", non_blocking=True)
            del batch
            torch.cuda.current_stream().wait_stream(side)
            copies.append(copy)
        assert pinned.stats()["pinned"]
    copies_checked(expected, copies, torch)


def test_a_graph_captured_beside_the_releases_is_not_broken(torch: Any, dataset: Path) -> None:
    """CUDA graphs captured on the main thread (on torch's capture stream, one of its pool's)
    while a prefetch thread (:func:`prefetch_thread`) copies and releases batches: the fence
    thread's sweep waits each capture out instead of recording into it or breaking it, and the
    copies stay right. The captures are thread-local (the releasing thread's own allocations would
    break a global one, with any loader); the fence thread runs in the relaxed mode either
    way."""
    expected = reference_epoch(dataset, False)
    x = torch.zeros(1 << 20, device="cuda")
    copies: list[Any] = []
    failures: list[BaseException] = []
    with loader(dataset, pin_memory=True, prefetch=2, max_held_batches=1) as pinned:
        thread = prefetch_thread(torch, pinned, copies, failures)
        # Once every slot is page-locked (when its first batch went out).
        while thread.is_alive() and len(copies) < 50:
            time.sleep(0.01)
        graphs = 0
        while thread.is_alive():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                y = x * 2 + 1
            graph.replay()
            graphs += 1
        thread.join()
        assert failures == [], failures
        assert graphs > 0 and float(y[0]) == 1.0
    copies_checked(expected, copies, torch)
