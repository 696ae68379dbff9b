//! Whose fault a failed read is ([`ReadFault`]): the sample's own, the machine's for a while,
//! or the storage's as a whole; the bad-input policy replaces only the first. With the
//! constructors of the two I/O errors a read makes, on a dataset's file or the cache's.

use std::path::PathBuf;

use super::Error;

/// Whose fault a failed read is: the bad-input policy may replace a sample only for
/// [`ReadFault::Sample`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFault {
    /// The sample's own bytes are missing or wrong (a deleted file, a truncated member, a
    /// malformed record): a bad sample.
    Sample,
    /// The process or the machine ran short of something (descriptors, memory, kernel
    /// buffers): the same read may succeed after a pause.
    Resource,
    /// The storage or the dataset failed as a whole (an I/O error of the device, a full or
    /// stale file system, a file changed under the job): neither the sample's fault nor worth
    /// retrying.
    Source,
}

impl Error {
    /// Whose fault this error is when it comes from reading one sample.
    pub fn read_fault(&self) -> ReadFault {
        match self {
            Error::Io { source, .. } | Error::ShardRead { source, .. } => io_fault(source),
            // Short of descriptors or memory it may pass; anything else is the cache's.
            Error::Cache { source, .. } => match io_fault(source) {
                ReadFault::Resource => ReadFault::Resource,
                _ => ReadFault::Source,
            },
            Error::ParquetFile { source, .. } | Error::ParquetRowGroup { source, .. } => {
                match source {
                    parquet::errors::ParquetError::External(inner) => inner
                        .downcast_ref::<std::io::Error>()
                        .map_or(ReadFault::Sample, io_fault),
                    _ => ReadFault::Sample,
                }
            }
            Error::FileChanged { .. }
            | Error::FileReplaced { .. }
            | Error::FileRemoved { .. }
            | Error::ObjectChanged { .. }
            | Error::CacheLockTimeout { .. }
            | Error::ObjectStore { .. }
            | Error::NoS3Client { .. }
            | Error::Credentials(_)
            | Error::IncompleteObject { .. } => ReadFault::Source,
            _ => ReadFault::Sample,
        }
    }
}

impl Error {
    /// Whether the dataset changed under the job (a file rewritten or replaced, an object of
    /// another version, of another size than listed, or gone since it was listed): every
    /// reader of it sees the change, so no other try, and no other worker, reads the job's
    /// dataset as it was.
    pub fn dataset_changed(&self) -> bool {
        matches!(
            self,
            Error::FileChanged { .. }
                | Error::FileReplaced { .. }
                | Error::FileRemoved { .. }
                | Error::ObjectChanged { .. }
                | Error::IncompleteObject { .. }
                | Error::ObjectStore {
                    source: object_store::Error::NotFound { .. }
                        | object_store::Error::Precondition { .. },
                    ..
                }
        )
    }
}

/// Whose fault a failed system call is; see [`ReadFault`].
pub(crate) fn io_fault(error: &std::io::Error) -> ReadFault {
    if error.kind() == std::io::ErrorKind::OutOfMemory {
        return ReadFault::Resource;
    }
    match error.raw_os_error() {
        Some(
            libc::EMFILE
            | libc::ENFILE
            | libc::ENOMEM
            | libc::ENOBUFS
            | libc::EAGAIN
            | libc::EINTR
            | libc::ENOLCK,
        ) => ReadFault::Resource,
        Some(
            libc::EIO
            | libc::ENOSPC
            | libc::EDQUOT
            | libc::ESTALE
            | libc::ENODEV
            | libc::ENXIO
            | libc::EROFS
            | libc::ETIMEDOUT
            | libc::ENOTCONN
            | libc::EHOSTDOWN
            | libc::EREMOTEIO,
        ) => ReadFault::Source,
        _ => ReadFault::Sample,
    }
}

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Wraps an I/O error on a file of the cache tier ([`Error::Cache`]).
    pub(crate) fn cache(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Cache {
            path: path.into(),
            source,
        }
    }
}
