"""Naming a source's files: globs, brace ranges and lists, and splits. A hub folder holding train
and test is never read whole: ``split=`` picks one, and without it the error names the splits.
Patterns and lists read exactly the files they name (sorted by path, each once), so their
batches equal those of the same files named another way."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_hf_datasets import datasets_or_skip

import stoker
from conftest import (
    SAMPLE_COUNT,
    assert_same_batches,
    daemon_binary,
    epoch_batches,
    running_cluster,
)

Make = Callable[..., stoker.Loader]


def convert(dataset: Path, out: Path, to: str, shard_mb: int) -> list[Path]:
    """``stoker convert`` of ``dataset`` into ``out`` in shards of about ``shard_mb`` MB."""
    subprocess.run(
        [str(daemon_binary("stoker")), "convert", "--from", str(dataset), "--to", to,
         "--out", str(out), "--shard-size", str(shard_mb)],
        check=True, capture_output=True, timeout=180,
    )
    return sorted(out.glob(f"*.{'tar' if to == 'tar' else 'parquet'}"))


@pytest.fixture(scope="module")
def tar_set(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The sample set as tar shards ``shard-000000.tar`` ..., at least four of them."""
    shards = convert(dataset, tmp_path_factory.mktemp("tars") / "set", "tar", 1)
    assert len(shards) >= 4, shards
    return shards


