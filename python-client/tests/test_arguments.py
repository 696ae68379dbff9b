"""Loader arguments: every bad one is refused with a clear exception before any work starts."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stoker
from stoker import ops


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        # The range said is the one taken (it said 1..=2**32-1).
        ({"batch_size": 65537}, r"batch_size must be an int in 1\.\.=65536"),
        ({"shuffle": 1}, "shuffle"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"drop_last": "no"}, "drop_last"),
        ({"num_threads": 0}, "num_threads"),
        ({"num_threads": -2}, "num_threads"),
        ({"rank": -1}, "rank"),
        ({"rank": 2, "world_size": 2}, "out of range"),
        ({"world_size": 0}, "world_size"),
        ({"prefetch": 0}, "prefetch"),
        ({"prefetch": "lots"}, "prefetch"),
        ({"output": "jax"}, "output"),
        ({"on_error": "ignore"}, "on_error"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": 1e20}, "timeout"),
        ({"worker_grace": 1e20}, "worker_grace"),
        ({"max_held_batches": 0}, "max_held_batches"),
        ({"address": "grpc://coordinator:7070"}, "host:port"),
        ({"pipeline": [ops.Resize(64)]}, "Resize alone"),
        ({"pipeline": "imagenet_train"}, "pipeline"),
    ],
)
def test_bad_arguments_raise_value_errors(
    make_loader: Callable[..., stoker.Loader], overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_loader(**overrides)


@pytest.mark.parametrize(
    ("name", "alternative"),
    [
        ("num_workers", "num_threads"),
        ("sampler", "shuffle, seed, rank and world_size"),
        ("batch_sampler", "batch_size and drop_last"),
        ("collate_fn", "dict of tensors"),
        ("pin_memory_device", "device='cuda:N'"),
        ("worker_init_fn", "no worker processes"),
        ("persistent_workers", "close"),
        ("prefetch_factor", "prefetch="),
        ("generator", "seed="),
        ("dataset", "Loader.from_dataset"),
        ("transform", "Loader.from_dataset"),
    ],
)
def test_dataloader_only_arguments_name_the_alternative(
    make_loader: Callable[..., stoker.Loader], name: str, alternative: str
) -> None:
    with pytest.raises(ValueError, match=alternative) as raised:
        make_loader(**{name: 2})
    assert name in str(raised.value)


def test_device_cpu_is_host_delivery(make_loader: Callable[..., stoker.Loader]) -> None:
    with make_loader(device="cpu") as loader:
        assert len(loader) > 0
    with pytest.raises(ValueError, match="device must be"):
        make_loader(device="tpu")


def test_unknown_keyword_is_a_type_error(make_loader: Callable[..., stoker.Loader]) -> None:
    with pytest.raises(TypeError, match="batchsize"):
        make_loader(batchsize=3)


def test_required_arguments() -> None:
    with pytest.raises(TypeError):
        stoker.Loader("/tmp", batch_size=4)  # type: ignore[call-arg]


def test_missing_source_is_file_not_found_naming_it(
    make_loader: Callable[..., stoker.Loader], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-folder"
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        make_loader(missing)
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        make_loader(f"file://{missing}")


def test_source_forms(make_loader: Callable[..., stoker.Loader], dataset: Path) -> None:
    assert (
        len(make_loader(f"file://{dataset}"))
        == len(make_loader(str(dataset)))
        == len(make_loader(dataset))
    )
    with pytest.raises(ValueError, match="gs:// sources are not supported"):
        make_loader("gs://bucket/train")
    with pytest.raises(ValueError, match="source must be a path"):
        make_loader(42)


def test_s3_uris_pass_the_path_check_and_reach_the_object_store_code(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    # Not a FileNotFoundError from the local-path check: the URI is parsed by the Rust side,
    # which names what is wrong with it (no network needed).
    with pytest.raises(ValueError, match="bucket name is empty"):
        make_loader("s3:///train")


def test_a_folder_without_images_is_a_dataset_error(
    make_loader: Callable[..., stoker.Loader], tmp_path: Path
) -> None:
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(stoker.DatasetError):
        make_loader(tmp_path)


def test_a_file_as_source_is_a_stoker_error(
    make_loader: Callable[..., stoker.Loader], tmp_path: Path
) -> None:
    file = tmp_path / "train.txt"
    file.write_text("not a folder")
    with pytest.raises((stoker.DatasetError, NotADirectoryError)):
        make_loader(file)


def test_output_torch_without_torch_is_an_import_error_with_a_hint(
    make_loader: Callable[..., stoker.Loader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry makes `import torch` raise ImportError, as on a machine without torch.
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="output='numpy'"):
        make_loader(output="torch")
    loader = make_loader(output=None)
    assert isinstance(next(iter(loader))["image"], __import__("numpy").ndarray)


def test_checks_run_before_the_source_is_touched(
    make_loader: Callable[..., stoker.Loader], tmp_path: Path
) -> None:
    # A bad pipeline is reported even when the folder is also missing: nothing was opened.
    with pytest.raises(ValueError, match="Resize alone"):
        make_loader(tmp_path / "missing", pipeline=[ops.Resize(8)])


def test_numpy_numbers_are_taken_as_pythons(make_loader: Callable[..., stoker.Loader]) -> None:
    """A seed or a size from a numpy array or a config parsed with numpy (they were refused as
    not ints, where ops took them)."""
    np = pytest.importorskip("numpy")
    loader = make_loader(
        batch_size=np.int64(4), seed=np.uint32(3), timeout=np.float32(5), prefetch=np.int8(2)
    )
    assert loader.batch_size == 4 and sum(1 for _ in loader) > 0
    assert stoker.vision.imagenet_train(np.int64(32)) == stoker.vision.imagenet_train(32)
    # 224 * 256 in an int16 wraps: the recipe computes in Python's ints.
    assert stoker.vision.imagenet_eval(np.int16(224)) == stoker.vision.imagenet_eval(224)
