"""Every image format Stoker decodes, against Pillow's ``Image.open(f).convert("RGB")``.

Pillow writes each file; Stoker decodes it through a pipeline that centre-crops the image to its
own size, which hands the decoded pixels through unresampled (PNG checks that). Lossless formats
and CMYK JPEGs (Stoker converts CMYK as Pillow's ``cmyk2rgb`` does, on the inverted bytes Pillow
reads) must be bit-exact. Lossy WebP is decoded by another decoder than Pillow's (the
``image-webp`` crate, not libwebp), yet measured bit-exact too against Pillow 13.0 (libwebp
1.6): ``LOSSY_WEBP_MAX_LEVELS`` is 0, checked on a sweep of qualities, methods and alpha. The
one known difference, 16-bit gray (Stoker keeps the high byte, Pillow clips at 255), has a test
of its own.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import _native, ops

Image = pytest.importorskip("PIL.Image")

WIDTH, HEIGHT = 61, 47

# Measured with Pillow 13.0 (libwebp 1.6) over 40 random images (sizes 5-300, qualities 5-99,
# methods 0-6, a third with alpha): no level differs.
LOSSY_WEBP_MAX_LEVELS = 0


def photo(channels: int = 3) -> np.ndarray:
    """A smooth picture with some detail and noise, ``channels`` bytes a pixel."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float64)
    rng = np.random.default_rng(7)
    planes = [
        255 * x / WIDTH,
        255 * y / HEIGHT,
        128 + 100 * np.sin(x / 5) * np.cos(y / 7),
        255 - 200 * (x * y) / (WIDTH * HEIGHT),
    ][:channels]
    image = np.stack(planes, axis=-1) + rng.normal(0, 6, (HEIGHT, WIDTH, channels))
    return np.clip(image, 0, 255).astype(np.uint8)


def stoker_rgb(data: bytes, size: tuple[int, int] = (WIDTH, HEIGHT)) -> np.ndarray:
    """Stoker's decode of ``data``, an image of ``size`` (width, height)."""
    width, height = size
    pipeline = _native.ImagePipeline(
        [op.to_dict() for op in (ops.DecodeImage(), ops.CenterCrop((height, width)))]
    )
    out = np.zeros((height, width, 3), np.uint8)
    pipeline.process(data, 0, 0, 0, out)
    return out


def pillow_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def saved(image: object, format: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format, **options)  # type: ignore[attr-defined]
    return out.getvalue()


def without_adobe_marker(jpeg: bytes) -> bytes:
    """The JPEG without its APP14 segment: libjpeg then takes four components for CMYK."""
    at = jpeg.index(b"\xff\xee")
    length = int.from_bytes(jpeg[at + 2 : at + 4], "big")
    return jpeg[:at] + jpeg[at + 2 + length :]


def cmyk_jpeg() -> bytes:
    return saved(Image.fromarray(photo(4), "CMYK"), "JPEG", quality=92)


