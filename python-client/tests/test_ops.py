"""Pipeline ops and ready-made pipelines: argument and order checks, the dicts sent to Rust."""

from __future__ import annotations

from typing import Any

import pytest

from stoker import ops, vision
from stoker.ops import (
    CenterCrop,
    DecodeImage,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
    check_pipeline,
)


def test_sizes_accept_int_or_pair_like_torchvision() -> None:
    assert RandomResizedCrop(224).size == (224, 224)
    assert RandomResizedCrop((200, 300)).size == (200, 300)
    assert CenterCrop([7]).size == (7, 7)
    assert CenterCrop((5, 9)).to_dict() == {"op": "center_crop", "size": [5, 9]}


def test_to_dict_matches_the_native_contract() -> None:
    assert DecodeImage().to_dict() == {
        "op": "decode_image",
        "max_pixels": 0,
        "allow_dct_scaling": False,
    }
    assert DecodeImage(1000, dct_scaling=True).to_dict() == {
        "op": "decode_image",
        "max_pixels": 1000,
        "allow_dct_scaling": True,
    }
    assert RandomResizedCrop(8, scale=(0.5, 1), ratio=(1, 2)).to_dict() == {
        "op": "random_resized_crop",
        "size": [8, 8],
        "scale": [0.5, 1.0],
        "ratio": [1.0, 2.0],
    }
    assert Resize(256).to_dict() == {"op": "resize", "size": 256}
    assert RandomHorizontalFlip().to_dict() == {"op": "random_horizontal_flip", "p": 0.5}
    assert Normalize((0.5, 0.5, 0.5), [1, 2, 3]).to_dict() == {
        "op": "normalize",
        "mean": [0.5, 0.5, 0.5],
        "std": [1.0, 2.0, 3.0],
    }
    assert ToTensor("NCHW", "float32").to_dict() == {
        "op": "to_tensor",
        "layout": "NCHW",
        "dtype": "float32",
    }


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: DecodeImage(max_pixels=0), "max_pixels"),
        (lambda: DecodeImage(max_pixels=-5), "max_pixels"),
        (lambda: DecodeImage(max_pixels=1.5), "max_pixels"),
        (lambda: DecodeImage(dct_scaling="yes"), "dct_scaling"),
        (lambda: RandomResizedCrop(0), "size"),
        (lambda: RandomResizedCrop(16_385), "1..=16384"),
        (lambda: RandomResizedCrop((10, 0)), "width"),
        (lambda: RandomResizedCrop((1, 2, 3)), "size"),
        (lambda: RandomResizedCrop("224"), "size"),
        (lambda: RandomResizedCrop(True), "size"),
        (lambda: RandomResizedCrop(8, scale=(0.9, 0.1)), "scale"),
        (lambda: RandomResizedCrop(8, scale=(0.1, 1.5)), "scale"),
        (lambda: RandomResizedCrop(8, scale=(-0.1, 0.5)), "scale"),
        (lambda: RandomResizedCrop(8, scale=(0.1, float("nan"))), "scale"),
        (lambda: RandomResizedCrop(8, scale=0.5), "scale"),
        (lambda: RandomResizedCrop(8, ratio=(0, 1)), "ratio"),
        (lambda: RandomResizedCrop(8, ratio=(2, 1)), "ratio"),
        (lambda: Resize(0), "Resize size"),
        (lambda: Resize((224, 224)), "Resize size"),
        (lambda: CenterCrop(-1), "CenterCrop size"),
        (lambda: RandomHorizontalFlip(1.5), "p"),
        (lambda: RandomHorizontalFlip(-0.1), "p"),
        (lambda: RandomHorizontalFlip("0.5"), "p"),
        (lambda: Normalize((0.5, 0.5), (1, 1, 1)), "mean"),
        (lambda: Normalize((0.5, 0.5, 0.5), (1, 0, 1)), "std"),
        (lambda: Normalize((0.5, 0.5, float("inf")), (1, 1, 1)), "mean"),
        (lambda: Normalize("abc", (1, 1, 1)), "mean"),
        (lambda: ToTensor("HWC"), "layout"),
        (lambda: ToTensor("NHWC", "float16"), "dtype"),
    ],
)
def test_bad_op_arguments_raise_value_errors_naming_them(make: Any, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        make()


def test_decode_image_is_prepended_when_missing() -> None:
    checked = check_pipeline([RandomResizedCrop(8)])
    assert checked == [DecodeImage(), RandomResizedCrop(8)]
    full = [DecodeImage(dct_scaling=True), CenterCrop(8)]
    assert check_pipeline(full) == full


@pytest.mark.parametrize(
    "pipeline",
    [
        [
            DecodeImage(),
            RandomResizedCrop(8),
            RandomHorizontalFlip(),
            Normalize((0, 0, 0), (1, 1, 1)),
            ToTensor("NCHW", "float32"),
        ],
        [Resize(10), CenterCrop(8)],
        [CenterCrop(8), ToTensor("NCHW")],
        [RandomResizedCrop(8), Normalize((0, 0, 0), (1, 1, 1))],
        vision.imagenet_train(),
        vision.imagenet_eval(),
    ],
)
def test_supported_orders_pass(pipeline: list[ops.Op]) -> None:
    assert isinstance(check_pipeline(pipeline)[0], DecodeImage)


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ([], "after DecodeImage comes"),
        ([RandomHorizontalFlip(), RandomResizedCrop(8)], "after DecodeImage comes"),
        ([Resize(10)], "Resize alone"),
        ([RandomResizedCrop(8), CenterCrop(8)], "CenterCrop is out of place"),
        (
            [CenterCrop(8), ToTensor(), RandomHorizontalFlip()],
            "RandomHorizontalFlip is out of place",
        ),
        (
            [CenterCrop(8), RandomHorizontalFlip(), RandomHorizontalFlip()],
            "out of place or repeated",
        ),
        ([CenterCrop(8), DecodeImage()], "DecodeImage may appear only first"),
        ([CenterCrop(8), Normalize((0, 0, 0), (1, 1, 1)), ToTensor(dtype="uint8")], "contradicts"),
    ],
)
def test_bad_orders_raise_value_errors_naming_the_supported_ones(
    pipeline: list[ops.Op], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        check_pipeline(pipeline)
    if "contradicts" not in message:
        assert "supported orders" in str(raised.value)


@pytest.mark.parametrize(
    "pipeline", ["imagenet", RandomResizedCrop(8), [RandomResizedCrop(8), lambda x: x], None]
)
def test_pipeline_must_be_a_list_of_ops(pipeline: Any) -> None:
    with pytest.raises(ValueError, match="pipeline"):
        check_pipeline(pipeline)


def test_vision_recipes() -> None:
    assert vision.imagenet_train(128) == [
        DecodeImage(dct_scaling=True),
        RandomResizedCrop(128),
        RandomHorizontalFlip(),
        ToTensor(),
    ]
    assert vision.imagenet_eval(224) == [DecodeImage(), Resize(256), CenterCrop(224), ToTensor()]
    with pytest.raises(ValueError, match="imagenet_eval size"):
        vision.imagenet_eval(0)
    with pytest.raises(ValueError, match="imagenet_train size"):
        vision.imagenet_train((224, 224))  # type: ignore[arg-type]
