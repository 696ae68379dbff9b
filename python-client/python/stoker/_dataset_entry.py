"""``Loader.from_dataset``, the way in for a Python map-style dataset: :class:`FromDataset`
gives :class:`stoker.Loader` that constructor, and :func:`register_dataset_builder` is how
:mod:`stoker._dataset` (which subclasses ``Loader``, so ``loader.py`` cannot import it)
supplies what it calls.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, Literal, Self

from stoker.ops import Op

__all__ = ["FromDataset", "register_dataset_builder"]

# What Loader.from_dataset calls: stoker._dataset's builder, registered when that module loads
# (stoker's __init__ imports it).
_dataset_builder: Callable[..., Any] | None = None


def register_dataset_builder(builder: Callable[..., Any]) -> None:
    """Sets what :meth:`Loader.from_dataset` calls (done once, by :mod:`stoker._dataset`)."""
    global _dataset_builder
    _dataset_builder = builder


class FromDataset:
    """Gives :class:`stoker.Loader` its ``from_dataset`` constructor."""

    @classmethod
    def from_dataset(
        cls,
        dataset: Any,
        *,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        transform: Any = None,
        collate_fn: Any = None,
        num_threads: int | None = None,
        num_workers: int = 0,
        multiprocessing_context: Literal["forkserver", "spawn", "fork"] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int | Literal["auto"] = "auto",
        output: Literal["torch", "numpy"] | None = None,
        on_error: Literal["skip", "fail"] = "fail",
        timeout: float = 600.0,
        max_held_batches: int = 4,
        dashboard: int | str | None = None,
        dashboard_token_file: str | os.PathLike[str] | None = None,
        pipeline: Iterable[Op] | None = None,
        pin_memory: bool = False,
        pinned_memory_budget: int | None = None,
    ) -> Self:
        """A loader over a map-style dataset (``__getitem__`` and ``__len__``, such as a
        ``torch.utils.data.Dataset``), run under Stoker's planner.

        The order is the native loader's for a source of ``len(dataset)`` samples with the same
        ``seed``, ``shuffle``, ``rank`` and ``world_size``: each index once per epoch, the same
        whatever ``num_threads`` or ``num_workers``; ``set_epoch``, ``state_dict`` and
        ``load_state_dict`` (also on another world size), ``stats()`` and ``dashboard=`` work
        as on a native source. Defaults follow DataLoader (``batch_size=1``,
        ``shuffle=False``).

        Samples: ``dataset[0]`` is read once here to learn the layout; every sample must
        have its structure (a value, or tuples, lists and dicts of them) and, for each
        numpy array, torch tensor, PIL image or number in it, the same dtype and shape. A
        batch has that structure with each value stacked to ``(batch, *shape)`` (numbers
        become int64, float64 or bool arrays), like DataLoader's default collation; with
        ``collate_fn``, the batch is ``collate_fn(samples)`` over the batch's samples,
        called in the training loop's thread.

        Two ways to run the dataset's code:

        - ``num_workers=0`` (default): ``num_threads`` threads of this process (default: as
          :class:`Loader`) each load whole batches. Fast when the code releases the GIL
          (PIL decoding and resizing, numpy); pure-Python code runs one thread at a time.
        - ``num_workers=N``: N worker processes (``multiprocessing_context``: ``"fork"``,
          the default on Linux as for DataLoader (inherited; fastest to start and leanest;
          started before any of the loader's own threads, see the package README for the
          caveat of forking a process with threads), ``"forkserver"`` (the default elsewhere
          where available) or ``"spawn"`` (the dataset pickled once to each; a dataset class
          defined in a script read from stdin cannot be loaded there and is refused by
          name)). A worker loads a whole batch straight into its batch slot: the slots are
          one shared mapping (``memfd``, not ``/dev/shm``), so there are no pickled batches,
          no copy after the worker's, and memory stays bounded by the slots. A worker that
          cannot load the dataset (its module failing to import there, say) raises
          :class:`~stoker.DatasetError` with the end of its traceback.

        Determinism: :func:`stoker.sample_rng` (a numpy generator) and
        :func:`stoker.sample_seed` give the code a seed of (seed, epoch, index), the same for
        any thread or process count. Code drawing from the global RNGs (``random``,
        ``numpy.random``, ``torch``; torchvision's v2 transforms do) is deterministic only
        with worker processes, where each sample starts with those three seeded from
        :func:`stoker.sample_seed`; threads share the global RNGs, so draws there depend on
        timing: use ``sample_rng()`` or a ``torch.Generator`` seeded from ``sample_seed()``.

        Native ops after Python: with ``pipeline=[stoker.ops.DecodeImage(), ...]`` (or
        ``stoker.vision.imagenet_train(224)``), a ``bytes`` value in the sample (an encoded
        image the dataset read) is decoded and augmented by Stoker's pipeline into that field
        (its output shape and dtype), with the GIL released and the native per-sample random
        stream: the same bytes at the same (seed, epoch, index) give the same pixels as a
        native source. Without ``pipeline``, ``bytes`` in a sample is refused.

        Errors in the dataset's code follow ``on_error``: ``"fail"`` (default, as DataLoader)
        raises :class:`~stoker.DecodeError` naming the index, the exception and its traceback;
        ``"skip"`` replaces the sample by the next one that loads (as native sources do),
        logged and listed in the iterator's ``bad_samples``.

        ``pin_memory`` and ``pinned_memory_budget`` are :class:`Loader`'s: the slots (with
        worker processes, the shared mapping they write into) are page-locked once, so the
        batch's tensors report ``is_pinned()``.

        Raises:
            TypeError: ``dataset`` is not map-style, or a sample holds a value that cannot be
                batched (the message names where in the sample).
            ValueError: an argument is out of range.
            stoker.DatasetError: the dataset is empty, or ``dataset[0]`` raised.
        """
        if _dataset_builder is None:
            raise RuntimeError("stoker._dataset did not register its builder: import stoker")
        # The builder makes stoker._dataset's DatasetLoader, a Loader.
        loader: Self = _dataset_builder(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            transform=transform,
            collate_fn=collate_fn,
            num_threads=num_threads,
            num_workers=num_workers,
            multiprocessing_context=multiprocessing_context,
            rank=rank,
            world_size=world_size,
            prefetch=prefetch,
            output=output,
            on_error=on_error,
            timeout=timeout,
            max_held_batches=max_held_batches,
            dashboard=dashboard,
            dashboard_token_file=dashboard_token_file,
            pipeline=pipeline,
            pin_memory=pin_memory,
            pinned_memory_budget=pinned_memory_budget,
        )
        return loader
