"""Mosaic Streaming's MDS shards, written here byte for byte in the layout its ``MDSWriter``
writes (``index.json``, ``shard.NNNNN.mds``, zstd-compressed ``.mds.zstd``), read in place:
the batches equal those of the same images as an image folder, plain or compressed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import stoker

zstd = pytest.importorskip("zstandard", reason="zstandard writes the compressed shards")


def write_mds(out: Path, samples: list[tuple[bytes, int]], per_shard: int, compress: bool) -> None:
    """Images as ``jpeg`` and labels as ``int``, as ``MDSWriter(columns={"image": "jpeg",
    "label": "int"})`` lays them out: per shard the sample count, the samples' offsets (uint32),
    the writer's settings as JSON, then each sample: its variable sizes, then its columns."""
    out.mkdir(parents=True)
    config = json.dumps({"columns": {"image": "jpeg", "label": "int"}}).encode()
    shards = []
    for number, start in enumerate(range(0, len(samples), per_shard)):
        encoded = [
            np.uint32(len(image)).tobytes() + image + np.int64(label).tobytes()
            for image, label in samples[start : start + per_shard]
        ]
        header = 4 + 4 * (len(encoded) + 1) + len(config)
        offsets = np.cumsum([header] + [len(s) for s in encoded]).astype("<u4")
        data = np.uint32(len(encoded)).tobytes() + offsets.tobytes() + config + b"".join(encoded)
        raw = f"shard.{number:05d}.mds"
        zip_data = None
        if compress:
            zipped = zstd.ZstdCompressor(level=7).compress(data)
            (out / f"{raw}.zstd").write_bytes(zipped)
            zip_data = {"basename": f"{raw}.zstd", "bytes": len(zipped), "hashes": {}}
        else:
            (out / raw).write_bytes(data)
        shards.append({
            "column_encodings": ["jpeg", "int"], "column_names": ["image", "label"],
            "column_sizes": [None, 8], "compression": "zstd:7" if compress else None,
            "format": "mds", "hashes": [], "raw_data": {"basename": raw, "bytes": len(data),
            "hashes": {}}, "samples": len(encoded), "size_limit": 1 << 26, "version": 2,
            "zip_data": zip_data,
        })
    (out / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))


def batches(source: Path | str, **kwargs: object) -> list[dict[str, np.ndarray]]:
    with stoker.Loader(source, pipeline=stoker.vision.imagenet_train(32), batch_size=16,
                       num_threads=2, output="numpy", seed=5, **kwargs) as loader:
        return list(loader)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "zstd"])
def test_an_mds_set_gives_the_batches_of_its_images_as_an_image_folder(
    dataset: Path, tmp_path: Path, compress: bool
) -> None:
    classes = sorted(p.name for p in dataset.iterdir() if p.is_dir())
    files = [(f, k) for k, c in enumerate(classes) for f in sorted((dataset / c).iterdir())]
    mds = tmp_path / "mds"
    write_mds(mds, [(f.read_bytes(), k) for f, k in files], per_shard=25, compress=compress)
    with stoker.Loader(mds, pipeline=stoker.vision.imagenet_eval(32), batch_size=8) as loader:
        assert loader.num_samples == len(files)
    folder = batches(dataset, shuffle=False)
    for shuffle in (False, True):
        got = batches(mds, shuffle=shuffle, format="mds")
        want = folder if not shuffle else batches(dataset, shuffle=True)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a["image"], b["image"])
            np.testing.assert_array_equal(a["label"], b["label"])
