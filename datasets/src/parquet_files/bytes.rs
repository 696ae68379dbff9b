//! Where a Parquet file's bytes come from: a local file, or an object in a store read by byte
//! ranges through the cache tier. For a remote file the footer is read from the object's tail,
//! and a read of some row groups and columns first fetches exactly those column chunks (in one
//! call: neighbours coalesced), then serves the Parquet reader from them ([`ChunkBytes`]).

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};

use crate::error::{Error, Result};
use crate::same_file::{reopen_error, SameFile};
use crate::storage::ByteRanges;

/// The bytes of one Parquet file.
#[derive(Clone)]
pub(crate) enum FileBytes {
    /// A local file.
    Local(LocalFile),
    /// A file read by ranges (an object in a store).
    Remote(Arc<dyn ByteRanges>),
}

/// A local Parquet file, opened again by its path for each read of its column chunks, and
/// held to the file whose footer was read: another file renamed over it, or the file cut or
/// grown, would give other bytes at the footer's offsets (other rows under the labels read at
/// open), so such a read is [`Error::FileReplaced`] and stops the job.
#[derive(Clone)]
pub(crate) struct LocalFile {
    path: PathBuf,
    /// Taken as the footer is read; shared by the clones of this file.
    footer_of: Arc<OnceLock<SameFile>>,
}

