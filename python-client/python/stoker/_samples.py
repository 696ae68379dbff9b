"""Loading a Python dataset's samples into a batch slot, for ``Loader.from_dataset``.

A sample's *layout* (its structure and, per leaf, a dtype and shape) is learnt from
``dataset[0]``; each batch's slot holds one region per leaf, ``n`` rows of it, every region
starting on a 64-byte boundary. :func:`fill_batch` loads a batch's samples into their rows
under the bad-sample policy, on whatever thread or worker process runs it, each sample
drawing from its own random stream (:func:`sample_seed`, :func:`sample_rng`).
"""

from __future__ import annotations

import errno
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from stoker import _native
from stoker._busy import LoadingLog, batch_text, describe, where
from stoker.errors import DatasetError

__all__ = [
    "NO_LAYOUT",
    "Layout",
    "State",
    "ThreadBuilder",
    "fill_batch",
    "loading_epoch",
    "on_sample",
    "probe",
    "rebuild",
    "sample_rng",
    "sample_seed",
]

# Samples after a bad one the skip policy tries one by one (then 32, 64... on), as natively.
_MAX_SUBSTITUTE_TRIES: Final = 16
# The smallest batch whose samples, most of another layout than dataset[0]'s, fail it under
# skip: a few odd samples in a small batch are bad samples, replaced.
_LAYOUT_JUDGED_FROM: Final = 8
# Errors of this machine or its storage (_fault): never a bad sample; and of the network.
# Each is tried again after these pauses (seconds), as native reads are; then the machine's
# fail the batch, the network's are the sample's.
_MACHINE_ERRNOS: Final = frozenset({
    errno.EIO, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ESTALE,
})
_NETWORK_ERRNOS: Final = frozenset({
    errno.ETIMEDOUT, errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENOLINK,
})
_MACHINE_RETRY_PAUSES: Final = (0.1, 0.5, 2.0)
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


def _flatten(
    value: Any, path: str, leaves: list[tuple[str, Any]], encoded: bool, like: Any = None
) -> Any:
    """Appends the leaves of ``value`` to ``leaves`` and returns its structure's template;
    with ``encoded``, bytes are a leaf (an encoded image for the native pipeline). ``like``
    (dataset[0]'s template) orders a dict's keys: a sample with the same keys in another
    order is the same structure, as DataLoader's collation takes them by name."""
    if isinstance(value, Mapping):
        keys = list(value.keys())
        known = like[1] if like is not None and like[0] == "dict" else None
        if known is not None and len(known) == len(keys) and set(known) == set(keys):
            keys = list(known)
        inner = like[2] if known is not None and keys == known else [None] * len(keys)
        children = [
            _flatten(value[k], f"{path}[{k!r}]", leaves, encoded, inner[i])
            for i, k in enumerate(keys)
        ]
        return ("dict", keys, children)
    if isinstance(value, (tuple, list)):
        same = like is not None and like[0] == "seq" and len(like[2]) == len(value)
        inner = like[2] if same else [None] * len(value)
        children = [
            _flatten(v, f"{path}[{i}]", leaves, encoded, inner[i]) for i, v in enumerate(value)
        ]
        return ("seq", type(value), children)
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not encoded:
            raise TypeError(
                f"sample{path} is {type(value).__name__}: pass pipeline=[stoker.ops.DecodeImage()"
                ", ...] to decode encoded images natively, or decode them in the transform"
            )
        leaves.append((path, value))
        return ("image", len(leaves) - 1)
    try:
        array = _leaf_array(value)
    except (TypeError, RuntimeError, OverflowError, ValueError) as error:
        # torch's bfloat16 has no numpy dtype; an int past int64; a conjugate view.
        dtype = getattr(value, "dtype", type(value).__name__)
        raise TypeError(
            f"sample{path} ({dtype}) cannot be batched as a numpy array: {error}; convert it "
            "in the transform (a bfloat16 tensor: .float(), or .view(torch.int16) to keep its "
            "bits)"
        ) from None
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


def rebuild(template: Any, leaves: Sequence[Any]) -> Any:
    kind = template[0]
    if kind in ("leaf", "image"):
        return leaves[template[1]]
    if kind == "dict":
        return {k: rebuild(t, leaves) for k, t in zip(template[1], template[2], strict=True)}
    kind_type, children = template[1], [rebuild(t, leaves) for t in template[2]]
    if hasattr(kind_type, "_fields"):  # a namedtuple
        return kind_type(*children)
    return kind_type(children)


