//! What the lane counted: rows by where they were built, its busy time and the decode threads'
//! beside it (what `auto`'s decisions read), and where its threads spent their time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use stoker_dashboard::GpuDecodeFigures;

use super::{lock, LaneCounts};
use crate::decode::{DecodeMode, SplitSchedule, AUTO_START};

/// What the lane counted so far.
#[derive(Debug, Default)]
pub struct LaneStats {
    /// Rows decoded and cropped on the GPU.
    pub gpu_rows: AtomicU64,
    /// Rows offered to the lane that the decode threads kept (not taken by the engines, or
    /// too large for the lane's memory).
    pub declined_rows: AtomicU64,
    /// Rows the lane took and then built on the CPU: nvJPEG's parse read another frame or its
    /// batched decode does not take the stream, the decode failed (its strict bitstream check
    /// included), or the decode reported success without writing the image's place.
    pub fallback_rows: AtomicU64,
    /// Time the lane's thread worked on batches (waits for the GPU included, waits for a free
    /// output buffer not), in nanoseconds.
    pub gpu_busy_ns: AtomicU64,
    /// Rows the decode threads built in batches the lane also worked on.
    pub cpu_rows: AtomicU64,
    /// Time the decode threads spent on those batches, in nanoseconds.
    pub cpu_busy_ns: AtomicU64,
    /// Where the lane's thread spent its time, in nanoseconds: asking nvJPEG whether it takes
    /// each image, in nvJPEG's decode calls, waiting for a pipe's previous work, and queueing
    /// the crop kernel.
    pub check_ns: AtomicU64,
    /// See `check_ns`.
    pub decode_call_ns: AtomicU64,
    /// See `check_ns`.
    pub pipe_wait_ns: AtomicU64,
    /// See `check_ns`.
    pub launch_ns: AtomicU64,
}

pub(super) fn add_since(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

impl LaneStats {
    /// The lane's figures: these counts, the split in effect under `mode` (the latest of
    /// `splits` under `"auto"`), and the lane's device memory (held, cap) and engines.
    pub(crate) fn figures(
        &self,
        mode: DecodeMode,
        splits: &Mutex<SplitSchedule>,
        (memory_bytes, memory_cap): (u64, u64),
        hardware: bool,
    ) -> GpuDecodeFigures {
        let sixteenths = match mode {
            DecodeMode::Gpu => 16,
            _ => lock(splits).latest().unwrap_or(AUTO_START),
        };
        GpuDecodeFigures {
            split_pct: f64::from(sixteenths) * 100.0 / 16.0,
            gpu_rows_per_s: self.gpu_rate(),
            cpu_rows_per_s: self.cpu_rate(),
            gpu_rows: self.gpu_rows.load(Ordering::Relaxed),
            declined_rows: self.declined_rows.load(Ordering::Relaxed),
            memory_bytes,
            memory_cap,
            hardware,
            lost: None,
        }
    }

    /// Rows per second of the GPU lane while it worked.
    pub fn gpu_rate(&self) -> f64 {
        self.counts().gpu_rate()
    }

    /// Rows per second of the decode threads in the batches the lane also worked on.
    pub fn cpu_rate(&self) -> f64 {
        self.counts().cpu_rate()
    }

    /// The two lanes' totals now, as `auto`'s split decisions read them.
    pub fn counts(&self) -> LaneCounts {
        LaneCounts {
            gpu_rows: self.gpu_rows.load(Ordering::Relaxed),
            gpu_busy_ns: self.gpu_busy_ns.load(Ordering::Relaxed),
            cpu_rows: self.cpu_rows.load(Ordering::Relaxed),
            cpu_busy_ns: self.cpu_busy_ns.load(Ordering::Relaxed),
        }
    }
}
