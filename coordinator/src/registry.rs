//! What the coordinator's service records of the workers and clients it has heard from: a
//! leaf both the service (which writes the records) and the dashboard feed (which reads them)
//! import, so neither imports the other.

use std::time::Instant;

use stoker_proto::v1::ClientStats;

/// A registered worker as the daemon knows it.
#[derive(Debug, Clone)]
pub struct WorkerEntry {
    /// Id in the core.
    pub id: u64,
    /// Where clients reach its data server.
    pub data_address: String,
    /// Its process's random instance (0: not said).
    pub instance: u64,
    /// Its decode threads.
    pub threads: u32,
    /// Its `--data-root` folders.
    pub data_roots: Vec<String>,
    /// When it registered.
    pub registered_at: Instant,
    /// Leases it reported completed.
    pub completed: u64,
    /// Leases it reported failed.
    pub failed: u64,
    /// Samples it replaced under the skip policy.
    pub bad_samples: u64,
    /// Nanoseconds it reported having a batch in production.
    pub busy_ns: u64,
}

/// The latest figures a client reported for one (job, rank).
#[derive(Debug, Clone)]
pub struct ClientEntry {
    /// The job.
    pub job: u64,
    /// The rank.
    pub rank: u32,
    /// The epoch of the session that reported.
    pub epoch: u64,
    /// Cumulative figures as reported.
    pub stats: ClientStats,
    /// Every step below this is acknowledged.
    pub acknowledged_position: u64,
    /// Steps in the epoch.
    pub steps_per_epoch: u64,
    /// When the report came.
    pub at: Instant,
    /// The session that sent it.
    pub session: u64,
}