def gif_with_transparency() -> bytes:
    """A palette GIF whose index 3 is transparent (its RGB entry is not black)."""
    indices = (photo(1)[..., 0] // 32).astype(np.uint8)
    image = Image.fromarray(indices, "L").convert("P")
    palette = [channel for i in range(8) for channel in (i * 30, 255 - i * 20, (i * 70) % 256)]
    image.putpalette(palette)
    return saved(image, "GIF", transparency=3)


def rgb_jpeg() -> bytes:
    """A JPEG as Pillow writes one (a JFIF header), without chroma subsampling."""
    return saved(Image.fromarray(photo()), "JPEG", quality=92, subsampling=0)


def with_scan_fields_zeroed(jpeg: bytes) -> bytes:
    """The sequential JPEG with zeros for its scan's Ss, Se and Ah/Al, as Samsung phones write
    them: libjpeg warns ("Invalid SOS parameters"), Pillow reads the pixels."""
    at = jpeg.index(b"\xff\xda")
    fields = at + 5 + 2 * jpeg[at + 4]
    assert jpeg[fields : fields + 3] == b"\x00\x3f\x00"
    return jpeg[:fields] + b"\x00\x00\x00" + jpeg[fields + 3 :]


def with_jfif_version_2(jpeg: bytes) -> bytes:
    """The JPEG with a JFIF header of version 2.01, which libjpeg warns of."""
    at = jpeg.index(b"JFIF\x00") + 5
    return jpeg[:at] + b"\x02\x01" + jpeg[at + 2 :]


def with_associated_alpha(tiff: bytes) -> bytes:
    """The little-endian TIFF (one image, an ExtraSamples tag of one value) with its alpha
    declared associated: Pillow divides the colour samples by it."""
    data = bytearray(tiff)
    ifd = struct.unpack_from("<I", data, 4)[0]
    for entry in range(struct.unpack_from("<H", data, ifd)[0]):
        at = ifd + 2 + 12 * entry
        if struct.unpack_from("<H", data, at)[0] == 338:
            struct.pack_into("<H", data, at + 8, 1)
            return bytes(data)
    raise AssertionError("no ExtraSamples tag")


def premultiplied_rgba() -> np.ndarray:
    """RGBA with alpha from 0 to 255 across the image and each colour at most its alpha."""
    rgba = photo(4)
    alpha = np.linspace(0, 255, WIDTH).astype(np.uint16)[None, :, None]
    rgba[..., 3:] = alpha
    rgba[..., :3] = (rgba[..., :3].astype(np.uint16) * alpha // 255).astype(np.uint8)
    return rgba


def associated_alpha_tiff(rgba: np.ndarray, big_endian: bool, extra_samples_type: int) -> bytes:
    """An uncompressed RGBA TIFF of one strip whose alpha is associated (ExtraSamples 1, of
    TIFF type ``extra_samples_type``: 3 unsigned, 8 signed), 8- or 16-bit as ``rgba`` is."""
    order = ">" if big_endian else "<"
    height, width = rgba.shape[:2]
    pixels = rgba.astype(rgba.dtype.newbyteorder(order)).tobytes()
    bits_at = 8 + len(pixels)
    ifd_at = bits_at + 8
    entries = [  # tag, type, count, value (a short one left-aligned in its field)
        *((tag, 4, 1, value) for tag, value in ((256, width), (257, height), (273, 8))),
        (258, 3, 4, bits_at),
        *((tag, 3, 1, value) for tag, value in ((259, 1), (262, 2), (277, 4), (284, 1))),
        *((tag, 4, 1, value) for tag, value in ((278, height), (279, len(pixels)))),
        (338, extra_samples_type, 1, 1),
    ]
    out = (b"MM" if big_endian else b"II") + struct.pack(order + "HI", 42, ifd_at) + pixels
    out += struct.pack(order + "4H", *[rgba.dtype.itemsize * 8] * 4)
    out += struct.pack(order + "H", len(entries))
    for tag, kind, count, value in sorted(entries):
        field = "I" if kind == 4 or count > 1 else "h2x" if kind == 8 else "H2x"
        out += struct.pack(order + "HHI" + field, tag, kind, count, value)
    return out + struct.pack(order + "I", 0)


def with_junk_between_segments(jpeg: bytes) -> bytes:
    """The JPEG with bytes libjpeg discards (warning "extraneous bytes before marker"): any
    after its JFIF header, zeros after its tables; Pillow reads the pixels."""
    for marker, junk in (
        (b"\xff\xdb", b"\x00\x12\xff\x00\x34"),
        (b"\xff\xc4", b"\x00\x00"),
        (b"\xff\xda", b"\x00"),
    ):
        at = jpeg.index(marker)
        jpeg = jpeg[:at] + junk + jpeg[at:]
    return jpeg


LOSSLESS: dict[str, Callable[[], bytes]] = {
    "jpeg 4:4:4": rgb_jpeg,
    "jpeg, scan fields zeroed (samsung)": lambda: with_scan_fields_zeroed(rgb_jpeg()),
    "jpeg, jfif 2.01": lambda: with_jfif_version_2(rgb_jpeg()),
    "jpeg, bytes between segments": lambda: with_junk_between_segments(rgb_jpeg()),
    "cmyk jpeg (adobe marker)": cmyk_jpeg,
    "cmyk jpeg (no adobe marker)": lambda: without_adobe_marker(cmyk_jpeg()),
    "webp lossless": lambda: saved(Image.fromarray(photo()), "WEBP", lossless=True),
    "webp lossless with alpha": lambda: saved(
        Image.fromarray(photo(4), "RGBA"), "WEBP", lossless=True
    ),
    "bmp": lambda: saved(Image.fromarray(photo()), "BMP"),
    "bmp gray": lambda: saved(Image.fromarray(photo(1)[..., 0], "L"), "BMP"),
    "tiff": lambda: saved(Image.fromarray(photo()), "TIFF"),
    "tiff lzw": lambda: saved(Image.fromarray(photo()), "TIFF", compression="tiff_lzw"),
    "tiff deflate rgba": lambda: saved(
        Image.fromarray(photo(4), "RGBA"), "TIFF", compression="tiff_adobe_deflate"
    ),
    "tiff rgba, associated alpha": lambda: with_associated_alpha(
        saved(Image.fromarray(premultiplied_rgba(), "RGBA"), "TIFF")
    ),
    "ppm": lambda: saved(Image.fromarray(photo()), "PPM"),
    "pgm": lambda: saved(Image.fromarray(photo(1)[..., 0], "L"), "PPM"),
    "pbm": lambda: saved(Image.fromarray(photo(1)[..., 0], "L").convert("1"), "PPM"),
    "gif": lambda: saved(Image.fromarray(photo()).convert("P"), "GIF"),
    "gif transparent": gif_with_transparency,
    "png (the crop copies)": lambda: saved(Image.fromarray(photo()), "PNG"),
}

LOSSY: dict[str, Callable[[], bytes]] = {
    "webp lossy": lambda: saved(Image.fromarray(photo()), "WEBP", quality=90),
    "webp lossy with alpha": lambda: saved(Image.fromarray(photo(4), "RGBA"), "WEBP", quality=90),
}


@pytest.mark.parametrize("name", sorted(LOSSLESS))
def test_lossless_formats_and_cmyk_match_pillow_exactly(name: str) -> None:
    data = LOSSLESS[name]()
    ours, theirs = stoker_rgb(data), pillow_rgb(data)
    assert ours.shape == theirs.shape == (HEIGHT, WIDTH, 3)
    differing = int(np.count_nonzero(ours != theirs))
    assert differing == 0, f"{name}: {differing} bytes differ from Pillow"


def test_the_cmyk_files_are_what_they_claim() -> None:
    adobe = cmyk_jpeg()
    assert adobe.index(b"\xff\xee") + 4 == adobe.index(b"Adobe")
    stripped = without_adobe_marker(adobe)
    assert b"\xff\xee" not in stripped
    for data in (adobe, stripped):
        assert Image.open(io.BytesIO(data)).mode == "CMYK"


@pytest.mark.parametrize(
    ("bits", "big_endian", "extra_samples_type"),
    [(8, False, 3), (8, True, 8), (16, False, 3), (16, True, 3)],
)
def test_a_tiffs_associated_alpha_is_divided_out_as_pillow_does(
    bits: int, big_endian: bool, extra_samples_type: int
) -> None:
    # Any colour under any alpha: above it (clipped), under alpha 0 (black), opaque.
    rng = np.random.default_rng(bits + big_endian)
    dtype = np.uint8 if bits == 8 else np.uint16
    rgba = rng.integers(0, 1 << bits, (HEIGHT, WIDTH, 4), dtype=dtype)
    rgba[0, :4, 3] = [0, 1 << (bits - 8), (1 << bits) - 1, 0]
    data = associated_alpha_tiff(rgba, big_endian, extra_samples_type)
    ours, theirs = stoker_rgb(data), pillow_rgb(data)
    assert theirs[0, 0].tolist() == [0, 0, 0] and theirs[0, 2].tolist() != [0, 0, 0]
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", sorted(LOSSY))
def test_lossy_webp_is_within_the_measured_bound(name: str) -> None:
    data = LOSSY[name]()
    difference = np.abs(stoker_rgb(data).astype(int) - pillow_rgb(data).astype(int))
    assert difference.max() <= LOSSY_WEBP_MAX_LEVELS, (name, int(difference.max()))


def test_lossy_webp_bound_holds_over_sizes_qualities_and_methods() -> None:
    rng = np.random.default_rng(1)
    for trial in range(12):
        width, height = (int(side) for side in rng.integers(5, 200, size=2))
        y, x = np.mgrid[0:height, 0:width]
        planes = [np.sin(x / rng.uniform(2, 30)), np.cos(y / rng.uniform(2, 30)), (x + y) / 200]
        picture = np.stack(planes, axis=-1) * 120 + 128
        picture += rng.normal(0, rng.uniform(0, 40), picture.shape)
        pixels = np.clip(picture, 0, 255).astype(np.uint8)
        if trial % 3 == 2:
            alpha = rng.integers(0, 256, (height, width, 1), dtype=np.uint8)
            image = Image.fromarray(np.concatenate([pixels, alpha], axis=-1), "RGBA")
        else:
            image = Image.fromarray(pixels)
        quality, method = int(rng.integers(5, 100)), int(rng.integers(0, 7))
        data = saved(image, "WEBP", quality=quality, method=method)
        ours = stoker_rgb(data, (width, height)).astype(int)
        worst = int(np.abs(ours - pillow_rgb(data).astype(int)).max())
        assert worst <= LOSSY_WEBP_MAX_LEVELS, (width, height, quality, method, image.mode)


def gif_frame_on_screen(
    screen: tuple[int, int],
    frame: tuple[int, int, int, int],
    global_palette: bytes = b"",
    local_palette: bytes = b"",
    transparent: int | None = None,
    interlaced: bool = False,
) -> bytes:
    """A GIF whose one frame (left, top, width, height) of a few indices lies on a logical
    screen of ``screen`` (width, height); palettes of 4 colours. Pillow writes no such file."""
    left, top, width, height = frame
    flags = 0x81 if global_palette else 0
    out = b"GIF89a" + struct.pack("<HHBBB", *screen, flags, 0, 0) + global_palette
    if transparent is not None:
        out += b"\x21\xf9\x04\x01\x00\x00" + bytes([transparent]) + b"\x00"
    local_flags = (0x81 if local_palette else 0) | (0x40 if interlaced else 0)
    out += b"\x2c" + struct.pack("<HHHHB", left, top, width, height, local_flags) + local_palette
    # Each row its own indices (row r's first four are r's bits), so rows out of order show.
    indices = [(y >> x) & 1 if x < 4 else x % 4 for y in range(height) for x in range(width)]
    # LZW of 3-bit codes: a clear code before each index keeps the code size from growing.
    codes = [code for index in indices for code in (4, index)] + [5]
    packed = sum(code << (3 * n) for n, code in enumerate(codes))
    data = packed.to_bytes((3 * len(codes) + 7) // 8, "little")
    blocks = b"".join(
        bytes([len(data[i : i + 255])]) + data[i : i + 255] for i in range(0, len(data), 255)
    )
    return out + b"\x02" + blocks + b"\x00\x3b"


GIF_PALETTE = bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30])
GIF_LOCAL_PALETTE = bytes([1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13])

GIF_FRAMES: dict[str, Callable[[], bytes]] = {
    "smaller than the screen": lambda: gif_frame_on_screen((9, 7), (2, 1, 5, 4), GIF_PALETTE),
    "with a transparent index": lambda: gif_frame_on_screen(
        (9, 7), (2, 1, 5, 4), GIF_PALETTE, transparent=3
    ),
    "with a local palette": lambda: gif_frame_on_screen(
        (9, 7), (0, 3, 9, 2), GIF_PALETTE, GIF_LOCAL_PALETTE, transparent=2
    ),
    "a local palette alone": lambda: gif_frame_on_screen(
        (9, 7), (1, 1, 3, 3), b"", GIF_LOCAL_PALETTE
    ),
    "a gray local palette over a coloured global one": lambda: gif_frame_on_screen(
        (9, 7), (1, 1, 3, 3), GIF_PALETTE, bytes(i // 3 for i in range(12))
    ),
    "interlaced": lambda: gif_frame_on_screen((9, 12), (1, 2, 6, 9), GIF_PALETTE, interlaced=True),
    "past the screen": lambda: gif_frame_on_screen((6, 5), (3, 2, 5, 4), GIF_PALETTE),
}


@pytest.mark.parametrize("name", sorted(GIF_FRAMES))
def test_a_gifs_first_frame_lies_on_the_canvas_pillow_gives(name: str) -> None:
    data = GIF_FRAMES[name]()
    theirs = pillow_rgb(data)
    height, width = theirs.shape[:2]
    ours = stoker_rgb(data, (width, height))
    np.testing.assert_array_equal(ours, theirs)


def gif_with_blocks(blocks: bytes, transparent: int | None = 3) -> bytes:
    """A GIF of ``GIF_FRAMES``' kind with ``blocks`` put before its image descriptor."""
    data = gif_frame_on_screen((9, 7), (2, 1, 5, 4), GIF_PALETTE, transparent=transparent)
    at = data.index(b"\x2c\x02\x00\x01\x00")
    return data[:at] + blocks + data[at:]


# GIFs Pillow reads and Stoker does not (the `gif` crate refuses them): the ``DecodeImage`` and
# decode module docs list them.
GIFS_REFUSED: dict[str, Callable[[], bytes]] = {
    "no colour table": lambda: gif_frame_on_screen((9, 7), (2, 1, 5, 4)),
    "an extension of an unknown label": lambda: gif_with_blocks(b"\x21\x99\x02ab\x00"),
    "a graphic control block of 5 bytes": lambda: gif_with_blocks(
        b"\x21\xf9\x05\x01\x00\x00\x02\x00\x00", transparent=None
    ),
    "a graphic control block of 3 bytes": lambda: gif_with_blocks(
        b"\x21\xf9\x03\x00\x00\x00\x00", transparent=None
    ),
    "a stray byte between blocks": lambda: gif_with_blocks(b"\x07"),
}


@pytest.mark.parametrize("name", sorted(GIFS_REFUSED))
def test_gifs_the_gif_crate_refuses_are_bad_samples(name: str) -> None:
    data = GIFS_REFUSED[name]()
    theirs = pillow_rgb(data)
    with pytest.raises(stoker.DecodeError, match="gif"):
        stoker_rgb(data, (theirs.shape[1], theirs.shape[0]))


@pytest.mark.parametrize(
    "data",
    [
        # The file's own block makes index 3 transparent; a second one, without transparency,
        # follows it.
        lambda: gif_with_blocks(b"\x21\xf9\x04\x00\x00\x00\x00\x00"),
        # One block of two sub-blocks: the first makes index 3 transparent, the second not.
        lambda: gif_with_blocks(
            b"\x21\xf9\x04\x01\x00\x00\x03\x04\x00\x00\x00\x00\x00", transparent=None
        ),
    ],
    ids=["two blocks", "two sub-blocks"],
)
def test_the_last_graphic_control_gives_the_transparent_index(data: Callable[[], bytes]) -> None:
    # Pillow keeps index 3 for the canvas; Stoker takes the last word: none, so index 0.
    ours, theirs = stoker_rgb(data(), (9, 7)), pillow_rgb(data())
    assert theirs[0, 0].tolist() == list(GIF_PALETTE[9:12])
    assert ours[0, 0].tolist() == list(GIF_PALETTE[0:3])
    np.testing.assert_array_equal(ours[1:5, 2:7], theirs[1:5, 2:7])


@pytest.mark.parametrize("format", ["PPM", "TIFF", "PNG"])
def test_sixteen_bit_gray_keeps_the_high_byte_where_pillow_clips(format: str) -> None:
    values = (np.arange(WIDTH * HEIGHT, dtype=np.uint32) * 517 % 65536).astype(np.uint16)
    gray = values.reshape(HEIGHT, WIDTH)
    data = saved(Image.fromarray(gray), format)
    high_byte = np.repeat((gray >> 8).astype(np.uint8)[..., None], 3, axis=-1)
    assert np.array_equal(stoker_rgb(data), high_byte)
    clipped = np.repeat(np.minimum(gray, 255).astype(np.uint8)[..., None], 3, axis=-1)
    assert np.array_equal(pillow_rgb(data), clipped)


def planar_tiff(width: int = 4, height: int = 4) -> bytes:
    """An uncompressed RGB TIFF stored by planes (PlanarConfiguration 2), which Pillow reads
    and does not write."""
    planes = [
        bytes((x * 40 + c * 80 + y * 10) % 256 for y in range(height) for x in range(width))
        for c in range(3)
    ]
    entries, ifd, plane = 10, 8, width * height
    bits_at = ifd + 2 + entries * 12 + 4
    offsets_at, counts_at = bits_at + 6, bits_at + 18
    data_at = counts_at + 12

    def entry(tag: int, kind: int, count: int, value: int) -> bytes:
        if kind == 3 and count == 1:  # one SHORT, in the entry itself
            return struct.pack("<HHIHH", tag, kind, count, value, 0)
        return struct.pack("<HHII", tag, kind, count, value)

    out = b"II*\x00" + struct.pack("<IH", ifd, entries)
    out += entry(256, 3, 1, width) + entry(257, 3, 1, height) + entry(258, 3, 3, bits_at)
    out += entry(259, 3, 1, 1) + entry(262, 3, 1, 2) + entry(273, 4, 3, offsets_at)
    out += entry(277, 3, 1, 3) + entry(278, 3, 1, height) + entry(279, 4, 3, counts_at)
    out += entry(284, 3, 1, 2) + struct.pack("<I", 0)
    out += struct.pack("<3H", 8, 8, 8)
    out += struct.pack("<3I", *(data_at + i * plane for i in range(3)))
    out += struct.pack("<3I", plane, plane, plane)
    return out + b"".join(planes)


UNREAD_TIFFS: dict[str, Callable[[], bytes]] = {
    "palette": lambda: saved(Image.fromarray(photo()).convert("P"), "TIFF"),
    "ycbcr (jpeg-compressed)": lambda: saved(
        Image.fromarray(photo()).convert("YCbCr"), "TIFF", compression="jpeg"
    ),
    "planar": planar_tiff,
    "gray with alpha": lambda: saved(Image.fromarray(photo(2), "LA"), "TIFF"),
    "bigtiff": lambda: saved(Image.fromarray(photo()), "TIFF", big_tiff=True),
}


@pytest.mark.parametrize("name", sorted(UNREAD_TIFFS))
def test_tiffs_pillow_reads_and_stoker_does_not_are_bad_samples_naming_why(name: str) -> None:
    data = UNREAD_TIFFS[name]()
    assert pillow_rgb(data).ndim == 3
    why = "an image of a kind Stoker does not decode: tiff"
    with pytest.raises(stoker.DecodeError, match=why):
        stoker_rgb(data, Image.open(io.BytesIO(data)).size)


def test_a_cmyk_tiff_is_within_one_level_of_pillow() -> None:
    data = saved(Image.fromarray(photo(4), "CMYK"), "TIFF")
    ours, theirs = stoker_rgb(data).astype(int), pillow_rgb(data).astype(int)
    assert int(np.abs(ours - theirs).max()) <= 1


def two_classes(root: Path, files: dict[str, bytes]) -> None:
    """Class folders ``a`` and ``b`` under ``root``, each holding ``files``."""
    for class_name in ("a", "b"):
        folder = root / class_name
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)


def small_loader(root: Path, **options: Any) -> stoker.Loader:
    """A loader of 32x32 numpy batches over the class folders under ``root``."""
    return stoker.Loader(
        root, pipeline=stoker.vision.imagenet_eval(32), output="numpy", timeout=30, **options
    )


def test_a_folder_of_every_format_has_no_bad_sample(dataset: Path, tmp_path: Path) -> None:
    jpegs = sorted(dataset.rglob("*.jpg"))[:4]
    files = {
        "photo.webp": LOSSY["webp lossy"](),
        "alpha.webp": LOSSLESS["webp lossless with alpha"](),
        "photo.bmp": LOSSLESS["bmp"](),
        "photo.tif": LOSSLESS["tiff lzw"](),
        "photo.tiff": LOSSLESS["tiff"](),
        "photo.ppm": LOSSLESS["ppm"](),
        "photo.pgm": LOSSLESS["pgm"](),
        "cmyk.jpg": cmyk_jpeg(),
        "phone.jpg": with_scan_fields_zeroed(rgb_jpeg()),
        "jfif2.jpg": with_jfif_version_2(rgb_jpeg()),
        "junk.jpg": with_junk_between_segments(rgb_jpeg()),
        "photo.png": saved(Image.fromarray(photo()), "PNG"),
    }
    two_classes(tmp_path, {**files, **{j.name: j.read_bytes() for j in jpegs}})
    samples = 2 * (len(files) + len(jpegs))

    with small_loader(tmp_path, batch_size=6, num_threads=2, on_error="fail") as loader:
        assert loader.num_samples == samples
        seen = sum(batch["image"].shape[0] for batch in loader)
        assert seen == samples
        assert loader.stats()["bad_samples"] == 0


def test_a_jpeg_cut_short_behind_a_header_quirk_is_a_bad_sample(tmp_path: Path) -> None:
    # libjpeg warns of the quirk first and TurboJPEG keeps the first warning only: the cut
    # (a warning too, "Premature end of JPEG file") must not pass with it.
    whole = rgb_jpeg()
    files = {"whole.jpg": whole}
    for name, quirky in (
        ("phone", with_scan_fields_zeroed(whole)),
        ("jfif2", with_jfif_version_2(whole)),
        ("junk", with_junk_between_segments(whole)),
    ):
        files[f"{name}_cut.jpg"] = quirky[: len(quirky) * 6 // 10]
    two_classes(tmp_path, files)

    with (
        pytest.raises(stoker.DecodeError, match=r"_cut\.jpg"),
        small_loader(tmp_path, batch_size=6, on_error="fail", shuffle=False) as loader,
    ):
        list(loader)
    with small_loader(tmp_path, batch_size=6, on_error="skip") as loader:
        assert sum(batch["image"].shape[0] for batch in loader) == 8
        assert loader.stats()["bad_samples"] == 6


def test_image_files_a_folder_does_not_take_are_logged_once_with_the_first(
    dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jpegs = sorted(dataset.rglob("*.jpg"))[:2]
    two_classes(tmp_path, {j.name: j.read_bytes() for j in jpegs})
    (tmp_path / "a" / "phone.heic").write_bytes(b"not decoded")
    (tmp_path / "b" / "anim.gif").write_bytes(saved(Image.fromarray(photo()), "GIF"))
    (tmp_path / "b" / "notes.txt").write_text("no image")
    with caplog.at_level("WARNING", logger="stoker"):
        loader = small_loader(tmp_path, batch_size=2, num_threads=1)
    with loader:
        assert loader.num_samples == 4
        notices = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
        assert len(notices) == 1, notices
        assert "left out 2 image file(s)" in notices[0], notices
        assert str(tmp_path / "a" / "phone.heic") in notices[0], notices


@pytest.mark.parametrize("size", [(896, 1200), (897, 1201)])
def test_a_dct_scaled_resize_keeps_the_images_extent(size: tuple[int, int]) -> None:
    """Decoded at 1/8 scale, 897 px come out 113 wide (112.125 rounded up): taking that width
    for the image's extent stretched the resize, up to 16 grey levels off a full-size decode
    of a gradient. Now within the blur the ``DecodeImage`` docs state (7.3 at most)."""
    width, height = size
    x, y = np.meshgrid(np.arange(width), np.arange(height))
    gradient = np.stack([255 * x / width, 255 * y / height, 255 * (x + y) / (width + height)],
                        axis=-1).astype(np.uint8)
    data = saved(Image.fromarray(gradient), "JPEG", quality=95)
    outs = []
    for dct in (False, True):
        pipeline = _native.ImagePipeline([
            op.to_dict() for op in (ops.DecodeImage(dct_scaling=dct), ops.Resize(55),
                                    ops.CenterCrop(48))
        ])
        out = np.zeros((48, 48, 3), np.uint8)
        pipeline.process(data, 0, 0, 0, out)
        outs.append(out.astype(np.int16))
    difference = np.abs(outs[0] - outs[1])
    assert difference.max() <= 7 and difference.mean() < 1.0, (difference.max(), difference.mean())
