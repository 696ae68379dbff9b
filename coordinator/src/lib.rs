//! Stoker's coordinator for the distributed mode: the scheduling core ([`Coordinator`]:
//! workers, sessions, credits, leases and the journal writes they call for, handed out as
//! intents; no sockets, no I/O, the time passed in), the journal that makes those writes
//! ([`JournalWriter`]; [`Durable`] pairs it with a core for callers that write in place) and the
//! gRPC
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
mod durable;
mod journal;
mod registry;
mod requests;
mod scheduler;
mod service;
#[cfg(test)]
mod service_tests;
mod status;

pub use durable::{Durable, JournalWriter};
pub use journal::JOURNAL_FILE;
pub use registry::{ClientEntry, WorkerEntry};
pub use scheduler::{
    AckOutcome, Coordinator, CoordinatorConfig, CoordinatorError, CoordinatorResult,
    CoordinatorStats, ExpireReport, JobId, JobShareStats, JobWrite, Lease, LeaseId, LeaseOutcome,
    PositionWrite, SessionId, Step, TaskKey, WeightWrite, WorkerId, MAX_JOB_WEIGHT,
};
pub use service::{CoordinatorService, CoordinatorServiceConfig, ServeError, StreamAnswers};
