"""Pipeline ops: the typed, declarative steps a Stoker pipeline is built from.

Each op mirrors its torchvision namesake (same argument names, same defaults) and checks its
arguments when it is constructed, so a bad pipeline fails with a ``ValueError`` on the line
that built it, before any thread starts or any file is read. Ops are data, not code: the Rust
workers execute them, and :meth:`Op.to_dict` gives the exact description they receive.

A pipeline is a list of ops in one of two orders (brackets mark optional ops)::

    DecodeImage, RandomResizedCrop, [RandomHorizontalFlip], [Normalize], [ToTensor]
    DecodeImage, [Resize], CenterCrop, [RandomHorizontalFlip], [Normalize], [ToTensor]

A list that does not start with :class:`DecodeImage` gets ``DecodeImage()`` put in front.

Token sources take one of two token pipelines instead::

    TokenWindows(seq_len)                          # token files (nanoGPT .bin)
    Tokenize(tokenizer_path), PackSequences(...)   # text (JSONL, Parquet text columns)

Parquet numeric columns come as tensors through a pipeline of one op::

    SelectColumns(names, dtype=None)               # one (B,) array per column

:func:`check_pipeline` enforces all of this; :class:`stoker.Loader` calls it for you.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, Final, TypeGuard

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

# The Rust side refuses larger sizes; checking here gives the same answer without a round trip.
MAX_SIDE: Final = 16_384
# The decoder's own default limit (a decompression-bomb guard), for the error message.
DEFAULT_MAX_PIXELS: Final = 89_478_485
# DecodeImage.max_pixels travels as an unsigned 64-bit integer.
MAX_U64: Final = 2**64 - 1

SUPPORTED_ORDERS: Final = (
    "[DecodeImage, RandomResizedCrop, (RandomHorizontalFlip), (Normalize), (ToTensor)] or "
    "[DecodeImage, (Resize), CenterCrop, (RandomHorizontalFlip), (Normalize), (ToTensor)]"
)
TOKEN_ORDERS: Final = "[TokenWindows] (token files) or [Tokenize, PackSequences] (text)"
# The Rust side's longest token row.
MAX_SEQ_LEN: Final = 1 << 24
MAX_ID: Final = 2**31 - 1


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, but True as a size is always a mistake.
    return isinstance(value, int) and not isinstance(value, bool)


def _side(value: object, what: str) -> int:
    if not _is_int(value) or not 1 <= value <= MAX_SIDE:
        raise ValueError(f"{what} must be an int in 1..={MAX_SIDE}, got {value!r}")
    return int(value)


def _size_pair(size: object, what: str) -> tuple[int, int]:
    """Reads a torchvision-style size: an int for a square, or ``(height, width)``."""
    if _is_int(size):
        side = _side(size, what)
        return side, side
    if isinstance(size, Sequence) and not isinstance(size, (str, bytes)):
        if len(size) == 1:
            side = _side(size[0], what)
            return side, side
        if len(size) == 2:
            return _side(size[0], f"{what} height"), _side(size[1], f"{what} width")
    raise ValueError(
        f"{what} must be an int or a (height, width) pair of ints in 1..={MAX_SIDE}, got {size!r}"
    )


def _float_pair(value: object, what: str) -> tuple[float, float]:
    if (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        low, high = float(value[0]), float(value[1])
        if math.isfinite(low) and math.isfinite(high):
            return low, high
    raise ValueError(f"{what} must be a (low, high) pair of finite numbers, got {value!r}")


def _rgb_triple(value: object, what: str) -> tuple[float, float, float]:
    if (
        isinstance(value, Iterable)
        and not isinstance(value, (str, bytes))
        and len(values := list(value)) == 3
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        and all(math.isfinite(float(v)) for v in values)
    ):
        return float(values[0]), float(values[1]), float(values[2])
    raise ValueError(f"{what} must be 3 finite numbers (one per RGB channel), got {value!r}")


class Op(ABC):
    """One step of a pipeline. Subclasses check their arguments in ``__init__``."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The op as the native loader receives it (a plain dict, key ``"op"`` names it)."""

    def __repr__(self) -> str:
        fields = {k: v for k, v in self.to_dict().items() if k != "op"}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Op)
            and type(other) is type(self)
            and other.to_dict() == self.to_dict()
        )

    def __hash__(self) -> int:
        return hash(repr(self))


