//! Stoker's loader: the epoch planner, jobs opened from their spec, and the embedded loader that
//! runs a whole pipeline in one process.
//!
//! A batch is a pure function of (job spec, epoch, rank, step): the [`EpochPlan`] says which
//! samples it holds, and `stoker-worker` turns them into tensors with random draws seeded by
//! (seed, epoch, sample index). The embedded [`Loader`] runs that on its own thread pool and
//! yields batches in step order.
//!
//! ```
//! use stoker_loader::{EpochPlan, PlanConfig};
//! use stoker_proto::v1::UnevenTail;
//! let config = PlanConfig {
//!     num_samples: 10, batch_size: 4, seed: 7, shuffle: true, drop_last: false,
//!     rank: 0, world_size: 1, uneven_tail: UnevenTail::Pad, shuffle_window: 0,
//! };
//! let plan = EpochPlan::new(config, 0).unwrap();
//! assert_eq!(plan.steps(), 3);
//! let mut seen: Vec<u64> = (0..3).flat_map(|s| plan.batch_indices(s)).collect();
//! seen.sort();
//! assert_eq!(seen, (0..10).collect::<Vec<_>>());
//! ```

mod client;
mod coordinator;
mod dashboard;
mod digest;
pub mod distributed;
mod error;
mod job;
mod planner;

pub use client::embedded::EmbeddedSource;
pub use client::loader::{Loader, LoaderOptions};
pub use client::monitor::{LoaderMonitor, MonitorSnapshot};
pub use client::prefetch::{
    ChangeReason, ControllerConfig, ControllerSnapshot, PrefetchController,
};
pub use client::remote::{RemoteOptions, RemoteSource};
pub use client::slots::{Slot, SlotPool};
pub use client::source::{BatchSource, Built, EpochFeed, SourceInfo};
pub use client::stats::LoaderStats;
pub use client::stream::{EpochStream, INTERRUPT_CHECK};
pub use coordinator::{
    AckOutcome, Coordinator, CoordinatorConfig, CoordinatorError, CoordinatorResult,
    CoordinatorStats, ExpireReport, JobId, Lease, LeaseId, LeaseOutcome, SessionId, Step, TaskKey,
    WorkerId, JOURNAL_FILE,
};
pub use dashboard::{Dashboard, DashboardError, WorkerLoad};
pub use digest::BatchDigest;
pub use error::{Error, ErrorKind, Result, ERROR_KINDS};
pub use job::{open_source, Job, MAX_BATCH_SIZE};
pub use planner::{EpochPlan, Permutation, PlanConfig};
