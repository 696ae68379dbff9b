"""Pipeline ops: the typed, declarative steps a Stoker pipeline is built from.

Each op takes its torchvision namesake's argument names and defaults, with two differences
its docstring states: :class:`ToTensor` keeps uint8 NHWC unless asked for float32 (the cheapest
form to move), and :class:`Normalize` scales pixels to [0, 1] first (as torchvision's
``ToTensor`` then ``Normalize`` do), so its statistics are on that scale. Each op is checked
when it is constructed, so a bad op fails with a :class:`stoker.PipelineError` (a
``ValueError``) on the line that built it, before any thread starts or any file is read. Ops
are data, not code: the Rust workers execute them, and :meth:`Op.to_dict` gives the exact
description they receive.

The language itself is the ``Op`` message of the proto (``proto/stoker/v1/job.proto``):
:func:`stoker._native.op_schema` lists its ops and their fields, ``to_dict`` gives those fields
by their proto names, and the checks of arguments and order are the workers' own, run by the
native module. The classes here add the Python surface (torchvision's argument names, an int
or a pair for a size) and nothing the workers would check again; ``tests/test_ops.py`` fails
when they, or the stubs, miss an op or a field of the proto.

A pipeline is a list of ops in one of two orders (brackets mark optional ops)::

    DecodeImage, RandomResizedCrop, [RandomHorizontalFlip], [Normalize], [ToTensor]
    DecodeImage, [Resize], CenterCrop, [RandomHorizontalFlip], [Normalize], [ToTensor]

A list that does not start with :class:`DecodeImage` gets ``DecodeImage()`` put in front.

Token sources take one of two token pipelines instead (:data:`TOKEN_ORDERS`)::

    TokenWindows(seq_len)                          # token files (nanoGPT .bin)
    Tokenize(tokenizer_path), PackSequences(...)   # text (JSONL, Parquet text columns)

Parquet numeric columns come as tensors through a pipeline of one op::

    SelectColumns(names, dtype=None)               # one (B,) array per column

:func:`check_pipeline` checks a list against these orders (in Rust); :class:`stoker.Loader`
calls it for you.
"""

from __future__ import annotations

import inspect
import numbers
import os
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Final, TypeGuard

from stoker import _native
from stoker.errors import PipelineError

__all__ = [
    "SUPPORTED_ORDERS",
    "CenterCrop",
    "DecodeImage",
    "Normalize",
    "Op",
    "PackSequences",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "SelectColumns",
    "ToTensor",
    "TokenWindows",
    "Tokenize",
    "check_pipeline",
]

# The limits and orders the native checks use, for messages and recipes (stoker.vision).
MAX_SIDE: Final[int] = _native.MAX_SIDE
DEFAULT_MAX_PIXELS: Final[int] = _native.DEFAULT_MAX_PIXELS
MAX_SEQ_LEN: Final[int] = _native.MAX_SEQ_LEN
SUPPORTED_ORDERS: Final[str] = _native.IMAGE_ORDERS
TOKEN_ORDERS: Final[str] = _native.TOKEN_ORDERS


def _is_int(value: object) -> TypeGuard[numbers.Integral]:
    # bool is an int subclass, but True as a size is always a mistake. numpy's integers count.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _size_pair(size: object, what: str) -> tuple[Any, Any]:
    """Reads a torchvision-style size: an int for a square, or ``(height, width)``. The
    sides' range is the native check's."""
    if _is_int(size):
        return int(size), int(size)
    if isinstance(size, Sequence) and not isinstance(size, (str, bytes)):
        if len(size) == 1 and _is_int(size[0]):
            return int(size[0]), int(size[0])
        if len(size) == 2 and all(_is_int(side) for side in size):
            return int(size[0]), int(size[1])
    raise PipelineError(
        f"{what} must be an int or a (height, width) pair of ints in 1..={MAX_SIDE}, got {size!r}"
    )


def _pair(value: object, what: str) -> tuple[Any, Any]:
    """Reads a ``(low, high)`` range; which ranges are valid is the native check's."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        return value[0], value[1]
    raise PipelineError(f"{what} must be a (low, high) pair of numbers, got {value!r}")


def _as_list(value: object) -> object:
    """An iterable (not a string) as a list, anything else as it is, for the native check to
    refuse with the field's name."""
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return list(value)
    return value


