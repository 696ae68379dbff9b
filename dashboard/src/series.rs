//! Per-job time series: readings of a [`LoaderMonitor`] turned into per-interval figures, kept
//! in a bounded ring, and the verdict drawn from the last few seconds of them.
//!
//! Figures are rounded once here (stall and throughput to 0.1, milliseconds to 0.01), so the
//! JSON API, the page and `/metrics` all show the same numbers.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub(crate) use crate::verdict::Verdict;
use crate::{LoaderMonitor, LoaderStats, MonitorSnapshot};

/// Time between two readings of a job.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(500);

/// How much history each job keeps.
pub const HISTORY: Duration = Duration::from_secs(600);

/// The stretch the verdict and the time breakdown look back over.
pub const VERDICT_WINDOW: Duration = Duration::from_secs(10);

/// Loader time a window must cover before a verdict is given.
const MIN_VERDICT_SECONDS: f64 = 2.0;

/// Stall above this share of the time means the input pipeline holds the trainer back.
const INPUT_BOUND_STALL_PCT: f64 = 5.0;

/// Decode threads busy less than this share are not what an input-bound job waits on.
const DECODE_THREADS_BUSY_PCT: f64 = 50.0;

/// Stall below this share of the time means the trainer is the bottleneck.
const COMPUTE_BOUND_STALL_PCT: f64 = 1.0;

/// The decode-thread stages, in pipeline order (names as in `/metrics` and the API).
pub(crate) const STAGES: [&str; 4] = ["read", "decode", "augment", "assemble"];

/// The input-bound verdict's "stage" when no batch was built over the window.
const NO_BATCH_BUILT: &str = "no batch built";

/// Raw differences between two readings, kept to aggregate windows exactly.
#[derive(Debug, Clone, Copy, Default)]
struct Delta {
    wall_s: f64,
    elapsed_s: f64,
    wait_s: f64,
    /// The part of `wait_s` spent on the first batch of an epoch.
    epoch_start_wait_s: f64,
    samples: u64,
    batches: u64,
    stages_s: [f64; 4],
    /// GPU idle waiting for a batch, and the GPU time it was measured over.
    gpu_idle_s: f64,
    gpu_span_s: f64,
    /// What the GPU decode lane beside the step cost the GPU stream over that time.
    gpu_lane_cost_s: f64,
}

impl Delta {
    fn between(before: &LoaderStats, after: &LoaderStats, wall_s: f64) -> Self {
        Self {
            wall_s,
            elapsed_s: (after.elapsed_s - before.elapsed_s).max(0.0),
            wait_s: (after.wait_s - before.wait_s).max(0.0),
            epoch_start_wait_s: (after.epoch_start_wait_s - before.epoch_start_wait_s).max(0.0),
            samples: after.samples.saturating_sub(before.samples),
            batches: after.batches.saturating_sub(before.batches),
            stages_s: [
                (after.read_s - before.read_s).max(0.0),
                (after.decode_s - before.decode_s).max(0.0),
                (after.augment_s - before.augment_s).max(0.0),
                (after.assemble_s - before.assemble_s).max(0.0),
            ],
            gpu_idle_s: (after.gpu_idle_s - before.gpu_idle_s).max(0.0),
            gpu_span_s: (after.gpu_span_s - before.gpu_span_s).max(0.0),
            gpu_lane_cost_s: (after.gpu_lane_cost_s - before.gpu_lane_cost_s).max(0.0),
        }
    }

    fn add(&mut self, other: &Self) {
        self.wall_s += other.wall_s;
        self.elapsed_s += other.elapsed_s;
        self.wait_s += other.wait_s;
        self.epoch_start_wait_s += other.epoch_start_wait_s;
        self.samples += other.samples;
        self.batches += other.batches;
        for (sum, stage) in self.stages_s.iter_mut().zip(other.stages_s) {
            *sum += stage;
        }
        self.gpu_idle_s += other.gpu_idle_s;
        self.gpu_span_s += other.gpu_span_s;
        self.gpu_lane_cost_s += other.gpu_lane_cost_s;
    }

    /// Share of the GPU's measured time spent idle waiting for a batch, percent; `None` when
    /// nothing measured it over the interval.
    fn gpu_idle_pct(&self) -> Option<f64> {
        (self.gpu_span_s > 0.0).then(|| round(100.0 * self.gpu_idle_s / self.gpu_span_s, 1))
    }

    /// Share of the GPU's measured time the decode lane beside the step cost it, percent;
    /// `None` when nothing measured the GPU's time over the interval.
    fn gpu_lane_cost_pct(&self) -> Option<f64> {
        (self.gpu_span_s > 0.0).then(|| round(100.0 * self.gpu_lane_cost_s / self.gpu_span_s, 1))
    }

    /// Share of the time the consumer waited inside `next()`, percent: at most 100 (a wait is
    /// counted as it goes, but a reading's two clocks are read a moment apart).
    fn stall_pct(&self) -> Option<f64> {
        (self.elapsed_s > 0.0).then(|| round((100.0 * self.wait_s / self.elapsed_s).min(100.0), 1))
    }

