"""Bad input, lifetime and fork: errors arrive as Python exceptions that name the cause."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import _native

BAD_FILES = ("empty.jpg", "notes.jpg", "truncated.jpg")


def test_exception_hierarchy() -> None:
    for error in (
        stoker.DatasetError,
        stoker.DecodeError,
        stoker.PipelineError,
        stoker.LoaderTimeoutError,
        stoker.WorkerUnavailableError,
        stoker.AuthenticationError,
        stoker.TlsError,
    ):
        assert issubclass(error, stoker.StokerError)
        assert error is getattr(_native, error.__name__)
    assert issubclass(stoker.PipelineError, ValueError)
    assert issubclass(stoker.LoaderTimeoutError, TimeoutError)
    assert issubclass(stoker.AuthenticationError, PermissionError)
    assert issubclass(stoker.TlsError, ConnectionError)


def test_fail_policy_names_the_bad_file(
    make_loader: Callable[..., stoker.Loader], bad_dataset: Path
) -> None:
    loader = make_loader(bad_dataset, on_error="fail", shuffle=False, batch_size=4)
    with pytest.raises(stoker.DecodeError) as raised:
        for _ in loader:
            pass
    message = str(raised.value)
    assert any(name in message for name in BAD_FILES), message


def test_skip_policy_keeps_batch_shapes_and_reports(
    make_loader: Callable[..., stoker.Loader], bad_dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loader = make_loader(bad_dataset, on_error="skip", shuffle=False, batch_size=4)
    assert loader.num_samples == 11
    iterator = iter(loader)
    reported = []
    for batch in iterator:
        assert batch["image"].shape[1:] == (32, 32, 3)
        assert batch["image"].shape[0] == len(iterator.sample_indices)
        reported.extend(iterator.bad_samples)
    assert sorted(Path(bad["path"]).name for bad in reported) == sorted(BAD_FILES)
    for bad in reported:
        assert bad["reason"]
    assert loader.stats()["bad_samples"] == len(BAD_FILES)
    assert sum("skipped bad sample" in record.message for record in caplog.records) == len(
        BAD_FILES
    )


def test_the_bad_sample_log_stops_after_its_cap_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from stoker._batches import MAX_LOGGED_BAD_SAMPLES, BadSampleLog

    log = BadSampleLog()
    sample = {"path": "x.jpg", "sample_index": 1, "reason": "cut short", "substitute_index": 2}
    with caplog.at_level("WARNING", logger="stoker"):
        for _ in range(MAX_LOGGED_BAD_SAMPLES + 5):
            log.note([sample])
    messages = [record.getMessage() for record in caplog.records]
    assert sum("skipped bad sample x.jpg" in m for m in messages) == MAX_LOGGED_BAD_SAMPLES
    assert sum("further bad samples are not logged" in m for m in messages) == 1


def test_skip_policy_is_deterministic(
    make_loader: Callable[..., stoker.Loader], bad_dataset: Path
) -> None:
    runs = [
        [
            batch["image"].copy()
            for batch in make_loader(bad_dataset, batch_size=4, num_threads=threads)
        ]
        for threads in (1, 2)
    ]
    assert all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))


def test_an_interrupt_while_a_batch_is_made_loses_no_step(
    make_loader: Callable[..., stoker.Loader], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C (or any error) raised while a batch taken from the native side is made into
    tensors, caught by a loop that goes on: the next ``next()`` gives that batch, not the one
    after it, and the position counts it once."""
    import stoker._batches as batches

    loader = make_loader(batch_size=16)
    want = [list(indices) for indices in _steps(make_loader(batch_size=16))]
    made = batches.host_batch
    calls = {"n": 0}

    def interrupted_once(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return made(*args, **kwargs)

    monkeypatch.setattr(batches, "host_batch", interrupted_once)
    iterator = iter(loader)
    got: list[list[int]] = []
    while True:
        try:
            next(iterator)
        except KeyboardInterrupt:
            assert loader.state_dict()["step"] == 2, "the interrupted step is not counted"
            continue
        except StopIteration:
            break
        got.append(list(iterator.sample_indices))
    assert got == want


def test_an_interrupt_as_a_batch_is_handed_over_loses_no_step(
    make_loader: Callable[..., stoker.Loader], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C raised as the native call returns a batch (the batch never reaches the loop),
    caught by a loop that goes on: the epoch goes on from that step. Before, the native stream
    had moved past it and the loop got the step after it: one batch skipped, unseen."""
    loader = make_loader(batch_size=16)
    want = [list(indices) for indices in _steps(make_loader(batch_size=16))]
    feed = loader._feed
    native_of = feed.handle
    calls = {"n": 0}

    class LostOnReturn:
        def __init__(self, native: Any) -> None:
            self._native = native

        def __getattr__(self, name: str) -> Any:
            return getattr(self._native, name)

        def next_batch(self) -> Any:
            item = self._native.next_batch()
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyboardInterrupt  # as the call returns: the batch is dropped
            return item

    monkeypatch.setattr(feed, "handle", lambda: LostOnReturn(native_of()))
    iterator = iter(loader)
    got: list[list[int]] = []
    interrupted = 0
    while True:
        try:
            next(iterator)
        except KeyboardInterrupt:
            interrupted += 1
            assert loader.state_dict()["step"] == 2, "the lost step is not counted"
            continue
        except StopIteration:
            break
        got.append(list(iterator.sample_indices))
    assert interrupted == 1
    assert got == want


def _steps(loader: stoker.Loader) -> list[list[int]]:
    iterator = iter(loader)
    return [list(iterator.sample_indices) for _ in iterator]


def test_close_is_idempotent_and_a_closed_loader_refuses_work(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader()
    batch = next(iter(loader))
    loader.close()
    loader.close()
    assert loader.closed
    # Batches already yielded stay readable after close.
    assert batch["image"].sum() >= 0
    for use in (
        lambda: iter(loader),
        loader.stats,
        lambda: loader.set_epoch(1),
        lambda: len(loader),
    ):
        with pytest.raises(stoker.StokerError, match="closed"):
            use()
    assert loader.state_dict()["step"] == 1


def test_iterating_after_close_mid_epoch_raises(make_loader: Callable[..., stoker.Loader]) -> None:
    loader = make_loader()
    iterator = iter(loader)
    next(iterator)
    loader.close()
    with pytest.raises(stoker.StokerError, match="closed"):
        next(iterator)


def test_context_manager_closes(make_loader: Callable[..., stoker.Loader]) -> None:
    with make_loader() as loader:
        assert next(iter(loader))["label"].shape == (16,)
    assert loader.closed
    with pytest.raises(stoker.StokerError):
        next(iter(loader))


def test_a_new_iteration_makes_the_old_iterator_stale(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader()
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(stoker.StokerError, match="stale"):
        next(first)
    # The new iteration goes on at the batch after the one the first handed out.
    assert len(list(second)) == len(loader) - 1


def test_stats_report_throughput_stall_and_queue(make_loader: Callable[..., stoker.Loader]) -> None:
    loader = make_loader()
    for _ in loader:
        pass
    stats = loader.stats()
    for key in (
        "samples",
        "batches",
        "elapsed_s",
        "samples_per_s",
        "wait_s",
        "first_batch_s",
        "read_s",
        "decode_s",
        "augment_s",
        "assemble_s",
        "bad_samples",
        "in_flight",
        "slots_in_use",
        "slot_capacity",
        "stall_fraction",
    ):
        assert key in stats, key
    assert stats["samples"] == loader.num_samples
    assert stats["batches"] == len(loader)
    assert stats["samples_per_s"] > 0
    assert stats["first_batch_s"] is not None and stats["first_batch_s"] > 0
    assert 0.0 <= stats["stall_fraction"] <= 1.0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
def test_a_loader_inherited_by_fork_fails_clearly(
    make_loader: Callable[..., stoker.Loader],
) -> None:
    loader = make_loader()
    next(iter(loader))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what using the loader does, then leave without cleanup
        try:
            os.close(read_end)
            try:
                iter(loader)
                outcome = ("no error", "")
            except stoker.StokerError as error:
                outcome = ("StokerError", str(error))
            except BaseException as error:
                outcome = (type(error).__name__, str(error))
            os.write(write_end, pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        kind, message = pickle.loads(pipe.read())
    os.waitpid(pid, 0)
    assert kind == "StokerError", message
    assert "fork" in message
    # The parent's loader is untouched: it goes on after the batch it handed out.
    assert len(list(loader)) == len(loader) - 1


CTRL_C_SCRIPT = """
import os, signal, sys, threading, time
import stoker

# A shell starts background jobs with SIGINT ignored, and Python then installs no handler:
# install the default one so that the test does not depend on how it was launched.
signal.signal(signal.SIGINT, signal.default_int_handler)

loader = stoker.Loader(sys.argv[1], pipeline=stoker.vision.imagenet_train(32), batch_size=8,
                       num_threads=1, prefetch=1, max_held_batches=1, timeout=6, output="numpy")
iterator = iter(loader)
held = [next(iterator), next(iterator)]  # every slot held: the next call waits its full timeout
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    next(iterator)
    print("no error")
except KeyboardInterrupt:
    print(f"KeyboardInterrupt after {time.monotonic() - started:.1f} s")
except BaseException as error:
    print(f"{type(error).__name__} after {time.monotonic() - started:.1f} s")
"""


def test_ctrl_c_interrupts_a_waiting_next(dataset: Path) -> None:
    # In a child process: a KeyboardInterrupt that escaped here would end the pytest session.
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_SCRIPT, str(dataset)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    outcome = result.stdout.strip()
    assert outcome.startswith("KeyboardInterrupt"), outcome or result.stderr
    assert float(outcome.split()[2]) < 3, outcome


def test_the_native_sides_warnings_and_errors_reach_the_stoker_logger(
    make_loader: Callable[..., stoker.Loader], caplog: pytest.LogCaptureFixture
) -> None:
    """The loader's native warnings and errors come out on logger ``stoker`` with their level,
    not into the void: here every slot held, warned while next() still waits (10 s, or half
    the timeout); the timeout itself is raised, not logged as well."""
    loader = make_loader(prefetch=1, max_held_batches=1, timeout=1, num_threads=1)
    iterator = iter(loader)
    held = [next(iterator), next(iterator)]
    with caplog.at_level("WARNING", logger="stoker"), pytest.raises(stoker.LoaderTimeoutError):
        next(iterator)
    native = [r for r in caplog.records if r.name == "stoker" and "stoker_loader" in r.message]
    held = [r for r in native if "every batch slot is held by batches the training" in r.message]
    assert [r.levelname for r in held] == ["WARNING"], caplog.records
    assert not [r for r in native if "loader.next" in r.message], native
    del held


def test_bad_samples_are_logged_once_not_again_from_the_native_side(
    bad_dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="stoker"), stoker.Loader(
        bad_dataset, pipeline=stoker.vision.imagenet_eval(32), batch_size=4, num_threads=1,
        on_error="skip", output="numpy",
    ) as loader:
        for _ in loader:
            pass
        assert loader.stats()["bad_samples"] == 3
    assert not [r for r in caplog.records if "[stoker_pipeline" in r.getMessage()], caplog.text
