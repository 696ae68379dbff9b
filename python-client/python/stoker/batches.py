"""What a batch from the native loader becomes in Python: its tensors as numpy arrays or torch
tensors viewing the batch's slot (no copy), and the log of the samples it replaced.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

if TYPE_CHECKING:
    from stoker._native import BadSample

__all__ = ["BadSampleLog", "host_batch"]

_log = logging.getLogger("stoker")

# Per-sample logs are capped: a folder full of bad files should not drown the training log.
MAX_LOGGED_BAD_SAMPLES: Final = 20


def host_batch(
    tensors: Sequence[tuple[str, str, tuple[int, ...], Any]], torch: Any, pin_small: bool
) -> dict[str, Any]:
    """The batch's tensors (``(name, dtype, shape, Buffer)``) as numpy arrays, or torch tensors
    when ``torch`` is given, viewing the slot; with ``pin_small``, a tensor outside the slot is
    copied into torch's pinned memory."""
    batch: dict[str, Any] = {}
    for name, dtype, shape, data in tensors:
        count = math.prod(shape)
        # frombuffer keeps a reference to `data`, so the slot stays out of the pool as long
        # as this array, or any view of it, is alive.
        array = np.frombuffer(memoryview(data), dtype=np.dtype(dtype), count=count).reshape(shape)
        if torch is None:
            batch[name] = array
            continue
        tensor = torch.from_numpy(array)
        if pin_small and not data.pinned:
            # Labels and other small tensors live outside the slot: pinned as DataLoader
            # pins them, by a copy into torch's pinned memory.
            tensor = tensor.pin_memory()
        batch[name] = tensor
    return batch


class BadSampleLog:
    """Logs the samples replaced under ``on_error="skip"``: the first
    :data:`MAX_LOGGED_BAD_SAMPLES` of a loader each with its path, reason and substitute, then
    one line saying the rest are only counted."""

    def __init__(self) -> None:
        self._logged = 0

    def note(self, bad: Sequence[BadSample]) -> None:
        """Logs the replaced samples of one batch."""
        for sample in bad:
            self._logged += 1
            if self._logged <= MAX_LOGGED_BAD_SAMPLES:
                _log.warning(
                    "skipped bad sample %s (index %s): %s; replaced by sample %s",
                    sample.get("path"),
                    sample.get("sample_index"),
                    sample.get("reason"),
                    sample.get("substitute_index"),
                )
            if self._logged == MAX_LOGGED_BAD_SAMPLES:
                _log.warning(
                    "further bad samples are not logged; stats()['bad_samples'] counts them"
                )
