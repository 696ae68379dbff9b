//! The bytes of one data file, read by position, wherever they live: a local file (copied out of
//! its read-only map, or read with `pread`: `mapped_file/`) or an object in a store through the
//! cache tier (ranged GETs, with a read-ahead thread: `storage/`). Formats that read a file by
//! byte ranges (token files) are written once over it, local and `s3://` alike.

use std::ops::Range;

use crate::cache_stats::CacheStats;
use crate::error::{Error, Result};
use crate::mapped_file::MappedFile;
use crate::storage::{ByteRanges, Prefetcher, RemoteObject};

/// Where one file's bytes are read from.
pub(crate) enum FileBytes {
    /// A local file.
    Local(MappedFile),
    /// An object in a store, through the cache tier, with its read-ahead thread when it started.
    Remote {
        object: RemoteObject,
        read_ahead: Option<Prefetcher>,
    },
}

impl FileBytes {
    /// The object `object`, read through the cache, with a read-ahead thread of its own.
    pub(crate) fn remote(object: RemoteObject) -> FileBytes {
        let read_ahead = object.start_read_ahead();
        FileBytes::Remote { object, read_ahead }
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            FileBytes::Local(file) => file.len(),
            FileBytes::Remote { object, .. } => object.size(),
        }
    }

    /// Whether a local file is read out of its memory map (`false` for `pread` and objects).
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self, FileBytes::Local(file) if file.is_mapped())
    }

    /// Bytes `range`, which lies within [`Self::len`], as a new buffer.
    pub(crate) fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>> {
        match self {
            FileBytes::Local(file) => {
                let len = usize::try_from(range.end - range.start).map_err(|_| {
                    Error::InvalidArgument(format!("a read of {range:?} is too large"))
                })?;
                let mut bytes = vec![0u8; len];
                file.read_at(&mut bytes, range.start)?;
                Ok(bytes)
            }
            FileBytes::Remote { object, .. } => Ok(object
                .read_ranges(std::slice::from_ref(&range))?
                .pop()
                .unwrap_or_default()),
        }
    }

    /// Fills `dest` with the bytes from `offset` on, which lie within [`Self::len`].
    pub(crate) fn read_at(&self, dest: &mut [u8], offset: u64) -> Result<()> {
        match self {
            FileBytes::Local(file) => file.read_at(dest, offset),
            FileBytes::Remote { .. } => {
                let bytes = self.read_range(offset..offset + dest.len() as u64)?;
                if bytes.len() != dest.len() {
                    return Err(Error::InvalidArgument(format!(
                        "a ranged read of {} bytes gave {}",
                        dest.len(),
                        bytes.len()
                    )));
                }
                dest.copy_from_slice(&bytes);
                Ok(())
            }
        }
    }

    /// Tells the read-ahead thread that `ranges` are read next (an object only; a local file
    /// is read where it lies).
    pub(crate) fn read_ahead(&self, ranges: Vec<Range<u64>>) {
        if let FileBytes::Remote {
            object,
            read_ahead: Some(read_ahead),
        } = self
        {
            if let Some(listed) = object.listed() {
                read_ahead.hint(vec![(listed.clone(), ranges)]);
            }
        }
    }

    /// The cache tier's figures, for an object.
    pub(crate) fn cache_stats(&self) -> Option<CacheStats> {
        match self {
            FileBytes::Local(_) => None,
            FileBytes::Remote { object, .. } => Some(object.cache_stats()),
        }
    }
}
