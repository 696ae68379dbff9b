"""Type stubs of ``stoker._native``, the Rust extension module under the ``stoker`` package.

The public API is :class:`stoker.Loader`; this module is its engine and may change between
releases. Every method that waits or works releases the GIL.
"""

import os
from typing import Any, Final, Literal, NotRequired, TypedDict, final

from stoker._settings import DatasetSettings, LoaderSettings, SourceSettings

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
    pinned: bool
    pinned_bytes: int
    pin_error: str | None
    pinned_device: int | None
    gpu_idle_s: float
    gpu_span_s: float
    gpu_lane_cost_s: float
    gpu_lane_quiet_steps: int
    gpu_decode: GpuDecodeStats | None
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
    @property
    def pinned(self) -> bool:
        """Whether the bytes are in a page-locked slot, or in the page-locked room beside
        the slots (labels, row places)."""
    def release_after(self, stream: int) -> None:
        """Fences the slot on ``stream`` (a ``CUstream`` of the pool's device): it returns to
        the pool only after the copies queued there so far have completed. For the loader's
        own copy stream (the bytes are then not handed to the user); a no-op when pageable."""
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

TensorEntry = tuple[str, TensorDtype, tuple[int, ...], Buffer]
"""``(name, dtype, shape, data)``: ``"image"`` first, then ``"label"`` (int64, ``(n,)``)."""

class GpuDecodeStats(TypedDict):
    """What the GPU decode lane did so far."""

    hardware: bool
    rows_dtype: str
    tail_fused: bool
    rows: int
    declined_rows: int
    fallback_rows: int
    gpu_rows_per_s: float
    cpu_rows_per_s: float
    memory_bytes: int
    memory_cap: int
    nvjpeg_allocations: int
    pinned_bytes: int
    staging_bytes: int
    pinned_refused: int
    busy_s: float
    check_s: float
    decode_call_s: float
    pipe_wait_s: float
    launch_s: float

@final
class DeviceRows:
    """The rows of one batch that the GPU decode lane decoded, still on the GPU: ``shape`` of
    ``dtype``, row ``k`` being the batch's row ``positions[k]``; uint8 (rows, height, width, 3)
    unless ``tail_applied`` (``STOKER_GPU_DECODE_FUSED_TAIL=1``: the device stage's tail already
    applied, NHWC memory or (rows, 3, height, width) planes); valid while this object (which
    the batch holds) is alive."""

    positions: Final[list[int]]
    shape: Final[tuple[int, int, int, int]]
    dtype: Final[str]
    """As torch names its dtype: "uint8", "float32", "bfloat16" or "float16"."""
    tail_applied: Final[bool]
    device: Final[int]
    __cuda_array_interface__: Final[dict[str, Any]]
    def wait(self, stream: int) -> None:
        """Makes CUDA stream ``stream`` (of the rows' device; 0: the legacy default stream)
        wait on the GPU until the rows are written."""
    def keep_until(self, stream: int) -> None:
        """Keeps the rows' buffer from the lane until the work queued on ``stream`` so far
        (the copies reading the rows) is done."""

@final
class NativeBatch:
    """One batch as the loader hands it to Python, by name. Tensor bytes are shared with the
    slot, not copied."""

    epoch: Final[int]
    step: Final[int]
    tensors: Final[list[TensorEntry]]
    """``(name, dtype, shape, Buffer)`` per tensor: the image first, then the label."""
    sample_indices: Final[list[int]]
    bad_samples: Final[list[BadSample]]
    device_rows: Final[DeviceRows | None]
    """The rows the GPU decode lane left on the GPU, if any."""
    row_places: Final[Buffer | None]
    """With ``device_rows``: the batch row of each, as int64 bytes (page-locked beside the
    slots when the pool pins and had room there)."""

