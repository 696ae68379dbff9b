//! The worker's error type: bad pipelines, bad samples, and failures of the libraries below.

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
}

/// Result alias for the worker crate.
pub type Result<T> = std::result::Result<T, Error>;

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
    /// The bytes are not a JPEG or PNG image.
    #[error("not a JPEG or PNG image")]
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
