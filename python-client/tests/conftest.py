"""Shared fixtures of the stoker Python tests: the sample image folders and a loader factory.

One 120-image ImageNet-like folder is generated per session (by the native generator, seeded,
so every run sees the same files), plus a tiny folder mixing good JPEGs with bad files (empty,
truncated, text named .jpg) for the bad-input tests. The distributed tests start the release
``stoker coordinator`` and ``stoker-worker`` daemons here too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import _native

SAMPLE_COUNT = 120
SMALL_CROP = 32
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 120-image, 10-class ImageFolder."""
    root = _native.make_dataset(str(tmp_path_factory.mktemp("imagenet-like")), SAMPLE_COUNT, seed=1)
    return Path(root)


@pytest.fixture(scope="session")
def bad_dataset(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two classes: four good JPEGs each, and three bad files in ``b_bad``."""
    root = tmp_path_factory.mktemp("bad-set")
    good = sorted(p for p in dataset.rglob("*") if p.is_file())
    for class_name, files in (("a_good", good[:4]), ("b_bad", good[4:8])):
        (root / class_name).mkdir()
        for source in files:
            shutil.copy(source, root / class_name / source.name)
    bad = root / "b_bad"
    (bad / "empty.jpg").write_bytes(b"")
    whole = good[8].read_bytes()
    (bad / "truncated.jpg").write_bytes(whole[: len(whole) // 3])
    (bad / "notes.jpg").write_text("this is a text file, not a JPEG\n")
    return root


def image_files(root: Path) -> list[Path]:
    """The folder's samples in ImageFolder order: sorted classes, then sorted file names."""
    return [
        file
        for cls in sorted(p for p in root.iterdir() if p.is_dir())
        for file in sorted(cls.iterdir())
    ]


def class_index_of(root: Path) -> list[int]:
    """Label of each sample index: the position of its class folder among the sorted ones."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [classes.index(path.parent.name) for path in image_files(root)]


@pytest.fixture
def make_loader(dataset: Path) -> Iterator[Callable[..., stoker.Loader]]:
    """Builds loaders over ``dataset`` with small, fast defaults, and closes them afterwards."""
    made: list[stoker.Loader] = []

    def make(source: Any = None, **overrides: Any) -> stoker.Loader:
        options: dict[str, Any] = {
            "pipeline": stoker.vision.imagenet_train(SMALL_CROP),
            "batch_size": 16,
            "num_threads": 2,
            "output": "numpy",
            "timeout": 30,
        }
        options.update(overrides)
        loader = stoker.Loader(dataset if source is None else source, **options)
        made.append(loader)
        return loader

    yield make
    for loader in made:
        loader.close()


def epoch_batches(loader: stoker.Loader) -> list[dict[str, np.ndarray]]:
    """One epoch, each tensor copied (so the slots go back and later epochs can run)."""
    return [{name: np.array(value, copy=True) for name, value in batch.items()} for batch in loader]


def require_cuda_torch(tests: str) -> Any:
    """torch with a usable CUDA device, or a skip of ``tests`` naming what is missing."""
    try:
        import torch
    except ImportError as error:
        pytest.skip(f"torch is not importable ({error}): no GPU test can run")
    if torch.version.cuda is None or not torch.cuda.is_available():
        pytest.skip(
            f"no CUDA GPU here (torch {torch.__version__}, cuda {torch.version.cuda}, "
            f"is_available {torch.cuda.is_available()}): {tests} run on a GPU machine"
        )
    return torch


def read_indices(loader: stoker.Loader, steps: int | None = None) -> list[int]:
    """Sample indices of ``steps`` batches (all: None) of the loader's current epoch."""
    iterator = iter(loader)
    indices: list[int] = []
    for taken, _ in enumerate(iterator, start=1):
        indices.extend(iterator.sample_indices)
        if steps is not None and taken == steps:
            break
    return indices


def assert_same_batches(
    left: list[dict[str, np.ndarray]], right: list[dict[str, np.ndarray]]
) -> None:
    assert len(left) == len(right)
    for step, (a, b) in enumerate(zip(left, right, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, (step, name)
            assert np.array_equal(a[name], b[name]), f"step {step}: {name} differs"


def torch_or_skip() -> Any:
    """The torch module, or a pytest skip saying why the test cannot run."""
    try:
        import torch
    except ImportError as error:
        pytest.skip(f"torch is not importable ({error}); the torch output path is untested here")
    return torch


@pytest.fixture(autouse=True)
def _no_rank_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A RANK set by the shell (or a torchrun parent) would shard every loader in the suite.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def daemon_binary(name: str) -> Path:
    """The release build of ``name`` (``./dev test`` builds it before pytest runs)."""
    folder = Path(os.environ.get("STOKER_BIN_DIR", REPO / "target" / "release"))
    path = folder / name
    if not path.exists():
        pytest.fail(
            f"{path} is missing: build it with "
            "`cargo build --release -p stoker-cli -p stoker-worker-daemon`"
        )
    return path


def write_test_certificates(folder: Path, names: Sequence[str]) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate it signs for ``names`` (DNS names or IP
    addresses), written into ``folder``: the paths of the CA, the certificate and its key."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert(*names)
    paths = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
    ca.cert_pem.write_to_path(str(paths[0]))
    server.cert_chain_pems[0].write_to_path(str(paths[1]))
    server.private_key_pem.write_to_path(str(paths[2]))
    return str(paths[0]), str(paths[1]), str(paths[2])


def start_daemon(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Starts a daemon; returns it and the address its first line says it listens on."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.kill()
        pytest.fail(f"{args[0]} exited before printing its address")
    return process, line.split()[-1]


@contextlib.contextmanager
def running_cluster(
    dataset: Path,
    state: Path,
    worker_args: Sequence[str] = (),
    coordinator_args: Sequence[str] = (),
    workers: int = 2,
) -> Iterator[str]:
    """A coordinator journaling in ``state`` and ``workers`` one-thread workers allowed to read
    ``dataset`` (each daemon given its extra arguments); yields the coordinator's address and
    SIGKILLs them all at the end."""
    processes = []
    try:
        coordinator, address = start_daemon(
            [str(daemon_binary("stoker")), "coordinator", "--listen", "127.0.0.1:0",
             "--state", str(state), *coordinator_args]
        )
        processes.append(coordinator)
        for _ in range(workers):
            worker, _ = start_daemon(
                [str(daemon_binary("stoker-worker")), "--coordinator", address,
                 "--data-root", str(dataset), "--threads", "1", *worker_args]
            )
            processes.append(worker)
        yield address
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def cluster(dataset: Path, tmp_path: Path) -> Iterator[str]:
    """A coordinator and two workers allowed to read ``dataset``; yields the coordinator."""
    with running_cluster(dataset, tmp_path / "state") as address:
        yield address


class RecordingNative:
    """Stands in for a loader's native handle and keeps what ``note`` reads of each batch it
    hands out (not the batch itself, which would hold its slot)."""

    def __init__(self, native: Any, note: Callable[[Any], Any]) -> None:
        self._native = native
        self._note = note
        self.notes: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def next_batch(self) -> Any:
        item = self._native.next_batch()
        if item is not None:
            self.notes.append(self._note(item))
        return item

    def try_next_batch(self) -> Any:
        item = self._native.try_next_batch()
        if item is not None:
            self.notes.append(self._note(item))
        return item
