//! The worker's error type (bad pipelines, bad samples, failures of the libraries below) and the
//! kind of each ([`ErrorKind`], defined in `stoker-proto` with the wire that carries it).

use std::path::PathBuf;

pub use stoker_proto::{ErrorKind, ERROR_KINDS};

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

/// The kind of a failure to open a dataset: a missing path is `NotFound`, a bad URI an
/// invalid argument, anything else a dataset error.
pub fn kind_of_opening(error: &stoker_datasets::Error) -> ErrorKind {
    use stoker_datasets::Error as DatasetError;
    match error {
        DatasetError::RootNotFound(_)
        | DatasetError::NoMatch { .. }
        | DatasetError::ListedFileMissing { .. } => ErrorKind::NotFound,
        DatasetError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            ErrorKind::NotFound
        }
        // A file outside a worker's data roots (a link among a dataset's files), or one the
        // worker may not read.
        DatasetError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            ErrorKind::PermissionDenied
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
        DatasetError::ShardSet { .. } => ErrorKind::Dataset,
        _ => ErrorKind::Dataset,
    }
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidSpec(_) => ErrorKind::InvalidArgument,
            Error::OpenDataset(error) => kind_of_opening(error),
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
    /// The bytes are of a format Stoker decodes, in a kind of it its decoder does not read (a
    /// palette, YCbCr, planar or gray-with-alpha TIFF, say), which PIL may read.
    #[error("an image of a kind Stoker does not decode: {0}")]
    UnsupportedKind(String),
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
    /// Resized to its shorter side, the image's longer side would pass `u32::MAX` pixels.
    #[error(
        "image of {width}x{height} resized to a shorter side of {size} would be over \
         4,294,967,295 pixels long"
    )]
    TooElongated {
        /// Width from the header.
        width: u32,
        /// Height from the header.
        height: u32,
        /// The shorter side asked for.
        size: u32,
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
