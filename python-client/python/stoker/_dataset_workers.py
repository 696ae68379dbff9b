"""``Loader.from_dataset``'s worker processes, the parent's side: each started (the start
method and ``__main__`` checks that let a dataset reach a fresh interpreter), sent its batches,
replaced when it dies, and closed. What runs in the process is :mod:`stoker._worker_process`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.reduction
import os
import pickle
import shutil
import signal
import threading
import time
import weakref
from typing import Any, NoReturn

from stoker._busy import (
    IndexWord,
    LoadingLog,
    batch_text,
    describe,
    read_dumps,
    stacks_folder,
)
from stoker._samples import Layout, State, on_sample
from stoker._start_method import main_not_rerun, unpicklable_part
from stoker._worker_process import dump_path, worker_main
from stoker.errors import DatasetError, LoaderTimeoutError, StokerError

__all__ = ["ProcessBuilder"]

_log = logging.getLogger("stoker")

# Seconds a closing loader's workers have to finish their batch and exit before they are killed.
_CLOSE_GRACE_S = 5.0

# Seconds between two looks, while a lane waits for its worker's reply, at whether it exited.
_DEATH_CHECK = 0.1

# Every worker process started, so that a child forked from this process forgets them.
_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()

# Held while a worker process is started, until the parent closes the child's end of its pipe.
_STARTING = threading.Lock()

# The parent's ends of the workers' pipes until closed. Held here, so that when a loader is in
# a reference cycle (a transform bound to an object holding it) the collector does not finalise
# them with the cycle: a Connection's __del__ closes its descriptor without marking it closed,
# and the loader's own close() then closed the same number again (EBADF, or a descriptor
# opened meanwhile). A pipe holds no reference back to the dataset.
_OPEN_PIPES: set[Any] = set()


def _forget_workers_in_child() -> None:
    """In a child made by ``fork()``: drops the parent's worker processes from multiprocessing's
    list of this process's children. Left there, the child's exit would SIGTERM them (its exit
    handler ends every daemonic child it lists) and the parent's loader would lose them."""
    children = getattr(multiprocessing.process, "_children", None)
    if isinstance(children, set):
        children.difference_update(list(_STARTED))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_in_child)


def _live_pid(process: Any) -> int | None:
    """The pid of ``process`` while it runs (a dead worker's pid may be another process's
    by now, which must not be signalled); None once it exited."""
    try:
        return int(process.pid) if process.is_alive() else None
    except (AssertionError, ValueError, OSError):
        return None


class _WorkerDied(StokerError):
    """A worker process exited (killed, crashed) while it had work: a batch is built again by
    a new process, anything else is raised as it is. ``index``: the sample it was on (-1:
    none, or not known)."""

    def __init__(self, message: str, index: int = -1) -> None:
        super().__init__(message)
        self.index = index


