"""Where a loader stands, what ``Loader.state_dict`` saves and what ``Loader.load_state_dict``
accepts.

A state is the position of the next batch (epoch, step, the resizes of an epoch resumed on
another world size) and the settings a resume must match (a batch is a function of them and
the position). This module keeps a loader's :class:`Position`, checks states and reads one or
several ranks' states into the position they resume.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from stoker._arguments import MAX_U32, MAX_U64, MAX_WORLD_SIZE, check_int, is_int
from stoker.errors import StokerError

if TYPE_CHECKING:
    from stoker._native import NativeLoader

__all__ = ["STATE_VERSION", "Position", "Saved", "check_state", "normalised", "read_states"]

_log = logging.getLogger("stoker")

STATE_VERSION: Final = 1
# Keys of state_dict() that must match on load: a batch is a function of these and the position.
# (rank and world_size may differ: another rank's state, or a resume on another world size.)
SPEC_KEYS: Final = (
    "seed",
    "batch_size",
    "num_samples",
    "shuffle",
    "drop_last",
)
# Compared when the state has it (states saved before it was added lack it): a sharded
# source's order depends on its shuffle window.
OPTIONAL_SPEC_KEYS: Final = ("shuffle_window", "source", "reading")


@dataclass(frozen=True)
class Saved:
    """The position one or several ranks' states resume."""

    epoch: int
    # The world size that saved them.
    world_size: int
    # (cursor, taken) of each earlier resize of that epoch.
    resizes: list[tuple[int, list[int]]]
    # The step each saving rank had reached, by rank.
    steps: list[int]
    # [epoch, sixteenths] of the GPU decode split of the saved position's next batch, when one
    # was saved.
    decode_split: tuple[int, int] | None