    fn samples_per_s(&self) -> Option<f64> {
        (self.elapsed_s > 0.0).then(|| round(self.samples as f64 / self.elapsed_s, 1))
    }

    /// Decode-pool wall milliseconds per sample for each stage: the threads' time divided by
    /// their number, which is what a sample costs in wall time with every thread busy and so
    /// compares directly with the trainer's time per sample.
    fn stage_ms_per_sample(&self, threads: usize) -> [Option<f64>; 4] {
        self.stages_s.map(|seconds| {
            (self.samples > 0 && threads > 0)
                .then(|| round(1e3 * seconds / (self.samples as f64 * threads as f64), 2))
        })
    }

    /// Share of the decode threads' time spent working, in percent: at most 100 (a batch's
    /// stage times are counted when it is handed out, so a stretch shorter than a batch's
    /// making can hold more than its own time).
    fn busy_pct(&self, threads: usize) -> Option<f64> {
        let capacity = threads as f64 * self.wall_s;
        (capacity > 0.0).then(|| {
            round(
                (100.0 * self.stages_s.iter().sum::<f64>() / capacity).min(100.0),
                1,
            )
        })
    }

    /// Samples per batch over this stretch.
    fn batch_size(&self) -> Option<f64> {
        (self.batches > 0).then(|| self.samples as f64 / self.batches as f64)
    }
}

/// The time breakdown of one sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct TimePerSample {
    /// Reading bytes (decode-pool wall ms per sample).
    pub read_ms: Option<f64>,
    /// Decoding.
    pub decode_ms: Option<f64>,
    /// Crop, resize, flip.
    pub augment_ms: Option<f64>,
    /// Writing the output layout.
    pub assemble_ms: Option<f64>,
    /// The trainer's step time between `next()` calls, per sample ("waiting for the trainer");
    /// known only when the prefetch depth is automatic.
    pub trainer_ms: Option<f64>,
}

impl TimePerSample {
    fn new(delta: &Delta, threads: usize, step: Option<Duration>, batch_size: Option<f64>) -> Self {
        let [read_ms, decode_ms, augment_ms, assemble_ms] = delta.stage_ms_per_sample(threads);
        let trainer_ms = match (step, batch_size) {
            (Some(step), Some(size)) if size > 0.0 => {
                Some(round(step.as_secs_f64() * 1e3 / size, 2))
            }
            _ => None,
        };
        Self {
            read_ms,
            decode_ms,
            augment_ms,
            assemble_ms,
            trainer_ms,
        }
    }
}

/// One reading of a job, as the API and the page show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    /// When the reading was taken, in Unix milliseconds (one value per sampler tick, shared by
    /// every job).
    pub t_ms: u64,
    /// Share of the interval the trainer spent waiting for a batch, percent.
    pub stall_pct: Option<f64>,
    /// Share of the GPU's time over the interval its stream sat idle waiting for a batch,
    /// percent (measured with events by the consumer; `None` where nothing measures it).
    pub gpu_idle_pct: Option<f64>,
    /// Share of the GPU's time over the interval the decode lane beside the step cost it,
    /// percent (see `LoaderStats::gpu_lane_cost_s`; `None` where nothing measures it).
    pub gpu_lane_cost_pct: Option<f64>,
    /// Samples yielded per second over the [`VERDICT_WINDOW`] up to the reading.
    pub samples_per_s: Option<f64>,
    /// Batches being built.
    pub in_flight: usize,
    /// Batches allowed in flight.
    pub prefetch_depth: usize,
    /// Smoothed time from requesting a batch to its arrival, ms (automatic prefetch only).
    pub batch_latency_ms: Option<f64>,
    /// Where a sample's time went over the [`VERDICT_WINDOW`] up to the reading.
    #[serde(flatten)]
    pub time: TimePerSample,
    /// Share of the decode threads' time spent working over the [`VERDICT_WINDOW`] up to the
    /// reading, percent.
    pub busy_pct: Option<f64>,
    /// Batches yielded per second over the [`VERDICT_WINDOW`] up to the reading (a "task" in
    /// embedded mode).
    pub batches_per_s: Option<f64>,
    /// Samples yielded since the loader started.
    pub samples_total: u64,
    /// Samples replaced under the skip policy since the loader started.
    pub bad_samples: u64,
    /// The GPU decode lane's split, rates and memory, when the loader has one.
    pub gpu_decode: Option<crate::GpuDecodeFigures>,
    /// Seconds since a remote client's last report, when its reports stopped.
    pub report_age_s: Option<f64>,
    #[serde(skip)]
    delta: Delta,
}

impl Point {
    /// This reading with every share of time and rate unknown: what a remote client whose
    /// reports stopped shows (its counts and depths stay, as last reported).
    fn unknown_while_silent(self) -> Point {
        Point {
            stall_pct: None,
            gpu_idle_pct: None,
            gpu_lane_cost_pct: None,
            samples_per_s: None,
            batch_latency_ms: None,
            time: TimePerSample::default(),
            busy_pct: None,
            batches_per_s: None,
            ..self
        }
    }
}