@final
class NativeLoader:
    """One job's loader for one rank: in-process (planner, decode threads), or with ``address``
    the client of a coordinator's workers; the slot pool, prefetch controller and statistics
    are the same in both modes."""

    steps_per_epoch: Final[int]
    num_samples: Final[int]
    dataset_fingerprint: Final[str | None]
    notices: Final[list[str]]
    class_names: Final[list[str]]
    num_threads: Final[int]
    prefetch: Final[int]
    slot_capacity: Final[int]
    dashboard_url: Final[str | None]
    address: Final[str | None]

    def __init__(self, settings: LoaderSettings, source: SourceSettings) -> None:
        """Opens ``source.source`` (a path, URI or pattern; with ``uris`` of several, those
        names as one source, ``source`` being the first) and ``split`` of it, and checks
        ``ops``; with ``mix`` it mixes those sources instead; ``num_threads`` 0 means all
        cores, ``settings.prefetch`` 0 lets a controller size the depth from the stall it
        observes, within ``max_prefetch_bytes``. With ``address`` the job is registered with
        that coordinator (a worker opens it, so a dataset outside the workers' ``--data-root``
        is refused here); every call carries ``token`` (else ``STOKER_TOKEN``'s), over TLS
        trusting ``tls_ca``. With ``settings.pin_device`` the slots are page-locked by that CUDA
        device's driver within ``pinned_budget`` bytes (this process's loaders together), its
        context opened when the first batch goes out; with ``pin_follow`` by the device whose
        context is current on the thread taking that batch, else ``pin_device`` or another
        device the process already uses (``pin_device`` where it uses none);
        ``release_streams`` names each device a released batch's slot is fenced on with the
        releasing thread's current stream there (the device's legacy and registered pool
        streams are swept besides). ``decode`` ``"gpu"`` or ``"auto"`` (with ``pin_device``)
        starts the GPU decode lane on that device within ``gpu_memory`` bytes, loading nvJPEG
        and NVRTC from ``library_dirs`` first.

        Raises:
            GpuUnavailableError: ``pin_device`` given but its driver or device is missing, or the
                slots do not fit ``pinned_budget``, or the GPU decode lane cannot start.
            PipelineError: ``ops`` is not a supported pipeline.
            FileNotFoundError: ``source`` does not exist.
            PermissionError: distributed mode: ``source`` is outside the workers' data roots.
            DatasetError: ``source`` is not a usable dataset.
            AuthenticationError: distributed mode: the coordinator refused the token.
            TlsError: distributed mode: the TLS connection failed; the message says why.
        """
    @staticmethod
    def from_dataset(settings: LoaderSettings, dataset: DatasetSettings) -> NativeLoader:
        """A loader over a Python dataset: ``dataset.builder.build(lane, epoch, step, indices,
        view, shared)`` fills each batch's slot (``shared``: (id, fd, size, offset) of the slot
        in the shared mapping when ``shared_slots``, else None)."""
    def start_epoch(self, epoch: int, start_step: int) -> None:
        """Starts producing ``epoch`` from ``start_step`` (no replay of earlier steps)."""
    def resume_resized(
        self,
        epoch: int,
        resizes: list[tuple[int, list[int]]],
        old_world: int,
        steps: list[int],
    ) -> tuple[int, int, list[tuple[int, list[int]]]]:
        """Builds the loader of ``epoch`` resumed on this world size after ranks of ``old_world``
        read ``steps[r]`` batches each; returns (start step, the epoch's steps, its resizes).
        Builds none when nothing of the epoch is left for this rank (0 steps)."""
    def end_resized(self) -> None:
        """Lets go of the loader of an epoch resumed on another world size."""
    @property
    def resumed_epoch(self) -> int | None:
        """The epoch resumed on another world size whose loader this one holds, if any."""
    def steps_in(self, epoch: int) -> int:
        """Steps of ``epoch`` for this rank (the resumed epoch's own count for that epoch)."""
    def next_batch(self) -> NativeBatch | None:
        """The next batch in step order, or ``None`` at the end of the epoch.

        Raises:
            DecodeError: a bad sample under ``on_error="fail"``.
            LoaderTimeoutError: no batch within ``timeout_s``, or every slot is held.
            WorkerUnavailableError: distributed mode: no worker served the job for
                ``worker_grace_s``.
        """
    def try_next_batch(self) -> NativeBatch | None:
        """The next batch if it has already arrived, else ``None`` (also at the end of the
        epoch); never waits."""
    @property
    def handed_out(self) -> int | None:
        """The step of the last batch handed out in the current epoch, if any."""
    def decode_split(self, epoch: int, step: int) -> int | None:
        """The GPU decode lane's share of step ``step`` of ``epoch`` in sixteenths (``auto``
        decides it once for the point the step is in, then keeps it); None without a lane."""
    def set_decode_split(self, epoch: int, step: int, sixteenths: int) -> None:
        """Sets the lane's share of the point step ``step`` of ``epoch`` is in (from a saved
        state)."""
    def record_gpu_idle(
        self,
        idle_s: float,
        span_s: float,
        lane_busy_s: float | None = None,
        window_s: float | None = None,
    ) -> None:
        """Counts ``idle_s`` seconds the consumer's GPU stream waited for batches, over
        ``span_s`` seconds of its time (stats, dashboard, prefetch controller); with
        ``lane_busy_s`` and ``window_s`` (one step's: the decode lane's work within the step's
        host window), the step also counts towards what the lane costs the stream."""
    def lane_busy_s(self) -> float | None:
        """Seconds the GPU decode lane has worked so far; None without a lane."""
    def stats(self) -> NativeStats:
        """Throughput, stall and queue counters so far."""
    def interrupt(self) -> None:
        """Ends a ``next_batch`` waiting in another thread (StokerError, "closed") and refuses
        later calls, ahead of ``close``."""
    def close(self) -> None:
        """Stops the threads; buffers already handed out stay valid."""

