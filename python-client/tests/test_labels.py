"""Labels as the sets users keep hold them, never silently replaced: a Parquet export of a
``datasets`` table whose ``ClassLabel`` is not named ``label`` gives its labels, another column
is named by ``label_column=``, an image set without labels says so, a negative label (how
Hugging Face marks a missing one) or a label column of another encoding refuses the set,
labels past the class names and tar members left out are warned about, files written apart
are checked against each other, and a double too large for float32 is a bad sample."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_hf_datasets import class_names, datasets_or_skip
from test_mds import write_mds_columns

import stoker
from conftest import class_index_of, epoch_batches, image_files

LOADER_LOG = "stoker"  # the logger the loader warns through


def labels_of(loader: stoker.Loader) -> list[int]:
    return np.concatenate([b["label"] for b in epoch_batches(loader)]).tolist()


def image_table(root: Path, **columns: list[object]) -> pa.Table:
    """The images of ``root`` as bytes, with ``columns`` beside them."""
    images = [path.read_bytes() for path in image_files(root)]
    return pa.table({"image": images, **columns})


def test_a_parquet_export_whose_class_label_is_not_named_label_gives_its_labels(
    dataset: Path, tmp_path: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    datasets = datasets_or_skip()
    files = image_files(dataset)
    table = datasets.Dataset.from_dict(
        {"image": [str(path) for path in files], "labels": class_index_of(dataset)}
    )
    table = table.cast_column("image", datasets.Image())
    table = table.cast_column("labels", datasets.ClassLabel(names=class_names(dataset)))
    out = tmp_path / "beans.parquet"
    table.to_parquet(str(out))
    loader = make_loader(out, shuffle=False)
    assert labels_of(loader) == class_index_of(dataset)
    assert loader.classes == class_names(dataset)


def test_a_parquet_export_whose_image_is_not_named_image_reads_its_image_feature(
    dataset: Path, tmp_path: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    """CIFAR on the hub keeps its images in ``img``: the ``Image`` feature ``datasets`` writes
    into the file's metadata names it, as in a ``save_to_disk`` folder."""
    datasets = datasets_or_skip()
    files = image_files(dataset)
    batches = {}
    for column in ("image", "img"):
        table = datasets.Dataset.from_dict(
            {column: [str(path) for path in files], "label": class_index_of(dataset)}
        )
        table = table.cast_column(column, datasets.Image())
        out = tmp_path / f"{column}.parquet"
        table.to_parquet(str(out))
        batches[column] = [b["image"].copy() for b in epoch_batches(make_loader(out, seed=3))]
    assert len(batches["img"]) == len(batches["image"]) > 0
    for a, b in zip(batches["img"], batches["image"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_label_column_names_another_column_and_an_image_set_without_one_says_so(
    dataset: Path,
    tmp_path: Path,
    make_loader: Callable[..., stoker.Loader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    labels = class_index_of(dataset)
    out = tmp_path / "category.parquet"
    pq.write_table(image_table(dataset, category=labels), out)
    assert labels_of(make_loader(out, shuffle=False, label_column="category")) == labels
    with caplog.at_level(logging.WARNING, logger=LOADER_LOG):
        unlabelled = make_loader(out, shuffle=False)
    assert set(labels_of(unlabelled)) == {0}
    assert any("no label column" in r.getMessage() and "category" in r.getMessage()
               for r in caplog.records), caplog.text
    with pytest.raises(stoker.DatasetError, match="no label column named"):
        make_loader(out, label_column="missing")
    with pytest.raises(ValueError, match="label_column= is for one source"):
        stoker.mix({stoker.Source(out): 1.0, stoker.Source(out): 1.0}, batch_size=4,
                   pipeline=stoker.vision.imagenet_train(32), label_column="category")


def test_label_columns_other_tools_name_are_taken_and_a_choice_among_class_labels_is_said(
    dataset: Path,
    tmp_path: Path,
    make_loader: Callable[..., stoker.Loader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An integer ``labels``, ``target`` or ``y`` column (MosaicML Streaming's converters write
    ``x``/``y``) is the label: it was left out, every label 0. Of two ClassLabel columns
    (CIFAR-100's ``fine_label`` and ``coarse_label``) the first is taken, and that is said."""
    labels = class_index_of(dataset)
    for name in ("labels", "target", "y"):
        out = tmp_path / f"{name}.parquet"
        pq.write_table(image_table(dataset, **{name: labels}), out)
        assert labels_of(make_loader(out, shuffle=False)) == labels, name
    images = [path.read_bytes() for path in image_files(dataset)[:8]]
    xy = tmp_path / "xy"
    write_mds_columns(xy, {"x": "jpeg", "y": "str_int"},
                      [[image, str(k % 3).encode()] for k, image in enumerate(images)],
                      per_shard=4, compress=False)
    assert labels_of(make_loader(xy, batch_size=4, shuffle=False)) == [k % 3 for k in range(8)]
    datasets = datasets_or_skip()
    files = image_files(dataset)
    table = datasets.Dataset.from_dict({
        "image": [str(path) for path in files], "coarse": [0] * len(files), "fine": labels,
    })
    table = table.cast_column("image", datasets.Image())
    table = table.cast_column("coarse", datasets.ClassLabel(names=["all"]))
    table = table.cast_column("fine", datasets.ClassLabel(names=class_names(dataset)))
    out = tmp_path / "two.parquet"
    table.to_parquet(str(out))
    with caplog.at_level(logging.WARNING, logger=LOADER_LOG):
        loader = make_loader(out, shuffle=False)
    assert set(labels_of(loader)) == {0}
    assert any("several columns could be the label" in r.getMessage()
               and "fine" in r.getMessage() for r in caplog.records), caplog.text
    assert labels_of(make_loader(out, shuffle=False, label_column="fine")) == labels


def test_a_negative_label_refuses_the_set_naming_the_row(
    dataset: Path, tmp_path: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    labels = class_index_of(dataset)
    labels[5] = -1
    out = tmp_path / "test-split.parquet"
    pq.write_table(image_table(dataset, label=labels), out)
    with pytest.raises(stoker.DatasetError, match=r"negative.*row 5.*missing label"):
        make_loader(out)


def test_labels_past_the_class_names_the_files_give_are_warned_about(
    dataset: Path,
    tmp_path: Path,
    make_loader: Callable[..., stoker.Loader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    labels = class_index_of(dataset)
    table = image_table(dataset, label=labels)
    names = class_names(dataset)[:-1]
    table = table.replace_schema_metadata({"stoker.class_names": json.dumps(names)})
    out = tmp_path / "short.parquet"
    pq.write_table(table, out)
    with caplog.at_level(logging.WARNING, logger=LOADER_LOG):
        loader = make_loader(out, shuffle=False)
    assert labels_of(loader) == labels
    assert any(f"past the {len(names)} class names" in r.getMessage() for r in caplog.records), (
        caplog.text
    )


def test_parquet_files_written_apart_are_checked_against_each_other(
    dataset: Path, tmp_path: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    # Class names that differ: the same label would name two classes.
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    for part, names in enumerate([["cat", "dog"], ["dog", "cat"]]):
        table = image_table(dataset, label=[i % 2 for i in range(len(image_files(dataset)))])
        table = table.replace_schema_metadata({"stoker.class_names": json.dumps(names)})
        pq.write_table(table, swapped / f"part-{part}.parquet")
    with pytest.raises(stoker.DatasetError, match="class names"):
        make_loader(swapped)
    # A numeric column of integers in one file and doubles in the other is read as floats from
    # both (before, the second file's rows were bad samples, replaced by the first's).
    numbers = tmp_path / "numbers"
    numbers.mkdir()
    pq.write_table(pa.table({"y": pa.array([10, 11, 12, 13], pa.int64())}),
                   numbers / "part-0.parquet")
    pq.write_table(pa.table({"y": pa.array([14.5, 15.5, 16.5, 17.5], pa.float64())}),
                   numbers / "part-1.parquet")
    loader = make_loader(numbers, shuffle=False, batch_size=4,
                         pipeline=[stoker.ops.SelectColumns(["y"])])
    values = np.concatenate([b["y"] for b in epoch_batches(loader)]).ravel().tolist()
    assert values == [10, 11, 12, 13, 14.5, 15.5, 16.5, 17.5]
    assert loader.stats()["bad_samples"] == 0
    # A column missing from a later file refuses the pipeline when the loader opens.
    pq.write_table(pa.table({"z": pa.array([1.0, 2.0])}), numbers / "part-2.parquet")
    with pytest.raises(ValueError, match="no column named \"y\", which the first file has"):
        make_loader(numbers, pipeline=[stoker.ops.SelectColumns(["y"])])


def test_a_double_too_large_for_float32_is_a_bad_sample_not_infinity(
    tmp_path: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    out = tmp_path / "big.parquet"
    pq.write_table(pa.table({"y": pa.array([1.0, 1e300, 3.0, float("inf")])}), out)
    loader = make_loader(out, shuffle=False, batch_size=4, on_error="fail",
                         pipeline=[stoker.ops.SelectColumns(["y"])])
    with pytest.raises(stoker.DecodeError, match="does not fit f32"):
        epoch_batches(loader)


def test_a_hugging_face_folder_with_a_huge_integer_label_is_refused(
    dataset: Path, tmp_path: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    datasets = datasets_or_skip()
    files = image_files(dataset)
    labels = class_index_of(dataset)
    labels[0] = 1 << 23
    table = datasets.Dataset.from_dict({"image": [str(p) for p in files], "label": labels})
    table = table.cast_column("image", datasets.Image())
    out = tmp_path / "huge"
    table.save_to_disk(str(out))
    with pytest.raises(stoker.DatasetError, match="more classes than are named by number"):
        make_loader(out)


def test_an_mds_label_of_another_encoding_refuses_the_set_and_no_label_is_warned_about(
    dataset: Path,
    tmp_path: Path,
    make_loader: Callable[..., stoker.Loader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    images = [path.read_bytes() for path in image_files(dataset)[:8]]
    named = tmp_path / "named"
    write_mds_columns(named, {"image": "jpeg", "label": "str"},
                      [[image, b"cat"] for image in images], per_shard=4, compress=False)
    with pytest.raises(stoker.DatasetError, match="label column \"label\" is encoded str"):
        make_loader(named)
    bare = tmp_path / "bare"
    write_mds_columns(bare, {"image": "jpeg"}, [[image] for image in images], per_shard=4,
                      compress=False)
    with caplog.at_level(logging.WARNING, logger=LOADER_LOG):
        loader = make_loader(bare, batch_size=4)
    assert set(labels_of(loader)) == {0}
    assert any("no label column" in r.getMessage() for r in caplog.records), caplog.text


def test_tar_members_left_out_are_warned_about(
    dataset: Path,
    tmp_path: Path,
    make_loader: Callable[..., stoker.Loader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    files = image_files(dataset)[:8]
    with tarfile.open(shards / "shard-000000.tar", "w") as tar:
        for number, path in enumerate(files):
            members = [(f"{number:04d}.jpg", path.read_bytes())]
            if number % 2 == 0:
                members.append((f"{number:04d}.cls", b"1"))
            elif number == 1:
                members.append((f"{number:04d}.cls", b"cat"))
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with caplog.at_level(logging.WARNING, logger=LOADER_LOG):
        loader = make_loader(shards, batch_size=2)
    assert loader.num_samples == 4
    assert any("problem(s) indexing the tar shards" in r.getMessage() for r in caplog.records), (
        caplog.text
    )


def test_a_tar_set_with_no_complete_sample_says_why(
    dataset: Path,
    tmp_path: Path,
    make_loader: Callable[..., stoker.Loader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Keys with dots (``img.0.jpg`` beside ``img.0.cls``: the key is ``img``) form no sample:
    the refusal said only "found no complete sample", the reasons went to no one."""
    shards = tmp_path / "dotted"
    shards.mkdir()
    with tarfile.open(shards / "shard-000000.tar", "w") as tar:
        for number, path in enumerate(image_files(dataset)[:4]):
            for name, data in ((f"img.{number}.jpg", path.read_bytes()),
                               (f"img.{number}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with (
        caplog.at_level(logging.WARNING, logger=LOADER_LOG),
        pytest.raises(stoker.DatasetError, match=r"member\(s\) were left out.*first dot"),
    ):
        make_loader(shards, batch_size=2)
    assert any("tar shard problem" in r.getMessage() for r in caplog.records), caplog.text