@dataclass(frozen=True)
class Layout:
    """Where each leaf of a sample goes in a batch slot."""

    template: Any
    fields: tuple[_Field, ...]

    @staticmethod
    def of(sample: Any, image: Any) -> Layout:
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
        return Layout(template, fields)

    def regions(self, n: int) -> list[tuple[int, int]]:
        """(offset, length) in an ``n``-sample slot of each field."""
        regions, offset = [], 0
        for field in self.fields:
            regions.append((offset, field.nbytes * n))
            offset += _aligned(field.nbytes * n)
        return regions

    def leaves_of(self, sample: Any) -> list[Any]:
        """The sample's leaves, checked against the layout; :class:`LayoutMismatch` (a
        ValueError) saying what differs."""
        leaves: list[tuple[str, Any]] = []
        encoded = any(field.encoded for field in self.fields)
        template = _flatten(sample, "", leaves, encoded, self.template)
        if template != self.template:
            raise LayoutMismatch(
                "the sample's structure differs from that of the sample at index 0: every "
                "sample must have the same keys and nesting"
            )
        for (path, array), field in zip(leaves, self.fields, strict=True):
            if field.encoded:
                continue
            if array.shape != field.shape or array.dtype != field.dtype:
                raise LayoutMismatch(
                    f"sample{path} is {array.dtype} {array.shape}, but the sample at index 0 "
                    "(probed as the loader was made; of a mix, mixed position 0) had "
                    f"{field.dtype} {field.shape}: from_dataset needs the same dtype and shape "
                    "in every sample (pad or resize in the transform)"
                )
        return [array for _, array in leaves]


class LayoutMismatch(ValueError):
    """A sample whose structure, dtype or shape is not that of the sample at index 0."""


@dataclass
class State:
    """What loading a sample needs, in the loader's process or a worker process."""

    dataset: Any
    transform: Callable[[Any], Any] | None
    layout: Layout
    seed: int
    on_error: str
    length: int
    seed_globals: bool
    # The native pipeline decoding the sample's encoded image, if any.
    image: Any = None


def sample_name(state: State, epoch: int, index: int) -> str:
    """How a sample is named in reasons and paths: ``dataset[i]``, or what the dataset says
    of its position ``i`` (a mix: the source and its sample)."""
    describe = getattr(state.dataset, "_stoker_describe_position", None)
    if describe is not None:
        try:
            return str(describe(epoch, index))
        except Exception:  # a name that cannot be given is no reason to fail the batch
            pass
    return f"dataset[{index}]"


def _substitute_offsets(length: int) -> list[int]:
    """The offsets from a bad sample of the samples tried in its place, as natively: the next
    16, then 32, 64, 128... on while below ``length``; every other sample up to 33."""
    others = length - 1
    if others <= 2 * _MAX_SUBSTITUTE_TRIES:
        return list(range(1, others + 1))
    far = [1 << k for k in range(5, max(5, length.bit_length())) if 1 << k < length]
    return list(range(1, _MAX_SUBSTITUTE_TRIES + 1)) + far


def _substitutes(state: State, epoch: int, index: int) -> list[int]:
    """The indices tried in turn in place of a bad sample ``index``: at ``_substitute_offsets``,
    in the dataset's own order of them where it gives one (a mix: the same source's next
    positions, so a batch keeps each source's count)."""
    offsets = _substitute_offsets(state.length)
    chosen = getattr(state.dataset, "_stoker_substitutes", None)
    if chosen is not None and offsets:
        try:
            found = [int(i) for i in chosen(epoch, index, offsets[-1])]
            return [found[offset - 1] for offset in offsets if offset <= len(found)]
        except Exception:  # the plain rule, as for a dataset without one
            pass
    return [(index + offset) % state.length for offset in offsets]


def _load(state: State, epoch: int, index: int, stream: int | None = None) -> Any:
    """``dataset[index]`` through the transform, drawing from the random stream of sample
    ``stream`` (default ``index``; a substitute draws from the stream of the sample it
    replaces, as native sources do)."""
    _current.key = (state.seed, epoch, index if stream is None else stream)
    torch = sys.modules.get("torch")
    try:
        if state.seed_globals:
            seed = sample_seed()
            random.seed(seed)
            # Both halves: the low 32 bits alone made samples share numpy's draws (some
            # hundred pairs of an ImageNet epoch).
            np.random.seed([seed & 0xFFFF_FFFF, seed >> 32])
            if torch is not None:
                # The CPU generator only: torch.manual_seed also seeds every accelerator's,
                # 80 us against 1 us a sample.
                torch.default_generator.manual_seed(seed)
        sample = state.dataset[index]
        if state.transform is not None:
            sample = state.transform(sample)
    finally:
        _current.key = None
    if state.seed_globals and torch is None and sys.modules.get("torch") is not None:
        # The sample imported torch, and drew from its generator unseeded: loaded again, now
        # that it is seeded like the others (once per process).
        return _load(state, epoch, index, stream)
    return sample


NO_LAYOUT: Final = Layout((), ())


