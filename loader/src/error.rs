//! The loader's error type, and the kinds its errors fall into: the same kinds whether the error
//! happened in this process or came back from a daemon over gRPC, so callers (and Python's
//! exception classes) can tell a missing dataset from a corrupt sample in both modes.

use std::time::Duration;

/// Everything that can stop the loader from yielding a batch.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The job spec is not usable; the message names the field.
    #[error("invalid job spec: {0}")]
    InvalidSpec(String),
    /// The dataset could not be opened.
    #[error(transparent)]
    Dataset(#[from] stoker_datasets::Error),
    /// A worker-side failure (bad pipeline, bad sample under the fail policy).
    #[error(transparent)]
    Worker(#[from] stoker_worker::Error),
    /// `next()` waited past its deadline.
    #[error("timed out after {waited:?} waiting for epoch {epoch} step {step} (rank {rank}); {in_flight} batches in flight {waiting_on}")]
    Timeout {
        /// Epoch waited for.
        epoch: u64,
        /// Step waited for.
        step: u64,
        /// Rank.
        rank: u32,
        /// How long.
        waited: Duration,
        /// Batches asked for and not yet received at the time.
        in_flight: usize,
        /// What the batches come from ("on 4 decode threads", "from the workers of ...").
        waiting_on: String,
    },
    /// Every batch buffer is still referenced by batches the consumer kept.
    #[error("no free batch buffer for step {step} after {waited:?}: all {capacity} are held by batches still referenced (drop old batches, or raise max_held_batches)")]
    SlotsHeld {
        /// Step that could not start.
        step: u64,
        /// Buffers in the pool.
        capacity: usize,
        /// How long.
        waited: Duration,
    },
    /// The caller asked a waiting `next()` to stop (Ctrl-C in Python).
    #[error("interrupted while waiting for a batch")]
    Interrupted,
    /// The loader's threads are gone (a panic in a decode thread, or shutdown).
    #[error("the loader stopped: {0}")]
    Stopped(String),
    /// The coordinator or a worker refused a request or failed it; `kind` is the kind the
    /// daemon gave the error (carried in the status metadata), so it maps like a local one.
    #[error("{context}: {message}")]
    Remote {
        /// The kind of the error at the daemon.
        kind: ErrorKind,
        /// Which call failed, and where.
        context: String,
        /// The daemon's message.
        message: String,
    },
    /// No worker served the job for longer than the worker grace period.
    #[error("no worker has served job {job} (coordinator {coordinator}) for {unserved:?}, longer than the worker grace of {grace:?}; start stoker-worker daemons or raise worker_grace")]
    WorkerUnavailable {
        /// The job's name at the coordinator.
        job: String,
        /// The coordinator's address.
        coordinator: String,
        /// How long no worker has served it.
        unserved: Duration,
        /// The grace period it passed.
        grace: Duration,
    },
    /// A thread pool could not be built.
    #[error("cannot start decode threads: {0}")]
    Threads(String),
}

/// Result alias for the loader crate.
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
    /// Anything else: the loader stopped, a daemon failed internally.
    Internal,
}

/// Every kind.
pub const ERROR_KINDS: [ErrorKind; 11] = [
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
            ErrorKind::Internal => "internal",
        }
    }

    /// The kind named `name`, if it is one.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ERROR_KINDS.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        use stoker_datasets::Error as DatasetError;
        use stoker_worker::Error as WorkerError;
        match self {
            Error::InvalidSpec(_) | Error::Worker(WorkerError::InvalidSpec(_)) => {
                ErrorKind::InvalidArgument
            }
            Error::Dataset(DatasetError::RootNotFound(_)) => ErrorKind::NotFound,
            Error::Dataset(DatasetError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                ErrorKind::NotFound
            }
            Error::Dataset(DatasetError::NotADirectory(_)) => ErrorKind::NotADirectory,
            Error::Dataset(DatasetError::UnsupportedScheme { .. })
            | Error::Dataset(DatasetError::InvalidUri { .. }) => ErrorKind::InvalidArgument,
            Error::Dataset(_) | Error::Worker(WorkerError::Dataset(_) | WorkerError::Io { .. }) => {
                ErrorKind::Dataset
            }
            Error::Worker(WorkerError::InvalidPipeline(_)) => ErrorKind::Pipeline,
            Error::Worker(WorkerError::BadSample { .. }) => ErrorKind::Decode,
            Error::Timeout { .. } | Error::SlotsHeld { .. } => ErrorKind::Timeout,
            Error::Interrupted => ErrorKind::Interrupted,
            Error::WorkerUnavailable { .. } => ErrorKind::WorkerUnavailable,
            Error::Remote { kind, .. } => *kind,
            Error::Stopped(_) | Error::Threads(_) => ErrorKind::Internal,
        }
    }
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
