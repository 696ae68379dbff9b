"""What `./dev dist-check` runs in a fresh virtualenv where the portable wheel was installed
without a Rust toolchain: the package imports from the wheel (not from this checkout), makes a
small image folder and a token file, and reads a few batches of each. Exits non-zero on any
failure; prints one line per check."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> int:
    import stoker
    from stoker import _native

    here = Path(__file__).resolve().parent
    where = Path(stoker.__file__).resolve()
    if here in where.parents:
        print(f"stoker was imported from this checkout ({where}), not the wheel", file=sys.stderr)
        return 1
    print(f"imported stoker from {where.parent}")
    with tempfile.TemporaryDirectory() as scratch:
        images = Path(_native.make_dataset(str(Path(scratch) / "images"), 96))
        with stoker.Loader(images, pipeline=stoker.vision.imagenet_train(64), batch_size=16,
                           output="numpy") as loader:
            batches = [batch for _, batch in zip(range(3), loader, strict=False)]
        shapes = {batch["image"].shape for batch in batches}
        assert shapes == {(16, 64, 64, 3)}, shapes
        print(f"image folder: {len(batches)} batches of {shapes.pop()}")

        tokens = Path(scratch) / "tokens.bin"
        np.arange(20_000, dtype="<u2").tofile(tokens)
        with stoker.Loader(tokens, pipeline=[stoker.ops.TokenWindows(128)], batch_size=8,
                           shuffle=False, output="numpy") as loader:
            first = next(iter(loader))["tokens"]
        assert first.shape == (8, 129) and first.dtype == np.uint16, (first.shape, first.dtype)
        assert first[1, 0] == 128, "consecutive windows share one token"
        print(f"token file: windows of {first.shape[1]} uint16 tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