@dataclass
class Position:
    """Where a loader stands between batches: the epoch and step of the next batch, the
    position a resumed state set for the next ``iter()``, the resizes of an epoch resumed on
    another world size, and a generation that every ``iter()``, ``set_epoch()`` and
    ``load_state_dict()`` bumps, so an older iterator refuses to go on instead of yielding
    batches of a position nobody asked for."""

    epoch: int = 0
    step: int = 0
    # A position from load_state_dict() that the next iter() starts at.
    resume_epoch: int = 0
    resume_step: int | None = None
    # (epoch, steps) of a loaded state saved after its epoch's last batch, whose position
    # moved on to the next epoch: set_epoch(epoch) then runs that epoch empty rather than
    # again from its start.
    resume_finished: tuple[int, int] | None = None
    # That finished epoch's resizes, which its state carries still once an iter() let go of
    # the epoch's loader (its steps counted without them are the plain epoch's).
    finished_resizes: list[tuple[int, list[int]]] = field(default_factory=list)
    # The epoch resumed on another world size, if any, and its resizes ((cursor, taken)
    # pairs, oldest first), which a state saves while that epoch runs.
    resized_epoch: int | None = None
    resizes: list[tuple[int, list[int]]] = field(default_factory=list)
    generation: int = 0
    # [epoch, sixteenths] of the next batch's GPU decode split as last read (read_split).
    decode_split: list[int] | None = None
    # Set when a failed load_state_dict left the native loader without the loader of
    # `resized_epoch`: that epoch cannot be served until a state is loaded again.
    resized_lost: bool = False
    # Held while a batch is taken and while iter(), set_epoch() or load_state_dict() move the
    # position, so a next() of another thread never records its step over a new position.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # Held while the fields change together and while a state reads them, never while a batch
    # is waited for: a state_dict() of a checkpoint thread sees a position before or after a
    # move, never halfway (the next epoch with the old epoch's step).
    fields: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    # Whether an iter() that went on with a pass left before its end was said.
    said_continuing: bool = False
    # The thread holding `lock` through `held`, which refuses that thread a second hold.
    holder: int | None = field(default=None, repr=False, compare=False)

    @contextlib.contextmanager
    def held(self, what: str) -> Iterator[None]:
        """Holds `lock` for ``what`` (a call, named in the error): a StokerError, not a wait
        for good, when this thread holds it already (a signal handler or a ``collate_fn``
        calling ``what`` while this thread's ``next()`` waits for a batch)."""
        if self.holder == threading.get_ident():
            raise StokerError(
                f"{what} was called while this thread's next() waits for a batch (from a "
                "signal handler, or from code next() runs): it would wait for itself; call "
                "it between batches"
            )
        with self.lock:
            try:
                self.holder = threading.get_ident()
                yield
            finally:
                self.holder = None

    def to_start(self, steps_in: Callable[[int], int]) -> tuple[int, int]:
        """The epoch and step an iterator starts now (see :meth:`start`), ``steps_in(e)``
        giving epoch ``e``'s steps; ValueError when that epoch is a resumed one whose loader a
        refused load let go of."""
        lost = self.resized_lost and self.epoch == self.resized_epoch
        if not lost and self.resume_step is None and 0 < steps_in(self.epoch) <= self.step:
            # Every batch was handed out, but the loop stopped before StopIteration (zip, islice,
            # a break at the last step): the next epoch, where state_dict() already points.
            self.finish_epoch(self.epoch)
        finished = self.resume_finished
        if self.resume_step is not None and finished is not None and finished[0] == self.epoch:
            # A loaded state's finished epoch, chosen again by set_epoch: it runs empty, on
            # whichever loader serves it now (the resumed one may be gone, and the plain one
            # would read it from its start).
            return self.epoch, steps_in(self.epoch)
        if self.resized_lost and self.epoch == self.resized_epoch:
            raise ValueError(
                f"a failed load_state_dict let go of the loader of epoch {self.epoch} as "
                "resumed on another world size; load a state again (state_dict() still "
                "gives this position)"
            )
        if self.resized_epoch is not None and self.resized_epoch < self.epoch:
            # Past the resumed epoch its loader (and so its resizes) are done, natively too.
            with self.fields:
                self.resized_epoch, self.resizes, self.resized_lost = None, [], False
        # An iteration left early (a break, islice, a loop of a fixed number of batches) goes
        # on at its next batch, where state_dict() points: starting the epoch over would hand
        # out its first batches again, every pass, and a checkpoint taken meanwhile would
        # resume elsewhere than the run goes on.
        return self.epoch, self.resume_step if self.resume_step is not None else self.step

    def start(self) -> int:
        """Starts an iterator over the current epoch, at the resume step or the next batch
        (0 once an epoch ended or ``set_epoch`` chose one); returns the step. The resume step
        holds until a batch is yielded or the epoch ends, so an iterator started again before
        its first batch (a first ``next()`` interrupted or timed out) starts there again."""
        with self.fields:
            continuing = self.resume_step is None and self.step > 0
            step = self.resume_step if self.resume_step is not None else self.step
            self.step = step
            self.generation += 1
        if continuing and not self.said_continuing:
            # Unlike DataLoader, whose every iter() reads the whole epoch: said once.
            self.said_continuing = True
            _log.warning(
                "iter() goes on with epoch %d at step %d, where the last pass over it stopped "
                "(a loop left early, a next(iter(loader)) peek, a sanity check): its first %d "
                "batches are not read again; set_epoch(%d) reads the epoch from its start "
                "(said once per loader)", self.epoch, step, step, self.epoch)
        return step

    def yielded(self, step: int) -> None:
        """The batch of ``step`` was handed out: the next is ``step + 1``; a resume is used."""
        with self.fields:
            self.step = step + 1
            self.resume_step = self.resume_finished = None

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` runs ``epoch``, at the resume step when one was set for it (for
        the epoch a loaded state had finished: at its end, so it runs empty)."""
        with self.fields:
            self.epoch = epoch
            finished = self.resume_finished
            if self.resume_step is not None and finished is not None and finished[0] == epoch:
                self.resume_epoch, self.resume_step = finished
            if self.resume_step is not None and self.resume_epoch != epoch:
                self.resume_step = None
            self.step = self.resume_step if self.resume_step is not None else 0
            self.generation += 1

    def finish_epoch(self, epoch: int) -> None:
        """``epoch`` ran to its end: the next batch is the next epoch's first."""
        with self.fields:
            self.epoch = epoch + 1
            self.step = 0
            self.resume_step = self.resume_finished = None

    def saved(self) -> dict[str, Any]:
        """The position's part of a state: the next batch's epoch and step, and the current
        epoch's resizes. A loaded state that had finished its epoch, saved again before a
        batch, is saved as it was loaded (its epoch at its end): as the next epoch's start it
        would run that epoch again after ``set_epoch`` of the finished one."""
        with self.fields:
            epoch = self.epoch
            step = self.resume_step if self.resume_step is not None else self.step
            resizes = list(self.resizes) if self.resized_epoch == epoch else []
            if self.resume_finished is not None and self.resume_step is not None:
                (epoch, step), resizes = self.resume_finished, list(self.finished_resizes)
        return {
            "epoch": epoch,
            "step": step,
            "resizes": [[cursor, list(taken)] for cursor, taken in resizes],
        }

    def resume(self, epoch: int, step: int, steps_in_epoch: int) -> None:
        """The next ``iter()`` starts at ``step`` of ``epoch`` (of ``steps_in_epoch``
        steps), or at the next epoch when that step is past the last batch."""
        with self.fields:
            self.resume_finished = None
            if step == steps_in_epoch:
                # Saved right after the last batch (or nothing was left): the next epoch
                # starts.
                self.resume_finished = (epoch, step)
                self.finished_resizes = list(self.resizes) if self.resized_epoch == epoch else []
                epoch, step = epoch + 1, 0
            self.epoch = self.resume_epoch = epoch
            self.step = self.resume_step = step
            self.generation += 1

    def next_batch(self, steps_in_epoch: int) -> tuple[int, int]:
        """The epoch and step of the next batch: the next epoch's first once this one (of
        ``steps_in_epoch`` steps) is done."""
        if self.step >= steps_in_epoch:
            return self.epoch + 1, 0
        return self.epoch, self.step

    def read_split(self, native: NativeLoader | None) -> list[int] | None:
        """[epoch, sixteenths] of the next batch's GPU decode split, read from ``native``
        (None: closed, the split last read stays); None without a GPU decode lane."""
        if native is not None:
            epoch, step = self.next_batch(native.steps_in(self.epoch))
            split = native.decode_split(epoch, step)
            self.decode_split = None if split is None else [epoch, split]
        return self.decode_split

    def resume_saved(self, saved: Saved, native: NativeLoader, world_size: int) -> None:
        """The next ``iter()`` starts where ``saved`` points, on ``native`` running
        ``world_size`` ranks: at the saved step when the world size is the same and every rank
        saved the same step, otherwise at the start of the rest of that epoch, spread over
        this run's ranks (whose resizes the position then keeps). A saved GPU decode split
        goes on where the run resumes, unless that is the next epoch (without a GPU decode
        lane ``native`` ignores it). A state refused here leaves the position as it was."""
        resizes: list[tuple[int, list[int]]] = []
        if saved.world_size == world_size and len(set(saved.steps)) == 1 and not saved.resizes:
            step = saved.steps[0]
            steps_in_epoch = native.steps_per_epoch
            if step > steps_in_epoch:
                raise ValueError(
                    f"state['step'] {step} is past the end of the epoch ({steps_in_epoch} steps)"
                )
            native.end_resized()
            resized_epoch = None
        else:
            try:
                step, steps_in_epoch, resizes = native.resume_resized(
                    saved.epoch, saved.resizes, saved.world_size, saved.steps
                )
            except BaseException:
                # The native loader lets go of an earlier resumed epoch's loader before it
                # builds the next: when that happened, this position can no longer be served.
                if self.resized_epoch is not None:
                    self.resized_lost = native.resumed_epoch != self.resized_epoch
                raise
            resized_epoch = saved.epoch
        with self.fields:  # the resizes and the position they belong to, together
            self.resized_epoch, self.resizes, self.resized_lost = resized_epoch, resizes, False
            self.resume(saved.epoch, step, steps_in_epoch)
        if saved.decode_split is not None and saved.decode_split[0] == self.epoch:
            native.set_decode_split(self.epoch, self.step, saved.decode_split[1])


def check_resizes(resizes: Any) -> list[tuple[int, list[int]]]:
    """The ``resizes`` of a state as (cursor, taken) pairs; ValueError when malformed."""
    if not isinstance(resizes, Sequence) or isinstance(resizes, (str, bytes)):
        raise ValueError(f"state['resizes'] must be a list, got {type(resizes).__name__}")
    checked = []
    for resize in resizes:
        if (not isinstance(resize, Sequence) or len(resize) != 2
                or not isinstance(resize[1], Sequence) or isinstance(resize[1], (str, bytes))):
            raise ValueError(f"state['resizes'] holds {resize!r}, not [cursor, [taken...]]")
        cursor = check_int(resize[0], "a resize cursor", 0, MAX_U64)
        taken = [check_int(t, "a resize position", 0, MAX_U64) for t in resize[1]]
        checked.append((cursor, taken))
    return checked


def check_state(state: Any, ours: Mapping[str, Any]) -> None:
    """Raises ValueError unless ``state`` is a state_dict() of a loader whose own state_dict()
    is ``ours`` (the same settings; any position)."""
    if not isinstance(state, Mapping):
        raise ValueError(
            f"state must be a dict from Loader.state_dict(), got {type(state).__name__}"
        )
    missing = [
        key
        for key in ("version", "epoch", "step", "rank", "world_size", *SPEC_KEYS)
        if key not in state
    ]
    if missing:
        raise ValueError(
            f"state is missing {', '.join(missing)}: it does not come from Loader.state_dict()"
        )
    if not is_int(state["version"]) or state["version"] != STATE_VERSION:
        raise ValueError(
            f"state version {state['version']!r} is not supported "
            f"(this build reads {STATE_VERSION})"
        )
    differing = [
        key
        for key in (*SPEC_KEYS, "mix", *(k for k in OPTIONAL_SPEC_KEYS if k in state))
        if normalised(state.get(key), key) != normalised(ours.get(key), key)
    ]
    if differing == ["num_samples"]:
        # No setting differs: the dataset changed size.
        raise ValueError(
            f"state was saved over {state.get('num_samples')!r} samples and the dataset now "
            f"has {ours.get('num_samples')!r} (num_samples): its positions would name other "
            "samples, some read twice and some never (a dataset that changed size cannot be "
            "resumed over; start its epoch again)"
        )
    mismatched = [
        f"{key}: saved {state.get(key)!r}, this loader {ours.get(key)!r}" for key in differing
    ]
    if mismatched:
        raise ValueError(
            "state was saved by a loader with other settings, so its positions name other "
            "batches; " + "; ".join(mismatched)
        )
    # Compared where both have one made by the same rule (older states, a coordinator's
    # client with older workers and Python datasets have none).
    saved, here = state.get("dataset"), ours.get("dataset")
    if (isinstance(saved, str) and isinstance(here, str)
            and _version(saved) == _version(here) and saved != here):
        raise ValueError(
            f"state was saved over another dataset: the same {ours.get('num_samples')} "
            "samples in number, but other names, labels or classes among the samples its "
            f"fingerprint reads (saved {saved}, this dataset {here}), so its positions "
            "would name other samples, some read twice and some never; if the dataset was "
            "changed on purpose, delete state['dataset'] to resume anyway"
        )


def _version(fingerprint: str) -> str:
    """The rule a dataset fingerprint was made by (its prefix, ``v3``)."""
    return fingerprint.partition(":")[0]


def normalised(value: Any, key: str) -> Any:
    """``value`` as compared: a mix's weights divided by their sum (the mix normalises them,
    so {a: 1, b: 1} is {a: 0.5, b: 0.5}), rounded off past 12 digits, and its sources named
    below the folder all of them share (the same files elsewhere, or named by a relative path,
    are the same mix; ``a/tokens.bin`` and ``b/tokens.bin`` in the other order are not)."""
    if key != "mix" or not isinstance(value, Mapping):
        return value
    sources = value.get("sources")
    if not isinstance(sources, list):
        return value  # not a mix this build saved: compared as it is
    try:
        total = sum(float(weight) for _, weight in sources)
        names = _below_shared_folder([name for name, _ in sources])
        named = [[name, round(float(weight) / total, 12)]
                 for name, (_, weight) in zip(names, sources, strict=True)]
    except (TypeError, ValueError, ZeroDivisionError):
        return value
    return {**value, "sources": named}


def _below_shared_folder(names: list[Any]) -> list[Any]:
    """Mix sources' names (each a comma-separated list of paths or URIs) with the folder every
    path of every source starts with left out."""
    if not all(isinstance(name, str) for name in names):
        return names
    paths = [[os.path.normpath(part) if "://" not in part else part for part in name.split(",")]
             for name in names]
    # The common prefix cut back to its last "/" (nothing when there is none); commonpath
    # refuses a mix of absolute and relative paths, and URIs.
    common = os.path.commonprefix([path for source in paths for path in source])  # noqa: RUF071
    cut = common.rfind("/") + 1
    return [",".join(path[cut:] for path in source) for source in paths]


def read_states(
    state: Mapping[str, Any] | Sequence[Mapping[str, Any]], ours: Mapping[str, Any]
) -> Saved:
    """One rank's state, or every rank's, checked against ``ours`` and read into the position
    they resume; ValueError when a state is not one, the states disagree or leave ranks out."""
    states = [state] if isinstance(state, Mapping) else state
    if not isinstance(states, Sequence) or not states:
        raise ValueError(
            "state must be a dict from Loader.state_dict() (or a list of every rank's), "
            f"got {type(state).__name__}"
        )
    for one in states:
        check_state(one, ours)
    first = states[0]
    old_world = check_int(first["world_size"], "state['world_size']", 1, MAX_WORLD_SIZE)
    # The epoch after it must be one too (a state at its end resumes there).
    epoch = check_int(first["epoch"], "state['epoch']", 0, MAX_U64 - 1)
    resizes = check_resizes(first.get("resizes", []))
    for one in states[1:]:
        for key in ("epoch", "world_size"):
            if one[key] != first[key]:
                raise ValueError(f"the states disagree on {key}: {first[key]!r}, {one[key]!r}")
        if check_resizes(one.get("resizes", [])) != resizes:
            raise ValueError("the states disagree on their resizes")
    if len(states) == 1:
        check_int(first["rank"], f"state['rank'] (of {old_world} ranks)", 0, old_world - 1)
        step = check_int(first["step"], "state['step']", 0, MAX_U64)
        steps = [step] * old_world
    else:
        ranks = [check_int(s["rank"], "state['rank']", 0, MAX_U32) for s in states]
        if sorted(ranks) != list(range(old_world)):
            raise ValueError(
                f"give one state or all {old_world} ranks' states, each once, got ranks "
                f"{sorted(ranks)}"
            )
        by_rank = dict(zip(ranks, states, strict=True))
        steps = [
            check_int(by_rank[r]["step"], "state['step']", 0, MAX_U64) for r in range(old_world)
        ]
    # The GPU decode split from this rank's own state when it is among them: each rank's lane
    # decides its own.
    mine = next((s for s in states if s.get("rank") == ours.get("rank")), first)
    split = mine.get("decode_split")
    decode_split = None
    if split is not None:
        if not isinstance(split, Sequence) or isinstance(split, (str, bytes)) or len(split) != 2:
            raise ValueError(f"state['decode_split'] must be [epoch, sixteenths], got {split!r}")
        decode_split = (
            check_int(split[0], "state['decode_split'][0]", 0, MAX_U64),
            check_int(split[1], "state['decode_split'][1]", 0, 16),
        )
    return Saved(epoch, old_world, resizes, steps, decode_split)
