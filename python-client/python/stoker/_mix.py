"""``stoker.mix``: one loader over several native sources, mixed by weight.

The mix is planned in Rust like a single source's order (see :func:`mix` for the rule), so a
mixed batch is a pure function of (sources, weights, window, epoch rule, seed, epoch, rank,
world_size, step): the same for any thread count, in-process or through a coordinator, and
:meth:`Loader.load_state_dict` resumes it exactly, also on another world size.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from stoker import _native
from stoker._loader import Loader
from stoker._mix_request import MixRequest, Source
from stoker._samples import loading_epoch
from stoker.ops import Op

__all__ = ["Source", "megatron_blend", "mix"]

_log = logging.getLogger("stoker")

DEFAULT_WINDOW: Final = 100
# The widest window the native side lays out (MAX_MIX_WINDOW).
MAX_WINDOW: Final = 1 << 20
_EPOCH_RULES: Final = ("first_exhausted", "all_exhausted")
# How far past a bad sample's position its source's next samples are looked for.
_SUBSTITUTE_SCAN: Final = 1 << 16


def _is_dataset(value: object) -> bool:
    """A map-style dataset (``__getitem__`` and ``__len__``), not a path or a Source."""
    return (
        not isinstance(value, (str, bytes, os.PathLike, Source))
        and hasattr(value, "__getitem__")
        and hasattr(value, "__len__")
    )


class MixedDataset:
    """Map-style datasets mixed by the native rule: position ``p`` of epoch ``e`` is sample
    ``i`` of dataset ``k`` as the mix order says, returned with ``k`` as its ``source``: a dict
    sample gains a ``"source"`` key, a tuple or list one more item, any other value becomes
    ``(value, source)``. What :func:`mix` hands to :meth:`stoker.Loader.from_dataset`, whose
    planner strides the positions unshuffled (the mix order is shuffled already).
    """

    def __init__(
        self,
        datasets: list[Any],
        weights: list[float],
        window: int,
        epoch_end: str,
        epoch_samples: int,
        seed: int,
        shuffle: bool,
    ) -> None:
        self.datasets = datasets
        self.lens = [len(dataset) for dataset in datasets]
        self.args = (weights, self.lens, window, epoch_end, epoch_samples, seed, shuffle)
        self._order: _native.MixOrder | None = _native.MixOrder(*self.args)
        self.len = int(self._order.epoch_len)
        if (rounding := self._order.rounding) is not None:
            _log.warning("%s", rounding)  # as a native mix's loader says it

    def __len__(self) -> int:
        return self.len

    def saved_with_states(self) -> dict[str, Any]:
        """What its loader's states save, and a resume must match (``"mix"``): each dataset's
        length and weight, the window, the epoch rule and whether the order is shuffled."""
        weights, lens, window, epoch_end, epoch_samples, _, shuffle = self.args
        return {
            "mix": {
                "sources": [
                    [f"dataset of {n} samples", w] for n, w in zip(lens, weights, strict=True)
                ],
                "window": window,
                "epoch_end": epoch_end,
                "epoch_samples": epoch_samples,
                "shuffle": shuffle,
            }
        }

    def __getstate__(self) -> dict[str, Any]:
        # The native order does not pickle; a worker process makes its own on first use.
        return {**self.__dict__, "_order": None}

    def order(self) -> _native.MixOrder:
        """The native mix order, made once per process and kept (with the windows it laid
        out)."""
        if self._order is None:
            self._order = _native.MixOrder(*self.args)
        return self._order

    def _stoker_describe_position(self, epoch: int, position: int) -> str:
        """How a bad sample is named: ``dataset k[i] (mixed position p)``."""
        ((source, index),) = self.order().samples(epoch, [position])
        return f"dataset {source}[{index}] (mixed position {position})"

    def _stoker_substitutes(self, epoch: int, position: int, count: int) -> list[int]:
        """Up to ``count`` positions after ``position`` (wrapping, within the next
        ``_SUBSTITUTE_SCAN`` positions) whose samples come from its source: what replaces a bad
        sample, so its batch keeps each source's count (a native mix replaces a bad sample by
        another of its source too)."""
        order = self.order()
        ((source, _),) = order.samples(epoch, [position])
        found: list[int] = []
        step, end = 256, min(self.len, _SUBSTITUTE_SCAN)
        for start in range(1, end, step):
            positions = [(position + offset) % self.len
                         for offset in range(start, min(start + step, end))]
            for at, (of, _) in zip(positions, order.samples(epoch, positions), strict=True):
                if of == source:
                    found.append(at)
                    if len(found) == count:
                        return found
        return found

    def __getitem__(self, position: int) -> Any:
        ((source, index),) = self.order().samples(loading_epoch(), [position])
        sample = self.datasets[source][index]
        if isinstance(sample, dict):
            if "source" in sample:
                raise TypeError(
                    f"a sample of mixed dataset {source} already has a 'source' key, which the "
                    "mix adds"
                )
            return {**sample, "source": source}
        if isinstance(sample, (tuple, list)):
            if isinstance(sample, list):
                return type(sample)([*sample, source])
            return (*sample, source)
        return (sample, source)


def _mix_datasets(
    sources: Mapping[Any, float],
    window: int,
    rule: str,
    samples: int,
    batch_size: int,
    pipeline: Iterable[Op] | None,
    loader_args: dict[str, Any],
) -> Any:
    """``stoker.mix`` over Python datasets: a :class:`MixedDataset` under
    :meth:`stoker.Loader.from_dataset`."""
    datasets, weights = [], []
    for dataset, weight in sources.items():
        if not _is_dataset(dataset):
            raise TypeError(
                "a mix takes native sources (paths, stoker.Source) or Python datasets, not "
                f"both; got {dataset!r} beside a dataset"
            )
        datasets.append(dataset)
        weights.append(float(weight))
    shuffle = loader_args.pop("shuffle", True)
    if not isinstance(shuffle, bool):
        raise ValueError(f"shuffle must be True or False, got {shuffle!r}")
    seed = loader_args.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in 0..2**64, got {seed!r}")
    mixed = MixedDataset(datasets, weights, window, rule, samples, seed, shuffle)
    # Its states name the mix they resume (MixedDataset.saved_with_states).
    return Loader.from_dataset(
        mixed, batch_size=batch_size, shuffle=False, pipeline=pipeline, **loader_args
    )


def mix(
    sources: Mapping[Any, float],
    *,
    batch_size: int,
    window: int = DEFAULT_WINDOW,
    epoch_end: Literal["first_exhausted", "all_exhausted"] | int = "first_exhausted",
    pipeline: Iterable[Op] | None = None,
    **loader_args: Any,
) -> Any:
    """A :class:`stoker.Loader` over several native sources mixed by weight.

    Example::

        loader = stoker.mix({"/data/web.bin": 0.7, "/data/code.bin": 0.3}, batch_size=32,
                            pipeline=[stoker.ops.TokenWindows(2048)])
        for batch in loader:
            tokens, source = batch["tokens"], batch["source"]

    The rule:

    - **Exact counts per window.** The epoch is an order of positions cut into windows of
      ``window`` positions. Source ``k`` gets ``floor(share_k * window)`` positions of every
      window (``share_k``: its weight over the sum of the weights), and the sources with the
      largest remainders one more each until the counts sum to ``window`` (ties: the earlier
      source in ``sources``' order); so ``{a: 0.7, b: 0.3}`` with ``window=100`` is exactly
      70 of ``a`` and 30 of ``b`` in every window. A source whose count would be 0 is refused;
      one whose count gives it a share more than a hundredth off its weight's (0.015 of a
      window of 100 is 0.01; three equal weights get 34, 33 and 33 of 100, every window) is
      warned about when the loader opens, for native sources and Python datasets alike: a
      larger ``window`` rounds less (300 splits three ways evenly). Windows start at the
      epoch's position 0; ranks stride the positions as they stride a single source (rank
      ``r`` of ``W`` takes positions ``r, r + W, ...``), so the counts hold for the run as a
      whole, not for each rank's share: without ``shuffle`` a rank's share may hold one
      source only (``{a: 1, b: 1}`` on two ranks: rank 0 reads ``a``, rank 1 ``b``).
    - **Order.** With ``shuffle`` each window's positions are permuted (seeded by seed, epoch
      and window) and each source is read in its own shuffled order; without, the sources are
      interleaved evenly and read in dataset order. A source that runs out starts a fresh pass
      (in a new order with ``shuffle``, in dataset order again without; with new
      augmentations).
    - **Epoch end** (``epoch_end``): ``"first_exhausted"`` (default) is the whole windows every
      source fills without repeating a sample, ``min(len_k // count_k)`` windows: what each
      source holds past them is not read that epoch (with ``shuffle`` another epoch's order
      draws other samples; without it every epoch reads the same first ones, so those past
      them are never read: use ``"all_exhausted"`` or shuffle); ``"all_exhausted"`` is
      the whole windows it takes every source to give each of its samples once, the others
      restarting, ``max(ceil(len_k / count_k))`` windows; an int is that many positions, the
      sources restarting as needed (its last window may be partial). Every epoch starts each
      source's first pass again: with an int smaller than the sources, each epoch reads a
      fresh draw of them with ``shuffle``, and the same first samples without (those past
      them never read). :attr:`Loader.num_samples` is an epoch's positions.

    Python datasets mix too: with map-style datasets as the keys (``__getitem__`` and
    ``__len__``, such as ``torch.utils.data.Dataset``; all keys datasets, not mixed with native
    sources), the mix runs under :meth:`Loader.from_dataset` (its arguments, such as
    ``num_workers``, go in ``loader_args``) with the same rule; each sample gains its source (a
    dict sample a ``"source"`` key, a tuple one more item: a named tuple becomes a plain one).

    Every batch carries ``"source"`` (int64 ``(B,)``): the index, in ``sources``' order, of
    each sample's source. Packed text (``[Tokenize, PackSequences]``) is tokenised per source
    and packed after mixing, so a row may hold documents of several sources; ``"source"`` is
    then per document, indexed like ``"document_ids"``, and the weights count documents, not
    tokens (a source of short documents gives fewer tokens than its weight). ``"label"`` is
    each source's own label: sources of other class names share one number space (a label
    means one class in one and another in the other), which the loader says when it opens;
    :attr:`Loader.classes` lists the class names when every source has the same, else none.
    A tensor of a source's own named ``"source"`` is refused (the mix adds that one).

    Args:
        sources: ``{source: weight}``, in the order that numbers them; a source is a path (or
            ``s3://`` URI, or a pattern) or a :class:`Source` with its own pipeline, split, or
            list of names read as one source. Weights are positive
            numbers, normalised to sum 1. Every source's batches must have the same tensors
            (names, dtypes, shapes, labels or not), else a ValueError names the two that differ
            (Python datasets' samples are not read up front: there the first sample whose
            layout is not mixed position 0's raises a DecodeError, or is a bad sample under
            ``on_error="skip"``).
        batch_size: samples per batch.
        window: positions per window, the span over which counts are exact; at most 2**20,
            and at most 2**22 positions laid out per batch (a batch's positions fall in about
            ``batch_size * world_size / window + 1`` windows): a larger one is refused when
            the loader opens the job.
        epoch_end: ``"first_exhausted"``, ``"all_exhausted"`` or a number of positions.
        pipeline: the ops of the sources that do not give their own.
        **loader_args: any other argument of :class:`stoker.Loader` (``shuffle``, ``seed``,
            ``num_threads``, ``rank``, ``world_size``, ``prefetch``, ``address``, ``format`` and
            ``text_column`` as the default of sources that give none, ...).

    Raises:
        ValueError: a weight, the window or the epoch rule is out of range, a source has no
            pipeline, or the sources' batches would differ.
        TypeError: ``sources`` is not a mapping, a key is neither a source nor a dataset, or
            native sources and Python datasets are mixed in one call.
    """
    if not isinstance(sources, Mapping):
        raise TypeError(
            f"sources must be a dict of {{source: weight}}, got {type(sources).__name__}"
        )
    if not sources:
        raise ValueError("sources is empty: a mix needs at least one source")
    for key, weight in sources.items():
        # Any real number (numpy's too: token counts from np.sum), as a finite float.
        value = math.nan
        if isinstance(weight, numbers.Real) and not isinstance(weight, bool):
            try:
                value = float(weight)
            except OverflowError:  # an int past a float's range
                value = math.inf
        if not 0 < value < math.inf:
            raise ValueError(
                f"the weight of {key!r} must be a positive finite number, got {weight!r}"
            )
    if (not isinstance(window, numbers.Integral) or isinstance(window, bool)
            or not 1 <= window <= MAX_WINDOW):
        raise ValueError(f"window must be an int in 1..={MAX_WINDOW}, got {window!r}")
    window = int(window)
    if isinstance(epoch_end, numbers.Integral) and not isinstance(epoch_end, bool):
        epoch_end = int(epoch_end)
    if isinstance(epoch_end, bool) or not (
        epoch_end in _EPOCH_RULES or (isinstance(epoch_end, int) and 1 <= epoch_end <= 2**62)
    ):
        raise ValueError(
            "epoch_end must be 'first_exhausted', 'all_exhausted' or a number of samples in "
            f"1..=2**62, got {epoch_end!r}"
        )
    rule, samples = (
        (epoch_end, 0) if isinstance(epoch_end, str) else ("samples", int(epoch_end))
    )
    if any(_is_dataset(key) for key in sources):
        return _mix_datasets(sources, window, rule, samples, batch_size, pipeline, loader_args)
    checked: list[tuple[Source, float]] = []
    for key, weight in sources.items():
        source = key if isinstance(key, Source) else None
        if source is None and isinstance(key, (str, os.PathLike)):
            source = Source(key)
        if source is None:
            raise TypeError(
                f"a mixed source must be a path, an s3:// URI, a stoker.Source or a map-style "
                f"dataset, got {key!r}"
            )
        if source.pipeline is None and pipeline is None:
            raise ValueError(
                f"source {source.name!r} has no pipeline: pass pipeline= to mix, "
                "or give the source its own with stoker.Source(path, pipeline=...)"
            )
        checked.append((source, float(weight)))
    request = MixRequest(tuple(checked), window, rule, samples)
    return Loader(
        request,
        pipeline=[] if pipeline is None else pipeline,
        batch_size=batch_size,
        **loader_args,
    )


def megatron_blend(blend: str | Sequence[str]) -> dict[str, float]:
    """The sources of a Megatron blend (``--data-path``), for :func:`mix`.

    ``"0.3 /data/web_text_document 0.7 /data/code_text_document"`` (or the same as a list of
    strings, as Megatron's ``--data-path`` takes it) gives ``{"/data/web_text_document.bin":
    0.3, "/data/code_text_document.bin": 0.7}``. Prefixes without weights weigh their token
    counts, as Megatron weighs an unweighted blend by its corpora's sizes (read from each
    local ``.idx`` header and ``.bin`` length; an ``s3://`` prefix needs a weight). A prefix
    may also be written with its ``.bin`` or ``.idx``.

    Raises:
        ValueError: the blend is empty, mixes weighted and unweighted prefixes, has a weight
            that is not a positive number, names a prefix twice, or names without weights a
            corpus whose size cannot be read here.
    """
    parts = blend.split() if isinstance(blend, str) else [str(part) for part in blend]
    if not parts:
        raise ValueError("a Megatron blend names at least one prefix")

    def weight(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    weighted = weight(parts[0]) is not None
    if weighted and len(parts) % 2:
        raise ValueError(f"a weighted Megatron blend alternates weight and prefix: {blend!r}")
    pairs = (
        [(weight(parts[k]), parts[k + 1]) for k in range(0, len(parts), 2)]
        if weighted
        else [(float(_corpus_tokens(part)), part) for part in parts]
    )
    sources: dict[str, float] = {}
    for value, prefix in pairs:
        if value is None or not value > 0 or value == float("inf"):
            raise ValueError(f"a blend's weights are positive numbers; got {blend!r}")
        if weight(prefix) is not None:
            raise ValueError(f"{prefix!r} stands where a prefix should in {blend!r}")
        for ending in (".bin", ".idx"):
            prefix = prefix.removesuffix(ending)
        if f"{prefix}.bin" in sources:
            raise ValueError(f"{prefix} appears twice in the blend {blend!r}")
        sources[f"{prefix}.bin"] = value
    return sources


# Bytes per token of each dtype code of a Megatron `.idx` header (Megatron's `DType`).
_MEGATRON_DTYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
_MEGATRON_INDEX_MAGIC = b"MMIDIDX\x00\x00"


def _corpus_tokens(prefix: str) -> int:
    """The tokens of the Megatron corpus ``prefix`` (its ``.bin``'s length over the token size
    its ``.idx`` header names), an unweighted blend's weight."""
    for ending in (".bin", ".idx"):
        prefix = prefix.removesuffix(ending)
    if "://" in prefix:
        raise ValueError(
            f"{prefix}: an unweighted blend weighs each corpus by its size, which is read from "
            "local files only; give the blend's weights"
        )
    index = f"{prefix}.idx"
    try:
        with open(index, "rb") as file:
            header = file.read(len(_MEGATRON_INDEX_MAGIC) + 9)
        size = os.path.getsize(f"{prefix}.bin")
    except OSError as error:
        raise ValueError(
            f"an unweighted blend weighs each corpus by its size, and {prefix} cannot be read "
            f"({error}); give the blend's weights"
        ) from error
    token_size = _MEGATRON_DTYPE_SIZES.get(header[-1]) if len(header) == 18 else None
    if not header.startswith(_MEGATRON_INDEX_MAGIC) or token_size is None:
        raise ValueError(f"{index} is not a Megatron index (its header is not one)")
    if size < token_size:
        raise ValueError(f"{prefix}.bin holds no token, so weighs nothing in the blend")
    return size // token_size
