//! What the lane counted: rows by where they were built, its busy time and the decode threads'
//! beside it (what `auto`'s decisions read), and where its threads spent their time; and the
//! share of each step it is offered ([`LaneSplit`]), the same for the lane in this process and
//! in its helper process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stoker_dashboard::GpuDecodeFigures;

use super::{lock, LaneCounts};
use crate::decode::{pinned_split, DecodeMode, SplitSchedule, AUTO_START, SPLIT_PIN_VARIABLE};

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
    /// Rows built on the GPU from the region of their image the engines decoded alone (region
    /// decoding, [`crate::decode::ROI_VARIABLE`]); part of `gpu_rows`.
    pub roi_rows: AtomicU64,
    /// Time the lane worked on batches, counted once while it works on any, in nanoseconds:
    /// in this process, while a pipe works on one (waits for the GPU included, waits for a
    /// free output buffer not); for the lane in a helper process (the loader's `HelperLane`),
    /// while one is sent and not yet answered.
    pub gpu_busy_ns: AtomicU64,
    /// Rows the decode threads built in batches the lane also worked on.
    pub cpu_rows: AtomicU64,
    /// Time the decode threads spent on those batches, in nanoseconds.
    pub cpu_busy_ns: AtomicU64,
    /// Where the lane's thread spent its time, in nanoseconds: asking nvJPEG whether it takes
    /// each image (and, with region decoding, its region), in nvJPEG's decode calls, waiting for a pipe's previous work, and queueing
    /// the crop kernel.
    pub check_ns: AtomicU64,
    /// See `check_ns`.
    pub decode_call_ns: AtomicU64,
    /// See `check_ns`.
    pub pipe_wait_ns: AtomicU64,
    /// See `check_ns`.
    pub launch_ns: AtomicU64,
    /// Batches the lane works on now, and when that count last changed ([`LaneStats::working`]).
    working: Mutex<(usize, Option<Instant>)>,
}

impl LaneStats {
    /// The lane starts (`true`) or ends (`false`) work on a batch: its busy time
    /// (`gpu_busy_ns`, which `auto`'s rates and the lane-cost figure read) runs while it works
    /// on any, counted at each change, so batches worked on together count once.
    pub(crate) fn working(&self, starts: bool) {
        let mut working = lock(&self.working);
        let now = Instant::now();
        if let (true, Some(since)) = (working.0 > 0, working.1) {
            self.gpu_busy_ns
                .fetch_add((now - since).as_nanos() as u64, Ordering::Relaxed);
        }
        working.0 = if starts {
            working.0 + 1
        } else {
            working.0.saturating_sub(1)
        };
        working.1 = Some(now);
    }

    /// The lane's busy time so far, the stretch of the work in progress included.
    pub(crate) fn busy(&self) -> Duration {
        let working = lock(&self.working);
        let counted = self.gpu_busy_ns.load(Ordering::Relaxed);
        let running = match working.1 {
            Some(since) if working.0 > 0 => since.elapsed(),
            _ => Duration::ZERO,
        };
        Duration::from_nanos(counted) + running
    }
}

pub(super) fn add_since(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// The share of each step a lane is offered: always all under `"gpu"`, and under `"auto"` the
/// share `SplitSchedule` decides at each point from the lanes' counts (held by
/// `STOKER_GPU_DECODE_SPLIT` when it pins one).
#[derive(Debug)]
pub(crate) struct LaneSplit {
    mode: DecodeMode,
    splits: Mutex<SplitSchedule>,
}

impl LaneSplit {
    /// The split of a lane in `mode`.
    pub(crate) fn new(mode: DecodeMode) -> LaneSplit {
        LaneSplit {
            mode,
            splits: Mutex::new(SplitSchedule::new(pinned_split(
                std::env::var(SPLIT_PIN_VARIABLE).ok().as_deref(),
            ))),
        }
    }

    /// The mode asked for.
    pub(crate) fn mode(&self) -> DecodeMode {
        self.mode
    }

    /// The lane's share of step `step` of `epoch`, in sixteenths: `gpu` mode always 16; `auto`
    /// the share of the point the step is in, decided from `stats` when first asked.
    pub(crate) fn split_at(&self, epoch: u64, step: u64, stats: &LaneStats) -> u8 {
        if self.mode == DecodeMode::Gpu {
            return 16;
        }
        lock(&self.splits).split_at(epoch, step, stats.counts())
    }

    /// Counts a batch of `rows` rows, step `step` of `epoch`, handed out `interval` after the
    /// one before (what `auto`'s later decisions compare).
    pub(crate) fn note_delivered(&self, epoch: u64, step: u64, rows: usize, interval: Duration) {
        if self.mode == DecodeMode::Auto {
            lock(&self.splits).note_delivered(epoch, step, rows, interval.as_nanos() as u64);
        }
    }

    /// Sets the share of the point step `step` of `epoch` is in (see `SplitSchedule::set`).
    pub(crate) fn set(&self, epoch: u64, step: u64, sixteenths: u8) -> bool {
        lock(&self.splits).set(epoch, step, sixteenths)
    }

    /// The lane's figures: `stats`, the split in effect (the latest decided under `"auto"`),
    /// and the lane's device memory (held, cap) and engines.
    pub(crate) fn figures(
        &self,
        stats: &LaneStats,
        (memory_bytes, memory_cap): (u64, u64),
        hardware: bool,
    ) -> GpuDecodeFigures {
        let sixteenths = match self.mode {
            DecodeMode::Gpu => 16,
            _ => lock(&self.splits).latest().unwrap_or(AUTO_START),
        };
        GpuDecodeFigures {
            split_pct: f64::from(sixteenths) * 100.0 / 16.0,
            gpu_rows_per_s: stats.gpu_rate(),
            cpu_rows_per_s: stats.cpu_rate(),
            gpu_rows: stats.gpu_rows.load(Ordering::Relaxed),
            declined_rows: stats.declined_rows.load(Ordering::Relaxed),
            memory_bytes,
            memory_cap,
            hardware,
            lost: None,
        }
    }
}

impl LaneStats {
    /// Counts `rows` built by the decode threads in `busy` for a batch the lane also worked on.
    pub(crate) fn note_cpu(&self, rows: usize, busy: Duration) {
        self.cpu_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.cpu_busy_ns
            .fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
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
