"""What a :class:`stoker.Loader` reads, resolved from its arguments before anything starts:
one source (a folder, files, URIs, a pattern; or a coordinator's job by the same names) or a
mix of sources, its pipeline split into the part Stoker runs natively and the device stage's
tail, and the :class:`~stoker._settings.SourceSettings` the native loader opens it with."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stoker._arguments import remote_source_path, source_names, source_path
from stoker._mix_request import MixRequest
from stoker._settings import SourceSettings
from stoker.ops import Op, check_pipeline

if TYPE_CHECKING:
    from stoker._mix_request import NativeMix
    from stoker._placement import Placement
    from stoker.gpu import DeviceTail


@dataclass(frozen=True)
class ChosenSource:
    """A loader's source as resolved: ``ops`` is its pipeline as given (checked),
    ``native_ops`` what runs natively and ``tail`` what the device stage runs after the copy;
    ``label`` how the loader names it, ``job_name`` the name its job gets."""

    ops: list[Op]
    native_ops: list[Op]
    tail: DeviceTail | None
    # Every name of one source (empty for a mix).
    names: list[str]
    label: str
    job_name: str
    mix: MixRequest | None
    native_mix: NativeMix | None
    format: str
    text_column: str
    split: str
    label_column: str = ""
    image_column: str = ""

    def reading(self, by_content: bool = True) -> str:
        """What decides the bytes of a batch besides the plan, as a short digest a saved state
        carries: the pipeline, format, text and label columns and split (a mix's, each
        source's; not where the files lie, which the dataset's fingerprint covers)."""
        what: dict[str, Any] = {
            "ops": _as_read([op.to_dict() for op in self.ops]), "format": self.format,
            "text_column": self.text_column, "label_column": self.label_column,
            "split": self.split,
        }
        # Only when named, so states saved before it existed keep their digest.
        if self.image_column:
            what["image_column"] = self.image_column
        named = _by_content if by_content else _as_given
        if self.native_mix is not None:
            what["sources"] = [
                [[named(op) for op in _as_read(ops)], source_format, text_column, split]
                for _, ops, _, source_format, text_column, _, split in self.native_mix.entries
            ]
        return reading_digest(what, by_content)

    def readings(self) -> tuple[str, str | None]:
        """:meth:`reading`, and the digest states saved before tokenizers were named by
        content carry (by their path) where it differs: such a state still resumes."""
        reading, by_path = self.reading(), self.reading(by_content=False)
        return reading, by_path if by_path != reading else None

    def settings(self, **rest: Any) -> SourceSettings:
        """The native loader's settings of this source; ``rest`` are the fields the source
        does not decide (threads, bad-sample policy, coordinator, decode lane)."""
        return SourceSettings(
            source=self.names[0] if self.names else self.label,
            ops=[op.to_dict() for op in self.native_ops],
            format=self.format,
            text_column=self.text_column,
            label_column=self.label_column,
            image_column=self.image_column,
            mix=None if self.native_mix is None else self.native_mix.arguments(),
            uris=self.names,
            split=self.split,
            **rest,
        )


def choose_source(
    source: object,
    pipeline: Iterable[Op],
    placement: Placement,
    *,
    remote: bool,
    format: str,
    text_column: str,
    split: str,
    label_column: str = "",
    image_column: str = "",
) -> ChosenSource:
    """Resolves ``source`` (names, or a :class:`MixRequest`) and ``pipeline`` for a loader
    placed by ``placement``, read through a coordinator when ``remote``; arguments already
    checked one by one. Raises ValueError for a combination a loader cannot run."""
    locate = remote_source_path if remote else source_path
    if not isinstance(source, MixRequest):
        ops = check_pipeline(pipeline)
        native_ops, tail = placement.split(ops)
        names = source_names(source, locate)
        return ChosenSource(
            ops, native_ops, tail, names,
            label=names[0] if len(names) == 1 else ",".join(names),
            job_name=os.path.basename(os.path.normpath(names[0])) or "python",
            mix=None, native_mix=None, format=format, text_column=text_column, split=split,
            label_column=label_column, image_column=image_column,
        )
    if split:
        raise ValueError("split= is for one source; a mix's sources name their own files")
    if label_column:
        raise ValueError("label_column= is for one source, not a mix")
    if image_column:
        raise ValueError("image_column= is for one source, not a mix")
    placement.refuse_mix()
    pipeline = list(pipeline)
    ops = check_pipeline(pipeline) if pipeline else []
    native_mix = source.native(ops, format, text_column, locate)
    return ChosenSource(
        ops, ops, None, [], native_mix.source, native_mix.job_name, source, native_mix,
        format=format, text_column=text_column, split="",
    )


def reading_digest(what: dict[str, Any], by_content: bool = True) -> str:
    """The digest a state's ``reading`` holds of ``what`` (its ``ops``, op dicts, named by
    content: a tokenizer by its file's bytes, not its path; by its path with
    ``by_content=False``, as states saved before that carry it)."""
    if "ops" in what and by_content:
        what = {**what, "ops": [_by_content(op) for op in what["ops"]]}
    text = json.dumps(what, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _as_read(ops: list[Any]) -> list[Any]:
    """Op dicts with a ToTensor's unset dtype as the one it gives (uint8; float32 after a
    Normalize): a state saved when ``ToTensor()`` spelled out uint8 keeps its digest."""
    normalized, read = False, []
    for op in ops:
        kind = op.get("op") if isinstance(op, dict) else None
        normalized = normalized or kind == "normalize"
        if kind == "to_tensor" and op.get("dtype") is None:
            op = {**op, "dtype": "float32" if normalized else "uint8"}
        read.append(op)
    return read


def _as_given(op: Any) -> Any:
    return op


def _by_content(op: Any) -> Any:
    """An op's dict with a tokenizer named by the SHA-256 of its file (another tokenizer at the
    same path gives other ids; the same one by another path, the same); by its path when it
    cannot be read here (the native loader refuses it then, naming why)."""
    if not isinstance(op, dict) or not isinstance(op.get("tokenizer_path"), str):
        return op
    try:
        with open(op["tokenizer_path"], "rb") as file:
            digest = hashlib.file_digest(file, "sha256").hexdigest()
    except OSError:
        return op
    named = {key: value for key, value in op.items() if key != "tokenizer_path"}
    return {**named, "tokenizer_sha256": digest}