class DecodeImage(Op):
    """Decodes JPEG, PNG and other common image files to RGB.

    Args:
        max_pixels: refuse images with more pixels than this (a decompression-bomb guard,
            like PIL's ``Image.MAX_IMAGE_PIXELS``). ``None`` keeps the default, 89,478,485.
            An image over the limit counts as a bad sample (see ``Loader(on_error=...)``).
        dct_scaling: let JPEGs decode at 1/2, 1/4 or 1/8 scale when the crop that follows
            is much smaller than the image. Much faster; the pixels differ slightly from a
            full-size decode followed by a resize, so it is off unless asked for.
    """

    def __init__(self, max_pixels: int | None = None, dct_scaling: bool = False) -> None:
        if max_pixels is not None and (not _is_int(max_pixels) or not 1 <= max_pixels <= MAX_U64):
            raise ValueError(
                f"DecodeImage max_pixels must be None (default {DEFAULT_MAX_PIXELS:,}) or an "
                f"int in 1..=2**64-1, got {max_pixels!r}"
            )
        if not isinstance(dct_scaling, bool):
            raise ValueError(f"DecodeImage dct_scaling must be a bool, got {dct_scaling!r}")
        self.max_pixels = max_pixels
        self.dct_scaling = dct_scaling

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": "decode_image",
            "max_pixels": 0 if self.max_pixels is None else self.max_pixels,
            "allow_dct_scaling": self.dct_scaling,
        }

    def __repr__(self) -> str:
        return f"DecodeImage(max_pixels={self.max_pixels!r}, dct_scaling={self.dct_scaling!r})"