@pytest.fixture(scope="module")
def hub_folder(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub-style repository: ``README.md`` and ``data/{train,test}-NNNNN-of-NNNNN.parquet``,
    the last Parquet shard of the set being the test split."""
    parts = convert(dataset, tmp_path_factory.mktemp("pq") / "set", "parquet", 1)
    assert len(parts) >= 3, parts
    root = tmp_path_factory.mktemp("hub")
    (root / "README.md").write_text("---\nconfigs: default\n---\n")
    data = root / "data"
    data.mkdir()
    train = parts[:-1]
    for k, part in enumerate(train):
        shutil.copy(part, data / f"train-{k:05d}-of-{len(train):05d}.parquet")
    shutil.copy(parts[-1], data / "test-00000-of-00001.parquet")
    return root


def test_a_hub_folder_with_two_splits_is_refused_without_split(hub_folder: Path,
                                                               make_loader: Make) -> None:
    for source in (hub_folder, hub_folder / "data", f"{hub_folder}/data/*.parquet"):
        with pytest.raises(ValueError, match=r"the splits test, train: name one with split="):
            make_loader(source)
    with pytest.raises(ValueError, match=r'no split "validation".*test, train'):
        make_loader(hub_folder, split="validation")


def test_split_reads_only_its_files(hub_folder: Path, make_loader: Make) -> None:
    train_files = sorted((hub_folder / "data").glob("train-*.parquet"))
    by_split = make_loader(hub_folder, split="train", shuffle=False)
    by_glob = make_loader(str(hub_folder / "data" / "train-*.parquet"), shuffle=False)
    by_list = make_loader([str(f) for f in reversed(train_files)], shuffle=False)
    test = make_loader(hub_folder, split="test", shuffle=False)
    assert test.num_samples > 0
    assert by_split.num_samples + test.num_samples == SAMPLE_COUNT
    assert by_glob.num_samples == by_list.num_samples == by_split.num_samples
    expected = epoch_batches(by_split)
    assert_same_batches(epoch_batches(by_glob), expected)
    assert_same_batches(epoch_batches(by_list), expected)


def test_brace_ranges_globs_and_lists_name_the_same_shards(tar_set: list[Path],
                                                           make_loader: Make) -> None:
    folder = tar_set[0].parent
    first_three = tar_set[:3]
    by_range = make_loader(f"{folder}/shard-{{000000..000002}}.tar", seed=3)
    by_glob = make_loader(f"{folder}/shard-00000[0-2].tar", seed=3)
    # A list in another order, one file twice: sorted, counted once.
    by_list = make_loader([str(first_three[2]), str(first_three[0]), str(first_three[1]),
                           str(first_three[0])], seed=3)
    whole = make_loader(folder, seed=3)
    assert by_range.num_samples == by_glob.num_samples == by_list.num_samples
    assert 0 < by_range.num_samples < whole.num_samples
    expected = epoch_batches(by_range)
    assert_same_batches(epoch_batches(by_glob), expected)
    assert_same_batches(epoch_batches(by_list), expected)


def test_bad_names_say_what_is_wrong(tar_set: list[Path], hub_folder: Path,
                                     make_loader: Make) -> None:
    folder = tar_set[0].parent
    with pytest.raises(FileNotFoundError, match=r"shard-9\*\.tar matches no file in"):
        make_loader(f"{folder}/shard-9*.tar")
    missing = r"shard-\d{6}\.tar does not exist \(named by the source pattern"
    with pytest.raises(FileNotFoundError, match=missing):
        make_loader(f"{folder}/shard-{{000000..000999}}.tar")
    with pytest.raises(ValueError, match=r"is never closed"):
        make_loader(f"{folder}/shard-{{000000..000002.tar")
    parquet = next((hub_folder / "data").glob("test-*.parquet"))
    with pytest.raises(ValueError, match=r"mixes formats") as mixed:
        make_loader([str(tar_set[0]), str(parquet)])
    assert "(tar shards)" in str(mixed.value) and "(Parquet)" in str(mixed.value)
    with pytest.raises(ValueError, match=r"is a folder"):
        make_loader([str(folder), str(tar_set[0])])
    with pytest.raises(ValueError, match=r"empty list"):
        make_loader([])
    with pytest.raises(ValueError, match=r"split must be"):
        make_loader(folder, split="")


def test_an_image_folder_laid_out_by_split(dataset: Path, tmp_path: Path,
                                           make_loader: Make) -> None:
    classes = sorted(p for p in dataset.iterdir() if p.is_dir())
    root = tmp_path / "imagenet"
    for split, chosen in (("train", classes), ("val", classes[:2])):
        for cls in chosen:
            shutil.copytree(cls, root / split / cls.name)
    with pytest.raises(ValueError, match=r"the splits train, val"):
        make_loader(root)
    val = make_loader(root, split="val")
    assert val.classes == [c.name for c in classes[:2]]
    train = make_loader(root, split="train")
    assert train.num_samples == SAMPLE_COUNT


def test_folders_beside_splits_never_make_them_classes_nor_hide_them(
    dataset: Path, hub_folder: Path, tmp_path: Path, make_loader: Make,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An image folder's splits beside another folder (``samples/``) were read whole, the
    splits as classes; a split folder beside a loose split file was hidden by it; a plain
    folder's subfolders of data files and a pattern of a hub set missing a shard went unsaid."""
    classes = sorted(p for p in dataset.iterdir() if p.is_dir())
    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        for cls in classes[:2]:
            shutil.copytree(cls, root / split / cls.name)
    shutil.copytree(classes[2], root / "samples")
    with pytest.raises(ValueError, match=r"the splits train, val:"):
        make_loader(root)
    assert make_loader(root, split="train").classes == [c.name for c in classes[:2]]
    parts = sorted((hub_folder / "data").glob("train-*.parquet"))
    loose = tmp_path / "loose"
    (loose / "train").mkdir(parents=True)
    shutil.copy(parts[0], loose / "train" / "part-0.parquet")
    shutil.copy(hub_folder / "data" / "test-00000-of-00001.parquet", loose / "validation.parquet")
    with pytest.raises(ValueError, match=r"the splits train, validation"):
        make_loader(loose)
    assert make_loader(loose, split="train").num_samples == make_loader(parts[0]).num_samples
    plain = tmp_path / "plain"
    (plain / "more").mkdir(parents=True)
    shutil.copy(parts[0], plain / "part-0.parquet")
    shutil.copy(parts[1], plain / "more" / "part-1.parquet")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        make_loader(plain)
        make_loader(f"{hub_folder}/data/train-0000[01]-of-*.parquet")
    said = caplog.text
    assert "subfolders' data files are not read" in said and "more" in said, said
    assert len(parts) > 2, parts  # so the pattern leaves one out
    assert "not one whole set" in said and "missing" in said, said


def test_a_mix_source_is_a_list_a_pattern_or_a_split(tar_set: list[Path], hub_folder: Path,
                                                     make_loader: Make) -> None:
    """``stoker.Source`` takes what ``Loader`` takes: a list read as one source, a pattern, a
    split of a hub folder; and a hub folder without its split is refused as ``Loader`` refuses
    it."""
    listed = [str(p) for p in reversed(tar_set[:2])]
    shards = make_loader(listed).num_samples
    train = make_loader(hub_folder, split="train").num_samples
    pipeline = stoker.vision.imagenet_train(32)
    sources = {stoker.Source(listed): 1, stoker.Source(hub_folder, split="train"): 1}
    with stoker.mix(sources, pipeline=pipeline, batch_size=8, window=2, output="numpy",
                    num_threads=2) as mixed:
        # One of each per window of 2, until the smaller source runs out.
        assert mixed.num_samples == 2 * min(shards, train)
        counts = Counter(np.concatenate([b["source"] for b in mixed]).tolist())
    assert counts == {0: min(shards, train), 1: min(shards, train)}
    pattern = stoker.Source(f"{tar_set[0].parent}/shard-00000[0-1].tar")
    with stoker.mix({pattern: 1, stoker.Source(hub_folder, split="test"): 1},
                    pipeline=pipeline, batch_size=8, window=2, output="numpy") as mixed:
        assert mixed.num_samples > 0
    with pytest.raises(ValueError, match=r"the splits test, train: name one with split="):
        stoker.mix({stoker.Source(listed): 1, stoker.Source(hub_folder): 1},
                   pipeline=pipeline, batch_size=8)


def test_distributed_digests_of_a_glob_and_a_list_equal_the_embedded(
    tar_set: list[Path], tmp_path: Path, make_loader: Make
) -> None:
    folder = tar_set[0].parent
    pattern = f"{folder}/shard-00000[0-2].tar"
    listed = [str(p) for p in tar_set[:3]]
    embedded = epoch_batches(make_loader(pattern, seed=5))
    with running_cluster(folder, tmp_path / "state") as address:
        for source in (pattern, listed):
            remote = make_loader(source, seed=5, address=address)
            assert_same_batches(epoch_batches(remote), embedded)
    assert sum(int(np.asarray(b["label"]).size) for b in embedded) > 0


def test_webdataset_shards_read_through_a_brace_range(dataset: Path, tmp_path: Path,
                                                      make_loader: Make) -> None:
    wds = pytest.importorskip("webdataset")
    files = sorted(p for p in dataset.rglob("*.jpg"))
    classes = sorted(p.name for p in dataset.iterdir() if p.is_dir())
    pattern = str(tmp_path / "shard-%05d.tar")
    with wds.ShardWriter(pattern, maxcount=40) as sink:
        for k, file in enumerate(files):
            sink.write({"__key__": f"{k:06d}", "jpg": file.read_bytes(),
                        "cls": str(classes.index(file.parent.name)).encode()})
    written = sorted(tmp_path.glob("shard-*.tar"))
    assert len(written) == 3
    loader = make_loader(str(tmp_path / "shard-{00000..00002}.tar"), shuffle=False)
    assert loader.num_samples == len(files)
    labels = np.concatenate([np.asarray(b["label"]) for b in epoch_batches(loader)])
    assert sorted(labels.tolist()) == sorted(classes.index(f.parent.name) for f in files)


def test_a_hub_folder_written_by_datasets_reads_by_split(dataset: Path, tmp_path: Path,
                                                         make_loader: Make) -> None:
    datasets = datasets_or_skip()
    files = sorted(p for p in dataset.rglob("*.jpg"))
    classes = sorted(p.name for p in dataset.iterdir() if p.is_dir())
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=classes)})
    counts = {}
    for split, chosen in (("train", files[:60]), ("validation", files[60:90]),
                          ("test", files[90:])):
        rows = {"image": [{"bytes": f.read_bytes(), "path": None} for f in chosen],
                "label": [classes.index(f.parent.name) for f in chosen]}
        table = datasets.Dataset.from_dict(rows, features=features)
        table.to_parquet(str(data / f"{split}-00000-of-00001.parquet"))
        counts[split] = len(chosen)
    with pytest.raises(ValueError, match=r"test, train, validation"):
        make_loader(tmp_path / "repo")
    for split, count in counts.items():
        assert make_loader(tmp_path / "repo", split=split).num_samples == count


