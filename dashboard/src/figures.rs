//! The figures a loader reports and the dashboard shows: its throughput and waits
//! ([`LoaderStats`]), the prefetch controller's view ([`ControllerSnapshot`]), the GPU decode
//! lane's ([`GpuDecodeFigures`]), one reading of them all ([`MonitorSnapshot`]), and the
//! [`LoaderMonitor`] that reads them from any thread: through a [`MonitorSource`] the loader
//! implements for a loader in this process, or from what a remote client last reported.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// A snapshot of the loader's figures since it was created.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoaderStats {
    /// Batches yielded.
    pub batches: u64,
    /// Samples yielded.
    pub samples: u64,
    /// Seconds since the first epoch started.
    pub elapsed_s: f64,
    /// Samples per second over `elapsed_s`.
    pub samples_per_s: f64,
    /// Seconds the consumer spent waiting inside `next()`.
    pub wait_s: f64,
    /// The part of `wait_s` spent waiting for the first batch of an epoch after the first
    /// epoch (an epoch-boundary stall).
    pub epoch_start_wait_s: f64,
    /// Seconds from the start of the first epoch to its first batch.
    pub first_batch_s: Option<f64>,
    /// Decode-thread seconds spent reading bytes.
    pub read_s: f64,
    /// Decode-thread seconds spent decoding.
    pub decode_s: f64,
    /// Decode-thread seconds spent on crop, resize and flip.
    pub augment_s: f64,
    /// Decode-thread seconds spent writing the output layout.
    pub assemble_s: f64,
    /// Samples replaced under the skip policy.
    pub bad_samples: u64,
    /// Packed text: document tokens past a batch's last row, dropped.
    pub tokens_dropped: u64,
    /// Tensor bytes yielded.
    pub bytes: u64,
    /// Batches in flight after the last `next()`.
    pub in_flight: usize,
    /// Batches allowed in flight after the last `next()` (the controller's choice in auto mode).
    pub prefetch_depth: usize,
    /// Seconds the consumer's GPU stream sat idle waiting for a batch, measured with events on
    /// that stream (the loader's `record_gpu_idle`; 0 when nothing reports it). It differs
    /// from `wait_s` when the training loop runs ahead of the GPU.
    pub gpu_idle_s: f64,
    /// Seconds of the GPU stream's time over which `gpu_idle_s` was measured.
    pub gpu_span_s: f64,
    /// Seconds the consumer's GPU stream was busier on its steps beside the GPU decode lane's
    /// work than on steps with the lane quiet (medians of the recent ones of each): what the
    /// lane beside the step costs it, which no wait shows. Counted once a few quiet steps give
    /// a baseline (`gpu_lane_quiet_steps`); 0 without a lane or a consumer that reports it.
    pub gpu_lane_cost_s: f64,
    /// Steps the consumer measured with the lane quiet (the baseline of `gpu_lane_cost_s`).
    pub gpu_lane_quiet_steps: u64,
    /// The GPU decode lane's figures, when the loader has one.
    pub gpu_decode: Option<GpuDecodeFigures>,
}

/// What the GPU decode lane did, as the dashboard and `/metrics` show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuDecodeFigures {
    /// The share of each batch offered to the GPU in the newest epoch started, percent.
    pub split_pct: f64,
    /// Rows per second the GPU lane built while it worked.
    pub gpu_rows_per_s: f64,
    /// Rows per second the decode threads built in the batches the lane also worked on.
    pub cpu_rows_per_s: f64,
    /// Rows the GPU lane built.
    pub gpu_rows: u64,
    /// Rows offered to the lane that the decode threads built (not JPEGs the engines take, or
    /// too large for the lane's memory).
    pub declined_rows: u64,
    /// Device bytes the lane holds.
    pub memory_bytes: u64,
    /// The most it may hold (`gpu_memory`).
    pub memory_cap: u64,
    /// Whether the hardware JPEG engines decode (else nvJPEG's default backend).
    pub hardware: bool,
    /// Why the lane builds no rows any more (its helper process lost), every row then built
    /// by the decode threads; `None` while it runs.
    pub lost: Option<String>,
}

/// Why the target depth last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeReason {
    /// It has not changed since the controller was created.
    Startup,
    /// The training loop waited inside `next()`.
    Stall,
    /// No stall for a long stretch and Little's law asked for much less.
    Idle,
    /// Little's law asked for more than the target.
    LittlesLaw,
    /// A raise wanted more than the memory budget or slot pool allows, and got the cap.
    Budget,
}