/// The figures over the verdict window that ends at some reading.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Window {
    /// Loader seconds the window covers.
    pub seconds: f64,
    /// Share of the window the trainer waited, percent.
    pub stall_pct: Option<f64>,
    /// Share of the GPU's time over the window spent idle waiting for a batch, percent.
    pub gpu_idle_pct: Option<f64>,
    /// Share of the GPU's time over the window the decode lane beside the step cost it, percent.
    pub gpu_lane_cost_pct: Option<f64>,
    /// Samples per second over the window.
    pub samples_per_s: Option<f64>,
    /// Where a sample's time went over the window.
    #[serde(flatten)]
    pub time: TimePerSample,
    /// What holds the job back.
    pub verdict: Verdict,
}

/// A job's series and the monitor it reads.
pub(crate) struct JobSeries {
    /// Name given at registration.
    pub name: String,
    /// Rank given at registration.
    pub rank: u32,
    /// `<name>-<rank>` with anything but ASCII letters, digits, `-` and `_` replaced by `_`: safe
    /// in HTML ids.
    pub key: String,
    monitor: LoaderMonitor,
    previous: Option<(Instant, LoaderStats)>,
    /// The newest reading, for `/metrics`.
    pub latest: Option<MonitorSnapshot>,
    /// Readings, oldest first, at most [`HISTORY`] long.
    pub points: VecDeque<Point>,
}

impl JobSeries {
    fn new(name: &str, rank: u32, monitor: LoaderMonitor) -> Self {
        let key = format!("{name}-{rank}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Self {
            name: name.to_string(),
            rank,
            key,
            monitor,
            previous: None,
            latest: None,
            points: VecDeque::new(),
        }
    }

    fn sample(&mut self, t_ms: u64, now: Instant) {
        let snapshot = self.monitor.snapshot();
        let stats = snapshot.stats.clone();
        if let Some((then, before)) = &self.previous {
            let wall_s = now.saturating_duration_since(*then).as_secs_f64();
            let delta = Delta::between(before, &stats, wall_s);
            // A batch's stage times land when it is handed out, so the rates are read over the
            // window up to this reading: over one interval a long step reads as nothing, then
            // as several times what it is.
            let trailing = self.trailing(&delta);
            let threads = snapshot.threads;
            let batch_size = delta.batch_size().or_else(|| {
                (stats.batches > 0).then(|| stats.samples as f64 / stats.batches as f64)
            });
            let controller = snapshot.controller.as_ref();
            // A silent remote client's figures stay as it last reported them and its silent
            // intervals add no time: every share and rate of the window would be its last
            // report's, shown as current. Unknown instead, as its busy share.
            let silent = snapshot.report_age_s.is_some();
            let point = Point {
                t_ms,
                stall_pct: delta.stall_pct(),
                gpu_idle_pct: delta.gpu_idle_pct(),
                gpu_lane_cost_pct: delta.gpu_lane_cost_pct(),
                samples_per_s: trailing.samples_per_s(),
                in_flight: stats.in_flight,
                prefetch_depth: stats.prefetch_depth,
                batch_latency_ms: controller
                    .filter(|c| !c.latency_mean.is_zero())
                    .map(|c| round(c.latency_mean.as_secs_f64() * 1e3, 2)),
                time: TimePerSample::new(
                    &trailing,
                    threads,
                    controller
                        .map(|c| c.step_mean)
                        .filter(|step| !step.is_zero()),
                    batch_size,
                ),
                busy_pct: trailing.busy_pct(threads),
                batches_per_s: (trailing.elapsed_s > 0.0)
                    .then(|| round(trailing.batches as f64 / trailing.elapsed_s, 1)),
                samples_total: stats.samples,
                bad_samples: stats.bad_samples,
                gpu_decode: stats.gpu_decode.clone(),
                report_age_s: snapshot.report_age_s.map(|age| round(age, 1)),
                delta,
            };
            let point = if silent {
                point.unknown_while_silent()
            } else {
                point
            };
            self.points.push_back(point);
            let capacity = capacity();
            while self.points.len() > capacity {
                self.points.pop_front();
            }
        }
        self.previous = Some((now, stats));
        self.latest = Some(snapshot);
    }

    /// The differences over the [`VERDICT_WINDOW`] that ends with `delta`, a reading not yet
    /// kept.
    fn trailing(&self, delta: &Delta) -> Delta {
        let readings = window_readings();
        let mut sum = *delta;
        for point in self.points.iter().rev().take(readings - 1) {
            sum.add(&point.delta);
        }
        sum
    }

    /// The position of the newest reading taken at or before `at_ms` (the newest of all
    /// without `at_ms`).
    pub fn position_at(&self, at_ms: Option<u64>) -> Option<usize> {
        match at_ms {
            None => self.points.len().checked_sub(1),
            Some(at) => self.points.iter().rposition(|p| p.t_ms <= at),
        }
    }