def test_datasets_to_parquet_of_image_files_reads_paths_and_class_labels(
    dataset: Path, tmp_path: Path, make_loader: Make
) -> None:
    """``to_parquet`` of an ``Image`` column built from files keeps only the paths (bytes
    null); the images are read from them, and the ``ClassLabel`` names are the classes."""
    datasets = datasets_or_skip()
    pq = pytest.importorskip("pyarrow.parquet")
    files = sorted(dataset.rglob("*.jpg"))[:24]
    classes = sorted(p.name for p in dataset.iterdir() if p.is_dir())
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=classes)})
    labels = [classes.index(f.parent.name) for f in files]
    table = datasets.Dataset.from_dict({"image": [str(f) for f in files], "label": labels},
                                       features=features)
    out = tmp_path / "paths.parquet"
    table.to_parquet(str(out))
    cells = pq.read_table(out).column("image").to_pylist()
    assert all(cell["bytes"] is None and cell["path"] for cell in cells), cells[0]
    loader = make_loader(out, shuffle=False)
    assert loader.classes == classes
    read = np.concatenate([np.asarray(b["label"]) for b in epoch_batches(loader)])
    assert read.tolist() == labels
    assert loader.stats()["bad_samples"] == 0
    # A path that is gone is a bad sample naming the file, not a null cell.
    files[3].rename(tmp_path / "moved.jpg")
    try:
        gone = make_loader(out, shuffle=False, on_error="fail")
        with pytest.raises(stoker.StokerError, match=files[3].name):
            epoch_batches(gone)
    finally:
        (tmp_path / "moved.jpg").rename(files[3])
