"""What a dataset loader's lanes are loading, for the message of a timeout: each batch being
loaded, for how long, the sample it is on (in process mode an :class:`IndexWord` the worker
writes), and where the dataset's Python code is in it (the lane thread's stack in thread mode;
in process mode the worker's, which it writes on a signal through :mod:`faulthandler`).

A ``LoaderTimeoutError`` of ``Loader.from_dataset`` thus names the ``__getitem__`` line a hung
sample waits on, rather than only the batch it waits for.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import itertools
import mmap
import os
import re
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

__all__ = [
    "IndexWord", "Loading", "LoadingLog", "batch_text", "describe", "listen_for_dumps",
    "read_dumps", "stacks_folder", "where",
]

STACKS_PREFIX = "stoker-stacks-"


def stacks_folder() -> str:
    """A new folder for a loader's workers' stack files (``close()`` removes it), named by this
    process's id; first, the folders of processes that are gone (a loader killed before its
    ``close()``: SIGKILL, the OOM killer) are removed."""
    base = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            pid = name[len(STACKS_PREFIX):].partition("-")[0]
            if name.startswith(STACKS_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{STACKS_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True

# Frames a message shows, innermost first.
SHOWN_FRAMES = 4
# How long a worker's dump is waited for.
DUMP_WAIT_S = 1.0

# This package's folder, as its modules' frames name it: those frames are left out.
_PACKAGE = os.path.dirname(__file__)
# The file a worker process's stacks go to (kept open for the process's life).
_dump_file: IO[str] | None = None


class IndexWord:
    """The dataset index a worker process is loading (-1: none), in a word of a memfd the
    parent makes and sends the worker (``fd``), which maps it too (:meth:`mapped`): the parent
    reads it while the worker hangs, or after it died."""

    _WORD = struct.Struct("q")

    def __init__(self) -> None:
        self.fd = os.memfd_create("stoker-worker-index", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, mmap.PAGESIZE)
        self._map = mmap.mmap(self.fd, mmap.PAGESIZE)

    @staticmethod
    def mapped(fd: int) -> Callable[[int], None]:
        """In the worker: what writes an index into the word of ``fd`` (closed here)."""
        word = mmap.mmap(fd, mmap.PAGESIZE)
        os.close(fd)
        return functools.partial(IndexWord._WORD.pack_into, word, 0)

    def set(self, index: int) -> None:
        self._WORD.pack_into(self._map, 0, index)

    def read(self) -> int:
        """The index written last; -1 when none (or closed)."""
        try:
            index: int = self._WORD.unpack_from(self._map, 0)[0]
        except ValueError:
            return -1
        return index

    def close(self) -> None:
        """Lets go of the word (a read meanwhile gives -1); once."""
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Loading:
    """One batch a lane is loading: what (``doing``), since when (``time.monotonic()``), on
    which thread (``threading.get_ident()``)."""

    lane: int
    doing: str
    since: float
    thread: int


class LoadingLog:
    """The batches the lanes of one builder are loading now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # By thread: lane k of a loader and of the loader of an epoch resumed on another world
        # size share worker k, each from a thread of its own.
        self._loading: dict[int, Loading] = {}

    @contextlib.contextmanager
    def loading(self, lane: int, doing: str) -> Iterator[None]:
        """Notes lane ``lane`` as loading ``doing`` on this thread while the block runs."""
        entry = Loading(lane, doing, time.monotonic(), threading.get_ident())
        with self._lock:
            self._loading[entry.thread] = entry
        try:
            yield
        finally:
            with self._lock:
                del self._loading[entry.thread]

    def now(self) -> list[Loading]:
        """The batches being loaded, the longest-running first."""
        with self._lock:
            entries = list(self._loading.values())
        return sorted(entries, key=lambda entry: entry.since)


def batch_text(epoch: int, step: int, indices: list[int], shown: int = 8) -> str:
    """What loading a batch is, for a message: its step, epoch and first ``shown`` dataset
    indices."""
    listed = ", ".join(str(i) for i in indices[:shown])
    more = f", ... ({len(indices)} in all)" if len(indices) > shown else ""
    return f"loading step {step} of epoch {epoch} (dataset indices {listed}{more})"


def where(thread: int) -> str:
    """Where thread ``thread`` of this process is in the dataset's Python code, innermost frame
    first ("" when it runs none)."""
    frame = sys._current_frames().get(thread)
    if frame is None:
        return ""
    # Names and numbers only: reading the source lines could hang on the very file system
    # the sample waits for.
    stack = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
    frames = _dataset_frames(list(stack), lambda f: f.filename)
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in frames)


