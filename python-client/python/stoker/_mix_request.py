"""A mix as :class:`stoker.Loader` takes it: the sources with their weights, checked, and the
epoch rule, and the form the native loader takes it in. A leaf module beside the argument
checks and ops it uses: :mod:`stoker._loader` reads a mix request without importing
:mod:`stoker.mix`, which builds loaders.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stoker._arguments import check_format, check_split, check_text_column, source_names
from stoker.ops import Op, check_pipeline

__all__ = ["MixRequest", "NativeMix", "Source"]


@dataclass(frozen=True, eq=False)
class Source:
    """One source of a mix: a dataset path (or ``s3://`` URI), a pattern, or a list of them
    read as one source, with, where it differs from the mix's, its own ``pipeline``,
    ``format`` and ``text_column``, and the ``split`` it reads of a folder laid out by split
    (see :class:`stoker.Loader`).

    Sources compare by identity, so the same path may appear twice with different pipelines.
    """

    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    pipeline: Iterable[Op] | None = None
    format: str | None = None
    text_column: str | None = None
    split: str | None = None

    @property
    def name(self) -> str:
        """The source as written: its path, or a list's names joined by ``,``."""
        if isinstance(self.path, (str, os.PathLike)):
            return str(os.fspath(self.path))
        return ",".join(str(os.fspath(each)) for each in self.path)


@dataclass(frozen=True)
class MixRequest:
    """What :func:`mix` hands to :class:`stoker.Loader` as its ``source``: the sources with
    their weights, checked, and the rule."""

    sources: tuple[tuple[Source, float], ...]
    window: int
    epoch_end: str
    epoch_samples: int

    def fingerprint(self) -> dict[str, Any]:
        """What a saved state must match: paths, weights, window and epoch rule."""
        return {
            "sources": [[s.name, weight] for s, weight in self.sources],
            "window": self.window,
            "epoch_end": self.epoch_end,
            "epoch_samples": self.epoch_samples,
        }

    def native(
        self, ops: list[Op], format: str, text_column: str, locate: Callable[[object], str]
    ) -> NativeMix:
        """The mix as the native loader takes it: each source's names located (``locate``,
        the loader's path check) with its own pipeline, format, text column and split checked,
        or the loader's ``ops``, ``format`` and ``text_column`` where it names none."""
        entries = []
        for mixed, weight in self.sources:
            source_ops = ops if mixed.pipeline is None else check_pipeline(mixed.pipeline)
            whose = f"the {{}} of source {mixed.name!r}"
            source_format = (
                format
                if mixed.format is None
                else check_format(mixed.format, whose.format("format"))
            )
            column = check_text_column(mixed.text_column, whose.format("text_column"))
            names = source_names(mixed.path, locate)
            entries.append(
                (
                    ",".join(names),
                    [op.to_dict() for op in source_ops],
                    weight,
                    source_format,
                    column or text_column,
                    names if len(names) > 1 else [],
                    check_split(mixed.split),
                )
            )
        return NativeMix(entries, self.window, self.epoch_end, self.epoch_samples)


@dataclass(frozen=True)
class NativeMix:
    """A mix's sources as the native loader takes them: (path, op dicts, weight, format, text
    column, the names of a list of several, split) each, with the mix's window and epoch
    rule."""

    entries: list[tuple[str, list[dict[str, Any]], float, str, str, list[str], str]]
    window: int
    epoch_end: str
    epoch_samples: int

    @property
    def source(self) -> str:
        """The sources' paths joined by ``+``: the loader's ``source`` in its repr and logs."""
        return "+".join(entry[0] for entry in self.entries)

    @property
    def job_name(self) -> str:
        """The sources' folder names joined by ``+``: the job's name on the dashboard."""
        return "+".join(
            os.path.basename(os.path.normpath(entry[0].split(",")[0])) or "python"
            for entry in self.entries
        )

    def arguments(self) -> tuple[Any, int, str, int]:
        """The native loader's ``mix`` argument."""
        return (self.entries, self.window, self.epoch_end, self.epoch_samples)