    /// The verdict window that ends with the reading at `end`.
    pub fn window_ending(&self, end: usize) -> Window {
        let mut sum = Delta::default();
        let mut step = None;
        let mut threads = None;
        let readings = window_readings();
        let first = (end + 1).saturating_sub(readings);
        for point in self
            .points
            .range(first..=end.min(self.points.len().saturating_sub(1)))
        {
            sum.add(&point.delta);
        }
        if let Some(point) = self.points.get(end) {
            // The trainer's step is already a smoothed figure: the newest one stands for the window.
            step = point.time.trainer_ms;
        }
        let mut own_threads = None;
        if let Some(snapshot) = &self.latest {
            threads = Some(snapshot.threads);
            own_threads = (!snapshot.threads_shared).then_some(snapshot.threads);
        }
        let mut time = TimePerSample::new(&sum, threads.unwrap_or(0), None, None);
        time.trainer_ms = step;
        let stall_pct = sum.stall_pct();
        if let Some(age) = self.points.get(end).and_then(|point| point.report_age_s) {
            // Its last report's figures, not the window's: unknown (see `sample`).
            return Window {
                seconds: round(sum.elapsed_s, 1),
                stall_pct: None,
                gpu_idle_pct: None,
                gpu_lane_cost_pct: None,
                samples_per_s: None,
                time: TimePerSample::default(),
                verdict: Verdict::Silent(age as u64),
            };
        }
        let verdict = verdict_of(&sum, own_threads);
        Window {
            seconds: round(sum.elapsed_s, 1),
            stall_pct,
            gpu_idle_pct: sum.gpu_idle_pct(),
            gpu_lane_cost_pct: sum.gpu_lane_cost_pct(),
            samples_per_s: sum.samples_per_s(),
            time,
            verdict,
        }
    }
}

/// Readings in a [`VERDICT_WINDOW`].
fn window_readings() -> usize {
    (VERDICT_WINDOW.as_millis() / SAMPLE_INTERVAL.as_millis()).max(1) as usize
}

/// What held the job back over a window's figures, `threads` decode threads building its
/// batches (unknown: `None`).
fn verdict_of(sum: &Delta, threads: Option<usize>) -> Verdict {
    if sum.elapsed_s < MIN_VERDICT_SECONDS {
        return Verdict::Starting;
    }
    // No batch over the window: a trainer that paused (or a run that ended) is idle; one
    // blocked in `next()` the whole time is as input-bound as a job gets.
    if sum.samples == 0 && sum.wait_s * 2.0 < sum.elapsed_s {
        return Verdict::Idle;
    }
    // The GPU's measured idle (events on the consumer's stream) counts as a wait: a loop that
    // runs ahead of the GPU waits little in `next()` while the GPU waits for the batch.
    let host = sum.stall_pct();
    let stall = match (host, sum.gpu_idle_pct()) {
        (Some(host), Some(gpu)) => Some(host.max(gpu)),
        (host, gpu) => host.or(gpu),
    };
    // The lane's cost is GPU time no wait shows: named when it is above the input-bound line
    // and more than the trainer or the GPU waited.
    if let Some(lane) = sum.gpu_lane_cost_pct() {
        if lane > INPUT_BOUND_STALL_PCT && lane >= stall.unwrap_or(0.0) {
            return Verdict::LaneBeside;
        }
    }
    // Most of the host's wait was for the first batch of an epoch: the boundary, not a stage
    // (judged on the host's wait alone, which is what the epoch's start is counted in).
    if host.is_some_and(|host| host > INPUT_BOUND_STALL_PCT)
        && sum.epoch_start_wait_s * 2.0 >= sum.wait_s
    {
        return Verdict::EpochBoundary;
    }
    match stall {
        Some(stall) if stall > INPUT_BOUND_STALL_PCT => {
            let busy = threads.filter(|&n| n > 0).and_then(|n| sum.busy_pct(n));
            let stage = dominant_stage(&sum.stages_s);
            // A stage only where the threads were busy enough (or no batch built: named so).
            if stage != NO_BATCH_BUILT && busy.is_some_and(|busy| busy < DECODE_THREADS_BUSY_PCT) {
                Verdict::NotTheDecodeThreads
            } else {
                Verdict::InputBound(stage)
            }
        }
        Some(stall) if stall < COMPUTE_BOUND_STALL_PCT => Verdict::ComputeBound,
        Some(_) => Verdict::Balanced,
        None => Verdict::Starting,
    }
}

/// The stage that took the most decode-thread time; [`NO_BATCH_BUILT`] when none took any
/// (a stage's time is counted as its batch is built).
fn dominant_stage(stages_s: &[f64; 4]) -> &'static str {
    if stages_s.iter().all(|seconds| *seconds <= 0.0) {
        return NO_BATCH_BUILT;
    }
    let mut best = 0;
    for (index, seconds) in stages_s.iter().enumerate() {
        if *seconds > stages_s[best] {
            best = index;
        }
    }
    STAGES[best]
}

