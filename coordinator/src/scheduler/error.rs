//! The coordinator's error type: every refusal names the id or value at fault.

use super::ids::{JobId, LeaseId, SessionId, Step, WorkerId};

/// Why the coordinator refused a call, or could not reach its journal.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// No job with this id was ever registered (or the journal did not hold it).
    #[error("unknown {0}")]
    UnknownJob(JobId),
    /// No worker with this id was ever registered.
    #[error("unknown {0}")]
    UnknownWorker(WorkerId),
    /// The worker missed its heartbeats and was dropped; it must register again.
    #[error("{0} expired (no heartbeat within the lease timeout); register again")]
    WorkerExpired(WorkerId),
    /// No session with this id was ever opened.
    #[error("unknown {0}")]
    UnknownSession(SessionId),
    /// The session was closed.
    #[error("{0} is closed")]
    SessionClosed(SessionId),
    /// The lease id was never issued.
    #[error("unknown {0}")]
    UnknownLease(LeaseId),
    /// The lease is live but belongs to another worker.
    #[error("{lease} is held by {holder}, not {caller}")]
    LeaseNotHeld {
        /// The lease.
        lease: LeaseId,
        /// The worker that holds it.
        holder: WorkerId,
        /// The worker that reported on it.
        caller: WorkerId,
    },
    /// A credit grant of zero, or one that would take the session past the limit.
    #[error(
        "{session}: cannot grant {granted} credits with {held} held (must be 1..={limit} in all)"
    )]
    InvalidCredits {
        /// The session.
        session: SessionId,
        /// Credits asked for.
        granted: u64,
        /// Credits the session already holds.
        held: u64,
        /// Most credits a session may hold.
        limit: u64,
    },
    /// A step at or past the end of the epoch.
    #[error("{step} is past the end of the epoch ({steps_per_epoch} steps)")]
    StepOutOfRange {
        /// The step asked for.
        step: Step,
        /// Steps in each epoch of the job.
        steps_per_epoch: u64,
    },
    /// A rank outside the job's world.
    #[error("rank {rank} is outside {job}'s world of {world_size}")]
    RankOutOfRange {
        /// The job.
        job: JobId,
        /// The rank asked for.
        rank: u32,
        /// Ranks in the job.
        world_size: u32,
    },
    /// A new session while [`CoordinatorConfig::max_sessions`](super::CoordinatorConfig) are
    /// open.
    #[error(
        "too many open sessions ({limit}, the coordinator's --max-sessions): close sessions \
         or wait for silent ones to time out"
    )]
    TooManySessions {
        /// Most sessions open at once.
        limit: usize,
    },
    /// An argument that makes no sense (zero steps per epoch, zero tasks asked for...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The journal (redb) failed. Boxed: redb's error is large and this path is rare.
    #[error("coordinator journal: {0}")]
    Journal(Box<redb::Error>),
    /// The journal file is damaged in a way its database only met by panicking (a file cut
    /// short: a partial copy or restore).
    #[error(
        "coordinator journal {path} is damaged ({problem}): restore it from a whole copy, or \
         move it away to start with an empty journal"
    )]
    JournalDamaged {
        /// The journal file.
        path: std::path::PathBuf,
        /// What the database said.
        problem: String,
    },
    /// The state directory could not be created.
    #[error("coordinator state directory {path}: {source}")]
    StateDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// An entry of the journal's position log did not decode.
    #[error("the coordinator journal's position log entry {entry} does not decode")]
    CorruptPositions {
        /// The entry's key.
        entry: u64,
    },
    /// A job spec in the journal did not decode.
    #[error("journaled spec of {job} does not decode: {source}")]
    CorruptSpec {
        /// The job.
        job: JobId,
        /// The cause.
        source: prost::DecodeError,
    },
}

/// The coordinator's result type.
pub type CoordinatorResult<T> = std::result::Result<T, CoordinatorError>;

/// Turns any of redb's error types into a [`CoordinatorError::Journal`].
pub(crate) fn journal_error(error: impl Into<redb::Error>) -> CoordinatorError {
    CoordinatorError::Journal(Box::new(error.into()))
}
