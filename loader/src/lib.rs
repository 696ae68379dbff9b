//! Stoker's loader: the client side of the service. One [`Loader`] over one [`BatchSource`]
//! seam (the embedded producer or the remote client), the slots batches land in, the prefetch
//! controller and the stall figures, which the stall [`Dashboard`] (`stoker-dashboard`,
//! re-exported here) shows. The `stoker` command-line tool with its bench harnesses
//! (`stoker-cli`) and the Python extension sit on top of it.
//!
//! Jobs and their epoch plans come from `stoker-pipeline`; the loader runs them in process or
//! asks the workers of a coordinator for their batches, and yields them in step order.
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
/// The fuzz targets' bodies (`fuzz/`), behind the `fuzzing` feature: the fuzz crate and this
/// crate's corpus replay tests turn it on; a build for users leaves them out.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz_targets;

pub use client::cuda::{
    active_devices as cuda_active_devices, check_device as cuda_check_device,
    driver_present as cuda_driver_present, Cuda, Fence, Sweep, Unavailable as CudaUnavailable,
};
pub use client::embedded::EmbeddedSource;
pub use client::gpu_decode::{
    compile_kernel, cuda_library_dirs, gpu_row, hardware_candidate, nvjpeg_version,
    split_for_rates, Compiled, CropItem, Decline, DecodeMode, DeviceRows, GpuDecodeError,
    GpuDecodeOptions, GpuLane, LaneStats, LaneView, AUTO_POINT_STEPS, AUTO_START,
    DEFAULT_GPU_MEMORY, KERNEL, KERNEL_SOURCE, NVJPEG_TESTED_MAJORS,
};
pub use client::landing;
pub use client::loader::{Loader, LoaderOptions, PinOptions};
pub use client::prefetch::{
    ChangeReason, ControllerConfig, ControllerSnapshot, PrefetchController,
};
pub use client::remote::updates as session_updates;
pub use client::remote::{RemoteOptions, RemoteSource};
pub use client::slots::{Attachment, PinDevice, PinnedPoolError, SharedMemory, Slot, SlotPool};
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
/// The shared token of the distributed mode (see [`RemoteOptions::token`]).
pub use stoker_rpc::security::Token;
