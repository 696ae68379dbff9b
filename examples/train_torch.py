#!/usr/bin/env python3
"""Trains a small CNN on an image folder with either stoker.Loader or torch's DataLoader.

The flag ``--loader`` picks the loader; everything else (model, optimiser, the training loop,
the conversion of uint8 images to normalised float NCHW on the training device) is shared, so
the printed images/s compare the loaders and nothing else. Without ``--data`` it trains on a
1,000-image ImageNet-like set generated into the temp folder (reused on later runs).

    python examples/train_torch.py --loader stoker
    python examples/train_torch.py --loader torch --workers 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

import stoker

CROP_SIZE = 112
MEAN = torch.tensor(stoker.vision.IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(stoker.vision.IMAGENET_STD).view(1, 3, 1, 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loader", choices=("stoker", "torch"), default="stoker")
    parser.add_argument(
        "--data", type=Path, help="ImageFolder root (default: a generated 1,000-image set)"
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--workers", type=int, default=2, help="stoker threads / DataLoader workers"
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def small_cnn(num_classes: int) -> nn.Module:
    """Three strided conv blocks and a linear head: enough to learn, cheap on a CPU."""

    def block(inputs: int, outputs: int) -> list[nn.Module]:
        return [
            nn.Conv2d(inputs, outputs, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.ReLU(inplace=True),
        ]

    return nn.Sequential(
        *block(3, 32),
        *block(32, 64),
        *block(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


def stoker_batches(loader: stoker.Loader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images uint8 NCHW, labels) from stoker's uint8 NHWC batches, without a copy."""
    for batch in loader:
        yield batch["image"].permute(0, 3, 1, 2), batch["label"]


def make_loader(
    args: argparse.Namespace, data: Path
) -> tuple[stoker.Loader | torch.utils.data.DataLoader, int]:
    """The chosen loader and the number of classes. Both reshuffle on every pass."""
    if args.loader == "stoker":
        loader = stoker.Loader(
            data,
            pipeline=stoker.vision.imagenet_train(CROP_SIZE),
            batch_size=args.batch_size,
            shuffle=True,
            seed=args.seed,
            num_threads=args.workers,
            output="torch",
        )
        return loader, len(loader.classes)

    from torchvision import datasets, transforms

    recipe = transforms.Compose(
        [
            transforms.RandomResizedCrop(CROP_SIZE),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )
    dataset = datasets.ImageFolder(str(data), transform=recipe)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed),
    )
    return loader, len(dataset.classes)


def to_model_input(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 NCHW on the host -> normalised float32 on the device (on the GPU when there is one).

    Stoker's images arrive as a permuted (channels-last) view; making them contiguous here
    gives both loaders' batches the same memory layout, so the model runs the same kernels.
    """
    images = images.to(device, non_blocking=True).float().div_(255).contiguous()
    return (images - MEAN.to(device)) / STD.to(device)


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    data = args.data
    if data is None:
        data = Path(
            stoker._native.make_dataset(
                str(Path(tempfile.gettempdir()) / "stoker-example-1000"), 1000
            )
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    loader, num_classes = make_loader(args, data)
    model = small_cnn(num_classes).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    print(f"{args.loader} loader, {data}, {num_classes} classes, device {device}")

    for epoch in range(args.epochs):
        batches: Iterable[tuple[torch.Tensor, torch.Tensor]] = (
            stoker_batches(loader) if isinstance(loader, stoker.Loader) else loader
        )
        model.train()
        started = time.perf_counter()
        images_seen, loss_sum = 0, 0.0
        for images, labels in batches:
            inputs = to_model_input(images, device)
            targets = labels.to(device, non_blocking=True)
            loss = loss_fn(model(inputs), targets)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            images_seen += labels.shape[0]
            loss_sum += loss.item() * labels.shape[0]
        elapsed = time.perf_counter() - started
        print(
            f"epoch {epoch}: loss {loss_sum / images_seen:.4f}, "
            f"{images_seen / elapsed:.0f} images/s ({elapsed:.1f} s)"
        )

    if isinstance(loader, stoker.Loader):
        stats = loader.stats()
        print(
            f"stoker: {stats['samples_per_s']:.0f} samples/s delivered, "
            f"stall {stats['stall_fraction']:.1%}"
        )
        loader.close()


if __name__ == "__main__":
    main()
