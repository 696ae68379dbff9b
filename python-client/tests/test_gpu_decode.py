"""The GPU decode lane (``decode="gpu"`` / ``"auto"``).

Without a GPU (CI): the kernel's source compiles with NVRTC (torch's CUDA wheels bring
``libnvrtc``), the arguments are checked, ``decode="gpu"`` says what is missing,
``decode="auto"`` gives the CPU's batches, and what DCT scaling changes on the CPU (the part of
the default recipe's bound the lane does not share) is held. With a GPU (``pytest -m gpu``):
pixel parity with the CPU pipeline within the bound stated below, the same crop windows, the
CPU fallback of progressive, PNG and corrupt files, the default ``imagenet_train`` recipe (the
CPU decoding large windows at a reduced DCT scale) within its own stated bound, flat device
memory, one digest for two ``auto`` runs, the lane's memory under its cap with 6000x6000 JPEGs
in the set, hostile JPEGs through ``decode="gpu"`` with the CUDA context usable after,
files with damaged scan data named as the same bad samples, with the same substitutes, under
``"cpu"``, ``"gpu"`` and ``"auto"``, and crop windows decoded alone giving the whole images'
rows within the resize's rounding.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from conftest import RecordingNative, daemon_binary, require_cuda_torch
from stoker import _native, _resume, gpu, ops, vision

CROP = 64

# The bound the lane is held to against the CPU pipeline on the generated set: mean absolute
# difference per pixel value over a whole epoch (the decoders' IDCT and chroma upsampling round
# differently; the crop, filter and flip are the same). The CPU side decodes at full size here
# (dct_scaling=False), as the hardware engines do.
MEAN_ABS_BOUND = 1.5
# No single image may be further off than this: a different crop window or flip would be.
IMAGE_MEAN_ABS_BOUND = 4.0
# With the default recipe (`vision.imagenet_train`, DCT scaling on) the CPU decodes a large
# window at a reduced scale and the lane at full size. On the generated set at CROP, the CPU's
# scaled rows differ from its own full-size rows by about 2.6 grey levels on average and 7.3 at
# most for an image (the CPU test below holds that); the lane is held to its full-size bound
# plus that difference.
SCALED_MEAN_ABS = (2.0, 3.2)
SCALED_IMAGE_MEAN_ABS_MAX = 8.0
DEFAULT_MEAN_ABS_BOUND = MEAN_ABS_BOUND + SCALED_MEAN_ABS[1]
DEFAULT_IMAGE_MEAN_ABS_BOUND = IMAGE_MEAN_ABS_BOUND + SCALED_IMAGE_MEAN_ABS_MAX


def train_pipeline(dct_scaling: bool = False) -> list[ops.Op]:
    return [
        ops.DecodeImage(dct_scaling=dct_scaling),
        ops.RandomResizedCrop(CROP),
        ops.RandomHorizontalFlip(),
        ops.ToTensor(),
    ]


def nvrtc_or_skip() -> list[str]:
    dirs = gpu.cuda_library_dirs()
    try:
        _native.compile_gpu_kernel(dirs)
    except RuntimeError as error:
        if "libnvrtc" in str(error) and os.environ.get("CI") != "true":
            pytest.skip(f"no libnvrtc here ({error}); CI installs torch, which brings it")
        raise
    return dirs


def test_the_kernel_compiles_with_nvrtc() -> None:
    dirs = nvrtc_or_skip()
    ptx = _native.compile_gpu_kernel(dirs)
    assert isinstance(ptx, str)
    assert ".entry crop_resize_flip" in ptx
    # Machine code for an architecture, as the lane compiles it for its GPU.
    cubin = _native.compile_gpu_kernel(dirs, (9, 0))
    assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF"


def test_decode_arguments_are_checked(dataset: Path) -> None:
    base: dict[str, Any] = {"pipeline": train_pipeline(), "batch_size": 4, "output": "numpy"}
    with pytest.raises(ValueError, match="decode must be 'cpu', 'gpu' or 'auto'"):
        stoker.Loader(dataset, decode="tpu", **base)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"decode='gpu'.*device='cuda'"):
        stoker.Loader(dataset, decode="gpu", **base)
    with pytest.raises(ValueError, match="gpu_memory sizes the GPU decode lane"):
        stoker.Loader(dataset, gpu_memory=1 << 30, **base)
    with pytest.raises(ValueError, match="gpu_memory must be an int of at least"):
        stoker.Loader(dataset, decode="auto", gpu_memory=1024, **base)
    with pytest.raises(ValueError, match="embedded mode"):
        stoker.Loader(dataset, decode="auto", address="127.0.0.1:1", **base)


def test_decode_gpu_without_a_gpu_names_what_is_missing(dataset: Path) -> None:
    if _native.cuda_driver_present():
        pytest.skip("a CUDA driver is present here: the GPU tests below cover this machine")
    torch = pytest.importorskip("torch")
    del torch
    with pytest.raises(stoker.GpuUnavailableError, match="CUDA"):
        stoker.Loader(
            dataset, pipeline=train_pipeline(), batch_size=4, device="cuda", decode="gpu"
        )


def epoch_digest(loader: stoker.Loader) -> str:
    digest = hashlib.sha256()
    for batch in loader:
        image = batch["image"]
        if hasattr(image, "cpu"):
            image = image.cpu().numpy()
        digest.update(np.ascontiguousarray(image).tobytes())
        label = batch["label"]
        digest.update(np.asarray(label.cpu() if hasattr(label, "cpu") else label).tobytes())
    return digest.hexdigest()


def cpu_options() -> dict[str, Any]:
    """A small host-memory loader's options (the tests that need no GPU)."""
    return {
        "pipeline": train_pipeline(),
        "batch_size": 8,
        "num_threads": 2,
        "output": "numpy",
        "seed": 3,
    }


def test_auto_gives_the_cpu_batches_where_no_lane_runs(dataset: Path) -> None:
    base = cpu_options()
    with stoker.Loader(dataset, **base) as cpu:
        expected = epoch_digest(cpu)
    # Without device=, "auto" has no GPU batch to decode into: it is "cpu".
    with stoker.Loader(dataset, decode="auto", **base) as auto:
        assert epoch_digest(auto) == expected
        assert auto.stats()["gpu_decode"] is None
        assert "decode_split" not in auto.state_dict()


# -- on a GPU ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch() -> Any:
    """torch with a usable CUDA device and a GPU lane that can start, or a skip naming what is
    missing."""
    torch = require_cuda_torch("the GPU decode tests")
    problem = _native.gpu_decode_unavailable(0, gpu.cuda_library_dirs())
    if problem is not None:
        pytest.fail(f"a GPU is here but the decode lane cannot run: {problem}")
    return torch


