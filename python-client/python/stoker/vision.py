"""Ready-made image pipelines: the standard ImageNet training and evaluation recipes.

Both yield uint8 NHWC images, the cheapest form to move; convert and normalise on the GPU
(``images.permute(0, 3, 1, 2).float().div(255)`` then subtract the mean and divide by the
std), or append :class:`stoker.ops.Normalize` (in place of the last ``ToTensor``): with
``stoker.Loader(..., device="cuda")`` it then runs on the GPU, on the loader's own stream;
without, on the CPU workers.
"""

from __future__ import annotations

from stoker._arguments import is_int
from stoker.ops import (
    MAX_SIDE,
    CenterCrop,
    DecodeImage,
    Op,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
)

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "imagenet_eval", "imagenet_train"]

# torchvision's ImageNet statistics, on the [0, 1] scale, for stoker.ops.Normalize.
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


def _check_size(size: object, recipe: str, largest: int) -> int:
    # Checked here so the message names the recipe's argument, not the op it feeds; a
    # Python int, whose arithmetic does not wrap as a numpy int16's does.
    if not is_int(size) or not 1 <= size <= largest:
        raise ValueError(f"{recipe} size must be an int in 1..={largest}, got {size!r}")
    return int(size)


def imagenet_train(size: int = 224) -> list[Op]:
    """The ImageNet training recipe: random-resized crop to ``size`` and a random flip.

    JPEGs decode at a reduced DCT scale where the crop window is much larger than the output
    (see :class:`stoker.ops.DecodeImage`), which is most of the speed-up on large photos.

    Args:
        size: side of the square output, in 1..=16384.

    Returns:
        ``[DecodeImage(dct_scaling=True), RandomResizedCrop(size), RandomHorizontalFlip(),
        ToTensor()]``.
    """
    size = _check_size(size, "imagenet_train", MAX_SIDE)
    return [
        DecodeImage(dct_scaling=True),
        RandomResizedCrop(size),
        RandomHorizontalFlip(),
        ToTensor(),
    ]


def imagenet_eval(size: int = 224) -> list[Op]:
    """The ImageNet evaluation recipe: resize the shorter side to ``size * 256 // 224``, then
    crop the centre ``size`` square.

    Args:
        size: side of the square output, in 1..=14336.

    Returns:
        ``[DecodeImage(), Resize(size * 256 // 224), CenterCrop(size), ToTensor()]``.
    """
    # The resize before the crop is 256/224 larger and must itself fit the limit.
    size = _check_size(size, "imagenet_eval", MAX_SIDE * 224 // 256)
    return [DecodeImage(), Resize(size * 256 // 224), CenterCrop(size), ToTensor()]