# The op language. Each op crosses as a dict: "op" names a variant of the proto's Op oneof
# (proto/stoker/v1/job.proto), the other keys are that message's fields, enum values by name
# (any case, with or without the enum's prefix), None or a missing key for the proto default.
# tests/test_ops.py checks these TypedDicts against op_schema().

class DecodeImageDict(TypedDict):
    op: Literal["decode_image"]
    max_pixels: int
    allow_dct_scaling: bool

class RandomResizedCropDict(TypedDict):
    op: Literal["random_resized_crop"]
    height: int
    width: int
    scale_min: float
    scale_max: float
    ratio_min: float
    ratio_max: float

class ResizeDict(TypedDict):
    op: Literal["resize"]
    shorter_side: int

class CenterCropDict(TypedDict):
    op: Literal["center_crop"]
    height: int
    width: int

class RandomHorizontalFlipDict(TypedDict):
    op: Literal["random_horizontal_flip"]
    p: float

class NormalizeDict(TypedDict):
    op: Literal["normalize"]
    mean: list[float]
    std: list[float]

class ToTensorDict(TypedDict):
    op: Literal["to_tensor"]
    layout: str
    dtype: str | None

class TokenWindowsDict(TypedDict):
    op: Literal["token_windows"]
    seq_len: int
    document_boundaries: bool

class TokenizeDict(TypedDict):
    op: Literal["tokenize"]
    tokenizer_path: str

class PackSequencesDict(TypedDict):
    op: Literal["pack_sequences"]
    seq_len: int
    eos_id: int
    pad_id: int

class SelectColumnsDict(TypedDict):
    op: Literal["select_columns"]
    names: list[str]
    dtype: str | None

OpDict = (
    DecodeImageDict
    | RandomResizedCropDict
    | ResizeDict
    | CenterCropDict
    | RandomHorizontalFlipDict
    | NormalizeDict
    | ToTensorDict
    | TokenWindowsDict
    | TokenizeDict
    | PackSequencesDict
    | SelectColumnsDict
)
"""What ``stoker.ops.Op.to_dict()`` gives and the loaders take."""

class FieldSchema(TypedDict):
    """A field of an op's message."""

    name: str
    number: int
    type: str
    repeated: bool
    doc: str
    values: NotRequired[list[str]]

class OpSchema(TypedDict):
    """An op: a variant of the proto's ``Op`` oneof and its message."""

    name: str
    message: str
    number: int
    doc: str
    fields: list[FieldSchema]

IMAGE_ORDERS: Final[str]
"""The orders an image pipeline may take (``stoker.ops.SUPPORTED_ORDERS``)."""
TOKEN_ORDERS: Final[str]
"""The op lists a token source takes."""
COLUMNS_ORDER: Final[str]
"""The op list of Parquet numeric columns."""
MAX_SIDE: Final[int]
"""The largest output side an image op accepts."""
MAX_BATCH_SIZE: Final[int]
"""The largest batch a loader takes."""
MAX_SEQ_LEN: Final[int]
"""The longest token row."""
DEFAULT_MAX_PIXELS: Final[int]
DEFAULT_GPU_MEMORY: Final[int]
# The fields the native loader reads from each settings dataclass of stoker._settings.
SETTINGS_FIELDS: Final[dict[str, list[str]]]
"""The GPU decode lane's device memory when ``gpu_memory`` is not given (1 GiB)."""
"""DecodeImage's pixel limit when none is given."""

def op_schema() -> list[OpSchema]:
    """The ops of the proto's ``Op`` oneof in field-number order, with their fields' names,
    types (proto spelling; an enum's name, its values under ``values``) and comments."""

def check_op(op: dict[str, Any]) -> None:
    """Checks one op dict's field types and arguments, as the workers would.

    Raises:
        PipelineError: an unknown op or field, a value of the wrong type, or an argument out
            of range; the message names the op and the field.
    """