def device_epoch(dataset: Path, decode: str, **overrides: Any) -> tuple[list[Any], dict[str, Any]]:
    """The uint8 NHWC images of one epoch delivered on cuda:0 with ``decode``, copied to the
    host, and the loader's stats."""
    options: dict[str, Any] = {
        "pipeline": train_pipeline(),
        "batch_size": 16,
        "num_threads": 2,
        "seed": 5,
        "device": "cuda",
        "decode": decode,
        "timeout": 120,
    }
    options.update(overrides)
    with stoker.Loader(dataset, **options) as loader:
        images = [
            (batch["image"].cpu().numpy().copy(), batch["label"].cpu().numpy().copy())
            for batch in loader
        ]
        return images, loader.stats()


def one_class(root: Path, dataset: Path, count: int, name: str) -> None:
    """Makes ``root`` a dataset of one class, ``a``, holding the first ``count`` JPEGs of
    ``dataset`` named ``name.format(i)``."""
    (root / "a").mkdir(parents=True)
    for i, source in enumerate(sorted(dataset.rglob("*.jpg"))[:count]):
        shutil.copy(source, root / "a" / name.format(i))


@pytest.mark.gpu
def test_gpu_rows_match_the_cpu_pipeline_within_the_bound(torch: Any, dataset: Path) -> None:
    cpu, _ = device_epoch(dataset, "cpu")
    lane, stats = device_epoch(dataset, "gpu")
    lane_stats = stats["gpu_decode"]
    assert lane_stats is not None and lane_stats["rows"] > 0, lane_stats
    assert lane_stats["fallback_rows"] == 0, lane_stats
    diffs = []
    for (cpu_image, cpu_label), (gpu_image, gpu_label) in zip(cpu, lane, strict=True):
        assert cpu_image.shape == gpu_image.shape and cpu_image.dtype == np.uint8
        np.testing.assert_array_equal(cpu_label, gpu_label)
        per_image = np.abs(cpu_image.astype(np.int16) - gpu_image.astype(np.int16)).mean(
            axis=(1, 2, 3)
        )
        assert per_image.max() < IMAGE_MEAN_ABS_BOUND, per_image
        diffs.append(per_image)
    mean = float(np.concatenate(diffs).mean())
    print(f"GPU lane vs CPU: mean abs diff {mean:.3f} grey levels")
    assert mean < MEAN_ABS_BOUND


def per_image_mean_abs(left: list[Any], right: list[Any]) -> Any:
    """Each image's mean absolute difference between two epochs of uint8 NHWC batches."""
    assert len(left) == len(right)
    return np.concatenate(
        [
            np.abs(a.astype(np.int16) - b.astype(np.int16)).mean(axis=(1, 2, 3))
            for a, b in zip(left, right, strict=True)
        ]
    )


def test_the_default_recipes_scaled_decode_differs_from_full_size_as_stated(
    dataset: Path,
) -> None:
    """On the CPU alone: what DCT scaling changes in `imagenet_train`'s rows on the generated
    set, the part of the lane's bound below that its full-size decode does not share."""

    def host_epoch(pipeline: list[ops.Op]) -> list[Any]:
        options = {"batch_size": 16, "num_threads": 2, "seed": 5}
        with stoker.Loader(dataset, pipeline=pipeline, **options) as loader:
            return [np.asarray(batch["image"]).copy() for batch in loader]

    scaled = host_epoch(vision.imagenet_train(CROP))
    full = host_epoch([ops.DecodeImage(dct_scaling=False), *vision.imagenet_train(CROP)[1:]])
    per_image = per_image_mean_abs(scaled, full)
    # Most windows of the set are large enough to decode scaled.
    assert (per_image > 0).sum() >= len(per_image) // 2, per_image
    low, high = SCALED_MEAN_ABS
    assert low < per_image.mean() < high, per_image.mean()
    assert per_image.max() < SCALED_IMAGE_MEAN_ABS_MAX, per_image.max()


@pytest.mark.gpu
def test_the_default_recipes_rows_are_within_the_stated_bound_of_the_cpus(
    torch: Any, dataset: Path
) -> None:
    """`imagenet_train` as it ships: the CPU decodes large windows scaled, the lane at full
    size, and the lane's rows stay within the full-size bound plus what scaling changes."""
    recipe = {"pipeline": vision.imagenet_train(CROP)}
    cpu, _ = device_epoch(dataset, "cpu", **recipe)
    lane, stats = device_epoch(dataset, "gpu", **recipe)
    assert stats["gpu_decode"]["rows"] > 0, stats["gpu_decode"]
    for (_, cpu_label), (_, gpu_label) in zip(cpu, lane, strict=True):
        np.testing.assert_array_equal(cpu_label, gpu_label)
    per_image = per_image_mean_abs([image for image, _ in cpu], [image for image, _ in lane])
    print(f"GPU lane vs CPU, imagenet_train: mean abs diff {per_image.mean():.3f} grey levels")
    assert per_image.max() < DEFAULT_IMAGE_MEAN_ABS_BOUND, per_image
    assert per_image.mean() < DEFAULT_MEAN_ABS_BOUND


@pytest.mark.gpu
def test_the_windows_are_the_cpus(torch: Any, dataset: Path) -> None:
    """A wrong window or flip shows as a large difference in the image's own content: each
    GPU row is closer to its own CPU row than to the CPU row of its mirror image."""
    cpu, _ = device_epoch(dataset, "cpu")
    lane, _ = device_epoch(dataset, "gpu")
    for (cpu_image, _), (gpu_image, _) in zip(cpu, lane, strict=True):
        same = np.abs(cpu_image.astype(np.int16) - gpu_image).mean(axis=(1, 2, 3))
        mirrored = np.abs(cpu_image[:, :, ::-1].astype(np.int16) - gpu_image).mean(axis=(1, 2, 3))
        assert (same < mirrored).all(), (same, mirrored)