/// Readings kept per job.
fn capacity() -> usize {
    (HISTORY.as_millis() / SAMPLE_INTERVAL.as_millis()).max(1) as usize
}

/// Rounds to `decimals` places (half away from zero), so the same value prints the same in
/// Rust and in JavaScript's `toFixed`.
pub(crate) fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// Every registered job.
#[derive(Default)]
pub(crate) struct Registry {
    /// Jobs in registration order.
    pub jobs: Vec<JobSeries>,
    /// The distributed mode's workers (a coordinator's dashboard); `None` in embedded mode,
    /// where the decode pool of the process is the one worker.
    pub workers: Option<Vec<super::WorkerLoad>>,
    /// Each job's share of the workers (a coordinator's dashboard).
    pub shares: Option<Vec<super::JobShare>>,
    /// Live workers and the workers wanted (a coordinator's dashboard).
    pub fleet: Option<(u64, u64)>,
}

impl Registry {
    /// Adds a job, or replaces the one with the same name and rank.
    pub fn register(&mut self, name: &str, rank: u32, monitor: LoaderMonitor) {
        let mut job = JobSeries::new(name, rank, monitor);
        // A first reading now, so the first interval figures come one tick later.
        job.sample(unix_ms(), Instant::now());
        match self
            .jobs
            .iter_mut()
            .find(|existing| existing.name == name && existing.rank == rank)
        {
            Some(existing) => *existing = job,
            None => self.jobs.push(job),
        }
        tracing::info!(job = name, rank, "dashboard charting job");
    }

    /// Forgets every rank of the jobs named in `names`.
    pub fn forget(&mut self, names: &std::collections::HashSet<String>) {
        self.jobs.retain(|job| !names.contains(&job.name));
    }

