"""A ``Loader.from_dataset`` worker process's own side: it maps the loader's shared slots (a
``memfd`` sent once as a descriptor), loads the batches it is sent straight into them, and
answers each call once; the parent's side is :mod:`stoker._dataset_workers`.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import multiprocessing.reduction
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from stoker import _native
from stoker._busy import IndexWord, listen_for_dumps
from stoker._samples import State, fill_batch, probe
from stoker.errors import DatasetError

__all__ = ["dump_path", "worker_main"]


class _Arena:
    """A worker's mapping of the loader's shared slots."""

    def __init__(self, fd: int, size: int) -> None:
        self.buffer = mmap.mmap(fd, size)
        self.view = memoryview(self.buffer)

    def close(self) -> None:
        self.view.release()
        # An array the dataset's code kept may still view it: the mapping is left to it then.
        with contextlib.suppress(BufferError):
            self.buffer.close()


def _interrupt_passed(signum: int, frame: object) -> None:
    """A worker's SIGINT handler: the interrupt is the parent's to act on."""


def worker_main(conn: Any, state: State | None, dumps: str, loader_pid: int) -> None:
    """A worker process: loads the batches it is sent straight into their slots, in the
    loader's shared slot mapping (sent once, as a descriptor, before the first batch). Its
    stacks go to a file in the folder ``dumps`` when the parent asks (:mod:`stoker._busy`).

    Under spawn and forkserver ``state`` is None: it comes pickled over ``conn`` and is loaded
    here, so that a failure to do so (the dataset's module failing to import in a fresh
    interpreter, say) reaches the parent with its traceback instead of dying in
    multiprocessing's bootstrap; and not as an argument of the process, whose arguments stay
    referenced for its whole life (a second copy of the dataset in every worker)."""
    # Ctrl-C goes to the whole process group; the parent decides, its workers do not. A
    # handler that does nothing, not SIG_IGN: an ignored signal stays ignored in the programs
    # the dataset's code starts (a decoder, a reader), which Ctrl-C then no longer ends. Where
    # the loader's process ignores it (started in the background by a shell script), it stays
    # ignored, for those programs too.
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupt_passed)
    listen_for_dumps(dump_path(dumps, os.getpid()))
    # A native thread: it needs no interpreter lock, which a sample in C code may hold.
    _native.exit_with_loader(loader_pid)
    if state is None:
        try:
            state = pickle.loads(conn.recv_bytes())
        except BaseException:
            with contextlib.suppress(OSError):
                conn.send(("failed", traceback.format_exc()))
            return
    assert isinstance(state, State)
    # Loaded: the parent waits for this before its first call (see `_Worker.started`).
    with contextlib.suppress(OSError):
        conn.send(("ready",))
    # One thread per worker process, as DataLoader's workers: N processes each running torch's
    # intra-op pool would oversubscribe the cores.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    arena: _Arena | None = None
    # Writes the sample being loaded where the parent reads it (the IndexWord it sends first).
    tell: Callable[[int], None] | None = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if message is None:
            return
        try:
            if message[0] == "arena":
                # Nothing is sent back for the mapping: a failure here (out of descriptors or
                # of address space) is the reply to the batch that comes with it, and then
                # this worker stops.
                try:
                    fd = multiprocessing.reduction.recv_handle(conn)
                    if arena is not None:
                        arena.close()
                    arena = _Arena(fd, message[1])
                    os.close(fd)
                except BaseException as error:
                    _reply_error(conn, "mapping the loader's slots", error)
                    return
                continue
            if message[0] == "index":
                # As for the mapping: nothing is sent back unless it fails, and then the
                # failure answers the next call and this worker stops (replies carry no step:
                # one more would answer every later call with the one before's).
                try:
                    tell = IndexWord.mapped(multiprocessing.reduction.recv_handle(conn))
                except BaseException as error:
                    _reply_error(conn, "mapping the loader's sample index word", error)
                    return
                continue
            if message[0] == "layout":
                state.layout = message[1]
                continue
            if message[0] == "probe":
                try:
                    conn.send(("layout", *probe(state)))
                except (DatasetError, TypeError) as error:
                    conn.send(("refused", type(error).__name__, str(error)))
                continue
            _, epoch, indices, offset, length, *rest = message
            if arena is None:
                raise RuntimeError("no slot mapping was sent before the first batch")
            view = arena.view[offset : offset + length]
            try:
                bad, failure = fill_batch(state, epoch, indices, view, loading=tell,
                                          doomed=rest[0] if rest else None)
            finally:
                view.release()
            conn.send(("done", bad, failure))
        except BaseException as error:
            _reply_error(conn, f"handling {message[0]!r}", error)


def _reply_error(conn: Any, doing: str, error: BaseException) -> None:
    """Sends the parent what failed in this worker outside the dataset's samples, with its
    traceback (a reply that cannot be pickled, say)."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    with contextlib.suppress(OSError):
        conn.send(("error", f"{doing}: {text.rstrip()}"))


def dump_path(dumps: str, pid: int) -> str:
    """Where worker process ``pid`` writes its stacks."""
    return os.path.join(dumps, f"{pid}.stacks")