def probe(state: State) -> tuple[Layout, str]:
    """The layout of ``dataset[0]``, and what its user should be told of it ("" when
    nothing); DatasetError when loading it fails, TypeError when a value in it cannot be
    batched. A failure of the machine or the network is tried again with backoff first, as a
    batch's samples are; under ``on_error="skip"`` a ``dataset[0]`` that fails on its own is
    passed over for the next samples, as a batch replaces it (the layout is then the first
    one's that loads, which the note says; the loader's process logs it on logger
    ``stoker``)."""
    candidates = [0, *_substitute_offsets(state.length)] if state.on_error == "skip" else [0]
    first_reason = ""
    for index in candidates:
        pauses = iter(_MACHINE_RETRY_PAUSES)
        while True:
            try:
                sample = _load(state, 0, index)
            except Exception as error:
                fault, reason = _fault(error), _describe(sample_name(state, 0, index), error)
                pause = next(pauses, None) if fault is not None else None
                if pause is not None:
                    time.sleep(pause)
                    continue
                if fault == "machine" or len(candidates) == 1:
                    raise DatasetError(
                        "from_dataset reads dataset[0] to learn the samples' layout, and it "
                        "failed: " + reason
                    ) from error
                first_reason = first_reason or reason
                break
            note = (f"from_dataset takes the samples' layout from dataset[{index}]: "
                    f"dataset[0] failed (a bad sample, replaced in its batch): {first_reason}"
                    if index else "")
            return Layout.of(sample, state.image), note
    raise DatasetError(
        f"from_dataset reads dataset[0] to learn the samples' layout, and it failed, as did "
        f"the {len(candidates) - 1} tried after it: {first_reason}"
    )


def _describe(name: str, error: BaseException) -> str:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        said = str(error)
    except Exception:  # an exception class whose __str__ fails is still this sample's
        said = "<its str() raised>"
    return f"{name} raised {type(error).__name__}: {said}\n{text.rstrip()}"


def _fault(error: BaseException) -> str | None:
    """``"machine"`` when ``error`` (or an exception it was raised ``from``) says this machine
    or its storage failed (memory, descriptors, I/O), ``"network"`` for the network or a
    timeout, None for the sample's own failure."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return None
        # Only MemoryError itself: numpy's array error, a subclass, is what a header claiming
        # an impossible size gives, the sample's fault.
        if type(seen) is MemoryError or (
            isinstance(seen, OSError) and seen.errno in _MACHINE_ERRNOS
        ):
            return "machine"
        if isinstance(seen, (ConnectionError, TimeoutError)) or (
            isinstance(seen, OSError) and seen.errno in _NETWORK_ERRNOS
        ):
            return "network"
        seen = seen.__cause__
    return None


def _attempt(
    state: State, epoch: int, index: int, stream: int, destinations: list[Any], row: int
) -> tuple[str, bool, bool] | None:
    """Loads sample ``index`` into row ``row`` (random stream of sample ``stream``); None, or
    why it failed (index, exception and traceback), whether the machine failed rather than
    the sample (:func:`_fault`) and whether the sample has another layout than dataset[0]'s.
    A failure of the machine or the network is tried again with backoff first; the network's,
    still failing, is then the sample's (a dead address)."""
    pauses = iter(_MACHINE_RETRY_PAUSES)
    tries = 0
    while True:
        tries += 1
        try:
            leaves = state.layout.leaves_of(_load(state, epoch, index, stream))
            _write_row(state, epoch, stream, destinations, row, leaves)
            return None
        except Exception as error:
            reason, fault = _describe(sample_name(state, epoch, index), error), _fault(error)
            mismatch = isinstance(error, LayoutMismatch)
            # The traceback's frames reach this one and the batch's arrays over the slot; an
            # exception the dataset's code keeps must not keep them.
            error.__traceback__ = None
        if fault is None:
            return reason, False, mismatch
        pause = next(pauses, None)
        if pause is None and fault == "network":
            return f"{reason}\n(tried {tries} times)", False, False
        if pause is None:
            return (f"{reason}\n(a failure of the machine or its storage, not of the sample, "
                    f"tried {tries} times: it is not replaced by another sample)"), True, False
        time.sleep(pause)