def _as_float32(value: float) -> float:
    """``value`` as the float32 the native side reads (a value under float32's smallest is
    0 there); one past float32's range as it is (infinite there, of the same sign)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0]) if abs(value) < 3.4e38 else value


def _float(value: Any) -> Any:
    """A number (numpy's scalars, a 0-d array or tensor too) as a float; anything else as it
    is, for the native check to refuse by the field's name."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real) or (
        getattr(value, "ndim", None) == 0 and hasattr(value, "__float__")
    ):
        return float(value)
    return value


def _plain(value: object) -> Any:
    """numpy's integers and floats (and lists of them) as Python's, which the native side
    reads; anything else as it is."""
    if isinstance(value, (list, tuple)):
        return type(value)(map(_plain, value))
    if _is_int(value) and not isinstance(value, int):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):
        return float(value)
    return value


def _numbers(value: object) -> Any:
    """An iterable (not a string) as a tuple, numbers as floats; anything else as it is."""
    listed = _as_list(value)
    return tuple(map(_float, listed)) if isinstance(listed, list) else listed


class Op(ABC):
    """One step of a pipeline. Subclasses build their fields in ``__init__``, then call
    :meth:`_check`, which asks the native module whether the workers would take them."""

    #: The op's name in the proto's ``Op`` oneof, the ``"op"`` key of :meth:`to_dict`.
    proto_name: ClassVar[str]

    @abstractmethod
    def _fields(self) -> dict[str, Any]:
        """The op's fields, named as in its proto message."""

    #: The fields that may be ``None`` (the default); the wire reads ``None`` as 0 or the
    #: first enum value, so anywhere else it is refused (``eos_id=None`` was token id 0).
    _optional: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The op as the native loader receives it: ``"op"`` names the proto's op, the other
        keys are its message's fields (enum values by name, ``None`` for the default; numpy's
        numbers as Python's)."""
        return {"op": self.proto_name, **{k: _plain(v) for k, v in self._fields().items()}}

    def _check(self) -> None:
        for name, value in self._fields().items():
            listed = value if isinstance(value, (list, tuple)) else [value]
            if name not in self._optional and any(item is None for item in listed):
                raise PipelineError(f"{type(self).__name__} {name} must be given, got {value!r}")
        _native.check_op(self.to_dict())

    def __repr__(self) -> str:
        arguments = inspect.signature(type(self)).parameters
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in arguments)
        return f"{type(self).__name__}({shown})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Op)
            and type(other) is type(self)
            and other.to_dict() == self.to_dict()
        )

    def __hash__(self) -> int:
        # As __eq__ sees it: numpy's numbers as Python's.
        return hash(repr(self.to_dict()))


class DecodeImage(Op):
    """Decodes an image to RGB as PIL's ``Image.open(f).convert("RGB")`` does.

    JPEG (CMYK and YCCK too), PNG, WebP, BMP, TIFF (the first page, one plane of gray, RGB,
    RGBA or CMYK samples), PBM/PGM/PPM and GIF (the first frame), told apart by their bytes,
    not their names; alpha is dropped (a TIFF's premultiplied alpha divided out first, as PIL
    does), gray replicated. Anything else is a bad sample (see
    ``Loader(on_error=...)``), also where PIL reads it: a palette, YCbCr, planar or
    gray-with-alpha TIFF, a BigTIFF. Where PIL differs: 16-bit gray (PNG, TIFF, PGM) keeps
    its high byte, where PIL clips it at 255 (nearly white); a PNM of a maximum other than
    255, and an 8-bit CMYK TIFF, may round one level apart (a 16-bit CMYK TIFF is converted
    by the ``image`` crate too, and was not compared); a GIF without a colour table, or with
    blocks the ``gif`` crate refuses (an extension of an unknown label, a graphic control
    block of more than 4 bytes or of 3 without transparency, a stray byte between blocks), is
    a bad sample; a GIF's transparent index is the last graphic control block's before the
    first frame (PIL keeps an earlier one's where the last gives none), and of a block of
    several sub-blocks, the last sub-block's (PIL reads the first).

    Args:
        max_pixels: refuse images with more pixels than this (a decompression-bomb guard).
            ``None`` keeps the default, 89,478,485, PIL's ``Image.MAX_IMAGE_PIXELS``; PIL
            only warns up to twice that and refuses past it, Stoker refuses past it. An image
            over the limit counts as a bad sample (see ``Loader(on_error=...)``).
        dct_scaling: let JPEGs decode at 1/2, 1/4 or 1/8 scale when the crop that follows
            is much smaller than the image. Much faster; the pixels differ from a full-size
            decode followed by a resize (a slight blur: on generated images at 64x64, 2.6
            grey levels on average, 7.3 at most for an image), so it is off unless asked
            for (``vision.imagenet_train`` asks).
    """

    proto_name = "decode_image"

    def __init__(self, max_pixels: int | None = None, dct_scaling: bool = False) -> None:
        # On the wire 0 means "the default"; here that is None, so 0 is a mistake.
        if max_pixels == 0 and not isinstance(max_pixels, bool):
            raise PipelineError(
                f"DecodeImage max_pixels must be None (default {DEFAULT_MAX_PIXELS:,}) or a "
                f"positive int, got {max_pixels!r}"
            )
        self.max_pixels = max_pixels
        self.dct_scaling = dct_scaling
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {
            "max_pixels": 0 if self.max_pixels is None else self.max_pixels,
            "allow_dct_scaling": self.dct_scaling,
        }


