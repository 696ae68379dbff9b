"""The GPU stage where there is no GPU (CI, laptops): what it says, never a silent no-op.

``pin_memory=True`` runs with pageable slots and warns once naming what is missing, as
DataLoader does; ``device="cuda"`` raises :class:`stoker.GpuUnavailableError` naming it. The
split of an image pipeline into the CPU's part and the device's tail is checked here too (it
needs no GPU). On a machine with a GPU the driver-dependent tests here are skipped: there
``test_gpu.py`` runs the real thing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import stoker
from conftest import epoch_batches
from stoker import _native, gpu, ops, vision


def no_driver() -> None:
    if _native.cuda_driver_present():
        pytest.skip("a CUDA driver is present here: test_gpu.py covers this machine")


def test_without_a_driver_the_native_side_names_what_is_missing() -> None:
    no_driver()
    reason = _native.cuda_unavailable(0)
    assert reason is not None and "libcuda" in reason and "no CUDA driver" in reason


def test_pin_memory_without_a_driver_warns_once_and_runs(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    no_driver()
    with pytest.warns(UserWarning, match=r"pin_memory=True.*no CUDA driver.*libcuda") as caught:
        pinned = make_loader(pin_memory=True)
    assert len(caught) == 1
    # Attributed to the line that made the Loader (in the fixture), not to Stoker's own code.
    assert Path(caught[0].filename).name == "conftest.py"
    plain = make_loader()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = epoch_batches(pinned)
    stats = pinned.stats()
    assert stats["pinned"] is False and stats["pinned_bytes"] == 0
    assert stats["pinned_device"] is None
    assert stats["gpu_idle_s"] == 0.0 and stats["gpu_idle_fraction"] == 0.0
    assert stats["device"] == "cpu"
    expected = epoch_batches(plain)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_pin_memory_of_a_wrapped_dataset_without_a_driver_warns() -> None:
    no_driver()
    data = [np.full(3, i, dtype=np.int64) for i in range(8)]
    with pytest.warns(UserWarning, match="cannot be page-locked") as caught:
        wrapped = stoker.Loader.from_dataset(data, batch_size=4, pin_memory=True, output="numpy")
    assert [Path(w.filename) for w in caught] == [Path(__file__)]
    with wrapped:
        assert [b[:, 0].tolist() for b in wrapped] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert wrapped.stats()["pinned"] is False


def test_pin_memory_of_a_mix_without_a_driver_warns_at_the_callers_line(dataset: Path) -> None:
    no_driver()
    with pytest.warns(UserWarning, match="cannot be page-locked") as caught:
        mixed = stoker.mix(
            {dataset: 1.0},
            pipeline=vision.imagenet_train(32),
            batch_size=4,
            pin_memory=True,
            output="numpy",
        )
    mixed.close()
    assert [Path(w.filename) for w in caught] == [Path(__file__)]


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_device_cuda_without_a_gpu_raises_naming_what_is_missing(
    make_loader: Callable[..., stoker.Loader], device: str
) -> None:
    no_driver()
    torch = pytest.importorskip("torch", reason="device='cuda' first needs torch itself")
    with pytest.raises(stoker.GpuUnavailableError, match=f"device='{device}'") as raised:
        make_loader(device=device, output="torch")
    message = str(raised.value)
    if torch.version.cuda is None:
        assert "built without CUDA" in message
    else:
        assert "no CUDA driver" in message and "libcuda" in message
    assert isinstance(raised.value, RuntimeError) and isinstance(raised.value, stoker.StokerError)


def test_device_needs_torch_output(make_loader: Callable[..., stoker.Loader]) -> None:
    with pytest.raises(ValueError, match="delivers torch tensors"):
        make_loader(device="cuda", output="numpy")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dtype": "bfloat16"}, "give device='cuda'"),
        ({"memory_format": "channels_last"}, "give device='cuda'"),
        ({"pin_memory": 1}, "pin_memory must be True or False"),
        ({"pinned_memory_budget": 0}, r"positive number of bytes \(this process's own\)"),
        ({"pinned_memory_budget": "4G"}, "pinned_memory_budget must be a positive"),
        # Taken and ignored on a loader that locks no page.
        ({"pinned_memory_budget": 1 << 30}, "only pin_memory=True or device='cuda' uses"),
        ({"device": "tpu"}, "device must be"),
        ({"device": "cuda:x"}, "device must be"),
    ],
)
def test_gpu_arguments_are_checked(
    make_loader: Callable[..., stoker.Loader], overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_loader(**overrides)


def test_a_mix_is_refused_on_the_device(dataset: Path) -> None:
    # Checked with the arguments, before torch or the driver are asked for the device.
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"device='cuda' does not take a stoker\.mix"):
        stoker.mix({dataset: 1.0}, pipeline=vision.imagenet_train(32), batch_size=4, device="cuda")


def crop() -> list[ops.Op]:
    return [ops.DecodeImage(), ops.RandomResizedCrop(32), ops.RandomHorizontalFlip()]


@pytest.mark.parametrize(
    ("tail_ops", "dtype", "memory_format", "expected"),
    [
        ([ops.ToTensor()], None, None, gpu.DeviceTail(None, "NHWC", "uint8", "contiguous")),
        ([], None, None, gpu.DeviceTail(None, "NHWC", "uint8", "contiguous")),
        (
            [ops.Normalize(vision.IMAGENET_MEAN, vision.IMAGENET_STD)],
            None,
            None,
            gpu.DeviceTail(
                (vision.IMAGENET_MEAN, vision.IMAGENET_STD), "NCHW", "float32", "contiguous"
            ),
        ),
        (
            [ops.Normalize((0.5,) * 3, (0.25,) * 3), ops.ToTensor("NHWC", "float32")],
            "bfloat16",
            None,
            gpu.DeviceTail(((0.5,) * 3, (0.25,) * 3), "NHWC", "bfloat16", "contiguous"),
        ),
        (
            [ops.ToTensor("NCHW", "float32")],
            "float16",
            "channels_last",
            gpu.DeviceTail(None, "NCHW", "float16", "channels_last"),
        ),
        (
            [ops.ToTensor("NHWC", "uint8")],
            None,
            "torch.channels_last",
            gpu.DeviceTail(None, "NCHW", "uint8", "channels_last"),
        ),
    ],
)
def test_the_tail_of_an_image_pipeline_moves_to_the_device(
    tail_ops: list[ops.Op], dtype: Any, memory_format: Any, expected: gpu.DeviceTail
) -> None:
    cpu, tail = gpu.split_tail([*crop(), *tail_ops], dtype, memory_format)
    assert tail == expected
    # The CPU threads make uint8 NHWC, the cheapest bytes to copy.
    assert cpu == [*crop(), ops.ToTensor()]
    assert ops.check_pipeline(cpu)


def test_the_lane_is_given_the_tail_as_the_stage_computes_it() -> None:
    """What the native lane gets for its kernel to apply (with STOKER_GPU_DECODE_FUSED_TAIL=1):
    the dtype, whether the memory holds channel planes (contiguous NCHW only), and Normalize as
    the per-channel scale and shift of byte values the stage multiplies and adds."""
    assert gpu.lane_tail(None) is None
    mean, std = vision.IMAGENET_MEAN, vision.IMAGENET_STD
    normalize = ops.Normalize(mean, std)
    _, tail = gpu.split_tail([*crop(), normalize], "bfloat16", "channels_last")
    assert tail is not None
    dtype, planar, affine = gpu.lane_tail(tail)  # type: ignore[misc]
    assert (dtype, planar) == ("bfloat16", False)
    assert affine is not None
    scale, shift = affine
    for v in (0, 17, 255):
        for c in range(3):
            assert v * scale[c] + shift[c] == pytest.approx((v / 255 - mean[c]) / std[c])
    _, contiguous = gpu.split_tail([*crop(), normalize], None, None)
    assert contiguous is not None
    assert gpu.lane_tail(contiguous)[:2] == ("float32", True)  # type: ignore[index]
    # Without Normalize a float dtype is ToTensor's v / 255; uint8 keeps its values.
    _, nhwc = gpu.split_tail([*crop(), ops.ToTensor("NHWC", "float32")], "float16", None)
    assert nhwc is not None
    assert gpu.lane_tail(nhwc) == ("float16", False, ([1 / 255] * 3, [0.0] * 3))
    _, planes = gpu.split_tail([*crop(), ops.ToTensor("NCHW", "uint8")], None, None)
    assert planes is not None
    assert gpu.lane_tail(planes) == ("uint8", True, None)
    # ToTensor's strings in any case, as the CPU path takes them: the same layout on the GPU
    # (lower-case "nhwc" came out NCHW there).
    _, lower = gpu.split_tail([*crop(), ops.ToTensor("nhwc", "FLOAT32")], None, None)
    assert lower is not None and (lower.layout, lower.dtype) == ("NHWC", "float32")
    assert gpu.lane_tail(lower) == ("float32", False, ([1 / 255] * 3, [0.0] * 3))


def test_the_tail_refuses_what_contradicts_the_pipeline() -> None:
    normalize = ops.Normalize(vision.IMAGENET_MEAN, vision.IMAGENET_STD)
    with pytest.raises(ValueError, match="contradicts Normalize"):
        gpu.split_tail([*crop(), normalize], "uint8", None)
    with pytest.raises(ValueError, match="dtype must be one of"):
        gpu.split_tail([*crop(), normalize], "int8", None)
    with pytest.raises(ValueError, match="memory_format must be"):
        gpu.split_tail([*crop(), normalize], None, "preserve")
    tokens = [ops.TokenWindows(16)]
    assert gpu.split_tail(tokens, None, None) == (tokens, None)
    with pytest.raises(ValueError, match="image pipelines only"):
        gpu.split_tail(tokens, "bfloat16", None)


def test_device_strings() -> None:
    assert gpu.parse_device(None) is None and gpu.parse_device("cpu") is None
    assert gpu.parse_device("cuda") == -1 and gpu.parse_device("cuda:3") == 3


def test_the_default_pinned_budget_divides_the_node_by_its_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    one, rule = gpu.default_pinned_budget()
    assert one > 0 and "quarter" in rule
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    eight, rule = gpu.default_pinned_budget()
    assert eight == one // 8 and "LOCAL_WORLD_SIZE=8" in rule


def test_the_default_pinned_budget_keeps_to_a_containers_memory_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A pod limited to 1 GiB on a larger host: a quarter of the limit, not of the host.
    limit = tmp_path / "memory.max"
    limit.write_text("1073741824\n")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(gpu, "CGROUP_MEMORY_LIMITS", (str(limit),))
    budget, rule = gpu.default_pinned_budget()
    assert budget == (1 << 30) // 4 and "cgroup limit's" in rule, rule
    # No limit set ("max"): the node's memory, as before.
    limit.write_text("max\n")
    budget, rule = gpu.default_pinned_budget()
    assert budget > 0 and "node's" in rule, rule


def test_without_a_driver_no_device_is_active() -> None:
    no_driver()
    assert _native.cuda_active_devices() == []  # nothing started, nothing raised


class RoundRobinPool:
    """A stand-in for torch's stream pool as its docs describe it: per device and priority
    level a fixed ring of streams, handed out in turn by ``torch.cuda.Stream()``; priorities
    past the last level share it."""

    def __init__(self, size: int, levels: int) -> None:
        self.size, self.levels = size, levels
        self.counters: dict[tuple[int, int], int] = {}

    def level(self, priority: int) -> int:
        return min(-priority, self.levels - 1)

    def stream(self, device: int = 0, priority: int = 0) -> SimpleNamespace:
        key = (device, self.level(priority))
        index = self.counters.get(key, 0)
        self.counters[key] = index + 1
        handle = 0x1000 * (device + 1) + 0x100 * key[1] + index % self.size + 1
        return SimpleNamespace(cuda_stream=handle)


def test_the_pool_is_enumerated_and_its_turn_left_where_it_was() -> None:
    pool = RoundRobinPool(size=32, levels=4)
    for _ in range(5):  # the program had asked for five streams of priority 0
        pool.stream()
    before = pool.stream().cuda_stream
    pool.counters[(0, 0)] -= 1  # (that look did not count)
    handles = gpu.pool_streams(lambda p: pool.stream(0, p), range(0, -6, -1))
    # Four levels of 32 (priorities -3, -4, -5 share the last), each once.
    assert len(handles) == 4 * 32 == len(set(handles))
    assert all(pool.counters[(0, level)] % 32 == 0 for level in range(1, 4))
    # The next stream the program asks for is the one it would have had.
    assert pool.stream().cuda_stream == before
    # A pool of another size is found whole too.
    small = RoundRobinPool(size=3, levels=1)
    assert len(gpu.pool_streams(lambda p: small.stream(0, p), [0])) == 3
    assert small.counters[(0, 0)] % 3 == 0


def test_a_release_fences_every_device_the_process_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which streams a released pinned slot waits for, from what torch and the driver report
    (a stand-in for torch's few calls: the pairing needs two GPUs to see for real, which
    ``test_gpu.py`` does where there are two)."""
    current = {0: 7, 1: 0, 2: 9}
    initialized = [False]
    pool = RoundRobinPool(size=32, levels=2)

    class Stream:
        @staticmethod
        def priority_range() -> tuple[int, int]:
            return (0, -1)

        def __new__(cls, device: int, priority: int) -> Any:
            return pool.stream(device, priority)

    stand_in = SimpleNamespace(
        cuda=SimpleNamespace(
            is_initialized=lambda: initialized[0],
            current_stream=lambda d: SimpleNamespace(cuda_stream=current[d]),
            Stream=Stream,
        )
    )
    active = [0, 1, 2]
    watched: list[tuple[int, int]] = []
    monkeypatch.setattr(_native, "cuda_active_devices", lambda: list(active))
    monkeypatch.setattr(
        _native, "cuda_watch_streams", lambda d, s: watched.append((d, len(s))) or len(s)
    )
    streams = gpu.release_streams(stand_in)
    assert streams() == []  # torch has not started CUDA: no copy can be queued
    assert watched == []
    initialized[0] = True
    # Each device in use with the releasing thread's current stream there; each device's
    # pool (both priority levels) registered for the fence thread's sweeps, once.
    assert streams() == [(0, 7), (1, 0), (2, 9)]
    assert watched == [(0, 64), (1, 64), (2, 64)]
    assert streams() == [(0, 7), (1, 0), (2, 9)]
    assert len(watched) == 3
    # A device nothing started is not fenced (that would start its context): a rank that
    # set its device before using CUDA has only that one.
    active[:] = [2]
    assert streams() == [(2, 9)]
    assert gpu.release_streams(None)() == []


