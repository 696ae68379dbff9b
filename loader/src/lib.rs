//! Stoker's loader: the client side of the service. One [`Loader`] over one [`BatchSource`]
//! seam (the embedded producer or the remote client), the slots batches land in, the prefetch
//! controller and the stall figures, which the stall [`Dashboard`] (`stoker-dashboard`,
//! re-exported here) shows. The `stoker` command-line tool with its bench harnesses
//! (`stoker-cli`) and the Python extension sit on top of it.
//!
//! Jobs and their epoch plans come from `stoker-pipeline`; the loader runs them in process or
//! asks the workers of a coordinator for their batches, and yields them in step order. Nothing
//! here talks to a GPU: `stoker-gpu` plugs in through two hooks, the [`PageLocker`] of a pinned
//! slot pool and the [`DecodeLane`] beside the embedded decode threads.
//!
//! ```
//! use stoker_loader::{Error, ErrorKind};
//! let error = Error::InvalidSpec("batch_size must be at least 1".into());
//! assert_eq!(error.kind(), ErrorKind::InvalidArgument);
//! assert_eq!(ErrorKind::from_name(error.kind().as_str()), Some(ErrorKind::InvalidArgument));
//! ```

mod client;
mod digest;
mod error;

pub use client::decode_lane::{DecodeLane, EmbeddedStep, StartDecodeLane};
pub use client::embedded::{build_on_pool, decode_panic, EmbeddedSource};
pub use client::landing;
pub use client::lane_cost::LaneWindow;
pub use client::loader::{Loader, LoaderOptions, PinOptions};
pub use client::prefetch::{
    ChangeReason, ControllerConfig, ControllerSnapshot, PrefetchController,
};
pub use client::remote::updates as session_updates;
pub use client::remote::{RemoteOptions, RemoteSource};
pub use client::slots::{
    pinned_reserved, PageLocker, PinnedPoolError, PinnedShare, SharedMemory, Slot, SlotPool,
};
pub use client::source::{
    receive, BatchSource, Built, EpochFeed, IdleClock, QueueFeed, SourceInfo, StepContext,
    StepTask, TaskQueue,
};
pub use client::stream::{EpochStream, INTERRUPT_CHECK};
pub use digest::BatchDigest;
pub use error::{Error, ErrorKind, Result, ERROR_KINDS};
pub use stoker_dashboard::{
    Dashboard, DashboardAccess, DashboardError, GpuDecodeFigures, JobShare, LoaderMonitor,
    LoaderStats, MonitorSnapshot, MonitorSource, WorkerLoad, COOKIE_LIFETIME,
};
/// The batch as the loader hands it on (built in process or landed off the wire), with its
/// tensors over their slot and any rows a decode lane left on a device.
pub use stoker_pipeline::{Batch, LaneRows, Tensor};
/// The shared token of the distributed mode (see [`RemoteOptions::token`]).
pub use stoker_rpc::security::Token;
