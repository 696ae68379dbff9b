"""Stoker: a data loader that keeps GPUs fed, written in Rust.

``stoker.Loader`` reads an image folder, decodes and augments images on Rust threads (the GIL
released), and yields batches as zero-copy numpy arrays or torch tensors, deterministically:
a batch depends on the seed, epoch, rank and step only, so runs reproduce and resume exactly.

    import stoker
    loader = stoker.Loader("/data/train", pipeline=stoker.vision.imagenet_train(224),
                           batch_size=256)
    for batch in loader:
        images, labels = batch["image"], batch["label"]

Modules: :mod:`stoker.ops` (pipeline ops), :mod:`stoker.vision` (ready-made pipelines),
:mod:`stoker.errors` (the exceptions, also exported here), :mod:`stoker.gpu` (pinned slots,
delivery on the device, GPU idle); :func:`stoker.mix` mixes several sources by weight into one
loader.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from stoker import errors, ops, vision
from stoker._batches import BatchIterator
from stoker._dataset import sample_rng, sample_seed
from stoker._loader import Loader
from stoker._mix import Source, megatron_blend, mix
from stoker.errors import *  # noqa: F403 (the exceptions, exported here too)

try:
    __version__: str = version("stoker")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BatchIterator",
    "Loader",
    "Source",
    "__version__",
    "megatron_blend",
    "mix",
    "ops",
    "sample_rng",
    "sample_seed",
    "vision",
]
__all__ += errors.__all__