@pytest.mark.parametrize(
    ("output", "wrapped"), [("numpy", False), ("torch", False), ("numpy", True)]
)
def test_slots_the_driver_refuses_at_the_first_batch_warn_once_and_pin_nothing(
    make_loader: Callable[..., stoker.Loader], output: str, wrapped: bool
) -> None:
    """The driver context that locks the slots opens with the first batch: where it fails (a
    GPU in exclusive use by another process, say), the loop's first batch warns once, as a
    missing driver does when the loader is made, and the labels are not pinned either. The
    native side is stood in for here (no GPU): pinned slots until the first batch, then
    refused."""
    if output == "torch":
        pytest.importorskip("torch")
    if wrapped:  # a Python dataset's loader
        samples = [{"x": np.full(3, i, dtype=np.int64)} for i in range(32)]
        loader = stoker.Loader.from_dataset(samples, batch_size=4, output=output)
    else:
        loader = make_loader(output=output)
    native = loader._native
    refusal = "CUDA driver call cuDevicePrimaryCtxRetain failed: CUDA_ERROR_DEVICES_UNAVAILABLE"
    asked = []

    class Refusing:
        def __getattr__(self, name: str) -> Any:
            return getattr(native, name)

        def stats(self) -> dict[str, Any]:
            stats = dict(native.stats())
            first = not asked
            asked.append(True)
            stats.update(
                pinned=first, pinned_device=None, pin_error=None if first else refusal
            )
            return stats

    loader._native = Refusing()  # type: ignore[assignment]
    loader._finish_init()
    made = loader._batches
    assert made._pin_unsettled and made._pin_small == (output == "torch")
    with pytest.warns(UserWarning, match="cannot be page-locked: CUDA driver call") as caught:
        got = epoch_batches(loader)
    unpinned = [w for w in caught if "page-locked" in str(w.message)]
    assert len(unpinned) == 1 and len(got) > 1
    assert not made._pin_small and not made._pin_unsettled
    loader.close()


