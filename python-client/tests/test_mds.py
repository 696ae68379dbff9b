"""Mosaic Streaming's MDS shards read in place: written here byte for byte in the layout its
``MDSWriter`` writes (``index.json``, ``shard.NNNNN.mds``, zstd-compressed ``.mds.zstd``), and
written by ``MDSWriter`` itself (``fixtures/mds_streaming``). The batches equal those of the
same images as an image folder, plain or compressed; ``ndarray`` token columns give the
windows of their ids in order, each sample a document."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import stoker

zstd = pytest.importorskip("zstandard", reason="zstandard writes the compressed shards")


def write_mds_columns(out: Path, columns: dict[str, str], rows: list[list[bytes]],
                      per_shard: int, compress: bool) -> None:
    """``rows`` (each one encoded value per column, none of a fixed size) as ``MDSWriter(columns=
    columns)`` lays them out: per shard the sample count, the samples' offsets (uint32), the
    writer's settings as JSON, then each sample: its columns' sizes, then the columns."""
    out.mkdir(parents=True)
    config = json.dumps({"columns": columns}).encode()
    shards = []
    for number, start in enumerate(range(0, len(rows), per_shard)):
        encoded = [
            np.asarray([len(v) for v in row], "<u4").tobytes() + b"".join(row)
            for row in rows[start : start + per_shard]
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
            "column_encodings": list(columns.values()), "column_names": list(columns),
            "column_sizes": [None] * len(columns), "compression": "zstd:7" if compress else None,
            "format": "mds", "hashes": [], "raw_data": {"basename": raw, "bytes": len(data),
            "hashes": {}}, "samples": len(encoded), "size_limit": 1 << 26, "version": 2,
            "zip_data": zip_data,
        })
    (out / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))


def write_mds(out: Path, samples: list[tuple[bytes, int]], per_shard: int, compress: bool) -> None:
    """Images as ``jpeg`` and labels as ``str_int``, as ``MDSWriter(columns={"image": "jpeg",
    "label": "str_int"})`` writes them."""
    rows = [[image, str(label).encode()] for image, label in samples]
    write_mds_columns(out, {"image": "jpeg", "label": "str_int"}, rows, per_shard, compress)


def token_array(ids: list[int]) -> bytes:
    """``ids`` as an ``ndarray:uint32`` column holds them: a one-axis shape header, the values."""
    width = 0 if len(ids) < 256 else 1
    shape = np.asarray([len(ids)], ["<u1", "<u2"][width]).tobytes()
    return bytes([(1 << 2) | width]) + shape + np.asarray(ids, "<u4").tobytes()


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


def test_several_image_columns_are_refused_until_image_column_names_one(
    dataset: Path, tmp_path: Path
) -> None:
    """``MDSWriter(columns={"x": "jpeg", "depth": "png", ...})`` keeps them in name order: the
    first, ``depth``, is no choice of the writer's, so the set waits for one to be named."""
    classes = sorted(p.name for p in dataset.iterdir() if p.is_dir())
    files = [(f, k) for k, c in enumerate(classes) for f in sorted((dataset / c).iterdir())]
    rows = [[b"not a png", str(k).encode(), f.read_bytes()] for f, k in files]
    mds = tmp_path / "two"
    write_mds_columns(mds, {"depth": "png", "label": "str_int", "x": "jpeg"}, rows, 25, False)
    with pytest.raises(stoker.DatasetError, match=r"several image columns.*image_column="):
        batches(mds)
    got = batches(mds, shuffle=False, image_column="x")
    want = batches(dataset, shuffle=False)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
    with pytest.raises(ValueError, match="image_column must be a str"):
        batches(mds, image_column=3)


# Sets written by Mosaic Streaming's own MDSWriter (`fixtures/write_mds_streaming.py` says how;
# the files are committed so that no Streaming install is needed here).
STREAMING = Path(__file__).parent / "fixtures" / "mds_streaming"


@pytest.mark.parametrize(
    ("name", "folder", "count"),
    [("jpeg", "images", 18), ("bytes_zstd", "images", 18), ("ndarray", "images_png", 12)],
)
def test_sets_streaming_s_writer_wrote_give_the_batches_of_their_image_folder(
    name: str, folder: str, count: int
) -> None:
    """Images as ``jpeg`` and ``bytes`` (zstd), and as ``ndarray:uint8`` pixels (gray and RGB)
    beside the same pixels as PNG files."""
    index = json.loads((STREAMING / name / "index.json").read_text())
    assert len(index["shards"]) > 1, "several shards"
    for shuffle in (False, True):
        want = batches(STREAMING / folder, shuffle=shuffle, drop_last=False)
        got = batches(STREAMING / name, shuffle=shuffle, drop_last=False)
        assert sum(len(b["label"]) for b in got) == count
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a["image"], b["image"])
            np.testing.assert_array_equal(a["label"], b["label"])


@pytest.mark.parametrize("name", ["tokens_uint32", "tokens_any"])
def test_token_windows_from_ndarray_columns_streaming_wrote(name: str) -> None:
    """LLM Foundry's layout (``tokens`` as ``ndarray:uint32``, zstd) and a bare ``ndarray`` of
    int64 (dtype and shape in each sample): the ids in order, each sample a document."""
    documents = json.loads((STREAMING / "documents.json").read_text())
    flat = np.concatenate([np.asarray(d) for d in documents])
    document_of = np.concatenate([np.full(len(d), k) for k, d in enumerate(documents)])
    seq_len = 4
    pipeline = [stoker.ops.TokenWindows(seq_len, document_boundaries=True)]
    with stoker.Loader(STREAMING / name, pipeline=pipeline, batch_size=3, shuffle=False,
                       drop_last=False, output="numpy") as loader:
        rows = list(loader)
    tokens = np.concatenate([b["tokens"] for b in rows])
    assert tokens.dtype == np.uint32
    assert len(tokens) == (len(flat) - 1) // seq_len
    for k, row in enumerate(tokens):
        window = slice(k * seq_len, k * seq_len + seq_len + 1)
        assert row.tolist() == flat[window].tolist()
        # Documents counted from the row start; positions restart at each sample's first id.
        documents_here = document_of[window]
        new = np.concatenate([[True], documents_here[1:] != documents_here[:-1]])
        ids = np.concatenate([b["document_ids"] for b in rows])[k]
        assert ids.tolist() == (np.cumsum(new) - 1).tolist()
        positions = np.concatenate([b["position_ids"] for b in rows])[k]
        expected: list[int] = []
        for j, starts in enumerate(new):
            expected.append(0 if starts else expected[j - 1] + 1)
        assert positions.tolist() == expected
