//! What the loader measured: throughput, the time the consumer waited inside `next()`, the
//! stage timings the decode threads reported with each batch, and what the consumer's GPU
//! stream reported (its idle time, and what a decode lane beside it cost it: [`LaneCost`]).

use std::time::{Duration, Instant};

use stoker_dashboard::LoaderStats;
use stoker_pipeline::Batch;

use super::lane_cost::{LaneCost, LaneWindow};

/// Accumulates [`LoaderStats`].
#[derive(Debug)]
pub(crate) struct StatsRecorder {
    started: Option<Instant>,
    first_batch: Option<Duration>,
    totals: LoaderStats,
    lane_cost: LaneCost,
    /// A wait inside `next()` that has not ended yet: since when, and whether it is for an
    /// epoch's first batch. Snapshots count it as it goes, so a consumer blocked for a minute
    /// reads as waiting all along, not as idle until the batch comes and then as one reading
    /// of a minute's wait.
    waiting: Option<(Instant, bool)>,
}

impl StatsRecorder {
    pub(crate) fn new() -> Self {
        Self {
            started: None,
            first_batch: None,
            totals: LoaderStats::default(),
            lane_cost: LaneCost::default(),
            waiting: None,
        }
    }

    /// The consumer began waiting inside `next()` at `at` (for an epoch's first batch when
    /// `epoch_start`); [`record_batch`](Self::record_batch) or
    /// [`record_wait`](Self::record_wait) ends it.
    pub(crate) fn wait_began(&mut self, at: Instant, epoch_start: bool) {
        self.waiting = Some((at, epoch_start));
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
        self.waiting = None;
        if self.first_batch.is_none() {
            self.first_batch = self.started.map(|s| s.elapsed());
        } else if epoch_start {
            self.totals.epoch_start_wait_s += waited.as_secs_f64();
        }
        let totals = &mut self.totals;
        totals.batches += 1;
        totals.samples += batch.sample_indices.len() as u64;
        totals.wait_s += waited.as_secs_f64();
        let t = &batch.timings;
        totals.read_s += t.read_ns as f64 * 1e-9;
        totals.decode_s += t.decode_ns as f64 * 1e-9;
        totals.augment_s += t.augment_ns as f64 * 1e-9;
        totals.assemble_s += t.assemble_ns as f64 * 1e-9;
        totals.bad_samples += batch.bad_samples.len() as u64;
        totals.tokens_dropped += batch.dropped_tokens;
        totals.bytes += batch
            .tensors
            .iter()
            .map(|t| t.data.len() as u64)
            .sum::<u64>();
        totals.in_flight = in_flight;
        totals.prefetch_depth = prefetch_depth;
    }

    pub(crate) fn record_wait(&mut self, waited: Duration, epoch_start: bool) {
        self.waiting = None;
        self.totals.wait_s += waited.as_secs_f64();
        if epoch_start && self.first_batch.is_some() {
            self.totals.epoch_start_wait_s += waited.as_secs_f64();
        }
    }

    pub(crate) fn record_gpu_idle(
        &mut self,
        idle: Duration,
        span: Duration,
        lane: Option<LaneWindow>,
    ) {
        self.totals.gpu_idle_s += idle.as_secs_f64();
        self.totals.gpu_span_s += span.as_secs_f64();
        if let Some(lane) = lane {
            self.lane_cost.note(span.saturating_sub(idle), lane);
            self.totals.gpu_lane_cost_s = self.lane_cost.cost_s;
            self.totals.gpu_lane_quiet_steps = self.lane_cost.quiet_steps;
        }
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
        if let Some((since, epoch_start)) = self.waiting {
            // As record_batch will count it when it ends (the whole wait, from the same start).
            let so_far = since.elapsed().as_secs_f64();
            stats.wait_s += so_far;
            if epoch_start && self.first_batch.is_some() {
                stats.epoch_start_wait_s += so_far;
            }
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait in progress counts in every snapshot as it goes, and once it ends the figure
    /// goes on from there, never back: a consumer blocked in `next()` reads as waiting.
    #[test]
    fn a_wait_in_progress_counts_as_it_goes_and_never_twice() {
        let mut recorder = StatsRecorder::new();
        recorder.epoch_started();
        assert_eq!(recorder.snapshot().wait_s, 0.0);
        let began = Instant::now()
            .checked_sub(Duration::from_secs(2))
            .expect("the clock is past 2 s");
        recorder.wait_began(began, false);
        let during = recorder.snapshot().wait_s;
        assert!((2.0..3.0).contains(&during), "{during}");
        recorder.record_wait(began.elapsed(), false);
        let after = recorder.snapshot().wait_s;
        assert!(after >= during && after < 3.0, "{during} then {after}");
        // Ended: no longer counted as it goes.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(recorder.snapshot().wait_s, after);
    }
}