class RandomResizedCrop(Op):
    """Crops a random window and resizes it to ``size`` (torchvision's RandomResizedCrop).

    Args:
        size: output size, an int for a square or ``(height, width)``; each side in 1..=16384.
        scale: range of the window's area as a fraction of the image's, ``0 <= low <= high``
            and ``0 < high <= 1``.
        ratio: range of the window's aspect ratio (width / height), ``0 < low <= high``.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    ) -> None:
        self.size = _size_pair(size, "RandomResizedCrop size")
        low, high = _float_pair(scale, "RandomResizedCrop scale")
        if not (0.0 <= low <= high and 0.0 < high <= 1.0):
            raise ValueError(
                f"RandomResizedCrop scale must satisfy 0 <= low <= high and 0 < high <= 1, "
                f"got {tuple(scale)!r}"
            )
        self.scale = (low, high)
        low, high = _float_pair(ratio, "RandomResizedCrop ratio")
        if not 0.0 < low <= high:
            raise ValueError(
                f"RandomResizedCrop ratio must satisfy 0 < low <= high, got {tuple(ratio)!r}"
            )
        self.ratio = (low, high)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": "random_resized_crop",
            "size": list(self.size),
            "scale": list(self.scale),
            "ratio": list(self.ratio),
        }


class Resize(Op):
    """Resizes so the shorter side is ``size``, keeping the aspect ratio.

    Like torchvision's ``Resize(int)``. Images of different aspect ratios then differ in size,
    so a :class:`CenterCrop` must follow before they can be batched.

    Args:
        size: the shorter side after resizing, an int in 1..=16384.
    """

    def __init__(self, size: int) -> None:
        if not _is_int(size):
            raise ValueError(
                f"Resize size must be an int (the shorter side, in 1..={MAX_SIDE}); "
                f"for a fixed (height, width) use Resize then CenterCrop, got {size!r}"
            )
        self.size = _side(size, "Resize size")

    def to_dict(self) -> dict[str, Any]:
        return {"op": "resize", "size": self.size}


class CenterCrop(Op):
    """Crops the centre ``size`` window (torchvision's CenterCrop).

    Args:
        size: output size, an int for a square or ``(height, width)``; each side in 1..=16384.
    """

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _size_pair(size, "CenterCrop size")

    def to_dict(self) -> dict[str, Any]:
        return {"op": "center_crop", "size": list(self.size)}


class RandomHorizontalFlip(Op):
    """Flips left-right with probability ``p`` (torchvision's RandomHorizontalFlip).

    Args:
        p: probability of a flip, in [0, 1].
    """

    def __init__(self, p: float = 0.5) -> None:
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"RandomHorizontalFlip p must be a number in [0, 1], got {p!r}")
        self.p = float(p)

    def to_dict(self) -> dict[str, Any]:
        return {"op": "random_horizontal_flip", "p": self.p}


class Normalize(Op):
    """Scales pixels to [0, 1], subtracts ``mean`` and divides by ``std``, per channel.

    The same as torchvision's ``ToTensor()`` followed by ``Normalize(mean, std)``. The output
    is float32 in NCHW layout unless a :class:`ToTensor` after it asks for NHWC.

    Args:
        mean: three numbers, one per RGB channel, on the [0, 1] scale.
        std: three finite, non-zero numbers, one per RGB channel.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = _rgb_triple(mean, "Normalize mean")
        self.std = _rgb_triple(std, "Normalize std")
        if any(s == 0.0 for s in self.std):
            raise ValueError(f"Normalize std must be non-zero, got {std!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"op": "normalize", "mean": list(self.mean), "std": list(self.std)}


class ToTensor(Op):
    """Chooses the batch layout and dtype of the image tensor.

    ``dtype="float32"`` scales pixels to [0, 1] as torchvision's ``ToTensor`` does;
    ``"uint8"`` keeps the raw 0..255 values. Images travel as uint8 NHWC by default, the
    cheapest form to move (4x less than float32); convert or normalise on the GPU.

    Args:
        layout: ``"NHWC"`` (batch, height, width, channel) or ``"NCHW"``.
        dtype: ``"uint8"`` or ``"float32"``.
    """

    def __init__(self, layout: str = "NHWC", dtype: str = "uint8") -> None:
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"ToTensor layout must be 'NHWC' or 'NCHW', got {layout!r}")
        if dtype not in ("uint8", "float32"):
            raise ValueError(f"ToTensor dtype must be 'uint8' or 'float32', got {dtype!r}")
        self.layout = layout
        self.dtype = dtype

    def to_dict(self) -> dict[str, Any]:
        return {"op": "to_tensor", "layout": self.layout, "dtype": self.dtype}


def _seq_len(value: object, what: str) -> int:
    if not _is_int(value) or not 1 <= value <= MAX_SEQ_LEN:
        raise ValueError(f"{what} seq_len must be an int in 1..={MAX_SEQ_LEN}, got {value!r}")
    return int(value)


class TokenWindows(Op):
    """Cuts a token file into windows of ``seq_len + 1`` tokens, one window per sample.

    Window ``i`` is tokens ``[i * seq_len, i * seq_len + seq_len + 1)``, so input
    ``tokens[:, :-1]`` and target ``tokens[:, 1:]`` come from one tensor, as in nanoGPT. The
    batch holds ``"tokens"``: ``(B, seq_len + 1)`` in the file's dtype (uint16 or uint32).
    """

    def __init__(self, seq_len: int) -> None:
        self.seq_len = _seq_len(seq_len, "TokenWindows")

    def to_dict(self) -> dict[str, Any]:
        return {"op": "token_windows", "seq_len": self.seq_len}


class Tokenize(Op):
    """Tokenises text samples with a Hugging Face ``tokenizer.json`` (read by the workers).

    Args:
        tokenizer_path: path of the ``tokenizer.json``; must be followed by
            :class:`PackSequences`.
    """

    def __init__(self, tokenizer_path: str | os.PathLike[str]) -> None:
        if not isinstance(tokenizer_path, (str, os.PathLike)) or not os.fspath(tokenizer_path):
            raise ValueError(
                f"Tokenize tokenizer_path must be the path of a tokenizer.json, "
                f"got {tokenizer_path!r}"
            )
        self.tokenizer_path = os.fsdecode(os.fspath(tokenizer_path))

    def to_dict(self) -> dict[str, Any]:
        return {"op": "tokenize", "tokenizer_path": self.tokenizer_path}


class PackSequences(Op):
    """Packs tokenised documents into rows of ``seq_len`` tokens, EOS after each document.

    A batch's documents (``batch_size`` of them) are laid end to end in order and cut into
    ``batch_size`` rows; tokens past the last row are dropped, a short last row is padded.
    The batch holds int32 ``(B, seq_len)`` tensors ``"input_ids"``, ``"position_ids"``
    (0 at each document start and each row start) and ``"document_ids"`` (the document's
    place in the batch, -1 on padding: attend where they are equal).

    Args:
        seq_len: tokens per row.
        eos_id: the id put after each document; -1 (default) takes the tokenizer's own EOS
            token (``<|endoftext|>``, ``</s>``, ``<eos>``...).
        pad_id: the id that fills a short last row (default 0).
    """

    def __init__(self, seq_len: int, eos_id: int = -1, pad_id: int = 0) -> None:
        self.seq_len = _seq_len(seq_len, "PackSequences")
        if not _is_int(eos_id) or not -1 <= eos_id <= MAX_ID:
            raise ValueError(
                f"PackSequences eos_id must be -1 or an id in 0..2**31, got {eos_id!r}"
            )
        if not _is_int(pad_id) or not 0 <= pad_id <= MAX_ID:
            raise ValueError(f"PackSequences pad_id must be an id in 0..2**31, got {pad_id!r}")
        self.eos_id = int(eos_id)
        self.pad_id = int(pad_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": "pack_sequences",
            "seq_len": self.seq_len,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
        }


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

    def __init__(self, names: Sequence[str], dtype: str | None = None) -> None:
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
            raise ValueError(f"SelectColumns names must be a list of column names, got {names!r}")
        if not names:
            raise ValueError("SelectColumns needs at least one column name")
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"SelectColumns names must be non-empty strings, got {name!r}")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"SelectColumns names a column more than once: {repeated}")
        if dtype not in (None, "float32", "int64"):
            raise ValueError(
                f"SelectColumns dtype must be 'float32', 'int64' or None, got {dtype!r}"
            )
        self.names = list(names)
        self.dtype = dtype

    def to_dict(self) -> dict[str, Any]:
        return {"op": "select_columns", "names": list(self.names), "dtype": self.dtype}


