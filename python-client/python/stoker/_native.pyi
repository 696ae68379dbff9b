"""Type stubs of ``stoker._native``, the Rust extension module under the ``stoker`` package.

The public API is :class:`stoker.Loader`; this module is its engine and may change between
releases. Every method that waits or works releases the GIL.
"""

import os
from typing import Any, Final, Literal, NotRequired, TypedDict, final

TensorDtype = Literal["uint8", "float32", "int64", "int32", "uint16", "uint32"]

class BadSample(TypedDict):
    """A sample that could not be read or decoded, and what replaced it under ``skip``."""

    sample_index: int
    path: str
    reason: str
    substitute_index: int | None

class NativeStats(TypedDict):
    """Counters since the loader was made; times in seconds."""

    samples: int
    batches: int
    elapsed_s: float
    samples_per_s: float
    wait_s: float
    epoch_start_wait_s: float
    first_batch_s: float | None
    read_s: float
    decode_s: float
    augment_s: float
    assemble_s: float
    bad_samples: int
    in_flight: int
    prefetch_depth: int
    slots_in_use: int
    slot_capacity: int
    address: NotRequired[str]

@final
class Buffer:
    """A Rust-owned batch slot, exposed through the buffer protocol (1-D, unsigned bytes,
    writable). The slot returns to the loader's pool when the last view of it is released."""

    @property
    def address(self) -> int:
        """The address of the first byte."""
    @property
    def nbytes(self) -> int:
        """The size in bytes."""
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

TensorEntry = tuple[str, TensorDtype, tuple[int, ...], Buffer]
"""``(name, dtype, shape, data)``: ``"image"`` first, then ``"label"`` (int64, ``(n,)``)."""

NativeBatch = tuple[int, int, list[TensorEntry], list[int], list[BadSample]]
"""``(epoch, step, tensors, sample_indices, bad_samples)``."""

@final
class NativeLoader:
    """One job's loader for one rank: in-process (planner, decode threads), or with ``address``
    the client of a coordinator's workers; the slot pool, prefetch controller and statistics
    are the same in both modes."""

    steps_per_epoch: Final[int]
    num_samples: Final[int]
    class_names: Final[list[str]]
    num_threads: Final[int]
    prefetch: Final[int]
    slot_capacity: Final[int]
    dashboard_url: Final[str | None]
    address: Final[str | None]

    def __init__(
        self,
        source: str,
        ops: list[dict[str, Any]],
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        num_threads: int,
        rank: int,
        world_size: int,
        prefetch: int,
        on_error: Literal["skip", "fail"],
        timeout_s: float,
        max_held_batches: int,
        max_prefetch_bytes: int = 2 << 30,
        dashboard: str | None = None,
        job_name: str = "python",
        format: str = "auto",
        shuffle_window: int = 0,
        text_column: str = "",
        address: str | None = None,
        worker_grace_s: float = 120.0,
    ) -> None:
        """Opens ``source`` and checks ``ops``; ``num_threads`` 0 means all cores, ``prefetch``
        0 lets a controller size the depth from the stall it observes, within
        ``max_prefetch_bytes``. With ``address`` the job is registered with that coordinator
        (a worker opens it, so a dataset outside the workers' ``--data-root`` is refused here).

        Raises:
            PipelineError: ``ops`` is not a supported pipeline.
            FileNotFoundError: ``source`` does not exist.
            PermissionError: distributed mode: ``source`` is outside the workers' data roots.
            DatasetError: ``source`` is not a usable dataset.
        """
    def start_epoch(self, epoch: int, start_step: int) -> None:
        """Starts producing ``epoch`` from ``start_step`` (no replay of earlier steps)."""
    def next_batch(self) -> NativeBatch | None:
        """The next batch in step order, or ``None`` at the end of the epoch.

        Raises:
            DecodeError: a bad sample under ``on_error="fail"``.
            LoaderTimeoutError: no batch within ``timeout_s``, or every slot is held.
            WorkerUnavailableError: distributed mode: no worker served the job for
                ``worker_grace_s``.
        """
    def stats(self) -> NativeStats:
        """Throughput, stall and queue counters so far."""
    def close(self) -> None:
        """Stops the threads; buffers already handed out stay valid."""

def make_dataset(out: str, count: int, seed: int = 0) -> str:
    """Writes a seeded ImageNet-like image folder (10 classes, JPEG) of ``count`` images under
    ``out`` and returns its root; reuses one already there with the same spec."""

def make_tokens(
    out: str | os.PathLike[str],
    tokens: int,
    vocab: int = 50257,
    dtype: str = "uint16",
    seed: int = 0,
) -> None:
    """Writes a seeded token file of ``tokens`` random ids below ``vocab`` to ``out``."""

def train_bpe_tokenizer(
    texts: list[str],
    out: str | os.PathLike[str],
    vocab_size: int = 1000,
    eos: str = "<|endoftext|>",
) -> None:
    """Trains a small byte-level BPE on ``texts`` (``eos`` is id 0) and writes its
    ``tokenizer.json`` to ``out``."""

class StokerError(Exception):
    """The root of every Stoker exception."""

class DatasetError(StokerError):
    """The source cannot be opened or indexed."""

class DecodeError(StokerError):
    """A sample could not be read or decoded under ``on_error="fail"``; names the file."""

class PipelineError(StokerError, ValueError):
    """The pipeline's ops or their order were refused."""

class LoaderTimeoutError(StokerError, TimeoutError):
    """A wait passed its deadline, or every batch slot is held; the message says which."""

class WorkerUnavailableError(StokerError):
    """Distributed mode: no worker served the job for longer than ``worker_grace``."""