def _write_row(
    state: State, epoch: int, stream: int, destinations: list[Any], row: int, leaves: list[Any]
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


def fill_batch(
    state: State, epoch: int, indices: Sequence[int], view: Any,
    stopped: Callable[[], bool] | None = None, loading: Callable[[int], None] | None = None,
    doomed: Mapping[int, str] | None = None,
) -> tuple[list[tuple[int, str, int, str]], tuple[int, str, str] | None]:
    """Loads ``indices`` into ``view`` by the layout, under the bad-sample policy. Returns the
    replaced samples as (index, reason, substitute, name) and the failure, if any, as (index,
    reason, name), a name as :func:`sample_name` gives it.
    ``loading`` is told each dataset index as its loading starts, and -1 once the batch is
    done (what a timeout or a worker's death then names). ``doomed`` samples are not loaded:
    they fail with the reason given (ones that ended worker processes)."""
    try:
        return _fill_batch(state, epoch, indices, view, stopped, loading or _nowhere,
                           doomed or {})
    finally:
        if loading is not None:
            loading(-1)


def _nowhere(index: int) -> None:
    pass


def on_sample(index: int) -> str:
    """`` (on dataset[i])`` for a lane loading sample ``i``; "" for -1 (none now)."""
    return f" (on dataset[{index}])" if index >= 0 else ""


def _fill_batch(
    state: State, epoch: int, indices: Sequence[int], view: Any,
    stopped: Callable[[], bool] | None, loading: Callable[[int], None],
    doomed: Mapping[int, str],
) -> tuple[list[tuple[int, str, int, str]], tuple[int, str, str] | None]:
    n = len(indices)
    destinations = [
        np.frombuffer(view, dtype=field.dtype, count=n * field.nbytes // field.dtype.itemsize,
                      offset=offset).reshape((n, *field.shape))
        if field.nbytes else None
        for field, (offset, _) in zip(state.layout.fields, state.layout.regions(n), strict=False)
    ]
    bad: list[tuple[int, str, int, str]] = []

    def failing(index: int, reason: str) -> tuple[int, str, str]:
        return index, reason, sample_name(state, epoch, index)

    mismatched = 0
    try:
        for row, index in enumerate(indices):
            if stopped is not None and stopped():
                return bad, failing(index, "the loader was closed while this batch was loading")
            loading(index)
            failed = ((doomed[index], False, False) if index in doomed
                      else _attempt(state, epoch, index, index, destinations, row))
            if failed is None:
                continue
            reason, machine, mismatch = failed
            if state.on_error == "fail" or machine:
                return bad, failing(index, reason)
            mismatched += mismatch
            if n >= _LAYOUT_JUDGED_FROM and mismatched * 2 > n:
                # Most of a batch in another layout: not bad samples but a dataset whose
                # samples differ in shape (a transform that does not resize), which skip
                # would quietly replace by the few of dataset[0]'s layout.
                return bad, failing(index, (
                    f"{mismatched} of this batch's {n} samples have another structure, dtype or "
                    f"shape than dataset[0]: not bad samples to replace under on_error='skip' "
                    f"but samples of other layouts; give every sample one layout (resize or "
                    f"pad in the transform). The last: {reason}"))
            for substitute in _substitutes(state, epoch, index):
                loading(substitute)
                failed = ((doomed[substitute], False, False) if substitute in doomed
                          else _attempt(state, epoch, substitute, index, destinations, row))
                if failed is None:
                    bad.append((index, reason, substitute, sample_name(state, epoch, index)))
                    break
                if failed[1]:
                    return bad, failing(substitute, failed[0])
            else:
                return bad, failing(index, f"{reason}\n(and none of the samples tried in its "
                                    f"place loaded either)")
        return bad, None
    finally:
        # The slot's view is released when build() returns: no array may still export it.
        # Emptied, not only unbound: frames an exception chain of the dataset's code keeps (a
        # `raise ... from` in a retry loop, alive until the garbage collector runs) still
        # reach this list through their callers.
        destinations.clear()


class ThreadBuilder:
    """Thread mode: each lane loads its batch's samples on its own thread."""

    def __init__(self, state: State) -> None:
        self._state = state
        self._closed = threading.Event()
        self._log = LoadingLog()
        # The dataset index each lane thread is loading now (by thread), for a timeout.
        self._index: dict[int, int] = {}
        # One lock per lane number: a resized epoch's lane k (a thread of its own) waits for
        # the plain loader's lane k to finish its batch, so no more lanes call the dataset at
        # once than the loader has (one by default: a dataset that is not thread-safe), as
        # process mode's worker k serves both.
        self._lanes: dict[int, threading.Lock] = {}

    def build(
        self, lane: int, epoch: int, step: int, indices: list[int], view: Any, shared: Any,
    ) -> Any:
        with self._lanes.setdefault(lane, threading.Lock()), \
                self._log.loading(lane, batch_text(epoch, step, indices)):
            thread = threading.get_ident()
            return fill_batch(self._state, epoch, indices, view, self._closed.is_set,
                              lambda index: self._index.__setitem__(thread, index))

    def loading_now(self) -> str:
        """What the lane threads are loading now, for how long, and where each is in Python
        code; "" when none is loading."""
        now = time.monotonic()
        loading = self._log.now()
        return describe([
            (entry, f"lane thread {entry.lane}{on_sample(self._index.get(entry.thread, -1))}",
             where(entry.thread))
            for entry in loading
        ], now)

    def close(self) -> None:
        """Batches being loaded stop at their next sample."""
        self._closed.set()