class ScriptedGpu:
    """The few torch calls :class:`stoker.gpu.GpuIdleMeter` makes, over a GPU clock the test
    moves (an event records the clock's reading; every event has finished)."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.cuda = SimpleNamespace(
            is_initialized=lambda: True,
            current_stream=lambda index: "the consumer's stream",
            Event=self.event,
        )

    def event(self, enable_timing: bool) -> SimpleNamespace:
        assert enable_timing
        event = SimpleNamespace(at=None)
        event.record = lambda stream: setattr(event, "at", self.now_ms)
        event.query = lambda: True
        event.elapsed_time = lambda other: other.at - event.at
        return event


def test_the_idle_meter_reports_each_step_with_the_lanes_work_in_its_host_window() -> None:
    gpu_clock = ScriptedGpu()
    host = {"s": 100.0, "lane_s": 5.0}
    reports: list[tuple[float, ...]] = []
    meter = gpu.GpuIdleMeter(
        gpu_clock,
        None,
        lambda *figures: reports.append(tuple(round(f, 6) for f in figures)),
        lambda: host["lane_s"],
        clock=lambda: host["s"],
    )

    def step(work_ms: float, wait_ms: float, host_s: float, lane_s: float) -> None:
        # The consumer's stream works `work_ms`, then waits `wait_ms` inside next().
        gpu_clock.now_ms += work_ms
        meter.before()
        gpu_clock.now_ms += wait_ms
        host["s"] += host_s
        host["lane_s"] += lane_s
        meter.after()

    step(0.0, 2.0, 0.0, 0.0)  # the first batch: nothing before it to measure from
    assert reports == []
    step(10.0, 0.0, 0.010, 0.0)  # the lane quiet over the step's 10 ms
    step(12.0, 1.0, 0.013, 0.008)  # beside the lane's 8 ms of work
    assert reports == [(0.0, 0.010, 0.0, 0.010), (0.001, 0.013, 0.008, 0.013)]
    # Without a lane, a step reports its idle and span only, and the lane is asked once.
    bare: list[tuple[float, ...]] = []
    asked: list[None] = []
    meter = gpu.GpuIdleMeter(
        gpu_clock, None, lambda *figures: bare.append(figures), lambda: asked.append(None)
    )
    for _ in range(3):
        gpu_clock.now_ms += 5.0
        meter.before()
        meter.after()
    assert bare == [(0.0, 0.005), (0.0, 0.005)]
    assert len(asked) == 1


def test_steps_reported_beside_the_lane_show_their_cost_in_stats(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader()
    native = loader._handle()
    assert native.lane_busy_s() is None  # no lane here
    for _ in range(4):  # quiet steps: busy 10 ms of their 10.5
        native.record_gpu_idle(0.0005, 0.0105, 0.0, 0.0105)
    for _ in range(2):  # beside the lane: busy 13 ms, no wait at all
        native.record_gpu_idle(0.0, 0.013, 0.008, 0.013)
    stats = loader.stats()
    assert stats["gpu_lane_cost_s"] == pytest.approx(0.006)
    assert stats["gpu_lane_quiet_steps"] == 4
    assert stats["gpu_lane_cost_fraction"] == pytest.approx(0.006 / 0.068)
    assert stats["gpu_idle_fraction"] == pytest.approx(0.002 / 0.068)
    with pytest.raises(ValueError, match="come together"):
        native.record_gpu_idle(0.0, 0.01, 0.001)
    with pytest.raises(ValueError, match="finite and >= 0"):
        native.record_gpu_idle(0.0, 0.01, -1.0, 0.01)


def test_auto_decoding_on_the_cpu_is_a_warning_once_per_reason(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decode="auto"`` that could not use the GPU lane said so at INFO, or (without a
    device) not at all: a user who asked for the lane never learned it did not run."""
    monkeypatch.setattr(gpu, "_AUTO_SAID", set())
    with caplog.at_level("WARNING", logger="stoker"):
        assert gpu.check_decode("auto", None, None, None)[0] == "cpu"
        assert gpu.check_decode("auto", None, None, None)[0] == "cpu"
        no_driver()
        assert gpu.lane_decode("auto", 0) == "cpu"
        assert gpu.lane_decode("auto", 0) == "cpu"
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 2, said
    assert "no device= was given" in said[0] and "the GPU lane cannot run" in said[1], said
