"""One of ``Loader.from_dataset``'s worker processes, the parent's side: started (the state
sent on a thread of its own, the start waited for with a deadline), sent its batches, replaced
when it dies, and closed. What runs in the process is :mod:`stoker._worker_process`; the
loader's set of them is :mod:`stoker._process_builder`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.reduction
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, NoReturn

from stoker._busy import IndexWord, LoadingLog, batch_text
from stoker._samples import Layout, State, on_sample
from stoker._start_method import main_not_rerun
from stoker._worker_process import worker_main
from stoker.errors import DatasetError, LoaderTimeoutError, StokerError

__all__ = ["Worker", "WorkerDied"]

_log = logging.getLogger("stoker")

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


class WorkerDied(StokerError):
    """A worker process exited (killed, crashed) while it had work: a batch is built again by
    a new process, anything else is raised as it is. ``index``: the sample it was on (-1:
    none, or not known)."""

    def __init__(self, message: str, index: int = -1) -> None:
        super().__init__(message)
        self.index = index


class Worker:
    """Worker process ``number``, replaced by a new one when it dies (see :meth:`build`)."""

    def __init__(
        self, context: Any, number: int, state: State | bytes, dumps: str, log: LoadingLog,
        start_timeout: float, skip: bool = False,
    ) -> None:
        self.number = number
        # Seconds a new process has to load the state sent to it (see :meth:`started`).
        self.start_timeout = start_timeout
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
        # The thread in an exchange (holding ``lock``, see :meth:`exchange`), None when none.
        self._holder: int | None = None
        # Sends a new process its state, until :meth:`started` has seen it loaded.
        self._sender: threading.Thread | None = None
        try:
            self._start()
        except BaseException:
            self._index.close()
            raise

    def _start(self) -> None:
        """Starts the process and, on a thread of its own, sends it its state (and the
        layout, once known); the slot mapping goes with its first batch. :meth:`started`
        waits for the process to have loaded the state: the workers of a loader start side
        by side, a fresh interpreter taking a state larger than the pipe's buffer only once
        it has started, which may take seconds (imports)."""
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
        self.arena: int | None = None
        sender = threading.Thread(
            target=self._hand_over, args=(parent, pickled, process.pid, self.layout),
            name=f"stoker-worker-{self.number}-start", daemon=True,
        )
        try:
            self._index.set(-1)
            sender.start()
        except BaseException:
            # Interrupted mid-start (a Ctrl-C): the child, which passes on SIGINT, would wait on
            # its pipe until this interpreter exits; it goes now, and once a sender that
            # started has ended on it (its process gone), so does the pipe.
            with contextlib.suppress(OSError, ValueError):
                process.kill()
                process.join(timeout=5.0)
            if sender.ident is not None:
                sender.join(timeout=5.0)
            if not sender.is_alive():
                parent.close()
                _OPEN_PIPES.discard(parent)
            raise
        self._sender = sender

    def _hand_over(
        self, conn: Any, pickled: bytes | None, pid: int, layout: Layout | None
    ) -> None:
        """The sender thread: what a new process reads before its first call. A process that
        dies (or is killed) before reading it all ends the send (EPIPE)."""
        with contextlib.suppress(OSError, ValueError):
            if pickled is not None:
                conn.send_bytes(pickled)
            conn.send(("index",))
            multiprocessing.reduction.send_handle(conn, self._index.fd, pid)
            if layout is not None:
                conn.send(("layout", layout))

    def started(self, deadline: float) -> None:
        """Waits, until ``deadline`` (``time.monotonic()``), for the process last started to
        have loaded its state: a LoaderTimeoutError past it, the process killed; WorkerDied
        when it exited first; DatasetError when it could not load the state."""
        sender, timeout = self._sender, self.start_timeout
        try:
            if sender is not None:
                sender.join(timeout=max(0.0, deadline - time.monotonic()))
                if sender.is_alive():
                    raise LoaderTimeoutError(self._not_started(timeout))
                self._sender = None
            try:
                answered = self._answered(max(0.0, deadline - time.monotonic()))
                reply = self.conn.recv() if answered else None
            except (EOFError, OSError):
                self._died("starting")  # or its pipe closed under it, by close()
            if answered is None:
                self._died("starting")
            if not answered:
                raise LoaderTimeoutError(self._not_started(timeout))
            reply = self._checked(reply)
            if reply[0] != "ready":
                raise StokerError(
                    f"dataset worker process {self.number} answered {reply[0]!r} as it started"
                )
        except BaseException:
            # Ended here: a process that did not start, or whose start was interrupted (a
            # Ctrl-C), would otherwise wait on its pipe until this interpreter exits.
            with contextlib.suppress(OSError, ValueError):
                self.process.kill()
                self.process.join(timeout=5.0)
            if sender is not None:
                sender.join(timeout=5.0)
                if not sender.is_alive():
                    self._sender = None
            raise

    def _not_started(self, timeout: float) -> str:
        """A start timeout's message: where a process that has not loaded its state can hang."""
        hint = (
            "a forked process can hang on a lock another thread of this one held as it forked"
            if self.start_method == "fork" else
            f"a {self.start_method} process imports the main module again first (as "
            "__mp_main__): work at its top level outside `if __name__ == \"__main__\":` "
            "runs there too"
        )
        return (
            f"dataset worker process {self.number} (pid {self.process.pid}) did not start "
            f"within {timeout} s: it has not loaded the dataset sent to it (it was killed; "
            f"{hint})"
        )

    def set_layout(self, layout: Layout) -> None:
        """Sends the samples' layout (and keeps it for a replacement); a worker gone by then
        is seen, and replaced with it, at its next exchange."""
        with self.exchange():
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
            with self.exchange(), self.log.loading(self.number, doing):
                if not self.process.is_alive() and not self.stopping:
                    self._replace(f"it died before {doing}{self._last_words()}")
                try:
                    return self._build(shared, message, doing)
                except WorkerDied as died:
                    if self.stopping:
                        raise StokerError(str(died)) from None
                    # Killed (the OOM killer, say) or crashed: a new process builds the batch
                    # again, the same bytes (samples are seeded by their index). Twice is the
                    # dataset's doing, not chance: raised.
                    self._replace(str(died))
                    first = died.index
                try:
                    return self._build(shared, message, doing)
                except WorkerDied as died:
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
                except WorkerDied as died:
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
        if self.process.is_alive():
            # Taken for dead on its pipe (a descriptor that could not be passed to it, say)
            # while it runs: ended here, not left beside its replacement until the loader's
            # process ends (under fork it holds the parent's end of its pipe, so never reads
            # an end of file). Reaped by is_alive(), a wait on the process, not on its
            # sentinel, which a process the dataset forked may hold open.
            self.process.kill()
            reaped_by = time.monotonic() + 5.0
            while self.process.is_alive() and time.monotonic() < reaped_by:
                time.sleep(0.01)
        exitcode = self.process.exitcode
        self.conn.close()
        _OPEN_PIPES.discard(self.conn)
        self._start()
        try:
            self.started(time.monotonic() + self.start_timeout)
        except WorkerDied as died:
            raise StokerError(f"{why}; the process started in its place: {died}") from None
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
        return self._checked(reply)

    def _checked(self, reply: Any) -> Any:
        """``reply``, unless it says the worker failed outside the dataset's samples (a
        StokerError) or could not load the dataset sent to it (a DatasetError)."""
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
        raise WorkerDied(
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

    @contextlib.contextmanager
    def exchange(self) -> Iterator[None]:
        """Holds ``lock`` for an exchange with the worker, this thread noted as its holder."""
        with self.lock:
            self._holder = threading.get_ident()
            try:
                yield
            finally:
                self._holder = None

    def _held_here(self) -> bool:
        """Whether this thread is in an exchange with the worker, paused under a call to
        close() (the collector finalising a loader on its own lane's thread): that close must
        not wait for the exchange, which cannot go on before it returns, and nothing else uses
        the pipe meanwhile."""
        return self._holder == threading.get_ident()

    def ask_to_stop(self) -> None:
        """Asks the worker to exit once its current batch is done (and not to be replaced): at
        once when no lane is in an exchange with it (or this thread's is), else by that lane as
        its exchange ends."""
        self.stopping = True
        if self._held_here():
            self._send_stop()
            return
        if self.lock.acquire(blocking=False):
            try:
                self._send_stop()
            finally:
                self.lock.release()

    def _send_stop(self) -> None:
        """Sends the stop message; the caller holds ``lock``. A process not yet seen started,
        whose state the sender thread may still be writing to the pipe, is killed instead:
        it has no batch to finish."""
        if self._sender is not None:
            with contextlib.suppress(OSError, ValueError):
                self.process.kill()
            return
        with contextlib.suppress(OSError):
            self.conn.send(None)

    def _close_conn(self, wait: float, joined: Any = None) -> None:
        """Closes the pipe once no lane is in an exchange with the worker (waiting up to
        ``wait`` seconds; its process is dead by then, so a lane's read ends at once). A lane
        that still holds it keeps the pipe open: one descriptor left rather than a number
        closed under a thread that may still use it. A process a lane started after
        ``joined`` was ended (a replacement that raced close()) is killed and joined first.
        Called within this thread's own exchange, it closes the pipe at once: that exchange
        then ends on the closed pipe."""
        if self.conn.closed:
            return
        if self._held_here():
            self._close_held(joined)
            return
        if not self.lock.acquire(timeout=wait):
            _log.warning(
                "dataset worker process %d: a lane still holds its pipe; left open", self.number
            )
            return
        try:
            self._close_held(joined)
        finally:
            self.lock.release()

    def _close_held(self, joined: Any) -> None:
        """:meth:`_close_conn`'s work, ``lock`` held (by this thread's exchange or for it)."""
        if joined is not None and self.process is not joined:
            with contextlib.suppress(OSError, ValueError):
                self.process.kill()
                self.process.join(timeout=5.0)
        sender = self._sender
        if sender is not None:
            # Its process is dead: the send it is in fails at once.
            sender.join(timeout=5.0)
            if sender.is_alive():
                _log.warning("dataset worker process %d: its start's sender still runs; "
                             "pipe left open", self.number)
                return
            self._sender = None
        self.conn.close()
        _OPEN_PIPES.discard(self.conn)
        self._index.close()

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


def _last_lines(text: str, count: int = 6) -> str:
    """The end of a traceback, where the error is."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])
