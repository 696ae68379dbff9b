"""The ranks of one torch.distributed job held to reading alike.

Each rank plans its share of an epoch from its own settings and its own listing of the data:
a rank whose copy of the dataset holds one file more, whose seed is ``base + rank``, or that
was built before torch.distributed started (and so read as rank 0 of 1) reads samples the
others read too and leaves some unread, silently, or runs a step more and hangs the job's
collectives. So where torch.distributed is initialised and the loader's world size is the
process group's, each rank posts what decides its share (the ``state_dict()`` keys a resume
compares, its rank and its epochs' step count) in the process group's store when the loader is
made (or, for a loader made before torch.distributed started, at its first ``iter()``), and
its first ``iter()`` waits for every rank's and raises naming what differs. The n-th loader
the check applies to on each rank are compared with each other; the last rank to read the
posts takes them away.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Final

from stoker._resume import OPTIONAL_SPEC_KEYS, SPEC_KEYS, normalised
from stoker.errors import LoaderTimeoutError

__all__ = ["RankCheck"]

# The state_dict() keys every rank must share (rank and position aside).
COMPARED: Final = ("version", *SPEC_KEYS, *OPTIONAL_SPEC_KEYS, "mix", "dataset", "world_size")
_PREFIX: Final = "stoker/ranks"
# Loaders the check applies to in this process, numbered as they first post: the n-th of each
# rank are the same loader of the job.
_serials = itertools.count()


def _process_group() -> Any:
    """torch.distributed when it is imported and initialised, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _store(dist: Any) -> Any:
    """The default process group's key-value store (every launcher's process group has one),
    or None where this torch does not expose it."""
    c10d = getattr(dist, "distributed_c10d", None)
    get = getattr(c10d, "_get_default_store", None)
    if get is None:
        return None
    try:
        return get()
    except (RuntimeError, ValueError):
        return None


class RankCheck:
    """One loader's part in the check: made with the rank and world size it resolved and where
    they came from (``origin``, empty when both were passed)."""

    def __init__(self, rank: int, world_size: int, origin: str) -> None:
        self.rank, self.world_size, self.origin = rank, world_size, origin
        # Taken when the loader first posts: only loaders the check applies to are numbered.
        self._serial: int | None = None
        self._posted = False
        self._done = False
        # What the ranks' posts disagreed on, once read: a check tried again (a loop that
        # catches the ValueError) says it again without reading the posts, which the last rank
        # to read may have taken away, nor counting this rank's read twice.
        self._refused: str | None = None

    def _key(self, rank: int) -> str:
        return f"{_PREFIX}/{self._serial}/{rank}"

    def _group(self) -> tuple[Any, int] | None:
        """(store, this process's rank in it) when the check applies now, else None."""
        dist = _process_group()
        if dist is None or self.world_size == 1:
            return None
        if int(dist.get_world_size()) != self.world_size:
            return None  # a data-parallel group of its own, passed explicitly
        store = _store(dist)
        return None if store is None else (store, int(dist.get_rank()))

    def post(self, state: Callable[[], Mapping[str, Any]], steps: Callable[[], int]) -> None:
        """Posts this rank's settings (``state()``, its ``steps()`` per epoch) where the check
        applies (when the loader is made, so a rank that iterates first, before a barrier the
        others wait in, finds them there)."""
        if self._posted or (group := self._group()) is None:
            return
        store, rank = group
        if self._serial is None:
            self._serial = next(_serials)
        saved = state()
        what = {key: normalised(saved.get(key), key) for key in COMPARED}
        what["rank"], what["steps"] = saved.get("rank"), steps()
        store.set(self._key(rank), json.dumps(what, sort_keys=True, default=str))
        self._posted = True

    def check(self, state: Callable[[], Mapping[str, Any]], steps: Callable[[], int],
              timeout_s: float) -> None:
        """Before the first batch: ValueError when torch.distributed started since the loader
        was made and runs another rank or world size than the defaults the loader took, or when
        the ranks' settings differ; LoaderTimeoutError when a rank did not post within
        ``timeout_s``. Done once per loader, once it passes."""
        if self._done:
            return
        if self._refused is not None:
            raise ValueError(self._refused)
        dist = _process_group()
        if dist is None:
            return
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
        if self.origin and (rank, world) != (self.rank, self.world_size):
            raise ValueError(
                f"this loader was made as rank {self.rank} of {self.world_size} ({self.origin}), "
                f"and torch.distributed now runs rank {rank} of {world}: every rank would "
                "read the same samples. Make the loader after init_process_group(), or pass "
                "rank= and world_size="
            )
        self.post(state, steps)
        if (group := self._group()) is None:
            self._done = True
            return
        store = group[0]
        keys = [self._key(r) for r in range(world)]
        deadline = time.monotonic() + timeout_s
        while not store.check(keys):
            # In short waits, so that Ctrl-C (a signal handler) is seen between them.
            if time.monotonic() >= deadline:
                missing = [r for r, key in enumerate(keys) if not store.check([key])]
                raise LoaderTimeoutError(
                    f"{_ranks(missing)} did not make loader {self._serial} of world size "
                    f"{world} within {timeout_s:g}s (each rank posts its settings when the "
                    "check first applies to a loader, so that the ranks' shares are checked "
                    "to fit together: the n-th such loader of each rank are compared); a "
                    "loader only some ranks make needs rank=0, world_size=1"
                )
            left = max(0.01, deadline - time.monotonic())
            with contextlib.suppress(RuntimeError):
                store.wait(keys, timedelta(seconds=min(1.0, left)))
        posted = [json.loads(store.get(key)) for key in keys]
        # The last rank to read takes the keys away: a store that outlives the job (a file
        # store a run reuses) then holds no posts of it.
        with contextlib.suppress(RuntimeError, AttributeError, NotImplementedError):
            if store.add(f"{_PREFIX}/{self._serial}/read", 1) == world:
                for key in (*keys, f"{_PREFIX}/{self._serial}/read"):
                    store.delete_key(key)
        problems = disagreements(posted)
        if problems:
            self._refused = (
                "the ranks of this torch.distributed job would read overlapping or incomplete "
                "shares of the data, or different step counts: " + "; ".join(problems)
                + f" (loader {self._serial} of each rank compared: the n-th loader each rank "
                "makes with the job's world size; a loader only some ranks make needs "
                "rank=0, world_size=1)"
            )
            raise ValueError(self._refused)
        self._done = True


def disagreements(posted: list[dict[str, Any]]) -> list[str]:
    """What the ranks' posted settings (by process rank) disagree on, each as a phrase."""
    problems = []
    for key in (*COMPARED, "steps"):
        by_value: dict[str, list[int]] = {}
        for rank, what in enumerate(posted):
            by_value.setdefault(json.dumps(what.get(key), sort_keys=True), []).append(rank)
        if len(by_value) > 1:
            problems.append(f"{key}: " + ", ".join(
                f"{_short(value)} on {_ranks(ranks)}" for value, ranks in by_value.items()
            ))
    readers: dict[Any, list[int]] = {}
    for rank, what in enumerate(posted):
        readers.setdefault(what.get("rank"), []).append(rank)
    for loader_rank, ranks in readers.items():
        if len(ranks) > 1:
            problems.append(f"{_ranks(ranks)} all read as rank {loader_rank}")
    return problems


def _short(value: str) -> str:
    return value if len(value) <= 60 else value[:57] + "..."


def _ranks(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0, 2`` (the first eight, and how many more)."""
    shown = ", ".join(str(rank) for rank in ranks[:8])
    more = f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}{more}"
