//! The GPU decode lane: beside the CPU decode threads, below the seam, the hardware JPEG
//! engines decode some rows of each image batch and one batched kernel crops, resizes and
//! flips them on the GPU.
//!
//! Which rows go to the GPU is a number of sixteenths of the batch, spread evenly over its rows
//! ([`gpu_row`]), never a matter of timing, so a batch's bits depend only on the split.
//! `decode="gpu"` sends every row; `"auto"` starts at half and may change its split only at
//! fixed points (each epoch's first step and every [`AUTO_POINT_STEPS`] steps after), following
//! what the lanes did before ([`SplitSchedule`]); the split is part of the resume state. The
//! decode threads read every sample, draw its window and flip from its RNG as always, and
//! offer the rows of the GPU's share to the lane
//! ([`stoker_pipeline::ImageDiverter`]); an image the engines cannot take, or whose frame
//! nvJPEG's own parse reads otherwise than the decode threads did (see [`jpeg_scan`]), or too
//! large for the lane's memory is built on the CPU instead, in the same batch, as is one whose
//! decode fails nvJPEG's strict check or leaves its place unwritten (`lane/pipe/`). With
//! [`ROI_VARIABLE`] set, the hardware engines decode only the part of each image its crop
//! window covers (`region`).
//!
//! The lane's rows stay on the GPU: a batch built with the lane carries them beside the bytes
//! of its slot ([`DeviceRows`], in `Batch::device_rows`), and the device stage merges them
//! into the device batch after copying the slot's rows; with [`FUSED_TAIL_VARIABLE`] set the
//! lane's kernel has already applied the stage's tail to them ([`RowTail`]). Device memory is
//! the lane's own, allocated up front within `gpu_memory` bytes and never grown.

mod backend;
pub mod helper;
#[cfg(test)]
pub(crate) mod hostile;
mod jpeg_scan;
mod kernel;
#[cfg(test)]
mod kernel_host;
mod lane;
mod libraries;
mod nvjpeg;
mod region;
mod split;
mod tail;

use std::path::PathBuf;

pub use backend::StartGpuLane;
pub use helper::{helper_asked, HelperLane, HelperOptions, HELPER_BINARY, HELPER_VARIABLE};
#[cfg(feature = "fuzzing")]
pub(crate) use jpeg_scan::{
    accept, documented_reading, scan, Frame, Placement, MAX_SIDE as MAX_JPEG_SIDE,
};
pub use jpeg_scan::{hardware_candidate, Decline};
pub use kernel::{compile as compile_kernel, Compiled, CropItem, KERNEL, SOURCE as KERNEL_SOURCE};
pub use lane::{
    served_pinned_limit, DeviceRows, GpuLane, LaneItem, LaneStats, LaneTask, RowsBuilt, RowsTask,
    ServedHandles, IPC_HANDLE_BYTES,
};
pub use libraries::search_dirs as cuda_library_dirs;
pub use nvjpeg::{version as nvjpeg_version, TESTED_MAJORS as NVJPEG_TESTED_MAJORS};
#[cfg(feature = "fuzzing")]
pub(crate) use region::region_for;
pub use region::{roi_asked, ROI_VARIABLE};
pub use split::{
    gpu_row, pinned_split, split_for_rates, LaneCounts, SplitSchedule, AUTO_POINT_STEPS,
    AUTO_START, PIN_VARIABLE as SPLIT_PIN_VARIABLE,
};
pub use tail::{fused_tail_asked, Element, RowTail, TailParams, FUSED_TAIL_VARIABLE};

/// Whether `value` (switch `variable`'s, if set) turns it on; after trimming, anything but
/// `0`, `1` or empty (read as `0`) is an error naming the variable.
fn switch_asked(variable: &str, value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("{variable} must be 0 or 1, got {other:?}")),
    }
}

/// Where image rows are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeMode {
    /// Every row on the CPU threads.
    Cpu,
    /// Every row the engines take on the GPU lane.
    Gpu,
    /// Split between the two, changed only at fixed points, following what each split gave.
    Auto,
}

/// The lane's device memory when none is asked for: decoded images in flight, the rows
/// waiting for the training loop, and what nvJPEG allocates through the lane's allocators, all
/// within it (the hardware decoder's own buffers are outside it).
pub const DEFAULT_GPU_MEMORY: usize = 1 << 30;

/// How the GPU decode lane is asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDecodeOptions {
    /// `Gpu` or `Auto` (`Cpu` asks for no lane).
    pub mode: DecodeMode,
    /// CUDA device ordinal.
    pub device: usize,
    /// The most device memory the lane holds, in bytes.
    pub memory_bytes: usize,
    /// Folders to look in first for nvJPEG and NVRTC (see [`cuda_library_dirs`]).
    pub library_dirs: Vec<PathBuf>,
    /// The process's pinned budget (`stoker_loader::PinnedShare`) the lane's page-locked
    /// memory counts against, beside the slot pools: its pipes' staging, taken as it starts,
    /// and nvJPEG's pinned buffers, as nvJPEG allocates them (refused past the budget, which
    /// sends those images to the CPU). `None`: not counted.
    pub pinned_budget: Option<u64>,
    /// What the device stage makes of the rows after the lane (normalise, dtype, layout):
    /// applied by the lane's kernel when [`FUSED_TAIL_VARIABLE`] asks, else the rows stay
    /// uint8 NHWC ([`RowTail::BYTES`]) and the stage applies it.
    pub tail: RowTail,
    /// Runs the lane in a helper process of its own ([`HelperLane`]); `None`: in this process.
    pub helper: Option<HelperOptions>,
}

/// Why the lane cannot run here; the message names what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuDecodeError {
    /// A CUDA library cannot be loaded, or is a version Stoker was not tested with.
    #[error("{library}: {problem}")]
    Library {
        /// Which library.
        library: &'static str,
        /// What went wrong.
        problem: String,
    },
    /// A call failed.
    #[error("{call} failed: {error}")]
    Call {
        /// Which call.
        call: &'static str,
        /// Its error.
        error: String,
    },
    /// The kernel did not compile or load.
    #[error("the crop kernel: {0}")]
    Kernel(String),
    /// The CUDA driver is missing or refused.
    #[error("{0}")]
    Cuda(String),
    /// The memory cap leaves too little for the lane.
    #[error("{0}")]
    Memory(String),
    /// The job cannot use the lane.
    #[error("{0}")]
    Unsupported(String),
    /// The CUDA context broke (an error CUDA keeps for every later call of the context, a
    /// kernel's fault, met by a sync after a failed call), so the batch fails rather than go
    /// to the CPU image by image.
    #[error(
        "the GPU decode lane's CUDA context broke ({0}): every later CUDA call in that context \
         fails (decode=\"cpu\" avoids the GPU lane)"
    )]
    Broken(String),
}
