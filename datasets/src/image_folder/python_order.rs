//! File-name bytes and their order as Python sees them, so sorting matches torchvision's
//! `sorted()` calls byte for byte.
//!
//! Python decodes POSIX file names as UTF-8 with `surrogateescape` (each undecodable byte `b`
//! becomes the code point `U+DC00 + b`) and orders strings by code point. For valid UTF-8 that
//! order equals plain byte order; only names with invalid UTF-8 need the slow path.

use std::cmp::Ordering;
use std::ffi::OsStr;
use std::path::PathBuf;

/// Orders two file names (or `/`-joined relative paths) the way Python's `sorted()` orders the
/// `str` objects `os.scandir` would give for them.
pub(crate) fn compare_like_python(left: &[u8], right: &[u8]) -> Ordering {
    if std::str::from_utf8(left).is_ok() && std::str::from_utf8(right).is_ok() {
        return left.cmp(right);
    }
    surrogate_escaped_code_points(left).cmp(surrogate_escaped_code_points(right))
}

fn surrogate_escaped_code_points(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.utf8_chunks().flat_map(|chunk| {
        let valid = chunk.valid().chars().map(u32::from);
        let escaped = chunk.invalid().iter().map(|byte| 0xDC00 + u32::from(*byte));
        valid.chain(escaped)
    })
}

/// The raw bytes of a file name; on Unix exactly what the file system stores.
pub(crate) fn os_str_bytes(name: &OsStr) -> &[u8] {
    name.as_encoded_bytes()
}

/// Turns bytes from [`os_str_bytes`] back into a path.
#[cfg(unix)]
pub(crate) fn path_from_bytes(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(OsStr::from_bytes(bytes))
}

/// Turns bytes from [`os_str_bytes`] back into a path.
#[cfg(not(unix))]
pub(crate) fn path_from_bytes(bytes: &[u8]) -> PathBuf {
    // Off Unix the encoded bytes are WTF-8; names that are not Unicode are vanishingly rare
    // there and the crate's deployments are Linux, so a lossy round trip is accepted.
    PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_utf8_orders_by_code_point() {
        assert_eq!(compare_like_python(b"B", b"a"), Ordering::Less);
        assert_eq!(compare_like_python(b"a", b"a b"), Ordering::Less);
        assert_eq!(compare_like_python(b"a b", b"a/c"), Ordering::Less);
        assert_eq!(
            compare_like_python("z".as_bytes(), "\u{e9}".as_bytes()),
            Ordering::Less
        );
    }

    #[test]
    fn undecodable_bytes_sort_as_low_surrogates() {
        // 0xFF escapes to U+DCFF: above U+D7FF but below U+E000, unlike plain byte order
        // which would put it after every UTF-8 sequence.
        let escaped = [b'x', 0xFF];
        assert_eq!(
            compare_like_python(&escaped, "x\u{d7ff}".as_bytes()),
            Ordering::Greater
        );
        assert_eq!(
            compare_like_python(&escaped, "x\u{e000}".as_bytes()),
            Ordering::Less
        );
        assert_eq!(compare_like_python(&escaped, b"xz"), Ordering::Greater);
    }

    #[test]
    fn bytes_round_trip_through_paths() {
        let path = path_from_bytes(b"class/sub/img.JPEG");
        assert_eq!(os_str_bytes(path.as_os_str()), b"class/sub/img.JPEG");
    }
}
