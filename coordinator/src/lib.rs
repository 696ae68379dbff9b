//! Stoker's coordinator for the distributed mode: the scheduling core ([`Coordinator`]:
//! workers, sessions, credits, leases, the journal; no sockets, its one I/O the journal it
//! holds, the time passed in) and the gRPC
//! daemon around it ([`CoordinatorService`]: worker registry, long-polled leases, timers, job
//! checks, the dashboard feed). The dashboard itself is `stoker_dashboard::Dashboard`, which
//! serves embedded loaders too; `stoker coordinator` (the `stoker-cli` crate) runs this daemon.
//!
//! Control messages go to the coordinator; batches go from a worker straight to the client, on a
//! stream the client opened, against credits the client granted. See the repository's
//! `ARCHITECTURE.md` ("Data plane and control plane") for the contract; the worker daemon is
//! `stoker-worker-daemon`, the wire `stoker-rpc`, the client `stoker-loader`.

mod client_reports;
mod dashboard_feed;
mod registry;
mod requests;
mod scheduler;
mod service;
#[cfg(test)]
mod service_tests;
mod status;

pub use registry::{ClientEntry, WorkerEntry};
pub use scheduler::{
    AckOutcome, Coordinator, CoordinatorConfig, CoordinatorError, CoordinatorResult,
    CoordinatorStats, ExpireReport, JobId, JobShareStats, JobWrite, Lease, LeaseId, LeaseOutcome,
    PositionWrite, SessionId, Step, TaskKey, WeightWrite, WorkerId, JOURNAL_FILE, MAX_JOB_WEIGHT,
};
pub use service::{CoordinatorService, CoordinatorServiceConfig};