def check_pipeline(ops: list[dict[str, Any]]) -> bool:
    """Checks an op list's ops and order, as the workers would, reading no file. Returns
    whether it is an image list lacking its leading ``decode_image`` (it was checked with one
    of default arguments put in front).

    Raises:
        PipelineError: the list is not a supported pipeline; the message names the problem,
            the ops given and the orders there are.
    """

class ImagePipeline:
    """A native image pipeline for encoded bytes that Python code read."""

    def __init__(self, ops: list[dict[str, Any]]) -> None: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...
    def process(self, data: bytes, seed: int, epoch: int, index: int, out: Any) -> None:
        """Decodes and augments ``data`` into ``out`` with the stream of (seed, epoch, index)."""

def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 64-bit seed of a sample's random stream (the native pipelines' own)."""

def exit_with_loader(loader_pid: int) -> None:
    """Starts a native thread that exits this process once its parent changes or the
    process ``loader_pid`` is gone (a ``from_dataset`` worker's watch of its loader)."""

def forward_logs() -> None:
    """Hands the native side's queued warnings and errors to the ``stoker`` logger now."""

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

class AuthenticationError(StokerError, PermissionError):
    """Distributed mode: a daemon refused the token (none given, or not one it accepts)."""

class GpuUnavailableError(StokerError, RuntimeError):
    """device="cuda" cannot run here, or its pinned slots do not fit the budget."""

def cuda_unavailable(ordinal: int) -> str | None:
    """None when CUDA device ``ordinal`` is there to page-lock memory (starts no context),
    else what is missing."""

def available_threads() -> int:
    """One per CPU this process may run on (affinity and cgroup quota)."""

def cuda_driver_present() -> bool:
    """Whether the CUDA driver's library can be loaded (starts nothing)."""

def cuda_active_devices() -> list[int]:
    """The CUDA devices whose primary context is active in this process (torch's first use of
    a device starts it); starts nothing; empty without a driver."""

def cuda_watch_streams(ordinal: int, streams: list[int]) -> int:
    """Registers streams of device ``ordinal`` that are never destroyed (torch's stream pool)
    for the fence thread to fence before a released batch's slot is reused; returns how many
    the device has now. Retains the device's primary context."""

def gpu_decode_unavailable(ordinal: int, library_dirs: list[str] = ...) -> str | None:
    """None when the GPU decode lane can run on CUDA device ``ordinal`` (driver, nvJPEG of a
    tested version, NVRTC compiling the kernel), else what is missing."""

def lane_helper() -> os.PathLike[str] | None:
    """The ``stoker-lane-helper`` that ``STOKER_GPU_DECODE_HELPER`` asks loaders to start, or
    None when it asks for none.

    Raises:
        ValueError: the binary it names, or for ``1`` finds, is not there.
    """

def lane_helper_main(arguments: list[str]) -> int:
    """Runs the helper on this process's stdin and stdout until its input ends; the exit
    status (2 for any argument)."""

def encode_texts(tokenizer: str, texts: list[str]) -> tuple[list[list[int]], str]:
    """The ids ``tokenizer`` (a ``tokenizer.json``) gives each text as the Tokenize op encodes
    them (no special tokens added), and the ``tokenizers`` line that encoded them: ``"1.0"``, or
    ``"0.23: <why 1.0 cannot read the file>"``.

    Raises:
        PipelineError: the file cannot be loaded, or a text cannot be encoded.
    """

def compile_gpu_kernel(
    library_dirs: list[str] = ..., sm: tuple[int, int] | None = None
) -> str | bytes:
    """Compiles the GPU lane's crop kernel with NVRTC (no GPU needed): the PTX text, or with
    ``sm`` (a compute capability) that architecture's machine code.

    Raises:
        RuntimeError: no libnvrtc, or the kernel does not compile (the message says which).
    """

class TlsError(StokerError, ConnectionError):
    """Distributed mode: TLS failed (unknown CA, wrong name, or TLS on one side only)."""

class MixOrder:
    """The mix order of Python datasets (the native rule), kept between lookups: a window it
    lays out stays laid out for the positions after it. Not picklable."""

    def __init__(
        self,
        weights: list[float],
        lens: list[int],
        window: int,
        epoch_end: str,
        epoch_samples: int,
        seed: int,
        shuffle: bool,
    ) -> None: ...
    @property
    def epoch_len(self) -> int:
        """Positions of an epoch."""
    @property
    def rounding(self) -> str | None:
        """Where the window's counts give sources shares off their weights', in words."""
    def samples(self, epoch: int, positions: list[int]) -> list[tuple[int, int]]:
        """(source, index in the source) of each position of ``epoch``."""
