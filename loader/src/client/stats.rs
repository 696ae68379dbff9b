//! What the loader measured: throughput, the time the consumer waited inside `next()`, and the
//! stage timings the decode threads reported with each batch.

use std::time::{Duration, Instant};

use serde::Serialize;
use stoker_proto::v1::Batch;

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
    /// Tensor bytes yielded.
    pub bytes: u64,
    /// Batches in flight after the last `next()`.
    pub in_flight: usize,
    /// Batches allowed in flight after the last `next()` (the controller's choice in auto mode).
    pub prefetch_depth: usize,
    /// Seconds the consumer's GPU stream sat idle waiting for a batch, measured with events on
    /// that stream ([`crate::Loader::record_gpu_idle`]; 0 when nothing reports it). It differs
    /// from `wait_s` when the training loop runs ahead of the GPU.
    pub gpu_idle_s: f64,
    /// Seconds of the GPU stream's time over which `gpu_idle_s` was measured.
    pub gpu_span_s: f64,
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
}

/// Accumulates [`LoaderStats`].
#[derive(Debug)]
pub(crate) struct StatsRecorder {
    started: Option<Instant>,
    first_batch: Option<Duration>,
    totals: LoaderStats,
}

impl StatsRecorder {
    pub(crate) fn new() -> Self {
        Self {
            started: None,
            first_batch: None,
            totals: LoaderStats::default(),
        }
    }

    pub(crate) fn epoch_started(&mut self) {
        self.started.get_or_insert_with(Instant::now);
    }

    pub(crate) fn record_batch(
        &mut self,
        batch: &Batch,
        waited: Duration,
        epoch_start: bool,
        in_flight: usize,
        prefetch_depth: usize,
    ) {
        if self.first_batch.is_none() {
            self.first_batch = self.started.map(|s| s.elapsed());
        } else if epoch_start {
            self.totals.epoch_start_wait_s += waited.as_secs_f64();
        }
        let totals = &mut self.totals;
        totals.batches += 1;
        totals.samples += batch.sample_indices.len() as u64;
        totals.wait_s += waited.as_secs_f64();
        if let Some(t) = &batch.timings {
            totals.read_s += t.read_ns as f64 * 1e-9;
            totals.decode_s += t.decode_ns as f64 * 1e-9;
            totals.augment_s += t.augment_ns as f64 * 1e-9;
            totals.assemble_s += t.assemble_ns as f64 * 1e-9;
        }
        totals.bad_samples += batch.bad_samples.len() as u64;
        totals.bytes += batch
            .tensors
            .iter()
            .map(|t| t.data.len() as u64)
            .sum::<u64>();
        totals.in_flight = in_flight;
        totals.prefetch_depth = prefetch_depth;
    }

    pub(crate) fn record_wait(&mut self, waited: Duration, epoch_start: bool) {
        self.totals.wait_s += waited.as_secs_f64();
        if epoch_start && self.first_batch.is_some() {
            self.totals.epoch_start_wait_s += waited.as_secs_f64();
        }
    }

    pub(crate) fn record_gpu_idle(&mut self, idle: Duration, span: Duration) {
        self.totals.gpu_idle_s += idle.as_secs_f64();
        self.totals.gpu_span_s += span.as_secs_f64();
    }

    pub(crate) fn snapshot(&self) -> LoaderStats {
        let mut stats = self.totals.clone();
        stats.elapsed_s = self.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        stats.samples_per_s = if stats.elapsed_s > 0.0 {
            stats.samples as f64 / stats.elapsed_s
        } else {
            0.0
        };
        stats.first_batch_s = self.first_batch.map(|d| d.as_secs_f64());
        stats
    }
}
