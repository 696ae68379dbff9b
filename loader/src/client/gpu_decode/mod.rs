//! The GPU decode lane: beside the CPU decode threads, below the seam, the hardware JPEG
//! engines decode some rows of each image batch and one batched kernel crops, resizes and
//! flips them on the GPU.
//!
//! Which rows go to the GPU is fixed per epoch ([`DecodeSplit`]): a number of sixteenths of the
//! batch, spread evenly over its rows ([`gpu_rows`]), never a matter of timing, so a batch's
//! bits depend only on the split. `decode="gpu"` sends every row; `"auto"` starts at half and,
//! at each new epoch, follows the rates the two lanes showed before it; the split of each epoch
//! is part of the resume state. The decode threads read every sample, draw its window and flip
//! from its RNG as always, and offer the rows of the GPU's share to the lane
//! ([`stoker_worker::ImageDiverter`]); an image the engines cannot take (see [`jpeg_scan`]) or
//! too large for the lane's memory is built on the CPU instead, in the same batch.
//!
//! The lane's rows stay on the GPU: a batch built with the lane carries them beside its slot
//! ([`DeviceRows`], attached to the slot), and the device stage merges them into the device
//! batch after copying the slot's rows. Device memory is the lane's own, allocated up front
//! within `gpu_memory` bytes and never grown.

mod jpeg_scan;
mod kernel;
mod lane;
mod libraries;
mod nvjpeg;

use std::path::PathBuf;

pub use jpeg_scan::{hardware_candidate, Decline};
pub use kernel::{compile as compile_kernel, Compiled, CropItem, KERNEL, SOURCE as KERNEL_SOURCE};
pub use lane::{DeviceRows, GpuLane, LaneStats, LaneTask, LaneView};
pub use libraries::search_dirs as cuda_library_dirs;
pub use nvjpeg::{version as nvjpeg_version, TESTED_MAJORS as NVJPEG_TESTED_MAJORS};

/// Where image rows are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeMode {
    /// Every row on the CPU threads.
    Cpu,
    /// Every row the engines take on the GPU lane.
    Gpu,
    /// Split between the two by their measured rates, changed only at epoch starts.
    Auto,
}

/// The lane's device memory when none is asked for: decoded images in flight, the rows
/// waiting for the training loop, and nvJPEG's own buffers, all within it.
pub const DEFAULT_GPU_MEMORY: usize = 1 << 30;

/// The split `auto` starts from, in sixteenths of a batch for the GPU.
pub const AUTO_START: u8 = 8;

/// How the GPU decode lane is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDecodeOptions {
    /// `Gpu` or `Auto` (`Cpu` asks for no lane).
    pub mode: DecodeMode,
    /// CUDA device ordinal.
    pub device: usize,
    /// The most device memory the lane holds, in bytes.
    pub memory_bytes: usize,
    /// Folders to look in first for nvJPEG and NVRTC (see [`cuda_library_dirs`]).
    pub library_dirs: Vec<PathBuf>,
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
}

/// Whether row `row` of a batch goes to the GPU when `sixteenths` of 16 do: the rows are
/// spread evenly (row `r` is the GPU's when `floor((r + 1) s / 16) > floor(r s / 16)`), so
/// each part of a batch is split alike and the count is `floor(len s / 16)`.
pub fn gpu_row(row: usize, sixteenths: u8) -> bool {
    let s = usize::from(sixteenths.min(16));
    (row + 1) * s / 16 > row * s / 16
}

/// The split that gives each lane rows in proportion to its rate (rows per second), in
/// sixteenths, kept within 1..=15 while both lanes run, so neither rate goes unmeasured.
pub fn split_for_rates(cpu_rows_per_s: f64, gpu_rows_per_s: f64) -> u8 {
    if !(cpu_rows_per_s.is_finite() && gpu_rows_per_s.is_finite())
        || cpu_rows_per_s <= 0.0
        || gpu_rows_per_s <= 0.0
    {
        return AUTO_START;
    }
    let share = gpu_rows_per_s / (cpu_rows_per_s + gpu_rows_per_s);
    (share * 16.0).round().clamp(1.0, 15.0) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_spread_evenly_and_counted_exactly() {
        for sixteenths in 0..=16u8 {
            for len in [1usize, 7, 16, 100, 256] {
                let count = (0..len).filter(|&r| gpu_row(r, sixteenths)).count();
                assert_eq!(
                    count,
                    len * usize::from(sixteenths) / 16,
                    "{sixteenths} {len}"
                );
            }
        }
        let half: Vec<bool> = (0..8).map(|r| gpu_row(r, 8)).collect();
        assert_eq!(half, [false, true, false, true, false, true, false, true]);
        assert!((0..256).all(|r| gpu_row(r, 16)));
        assert!((0..256).all(|r| !gpu_row(r, 0)));
    }

    #[test]
    fn the_split_follows_the_rates_and_keeps_both_lanes() {
        assert_eq!(split_for_rates(1000.0, 1000.0), 8);
        assert_eq!(split_for_rates(1000.0, 3000.0), 12);
        assert_eq!(split_for_rates(1.0, 1e9), 15);
        assert_eq!(split_for_rates(1e9, 1.0), 1);
        assert_eq!(split_for_rates(0.0, 5.0), AUTO_START);
        assert_eq!(split_for_rates(f64::NAN, 5.0), AUTO_START);
    }
}