class RandomResizedCrop(Op):
    """Crops a random window and resizes it to ``size`` (torchvision's RandomResizedCrop).

    Args:
        size: output size, an int for a square or ``(height, width)``; each side in 1..=16384.
        scale: range of the window's area as a fraction of the image's, ``0 <= low <= high``
            and ``0 < high <= 1``.
        ratio: range of the window's aspect ratio (width / height), ``0 < low <= high``.
    """

    proto_name = "random_resized_crop"

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    ) -> None:
        self.size = _size_pair(size, "RandomResizedCrop size")
        low, high = _pair(scale, "RandomResizedCrop scale")
        self.scale = (_float(low), _float(high))
        low, high = _pair(ratio, "RandomResizedCrop ratio")
        self.ratio = (_float(low), _float(high))
        # (0, 0) on the wire means "unset" (torchvision's default range): a user's own (0, 0)
        # would be read so, not as the range it is.
        # Bounds travel as float32: one that rounds to 0 there (1e-46) would read as unset too.
        for name, (_, top) in (("scale", self.scale), ("ratio", self.ratio)):
            if isinstance(top, (int, float)) and _as_float32(top) <= 0:
                raise PipelineError(
                    f"RandomResizedCrop {name} upper bound must be above 0 as a float32, got "
                    f"{top!r}"
                )
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {
            "height": self.size[0],
            "width": self.size[1],
            "scale_min": self.scale[0],
            "scale_max": self.scale[1],
            "ratio_min": self.ratio[0],
            "ratio_max": self.ratio[1],
        }


class Resize(Op):
    """Resizes so the shorter side is ``size``, keeping the aspect ratio.

    Like torchvision's ``Resize(int)``. Images of different aspect ratios then differ in size,
    so a :class:`CenterCrop` must follow before they can be batched.

    Args:
        size: the shorter side after resizing, an int in 1..=16384.
    """

    proto_name = "resize"

    def __init__(self, size: int) -> None:
        if not _is_int(size):
            raise PipelineError(
                f"Resize size must be an int (the shorter side, in 1..={MAX_SIDE}); "
                f"for a fixed (height, width) use Resize then CenterCrop, got {size!r}"
            )
        self.size = int(size)
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"shorter_side": self.size}


class CenterCrop(Op):
    """Crops the centre ``size`` window (torchvision's CenterCrop).

    Args:
        size: output size, an int for a square or ``(height, width)``; each side in 1..=16384.
    """

    proto_name = "center_crop"

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _size_pair(size, "CenterCrop size")
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"height": self.size[0], "width": self.size[1]}


class RandomHorizontalFlip(Op):
    """Flips left-right with probability ``p`` (torchvision's RandomHorizontalFlip).

    Args:
        p: probability of a flip, in [0, 1].
    """

    proto_name = "random_horizontal_flip"

    def __init__(self, p: float = 0.5) -> None:
        self.p = _float(p)
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"p": self.p}


