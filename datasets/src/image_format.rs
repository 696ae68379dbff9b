//! Telling image formats apart by their leading bytes, so decoding does not trust file names.

/// An encoded image's container format, as far as the decode path cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// JPEG/JFIF/EXIF: starts with an SOI marker followed by another marker.
    Jpeg,
    /// PNG: starts with the eight-byte PNG signature.
    Png,
    /// WebP (lossy, lossless, with alpha, animated): a RIFF container of form type `WEBP`.
    WebP,
    /// Windows bitmap: starts with `BM`.
    Bmp,
    /// TIFF: `II*\0` (little-endian) or `MM\0*` (big-endian); BigTIFF is `Other`.
    Tiff,
    /// Netpbm's PBM, PGM and PPM, plain or raw: `P1` to `P6` followed by whitespace.
    Pnm,
    /// GIF: `GIF87a` or `GIF89a`.
    Gif,
    /// Anything else (AVIF, HEIC, ICO, PAM, truncated or corrupt data, ...).
    Other,
}

impl ImageFormat {
    /// The format's short lowercase name (`"jpeg"`, `"png"`, `"webp"`, `"bmp"`, `"tiff"`,
    /// `"pnm"`, `"gif"`, `"other"`), as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Png => "png",
            ImageFormat::WebP => "webp",
            ImageFormat::Bmp => "bmp",
            ImageFormat::Tiff => "tiff",
            ImageFormat::Pnm => "pnm",
            ImageFormat::Gif => "gif",
            ImageFormat::Other => "other",
        }
    }
}

const JPEG_MAGIC: [u8; 3] = [0xFF, 0xD8, 0xFF];
const PNG_MAGIC: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// Classifies encoded image bytes by their magic number, not their file extension.
///
/// ImageNet alone holds PNG and CMYK files named `.JPEG`, so the extension is not to be trusted.
///
/// ```
/// use stoker_datasets::{sniff_format, ImageFormat};
/// assert_eq!(sniff_format(&[0xFF, 0xD8, 0xFF, 0xE0]), ImageFormat::Jpeg);
/// assert_eq!(sniff_format(b"GIF89a"), ImageFormat::Gif);
/// assert_eq!(sniff_format(b"\0\0\0\x1cftypavif"), ImageFormat::Other);
/// ```
pub fn sniff_format(bytes: &[u8]) -> ImageFormat {
    if bytes.starts_with(&JPEG_MAGIC) {
        ImageFormat::Jpeg
    } else if bytes.starts_with(&PNG_MAGIC) {
        ImageFormat::Png
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        ImageFormat::WebP
    } else if bytes.starts_with(b"BM") {
        ImageFormat::Bmp
    } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
        ImageFormat::Tiff
    } else if is_pnm(bytes) {
        ImageFormat::Pnm
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        ImageFormat::Gif
    } else {
        ImageFormat::Other
    }
}

/// `P1`..`P6` and then whitespace (or a comment), so text that happens to start with `P3` is
/// not taken for an image.
fn is_pnm(bytes: &[u8]) -> bool {
    match bytes {
        [b'P', b'1'..=b'6', next, ..] => next.is_ascii_whitespace() || *next == b'#',
        _ => false,
    }
}

/// torchvision's `IMG_EXTENSIONS`, matched against the lowercased file name.
const IMAGE_EXTENSIONS: [&[u8]; 9] = [
    b".jpg", b".jpeg", b".png", b".ppm", b".bmp", b".pgm", b".tif", b".tiff", b".webp",
];

/// Image files an image folder leaves out, by extension: GIF (torchvision's `ImageFolder` leaves
/// it out too, so sample indices stay torchvision's) and formats Stoker does not decode.
const LEFT_OUT_IMAGE_EXTENSIONS: [&[u8]; 14] = [
    b".gif", b".heic", b".heif", b".avif", b".jxl", b".jp2", b".j2k", b".ico", b".tga", b".psd",
    b".dng", b".cr2", b".nef", b".exr",
];

