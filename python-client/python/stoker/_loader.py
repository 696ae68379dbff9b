"""``stoker.Loader``: Stoker's training-loop side, in the place of torch's ``DataLoader``.

The loader's story in Python: its arguments checked before any thread starts or any file is
read (:mod:`stoker._arguments`, :class:`stoker._placement.Placement`), handed to the native
loader (:mod:`stoker._native`: reading, decoding, augmenting, batching in Rust, GIL released),
then epochs, resumes (:mod:`stoker._resume`) and batches handed out (:mod:`stoker._batches`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Literal, Self

from stoker import _native, _resume, gpu
from stoker._arguments import (
    MAX_U32,
    MAX_U64,
    check_format,
    check_int,
    check_on_error,
    check_remote,
    check_seconds,
    check_split,
    check_text_column,
    default_threads,
    import_torch,
    refuse_unexpected,
    resolve_output,
)
from stoker._batches import BatchFeed, BatchIterator, BatchMaker
from stoker._dataset import DatasetSide, FromDataset
from stoker._fork import ForkGuard
from stoker._placement import Placement
from stoker._rank_check import RankCheck
from stoker._saved_state import SavedState
from stoker._settings import LoaderSettings, checked_settings
from stoker._source import choose_source
from stoker._stats import Stats
from stoker.errors import StokerError
from stoker.ops import Op

__all__ = ["BatchIterator", "Loader"]

_log = logging.getLogger("stoker")


class Loader(FromDataset, SavedState, Stats):
    """Loads batches of images or tokens, decoded, augmented or tokenised in Rust threads.

    Iterating yields one epoch of batches, each a dict of named tensors: ``"image"`` (uint8
    ``(B, H, W, 3)`` by default, see :mod:`stoker.ops`) and ``"label"`` (int64 ``(B,)``, the
    index of the sample's class folder in sorted order, like torchvision's ImageFolder); for
    token files (``pipeline=[ops.TokenWindows(seq_len)]``) ``"tokens"`` ``(B, seq_len + 1)``;
    for text (``[ops.Tokenize(path), ops.PackSequences(seq_len)]``) ``"input_ids"``,
    ``"position_ids"`` and ``"document_ids"``, int32 ``(B, seq_len)``; for Parquet numeric
    columns (``[ops.SelectColumns(names)]``) one ``(B,)`` array per column, named like it, and
    ``"label"``. The tensors are views
    of the loader's batch slots, not copies. Iterating again goes on from where the last
    iteration stopped: after an epoch's last batch, the next epoch, reshuffled; after a loop
    left early (a ``break``, ``islice``, a loop of a fixed number of batches), the same epoch
    from the next batch, where :meth:`state_dict` points; :meth:`set_epoch` starts an epoch
    from its first batch. Argument names follow ``torch.utils.data.DataLoader`` where the meaning
    is the same; DataLoader-only arguments raise a ValueError naming the alternative.

    Example::

        import stoker
        with stoker.Loader("/data/train", pipeline=stoker.vision.imagenet_train(224),
                           batch_size=256, num_threads=8) as loader:
            for batch in loader:
                train_step(batch["image"].cuda(), batch["label"].cuda())

    A batch is a pure function of (source, pipeline, seed, epoch, rank, world_size, step):
    the same whatever ``num_threads`` and ``prefetch``, and :meth:`load_state_dict` resumes
    at the exact batch an uninterrupted run would have yielded next.

    **Memory is bounded.** The loader owns ``prefetch + max_held_batches`` image slots
    (with ``prefetch="auto"``, the controller's ceiling) and never more. Each yielded batch
    keeps its slot until the last array or tensor viewing its image is released
    (``del batch``, or the loop variable moving on). The usual ``for batch in loader`` holds
    one batch (the one bound to ``batch``) while it asks for the next, well within the
    default bound. Keeping batches around (a list of them, an image stored in a metrics dict)
    holds slots: once ``max_held_batches`` are held beyond those in flight, the loader has no
    slot to fill, ``next()`` waits up to ``timeout`` seconds for one to come back, then raises
    :class:`~stoker.LoaderTimeoutError` saying that all slots are held. Release the batches
    (or copy what you keep: ``tensor.clone()``) and iteration goes on from where it stopped.

    Args:
        source: path (or ``file://`` URL) of the dataset, a pattern, or a list of them read
            as one source: a glob (``"data/train-*.parquet"``; ``*``, ``?``, ``[...]``,
            ``**``) or brace groups (``"shards/shard-{00000..01023}.tar"``, ``{a,b}``), whose
            files are sorted by their paths' bytes and counted once, all of one format (tar
            shards, Parquet, JSONL, or one token file). A name that exists as written is taken
            as written. The dataset: an image folder laid out like
            torchvision's ImageFolder (``root/<class>/<image>``), tar shards, a token file
            (``*.bin``; ``*.u32.bin`` and ``*.uint32.bin`` hold uint32 tokens, any other name
            uint16), JSON Lines text (a ``.jsonl`` file or a folder of them; ``.jsonl.gz`` and
            ``.jsonl.zst`` are decompressed once into the cache tier), Parquet files, or a Hugging
            Face ``datasets`` folder as ``Dataset.save_to_disk`` writes it (its ``Image`` or string
            column gives the samples, its ``ClassLabel`` the labels and :attr:`classes`; for a
            ``DatasetDict`` pass one split's folder), or Mosaic Streaming's MDS shards (a folder of
            ``index.json`` and its ``shard.NNNNN.mds`` files, zstd/gz-compressed ones
            decompressed once into the cache tier). The format is picked from the files
            unless ``format`` names it. ``s3://BUCKET/PREFIX`` is read as a local folder of
            the same files is (tar shards, Parquet, JSONL, a ``save_to_disk`` folder, an image
            folder; a key ending in ``.parquet`` or ``.bin`` is a Parquet or token file),
            through the local object cache (``STOKER_CACHE_DIR``, ``STOKER_CACHE_MAX_BYTES``;
            credentials and endpoint from the ``AWS_*`` variables, else the ``~/.aws``
            profile ``AWS_PROFILE`` names): tar shards, Parquet and
            token files by ranged GETs, an image folder an object per image, both read ahead
            of the loop; JSONL and ``save_to_disk`` shards fetched whole into the cache
            (a set larger than its cap is refused).
            ``stoker index s3://BUCKET/PREFIX`` writes the index that lets a tar set open
            without reading its shards.
        pipeline: the ops, e.g. ``stoker.vision.imagenet_train(224)`` or a list of
            :mod:`stoker.ops`; checked before any work starts.
        batch_size: samples per batch, >= 1.
        shuffle: reshuffle every epoch (``False``: dataset order).
        seed: seed of the shuffle and of every random augmentation, in 0..2**64.
        drop_last: drop the last, partial batch of each epoch (per rank), like DataLoader.
        num_threads: decode threads; ``None``: the CPUs this process may run on (affinity and
            cgroup quota), except under a launcher such as ``torchrun`` that starts
            ``LOCAL_WORLD_SIZE`` ranks on a node without pinning them: when this process's
            affinity covers every CPU of the node, the CPUs available (that affinity, or fewer
            under a cgroup quota) are divided by ``LOCAL_WORLD_SIZE`` (so 8 ranks do not
            start 8 node's worth of threads); an
            affinity already narrowed by the launcher is used as it is. ``stats()["thread_rule"]``
            says which rule applied.
        rank: this process's part of each epoch; default: ``torch.distributed`` when it is
            initialised, else the ``RANK`` environment variable, else 0: the global rank (with
            tensor or pipeline parallelism, pass the data-parallel rank and size).
        world_size: how many parts; default: as for ``rank`` (``WORLD_SIZE``), else 1. One of
            the two alone pairs only with defaults that agree. Ranks reading the same data with
            the same settings get disjoint parts of the same number of batches (short ranks
            wrap around); in a torch.distributed job the first ``iter()`` checks they do.
        prefetch: batches prepared ahead of the training loop, or ``"auto"``: a controller
            starts at twice the threads and sizes the depth from the stall, batch latency and
            step time it observes, up to as many batches as 2 GiB holds (at least 2, at
            most 64).
        output: ``"torch"`` (tensors) or ``"numpy"`` (arrays); default: ``"torch"`` when torch
            can be imported, else ``"numpy"``.
        on_error: what a sample that cannot be read or decoded does: ``"skip"`` replaces it
            with a deterministic substitute (batch shapes hold; it is logged with its path and
            counted in :meth:`stats`), ``"fail"`` raises :class:`~stoker.DecodeError` naming
            the file.
        address: ``"host:port"`` of a Stoker coordinator whose workers (``stoker-worker``)
            build the batches: distributed mode; or a fleet's coordinators, ``"a:7070,b:7070"``
            (the workers' list, in its order), each job at the one its spec hashes to.
            ``source`` is then a path on the workers (under their ``--data-root``); batches are
            bit-identical to the in-process mode. ``None`` (default) runs in-process. Then
            ``num_threads`` does not apply, ``prefetch`` is the batches the workers may send
            ahead (``"auto"``: the controller, from 8), each batch lands in one of the loader's
            slots, and the coordinator serves its own dashboard (``--http``) besides ``dashboard=``.
        timeout: seconds ``next()`` waits for a batch (or for a held slot to come back)
            before it raises :class:`~stoker.LoaderTimeoutError`; default 600 (at most 1e9).
        worker_grace: distributed mode: seconds batches may be wanted with no worker stream
            open (every worker gone, or the coordinator not answering) before ``next()``
            raises :class:`~stoker.WorkerUnavailableError` naming the job and which it was;
            default 120; the constructor waits as long for the coordinator to answer with a
            worker for the job (its answer without one takes 15 s), then raises the same.
            Separate from ``timeout``: workers leaving in a scale-down do not trip it.
        token: distributed mode: the shared token the daemons were started with
            (``--token-file``), sent on every call; default: the ``STOKER_TOKEN`` environment
            variable, if set. A refusal raises :class:`~stoker.AuthenticationError`.
        tls_ca: distributed mode: a PEM file of the CA that signed the daemons' certificates
            (``--tls-cert``): connect over TLS. ``None`` (default): plaintext. A failed
            handshake raises :class:`~stoker.TlsError` naming the cause.
        tls_server_name: distributed mode, with ``tls_ca``: the name the daemons' certificates
            carry, when it is not the host of their address.
        max_held_batches: batches the caller may keep alive at once beyond those in flight
            (see *Memory is bounded* above); default 4.
        dashboard: serve the stall dashboard (live charts, ``/api/jobs``, ``/metrics``) on
            this port of 127.0.0.1 (0: any free port) or ``"host:port"``; the URL is
            :attr:`dashboard_url`, served until :meth:`close`; without ``dashboard_token_file``
            open to anyone on the machine on loopback, refused (``ValueError``) off it.
        dashboard_token_file: with ``dashboard``, a file holding the credential it then asks
            for, on loopback too (open ``/?token=CREDENTIAL`` once: the browser keeps a cookie
            12 hours; or send ``Authorization: Bearer CREDENTIAL``); equal to the ``token``
            (or ``STOKER_TOKEN``) of the distributed mode, ``ValueError``.
        format: ``None`` (default: from the files), or one of ``"image_folder"``, ``"tar"``,
            ``"parquet"``, ``"tokens"``, ``"jsonl"``, ``"hf"`` (a ``save_to_disk`` folder),
            ``"mds"`` (Mosaic Streaming's shards).
        shuffle_window: shards per shuffle window for sharded sources (tar shards, a folder
            of JSONL files): 0 (default) shuffles globally; W >= 1 shuffles the shard order,
            then samples within windows of W shards, keeping reads mostly sequential.
        text_column: the text field of JSONL documents (default ``"text"``).
        label_column: the label column of a Parquet file, Hugging Face folder or MDS set
            (default: ``label``, else the first ``ClassLabel`` feature, logging which when
            there are several; else, beside images, an integer ``labels``, ``cls``, ``target``,
            ``targets`` or ``y``; an image set without one logs a warning that every label is
            0), or the integer label field of JSONL documents (default: ``label`` when the
            first holds an integer one; one named that it holds no integer in refuses the
            set). Labels are class indices: a negative one refuses the set. Not with mix().
        image_column: the image column of a Parquet file, Hugging Face folder or MDS set
            (default: ``image``, ``jpg`` or ``png``, else the first ``Image`` feature
            ``datasets`` wrote, else, in MDS, its one column encoded ``jpeg``, ``png`` or
            ``pil``: several such columns, none named so, refuse the set). Not with
            :func:`stoker.mix`.
        device: ``None`` or ``"cpu"`` (default): batches in host memory. ``"cuda"`` (the
            current device) or ``"cuda:N"``: batches delivered as tensors on that GPU. The
            slots are page-locked, each finished batch is copied on the loader's own CUDA
            stream, and the image's pipeline tail runs there: a trailing ``Normalize`` and
            ``ToTensor`` (same values as on the CPU within float rounding, same layout), or
            ``dtype`` / ``memory_format`` below; the CPU threads then make uint8 NHWC. The
            consumer's current stream waits for the batch on an event (the host does not), so
            the training loop needs no ``.cuda()`` and no normalisation. Device memory is
            torch's (its caching allocator), held by the batches alive. Needs torch with CUDA
            and a GPU: otherwise :class:`~stoker.GpuUnavailableError` names what is missing.
            Not with :func:`stoker.mix` yet.
        pin_memory: page-lock the batch slots (registered with the CUDA driver once per slot,
            never per batch), like DataLoader's ``pin_memory``: torch tensors of a batch
            report ``is_pinned()`` and ``.cuda(non_blocking=True)`` copies them
            asynchronously; a slot returns to the pool only after every copy from its batch
            queued before the batch was released has finished, on any stream of torch's (the
            default stream and every ``torch.cuda.Stream()``) from any thread, or on another
            stream current on the releasing thread. Without a CUDA driver it warns once,
            naming what is missing, and runs with pageable slots (``stats()["pinned"]`` is
            False). Implied by ``device="cuda"``.
        pinned_memory_budget: bytes of page-locked memory this process may hold: the slots
            and the room beside them for labels, and the GPU decode lane's staging and
            nvJPEG's pinned buffers; default: a quarter of the node's memory (or of its
            cgroup's limit where lower) divided by ``LOCAL_WORLD_SIZE``. The slot pool (and
            the prefetch ceiling) is made smaller to fit; fewer than ``max_held_batches + 2``
            slots raise :class:`~stoker.GpuUnavailableError`.
        dtype: with ``device="cuda"``: the image's dtype on the device, ``"float32"``,
            ``"bfloat16"``, ``"float16"`` (or torch's), or ``"uint8"`` without ``Normalize``;
            default: the pipeline's (float32 after ``Normalize``).
        memory_format: with ``device="cuda"``: ``"channels_last"`` (or
            ``torch.channels_last``): the image as NCHW with NHWC memory, what convolutions in
            channels_last want; ``"contiguous"`` (default): the pipeline's layout.
        decode: where images are decoded. ``"cpu"`` (default): the decode threads. ``"gpu"``
            (needs ``device="cuda"``): every row the GPU's JPEG engines take is decoded there
            (nvJPEG, hardware backend where the GPU has one) and cropped, resized and flipped by
            one batched kernel straight into the device batch; the RandomResizedCrop window and
            flip are drawn as on the CPU, so with ``DecodeImage(dct_scaling=False)`` pixels
            differ from ``"cpu"`` by the decoders' rounding and chroma upsampling (and the
            resize's rounding, at most 1 per value); with DCT
            scaling on (``imagenet_train``'s default) the CPU decodes large windows at a reduced
            scale and the GPU at full size, so those rows differ more (the README gives both
            figures).
            Progressive JPEGs, PNGs, CMYK, files cut short and images too large for
            ``gpu_memory`` are decoded on the CPU threads in the same batch. ``"auto"``: each
            batch is split between the CPU threads and the GPU, half and half at first, changed
            only at fixed points (each epoch's first step, then every 16 steps) toward the split
            whose batches reached the training loop fastest (first by the lanes' rates, then all
            rows on the GPU for one point, then a sixteenth at a time; one point in 128 all on
            the CPU, kept when faster: the lane's cost to the step counts); the split in force is
            saved in :meth:`state_dict`, so a resumed run gets the same bits up to the next
            point. Without ``device="cuda"``, or where the lane cannot run, ``"auto"`` is
            ``"cpu"``. Needs nvJPEG 13 (the CUDA toolkit's, or NVIDIA's pip wheel) and NVRTC
            (torch's CUDA wheels bring it); ``"gpu"`` where they are missing raises
            :class:`~stoker.GpuUnavailableError` naming what is. ``stats()["gpu_decode"]`` says
            what the lane did.
        gpu_memory: with ``decode="gpu"`` or ``"auto"``: the most device memory the lane
            holds, in bytes (decoded images in flight, rows waiting for the training loop,
            what nvJPEG allocates through the lane's allocators: on the hardware backend,
            whose own buffers are outside the cap, a margin of 8 MiB a decode thread, else a
            share equal to each thread's decoded images), allocated when the loader starts and
            never grown; an image
            whose decoded size does not fit goes to the CPU. Default 1 GiB
            (``stoker._native.DEFAULT_GPU_MEMORY``); freed by :meth:`close` once the batches
            holding its rows are released.
        split: the split to read of a source laid out by split: hub shards named
            ``{split}-00000-of-00002.*`` (directly or under ``data/``), ``{split}/`` or
            ``data/{split}/`` folders of data files, a ``DatasetDict`` folder, or an image
            folder whose subfolders are all split names (``train/``, ``val/``, ...) holding
            class folders; also the split among files a pattern names. A source holding several
            splits without ``split`` raises ValueError naming them; one split alone is read.

    Raises:
        ValueError: an argument is out of range, a DataLoader-only argument was passed, the
            pipeline is not supported (the message says what is accepted), a pattern is
            malformed, names files of several formats or a folder, or the source holds several
            splits and none (or one it lacks) is named.
        stoker.GpuUnavailableError: ``device="cuda"`` where no GPU can be used (the message
            names what is missing), or page-locked slots that do not fit the budget.
        TypeError: an unknown keyword argument.
        FileNotFoundError: ``source`` does not exist, a glob matches no file, or a file a
            brace range names is missing.
        ImportError: ``output="torch"`` without an importable torch.
        stoker.DatasetError: ``source`` is not a usable image folder.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        pipeline: Iterable[Op],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_threads: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int | Literal["auto"] = "auto",
        output: Literal["torch", "numpy"] | None = None,
        on_error: Literal["skip", "fail"] = "skip",
        address: str | None = None,
        timeout: float = 600.0,
        worker_grace: float = 120.0,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_server_name: str | None = None,
        max_held_batches: int = 4,
        dashboard: int | str | None = None,
        dashboard_token_file: str | os.PathLike[str] | None = None,
        format: str | None = None,
        shuffle_window: int = 0,
        text_column: str | None = None,
        label_column: str | None = None,
        image_column: str | None = None,
        device: str | None = None,
        pin_memory: bool = False,
        pinned_memory_budget: int | None = None,
        dtype: Any = None,
        memory_format: Any = None,
        decode: Literal["cpu", "gpu", "auto"] = "cpu",
        gpu_memory: int | None = None,
        split: str | None = None,
        **unsupported: Any,
    ) -> None:
        # Attributes close() relies on come first, so a failing __init__ leaves an object it
        # can handle.
        self._native: _native.NativeLoader | None = None
        self._closed = False
        self._fork = ForkGuard()

        refuse_unexpected(unsupported)
        check_remote(address, token, tls_ca, tls_server_name)
        placement = Placement.check(
            device=device, pin_memory=pin_memory, pinned_memory_budget=pinned_memory_budget,
            dtype=dtype, memory_format=memory_format, decode=decode, gpu_memory=gpu_memory,
            address=address,
        )
        settings, self._rank_origin = checked_settings(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
            world_size=world_size, prefetch=prefetch, timeout=timeout,
            max_held_batches=max_held_batches, dashboard=dashboard,
            dashboard_token_file=dashboard_token_file,
        )
        if num_threads is None:
            threads, self._thread_rule = default_threads()
        else:
            threads = check_int(num_threads, "num_threads (None: all cores)", 1, 4096)
            self._thread_rule = "num_threads"
        error_policy = check_on_error(on_error)
        worker_grace = check_seconds(worker_grace, "worker_grace")
        self._format: str = check_format(format)
        self._shuffle_window = check_int(shuffle_window, "shuffle_window", 0, MAX_U32)
        self._text_column: str = check_text_column(text_column)
        label_column = check_text_column(label_column, "label_column")
        image_column = check_text_column(image_column, "image_column")
        source_split = check_split(split)
        output_kind = resolve_output(output)
        placement.check_output(output_kind)
        self._torch = import_torch("output='torch'") if output_kind == "torch" else None
        self._output: str = output_kind
        chosen = choose_source(
            source, pipeline, placement, remote=address is not None, format=self._format,
            text_column=self._text_column, split=source_split, label_column=label_column,
            image_column=image_column,
        )
        self._mix, self._ops, self._source = chosen.mix, chosen.ops, chosen.label
        self._reading, self._reading_by_path = chosen.readings()
        placement = placement.resolve(self._torch)
        self._decode = placement.decode
        self._settings = replace(
            settings, job_name=chosen.job_name, **placement.pinning_arguments(self._torch)
        )
        try:
            self._native = _native.NativeLoader(
                self._settings,
                chosen.settings(
                    num_threads=threads, on_error=error_policy,
                    shuffle_window=self._shuffle_window, address=address,
                    worker_grace_s=worker_grace, token=token,
                    tls_ca=None if tls_ca is None else os.fspath(tls_ca),
                    tls_server_name=tls_server_name, **placement.lane_arguments(chosen.tail),
                ),
            )
        except BaseException:
            _native.forward_logs()  # what opening logged before it failed (tar members left out)
            raise
        try:
            self._finish_init(placement.stage(self._torch, chosen.tail))
        except BaseException:  # its threads, slots, port go now, not with the traceback
            self.close()
            raise

    @classmethod
    def _over_dataset(
        cls, native: _native.NativeLoader, side: DatasetSide, settings: LoaderSettings,
        output: str, thread_rule: str, rank_origin: str,
    ) -> Self:
        self = cls.__new__(cls)
        self._native = native
        self._fork = ForkGuard()
        self._closed = False  # set after _fork, which __del__ reads once this is set
        self._side, self._settings, self._thread_rule = side, settings, thread_rule
        self._rank_origin = rank_origin
        self._shuffle_window = 0  # a Python dataset has no shards to shuffle by window
        self._reading = side.reading
        self._source, self._ops, self._output = side.name, [], output
        self._torch = import_torch("output='torch'") if output == "torch" else None
        self._finish_init()
        return self

    def _finish_init(self, device_stage: gpu.DeviceStage | None = None) -> None:
        assert self._native is not None
        rebuild = None if self._side is None else self._side.batch
        self._batches = BatchMaker(self._handle, self._torch, device_stage, rebuild)
        self._feed = BatchFeed(
            self._handle, self._batches.make, device_stage, self._torch, self._loading_now
        )
        # Read once: state_dict() must work after close() and in a forked child, where the
        # handle may not be touched.
        self._num_samples: int = self._native.num_samples
        for notice in self._native.notices:
            _log.warning("%s", notice)
        _native.forward_logs()  # what opening it logged natively (a pool made smaller, say)
        self._dataset_fingerprint: str | None = self._native.dataset_fingerprint
        # The position of the next batch to yield, which is what state_dict() saves.
        self._position = _resume.Position()
        self._fork.hold(self._native)
        settings = self._settings
        self._ranks = RankCheck(settings.rank, settings.world_size, self._rank_origin)
        self._ranks.post(self.state_dict, self.__len__)

    # -- properties -------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last batch of an epoch may be smaller unless ``drop_last``)."""
        return self._settings.batch_size

    @property
    def num_samples(self) -> int:
        """Samples in the source (all ranks)."""
        return self._handle().num_samples

    @property
    def classes(self) -> list[str]:
        """Class folder names, sorted; a label is an index into this list."""
        return list(self._handle().class_names)

    @property
    def epoch(self) -> int:
        """The epoch being read, else the one the next ``iter()`` runs (the next one once
        an epoch's ``StopIteration`` came, or the one ``set_epoch`` chose). A loop that
        stopped at an epoch's last batch before its ``StopIteration`` (``zip``, ``islice``)
        leaves it at that epoch, and the next ``iter()`` moves on to the one after."""
        return self._position.epoch

    @property
    def rank(self) -> int:
        """This loader's rank."""
        return self._settings.rank

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._settings.world_size

    @property
    def num_threads(self) -> int:
        """Decode threads in use."""
        return self._handle().num_threads

    @property
    def prefetch(self) -> int:
        """Batches prepared ahead of the training loop (with ``"auto"``, the ceiling)."""
        return self._handle().prefetch

    @property
    def pipeline(self) -> list[Op]:
        """The checked pipeline of a native source (an image pipeline led by its
        ``DecodeImage``); empty for ``Loader.from_dataset``, whose ``pipeline=`` runs on the
        bytes in each sample as the dataset's samples are loaded."""
        return list(self._ops)

    # -- iteration --------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches of the current epoch for this rank (fewer in an epoch resumed on another
        world size, see :meth:`load_state_dict`)."""
        return self._handle().steps_in(self._position.epoch)

    def __iter__(self) -> BatchIterator:
        """Goes on with the current epoch at its next batch (the resume step after
        :meth:`load_state_dict`, the first after :meth:`set_epoch` or a finished epoch).

        Only the newest iterator is live: another, :meth:`set_epoch` or :meth:`load_state_dict`
        ends it. ValueError when a refused load let go of the resumed epoch to run.
        """
        native = self._handle()
        self._ranks.check(self.state_dict, self.__len__, self._settings.timeout_s)
        position = self._position
        with position.held("iter()"):  # not while another thread's next() takes a batch
            epoch, step = position.to_start(native.steps_in)
            self._feed.drop_staged()
            native.start_epoch(epoch, step)
            position.start()
        return BatchIterator(self._feed, position, epoch, self.__len__)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next ``iter()`` runs, like ``DistributedSampler.set_epoch``.

        Not needed for shuffling (each completed epoch advances it), but makes the epoch
        explicit. It keeps a resume position from :meth:`load_state_dict` for the same epoch,
        so ``load_state_dict(s)`` then ``set_epoch(s["epoch"])`` still resumes mid-epoch.
        """
        self._handle()
        with self._position.held("set_epoch()"):
            self._position.set_epoch(check_int(epoch, "epoch", 0, MAX_U64))

    # -- stats and lifetime -----------------------------------------------------------------

    @property
    def dashboard_url(self) -> str | None:
        """URL of the stall dashboard (``/`` the page, ``/api/jobs``, ``/metrics``), or None
        when the loader was built without ``dashboard=``."""
        return self._handle().dashboard_url

    def close(self) -> None:
        """Stops the loader: no batch is built after it (a batch being built when it is called
        finishes on its thread, holding its slot until then; from a dataset, its worker
        processes and threads end). Idempotent; batches already yielded stay valid. Buffers no
        batch holds are let go then (memory, page locks, pinned budget), a held one with its
        last view."""
        if self._closed:
            return
        try:
            if self._side is not None and not self._fork.forked:
                if self._native is not None:
                    self._native.interrupt()  # a next() waiting in another thread ends now
                self._side.close()  # a lane waiting on a worker then returns at once
        finally:  # also when interrupted (Ctrl-C in the workers' grace period)
            self._close_native()

    def _close_native(self) -> None:
        if getattr(self, "_position", None) is not None:
            self._decode_split()  # kept: state_dict() after close() saves it
        self._closed = True
        feed: BatchFeed | None = getattr(self, "_feed", None)  # None: __init__ failed early
        if feed is not None:
            feed.drop_staged()  # its slot, and its device memory, go back
        self._fork.release()
        if self._native is not None and not self._fork.forked:
            self._native.close()
            _native.forward_logs()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __del__(self) -> None:
        # A dataset's loader closes here, letting go of the interpreter while the threads that
        # call its code finish; a drop of the native loader by the collector would wait for
        # them holding it.
        if self._side is not None and not getattr(self, "_closed", True) and not self._fork.forked:
            self.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._native is None:
            return "Loader(<not initialised>)"
        position = self._position
        state = "closed" if self._closed else f"epoch={position.epoch}, step={position.step}"
        settings = self._settings
        return (
            f"{'Loader' if self._side is None else 'Loader.from_dataset'}({self._source!r}, "
            f"batch_size={settings.batch_size}, rank={settings.rank}, "
            f"world_size={settings.world_size}, output={self._output!r}, {state})"
        )

    # -- internals --------------------------------------------------------------------------

    def _handle(self) -> _native.NativeLoader:
        """The native loader, or a StokerError saying why it cannot be used."""
        self._fork.refuse()
        if self._closed or self._native is None:
            raise StokerError("this Loader is closed; make a new one")
        return self._native

    def _loading_now(self) -> str:
        """What the source's lanes are loading now, added to a timeout's message: nothing for
        Stoker's own (the native message says what it waits on); a dataset's names each batch
        being loaded and where its Python code is."""
        return "" if self._side is None else self._side.loading_now()
