//! The loader's error type.

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
    #[error("timed out after {waited:?} waiting for epoch {epoch} step {step} (rank {rank}); {in_flight} batches in flight on {threads} threads")]
    Timeout {
        /// Epoch waited for.
        epoch: u64,
        /// Step waited for.
        step: u64,
        /// Rank.
        rank: u32,
        /// How long.
        waited: Duration,
        /// Batches being produced at the time.
        in_flight: usize,
        /// Decode threads.
        threads: usize,
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
    /// The coordinator or a worker refused a request or could not be reached in time; the
    /// message says which and why.
    #[error("distributed mode: {0}")]
    Remote(String),
    /// `next()` in distributed mode waited past its deadline.
    #[error("timed out after {waited:?} waiting for epoch {epoch} step {step} (rank {rank}) from the workers of coordinator {coordinator}")]
    RemoteTimeout {
        /// Epoch waited for.
        epoch: u64,
        /// Step waited for.
        step: u64,
        /// Rank.
        rank: u32,
        /// How long.
        waited: Duration,
        /// The coordinator's address.
        coordinator: String,
    },
    /// A thread pool could not be built.
    #[error("cannot start decode threads: {0}")]
    Threads(String),
}

/// Result alias for the loader crate.
pub type Result<T> = std::result::Result<T, Error>;
