"""A mix as :class:`stoker.Loader` takes it: the sources with their weights, checked, and the
epoch rule. A leaf module: :mod:`stoker.loader` reads a mix request without importing
:mod:`stoker.mix`, which builds loaders.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stoker.ops import Op

__all__ = ["MixRequest", "Source"]


@dataclass(frozen=True, eq=False)
class Source:
    """One source of a mix: a dataset path (or ``s3://`` URI) with, where it differs from the
    mix's, its own ``pipeline``, ``format`` and ``text_column`` (see :class:`stoker.Loader`).

    Sources compare by identity, so the same path may appear twice with different pipelines.
    """

    path: str | os.PathLike[str]
    pipeline: Iterable[Op] | None = None
    format: str | None = None
    text_column: str | None = None


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
            "sources": [[os.fspath(s.path), weight] for s, weight in self.sources],
            "window": self.window,
            "epoch_end": self.epoch_end,
            "epoch_samples": self.epoch_samples,
        }
