"""The exceptions Stoker raises, rooted at :class:`StokerError`.

They are defined by the native module (so Rust errors map onto them without a translation
layer) and re-exported here, so ``except stoker.StokerError`` catches every Stoker failure.
Some also derive from the built-in a caller would reach for: :class:`PipelineError` is a
``ValueError``, :class:`LoaderTimeoutError` a ``TimeoutError``; a missing path is Python's own
``FileNotFoundError``.

- :class:`StokerError`: the root; also raised for using a closed loader, or one inherited
  across ``fork()``.
- :class:`DatasetError`: the source cannot be opened or indexed (not an image folder, no
  samples, unreadable).
- :class:`DecodeError`: a sample cannot be read or decoded under ``on_error="fail"``; the
  message names the file.
- :class:`PipelineError`: the pipeline was refused by the native side.
- :class:`LoaderTimeoutError`: a wait for a batch passed its deadline, or every batch slot is
  held by the caller; the message says which.
- :class:`WorkerUnavailableError`: distributed mode: no worker served the job for longer
  than ``worker_grace``; the message names the job and how long.

The same class is raised for the same cause in both modes: an error from a worker or the
coordinator carries its kind back over the wire.
"""

from __future__ import annotations

from stoker._native import (
    DatasetError,
    DecodeError,
    LoaderTimeoutError,
    PipelineError,
    StokerError,
    WorkerUnavailableError,
)

__all__ = [
    "DatasetError",
    "DecodeError",
    "LoaderTimeoutError",
    "PipelineError",
    "StokerError",
    "WorkerUnavailableError",
]
