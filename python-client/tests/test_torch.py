"""The torch output path: tensors share the slot's memory and carry the right dtypes.

Skipped, with the reason, where torch cannot be imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import stoker
from conftest import SMALL_CROP, torch_or_skip


class RecordingNative:
    """Stands in for a loader's native handle and remembers the Buffers of the last batch.

    A torch tensor made by ``torch.from_numpy`` hides the array it views, so the test takes
    the Buffers on their way in to compare addresses.
    """

    def __init__(self, native: Any) -> None:
        self._native = native
        self.buffers: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def next_batch(self) -> Any:
        item = self._native.next_batch()
        if item is not None:
            self.buffers = {name: data for name, _, _, data in item.tensors}
        return item


def test_torch_tensors_share_the_slot(make_loader: Callable[..., stoker.Loader]) -> None:
    torch = torch_or_skip()
    loader = make_loader(output="torch", batch_size=8)
    recorder = RecordingNative(loader._native)
    loader._native = recorder  # type: ignore[assignment]
    batch = next(iter(loader))
    image, label = batch["image"], batch["label"]
    assert isinstance(image, torch.Tensor) and isinstance(label, torch.Tensor)
    assert image.dtype == torch.uint8 and tuple(image.shape) == (8, SMALL_CROP, SMALL_CROP, 3)
    assert label.dtype == torch.int64 and tuple(label.shape) == (8,)
    for name, tensor in batch.items():
        assert tensor.data_ptr() == recorder.buffers[name].address, name


def test_default_output_is_torch_when_importable(make_loader: Callable[..., stoker.Loader]) -> None:
    torch = torch_or_skip()
    assert isinstance(next(iter(make_loader(output=None)))["image"], torch.Tensor)


def test_torch_and_numpy_outputs_hold_the_same_values(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    torch_or_skip()
    as_torch = next(iter(make_loader(output="torch", seed=4)))
    as_numpy = next(iter(make_loader(output="numpy", seed=4)))
    for name in as_numpy:
        assert (as_torch[name].numpy() == as_numpy[name]).all()


def test_float_pipeline_to_torch(make_loader: Callable[..., stoker.Loader]) -> None:
    torch = torch_or_skip()
    pipeline = [
        stoker.ops.CenterCrop(16),
        stoker.ops.Normalize(stoker.vision.IMAGENET_MEAN, stoker.vision.IMAGENET_STD),
    ]
    image = next(iter(make_loader(output="torch", pipeline=pipeline, batch_size=4)))["image"]
    assert image.dtype == torch.float32 and tuple(image.shape) == (4, 3, 16, 16)
    # The tensor is a normal one: the training side can convert it in place.
    image.mul_(2)


def test_a_torch_tensor_kept_alive_holds_its_slot(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    torch_or_skip()
    loader = make_loader(output="torch", prefetch=1, max_held_batches=1, timeout=1, batch_size=8)
    iterator = iter(loader)
    # The image is what fills a slot; a tensor of it alone keeps the slot taken.
    kept = [next(iterator)["image"], next(iterator)["image"]]
    with pytest.raises(stoker.LoaderTimeoutError, match="held"):
        next(iterator)
    kept.clear()
    assert next(iterator)["image"].shape[0] == 8