/// What the controller believes, for stats and logs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerSnapshot {
    /// Depth the loader should keep.
    pub target_depth: usize,
    /// Largest depth the budget allows.
    pub budget_depth: usize,
    /// Smoothed latency from request to arrival of a batch.
    pub latency_mean: Duration,
    /// Standard deviation of that latency.
    pub latency_std: Duration,
    /// Smoothed time the training loop spends between `next()` calls (bursts clipped).
    pub step_mean: Duration,
    /// Standard deviation of that step time.
    pub step_std: Duration,
    /// Depth Little's law asks for, within the limits; the target when nothing is measured yet.
    pub littles_depth: usize,
    /// Depth idle drops stop at: what the worst recent stall showed was needed.
    pub stall_floor_depth: usize,
    /// Recent share of the training loop's time spent waiting inside `next()`, in `[0, 1]`.
    pub stall_fraction: f64,
    /// Why the target last changed.
    pub last_change: ChangeReason,
}

/// One reading of a [`LoaderMonitor`].
#[derive(Debug, Clone, Default)]
pub struct MonitorSnapshot {
    /// Throughput, waits, stage times.
    pub stats: LoaderStats,
    /// The prefetch controller's view, in auto mode.
    pub controller: Option<ControllerSnapshot>,
    /// The fixed depth, when not in auto mode.
    pub fixed_prefetch: Option<usize>,
    /// Batch buffers in use (in flight, waiting, or held by the consumer).
    pub slots_in_use: usize,
    /// Batch buffers that may exist.
    pub slot_capacity: usize,
    /// Bytes per batch buffer.
    pub slot_bytes: usize,
    /// Decode threads.
    pub threads: usize,
    /// Whether `threads` are remote workers' shared with other jobs (the coordinator's
    /// estimate of a rank's share), not the loader's own: their busy share then names no
    /// verdict.
    pub threads_shared: bool,
    /// Seconds since a remote client's last report, once it is older than the reports'
    /// period allows (1.5 s); `None` while reports come, and for a loader in this process.
    pub report_age_s: Option<f64>,
}

/// Where a [`LoaderMonitor`] reads a loader's figures: the loader implements it over what it
/// keeps (its stats, controller, slot pool and GPU lane).
pub trait MonitorSource: Send + Sync {
    /// The figures now.
    fn snapshot(&self) -> MonitorSnapshot;
}

/// Reads a loader's figures from any thread (the dashboard, the metrics endpoint, a remote
/// client's reports to its coordinator). A coordinator builds monitors of remote clients from
/// their reports with [`LoaderMonitor::reported`].
#[derive(Clone)]
pub struct LoaderMonitor {
    source: Arc<dyn MonitorSource>,
}

/// How long a remote client's last report stands for the present before it is taken as
/// silent (it reports every half second while it reads).
pub(crate) const REPORT_STALE_AFTER: Duration = Duration::from_millis(1500);

/// The latest figures a remote client reported, and when this monitor first saw them (by the
/// client's own elapsed time).
struct Reported {
    latest: Arc<Mutex<MonitorSnapshot>>,
    seen: Mutex<(f64, Instant)>,
}

impl MonitorSource for Reported {
    /// The latest report; once it is older than [`REPORT_STALE_AFTER`] (the client stopped,
    /// paused between sessions, died, or cannot reach the coordinator), with the report's
    /// age: the verdict says the reports stopped rather than guess why, and no share of the
    /// time is given (the client's wait since then is unknown: its elapsed time run on
    /// without its wait read as 0% stall, a starving client cut off from the coordinator as a
    /// healthy one, and its run time counter stepped back when reports came again).
    fn snapshot(&self) -> MonitorSnapshot {
        let mut snapshot = self
            .latest
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.0 != snapshot.stats.elapsed_s {
            *seen = (snapshot.stats.elapsed_s, Instant::now());
        } else if seen.1.elapsed() > REPORT_STALE_AFTER {
            snapshot.report_age_s = Some(seen.1.elapsed().as_secs_f64());
        }
        snapshot
    }
}

impl LoaderMonitor {
    /// A monitor over `source` (a loader in this process).
    pub fn new(source: Arc<dyn MonitorSource>) -> Self {
        Self { source }
    }

    /// A monitor that shows whatever is written into `latest` (a remote client's reports).
    pub fn reported(latest: Arc<Mutex<MonitorSnapshot>>) -> Self {
        Self::new(Arc::new(Reported {
            latest,
            seen: Mutex::new((f64::NAN, Instant::now())),
        }))
    }

    /// The figures now.
    pub fn snapshot(&self) -> MonitorSnapshot {
        self.source.snapshot()
    }
}