class Normalize(Op):
    """Scales pixels to [0, 1], subtracts ``mean`` and divides by ``std``, per channel.

    The same as torchvision's ``ToTensor()`` followed by ``Normalize(mean, std)``. The output
    is float32, in NCHW layout, or in the one a :class:`ToTensor` after it names (NHWC by
    default).

    Args:
        mean: three finite numbers, one per RGB channel, on the [0, 1] scale (in [0, 1]).
        std: three finite, non-zero numbers, one per RGB channel, at most 1 in magnitude.
            Statistics on the 0..255 scale (``123.675``, ``58.395``) are refused: divide them
            by 255.
    """

    proto_name = "normalize"

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = _numbers(mean)
        self.std = _numbers(std)
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"mean": _as_list(self.mean), "std": _as_list(self.std)}


class ToTensor(Op):
    """Chooses the batch layout and dtype of the image tensor.

    ``dtype="float32"`` scales pixels to [0, 1] as torchvision's ``ToTensor`` does;
    ``"uint8"`` keeps the raw 0..255 values. Images travel as uint8 NHWC by default, the
    cheapest form to move (4x less than float32); convert or normalise on the GPU. A
    :class:`Normalize` without a ToTensor after it gives NCHW float32.

    Args:
        layout: ``"NHWC"`` (batch, height, width, channel) or ``"NCHW"``.
        dtype: ``"uint8"``, ``"float32"``, or ``None`` (default) for uint8, float32 after a
            Normalize (where uint8 is refused).
    """

    proto_name = "to_tensor"
    _optional = ("dtype",)

    def __init__(self, layout: str = "NHWC", dtype: str | None = None) -> None:
        for name, value, names in (("layout", layout, ("NHWC", "NCHW")),
                                   ("dtype", dtype, ("uint8", "float32"))):
            if value is not None and (not isinstance(value, str) or value.upper() not in
                                      (n.upper() for n in names)):
                raise PipelineError(
                    f"ToTensor {name} must be {names[0]!r} or {names[1]!r}, got {value!r}"
                )
        self.layout = layout
        self.dtype = dtype
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"layout": self.layout, "dtype": self.dtype}


class TokenWindows(Op):
    """Cuts a token file into windows of ``seq_len + 1`` tokens, one window per sample.

    Window ``i`` is tokens ``[i * seq_len, i * seq_len + seq_len + 1)``, so input
    ``tokens[:, :-1]`` and target ``tokens[:, 1:]`` come from one tensor, as in nanoGPT. The
    batch holds ``"tokens"``: ``(B, seq_len + 1)`` in the file's dtype (uint16 or uint32).

    With ``document_boundaries=True`` (a Megatron corpus, whose ``.idx`` gives its documents)
    the batch also holds ``"position_ids"`` and ``"document_ids"``, int32 ``(B, seq_len + 1)``:
    positions count from 0 at each row start and at each document start, document ids from 0
    at each row start and one more at each document start, so a token attends where the ids
    are equal (document-masked attention), as packed text's ids do.

    Args:
        seq_len: input tokens per window, in 1..=2**24.
        document_boundaries: also give each token's position in its document and its
            document; a token file without a document index is refused.
    """

    proto_name = "token_windows"

    def __init__(self, seq_len: int, document_boundaries: bool = False) -> None:
        self.seq_len = seq_len
        if not isinstance(document_boundaries, bool):
            raise ValueError(
                f"document_boundaries must be a bool, got {document_boundaries!r}"
            )
        self.document_boundaries = document_boundaries
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "document_boundaries": self.document_boundaries}


class Tokenize(Op):
    """Tokenises text samples with a Hugging Face ``tokenizer.json`` (read by the workers).

    The file's own truncation and padding settings are left unapplied, as ``transformers``
    leaves them unless asked: :class:`PackSequences` splits long documents across rows and
    pads only once the batch's documents end. Text is encoded as
    ``encode(text, add_special_tokens=False)`` encodes it: no BOS (Llama's
    ``<|begin_of_text|>``, ``<s>``) or ``[CLS]`` is added, while a special token's text inside
    a document (``<|endoftext|>``) is read as that token, as HF reads it;
    :class:`PackSequences` puts an EOS after each document. A
    file whose BPE model sets ``dropout`` is refused (it draws other tokens at each encoding).

    Args:
        tokenizer_path: path of the ``tokenizer.json``; must be followed by
            :class:`PackSequences`.
    """

    proto_name = "tokenize"

    def __init__(self, tokenizer_path: str | os.PathLike[str]) -> None:
        path: object = tokenizer_path
        if isinstance(path, (str, os.PathLike)):
            path = os.fsdecode(os.fspath(path))
        self.tokenizer_path = path
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"tokenizer_path": self.tokenizer_path}