def _dataset_frames(frames: list[T], path: Callable[[T], str]) -> list[T]:
    """Of a stack, innermost first, the dataset's frames under this package's call (what this
    package's code runs beneath them, as ``sample_rng()``, left out), :data:`SHOWN_FRAMES` at
    most."""
    inner = list(itertools.dropwhile(lambda frame: _ours(path(frame)), frames))
    return list(itertools.takewhile(lambda frame: not _ours(path(frame)), inner))[:SHOWN_FRAMES]


def _ours(filename: str) -> bool:
    """Whether a frame is in this package's code (left out: the dataset's code is the news).
    By the path the package was imported from, as its frames carry it: no file system call,
    which could hang where the sample hangs."""
    return os.path.dirname(filename) == _PACKAGE


def _dump_signal() -> int | None:
    """The signal a worker process writes its stacks on (None where there is none)."""
    return getattr(signal, "SIGUSR1", None)


def listen_for_dumps(path: str) -> None:
    """In a worker process: writes every thread's stack to ``path`` (appended) when
    :func:`_dump_signal` comes. Nothing where it cannot (the signal missing, the file not
    opened): the parent checks that the signal is caught before it sends it."""
    global _dump_file
    number = _dump_signal()
    if number is None:
        return
    try:
        _dump_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept for the process)
        faulthandler.register(number, file=_dump_file, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        return


def _catches(pid: int, number: int) -> bool:
    """Whether process ``pid`` has a handler for signal ``number`` (Linux's ``SigCgt``): only
    then is it sent, since the default action of the dump signal ends the process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    found = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", status, re.MULTILINE)
    return found is not None and bool(int(found.group(1), 16) >> (number - 1) & 1)


def read_dumps(workers: list[tuple[int, str]], wait: float = DUMP_WAIT_S) -> dict[int, str]:
    """Asks each worker process ``(pid, path)`` for its stacks (written to ``path`` by
    :func:`listen_for_dumps`), all at once, and returns by pid where each is in Python code,
    innermost frame first; "" for one whose stacks cannot be had within ``wait`` seconds."""
    number = _dump_signal()
    asked: dict[int, tuple[str, int]] = {}
    for pid, path in workers:
        if number is None or not _catches(pid, number):
            continue
        try:
            start = os.path.getsize(path)
            os.kill(pid, number)
        except OSError:
            continue
        asked[pid] = (path, start)
    found = {pid: "" for pid, _ in workers}
    deadline = time.monotonic() + wait
    sizes = {pid: start for pid, (_, start) in asked.items()}
    while asked and time.monotonic() < deadline:
        time.sleep(0.02)
        for pid, (path, start) in list(asked.items()):
            try:
                size = os.path.getsize(path)
            except OSError:
                del asked[pid]
                continue
            if size > start and size == sizes[pid]:  # written, and no longer growing
                found[pid] = _read_from(path, start)
                del asked[pid]
            sizes[pid] = size
    return found


def _read_from(path: str, start: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            file.seek(start)
            return _loading_stack(file.read())
    except OSError:
        return ""


def _loading_stack(text: str) -> str:
    """The frames of a faulthandler dump's thread that is loading a batch (the one whose stack
    passes through ``fill_batch``; else the first): its dataset frames, innermost first, as
    :func:`where` writes them."""
    threads: list[list[tuple[str, str, str]]] = []
    for line in text.splitlines():
        found = re.match(r'\s+File "(.*)", line (\d+|\?\?\?) in (.*)$', line)
        if found is None:
            if line and not line.startswith(" "):
                threads.append([])  # "Thread 0x... (most recent call first):"
            continue
        if not threads:
            threads.append([])
        threads[-1].append((found.group(1), found.group(2), found.group(3)))
    threads = [frames for frames in threads if frames]
    if not threads:
        return ""
    loading = next(
        (frames for frames in threads if any(name == "fill_batch" for _, _, name in frames)),
        threads[0],
    )
    frames = _dataset_frames(loading, lambda frame: frame[0])
    return " <- ".join(f"{os.path.basename(path)}:{line} in {name}" for path, line, name in frames)


def describe(entries: list[tuple[Loading, str, str]], now: float) -> str:
    """One sentence per batch being loaded: ``(entry, who, where)`` with ``who`` naming the
    lane ("dataset worker process 1 (pid 42)") and ``where`` its stack ("" if unknown)."""
    parts = []
    for entry, who, place in entries:
        part = f"{who} has been {entry.doing} for {now - entry.since:.1f} s"
        parts.append(part + (f", at {place}" if place else ""))
    return "; ".join(parts)