@pytest.fixture
def mixed_root(dataset: Path, tmp_path: Path) -> Path:
    """Baseline JPEGs, progressive JPEGs, PNGs and a corrupt JPEG in one folder."""
    root = tmp_path / "mixed"
    from PIL import Image

    files = sorted(p for p in dataset.rglob("*.jpg"))[:24]
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    for i, source in enumerate(files):
        image = Image.open(source).convert("RGB")
        target = root / ("a" if i % 2 else "b")
        if i % 4 == 0:
            image.save(target / f"{i:03}_progressive.jpg", progressive=True, quality=90)
        elif i % 4 == 1:
            image.save(target / f"{i:03}.png")
        else:
            shutil.copy(source, target / f"{i:03}.jpg")
    whole = files[0].read_bytes()
    (root / "a" / "999_corrupt.jpg").write_bytes(whole[: len(whole) // 2])
    return root


@pytest.mark.gpu
def test_progressive_png_and_corrupt_files_go_to_the_cpu(torch: Any, mixed_root: Path) -> None:
    cpu, _ = device_epoch(mixed_root, "cpu", batch_size=5)
    lane, stats = device_epoch(mixed_root, "gpu", batch_size=5)
    lane_stats = stats["gpu_decode"]
    # 6 progressive + 6 PNG + the corrupt one are declined; the 12 baseline JPEGs decoded.
    assert lane_stats["declined_rows"] >= 13, lane_stats
    assert lane_stats["rows"] >= 1, lane_stats
    assert stats["bad_samples"] >= 1  # the corrupt file, replaced as on the CPU
    for (cpu_image, cpu_label), (gpu_image, gpu_label) in zip(cpu, lane, strict=True):
        np.testing.assert_array_equal(cpu_label, gpu_label)
        per_image = np.abs(cpu_image.astype(np.int16) - gpu_image).mean(axis=(1, 2, 3))
        assert per_image.max() < IMAGE_MEAN_ABS_BOUND


@pytest.mark.gpu
def test_device_memory_is_flat_over_2000_batches(torch: Any, dataset: Path) -> None:
    options: dict[str, Any] = {
        "pipeline": train_pipeline(),
        "batch_size": 8,
        "num_threads": 2,
        "device": "cuda",
        "decode": "gpu",
        "timeout": 120,
    }
    with stoker.Loader(dataset, **options) as loader:
        seen = 0
        free_after_warmup = None
        lane_after_warmup = None
        allocations_after_warmup = None
        while seen < 2000:
            for batch in loader:
                seen += 1
                del batch
                if seen == 500:
                    # By now nvJPEG has seen every image size of the set.
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                    free_after_warmup = torch.cuda.mem_get_info()[0]
                    lane_after_warmup = loader.stats()["gpu_decode"]["memory_bytes"]
                    allocations_after_warmup = loader.stats()["gpu_decode"]["nvjpeg_allocations"]
                if seen >= 2000:
                    break
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free_end = torch.cuda.mem_get_info()[0]
        lane = loader.stats()["gpu_decode"]
        assert lane["memory_bytes"] == lane_after_warmup, lane
        assert lane["memory_bytes"] <= lane["memory_cap"], lane
        assert free_after_warmup is not None
        # Nothing grows on the device over the last 1,500 batches. nvJPEG's allocations through
        # the lane's allocators after warm-up (each cuMemAlloc/cuMemFree may wait for the whole
        # device, the training stream included) are printed, not held: they cost time only.
        print(f"device memory change over 1,500 batches: {free_after_warmup - free_end} bytes")
        print(
            f"nvJPEG allocations: {allocations_after_warmup} in the first 500 batches, "
            f"{lane['nvjpeg_allocations'] - (allocations_after_warmup or 0)} in the 1,500 after"
        )
        assert free_after_warmup - free_end < 4 << 20, (free_after_warmup, free_end)


@pytest.mark.gpu
def test_the_lanes_page_locked_memory_stays_within_the_pinned_budget(
    torch: Any, dataset: Path
) -> None:
    """The lane's staging and nvJPEG's pinned buffers count against ``pinned_memory_budget``
    beside the slots: what both hold stays within it, and slots that do not fit beside the
    lane are refused by name; in the helper process, its staging and the room it keeps to for
    nvJPEG's pinned buffers are reserved here alike."""
    budget = 256 << 20
    _, stats = device_epoch(dataset, "gpu", pinned_memory_budget=budget)
    lane = stats["gpu_decode"]
    print(f"slots {stats['pinned_bytes']} B, lane {lane['pinned_bytes']} B of {budget} B")
    assert lane["pinned_bytes"] > 0 and lane["pinned_refused"] == 0, lane
    assert stats["pinned_bytes"] + lane["pinned_bytes"] <= budget, (stats, lane)
    # A budget the lane's staging fills (what it takes as it starts, before the slots are sized;
    # nvJPEG's pinned buffers come later, as it decodes): the lane starts, and the slots then
    # do not fit beside it, which the error says.
    assert 0 < lane["staging_bytes"] <= lane["pinned_bytes"], lane
    beside_the_lane = "held by its other loaders and GPU decode lanes"
    with pytest.raises(stoker.GpuUnavailableError, match=beside_the_lane):
        device_epoch(dataset, "gpu", pinned_memory_budget=lane["staging_bytes"])
    # The lane in its helper process: the helper's staging, and the room it keeps to for
    # nvJPEG's pinned buffers there (twice the staging), are reserved here within the budget.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STOKER_GPU_DECODE_HELPER", str(daemon_binary("stoker-lane-helper")))
        _, stats = device_epoch(dataset, "gpu", pinned_memory_budget=budget)
        helped = stats["gpu_decode"]
        assert helped["staging_bytes"] == lane["staging_bytes"], stats
        staging = helped["staging_bytes"]
        assert staging <= helped["pinned_bytes"] <= 3 * staging, stats
        assert helped["pinned_refused"] == 0, stats
        assert stats["pinned_bytes"] + helped["pinned_bytes"] <= budget, stats
        with pytest.raises(stoker.GpuUnavailableError, match=beside_the_lane):
            device_epoch(dataset, "gpu", pinned_memory_budget=lane["staging_bytes"])
        with pytest.raises(stoker.GpuUnavailableError, match="does not fit in the pinned"):
            device_epoch(dataset, "gpu", pinned_memory_budget=lane["staging_bytes"] - 1)


@pytest.mark.gpu
def test_the_lanes_row_places_and_the_labels_reach_the_device_from_the_room_beside_the_slots(
    torch: Any, dataset: Path
) -> None:
    """Under ``decode="gpu"`` each batch's row places (where the lane's rows go) and labels are
    page-locked beside the slots, within the budget, and the places say the rows' positions."""

    def note(item: Any) -> tuple[bool, list[int] | None, bool, list[int] | None]:
        label = {name: data for name, _, _, data in item.tensors}["label"]
        places, rows = item.row_places, item.device_rows
        if rows is None:
            return label.pinned, None, False, None
        read = np.frombuffer(memoryview(places), dtype=np.int64).tolist()
        return label.pinned, read, places.pinned, list(rows.positions)

    options = {"pipeline": train_pipeline(), "batch_size": 16, "num_threads": 2, "seed": 5}
    with stoker.Loader(dataset, device="cuda", decode="gpu", timeout=120, **options) as loader:
        recorder = RecordingNative(loader._native, note)
        loader._native = recorder  # type: ignore[assignment]
        labels = [batch["label"].cpu().numpy().copy() for batch in loader]
    with stoker.Loader(dataset, output="numpy", **options) as cpu:
        expected = [batch["label"].copy() for batch in cpu]
    assert len(labels) == len(expected)
    for got, want in zip(labels, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert all(label_pinned for label_pinned, _, _, _ in recorder.notes)
    with_rows = [n for n in recorder.notes if n[1] is not None]
    assert with_rows, "the lane built rows"
    for _, places, places_pinned, positions in with_rows:
        assert places == positions
        assert places_pinned


@pytest.mark.gpu
def test_pipes_in_green_contexts_give_the_same_batches(
    torch: Any, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``STOKER_GPU_DECODE_SMS`` runs each pipe in a green context of that many SMs: the bits
    are those of the primary context; a count the device cannot give stops ``decode="gpu"``
    with the variable named, and a count that is not one is refused by name."""
    plain, _ = device_epoch(dataset, "gpu")
    monkeypatch.setenv("STOKER_GPU_DECODE_SMS", "16")
    green, stats = device_epoch(dataset, "gpu")
    assert stats["gpu_decode"]["rows"] > 0, stats["gpu_decode"]
    for (a, a_labels), (b, b_labels) in zip(plain, green, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a_labels, b_labels)
    for wrong in ("100000", "sixteen"):
        monkeypatch.setenv("STOKER_GPU_DECODE_SMS", wrong)
        with pytest.raises(stoker.GpuUnavailableError, match="STOKER_GPU_DECODE_SMS"):
            device_epoch(dataset, "gpu")


NORMALIZE = ops.Normalize(vision.IMAGENET_MEAN, vision.IMAGENET_STD)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("tail_ops", "dtype", "memory_format", "expected"),
    [
        ([NORMALIZE], "bfloat16", "channels_last", "bfloat16"),
        ([NORMALIZE], None, None, "float32"),  # NCHW planes
        ([NORMALIZE], "float16", "channels_last", "float16"),
        ([NORMALIZE, ops.ToTensor("NHWC", "float32")], None, None, "float32"),
        ([ops.ToTensor("NCHW", "uint8")], None, None, "uint8"),  # planes of bytes
    ],
)
def test_the_lanes_kernel_applying_the_tail_gives_the_stages_batches(
    torch: Any,
    dataset: Path,
    monkeypatch: pytest.MonkeyPatch,
    tail_ops: list[ops.Op],
    dtype: str | None,
    memory_format: str | None,
    expected: str,
) -> None:
    """``STOKER_GPU_DECODE_FUSED_TAIL=1``: the lane's crop kernel writes the normalised rows
    itself (channel planes for contiguous NCHW), and the stage only copies them into place.
    Under ``"gpu"`` and under ``"auto"`` (whose batches mix the lane's rows with the CPU's) the
    batches have the stage's shape, strides and dtype, and values equal within one rounding of
    the dtype (the kernel's multiply-add is one fused operation; torch's addcmul may round
    twice); a value other than 0 or 1 stops ``decode="gpu"`` with the variable named."""
    # One unit in the last place, relative to the value (at most); bytes are exact.
    eps = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-22, "uint8": 0.0}[expected]
    options = {
        "pipeline": [*train_pipeline()[:-1], *tail_ops],
        "batch_size": 16,
        "num_threads": 2,
        "seed": 5,
        "device": "cuda",
        "dtype": dtype,
        "memory_format": memory_format,
        "timeout": 120,
    }

    def epoch(decode: str) -> tuple[list[Any], dict[str, Any]]:
        with stoker.Loader(dataset, decode=decode, **options) as loader:
            images = []
            for batch in loader:
                image = batch["image"]
                assert str(image.dtype) == f"torch.{expected}"
                images.append((image.stride(), image.float().cpu().numpy()))
            return images, loader.stats()

    for decode in ("gpu", "auto"):
        monkeypatch.delenv("STOKER_GPU_DECODE_FUSED_TAIL", raising=False)
        plain, plain_stats = epoch(decode)
        assert plain_stats["gpu_decode"]["rows_dtype"] == "uint8"
        assert not plain_stats["gpu_decode"]["tail_fused"]
        monkeypatch.setenv("STOKER_GPU_DECODE_FUSED_TAIL", "1")
        fused, stats = epoch(decode)
        assert stats["gpu_decode"]["rows"] > 0, stats["gpu_decode"]
        assert stats["gpu_decode"]["rows_dtype"] == expected
        assert stats["gpu_decode"]["tail_fused"]
        differing = 0
        for (plain_strides, a), (fused_strides, b) in zip(plain, fused, strict=True):
            assert plain_strides == fused_strides
            np.testing.assert_allclose(b, a, rtol=eps, atol=1e-6, err_msg=decode)
            differing += int(np.count_nonzero(a != b))
        print(f"fused tail, {decode}, {expected}: {differing} values differ from the stage's")
    monkeypatch.setenv("STOKER_GPU_DECODE_FUSED_TAIL", "yes")
    with pytest.raises(stoker.GpuUnavailableError, match="STOKER_GPU_DECODE_FUSED_TAIL"):
        epoch("gpu")


@pytest.mark.gpu
def test_decoding_only_the_crop_window_gives_the_whole_images_rows(
    torch: Any, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``STOKER_GPU_DECODE_ROI=1``: on nvJPEG's hardware backend the engines decode each
    RandomResizedCrop window alone, grown to whole MCUs, and the batches equal those of whole
    decodes but for the resize's rounding (its filter placed in the region's coordinates): the
    same labels, the same rows built on the GPU, every image within a tenth of a grey level on
    average. Elsewhere the lane decodes whole images and says so (``roi`` False). A pipeline
    that resizes before it crops is decoded whole; a value other than 0 or 1 stops the lane."""
    monkeypatch.delenv("STOKER_GPU_DECODE_ROI", raising=False)
    whole, whole_stats = device_epoch(dataset, "gpu")
    assert not whole_stats["gpu_decode"]["roi"], whole_stats["gpu_decode"]
    assert whole_stats["gpu_decode"]["roi_rows"] == 0
    monkeypatch.setenv("STOKER_GPU_DECODE_ROI", "1")
    by_region, stats = device_epoch(dataset, "gpu")
    lane = stats["gpu_decode"]
    if lane["hardware"]:
        assert lane["roi"] and lane["roi_rows"] > 0, lane
    else:
        assert not lane["roi"] and lane["roi_rows"] == 0, lane
    assert lane["rows"] == whole_stats["gpu_decode"]["rows"], (lane, whole_stats["gpu_decode"])
    image_means, largest = [], 0
    for (a, a_labels), (b, b_labels) in zip(whole, by_region, strict=True):
        np.testing.assert_array_equal(a_labels, b_labels)
        diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
        image_means.extend(diff.reshape(diff.shape[0], -1).mean(axis=1).tolist())
        largest = max(largest, int(diff.max()))
    print(
        f"region decode: {lane['roi_rows']} rows by region, mean abs diff "
        f"{np.mean(image_means):.4f}, worst image {max(image_means):.4f}, largest {largest}"
    )
    assert max(image_means) <= 0.1, max(image_means)

    # Resize before the crop: the filter reads past any window, so nothing is decoded by region.
    eval_pipeline = [ops.DecodeImage(dct_scaling=False), *vision.imagenet_eval(CROP)[1:]]
    _, eval_stats = device_epoch(dataset, "gpu", pipeline=eval_pipeline)
    assert eval_stats["gpu_decode"]["rows"] > 0 and eval_stats["gpu_decode"]["roi_rows"] == 0

    monkeypatch.setenv("STOKER_GPU_DECODE_ROI", "yes")
    with pytest.raises(stoker.GpuUnavailableError, match="STOKER_GPU_DECODE_ROI"):
        device_epoch(dataset, "gpu")


@pytest.mark.gpu
def test_places_the_decode_left_unwritten_are_found_and_built_on_the_cpu(
    torch: Any, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``STOKER_GPU_DECODE_FAULT_EVERY=1`` poisons every place again after nvJPEG wrote it, as
    a decode that reported success without writing would leave it: the lane finds each by its
    sentinel and builds the row on the CPU, whose bytes replace the device row (copied on the
    pipe's stream before the rows' ready event), so the batches are the CPU path's bit for bit;
    with the tail fused in, the replaced rows are made on the host, within one rounding of the
    stage's."""
    monkeypatch.setenv("STOKER_GPU_DECODE_FAULT_EVERY", "1")
    cpu, _ = device_epoch(dataset, "cpu")
    faulted, stats = device_epoch(dataset, "gpu")
    lane = stats["gpu_decode"]
    assert lane["rows"] == 0 and lane["fallback_rows"] > 0, lane
    for (a, a_labels), (b, b_labels) in zip(cpu, faulted, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a_labels, b_labels)

    options = {
        "pipeline": [
            *train_pipeline()[:-1],
            ops.Normalize(vision.IMAGENET_MEAN, vision.IMAGENET_STD),
        ],
        "batch_size": 16,
        "num_threads": 2,
        "seed": 5,
        "device": "cuda",
        "dtype": "bfloat16",
        "memory_format": "channels_last",
        "timeout": 120,
    }

    def epoch(decode: str) -> tuple[list[Any], dict[str, Any]]:
        with stoker.Loader(dataset, decode=decode, **options) as loader:
            return [batch["image"].float().cpu().numpy() for batch in loader], loader.stats()

    monkeypatch.setenv("STOKER_GPU_DECODE_FUSED_TAIL", "1")
    stage, _ = epoch("cpu")
    fused, stats = epoch("gpu")
    lane = stats["gpu_decode"]
    assert lane["tail_fused"] and lane["rows_dtype"] == "bfloat16", lane
    assert lane["fallback_rows"] > 0, lane
    for a, b in zip(stage, fused, strict=True):
        np.testing.assert_allclose(b, a, rtol=2.0**-7, atol=1e-6)


@pytest.mark.gpu
def test_the_lane_in_a_helper_process_gives_the_lanes_batches_and_its_kill_costs_nothing(
    torch: Any, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``STOKER_GPU_DECODE_HELPER`` naming ``stoker-lane-helper`` runs the lane in a process of
    its own: its rows reach this process through CUDA IPC (its buffers, copied here as each
    answer comes), and the batches are the in-process lane's bit for bit (the same nvJPEG and
    kernel), also with the ``stoker-lane-helper`` command the wheel installs (the same helper
    through the package's native module); places its decode left unwritten are replaced by the
    CPU's. Killed mid-epoch, the
    helper costs the run nothing: every batch is the lane's or the CPU's, the last ones the
    CPU's, this process's CUDA context still works, and ``stats()`` names the loss."""
    import signal

    in_process, _ = device_epoch(dataset, "gpu")
    cpu, _ = device_epoch(dataset, "cpu")
    monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", str(daemon_binary("stoker-lane-helper")))
    helped, stats = device_epoch(dataset, "gpu")
    lane = stats["gpu_decode"]
    assert lane["helper"]["on_device"] and lane["helper"]["lost"] is None, lane
    assert lane["rows"] > 0 and lane["staging_bytes"] > 0, lane
    for (a, a_labels), (b, b_labels) in zip(in_process, helped, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a_labels, b_labels)
    # The wheel's command: found by "1" where pip put it, or beside the package after
    # `pip install --target` (as benches/gpu/install.sh installs it).
    beside = Path(stoker.__file__).parent.parent / "bin" / "stoker-lane-helper"
    monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", str(beside) if beside.is_file() else "1")
    commanded, stats = device_epoch(dataset, "gpu")
    assert stats["gpu_decode"]["helper"]["on_device"], stats["gpu_decode"]
    for (a, _), (b, _) in zip(in_process, commanded, strict=True):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", str(daemon_binary("stoker-lane-helper")))
    # Places the helper's decode left unwritten (the fault hook, in the helper's environment)
    # come back as device rows the CPU's replace: put over the copy here, the CPU's bit for bit.
    monkeypatch.setenv("STOKER_GPU_DECODE_FAULT_EVERY", "1")
    faulted, stats = device_epoch(dataset, "gpu")
    monkeypatch.delenv("STOKER_GPU_DECODE_FAULT_EVERY")
    lane = stats["gpu_decode"]
    assert lane["rows"] == 0 and lane["fallback_rows"] > 0, lane
    for (a, _), (b, _) in zip(cpu, faulted, strict=True):
        np.testing.assert_array_equal(a, b)

    options = {
        "pipeline": train_pipeline(),
        "batch_size": 16,
        "num_threads": 2,
        "seed": 5,
        "device": "cuda",
        "decode": "gpu",
        "timeout": 120,
    }
    got = []
    with stoker.Loader(dataset, **options) as loader:
        for k, batch in enumerate(loader):
            got.append(batch["image"].cpu().numpy().copy())
            if k == 2:
                os.kill(loader.stats()["gpu_decode"]["helper"]["pid"], signal.SIGKILL)
        stats = loader.stats()
    lost = stats["gpu_decode"]["helper"]["lost"]
    assert lost is not None and "signal: 9" in lost, stats["gpu_decode"]
    assert len(got) == len(cpu)
    for k, (batch, (lane_batch, _), (cpu_batch, _)) in enumerate(
        zip(got, in_process, cpu, strict=True)
    ):
        assert np.array_equal(batch, lane_batch) or np.array_equal(batch, cpu_batch), k
    np.testing.assert_array_equal(got[-1], cpu[-1][0])
    # This process's context is untouched.
    x = torch.ones(1024, device="cuda") * 2
    torch.cuda.synchronize()
    assert float(x.sum()) == 2048.0

    monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", "/no/such/helper")
    with pytest.raises(ValueError, match="STOKER_GPU_DECODE_HELPER=/no/such/helper: not a file"):
        stoker.Loader(dataset, **options)


def auto_options(seed: int) -> dict[str, Any]:
    """A small decode="auto" loader's arguments on the GPU."""
    return {
        "pipeline": train_pipeline(),
        "batch_size": 16,
        "num_threads": 2,
        "seed": seed,
        "device": "cuda",
        "decode": "auto",
        "timeout": 120,
    }


@pytest.mark.gpu
def test_two_auto_runs_with_one_seed_give_one_digest(torch: Any, dataset: Path) -> None:
    options = auto_options(seed=11)
    digests = []
    for _ in range(2):
        with stoker.Loader(dataset, **options) as loader:
            # The first point starts half and half, whatever the machine; the epoch (8 steps of
            # 16 images) ends before the next point could change it.
            assert loader.state_dict()["decode_split"] == [0, 8]
            digests.append(epoch_digest(loader))
            lane = loader.stats()["gpu_decode"]
            assert lane["rows"] > 0 and lane["cpu_rows_per_s"] > 0, lane
    assert digests[0] == digests[1]
    # The split differs from "cpu" and from "gpu": some rows of each batch on each side.
    with stoker.Loader(dataset, **{**options, "decode": "cpu"}) as cpu:
        assert epoch_digest(cpu) != digests[0]


@pytest.mark.gpu
def test_a_resumed_auto_run_gets_the_saved_split(torch: Any, dataset: Path) -> None:
    options = auto_options(seed=2)
    with stoker.Loader(dataset, **options) as first:
        it = iter(first)
        next(it)
        state = first.state_dict()
        expected = next(it)["image"].cpu().numpy().copy()
    state["decode_split"] = [state["epoch"], 12]
    with stoker.Loader(dataset, **options) as resumed:
        resumed.load_state_dict(state)
        got = next(iter(resumed))["image"].cpu().numpy()
        assert resumed.state_dict()["decode_split"] == [state["epoch"], 12]
    # Another split changes which rows the GPU decoded: the images differ by the decoders'
    # rounding and chroma upsampling only (full-size decodes on both sides here).
    assert np.abs(expected.astype(np.int16) - got).mean() < MEAN_ABS_BOUND


def splits_by_step(
    loader: stoker.Loader,
) -> tuple[dict[int, int], list[Any], dict[int, dict[str, Any]]]:
    """One epoch of ``loader``: the split in force at each step and the state saved there
    (``state_dict()`` before the step's batch), and the images, copied to the host."""
    splits, images, states = {}, [], {}
    it = iter(loader)
    while True:
        state = loader.state_dict()
        try:
            batch = next(it)
        except StopIteration:
            return splits, images, states
        splits[state["step"]] = state["decode_split"][1]
        states[state["step"]] = state
        images.append(batch["image"].cpu().numpy().copy())


@pytest.mark.gpu
def test_auto_changes_its_split_only_at_fixed_points(torch: Any, dataset: Path) -> None:
    # Batches of 4: 30 steps an epoch, so the second point (step 16) falls inside it.
    options = {**auto_options(seed=3), "batch_size": 4}
    with stoker.Loader(dataset, **options) as loader:
        splits, images, states = splits_by_step(loader)
        # After the epoch's last batch the next batch is the next epoch's first.
        last = loader.state_dict()["decode_split"]
        assert last[0] == 1, last
    # A closed loader's state still has it.
    assert loader.state_dict()["decode_split"] == last
    assert sorted(splits) == list(range(30))
    assert {splits[s] for s in range(16)} == {8}, splits
    assert len({splits[s] for s in range(16, 30)}) == 1, splits
    # Resumed from the state saved at step 20, the rest of the epoch has the run's split and
    # bits (a split set by hand instead gives other rows to the GPU, so other bits).
    state = states[20]
    assert state["decode_split"] == [0, splits[20]]
    for split in (state["decode_split"][1], (state["decode_split"][1] + 8) % 16 or 4):
        with stoker.Loader(dataset, **options) as resumed:
            resumed.load_state_dict({**state, "decode_split": [0, split]})
            resumed_splits, resumed_images, _ = splits_by_step(resumed)
            assert resumed_splits == {s: split for s in range(20, 30)}
            lane = resumed.stats()["gpu_decode"]
            # Each batch of 4 offers floor(4 split / 16) rows to the lane (built on the CPU
            # when the engines decline them); the next epoch's first batches, started ahead,
            # may add theirs.
            offered = lane["rows"] + lane["declined_rows"] + lane["fallback_rows"]
            assert offered >= 10 * (4 * split // 16), lane
        same = all(np.array_equal(a, b) for a, b in zip(images[20:], resumed_images, strict=True))
        assert same == (split == state["decode_split"][1]), split


@pytest.fixture
def huge_root(dataset: Path, tmp_path: Path) -> Path:
    """One class: 20 of the dataset's JPEGs and 3 of 6000x6000 pixels."""
    from PIL import Image

    root = tmp_path / "huge"
    one_class(root, dataset, 20, "{:03}.jpg")
    gradient = np.linspace(0, 255, 6000, dtype=np.uint8)
    big = np.stack([np.tile(gradient, (6000, 1))] * 3, axis=-1)
    for i in range(3):
        Image.fromarray(big).save(root / "a" / f"big{i}.jpg", quality=80)
    return root


@pytest.mark.gpu
def test_huge_jpegs_keep_the_lane_under_its_cap(torch: Any, huge_root: Path) -> None:
    cap = 128 << 20
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info()[0]
    lane_images, stats = device_epoch(
        huge_root, "gpu", batch_size=4, gpu_memory=cap, pipeline=train_pipeline()
    )
    lane = stats["gpu_decode"]
    assert lane["memory_cap"] == cap
    assert lane["memory_bytes"] <= cap, lane
    # 6000x6000x3 bytes decoded do not fit a third of the cap: those go to the CPU.
    assert lane["declined_rows"] >= 3, lane
    assert lane["rows"] >= 1, lane
    assert len(lane_images) == 6
    # Closed: the lane's memory is back once the last batch's copies are done (the slots go
    # back to their pool on the fence thread).
    deadline = time.monotonic() + 5
    while True:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free_after = torch.cuda.mem_get_info()[0]
        if free_after >= free_before - (8 << 20) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print(f"device memory still held after close: {free_before - free_after} bytes")
    assert free_after >= free_before - (8 << 20), (free_before, free_after)


def test_a_malformed_saved_split_is_refused(dataset: Path) -> None:
    base = cpu_options()
    with stoker.Loader(dataset, **base) as plain:
        state = plain.state_dict()
    with stoker.Loader(dataset, decode="auto", **base) as resumed:
        for wrong in (12, [0], [0, 1, 2], "08", [0, 17], [-1, 4]):
            with pytest.raises(ValueError, match="decode_split"):
                resumed.load_state_dict({**state, "decode_split": wrong})


def test_each_rank_resumes_with_its_own_states_split(dataset: Path) -> None:
    ranks = [cpu_options() | {"rank": r, "world_size": 2} for r in range(2)]
    states = []
    for rank, options in enumerate(ranks):
        with stoker.Loader(dataset, **options) as loader:
            states.append({**loader.state_dict(), "decode_split": [0, 4 + rank]})
    for rank, options in enumerate(ranks):
        with stoker.Loader(dataset, **options) as loader:
            saved = _resume.read_states(states, loader.state_dict())
            assert saved.decode_split == (0, 4 + rank)
            # One state alone resumes any rank, with that state's split.
            assert _resume.read_states(states[0], loader.state_dict()).decode_split == (0, 4)


def test_the_split_saved_after_an_epoch_is_the_next_epochs() -> None:
    position = _resume.Position(epoch=3, step=7)
    assert position.next_batch(8) == (3, 7)
    position.step = 8
    assert position.next_batch(8) == (4, 0)


def test_a_saved_split_is_ignored_without_a_lane(dataset: Path) -> None:
    base = cpu_options()
    with stoker.Loader(dataset, **base) as plain:
        it = iter(plain)
        next(it)
        state = plain.state_dict()
        expected = next(it)["image"].copy()
    # A state saved by a run with a GPU lane resumes on a machine without one.
    state["decode_split"] = [state["epoch"], 12]
    with stoker.Loader(dataset, decode="auto", **base) as resumed:
        resumed.load_state_dict(state)
        np.testing.assert_array_equal(next(iter(resumed))["image"], expected)
        assert "decode_split" not in resumed.state_dict()


# -- hostile JPEGs (the Rust generator's set, `gpu/src/decode/hostile.rs`, written
# with Pillow: 12-bit samples and arithmetic coding, which Pillow does not write, are patched
# into a baseline file's frame header) ----------------------------------------------------------


def jpeg_markers(data: bytes) -> list[tuple[int, int, int]]:
    """(code, start, end) of each marker segment; the scan's ends with its entropy-coded data."""
    found = [(0xD8, 0, 2)]
    at = 2
    while at + 1 < len(data):
        code = data[at + 1]
        if code == 0xD9:
            found.append((code, at, at + 2))
            break
        end = at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")
        if code == 0xDA:
            while not (
                data[end] == 0xFF and data[end + 1] != 0 and not 0xD0 <= data[end + 1] <= 0xD7
            ):
                end += 1
        found.append((code, at, end))
        at = end
    return found


def jpeg_segment(data: bytes, code: int) -> tuple[int, int]:
    return next((start, end) for c, start, end in jpeg_markers(data) if c == code)


def scan_data(data: bytes) -> tuple[int, int]:
    start, end = jpeg_segment(data, 0xDA)
    return start + 2 + int.from_bytes(data[start + 2 : start + 4], "big"), end


def resized_frame(data: bytes, width: int, height: int) -> bytes:
    start, end = jpeg_segment(data, 0xC0)
    frame = bytearray(data[start:end])
    frame[5:7] = height.to_bytes(2, "big")
    frame[7:9] = width.to_bytes(2, "big")
    return bytes(frame)


def cut_scan(data: bytes) -> bytes:
    """The scan cut in the middle, the end marker appended."""
    first, end = scan_data(data)
    cut = first + (end - first) // 2
    while data[cut - 1] == 0xFF:
        cut += 1
    return data[:cut] + b"\xff\xd9"


def flip_scan(data: bytes, seed: int, flips: int = 6) -> bytes:
    """Bits flipped in the scan data with every marker intact (no byte becomes or follows
    0xFF)."""
    first, end = scan_data(data)
    out = bytearray(data)
    rng = np.random.default_rng(seed)
    done = 0
    for at in rng.permutation(np.arange(first + 4, end - 4)):
        bit = 1 << int(rng.integers(8))
        if 0xFF not in (out[at], out[at] ^ bit, out[at - 1]):
            out[at] ^= bit
            done += 1
        if done == flips:
            break
    return bytes(out)


def ones_in_scan(data: bytes) -> bytes:
    """Bits flipped to ones in the middle of the scan data (0xFE, never a marker): no code of
    the standard Huffman tables, which libjpeg-turbo reports."""
    first, end = scan_data(data)
    middle = (first + end) // 2
    return data[: middle - 6] + b"\xfe" * 12 + data[middle + 6 :]


def hostile_set(dataset: Path) -> dict[str, bytes]:
    """The hostile files, by name, from one of the generated images."""
    from PIL import Image

    source = Image.open(sorted(dataset.rglob("*.jpg"))[0]).convert("RGB").resize((64, 48))

    def encode(image: Any, **options: Any) -> bytes:
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90, **options)
        return out.getvalue()

    valid = encode(source)
    restarts = encode(source, restart_marker_rows=1)
    frame_start, frame_end = jpeg_segment(valid, 0xC0)
    data_end = scan_data(valid)[1]
    twelve = bytearray(valid)
    twelve[frame_start + 4] = 12
    arithmetic = bytearray(valid)
    arithmetic[frame_start + 1] = 0xC9
    disordered = bytearray(restarts)
    first = scan_data(restarts)[0]
    second = [
        i
        for i in range(first, len(restarts) - 1)
        if restarts[i] == 0xFF and 0xD0 <= restarts[i + 1] <= 0xD7
    ][1]
    disordered[second + 1] = 0xD5
    return {
        "valid_420": valid,
        "restart_markers": restarts,
        "two_frames": valid[:frame_end] + resized_frame(valid, 4000, 3000) + valid[frame_end:],
        "stray_soi": valid[:frame_start] + b"\xff\xd8" + valid[frame_start:],
        "frame_after_scan": valid[:data_end] + resized_frame(valid, 4000, 3000) + valid[data_end:],
        "side_65500": encode(source.resize((65500, 8))),
        "precision_12": bytes(twelve),
        "cmyk": encode(source.convert("CMYK")),
        "arithmetic": bytes(arithmetic),
        "progressive": encode(source, progressive=True),
        "restarts_out_of_order": bytes(disordered),
        "truncated_scan": cut_scan(valid),
        "truncated_restart_scan": cut_scan(restarts),
        "bit_flipped_scan": ones_in_scan(valid),
        "image_after_end": valid + valid,
    }


def epoch_with_bad_samples(
    root: Path, decode: str, **overrides: Any
) -> tuple[list[Any], list[tuple[str, int, int | None]], dict[str, Any]]:
    """One epoch on cuda:0 with ``decode``: each batch's images and labels (on the host), the
    bad samples reported (file name, sample index, substitute index), and the stats."""
    options: dict[str, Any] = {
        "pipeline": train_pipeline(),
        "batch_size": 4,
        "num_threads": 2,
        "seed": 9,
        "device": "cuda",
        "decode": decode,
        "timeout": 120,
    }
    options.update(overrides)
    with stoker.Loader(root, **options) as loader:
        iterator = iter(loader)
        batches, bad = [], []
        for batch in iterator:
            batches.append(
                (batch["image"].cpu().numpy().copy(), batch["label"].cpu().numpy().copy())
            )
            bad.extend(
                (Path(b["path"]).name, b["sample_index"], b.get("substitute_index"))
                for b in iterator.bad_samples
            )
        return batches, sorted(bad), loader.stats()


@pytest.fixture
def hostile_root(dataset: Path, tmp_path: Path) -> Path:
    """One class of the hostile set beside 9 plain JPEGs."""
    root = tmp_path / "hostile"
    one_class(root, dataset, 9, "plain{}.jpg")
    for name, data in hostile_set(dataset).items():
        (root / "a" / f"{name}.jpg").write_bytes(data)
    return root


@pytest.mark.gpu
def test_hostile_jpegs_never_break_the_cuda_context(torch: Any, hostile_root: Path) -> None:
    started = time.monotonic()
    cpu, cpu_bad, _ = epoch_with_bad_samples(hostile_root, "cpu")
    lane, lane_bad, stats = epoch_with_bad_samples(hostile_root, "gpu")
    # The process's context is usable: a torch op on the device runs and returns.
    assert float(torch.ones(64, device="cuda").sum().item()) == 64.0
    torch.cuda.synchronize()
    print(f"hostile set through decode='gpu' and 'cpu': {time.monotonic() - started:.1f} s")
    lane_stats = stats["gpu_decode"]
    print(f"lane: {lane_stats}")
    # Each file was built on the GPU or by the CPU path, as the CPU would: the same bad
    # samples, the same labels, the same pixels within the bound.
    assert lane_bad == cpu_bad
    assert lane_stats["rows"] >= 2, lane_stats  # the valid files, the plain ones
    for (cpu_image, cpu_label), (gpu_image, gpu_label) in zip(cpu, lane, strict=True):
        np.testing.assert_array_equal(cpu_label, gpu_label)
        per_image = np.abs(cpu_image.astype(np.int16) - gpu_image).mean(axis=(1, 2, 3))
        assert per_image.max() < IMAGE_MEAN_ABS_BOUND, per_image


@pytest.fixture
def damaged_root(dataset: Path, tmp_path: Path) -> Path:
    """32 generated JPEGs, 3 with random bits flipped in their scan data, 3 with a run of bits
    flipped to ones there, and 2 cut short inside it with the end marker kept, in two
    classes."""
    root = tmp_path / "damaged"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    for i, source in enumerate(sorted(dataset.rglob("*.jpg"))[:32]):
        data = source.read_bytes()
        if i < 3:
            data, name = flip_scan(data, seed=i, flips=24), f"{i:03}_flipped.jpg"
        elif i < 6:
            data, name = ones_in_scan(data), f"{i:03}_ones.jpg"
        elif i < 8:
            data, name = cut_scan(data), f"{i:03}_cut.jpg"
        else:
            name = f"{i:03}.jpg"
        (root / ("a" if i % 2 else "b") / name).write_bytes(data)
    return root


@pytest.mark.gpu
def test_damaged_scans_are_the_same_bad_samples_under_every_split(
    torch: Any, damaged_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same files are bad samples, with the same substitutes, under ``"cpu"``, ``"gpu"``,
    ``"auto"``, and ``"gpu"`` with region decoding (``STOKER_GPU_DECODE_ROI=1``: the engines
    must find damage outside the window they decode, as libjpeg-turbo does)."""
    runs = {}
    monkeypatch.delenv("STOKER_GPU_DECODE_ROI", raising=False)
    for decode in ("cpu", "gpu", "auto", "gpu-roi"):
        if decode == "gpu-roi":
            monkeypatch.setenv("STOKER_GPU_DECODE_ROI", "1")
        started = time.monotonic()
        runs[decode] = epoch_with_bad_samples(damaged_root, decode.removesuffix("-roi"))
        print(
            f"decode={decode!r}: {time.monotonic() - started:.1f} s, "
            f"bad {[b[0] for b in runs[decode][1]]}, lane {runs[decode][2]['gpu_decode']}"
        )
    cpu_batches, cpu_bad, cpu_stats = runs["cpu"]
    # libjpeg-turbo finds the cut scans and most flipped ones (a flip may land where the
    # Huffman code stays valid: then no decoder can tell, and none reports it).
    assert any("_cut" in name for name, _, _ in cpu_bad), cpu_bad
    assert any("_ones" in name for name, _, _ in cpu_bad), cpu_bad
    for decode in ("gpu", "auto", "gpu-roi"):
        batches, bad, stats = runs[decode]
        assert bad == cpu_bad, decode
        assert stats["bad_samples"] == cpu_stats["bad_samples"], decode
        # The same substitutes in the same rows: the labels match batch by batch.
        for (cpu_image, cpu_label), (image, label) in zip(cpu_batches, batches, strict=True):
            np.testing.assert_array_equal(cpu_label, label)
            per_image = np.abs(cpu_image.astype(np.int16) - image).mean(axis=(1, 2, 3))
            assert per_image.max() < IMAGE_MEAN_ABS_BOUND, (decode, per_image)
