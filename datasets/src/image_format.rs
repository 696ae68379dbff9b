//! Telling image formats apart by their leading bytes, so decoding does not trust file names.

/// An encoded image's container format, as far as the decode path cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// JPEG/JFIF/EXIF: starts with an SOI marker followed by another marker.
    Jpeg,
    /// PNG: starts with the eight-byte PNG signature.
    Png,
    /// Anything else (WebP, BMP, TIFF, truncated or corrupt data, ...).
    Other,
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
/// assert_eq!(sniff_format(b"GIF89a"), ImageFormat::Other);
/// ```
pub fn sniff_format(bytes: &[u8]) -> ImageFormat {
    if bytes.starts_with(&JPEG_MAGIC) {
        ImageFormat::Jpeg
    } else if bytes.starts_with(&PNG_MAGIC) {
        ImageFormat::Png
    } else {
        ImageFormat::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_jpeg_and_png_signatures() {
        assert_eq!(
            sniff_format(&[0xFF, 0xD8, 0xFF, 0xDB, 0]),
            ImageFormat::Jpeg
        );
        assert_eq!(sniff_format(&PNG_MAGIC), ImageFormat::Png);
    }

    #[test]
    fn short_or_foreign_bytes_are_other() {
        assert_eq!(sniff_format(&[]), ImageFormat::Other);
        assert_eq!(sniff_format(&[0xFF, 0xD8]), ImageFormat::Other);
        assert_eq!(sniff_format(&PNG_MAGIC[..7]), ImageFormat::Other);
        assert_eq!(sniff_format(b"RIFF\0\0\0\0WEBP"), ImageFormat::Other);
        assert_eq!(sniff_format(b"BM"), ImageFormat::Other);
    }
}