impl LocalFile {
    pub(crate) fn new(path: PathBuf) -> LocalFile {
        LocalFile {
            path,
            footer_of: Arc::default(),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file opened, checked against the one whose footer was read (if it was): one gone
    /// since is [`Error::FileRemoved`].
    fn open(&self) -> Result<File> {
        let file = File::open(&self.path).map_err(|source| match self.footer_of.get() {
            Some(_) => reopen_error(&self.path, &self.path, source),
            None => Error::io(&self.path, source),
        })?;
        let now = SameFile::of_file(&file, &self.path)?;
        self.footer_of
            .get_or_init(|| now)
            .matches(now, &self.path)?;
        Ok(file)
    }
}

/// Bytes of a remote file's tail read first, at most: most footers fit. A small file reads a
/// thousandth of its size (at least 1 KiB), so a set of small files does not pay a tail of this
/// size for footers of a few KiB; a footer longer than the tail costs a second GET.
const TAIL_BYTES: u64 = 16 * 1024;

impl FileBytes {
    /// A reader of the footer (a local file: the whole file).
    pub(crate) fn footer(&self) -> Result<ChunkBytes> {
        match self {
            FileBytes::Local(local) => Ok(ChunkBytes::Local(local.open()?)),
            FileBytes::Remote(object) => {
                let len = object.size();
                let tail_bytes = (len / 1024).clamp(1024, TAIL_BYTES);
                let tail = len.saturating_sub(tail_bytes)..len;
                let mut chunks = object.read_ranges(std::slice::from_ref(&tail))?;
                let bytes = chunks.pop().unwrap_or_default();
                // The last 8 bytes: the footer's length (u32 LE) and `PAR1`.
                let footer = bytes
                    .len()
                    .checked_sub(8)
                    .and_then(|at| bytes.get(at..at + 4))
                    .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .unwrap_or(0);
                let needed = footer.saturating_add(8);
                if needed <= bytes.len() as u64 || needed > len {
                    return Ok(ChunkBytes::sparse(len, vec![(tail.start, bytes)]));
                }
                let whole = len - needed..len;
                let mut chunks = object.read_ranges(std::slice::from_ref(&whole))?;
                Ok(ChunkBytes::sparse(
                    len,
                    vec![(whole.start, chunks.pop().unwrap_or_default())],
                ))
            }
        }
    }

    /// A reader of the column chunks of `roots` in `row_groups` (a local file: the file).
    pub(crate) fn chunks(
        &self,
        metadata: &ParquetMetaData,
        row_groups: &[usize],
        roots: &[usize],
    ) -> Result<ChunkBytes> {
        match self {
            FileBytes::Local(local) => Ok(ChunkBytes::Local(local.open()?)),
            FileBytes::Remote(object) => {
                let ranges = column_chunk_ranges(metadata, row_groups, roots, object.size());
                let fetched = object.read_ranges(&ranges)?;
                Ok(ChunkBytes::sparse(
                    object.size(),
                    ranges.iter().map(|r| r.start).zip(fetched).collect(),
                ))
            }
        }
    }
}

/// The byte ranges of the column chunks of `roots` (root columns) in `row_groups`, as the
/// footer gives them, cut to `len` bytes: what a read of those groups fetches, and what a
/// read-ahead brings into the cache for it.
pub(crate) fn column_chunk_ranges(
    metadata: &ParquetMetaData,
    row_groups: &[usize],
    roots: &[usize],
    len: u64,
) -> Vec<Range<u64>> {
    let schema = metadata.file_metadata().schema_descr();
    let mut ranges = Vec::new();
    for &group in row_groups {
        let Some(row_group) = metadata.row_groups().get(group) else {
            continue;
        };
        for leaf in 0..schema.num_columns() {
            if !roots.contains(&schema.get_column_root_idx(leaf)) {
                continue;
            }
            let (start, length) = row_group.column(leaf).byte_range();
            let end = start.saturating_add(length).min(len);
            if start < end {
                ranges.push(start..end);
            }
        }
    }
    ranges
}

/// What a Parquet reader reads: a local file, or the fetched parts of a remote one (reads
/// outside them fail with an error naming the offset).
pub(crate) enum ChunkBytes {
    Local(File),
    Sparse {
        len: u64,
        /// (offset, bytes), sorted by offset.
        chunks: Vec<(u64, Bytes)>,
    },
}

impl ChunkBytes {
    /// A second reader of the same bytes (`path` names the file in errors).
    pub(crate) fn try_clone(&self, path: &std::path::Path) -> Result<ChunkBytes> {
        match self {
            ChunkBytes::Local(file) => Ok(ChunkBytes::Local(
                file.try_clone().map_err(|source| Error::io(path, source))?,
            )),
            ChunkBytes::Sparse { len, chunks } => Ok(ChunkBytes::Sparse {
                len: *len,
                chunks: chunks.clone(),
            }),
        }
    }

    fn sparse(len: u64, chunks: Vec<(u64, Vec<u8>)>) -> ChunkBytes {
        let mut chunks: Vec<(u64, Bytes)> = chunks
            .into_iter()
            .map(|(offset, bytes)| (offset, Bytes::from(bytes)))
            .collect();
        chunks.sort_by_key(|(offset, _)| *offset);
        ChunkBytes::Sparse { len, chunks }
    }

    /// The fetched bytes from `start` to the end of the part holding it.
    fn from(chunks: &[(u64, Bytes)], start: u64) -> parquet::errors::Result<Bytes> {
        let position = chunks.partition_point(|(offset, _)| *offset <= start);
        position
            .checked_sub(1)
            .and_then(|p| chunks.get(p))
            .and_then(|(offset, bytes)| {
                let at = usize::try_from(start - offset).ok()?;
                (at <= bytes.len()).then(|| bytes.slice(at..))
            })
            .ok_or_else(|| {
                ParquetError::General(format!(
                    "byte {start} of a remote Parquet file was not fetched for this read"
                ))
            })
    }
}

impl Length for ChunkBytes {
    fn len(&self) -> u64 {
        match self {
            ChunkBytes::Local(file) => Length::len(file),
            ChunkBytes::Sparse { len, .. } => *len,
        }
    }
}

impl ChunkReader for ChunkBytes {
    type T = Box<dyn Read + Send>;

    /// A reader that fails at the end of the bytes instead of reading nothing: a page header
    /// that runs past the file is an error at once (the parquet crate's header parser treats
    /// an empty read as a field of no bytes, and a crafted header then loops for minutes).
    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            ChunkBytes::Local(file) => Ok(Box::new(NoReadPastEnd(file.get_read(start)?))),
            ChunkBytes::Sparse { chunks, .. } => Ok(Box::new(NoReadPastEnd(std::io::Cursor::new(
                Self::from(chunks, start)?,
            )))),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            ChunkBytes::Local(file) => file.get_bytes(start, length),
            ChunkBytes::Sparse { chunks, .. } => {
                let bytes = Self::from(chunks, start)?;
                if bytes.len() < length {
                    return Err(ParquetError::General(format!(
                        "bytes {start}..{} of a remote Parquet file were not fetched for this \
                         read",
                        start + length as u64
                    )));
                }
                Ok(bytes.slice(..length))
            }
        }
    }
}

/// A reader whose end is an error: a read that would return no byte fails instead.
struct NoReadPastEnd<R>(R);

impl<R: Read> Read for NoReadPastEnd<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let read = self.0.read(out)?;
        if read == 0 && !out.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end of the Parquet file",
            ));
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn reads_past_the_end_of_the_bytes_are_errors_for_local_and_fetched_files() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let path = dir.path().join("data.parquet");
        std::fs::write(&path, b"0123456789").expect("a file");
        let local = ChunkBytes::Local(File::open(&path).expect("the file"));
        let fetched = ChunkBytes::sparse(10, vec![(4, b"456789".to_vec())]);
        for bytes in [local, fetched] {
            let mut read = bytes.get_read(6).expect("a reader");
            let mut out = [0u8; 8];
            assert_eq!(read.read(&mut out).expect("the last four bytes"), 4);
            assert_eq!(&out[..4], b"6789");
            let error = read.read(&mut out).expect_err("the end");
            assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
            assert!(error
                .to_string()
                .contains("read past the end of the Parquet file"));
        }
    }
}
