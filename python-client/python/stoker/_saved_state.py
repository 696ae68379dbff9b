"""What a :class:`stoker.Loader` saves and resumes: :meth:`SavedState.state_dict` (the
position of the next batch, and the settings a resume must match) and
:meth:`SavedState.load_state_dict`, the loader's side of :mod:`stoker._resume`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stoker import _resume

if TYPE_CHECKING:
    from stoker._dataset import DatasetSide
    from stoker._fork import ForkGuard
    from stoker._mix_request import MixRequest
    from stoker._native import NativeLoader
    from stoker._settings import LoaderSettings

__all__ = ["SavedState"]


class SavedState:
    """The saving and resuming half of :class:`stoker.Loader`, over the loader's state below."""

    # The settings the native loader was made with.
    _settings: LoaderSettings
    # The Python dataset's part of a loader from Loader.from_dataset; None over Stoker's own.
    _side: DatasetSide | None = None
    # The mix this loader reads (stoker.mix), if any.
    _mix: MixRequest | None = None
    # Where images are decoded ("cpu", "gpu" or "auto"); from_dataset loaders decode none.
    _decode: str = "cpu"
    # The position of the next batch to yield.
    _position: _resume.Position
    # Read once when the loader is made: saved also after close() and in a forked child.
    _num_samples: int
    _dataset_fingerprint: str | None
    _shuffle_window: int
    # What decides a batch's bytes besides the plan (pipeline, columns, format, split): a
    # digest for Stoker's own sources, and for from_dataset's native ops when it has some;
    # None otherwise (the Python code decides). And the digest states saved before tokenizers
    # were named by their contents carry, where it differs.
    _reading: str | None = None
    _reading_by_path: str | None = None
    _native: NativeLoader | None
    _fork: ForkGuard
    _closed: bool

    def _handle(self) -> NativeLoader:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The position of the next batch, and the settings a resume must match.

        ``load_state_dict`` on a loader made with the same arguments then yields, as its next
        batch, exactly the batch this one would have yielded next. Works after :meth:`close`.
        """
        settings = self._settings
        state: dict[str, Any] = {
            "version": _resume.STATE_VERSION,
            **self._position.saved(),
            "seed": settings.seed, "batch_size": settings.batch_size,
            "num_samples": self._num_samples, "rank": settings.rank,
            "world_size": settings.world_size, "shuffle": settings.shuffle,
            "drop_last": settings.drop_last, "shuffle_window": self._shuffle_window,
        }
        # Which kind of loader saved it: its positions mean nothing to the other kind.
        state["source"] = "python dataset" if self._side is not None else "stoker source"
        if self._reading is not None:
            state["reading"] = self._reading
        if self._mix is not None:
            state["mix"] = self._mix.fingerprint()
        if self._side is not None:
            state.update(self._side.saved)
        if self._dataset_fingerprint is not None:
            state["dataset"] = self._dataset_fingerprint
        if (split := self._decode_split()) is not None:
            state["decode_split"] = split
        return state

    def _decode_split(self) -> list[int] | None:
        """[epoch, sixteenths] of the next batch's GPU decode split; None without a lane."""
        if self._decode == "cpu" or self._native is None or self._fork.forked:
            return None
        return self._position.read_split(None if self._closed else self._native)

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resumes at the position saved by :meth:`state_dict`: the next ``iter()`` starts there.

        ``state`` is one rank's dict, or the dicts of every rank of the run that saved them.
        One dict is enough when every rank saved at the same step, as synchronous data-parallel
        training does; any rank's dict then resumes any rank (with ``decode="auto"`` a rank's own
        gives its own GPU split). With all the dicts, ranks that had gone further than the
        slowest one are accounted for too. Every rank must load the same dict or the same list
        (not each its own, saved at other steps): ranks resumed at different steps run
        different step counts, and the job's collectives fall out of step.

        The world size may differ from the saved one: the rest of the saved epoch (the samples
        no rank had read) is then spread over this run's ranks, each sample once, in equal step
        counts by the loader's tail rules (padding may repeat up to ``world_size - 1`` of them;
        ``drop_last`` may drop a last partial batch per rank); that epoch has fewer steps
        (``len(loader)``; none when nothing of it is left, and the next epoch starts), and the
        next epoch is the plain one of the new world size.

        A loader over Stoker's own formats saves its datasets' fingerprint (in-process, or as a
        coordinator's workers report it; not under ``from_dataset``): ``state["dataset"]``, the
        sample count, class names, and the names and labels of 4,096 samples spread over each
        dataset, named below the folder they all share. So a state saved over another dataset
        of the same size is refused; the dataset may move to another folder, machine or
        bucket. It also carries what decides the batches' bytes besides the plan (a digest of
        the pipeline, a tokenizer by its file's contents, format, columns and split; under
        ``from_dataset``, of ``pipeline`` when one is given: ``state["reading"]``) and whether
        a Python dataset's loader saved it (``state["source"]``): a state of another pipeline
        or kind of loader is refused unless the key is deleted. A mix's sources are compared
        by their names below the folder they all share. A file
        changed in place under the same name is not seen. Delete the key to resume over a
        dataset changed on purpose.

        Raises:
            ValueError: ``state`` is not a Stoker state, was saved by a loader with other
                settings or over another dataset (the message names the mismatch), or the dicts
                disagree or leave ranks out.
        """
        native = self._handle()
        ours = self.state_dict()
        given = [state] if isinstance(state, Mapping) else state
        if self._reading_by_path is not None and isinstance(given, Sequence) and any(
            isinstance(one, Mapping) and one.get("reading") == self._reading_by_path
            for one in given
        ):
            ours["reading"] = self._reading_by_path  # saved when tokenizers were named by path
        saved = _resume.read_states(state, ours)
        with self._position.held("load_state_dict()"):
            self._position.resume_saved(saved, native, self._settings.world_size)
