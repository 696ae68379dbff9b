"""``Loader.from_dataset``'s worker processes as one builder: lane k hands its batches to
worker process k (:mod:`stoker._dataset_workers`); the workers started side by side, what they
are loading named for a timeout, and all of them closed together.
"""

from __future__ import annotations

import logging
import pickle
import shutil
import threading
import time
from typing import Any

from stoker._busy import LoadingLog, describe, read_dumps, stacks_folder
from stoker._dataset_workers import Worker, WorkerDied
from stoker._samples import Layout, State, on_sample
from stoker._start_method import unpicklable_part
from stoker._worker_process import dump_path
from stoker.errors import DatasetError

__all__ = ["ProcessBuilder"]

_log = logging.getLogger("stoker")

# Seconds a closing loader's workers have to finish their batch and exit before they are killed.
_CLOSE_GRACE_S = 5.0


class ProcessBuilder:
    """Process mode: lane k hands its batches to worker process k."""

    def __init__(
        self, state: State, workers: int, context: Any, start_timeout: float
    ) -> None:
        """Starts the workers side by side and waits until ``start_timeout`` seconds from
        now for every one to have loaded the dataset (a LoaderTimeoutError past it)."""
        self._workers: list[Worker] = []
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
                self._workers.append(Worker(context, number, sent, self._dumps, self._log,
                                             start_timeout, skip=state.on_error == "skip"))
            deadline = time.monotonic() + start_timeout
            for worker in self._workers:
                try:
                    worker.started(deadline)
                except WorkerDied as died:
                    raise DatasetError(_as_it_started(worker, died)) from None
        except BaseException:
            self.close()
            raise

    def probe(self, timeout: float) -> Layout:
        """The layout of ``dataset[0]``, read by worker 0 and sent to every worker."""
        first = self._workers[0]
        with first.exchange():
            try:
                reply = first.call(("probe",), "reading dataset[0]", timeout)
            except WorkerDied as died:
                raise DatasetError(_as_it_started(first, died)) from None
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


def _as_it_started(worker: Worker, died: WorkerDied) -> str:
    """The message of a worker that died starting or reading ``dataset[0]``: its own error
    went to its stderr, which is this process's."""
    hint = ("" if worker.start_method == "fork" else
            f"; under the {worker.start_method!r} start method a script must "
            "make the loader under `if __name__ == \"__main__\":`")
    return f"{died} (its error is on stderr above{hint})"


def _live_pid(process: Any) -> int | None:
    """The pid of ``process`` while it runs (a dead worker's pid may be another process's
    by now, which must not be signalled); None once it exited."""
    try:
        return int(process.pid) if process.is_alive() else None
    except (AssertionError, ValueError, OSError):
        return None