class _Worker:
    """Worker process ``number``, replaced by a new one when it dies (see :meth:`build`)."""

    def __init__(
        self, context: Any, number: int, state: State | bytes, dumps: str, log: LoadingLog,
        skip: bool = False,
    ) -> None:
        self.number = number
        # on_error="skip": a sample that killed two processes is a bad sample.
        self.skip = skip
        self.context = context
        self.state = state
        self.dumps = dumps
        self.log = log
        self.start_method: str = context.get_start_method()
        self.layout: Layout | None = None
        self.stopping = False
        # The dataset index the process is loading (-1: none), a word of a memfd it maps too:
        # named by a timeout, and by the message of its death.
        self._index = IndexWord()
        # Lane k of the loader, and of the loader of an epoch resumed on another world size,
        # share worker k: one exchange at a time. Whoever holds it is the only one to use,
        # replace or close ``conn``: a pipe is not safe to close from one thread while another
        # uses it (the descriptor's number goes to the next file opened, which the other
        # thread would then read, write or close).
        self.lock = threading.Lock()
        try:
            self._start()
        except BaseException:
            self._index.close()
            raise

    def _start(self) -> None:
        """Starts the process (and sends it the layout, once known); the slot mapping goes
        with its first batch."""
        # One start at a time: a worker forked by another lane meanwhile would inherit this
        # one's end of the pipe and keep it open, so this lane would not see its worker die.
        with _STARTING:
            parent, child = self.context.Pipe()
            pickled = self.state if isinstance(self.state, bytes) else None
            process = self.context.Process(
                target=worker_main,
                args=(child, None if pickled is not None else self.state, self.dumps,
                      os.getpid()),
                name=f"stoker-dataset-worker-{self.number}",
                daemon=True,
            )
            # Listed before it starts: a fork by another thread meanwhile must not leave it on
            # the child's list of processes to end.
            _STARTED.add(process)
            try:
                with main_not_rerun(self.context):
                    process.start()
            except AssertionError as error:
                # multiprocessing's own check: a daemonic process (a DataLoader worker) may
                # not start children.
                _STARTED.discard(process)
                parent.close()
                child.close()
                if "daemonic" not in str(error):
                    raise
                raise ValueError(
                    "Loader.from_dataset(num_workers=...) starts worker processes, and this "
                    "process is a daemonic one (a DataLoader worker, say), which may not have "
                    "children: use num_threads=N here"
                ) from None
            child.close()
        # Started before it is seen: close() may join it from another thread.
        self.process, self.conn = process, parent
        _OPEN_PIPES.add(parent)
        try:
            # A worker that dies before reading these is seen by the caller's next exchange.
            with contextlib.suppress(OSError):
                if pickled is not None:
                    parent.send_bytes(pickled)
                self._index.set(-1)
                parent.send(("index",))
                multiprocessing.reduction.send_handle(parent, self._index.fd, process.pid)
                if self.layout is not None:
                    parent.send(("layout", self.layout))
        except BaseException:
            # Interrupted mid-start (a Ctrl-C during a long send): the child, which ignores
            # SIGINT, would wait on its pipe until this interpreter exits; it goes now.
            with contextlib.suppress(OSError, ValueError):
                process.kill()
                process.join(timeout=5.0)
            parent.close()
            _OPEN_PIPES.discard(parent)
            raise
        self.arena: int | None = None

    def set_layout(self, layout: Layout) -> None:
        """Sends the samples' layout (and keeps it for a replacement); a worker gone by then
        is seen, and replaced with it, at its next exchange."""
        with self.lock:
            self.layout = layout
            with contextlib.suppress(OSError):
                self.conn.send(("layout", layout))

    def build(
        self, epoch: int, step: int, indices: list[int], view: memoryview,
        shared: tuple[int, int, int, int] | None,
    ) -> Any:
        if shared is None:
            raise StokerError("process mode needs the loader's slots in shared memory")
        doing = batch_text(epoch, step, indices)
        message = ("build", epoch, indices, shared[3], len(view))
        try:
            with self.lock, self.log.loading(self.number, doing):
                if not self.process.is_alive() and not self.stopping:
                    self._replace(f"it died before {doing}{self._last_words()}")
                try:
                    return self._build(shared, message, doing)
                except _WorkerDied as died:
                    if self.stopping:
                        raise StokerError(str(died)) from None
                    # Killed (the OOM killer, say) or crashed: a new process builds the batch
                    # again, the same bytes (samples are seeded by their index). Twice is the
                    # dataset's doing, not chance: raised.
                    self._replace(str(died))
                    first = died.index
                try:
                    return self._build(shared, message, doing)
                except _WorkerDied as died:
                    if not (self.skip and died.index >= 0 and died.index == first):
                        raise StokerError(
                            f"{died}, as did the process started in its place"
                        ) from None
                    # The same sample ended two processes: under skip it is a bad sample, and
                    # a third builds the batch without it.
                    self._replace(str(died))
                    doomed = {died.index: f"dataset[{died.index}] ended the worker process "
                                          f"loading it, twice: {died}"}
                try:
                    return self._build(shared, (*message, doomed), doing)
                except _WorkerDied as died:
                    raise StokerError(
                        f"{died}, after two processes ended on dataset[{first}]"
                    ) from None
        finally:
            # A stop asked while this exchange held the pipe is sent now: ask_to_stop marks
            # the worker stopping before it tries the lock, so either it got the lock or this
            # sees the mark (or a lane that took the lock since sends it as it lets go).
            if self.stopping:
                self.ask_to_stop()

    def _build(
        self, shared: tuple[int, int, int, int], message: tuple[Any, ...], doing: str
    ) -> Any:
        arena, fd, size, _ = shared
        try:
            if self.arena != arena:
                self.conn.send(("arena", size))
                multiprocessing.reduction.send_handle(self.conn, fd, self.process.pid)
                self.arena = arena
        except OSError:
            self._died(doing)
        _, bad, failure = self.call(message, doing)
        return bad, failure

    def _replace(self, why: str) -> None:
        """Starts a new process in place of the dead one; a StokerError instead once the loader
        is closing (close() joins the processes it has, not one started after it)."""
        if self.stopping:
            raise StokerError(f"{why}; the loader is closing")
        exitcode = self.process.exitcode
        self.conn.close()
        _OPEN_PIPES.discard(self.conn)
        self._start()
        if self.stopping:  # close() came meanwhile: this one stops too
            self._send_stop()
        _log.warning(
            "dataset worker process %d (exit code %s) replaced by pid %d: %s",
            self.number, exitcode, self.process.pid, why,
        )

    def call(self, message: Any, doing: str, timeout: float | None = None) -> Any:
        """Sends ``message`` and returns the worker's reply; a StokerError when it died or
        failed outside the dataset's code, LoaderTimeoutError when ``timeout`` passed."""
        try:
            try:
                self.conn.send(message)
            except OSError:
                # Gone before it read this: a reply it left says why (its failure to load
                # the dataset sent to it, say).
                if not self.conn.poll(0):
                    raise
                answered: bool | None = True
            else:
                answered = self._answered(timeout)
            if answered is None:
                self._died(doing)
            if answered:
                reply = self.conn.recv()
        except (EOFError, OSError):
            self._died(doing)
        if not answered:
            raise LoaderTimeoutError(
                f"dataset worker process {self.number} (pid {self.process.pid}) did not "
                f"finish {doing} within {timeout} s"
            )
        if reply[0] == "error":
            raise StokerError(f"dataset worker process {self.number} failed: {reply[1]}")
        if reply[0] == "failed":
            self.process.join(timeout=5.0)
            raise DatasetError(
                f"dataset worker process {self.number} could not load the dataset sent to it "
                f"({self.start_method}): "
                + _last_lines(reply[1])
            )
        return reply

    def _answered(self, timeout: float | None) -> bool | None:
        """Whether the reply came within ``timeout``; None when the process exited without
        one. Its exit is asked of the process itself (``waitpid``), not only read from the
        pipe's end or the process's sentinel: a process the dataset's code started in the
        worker inherits both and holds them open past the worker's death (killed by the OOM
        killer, say), where neither would tell."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _DEATH_CHECK if deadline is None else min(
                _DEATH_CHECK, max(0.0, deadline - time.monotonic())
            )
            if self.conn.poll(wait):
                return True
            if not self.process.is_alive():
                return True if self.conn.poll(0) else None
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def loading(self) -> int:
        """The dataset index the process is loading now, -1 when none (or closed)."""
        return self._index.read()

    def _died(self, doing: str) -> NoReturn:
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        killed = ""
        if isinstance(code, int) and code < 0:
            with contextlib.suppress(ValueError):
                killed = f", {signal.Signals(-code).name}"
        index = self.loading()
        raise _WorkerDied(
            f"dataset worker process {self.number} (pid {self.process.pid}) exited with "
            f"code {code}{killed} while {doing}{on_sample(index)}{self._last_words()}", index
        ) from None

    def _last_words(self) -> str:
        """What a dead worker sent that nobody read (its failure outside the dataset's
        samples), as the end of a message; "" when it left nothing."""
        try:
            reply = self.conn.recv() if self.conn.poll(0) else None
        except Exception:  # cut short as it died
            return ""
        if not (isinstance(reply, tuple) and reply and reply[0] in ("error", "failed")):
            return ""
        return f" (it said: {_last_lines(str(reply[-1]), 2)})"

    def ask_to_stop(self) -> None:
        """Asks the worker to exit once its current batch is done (and not to be replaced): at
        once when no lane is in an exchange with it, else by that lane as its exchange ends."""
        self.stopping = True
        if self.lock.acquire(blocking=False):
            try:
                self._send_stop()
            finally:
                self.lock.release()

    def _send_stop(self) -> None:
        """Sends the stop message; the caller holds ``lock``."""
        with contextlib.suppress(OSError):
            self.conn.send(None)

    def _close_conn(self, wait: float, joined: Any = None) -> None:
        """Closes the pipe once no lane is in an exchange with the worker (waiting up to
        ``wait`` seconds; its process is dead by then, so a lane's read ends at once). A lane
        that still holds it keeps the pipe open: one descriptor left rather than a number
        closed under a thread that may still use it. A process a lane started after
        ``joined`` was ended (a replacement that raced close()) is killed and joined first."""
        if self.conn.closed:
            return
        if not self.lock.acquire(timeout=wait):
            _log.warning(
                "dataset worker process %d: a lane still holds its pipe; left open", self.number
            )
            return
        try:
            if joined is not None and self.process is not joined:
                with contextlib.suppress(OSError, ValueError):
                    self.process.kill()
                    self.process.join(timeout=5.0)
            self.conn.close()
            _OPEN_PIPES.discard(self.conn)
            self._index.close()
        finally:
            self.lock.release()

    def kill(self) -> None:
        """Kills the worker if it still runs, without waiting (a replacement is the one
        ``self.process`` names; the one it replaced is dead)."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.is_alive():
                self.process.kill()
        with contextlib.suppress(OSError):
            self._close_conn(0.0)

    def end(self, deadline: float) -> Any:
        """Waits for the worker to exit until ``deadline`` (``time.monotonic()``), then kills it
        (and a replacement a lane started meanwhile); returns the last process it ended, for
        :meth:`close_conn`."""
        process = self.process
        process.join(timeout=max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(timeout=5.0)
        if self.process is not process:
            process = self.process
            process.kill()
            process.join(timeout=5.0)
        return process

    def close_conn(self, ended: Any) -> None:
        """Closes the pipe once its lane lets go, after :meth:`end` returned ``ended``."""
        self._close_conn(5.0, ended)


class ProcessBuilder:
    """Process mode: lane k hands its batches to worker process k."""

    def __init__(self, state: State, workers: int, context: Any) -> None:
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._log = LoadingLog()
        self._dumps = ""
        # A fresh interpreter gets the state pickled here and loads it itself (see
        # `stoker._worker_process.worker_main`); a forked worker inherits it as it is. Plain
        # pickle, by value: the same bytes go to every worker and to replacements, and
        # torch's reductions for process handover (tensors moved to shared memory, passed by
        # a handle one process takes) would serve only the first.
        sent: State | bytes = state
        method = context.get_start_method()
        if method != "fork":
            try:
                sent = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as error:
                raise DatasetError(
                    f"the {unpicklable_part(state)} cannot be sent to worker processes started "
                    f"by {method!r}: it does not pickle ({type(error).__name__}: {error}); "
                    "multiprocessing_context='fork' hands it over without pickling"
                ) from error
        try:
            # The workers' stack files (see stoker._busy), removed by close().
            self._dumps = stacks_folder()
            for number in range(workers):
                self._workers.append(_Worker(context, number, sent, self._dumps, self._log,
                                             skip=state.on_error == "skip"))
        except BaseException:
            self.close()
            raise

    def probe(self, timeout: float) -> Layout:
        """The layout of ``dataset[0]``, read by worker 0 and sent to every worker."""
        first = self._workers[0]
        with first.lock:
            try:
                reply = first.call(("probe",), "reading dataset[0]", timeout)
            except _WorkerDied as died:
                # Its own error went to its stderr, which is this process's.
                hint = ("" if first.start_method == "fork" else
                        f"; under the {first.start_method!r} start method a script must "
                        "make the loader under `if __name__ == \"__main__\":`")
                raise DatasetError(f"{died} (its error is on stderr above{hint})") from None
        if reply[0] == "refused":
            kind = TypeError if reply[1] == "TypeError" else DatasetError
            raise kind(reply[2])
        layout: Layout = reply[1]
        if reply[2]:
            _log.warning("%s", reply[2])  # in this process, where the logging is set up
        for worker in self._workers:
            worker.set_layout(layout)
        return layout

    def build(
        self, lane: int, epoch: int, step: int, indices: list[int], view: memoryview,
        shared: tuple[int, int, int, int] | None,
    ) -> Any:
        return self._workers[lane].build(epoch, step, indices, view, shared)

    def loading_now(self) -> str:
        """What the worker processes are loading now, for how long, and where each is in
        Python code (see :mod:`stoker._busy`); "" when none is loading."""
        workers = self._workers
        loading = [(entry, _live_pid(workers[entry.lane].process))
                   for entry in self._log.now() if entry.lane < len(workers)]
        stacks = read_dumps([(pid, dump_path(self._dumps, pid)) for _, pid in loading if pid])
        now = time.monotonic()
        return describe([
            (entry, f"dataset worker process {entry.lane} (pid {pid})"
                    f"{on_sample(workers[entry.lane].loading())}", stacks.get(pid, ""))
            if pid is not None else (entry, f"dataset worker process {entry.lane} (exited)", "")
            for entry, pid in loading
        ], now)

    def close(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        # All asked at once and waited for together: a close takes one grace period, not one
        # per busy worker (their batches are dropped anyway).
        for worker in workers:
            worker.ask_to_stop()
        deadline = time.monotonic() + _CLOSE_GRACE_S
        try:
            # Every process ended before any pipe is closed: a lane reading a pipe sees its
            # end once the process is gone, which may be another worker's turn.
            ended = [worker.end(deadline) for worker in workers]
            for worker, process in zip(workers, ended, strict=True):
                worker.close_conn(process)
        finally:
            # Interrupted meanwhile (a second Ctrl-C in the grace period): the workers not
            # waited for are killed now rather than left running with nothing to stop them.
            for worker in workers:
                worker.kill()
            if self._dumps:
                shutil.rmtree(self._dumps, ignore_errors=True)


def _last_lines(text: str, count: int = 6) -> str:
    """The end of a traceback, where the error is."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])
