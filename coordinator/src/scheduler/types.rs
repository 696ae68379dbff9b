//! The coordinator core's settings and the values its calls return.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::ids::{LeaseId, SessionId, Step, TaskKey, WorkerId};

/// Tuning of a [`Coordinator`](super::Coordinator).
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// A worker whose last heartbeat is older than this is dead, and its leases with it.
    pub lease_timeout: Duration,
    /// Acknowledgements between two journal writes of the acknowledged positions.
    pub journal_every: u64,
    /// Most credits one session may hold.
    pub max_credits: u32,
    /// Most tasks one `lease` call may return.
    pub max_lease_batch: usize,
    /// Most sessions open at once (reopening an open session does not count again); a new one
    /// past it is refused until one closes or times out.
    pub max_sessions: usize,
    /// Largest weight a job may be given: a job asking for more gets this much (see
    /// [`Coordinator::set_job_weight`](super::Coordinator::set_job_weight)); at most
    /// [`MAX_JOB_WEIGHT`].
    pub max_job_weight: u32,
    /// A job none of whose ranks has had a session open for this long is forgotten (its spec,
    /// weight and positions leave memory and the journal; see
    /// [`Coordinator::idle_jobs`](super::Coordinator::idle_jobs)); `None` keeps every job.
    pub job_retention: Option<Duration>,
}

/// The largest `max_job_weight` there is: a lease advances a job's pass by 2^20 / weight, and
/// at this weight that is still 16, so shares keep their proportions.
pub const MAX_JOB_WEIGHT: u32 = 1 << 16;

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            lease_timeout: Duration::from_secs(10),
            journal_every: 1024,
            max_credits: 65_536,
            max_lease_batch: 4096,
            max_sessions: 65_536,
            max_job_weight: 8,
            job_retention: Some(Duration::from_secs(24 * 3600)),
        }
    }
}

/// One task leased to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The batch to produce.
    pub task: TaskKey,
    /// The session (client stream) to send it to.
    pub session: SessionId,
    /// The session's opening this lease was made in (bumped by each reopen).
    pub opening: u32,
    /// What the worker quotes when it reports completion or failure.
    pub lease_id: LeaseId,
    /// When the lease dies unless the worker heartbeats before (heartbeats extend it).
    pub deadline: Instant,
}

/// What a worker's report on a lease did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The report was applied.
    Applied,
    /// The lease had already expired (its task was requeued, maybe redone) or its session was
    /// reopened: the report was ignored and counted as a duplicate.
    Stale,
}

/// What an acknowledgement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Recorded; the session's acknowledged position is `position`.
    Recorded {
        /// Every step below this was acknowledged.
        position: Step,
    },
    /// The step was already acknowledged; ignored and counted.
    Duplicate,
}

/// What [`Coordinator::expire`](super::Coordinator::expire) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpireReport {
    /// Workers dropped for missing their heartbeats.
    pub workers: Vec<WorkerId>,
    /// Tasks of theirs put back in their sessions' queues.
    pub requeued_tasks: u64,
}

/// Counters and sizes, for logs, the dashboard and the bench.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Jobs registered (journaled).
    pub jobs: u64,
    /// Live workers.
    pub workers: u64,
    /// Open sessions.
    pub sessions: u64,
    /// Sessions opened since start, reopens included: more than one per rank and epoch means
    /// clients reopened (a lost stream, a stall).
    pub session_opens: u64,
    /// Tasks waiting for a lease (steps not yet handed out plus requeued ones).
    pub queued_tasks: u64,
    /// Live leases.
    pub leased_tasks: u64,
    /// Tasks leased since start (a redone task counts again).
    pub assignments: u64,
    /// Completions reported.
    pub completions: u64,
    /// Acknowledgements recorded (duplicates excluded).
    pub acknowledgements: u64,
    /// Duplicate acknowledgements and stale lease reports ignored.
    pub duplicates_dropped: u64,
    /// Leases that died with their worker.
    pub expired_leases: u64,
    /// Leases a worker still held when it left on purpose.
    pub returned_leases: u64,
    /// Leases the worker reported failed.
    pub failed_leases: u64,
    /// Journal transactions committed.
    pub journal_commits: u64,
    /// Jobs forgotten after their retention with no session open.
    pub jobs_retired: u64,
    /// Estimated bytes held by the coordinator's data structures (from their capacities).
    pub memory_bytes: u64,
}

/// Where a (job, rank, epoch) stands, as journaled.
pub(crate) type PositionKey = (u64, u32, u64);

/// A job as journaled.
pub(crate) struct JournaledJob {
    pub id: u64,
    pub steps_per_epoch: u64,
    pub spec: Vec<u8>,
}

/// What a journal held when it was opened: the state a core is restored from
/// ([`Coordinator::restore`](super::Coordinator::restore)).
pub(crate) struct JournalContents {
    pub jobs: Vec<JournaledJob>,
    pub positions: HashMap<PositionKey, u64>,
    /// Weights of the jobs given one.
    pub weights: HashMap<u64, u32>,
    /// What a worker described of each job when it was registered (an encoded
    /// `DescribeJobResponse`; none for a job of an older journal).
    pub descriptions: HashMap<u64, Vec<u8>>,
}
