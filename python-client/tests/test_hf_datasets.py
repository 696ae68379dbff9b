"""Hugging Face ``datasets`` folders from Python: a folder written by the real ``datasets``
package (``Dataset.from_dict(...).cast_column(...)`` then ``save_to_disk``) opens by its path,
gives the ClassLabel's labels and names, and the same pixels (same digest) as the ImageFolder
its images came from; a ``DatasetDict`` folder is refused with the splits to pick.

The ``datasets`` package is installed by ``./dev test`` in CI (``CI=true``) or with
``STOKER_TEST_TORCH=1``; elsewhere these tests are skipped with that reason.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from conftest import (
    SAMPLE_COUNT,
    assert_same_batches,
    class_index_of,
    daemon_binary,
    epoch_batches,
    image_files,
)


def datasets_or_skip() -> Any:
    """The ``datasets`` module, or a pytest skip saying why the test cannot run."""
    try:
        import datasets
    except ImportError as error:
        pytest.skip(
            f"the `datasets` package is not importable ({error}); ./dev test installs it when "
            "CI=true or STOKER_TEST_TORCH=1, so the Hugging Face folder tests are untested here"
        )
    if not hasattr(datasets, "Dataset"):
        # Without the package, `python -m pytest` from the repository root imports the
        # repository's own `datasets/` folder (the Rust crate) as a namespace package.
        pytest.skip(
            "the `datasets` package is not installed (the repository's datasets/ folder was "
            "imported instead); ./dev test installs it when CI=true or STOKER_TEST_TORCH=1"
        )
    return datasets


def class_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def hf_table(datasets: Any, root: Path) -> Any:
    """The images of the ImageFolder ``root`` as a ``datasets.Dataset``: an ``Image`` column,
    a ``ClassLabel`` with the folder's class names, and an integer ``index`` column."""
    files = image_files(root)
    table = datasets.Dataset.from_dict(
        {
            "image": [str(path) for path in files],
            "label": class_index_of(root),
            "index": list(range(len(files))),
        }
    )
    table = table.cast_column("image", datasets.Image())
    return table.cast_column("label", datasets.ClassLabel(names=class_names(root)))


@pytest.fixture(scope="module")
def hf_folder(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    datasets = datasets_or_skip()
    out = tmp_path_factory.mktemp("hf") / "train"
    hf_table(datasets, dataset).save_to_disk(str(out), num_shards=3)
    return out


def digest(batches: list[dict[str, np.ndarray]]) -> str:
    sha = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            sha.update(name.encode())
            sha.update(np.ascontiguousarray(batch[name]).tobytes())
    return sha.hexdigest()


def test_a_saved_dataset_reads_like_the_image_folder(
    dataset: Path, hf_folder: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    assert len(list(hf_folder.glob("data-*.arrow"))) == 3
    assert (hf_folder / "dataset_info.json").is_file() and (hf_folder / "state.json").is_file()
    from_hf = make_loader(hf_folder, seed=5)
    from_folder = make_loader(dataset, seed=5)
    assert from_hf.num_samples == SAMPLE_COUNT
    assert from_hf.classes == class_names(dataset) == from_folder.classes
    hf_batches = epoch_batches(from_hf)
    folder_batches = epoch_batches(from_folder)
    assert sum(len(batch["label"]) for batch in hf_batches) == SAMPLE_COUNT
    assert_same_batches(hf_batches, folder_batches)
    assert digest(hf_batches) == digest(folder_batches)
    # Named explicitly, the format gives the same batches.
    assert digest(epoch_batches(make_loader(hf_folder, seed=5, format="hf"))) == digest(hf_batches)


def test_inspect_describes_the_folder(hf_folder: Path) -> None:
    """``stoker inspect`` names the format, counts shards, record batches and rows, and shows
    each column's feature and role, as text and as JSON."""

    def inspect(*extra: str) -> str:
        command = [str(daemon_binary("stoker")), "inspect", "--data", str(hf_folder), *extra]
        return subprocess.run(
            command, capture_output=True, text=True, check=True, timeout=120
        ).stdout

    text = inspect()
    for expected in (
        "(hugging face datasets)",
        "files     3 (",
        f"record batches, {SAMPLE_COUNT} rows",
        "Image  (images)",
        "ClassLabel (",
        "(labels)",
        f"samples   {SAMPLE_COUNT}",
    ):
        assert expected in text, f"{expected!r} missing: {text}"
    report = json.loads(inspect("--json"))
    assert report["format"] == "hf"
    assert report["files"] == 3 and report["rows"] == SAMPLE_COUNT
    assert report["record_batches"] >= 3
    assert report["sample_column"] == "image" and report["label_column"] == "label"
    features = {column["name"]: column["feature"] for column in report["columns"]}
    assert features["image"] == "Image" and features["label"].startswith("ClassLabel")
    assert report["images"]["samples"] == SAMPLE_COUNT


def test_labels_and_numeric_columns_follow_the_features(
    dataset: Path, hf_folder: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    labels = class_index_of(dataset)
    in_order = epoch_batches(make_loader(hf_folder, shuffle=False))
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in in_order]), labels)
    columns = epoch_batches(
        make_loader(
            hf_folder,
            shuffle=False,
            pipeline=[stoker.ops.SelectColumns(["index", "label"])],
        )
    )
    np.testing.assert_array_equal(
        np.concatenate([b["index"] for b in columns]), np.arange(SAMPLE_COUNT)
    )
    # A shuffle window over record batches still delivers every sample once.
    windowed = epoch_batches(make_loader(hf_folder, seed=3, shuffle_window=1))
    assert sorted(np.concatenate([b["label"] for b in windowed]).tolist()) == sorted(labels)


def test_a_dataset_dict_folder_names_its_splits(
    dataset: Path, tmp_path: Path, make_loader: Callable[..., stoker.Loader]
) -> None:
    datasets = datasets_or_skip()
    table = hf_table(datasets, dataset)
    splits = table.train_test_split(test_size=0.25, seed=0)
    splits.save_to_disk(str(tmp_path / "dict"))
    # Never read whole: the error names the splits and how to pick one, which split= does.
    with pytest.raises(ValueError, match=r'the splits test, train: .*split="train"'):
        make_loader(tmp_path / "dict")
    assert make_loader(tmp_path / "dict", split="test").num_samples == SAMPLE_COUNT // 4
    assert make_loader(tmp_path / "dict" / "test").num_samples == SAMPLE_COUNT // 4