_TOKEN_OPS: Final = (TokenWindows, Tokenize, PackSequences)


def _check_token_pipeline(ops: list[Op]) -> list[Op]:
    kinds = [type(op) for op in ops]
    if kinds in ([TokenWindows], [Tokenize, PackSequences]):
        return ops
    names = ", ".join(type(op).__name__ for op in ops)
    raise ValueError(f"unsupported token pipeline [{names}]; supported: {TOKEN_ORDERS}")


def _order_error(message: str, ops: Sequence[Op]) -> ValueError:
    names = ", ".join(type(op).__name__ for op in ops)
    return ValueError(f"{message}; got [{names}]; supported orders: {SUPPORTED_ORDERS}")


def check_pipeline(pipeline: Iterable[Op]) -> list[Op]:
    """Checks a pipeline's ops and their order; returns it with ``DecodeImage()`` in front
    (image pipelines) or as it is (token pipelines, :data:`TOKEN_ORDERS`).

    Args:
        pipeline: the ops, in order.

    Returns:
        A new list: the ops, led by a ``DecodeImage``.

    Raises:
        ValueError: an element is not an op, or the order is not one of
            :data:`SUPPORTED_ORDERS` (the message names both).
    """
    if isinstance(pipeline, (str, bytes, Op)) or not isinstance(pipeline, Iterable):
        raise ValueError(
            f"pipeline must be a list of stoker.ops (see stoker.vision for ready-made ones), "
            f"got {pipeline!r}"
        )
    ops = list(pipeline)
    for position, op in enumerate(ops):
        if not isinstance(op, Op):
            raise ValueError(
                f"pipeline[{position}] must be a stoker.ops op (torchvision transforms and "
                f"Python callables cannot run in the Rust workers), got {op!r}"
            )
    if any(isinstance(op, SelectColumns) for op in ops):
        if len(ops) != 1:
            names = ", ".join(type(op).__name__ for op in ops)
            raise ValueError(f"SelectColumns is a pipeline of its own; got [{names}]")
        return ops
    if any(isinstance(op, _TOKEN_OPS) for op in ops):
        return _check_token_pipeline(ops)
    if not ops or not isinstance(ops[0], DecodeImage):
        ops.insert(0, DecodeImage())
    rest = ops[1:]
    if any(isinstance(op, DecodeImage) for op in rest):
        raise _order_error("DecodeImage may appear only first", ops)

    if rest and isinstance(rest[0], RandomResizedCrop):
        rest = rest[1:]
    elif len(rest) >= 2 and isinstance(rest[0], Resize) and isinstance(rest[1], CenterCrop):
        rest = rest[2:]
    elif rest and isinstance(rest[0], CenterCrop):
        rest = rest[1:]
    elif rest and isinstance(rest[0], Resize):
        raise _order_error(
            "Resize alone gives images of different sizes, which cannot be batched: "
            "add CenterCrop after it",
            ops,
        )
    else:
        raise _order_error(
            "after DecodeImage comes RandomResizedCrop, Resize + CenterCrop, or CenterCrop", ops
        )

    # What may follow the geometry, in order, each at most once.
    tail_order: list[type[Op]] = [RandomHorizontalFlip, Normalize, ToTensor]
    for op in rest:
        while tail_order and type(op) is not tail_order[0]:
            tail_order.pop(0)
        if not tail_order:
            raise _order_error(f"{type(op).__name__} is out of place or repeated", ops)
        tail_order.pop(0)

    normalize = any(isinstance(op, Normalize) for op in ops)
    for op in ops:
        if normalize and isinstance(op, ToTensor) and op.dtype == "uint8":
            raise ValueError(
                "Normalize gives float32 values; ToTensor(dtype='uint8') after it contradicts "
                "that: drop the ToTensor dtype or use dtype='float32'"
            )
    return ops
