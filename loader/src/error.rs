//! The loader's error type. Its kinds ([`ErrorKind`], defined in `stoker-proto`) are the same
//! whether the error happened in this process or came back from a daemon over gRPC.

use std::time::Duration;

pub use stoker_proto::{ErrorKind, ERROR_KINDS};

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
    Worker(#[from] stoker_pipeline::Error),
    /// The token or TLS settings cannot be used.
    #[error(transparent)]
    Security(#[from] stoker_rpc::security::SecurityError),
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
        /// What the batches come from ("on 4 decode threads", "from the workers of ..."), and
        /// the files being read where the source can tell.
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
    #[error("no worker has served job {job} (coordinator {coordinator}) for {unserved:?}, longer than the worker grace of {grace:?}: {cause}")]
    WorkerUnavailable {
        /// The job's name at the coordinator.
        job: String,
        /// The coordinator's address.
        coordinator: String,
        /// How long no worker has served it.
        unserved: Duration,
        /// The grace period it passed.
        grace: Duration,
        /// Why, and what to do: no worker stream open, or the coordinator not answering.
        cause: String,
    },
    /// A thread pool could not be built.
    #[error("cannot start decode threads: {0}")]
    Threads(String),
    /// The GPU stage asked for cannot run: no CUDA driver or device, or page-locked slots that
    /// do not fit the pinned budget; the message names what is missing.
    #[error("{0}")]
    Gpu(String),
}

/// Result alias for the loader crate.
pub type Result<T> = std::result::Result<T, Error>;

impl From<stoker_rpc::transport::BadAddress> for Error {
    /// An address no channel can be made to is a setting of the job to fix.
    fn from(error: stoker_rpc::transport::BadAddress) -> Self {
        Error::InvalidSpec(error.to_string())
    }
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidSpec(_) | Error::Security(_) => ErrorKind::InvalidArgument,
            Error::Dataset(error) => stoker_pipeline::kind_of_opening(error),
            Error::Worker(error) => error.kind(),
            Error::Timeout { .. } | Error::SlotsHeld { .. } => ErrorKind::Timeout,
            Error::Interrupted => ErrorKind::Interrupted,
            Error::WorkerUnavailable { .. } => ErrorKind::WorkerUnavailable,
            Error::Remote { kind, .. } => *kind,
            Error::Stopped(_) | Error::Threads(_) | Error::Gpu(_) => ErrorKind::Internal,
        }
    }
}

/// The error a status from a daemon stands for, with the kind the daemon gave it; `context` says
/// which call failed.
pub(crate) fn error_from_status(context: &str, status: &tonic::Status) -> Error {
    Error::Remote {
        kind: stoker_rpc::error_kinds::kind_of_status(status),
        context: context.to_string(),
        message: status.message().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_rpc::error_kinds::status;

    #[test]
    fn every_kind_survives_the_wire() {
        for kind in ERROR_KINDS {
            let error = error_from_status("call", &status(kind, "why"));
            assert_eq!(error.kind(), kind);
            assert_eq!(error.to_string(), "call: why");
        }
        let bare = error_from_status("call", &tonic::Status::data_loss("corrupt"));
        assert_eq!(bare.kind(), ErrorKind::Decode);
    }
}