    /// Takes one reading of every job.
    pub fn sample_all(&mut self) {
        let t_ms = unix_ms();
        let now = Instant::now();
        for job in &mut self.jobs {
            job.sample(t_ms, now);
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it) as the wall clock read
/// them at the first call, counted on since by the monotonic clock: a wall clock stepped back
/// (NTP, a restored snapshot) would give readings older than the page's last, which it never
/// asks for again, so the charts froze as long as the step.
pub(crate) fn unix_ms() -> u64 {
    static ANCHOR: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    let (at, ms) = ANCHOR.get_or_init(|| {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH);
        (Instant::now(), ms.map_or(0, |d| d.as_millis() as u64))
    });
    ms + at.elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::REPORT_STALE_AFTER;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn delta(elapsed_s: f64, wait_s: f64, samples: u64, stages_s: [f64; 4]) -> Delta {
        Delta {
            wall_s: elapsed_s,
            elapsed_s,
            wait_s,
            epoch_start_wait_s: 0.0,
            samples,
            batches: samples / 16,
            stages_s,
            gpu_idle_s: 0.0,
            gpu_span_s: 0.0,
            gpu_lane_cost_s: 0.0,
        }
    }

    /// A remote client that stops reporting (it ended, paused between sessions, died, or
    /// cannot reach the coordinator) has its verdict say the reports stopped, with their age,
    /// and no share of time or rate on `/metrics`: its clock was run on without its wait, and
    /// a starving client cut off from the coordinator read 0% stall; before that it read
    /// "idle", and before that its last report stood for the present.
    #[test]
    fn a_remote_client_that_stops_reporting_reads_as_silent() {
        let reported = LoaderStats {
            elapsed_s: 100.0,
            samples: 5000,
            batches: 50,
            wait_s: 1.0,
            ..LoaderStats::default()
        };
        let latest = Arc::new(Mutex::new(MonitorSnapshot {
            stats: reported.clone(),
            threads: 4,
            ..MonitorSnapshot::default()
        }));
        let mut registry = Registry::default();
        registry.register("remote", 0, LoaderMonitor::reported(Arc::clone(&latest)));
        registry.sample_all();
        // Reports coming: the figures are the report's.
        assert_eq!(registry.jobs[0].monitor.snapshot().stats.elapsed_s, 100.0);
        {
            let mut next = latest.lock().unwrap();
            next.stats.elapsed_s = 101.0;
            next.stats.samples = 6000;
            next.stats.batches = 60;
        }
        registry.sample_all();
        let live = registry.jobs[0].points.back().unwrap();
        assert!(live.samples_per_s.is_some() && live.batches_per_s.is_some());
        std::thread::sleep(REPORT_STALE_AFTER + Duration::from_millis(600));
        let later = registry.jobs[0].monitor.snapshot().stats;
        assert_eq!(
            (later.elapsed_s, later.samples, later.wait_s),
            (101.0, 6000, 1.0)
        );
        registry.sample_all();
        let window = registry.jobs[0].window_ending(registry.jobs[0].points.len() - 1);
        assert_eq!(window.verdict, Verdict::Silent(2));
        assert!(window
            .verdict
            .to_string()
            .starts_with("no report for 2 s: the client stopped reading"));
        // `/metrics` labels the verdict with one value however long the silence (a label
        // value per second was a new series per scrape), and gives the age as a gauge.
        let text = super::super::metrics::render(&registry);
        assert!(
            text.contains("stoker_verdict{stoker_job=\"remote\",rank=\"0\",verdict=\"silent\"} 1"),
            "{text}"
        );
        let age = text
            .lines()
            .find_map(|line| {
                line.strip_prefix("stoker_report_age_seconds{stoker_job=\"remote\",rank=\"0\"} ")
            })
            .and_then(|value| value.parse::<f64>().ok());
        assert!(age.is_some_and(|age| (2.0..3.0).contains(&age)), "{text}");
        for unknown in [
            "stoker_stall_ratio{",
            "stoker_stall_ratio_window{",
            "stoker_samples_per_second{",
            "stoker_decode_busy_ratio{",
            "stoker_in_flight_batches{",
            "stoker_prefetch_depth{",
        ] {
            assert!(!text.contains(unknown), "{unknown} while silent: {text}");
        }
        assert!(
            text.contains("stoker_run_seconds_total{stoker_job=\"remote\",rank=\"0\"} 101\n"),
            "{text}"
        );
        // Nor on the page: its silent intervals add no time, so the window's rates were its
        // last report's, shown beside "no report for 2 s" as current.
        let current = registry.jobs[0].points.back().unwrap();
        assert_eq!(current.busy_pct, None, "no busy share while silent");
        assert_eq!(
            (
                current.samples_per_s,
                current.batches_per_s,
                current.stall_pct
            ),
            (None, None, None)
        );
        assert_eq!((window.samples_per_s, window.stall_pct), (None, None));
        // A new report is taken as it is.
        latest.lock().unwrap().stats.elapsed_s = 103.0;
        assert_eq!(registry.jobs[0].monitor.snapshot().stats.elapsed_s, 103.0);
    }

    /// A batch's stage times land when it is handed out: with a step of 4 s on one thread,
    /// one interval read 0 samples/s and the next 2,000, the decode threads 800% busy.
    #[test]
    fn rates_over_steps_longer_than_an_interval_read_steady_and_busy_at_most_all() {
        let latest = Arc::new(Mutex::new(MonitorSnapshot {
            threads: 1,
            ..MonitorSnapshot::default()
        }));
        let mut registry = Registry::default();
        registry.register("slow", 0, LoaderMonitor::reported(Arc::clone(&latest)));
        let start = Instant::now();
        let (mut rates, mut busy) = (Vec::new(), Vec::new());
        for tick in 0..60u64 {
            {
                let mut snapshot = latest.lock().unwrap();
                let stats = &mut snapshot.stats;
                stats.elapsed_s = tick as f64 * 0.5;
                // A 1,000-sample batch every 4 s, its 4 s of decoding counted as it is handed.
                let batches = tick / 8;
                stats.batches = batches;
                stats.samples = batches * 1000;
                stats.decode_s = batches as f64 * 4.0;
            }
            let job = &mut registry.jobs[0];
            job.sample(tick * 500, start + Duration::from_millis(tick * 500));
            if tick >= 24 {
                let point = job.points.back().unwrap();
                rates.push(point.samples_per_s.unwrap());
                busy.push(point.busy_pct.unwrap());
            }
        }
        // 250 samples/s, read over 10 s: two or three batches' worth.
        assert!(
            rates.iter().all(|rate| (190.0..=310.0).contains(rate)),
            "{rates:?}"
        );
        assert!(busy.iter().all(|b| *b <= 100.0), "{busy:?}");
        let per_interval = Delta {
            wall_s: 0.5,
            stages_s: [0.0, 4.0, 0.0, 0.0],
            ..Delta::default()
        };
        assert_eq!(per_interval.busy_pct(4), Some(100.0));
    }

    #[test]
    fn a_forgotten_job_leaves_the_registry_with_all_its_ranks() {
        let latest = Arc::new(Mutex::new(MonitorSnapshot::default()));
        let mut registry = Registry::default();
        for (name, rank) in [("job 1 a", 0), ("job 1 a", 1), ("job 2 b", 0)] {
            registry.register(name, rank, LoaderMonitor::reported(Arc::clone(&latest)));
        }
        registry.forget(&["job 1 a".to_string()].into());
        let left: Vec<(&str, u32)> = registry
            .jobs
            .iter()
            .map(|job| (job.name.as_str(), job.rank))
            .collect();
        assert_eq!(left, [("job 2 b", 0)]);
    }

    #[test]
    fn a_gpu_lanes_figures_reach_the_points_and_metrics() {
        let figures = crate::GpuDecodeFigures {
            split_pct: 62.5,
            gpu_rows_per_s: 8000.0,
            cpu_rows_per_s: 5000.0,
            gpu_rows: 1000,
            declined_rows: 12,
            memory_bytes: 700 << 20,
            memory_cap: 1 << 30,
            hardware: true,
            lost: None,
        };
        let latest = Arc::new(Mutex::new(MonitorSnapshot::default()));
        latest.lock().unwrap().stats.gpu_decode = Some(figures.clone());
        let mut registry = Registry::default();
        registry.register("lane", 0, LoaderMonitor::reported(Arc::clone(&latest)));
        registry.sample_all();
        let job = &registry.jobs[0];
        assert_eq!(
            job.points.back().unwrap().gpu_decode.as_ref(),
            Some(&figures)
        );
        let json = serde_json::to_value(job.points.back().unwrap()).unwrap();
        assert_eq!(json["gpu_decode"]["split_pct"], 62.5);
        assert!(json["gpu_decode"]["lost"].is_null());
        let text = super::super::metrics::render(&registry);
        for line in [
            "stoker_gpu_decode_share_ratio{stoker_job=\"lane\",rank=\"0\"} 0.625",
            "stoker_decode_rows_per_second{stoker_job=\"lane\",rank=\"0\",lane=\"gpu\"} 8000",
            "stoker_decode_rows_per_second{stoker_job=\"lane\",rank=\"0\",lane=\"cpu\"} 5000",
            "stoker_gpu_decode_memory_cap_bytes{stoker_job=\"lane\",rank=\"0\"} 1073741824",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // A job without a lane has no such samples (the families are still declared).
        latest.lock().unwrap().stats.gpu_decode = None;
        registry.sample_all();
        let text = super::super::metrics::render(&registry);
        assert!(!text.contains("stoker_gpu_decode_share_ratio{"), "{text}");
    }

    #[test]
    fn gpu_idle_is_idle_over_the_gpu_span() {
        let mut d = delta(10.0, 0.0, 100, [0.0; 4]);
        assert_eq!(d.gpu_idle_pct(), None, "nothing measured");
        d.gpu_idle_s = 0.5;
        d.gpu_span_s = 4.0;
        assert_eq!(d.gpu_idle_pct(), Some(12.5));
        let mut sum = Delta::default();
        sum.add(&d);
        sum.add(&d);
        assert_eq!(sum.gpu_idle_pct(), Some(12.5));
    }

    #[test]
    fn stall_is_waiting_over_elapsed() {
        let d = delta(0.5, 0.1, 32, [0.0; 4]);
        assert_eq!(d.stall_pct(), Some(20.0));
        assert_eq!(d.samples_per_s(), Some(64.0));
        assert_eq!(Delta::default().stall_pct(), None);
    }

    #[test]
    fn stage_costs_are_pool_wall_time_per_sample() {
        // 4 threads spent 0.4 s decoding 100 samples: 1 ms of pool time per sample.
        let d = delta(0.5, 0.0, 100, [0.0, 0.4, 0.0, 0.0]);
        assert_eq!(d.stage_ms_per_sample(4)[1], Some(1.0));
        assert_eq!(d.busy_pct(4), Some(20.0));
    }

    #[test]
    fn dominant_stage_is_the_largest() {
        assert_eq!(dominant_stage(&[0.1, 0.5, 0.2, 0.0]), "decode");
        assert_eq!(dominant_stage(&[0.9, 0.5, 0.2, 0.0]), "read");
        assert_eq!(dominant_stage(&[0.1, 0.5, 0.7, 0.0]), "augment");
    }

    #[test]
    fn verdict_text() {
        assert_eq!(
            Verdict::InputBound("decode").to_string(),
            "input-bound: decode"
        );
        assert_eq!(Verdict::ComputeBound.to_string(), "compute-bound");
        assert_eq!(
            Verdict::EpochBoundary.to_string(),
            "input-bound: epoch boundary"
        );
        assert_eq!(
            Verdict::LaneBeside.to_string(),
            "input-bound: GPU decode beside the step"
        );
    }

    #[test]
    fn a_lane_costing_the_gpu_stream_more_than_the_wait_is_the_verdict() {
        // 0.1% stall in next(), but the lane cost the stream 20% of its time.
        let mut slowed = delta(10.0, 0.01, 1000, [0.0, 4.0, 1.0, 0.0]);
        slowed.gpu_span_s = 10.0;
        slowed.gpu_lane_cost_s = 2.0;
        assert_eq!(slowed.gpu_lane_cost_pct(), Some(20.0));
        assert_eq!(verdict_of(&slowed, None), Verdict::LaneBeside);
        // Under the line: the verdict the wait gives.
        slowed.gpu_lane_cost_s = 0.3;
        assert_eq!(verdict_of(&slowed, None), Verdict::ComputeBound);
        // A wait larger than the lane's cost names the stage it waits on.
        let mut waiting = delta(10.0, 3.0, 1000, [0.0, 4.0, 1.0, 0.0]);
        waiting.gpu_span_s = 10.0;
        waiting.gpu_lane_cost_s = 1.0;
        assert_eq!(verdict_of(&waiting, None), Verdict::InputBound("decode"));
        // Nothing measured on the GPU: no lane figure.
        assert_eq!(delta(10.0, 0.0, 1000, [0.0; 4]).gpu_lane_cost_pct(), None);
    }

    #[test]
    fn a_stall_mostly_at_epoch_starts_is_named_as_such() {
        let mut boundary = delta(10.0, 1.0, 1000, [0.0, 4.0, 1.0, 0.0]);
        boundary.epoch_start_wait_s = 0.8;
        assert_eq!(verdict_of(&boundary, None), Verdict::EpochBoundary);
        let mut decode = delta(10.0, 1.0, 1000, [0.0, 4.0, 1.0, 0.0]);
        decode.epoch_start_wait_s = 0.2;
        assert_eq!(verdict_of(&decode, None), Verdict::InputBound("decode"));
        let mut quiet = delta(10.0, 0.05, 1000, [0.0, 4.0, 1.0, 0.0]);
        quiet.epoch_start_wait_s = 0.05;
        assert_eq!(verdict_of(&quiet, None), Verdict::ComputeBound);
    }

    #[test]
    fn a_trainer_blocked_for_the_whole_window_is_input_bound_not_idle() {
        // Each batch takes longer than the window: no sample, the wait the whole time.
        let blocked = delta(10.0, 10.0, 0, [0.0; 4]);
        assert_eq!(
            verdict_of(&blocked, None),
            Verdict::InputBound(NO_BATCH_BUILT)
        );
        assert_eq!(
            verdict_of(&blocked, None).to_string(),
            "input-bound: no batch built"
        );
        let mut first = delta(10.0, 10.0, 0, [0.0; 4]);
        first.epoch_start_wait_s = 10.0;
        assert_eq!(verdict_of(&first, None), Verdict::EpochBoundary);
        // Paused (an evaluation outside the loader, the run over): idle.
        assert_eq!(
            verdict_of(&delta(10.0, 0.0, 0, [0.0; 4]), None),
            Verdict::Idle
        );
    }

    /// The GPU's measured idle counts as a wait: a loop that runs ahead of the GPU waits
    /// little in `next()` while the GPU sits idle for the batch; it read "compute-bound".
    #[test]
    fn a_gpu_idle_for_the_batch_is_input_bound_though_the_host_waited_little() {
        let mut ahead = delta(10.0, 0.05, 1600, [1.0, 6.0, 1.0, 0.5]);
        ahead.gpu_span_s = 10.0;
        ahead.gpu_idle_s = 2.0;
        assert_eq!(verdict_of(&ahead, None), Verdict::InputBound("decode"));
        // No host wait at all: still the GPU's idle, not an epoch boundary (0 >= 0).
        ahead.wait_s = 0.0;
        assert_eq!(verdict_of(&ahead, None), Verdict::InputBound("decode"));
        ahead.wait_s = 0.05;
        ahead.gpu_idle_s = 0.05;
        assert_eq!(verdict_of(&ahead, None), Verdict::ComputeBound);
    }

    #[test]
    fn a_stall_share_is_at_most_the_whole_time() {
        let before = LoaderStats::default();
        let after = LoaderStats {
            elapsed_s: 0.5,
            wait_s: 0.500_01,
            ..LoaderStats::default()
        };
        assert_eq!(
            Delta::between(&before, &after, 0.5).stall_pct(),
            Some(100.0)
        );
    }

    #[test]
    fn rounding_matches_to_fixed() {
        assert_eq!(round(12.345_67, 1), 12.3);
        assert_eq!(round(0.25, 1), 0.3);
        assert_eq!(round(2.0 / 3.0, 2), 0.67);
    }

    /// A trainer waiting while the decode threads sat mostly idle (tiny batches handed over
    /// one by one, the wire, a remote worker) waits on none of their stages: the verdict named
    /// the largest of them ("input-bound: read" at 0% busy), sending the user to speed up what
    /// is not slow.
    #[test]
    fn a_wait_with_the_decode_threads_mostly_idle_names_no_stage_of_theirs() {
        // 83% stall; 0.01 s of stage time on 8 threads over 10 s.
        let idle = delta(10.0, 8.3, 1000, [0.01, 0.0, 0.0, 0.0]);
        assert_eq!(verdict_of(&idle, Some(8)), Verdict::NotTheDecodeThreads);
        assert_eq!(
            verdict_of(&idle, Some(8)).to_string(),
            "input-bound: not the decode threads (mostly idle)"
        );
        // One thread busy 9 s of 10: the stage is named; sixteen, barely busy: not.
        let busy = delta(10.0, 8.3, 1000, [0.0, 8.0, 1.0, 0.0]);
        assert_eq!(verdict_of(&busy, Some(1)), Verdict::InputBound("decode"));
        assert_eq!(verdict_of(&busy, Some(16)), Verdict::NotTheDecodeThreads);
        // Threads unknown (none reported): the stage, as before.
        assert_eq!(verdict_of(&idle, None), Verdict::InputBound("read"));
        assert_eq!(verdict_of(&idle, Some(0)), Verdict::InputBound("read"));
    }
}