/// Whether `name` ends with one of `extensions`, in any case.
fn ends_with_any(name: &[u8], extensions: &[&[u8]]) -> bool {
    extensions.iter().any(|extension| {
        name.len() >= extension.len()
            && name[name.len() - extension.len()..].eq_ignore_ascii_case(extension)
    })
}

/// Whether torchvision's `has_file_allowed_extension` would accept this file name.
pub(crate) fn has_image_extension(name: &[u8]) -> bool {
    ends_with_any(name, &IMAGE_EXTENSIONS)
}

/// Whether this file name is an image's that an image folder does not take (GIF, HEIC, AVIF,
/// JPEG 2000, raw camera files...): such files are counted and reported, not read.
pub(crate) fn is_left_out_image(name: &[u8]) -> bool {
    ends_with_any(name, &LEFT_OUT_IMAGE_EXTENSIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_match_torchvision_case_insensitively() {
        for name in [
            "a.jpg",
            "a.JPEG",
            "a.Png",
            "a.ppm",
            "a.bmp",
            "a.pgm",
            "a.TIF",
            "a.tiff",
            "a.webp",
            ".jpg",
            ".hidden.png",
        ] {
            assert!(has_image_extension(name.as_bytes()), "{name}");
        }
        for name in ["a.gif", "a.txt", "jpg", "a.jpg.tmp", "a.jpe", "a.heic", "a"] {
            assert!(!has_image_extension(name.as_bytes()), "{name}");
        }
        for name in ["a.GIF", "a.heic", "b.avif", "c.jp2"] {
            assert!(is_left_out_image(name.as_bytes()), "{name}");
        }
        assert!(!is_left_out_image(b"a.jpg") && !is_left_out_image(b"a.txt"));
    }

    #[test]
    fn recognises_each_signature() {
        assert_eq!(
            sniff_format(&[0xFF, 0xD8, 0xFF, 0xDB, 0]),
            ImageFormat::Jpeg
        );
        assert_eq!(sniff_format(&PNG_MAGIC), ImageFormat::Png);
        assert_eq!(sniff_format(b"RIFF\x24\0\0\0WEBPVP8L"), ImageFormat::WebP);
        assert_eq!(sniff_format(b"BM\x36\0\0\0"), ImageFormat::Bmp);
        assert_eq!(sniff_format(b"II*\0\x08\0\0\0"), ImageFormat::Tiff);
        assert_eq!(sniff_format(b"MM\0*\0\0\0\x08"), ImageFormat::Tiff);
        for magic in [b"P1\n", b"P2 ", b"P3\t", b"P4\r", b"P5\n", b"P6#"] {
            assert_eq!(sniff_format(magic), ImageFormat::Pnm, "{magic:?}");
        }
        assert_eq!(sniff_format(b"GIF87a\x01\0"), ImageFormat::Gif);
        assert_eq!(sniff_format(b"GIF89a\x01\0"), ImageFormat::Gif);
    }

    #[test]
    fn short_or_foreign_bytes_are_other() {
        assert_eq!(sniff_format(&[]), ImageFormat::Other);
        assert_eq!(sniff_format(&[0xFF, 0xD8]), ImageFormat::Other);
        assert_eq!(sniff_format(&PNG_MAGIC[..7]), ImageFormat::Other);
        assert_eq!(sniff_format(b"RIFF\0\0\0\0WAVE"), ImageFormat::Other);
        assert_eq!(sniff_format(b"RIFF\0\0\0\0WEB"), ImageFormat::Other);
        assert_eq!(sniff_format(b"B"), ImageFormat::Other);
        assert_eq!(sniff_format(b"II+\0\x10\0\0\0"), ImageFormat::Other);
        assert_eq!(sniff_format(b"P7\nWIDTH 1"), ImageFormat::Other);
        assert_eq!(sniff_format(b"P3x"), ImageFormat::Other);
        assert_eq!(sniff_format(b"P6"), ImageFormat::Other);
        assert_eq!(sniff_format(b"GIF88a"), ImageFormat::Other);
    }
}
