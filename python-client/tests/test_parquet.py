"""Parquet datasets from Python: a folder converted with ``stoker convert --to parquet`` is found
by its files (no format argument) and gives the same batches as the folder itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import stoker
from conftest import SAMPLE_COUNT, assert_same_batches, epoch_batches

REPO = Path(__file__).resolve().parents[2]


def stoker_binary() -> Path:
    """The release `stoker` CLI that `cargo test --release` (run before pytest) builds."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    binary = target / "release" / "stoker"
    if not binary.is_file():
        pytest.skip(
            f"{binary} is missing: build it with `cargo build --release -p stoker-cli` "
            "(./dev test does) to run the Parquet conversion test"
        )
    return binary


@pytest.fixture(scope="module")
def parquet_dataset(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parquet") / "set"
    subprocess.run(
        [
            str(stoker_binary()),
            "convert",
            "--from",
            str(dataset),
            "--to",
            "parquet",
            "--out",
            str(out),
            "--shard-size",
            "2",
            "--row-group-size",
            "16",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def test_a_converted_folder_reads_the_same_as_the_folder(
    dataset: Path, parquet_dataset: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    files = sorted(parquet_dataset.glob("*.parquet"))
    assert len(files) >= 2, files
    from_parquet = make_loader(parquet_dataset, seed=5)
    from_folder = make_loader(dataset, seed=5)
    assert from_parquet.num_samples == SAMPLE_COUNT
    assert from_parquet.classes == from_folder.classes
    batches = epoch_batches(from_parquet)
    assert sum(len(batch["label"]) for batch in batches) == SAMPLE_COUNT
    assert_same_batches(batches, epoch_batches(from_folder))
    # One file of the set is a dataset too.
    single = make_loader(files[0], shuffle=False)
    assert 0 < single.num_samples < SAMPLE_COUNT
    assert len(list(single)) == len(single)


def test_select_columns_reads_numeric_columns_per_sample(
    parquet_dataset: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    # A converted set's numeric column is its label: SelectColumns(["label"]) must give, per
    # batch, the labels the image pipeline gives for the same plan (and no second "label").
    images = epoch_batches(make_loader(parquet_dataset, seed=7))
    columns = epoch_batches(
        make_loader(parquet_dataset, seed=7, pipeline=[stoker.ops.SelectColumns(["label"])])
    )
    assert len(columns) == len(images)
    for from_columns, from_images in zip(columns, images, strict=True):
        assert list(from_columns) == ["label"]
        assert from_columns["label"].dtype == np.int64
        np.testing.assert_array_equal(from_columns["label"], from_images["label"])
    as_float = epoch_batches(
        make_loader(
            parquet_dataset,
            seed=7,
            pipeline=[stoker.ops.SelectColumns(["label"], dtype="float32")],
        )
    )
    assert as_float[0]["label"].dtype == np.float32
    np.testing.assert_array_equal(as_float[0]["label"], images[0]["label"].astype(np.float32))
    with pytest.raises(ValueError, match="not numeric"):
        make_loader(parquet_dataset, pipeline=[stoker.ops.SelectColumns(["image"])])


@pytest.mark.parametrize("codec", ["gzip", "brotli"])
def test_pandas_codecs_are_read_or_refused_at_open(
    dataset: Path, tmp_path: Path, codec: str
) -> None:
    """``to_parquet(compression="gzip")`` reads as snappy does; brotli, not decoded here, is
    refused when the set opens, naming the codec, not at every sample of a set without
    labels."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    images = [p.read_bytes() for p in sorted(dataset.rglob("*.jpg"))][:16]
    table = pa.table({"image": images})
    pq.write_table(table, tmp_path / "snappy.parquet")
    pq.write_table(table, tmp_path / f"{codec}.parquet", compression=codec)

    def first(name: str) -> np.ndarray:
        with stoker.Loader(tmp_path / name, pipeline=stoker.vision.imagenet_eval(32),
                           batch_size=8, num_threads=1, output="numpy") as loader:
            return next(iter(loader))["image"].copy()

    if codec == "gzip":
        np.testing.assert_array_equal(first("gzip.parquet"), first("snappy.parquet"))
    else:
        with pytest.raises(stoker.DatasetError, match="compressed with BROTLI"):
            first("brotli.parquet")
