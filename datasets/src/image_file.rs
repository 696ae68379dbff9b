//! One image file read from local disk, for every format that reads images as files: an image
//! folder's samples and the images a Hugging Face `Image` cell refers to by path. Bounded: not
//! a regular file (a named pipe, a link to `/dev/zero`), more than
//! [`crate::MAX_SAMPLE_BYTES`], or a large file that starts as no image format does is refused
//! before it is read whole.

use std::path::Path;

use crate::error::{Error, Result};
use crate::files::open_regular_file;
use crate::referenced_files::{check_allowed, check_data_file};

/// Files larger than this have their first bytes checked before the rest is read.
const SNIFFED_PAST: u64 = 4 << 20;

/// The bytes [`crate::sniff_format`] reads a format from.
const SNIFFED_BYTES: u64 = 16;

/// The file at `path`, unless it holds more than [`crate::MAX_SAMPLE_BYTES`], is not a regular
/// file (a named pipe is opened without waiting for a writer, and refused), or is larger than
/// 4 MiB and starts as no image format does.
pub(crate) fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    check_data_file(path)?;
    let (file, metadata) = open_regular_file(path).map_err(|source| Error::io(path, source))?;
    let bytes = metadata.len();
    if bytes > crate::MAX_SAMPLE_BYTES {
        return Err(Error::SampleTooLarge {
            what: path.display().to_string(),
            bytes,
        });
    }
    let mut file = file.take(crate::MAX_SAMPLE_BYTES + 1);
    let mut data = Vec::with_capacity(usize::try_from(bytes).unwrap_or(0));
    // A large file whose first bytes are no image format's (a video or an archive named
    // `.jpg`) is a bad sample before the rest is read: it was read whole, on every thread
    // that met it, every epoch, only for the decoder to refuse it.
    if bytes > SNIFFED_PAST {
        (&mut file)
            .take(SNIFFED_BYTES)
            .read_to_end(&mut data)
            .map_err(|source| Error::io(path, source))?;
        if crate::sniff_format(&data) == crate::ImageFormat::Other {
            return Err(Error::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "a file of {bytes} bytes whose first bytes are no image format's \
                         (JPEG, PNG, WebP, BMP, TIFF, PNM, GIF); not read further"
                    ),
                ),
            ));
        }
    }
    // Read to its end, not to its listed size: a file that grew since is read whole, up to
    // the bound.
    file.read_to_end(&mut data)
        .map_err(|source| Error::io(path, source))?;
    if data.len() as u64 > crate::MAX_SAMPLE_BYTES {
        return Err(Error::SampleTooLarge {
            what: path.display().to_string(),
            bytes: data.len() as u64,
        });
    }
    Ok(data)
}

/// Reads the file `reference` names: an absolute path, or one relative to `base`, once
/// the data roots let it (a refusal becomes the error `refused` makes of its reason), read as
/// an image file of a folder is ([`read_bounded`]).
pub(crate) fn read_referenced(
    reference: &str,
    base: &Path,
    refused: impl FnOnce(String) -> Error,
) -> Result<Vec<u8>> {
    let path = Path::new(reference);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    check_allowed(&path).map_err(refused)?;
    read_bounded(&path)
}
