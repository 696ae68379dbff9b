"""The exceptions Stoker raises, rooted at :class:`StokerError`.

They are defined by the native module (so Rust errors map onto them without a translation
layer) and re-exported here, so ``except stoker.StokerError`` catches Stoker's failures to
load data. Some also derive from the built-in a caller would reach for: :class:`PipelineError`
is a ``ValueError``, :class:`LoaderTimeoutError` a ``TimeoutError``. Bad arguments and settings
are Python's own: ``ValueError`` (an argument out of range, a ``load_state_dict`` of other
settings), ``TypeError`` (an unknown keyword), ``FileNotFoundError`` (a missing path),
``NotADirectoryError`` (a file where a folder is read) and ``PermissionError`` (a dataset
outside the workers' ``--data-root``).

- :class:`StokerError`: the root; also raised for using a closed loader, or one inherited
  across ``fork()``.
- :class:`DatasetError`: the source cannot be opened or indexed (not an image folder, no
  samples, unreadable).
- :class:`DecodeError`: a sample cannot be read or decoded under ``on_error="fail"`` (or under
  ``"skip"``, when none of the samples tried in its place can be either); the message names
  the file.
- :class:`PipelineError`: the pipeline was refused by the native side.
- :class:`LoaderTimeoutError`: a wait for a batch passed its deadline, every batch slot is
  held by the caller, or ranks of a torch.distributed job did not make the loader in time; the
  message says which.
- :class:`WorkerUnavailableError`: distributed mode: no worker served the job for longer
  than ``worker_grace``; the message names the job and how long.
- :class:`AuthenticationError` (a ``PermissionError``): distributed mode: a daemon refused the
  token (``token=`` or ``STOKER_TOKEN``): none was given, or not one it accepts.
- :class:`GpuUnavailableError` (a ``RuntimeError``): ``device="cuda"`` cannot run here (no
  CUDA driver or device, torch without CUDA), or its page-locked slots do not fit the pinned
  budget; the message names what is missing.
- :class:`TlsError` (a ``ConnectionError``): distributed mode: the TLS connection failed: the
  daemon's certificate is not signed by ``tls_ca``'s CA or names another host, or only one
  side speaks TLS; the message says which.

The same class is raised for the same cause in both modes: an error from a worker or the
coordinator carries its kind back over the wire.
"""

from __future__ import annotations

from stoker._native import (
    AuthenticationError,
    DatasetError,
    DecodeError,
    GpuUnavailableError,
    LoaderTimeoutError,
    PipelineError,
    StokerError,
    TlsError,
    WorkerUnavailableError,
)

__all__ = [
    "AuthenticationError",
    "DatasetError",
    "DecodeError",
    "GpuUnavailableError",
    "LoaderTimeoutError",
    "PipelineError",
    "StokerError",
    "TlsError",
    "WorkerUnavailableError",
]
