"""``Loader.from_dataset``: a team's own map-style ``Dataset`` under Stoker's planner.

The dataset's ``__getitem__`` (and an optional ``transform``) runs in Python, on threads of
this process or in worker processes; everything around it is the native loader's: the epoch
plan (shuffle, ranks, ``set_epoch``, exact resume, the same order as a native source of the
same length and seed), the bounded slot pool, the prefetch controller, the stall figures and
the dashboard.

How a sample travels: the first sample (``dataset[0]``) fixes the *layout*: its structure (a
tuple, list, dict or single value, nested) and, for each leaf (a numpy array, a torch tensor,
a PIL image, a Python or numpy scalar), a dtype and shape. Each batch's slot holds one region
per leaf, ``n`` rows of it; a sample's leaves are copied into their rows. Thread mode writes
straight into the slot. In process mode the loader's slots are one shared mapping (a
``memfd``, not ``/dev/shm``, sent to each worker once as a descriptor), and a worker writes
its batch straight into the slot too: no pickled batches, no copy after the worker's.
A batch comes back with the sample's structure, each leaf stacked (``(n, *shape)``), or as
``collate_fn(list_of_samples)`` when one is given.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import multiprocessing
import multiprocessing.reduction
import os
import pickle
import random
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn

import numpy as np

from stoker import _native, gpu
from stoker.arguments import (
    MAX_U32,
    MAX_U64,
    check_bool,
    check_int,
    check_on_error,
    check_prefetch,
    check_seconds,
    dashboard_address,
    dashboard_credential_path,
    default_threads,
    import_torch,
    is_int,
    resolve_output,
    resolve_rank,
)
from stoker.errors import DatasetError, LoaderTimeoutError, StokerError
from stoker.loader import Loader, register_dataset_builder
from stoker.ops import check_pipeline

__all__ = ["from_dataset", "loading_epoch", "sample_rng", "sample_seed"]

# How many following samples the skip policy tries, as the native policy does.
_MAX_SUBSTITUTE_TRIES: Final = 16
# Every field's region starts at a multiple of this from the slot's start (slots are at least
# 16-byte aligned, which every dtype's view needs).
_ALIGN: Final = 64

_current = threading.local()


def sample_seed() -> int:
    """The 64-bit seed of the sample being loaded: a function of (seed, epoch, index) only.

    Call it from a dataset's ``__getitem__`` or ``transform`` under
    :meth:`stoker.Loader.from_dataset` to seed a generator of your own, e.g.
    ``torch.Generator().manual_seed(stoker.sample_seed())``.

    Raises:
        RuntimeError: called outside a sample being loaded by ``from_dataset``.
    """
    key = getattr(_current, "key", None)
    if key is None:
        raise RuntimeError(
            "stoker.sample_seed() and stoker.sample_rng() work only inside a dataset's "
            "__getitem__ or transform while Loader.from_dataset loads a sample"
        )
    return int(_native.sample_seed(*key))


def loading_epoch() -> int:
    """The epoch of the sample being loaded, or 0 outside one (the loader probing a
    dataset's layout reads its first sample outside any epoch)."""
    key = getattr(_current, "key", None)
    return 0 if key is None else int(key[1])


def sample_rng() -> np.random.Generator:
    """A numpy generator for the sample being loaded, seeded by (seed, epoch, index).

    Draws from it depend on nothing else: not on the thread or process that loads the
    sample, nor on timing, so augmentations drawn from it are the same for any
    ``num_threads`` or ``num_workers``. A new generator each call, starting at the same point.

    Raises:
        RuntimeError: called outside a sample being loaded by ``from_dataset``.
    """
    return np.random.default_rng(sample_seed())


@dataclass(frozen=True)
class _Field:
    """One leaf of the sample structure: where it is, its dtype and its shape per sample."""

    path: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    # An encoded image (bytes) that the native pipeline decodes into this field.
    encoded: bool = False

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


def _leaf_array(value: Any) -> np.ndarray[Any, Any] | None:
    """``value`` as an array when it is a leaf (array, tensor, image, scalar), else None."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bool, np.bool_)):
        return np.asarray(value, dtype=np.bool_)
    if isinstance(value, int):
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float64)
    if isinstance(value, np.generic):
        return np.asarray(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        array: np.ndarray[Any, Any] = value.detach().cpu().numpy()
        return array
    if hasattr(value, "__array_interface__") or hasattr(value, "__array__"):
        return np.asarray(value)  # a PIL image, among others
    return None


def _flatten(value: Any, path: str, leaves: list[tuple[str, Any]], encoded: bool) -> Any:
    """Appends the leaves of ``value`` to ``leaves`` and returns its structure's template;
    with ``encoded``, bytes are a leaf (an encoded image for the native pipeline)."""
    if isinstance(value, Mapping):
        keys = list(value.keys())
        children = [_flatten(value[k], f"{path}[{k!r}]", leaves, encoded) for k in keys]
        return ("dict", keys, children)
    if isinstance(value, (tuple, list)):
        children = [_flatten(v, f"{path}[{i}]", leaves, encoded) for i, v in enumerate(value)]
        return ("seq", type(value), children)
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not encoded:
            raise TypeError(
                f"sample{path} is {type(value).__name__}: pass pipeline=[stoker.ops.DecodeImage()"
                ", ...] to decode encoded images natively, or decode them in the transform"
            )
        leaves.append((path, value))
        return ("image", len(leaves) - 1)
    array = _leaf_array(value)
    if array is None:
        raise TypeError(
            f"sample{path} is a {type(value).__name__}: from_dataset batches numpy arrays, "
            "torch tensors, PIL images and numbers (in tuples, lists or dicts); convert it in "
            "the transform"
        )
    if array.dtype.hasobject or array.dtype.kind in "USV":
        raise TypeError(f"sample{path} has dtype {array.dtype}, which has no fixed size in bytes")
    leaves.append((path, array))
    return ("leaf", len(leaves) - 1)


def _rebuild(template: Any, leaves: Sequence[Any]) -> Any:
    kind = template[0]
    if kind in ("leaf", "image"):
        return leaves[template[1]]
    if kind == "dict":
        return {k: _rebuild(t, leaves) for k, t in zip(template[1], template[2], strict=True)}
    kind_type, children = template[1], [_rebuild(t, leaves) for t in template[2]]
    if hasattr(kind_type, "_fields"):  # a namedtuple
        return kind_type(*children)
    return kind_type(children)


@dataclass(frozen=True)
class _Layout:
    """Where each leaf of a sample goes in a batch slot."""

    template: Any
    fields: tuple[_Field, ...]

    @staticmethod
    def of(sample: Any, image: Any) -> _Layout:
        """The layout of ``sample``; ``image``: the native pipeline for its encoded image."""
        leaves: list[tuple[str, Any]] = []
        template = _flatten(sample, "", leaves, image is not None)
        fields = tuple(
            _Field(path, np.dtype(image.dtype), tuple(image.shape), True)
            if isinstance(leaf, (bytes, bytearray, memoryview))
            else _Field(path, leaf.dtype, tuple(leaf.shape))
            for path, leaf in leaves
        )
        if image is not None and not any(field.encoded for field in fields):
            raise TypeError(
                "pipeline= decodes an encoded image, but the sample holds no bytes: return the "
                "image file's bytes from __getitem__ (or the transform)"
            )
        return _Layout(template, fields)

    def regions(self, n: int) -> list[tuple[int, int]]:
        """(offset, length) in an ``n``-sample slot of each field."""
        regions, offset = [], 0
        for field in self.fields:
            regions.append((offset, field.nbytes * n))
            offset += _aligned(field.nbytes * n)
        return regions

    def leaves_of(self, sample: Any) -> list[Any]:
        """The sample's leaves, checked against the layout; ValueError saying what differs."""
        leaves: list[tuple[str, Any]] = []
        template = _flatten(sample, "", leaves, any(field.encoded for field in self.fields))
        if template != self.template:
            raise ValueError(
                "the sample's structure differs from dataset[0]'s: every sample must have the "
                "same keys and nesting"
            )
        for (path, array), field in zip(leaves, self.fields, strict=True):
            if field.encoded:
                continue
            if array.shape != field.shape or array.dtype != field.dtype:
                raise ValueError(
                    f"sample{path} is {array.dtype} {array.shape}, but dataset[0] had "
                    f"{field.dtype} {field.shape}: from_dataset needs the same dtype and shape "
                    "in every sample (pad or resize in the transform)"
                )
        return [array for _, array in leaves]


@dataclass
class _State:
    """What loading a sample needs, in the loader's process or a worker process."""

    dataset: Any
    transform: Callable[[Any], Any] | None
    layout: _Layout
    seed: int
    on_error: str
    length: int
    seed_globals: bool
    # The native pipeline decoding the sample's encoded image, if any.
    image: Any = None


def _load(state: _State, epoch: int, index: int, stream: int | None = None) -> Any:
    """``dataset[index]`` through the transform, drawing from the random stream of sample
    ``stream`` (default ``index``; a substitute draws from the stream of the sample it
    replaces, as native sources do)."""
    _current.key = (state.seed, epoch, index if stream is None else stream)
    try:
        if state.seed_globals:
            seed = sample_seed()
            random.seed(seed)
            np.random.seed(seed & 0xFFFF_FFFF)
            torch = sys.modules.get("torch")
            if torch is not None:
                # The CPU generator only: torch.manual_seed also seeds every accelerator's,
                # 80 us against 1 us a sample.
                torch.default_generator.manual_seed(seed)
        sample = state.dataset[index]
        if state.transform is not None:
            sample = state.transform(sample)
        return sample
    finally:
        _current.key = None


_NO_LAYOUT: Final = _Layout((), ())


def _probe(state: _State) -> _Layout:
    """The layout of ``dataset[0]``; DatasetError when loading it fails, TypeError when a value
    in it cannot be batched."""
    try:
        first = _load(state, 0, 0)
    except Exception as error:
        raise DatasetError(
            "from_dataset reads dataset[0] to learn the samples' layout, and it failed: "
            + _describe(0, error)
        ) from error
    return _Layout.of(first, state.image)


def _describe(index: int, error: BaseException) -> str:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return f"dataset[{index}] raised {type(error).__name__}: {error}\n{text.rstrip()}"


def _attempt(
    state: _State, epoch: int, index: int, stream: int, destinations: list[Any], row: int
) -> str | None:
    """Loads sample ``index`` into row ``row`` (random stream of sample ``stream``); None, or
    why it failed (index, exception and traceback)."""
    try:
        leaves = state.layout.leaves_of(_load(state, epoch, index, stream))
        _write_row(state, epoch, stream, destinations, row, leaves)
        return None
    except Exception as error:
        reason = _describe(index, error)
        # The traceback's frames reach this one and the batch's arrays over the slot; an
        # exception the dataset's code keeps must not keep them.
        error.__traceback__ = None
        return reason


def _write_row(
    state: _State, epoch: int, stream: int, destinations: list[Any], row: int, leaves: list[Any]
) -> None:
    for destination, leaf, field in zip(
        destinations, leaves, state.layout.fields, strict=True
    ):
        if destination is None:
            continue
        if field.encoded:
            state.image.process(bytes(leaf), state.seed, epoch, stream,
                                destination[row].view(np.uint8))
        else:
            destination[row] = leaf


def _fill_batch(
    state: _State, epoch: int, indices: Sequence[int], view: Any,
    stopped: Callable[[], bool] | None = None,
) -> tuple[list[tuple[int, str, int]], tuple[int, str] | None]:
    """Loads ``indices`` into ``view`` by the layout, under the bad-sample policy. Returns the
    replaced samples as (index, reason, substitute) and the failure, if any, as (index, reason)."""
    n = len(indices)
    destinations = [
        np.frombuffer(view, dtype=field.dtype, count=n * field.nbytes // field.dtype.itemsize,
                      offset=offset).reshape((n, *field.shape))
        if field.nbytes else None
        for field, (offset, _) in zip(state.layout.fields, state.layout.regions(n), strict=False)
    ]
    bad: list[tuple[int, str, int]] = []
    try:
        for row, index in enumerate(indices):
            if stopped is not None and stopped():
                return bad, (index, "the loader was closed while this batch was loading")
            reason = _attempt(state, epoch, index, index, destinations, row)
            if reason is None:
                continue
            if state.on_error == "fail":
                return bad, (index, reason)
            for offset in range(1, min(_MAX_SUBSTITUTE_TRIES, state.length - 1) + 1):
                substitute = (index + offset) % state.length
                if _attempt(state, epoch, substitute, index, destinations, row) is None:
                    bad.append((index, reason, substitute))
                    break
            else:
                return bad, (index, f"{reason}\n(and none of the next "
                             f"{_MAX_SUBSTITUTE_TRIES} samples loaded either)")
        return bad, None
    finally:
        # The slot's view is released when build() returns: no array may still export it.
        del destinations


class _ThreadBuilder:
    """Thread mode: each lane loads its batch's samples on its own thread."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._closed = threading.Event()

    def build(
        self, lane: int, epoch: int, step: int, indices: list[int], view: Any, shared: Any,
    ) -> Any:
        return _fill_batch(self._state, epoch, indices, view, self._closed.is_set)

    def close(self) -> None:
        """Batches being loaded stop at their next sample."""
        self._closed.set()


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


def _worker_main(conn: Any, state: _State | bytes) -> None:
    """A worker process: loads the batches it is sent straight into their slots, in the
    loader's shared slot mapping (sent once, as a descriptor, before the first batch).

    Under spawn and forkserver ``state`` comes pickled and is loaded here, so that a failure
    to do so (the dataset's module failing to import in a fresh interpreter, say) reaches the
    parent with its traceback instead of dying in multiprocessing's bootstrap."""
    # Ctrl-C goes to the whole process group; the parent decides, its workers do not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if isinstance(state, bytes):
        try:
            state = pickle.loads(state)
        except BaseException:
            with contextlib.suppress(OSError):
                conn.send(("failed", traceback.format_exc()))
            return
    assert isinstance(state, _State)
    # One thread per worker process, as DataLoader's workers: N processes each running torch's
    # intra-op pool would oversubscribe the cores.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    arena: _Arena | None = None
    while True:
        try:
            message = conn.recv()
            if message is None:
                return
            if message[0] == "arena":
                fd = multiprocessing.reduction.recv_handle(conn)
                if arena is not None:
                    arena.close()
                arena = _Arena(fd, message[1])
                os.close(fd)
                continue
            if message[0] == "layout":
                state.layout = message[1]
                continue
            if message[0] == "probe":
                try:
                    conn.send(("layout", _probe(state)))
                except (DatasetError, TypeError) as error:
                    conn.send(("refused", type(error).__name__, str(error)))
                continue
        except (EOFError, OSError):
            return  # the parent is gone
        _, epoch, indices, offset, length = message
        try:
            if arena is None:
                raise RuntimeError("no slot mapping was sent before the first batch")
            view = arena.view[offset : offset + length]
            try:
                bad, failure = _fill_batch(state, epoch, indices, view)
            finally:
                view.release()
            conn.send(("done", bad, failure))
        except BaseException as error:
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            conn.send(("error", text.rstrip()))


class _Worker:
    def __init__(self, context: Any, number: int, state: _State | bytes) -> None:
        self.number = number
        self.start_method: str = context.get_start_method()
        parent, child = context.Pipe()
        self.process = context.Process(
            target=_worker_main,
            args=(child, state),
            name=f"stoker-dataset-worker-{number}",
            daemon=True,
        )
        with _main_not_rerun(context):
            self.process.start()
        child.close()
        self.conn = parent
        self.arena: int | None = None
        # Lane k of the loader, and of the loader of an epoch resumed on another world size,
        # share worker k: one exchange at a time.
        self.lock = threading.Lock()

    def build(
        self, epoch: int, step: int, indices: list[int], view: memoryview,
        shared: tuple[int, int, int, int] | None,
    ) -> Any:
        if shared is None:
            raise StokerError("process mode needs the loader's slots in shared memory")
        arena, fd, size, offset = shared
        doing = f"loading step {step} of epoch {epoch}"
        with self.lock:
            try:
                if self.arena != arena:
                    self.conn.send(("arena", size))
                    multiprocessing.reduction.send_handle(self.conn, fd, self.process.pid)
                    self.arena = arena
            except OSError:
                self._died(doing)
            _, bad, failure = self.call(("build", epoch, indices, offset, len(view)), doing)
        return bad, failure

    def call(self, message: Any, doing: str, timeout: float | None = None) -> Any:
        """Sends ``message`` and returns the worker's reply; a StokerError when it died or
        failed outside the dataset's code, LoaderTimeoutError when ``timeout`` passed."""
        try:
            self.conn.send(message)
            if timeout is not None and not self.conn.poll(timeout):
                raise LoaderTimeoutError(
                    f"dataset worker process {self.number} (pid {self.process.pid}) did not "
                    f"finish {doing} within {timeout} s"
                )
            reply = self.conn.recv()
        except (EOFError, OSError):
            self._died(doing)
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

    def _died(self, doing: str) -> NoReturn:
        self.process.join(timeout=1.0)
        raise StokerError(
            f"dataset worker process {self.number} (pid {self.process.pid}) exited with "
            f"code {self.process.exitcode} while {doing}"
        ) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        self.conn.close()


class _ProcessBuilder:
    """Process mode: lane k hands its batches to worker process k."""

    def __init__(self, state: _State, workers: int, context: Any) -> None:
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        # A fresh interpreter gets the state pickled here and loads it itself (see
        # `_worker_main`); a forked worker inherits it as it is.
        sent: _State | bytes = state
        if context.get_start_method() != "fork":
            sent = multiprocessing.reduction.ForkingPickler.dumps(state).tobytes()
        try:
            for number in range(workers):
                self._workers.append(_Worker(context, number, sent))
        except BaseException:
            self.close()
            raise

    def probe(self, timeout: float) -> _Layout:
        """The layout of ``dataset[0]``, read by worker 0 and sent to every worker."""
        first = self._workers[0]
        reply = first.call(("probe",), "reading dataset[0]", timeout)
        if reply[0] == "refused":
            kind = TypeError if reply[1] == "TypeError" else DatasetError
            raise kind(reply[2])
        layout: _Layout = reply[1]
        for worker in self._workers:
            worker.conn.send(("layout", layout))
        return layout

    def build(
        self, lane: int, epoch: int, step: int, indices: list[int], view: memoryview,
        shared: tuple[int, int, int, int] | None,
    ) -> Any:
        return self._workers[lane].build(epoch, step, indices, view, shared)

    def close(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()


def _default_start_method() -> str:
    """fork on Linux, as DataLoader: the workers start before any of the loader's own threads,
    in milliseconds, sharing the parent's pages. Elsewhere fork is unsafe (macOS's system
    libraries) or missing: forkserver where there is one, else spawn."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux") and "fork" in methods:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _main_reimportable() -> bool:
    """Whether a fresh interpreter can run the main module again, as spawn and forkserver do
    to find what it defines: not when it came from stdin (``python -``) or an interactive
    session."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    return path is None or os.path.isfile(path)


@contextlib.contextmanager
def _main_not_rerun(context: Any) -> Iterator[None]:
    """Starts a spawn or forkserver worker without asking it to run a main module that
    cannot be run again (a script read from stdin has ``__file__ == "<stdin>"``, which the
    child would look for as a file and die on)."""
    main = sys.modules.get("__main__")
    if context.get_start_method() == "fork" or main is None or _main_reimportable():
        yield
        return
    path = main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path


def _last_lines(text: str, count: int = 6) -> str:
    """The end of a traceback, where the error is."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _context(name: object, dataset: Any) -> Any:
    """The start method's context (default: :func:`_default_start_method`); a fork server
    preloads the dataset's module (and with it torch or torchvision), so its workers start
    without importing them again."""
    if name is None:
        name = _default_start_method()
    if name not in ("spawn", "forkserver", "fork"):
        raise ValueError(
            f"multiprocessing_context must be 'forkserver', 'spawn' or 'fork', got {name!r}"
        )
    if name != "fork" and type(dataset).__module__ == "__main__" and not _main_reimportable():
        raise ValueError(
            f"multiprocessing_context={name!r} starts a fresh interpreter, which cannot load "
            f"the dataset: its class {type(dataset).__name__} is defined in a main module that "
            "cannot be run again (a script read from stdin or an interactive session). Use "
            "multiprocessing_context='fork', or define the class in a module"
        )
    context = multiprocessing.get_context(str(name))
    if name == "forkserver":
        module = type(dataset).__module__
        preload = ["stoker.dataset"] + ([module] if module not in ("__main__", "builtins") else [])
        # Takes effect when this process starts its fork server, i.e. the first time.
        context.set_forkserver_preload(preload)
    return context


def from_dataset(
    dataset: Any,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    transform: Callable[[Any], Any] | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    num_threads: int | None,
    num_workers: int,
    multiprocessing_context: Literal["forkserver", "spawn", "fork"] | None,
    rank: int | None,
    world_size: int | None,
    prefetch: int | Literal["auto"],
    output: Literal["torch", "numpy"] | None,
    on_error: Literal["skip", "fail"],
    timeout: float,
    max_held_batches: int,
    dashboard: int | str | None,
    dashboard_token_file: str | os.PathLike[str] | None = None,
    pipeline: Any = None,
    pin_memory: bool = False,
    pinned_memory_budget: int | None = None,
) -> Any:
    """Builds the :class:`DatasetLoader` that ``Loader.from_dataset`` returns."""

    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(
            "from_dataset needs a map-style dataset (with __getitem__ and __len__), got "
            f"{type(dataset).__name__}"
        )
    length = len(dataset)
    if not is_int(length) or length < 1:
        raise DatasetError(f"the dataset has {length!r} samples; from_dataset needs at least one")
    for name, value in (("transform", transform), ("collate_fn", collate_fn)):
        if value is not None and not callable(value):
            raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")
    batch_size = check_int(batch_size, "batch_size", 1, MAX_U32)
    shuffle = check_bool(shuffle, "shuffle")
    seed = check_int(seed, "seed", 0, MAX_U64)
    drop_last = check_bool(drop_last, "drop_last")
    workers = check_int(num_workers, "num_workers", 0, 1024)
    if workers and num_threads is not None:
        raise ValueError(
            "give num_threads (threads in this process) or num_workers (worker processes), "
            "not both"
        )
    if workers:
        context = _context(multiprocessing_context, dataset)
        lanes, rule = workers, "num_workers"
        waiting_on = f"on {workers} dataset worker processes"
    else:
        if multiprocessing_context is not None:
            raise ValueError("multiprocessing_context applies to num_workers >= 1 only")
        if num_threads is None:
            lanes, rule = default_threads()
        else:
            lanes, rule = check_int(num_threads, "num_threads", 1, 4096), "num_threads"
        waiting_on = f"on {lanes} dataset threads"
    prefetch_count = check_prefetch(prefetch)
    error_policy = check_on_error(on_error)
    seconds = check_seconds(timeout, "timeout")
    max_held = check_int(max_held_batches, "max_held_batches", 1, 4096)
    output_kind = resolve_output(output)
    rank_, world = resolve_rank(rank, world_size)
    pin_memory = check_bool(pin_memory, "pin_memory")
    budget = (
        gpu.default_pinned_budget()[0]
        if pinned_memory_budget is None
        else gpu.check_budget(pinned_memory_budget)
    )
    torch = (
        import_torch("output='torch'") if output_kind == "torch" else sys.modules.get("torch")
    )
    pin_device = gpu.pin_device(torch, pin_memory)

    image = None
    if pipeline is not None:
        image = _native.ImagePipeline([op.to_dict() for op in check_pipeline(pipeline)])
    # The first sample fixes the layout: read here in thread mode, by a worker in process mode
    # (so that this process never runs the dataset's code, nor starts what it starts).
    state = _State(
        dataset, transform, _NO_LAYOUT, seed, error_policy, length, bool(workers), image
    )
    builder: Any
    if workers:
        builder = _ProcessBuilder(state, workers, context)
        try:
            layout = builder.probe(seconds)
        except BaseException:
            builder.close()
            raise
    else:
        layout = _probe(state)
        state.layout = layout
        builder = _ThreadBuilder(state)
    try:
        native = _native.NativeLoader.from_dataset(
            builder,
            length,
            [f.nbytes for f in layout.fields],
            lanes,
            waiting_on,
            batch_size,
            shuffle,
            seed,
            drop_last,
            rank_,
            world,
            prefetch_count,
            seconds,
            max_held,
            dashboard=dashboard_address(dashboard),
            dashboard_token_file=dashboard_credential_path(dashboard, dashboard_token_file),
            job_name=type(dataset).__name__,
            shared_slots=bool(workers),
            pin_device=pin_device,
            pinned_budget=budget,
            release_streams=None if pin_device is None else gpu.release_streams(torch, pin_device),
        )
    except BaseException:
        builder.close()
        raise
    return DatasetLoader._make(
        native, builder, layout, collate_fn, output_kind,
        batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank_,
        world_size=world, timeout=seconds, max_held_batches=max_held, thread_rule=rule,
        name=type(dataset).__name__,
    )


# Dataset loaders not closed yet: closed at exit, before the interpreter tears down, so no
# worker process outlives it and no thread of theirs calls into a dying interpreter.
_OPEN: weakref.WeakSet[DatasetLoader] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for loader in list(_OPEN):
        loader.close()


class DatasetLoader(Loader):
    """A :class:`stoker.Loader` over a Python dataset (see :meth:`Loader.from_dataset`).

    Iteration, ``len``, ``set_epoch``, ``state_dict``/``load_state_dict``, ``stats`` and
    the dashboard behave as for a native source; batches have the samples' structure.
    """

    _builder: Any
    _layout: _Layout
    _collate_fn: Callable[[list[Any]], Any] | None

    @classmethod
    def _make(cls, native: Any, builder: Any, layout: _Layout,
              collate_fn: Any, output: str, **settings: Any) -> DatasetLoader:
        self = cls.__new__(cls)
        self._native = native
        self._closed = False
        self._forked = False
        self._builder = builder
        self._layout = layout
        self._collate_fn = collate_fn
        self._batch_size = settings["batch_size"]
        self._shuffle = settings["shuffle"]
        self._seed = settings["seed"]
        self._drop_last = settings["drop_last"]
        self._rank = settings["rank"]
        self._world_size = settings["world_size"]
        self._timeout = settings["timeout"]
        self._max_held_batches = settings["max_held_batches"]
        self._thread_rule = settings["thread_rule"]
        self._source = settings["name"]
        self._ops = []
        self._output = output
        self._torch = import_torch("output='torch'") if output == "torch" else None
        self._finish_init()
        _OPEN.add(self)
        return self

    def __del__(self) -> None:
        # Closing here lets go of the interpreter while the threads finish; a drop of the native
        # loader by the collector would wait for them holding it.
        if not getattr(self, "_closed", True) and not getattr(self, "_forked", False):
            self.close()

    def close(self) -> None:
        """Stops the worker processes and threads. Idempotent; batches already yielded
        stay valid."""
        if self._closed:
            return
        _OPEN.discard(self)
        builder = getattr(self, "_builder", None)
        if builder is not None and not self._forked:
            builder.close()  # a lane waiting on a worker then returns at once
        super().close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch={self._epoch}, step={self._step}"
        return (
            f"DatasetLoader({self._source}, batch_size={self._batch_size}, "
            f"rank={self._rank}, world_size={self._world_size}, {state})"
        )

    def _to_batch(self, item: Any) -> tuple[int, Any, list[int], list[Any]]:
        _, step, tensors, indices, bad, _ = item
        n = len(indices)
        leaves = []
        for (_, _, _, data), field in zip(tensors, self._layout.fields, strict=False):
            array = np.frombuffer(
                memoryview(data), dtype=field.dtype,
                count=n * field.nbytes // field.dtype.itemsize,
            ).reshape((n, *field.shape))
            leaves.append(self._torch.from_numpy(array) if self._torch is not None else array)
        if self._collate_fn is not None:
            samples = [_rebuild(self._layout.template, [leaf[i] for leaf in leaves])
                       for i in range(n)]
            batch = self._collate_fn(samples)
        else:
            batch = _rebuild(self._layout.template, leaves)
        if bad:
            self._log_bad_samples(bad)
        return step, batch, list(indices), list(bad)


register_dataset_builder(from_dataset)