class PackSequences(Op):
    """Packs tokenised documents into rows of ``seq_len`` tokens, EOS after each document.

    A batch's documents (``batch_size`` of them) are laid end to end in order and cut into
    ``batch_size`` rows; tokens past the last row are dropped (counted in the loader's
    ``stats()["tokens_dropped"]``: documents much longer than ``seq_len`` lose most of their
    tokens), and once the documents run out the rest of the rows is padding (documents much
    shorter than ``seq_len`` leave whole rows of it). Nothing carries over between batches
    (a batch is a function of its own documents), so this suits documents near ``seq_len``
    tokens long; to train on every token of a corpus, write its tokens to a token file and
    read it with :class:`TokenWindows`, which drops only the file's last, too short window.
    The batch holds int32 ``(B, seq_len)`` tensors ``"input_ids"``, ``"position_ids"``
    (0 at each document start and each row start) and ``"document_ids"`` (the document's
    place in the batch, -1 on padding: attend where they are equal).

    Args:
        seq_len: tokens per row.
        eos_id: the id put after each document; -1 (default) takes the tokenizer's own EOS
            token (``<|endoftext|>``, ``</s>``, ``<eos>``...).
        pad_id: the id that fills the rows the documents leave (default 0). It is a real
            token id (0 is ``!`` in GPT-2's and Llama 3's vocabularies), and no labels or loss
            mask come with the batch: mask the loss where ``document_ids == -1`` (for instance
            ``labels = input_ids.masked_fill(document_ids == -1, -100)``), or the model learns
            to predict padding.
    """

    proto_name = "pack_sequences"

    def __init__(self, seq_len: int, eos_id: int = -1, pad_id: int = 0) -> None:
        # The wire takes any negative id as "the tokenizer's"; this API names one, -1.
        if _is_int(eos_id) and eos_id < -1:
            raise PipelineError(
                f"PackSequences eos_id must be -1 (the tokenizer's EOS) or an id in 0..2**31, "
                f"got {eos_id!r}"
            )
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.pad_id = pad_id
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "eos_id": self.eos_id, "pad_id": self.pad_id}


class SelectColumns(Op):
    """Reads numeric columns of a Parquet dataset as tensors: a pipeline of its own.

    The batch holds one ``(B,)`` array per column, named like the column, and ``"label"``
    (int64, the dataset's label column, 0 when it has none) unless a selected column is itself
    named ``label``. A null cell is a bad sample, handled by ``on_error`` like an unreadable
    image.

    Args:
        names: the columns, at least one, each once.
        dtype: ``"float32"``, ``"int64"`` (integer columns only), or ``None`` (default) for
            each column's own type: int64 for integer columns, float32 for floating-point ones.
    """

    proto_name = "select_columns"
    _optional = ("dtype",)

    def __init__(self, names: Sequence[str], dtype: str | None = None) -> None:
        self.names = _as_list(names)
        self.dtype = dtype
        self._check()

    def _fields(self) -> dict[str, Any]:
        return {"names": _as_list(self.names), "dtype": self.dtype}


def check_pipeline(pipeline: Iterable[Op]) -> list[Op]:
    """Checks a pipeline's ops and their order, as the workers will; returns it with
    ``DecodeImage()`` in front (image pipelines) or as it is (token and column pipelines).

    Args:
        pipeline: the ops, in order.

    Returns:
        A new list: the ops, led by a ``DecodeImage`` when they are an image pipeline.

    Raises:
        PipelineError: an element is not an op, or the order is not one of
            :data:`SUPPORTED_ORDERS` or :data:`TOKEN_ORDERS` (the message names the problem,
            the ops given and the orders there are). It is a ``ValueError``.
    """
    if isinstance(pipeline, (str, bytes, Op)) or not isinstance(pipeline, Iterable):
        raise PipelineError(
            f"pipeline must be a list of stoker.ops (see stoker.vision for ready-made ones), "
            f"got {pipeline!r}"
        )
    ops = list(pipeline)
    for position, op in enumerate(ops):
        if not isinstance(op, Op):
            raise PipelineError(
                f"pipeline[{position}] must be a stoker.ops op (torchvision transforms and "
                f"Python callables cannot run in the Rust workers), got {op!r}"
            )
    if _native.check_pipeline([op.to_dict() for op in ops]):
        ops.insert(0, DecodeImage())
    return ops
