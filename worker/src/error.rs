//! The worker's error type (bad pipelines, bad samples, failures of the libraries below), and
//! the kinds Stoker's errors fall into: the same kinds whether an error happened in this process
//! or came back from a daemon over gRPC, so callers (and Python's exception classes) can tell a
//! missing dataset from a corrupt sample in both modes.

use std::path::PathBuf;

/// Everything that can go wrong while turning samples into batches.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The op list cannot be run; the message says which op and why.
    #[error("invalid pipeline: {0}")]
    InvalidPipeline(String),
    /// A job spec field is out of range.
    #[error("invalid job spec: {0}")]
    InvalidSpec(String),
    /// A sample could not be read or decoded (raised under the `fail` policy, or when the
    /// `skip` policy finds no readable substitute).
    #[error("bad sample {index} ({path}): {reason}")]
    BadSample {
        /// Dataset index of the sample.
        index: u64,
        /// Where the sample lives.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The dataset a job names could not be opened.
    #[error(transparent)]
    OpenDataset(stoker_datasets::Error),
    /// The data source failed as a whole (not one sample).
    #[error(transparent)]
    Dataset(#[from] stoker_datasets::Error),
    /// A file the worker needed could not be opened.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The decode thread pool could not be built.
    #[error("cannot start decode threads: {0}")]
    Threads(String),
    /// The worker daemon's server failed.
    #[error("the worker daemon stopped: {0}")]
    Stopped(String),
}

/// Result alias for the worker crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong, as callers tell errors apart. Travels with every error a daemon returns
/// (the `stoker-error-kind` metadata of its gRPC status), so remote errors keep their kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A request or setting is not acceptable (bad spec, out-of-range value).
    InvalidArgument,
    /// A path that does not exist.
    NotFound,
    /// A path that is not a directory where one is needed.
    NotADirectory,
    /// A dataset that cannot be opened, indexed or read.
    Dataset,
    /// A sample that cannot be decoded (under the fail policy).
    Decode,
    /// A pipeline the workers refuse.
    Pipeline,
    /// A wait that passed its deadline.
    Timeout,
    /// A request the daemon is not allowed to serve (a path outside `--data-root`).
    PermissionDenied,
    /// No worker serves the job.
    WorkerUnavailable,
    /// The caller interrupted a wait.
    Interrupted,
    /// A daemon refused the call's token: none was given, or not one it accepts.
    Unauthenticated,
    /// The TLS connection failed: a certificate from an unknown CA or for another name, or one
    /// side speaking TLS and the other plaintext.
    Tls,
    /// Anything else: the loader stopped, a daemon failed internally.
    Internal,
}

/// Every kind.
pub const ERROR_KINDS: [ErrorKind; 13] = [
    ErrorKind::InvalidArgument,
    ErrorKind::NotFound,
    ErrorKind::NotADirectory,
    ErrorKind::Dataset,
    ErrorKind::Decode,
    ErrorKind::Pipeline,
    ErrorKind::Timeout,
    ErrorKind::PermissionDenied,
    ErrorKind::WorkerUnavailable,
    ErrorKind::Interrupted,
    ErrorKind::Unauthenticated,
    ErrorKind::Tls,
    ErrorKind::Internal,
];

impl ErrorKind {
    /// The name it travels as.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotFound => "not_found",
            ErrorKind::NotADirectory => "not_a_directory",
            ErrorKind::Dataset => "dataset",
            ErrorKind::Decode => "decode",
            ErrorKind::Pipeline => "pipeline",
            ErrorKind::Timeout => "timeout",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::WorkerUnavailable => "worker_unavailable",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Tls => "tls",
            ErrorKind::Internal => "internal",
        }
    }

    /// The kind named `name`, if it is one.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ERROR_KINDS.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The kind of a failure to open a dataset: a missing path is `NotFound`, a bad URI an
    /// invalid argument, anything else a dataset error.
    pub fn of_opening(error: &stoker_datasets::Error) -> ErrorKind {
        use stoker_datasets::Error as DatasetError;
        match error {
            DatasetError::RootNotFound(_)
            | DatasetError::NoMatch { .. }
            | DatasetError::ListedFileMissing { .. } => ErrorKind::NotFound,
            DatasetError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                ErrorKind::NotFound
            }
            DatasetError::NotADirectory(_) => ErrorKind::NotADirectory,
            DatasetError::UnsupportedScheme { .. }
            | DatasetError::InvalidUri { .. }
            | DatasetError::BadSourcePattern { .. }
            | DatasetError::FolderInList { .. }
            | DatasetError::MixedFormats { .. }
            | DatasetError::NotADataFile { .. }
            | DatasetError::SplitNeeded { .. }
            | DatasetError::NoSuchSplit { .. } => ErrorKind::InvalidArgument,
            _ => ErrorKind::Dataset,
        }
    }
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidSpec(_) => ErrorKind::InvalidArgument,
            Error::OpenDataset(error) => ErrorKind::of_opening(error),
            Error::Dataset(_) | Error::Io { .. } => ErrorKind::Dataset,
            Error::InvalidPipeline(_) => ErrorKind::Pipeline,
            Error::BadSample { .. } => ErrorKind::Decode,
            Error::Threads(_) | Error::Stopped(_) => ErrorKind::Internal,
        }
    }
}

/// Why one sample could not be turned into pixels. Kept apart from [`Error`] because the
/// bad-input policy decides whether it becomes an error at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    /// The bytes could not be read (missing file, I/O error).
    #[error("unreadable: {0}")]
    Unreadable(String),
    /// The file is empty.
    #[error("empty file")]
    Empty,
    /// The bytes are in no image format Stoker decodes (by their leading bytes).
    #[error("not an image Stoker decodes (JPEG, PNG, WebP, BMP, TIFF, PBM/PGM/PPM or GIF)")]
    UnsupportedFormat,
    /// The decoder rejected the bytes (truncated or corrupt data).
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// A text sample is not UTF-8, or the tokenizer refused it.
    #[error("invalid text: {0}")]
    InvalidText(String),
    /// A token window has another size than the pipeline expects.
    #[error("token window of {found} bytes where {expected} were expected")]
    WindowSize {
        /// Bytes read.
        found: usize,
        /// Bytes of a window of the pipeline's seq_len and the source's dtype.
        expected: usize,
    },
    /// The image has more pixels than the job allows.
    #[error("image of {width}x{height} exceeds the limit of {limit} pixels")]
    TooManyPixels {
        /// Width from the header.
        width: u64,
        /// Height from the header.
        height: u64,
        /// The job's limit.
        limit: u64,
    },
}

/// The message a panic carried (`&str` or `String`), or "unknown panic": for turning a caught
/// panic into an error that names it.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_by_name() {
        for kind in ERROR_KINDS {
            assert_eq!(ErrorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("no such kind"), None);
    }
}
