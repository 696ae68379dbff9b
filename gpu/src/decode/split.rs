//! Which rows of a batch the GPU lane gets: a share in sixteenths, spread evenly over the rows
//! ([`gpu_row`]), and, for `decode="auto"`, the points where that share may change and how it
//! is chosen there ([`SplitSchedule`]).
//!
//! `auto` may change its share only at fixed points: the first step of each epoch and every
//! [`AUTO_POINT_STEPS`] steps after it. The share of a point is decided once, when a step of it
//! is first built (or the loader's state is asked for there), from what the two lanes did
//! before, and then kept; so which decoder a sample gets never depends on timing within a
//! point, and a resumed run that is given the saved share of its point builds the same rows on
//! the same lanes.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

/// The split `auto` starts from, in sixteenths of a batch for the GPU.
pub const AUTO_START: u8 = 8;

/// Steps between the points where `auto` may change its split (each epoch starts a point).
pub const AUTO_POINT_STEPS: u64 = 16;

/// Set to a count of sixteenths (0 to 16), holds `auto`'s split there at every point: for
/// measuring what each split delivers.
pub const PIN_VARIABLE: &str = "STOKER_GPU_DECODE_SPLIT";

/// Epochs of decisions kept (the current one and the one before, whose last steps may still
/// be building or waiting for the training loop when the next epoch starts).
const EPOCHS_KEPT: u64 = 2;

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

/// The split [`PIN_VARIABLE`] holds `auto` at: its value when that is a count from 0 to 16,
/// else none (with a warning when it is set to something else).
pub fn pinned_split(asked: Option<&str>) -> Option<u8> {
    let asked = asked?;
    match asked.trim().parse::<u8>() {
        Ok(sixteenths) if sixteenths <= 16 => Some(sixteenths),
        _ => {
            tracing::warn!(
                asked,
                "{PIN_VARIABLE} is not a count of sixteenths from 0 to 16; auto decides"
            );
            None
        }
    }
}

/// The first step of the point `step` is in.
pub fn point_of(step: u64) -> u64 {
    step - step % AUTO_POINT_STEPS
}

/// What the two lanes did so far: rows built and the time spent on them, in nanoseconds
/// (running totals; a decision looks at what changed since the one before).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneCounts {
    /// Rows the GPU lane built.
    pub gpu_rows: u64,
    /// Time the GPU lane worked.
    pub gpu_busy_ns: u64,
    /// Rows the decode threads built in batches the lane also worked on.
    pub cpu_rows: u64,
    /// Time the decode threads spent on those batches.
    pub cpu_busy_ns: u64,
}

impl LaneCounts {
    /// Rows per second of the GPU lane while it worked (0 before it did).
    pub fn gpu_rate(&self) -> f64 {
        rate(self.gpu_rows, self.gpu_busy_ns)
    }

    /// Rows per second of the decode threads in the batches the lane also worked on.
    pub fn cpu_rate(&self) -> f64 {
        rate(self.cpu_rows, self.cpu_busy_ns)
    }

    /// The split these counts call for, when both lanes built rows in them.
    fn split(&self) -> Option<u8> {
        (self.gpu_rate() > 0.0 && self.cpu_rate() > 0.0)
            .then(|| split_for_rates(self.cpu_rate(), self.gpu_rate()))
    }

    fn since(&self, earlier: &LaneCounts) -> LaneCounts {
        LaneCounts {
            gpu_rows: self.gpu_rows.saturating_sub(earlier.gpu_rows),
            gpu_busy_ns: self.gpu_busy_ns.saturating_sub(earlier.gpu_busy_ns),
            cpu_rows: self.cpu_rows.saturating_sub(earlier.cpu_rows),
            cpu_busy_ns: self.cpu_busy_ns.saturating_sub(earlier.cpu_busy_ns),
        }
    }
}

/// Steps counted at one split before its time per row is compared with another split's.
const MIN_STEPS: u32 = 8;

/// Steps after a change of split that are not counted: the batches around the change share
/// the lanes with the other split's.
const SETTLING_STEPS: u32 = 3;

/// A batch that came this many times later than the mean of the last [`RECENT`] (per row) is
/// not counted: the training loop paused (an evaluation, a checkpoint). The mean, not the
/// median: batches handed out in pairs give intervals both far below and far above it.
const OUTLIER: f64 = 4.0;

/// Intervals the mean for [`OUTLIER`] is taken over.
const RECENT: usize = 8;

/// Rows after which a measure's older rows weigh half as much (about two points of 256-row
/// batches), so that it follows the recent pace.
const HALF_LIFE_ROWS: f64 = 8192.0;

/// Decisions after which a split's measured time is too old to compare: its neighbours are
/// tried again, so the split follows a change in the load.
const STALE_DECISIONS: u64 = 16;

/// How much less time per row a neighbouring split must have taken for a move to it (what
/// one point's measurement varies by).
const MARGIN: f64 = 0.03;

/// Decisions between two points built with the lane quiet (every row on the CPU): the steps
/// the loader's figures compare the steps beside the lane with, and a split `auto` keeps when
/// its batches came faster. One point in this many, about 1% of the steps at most.
pub const QUIET_EVERY: u64 = 128;

/// The time per row of the batches built at one split: the time between batches over the rows
/// they brought, summed (two batches handed out together give one long and one short
/// interval, so the sums, not each interval, carry the pace), older ones weighing less.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    /// Rows counted, discounted by age.
    rows: f64,
    /// Nanoseconds counted, discounted alike.
    ns: f64,
    /// Steps counted since the measure (re)started.
    steps: u32,
    /// The decision count when a step was last counted.
    at: u64,
}

/// `rows` per second of `busy_ns` (0 without any).
fn rate(rows: u64, busy_ns: u64) -> f64 {
    if busy_ns == 0 {
        0.0
    } else {
        rows as f64 * 1e9 / busy_ns as f64
    }
}

/// `auto`'s split at each point (see the module docs): decided once per point, or set from a
/// saved state.
///
/// What a split is worth is the time per row between the batches built with it as they were
/// handed to the training loop ([`SplitSchedule::note_delivered`]): the pace the loop got,
/// which counts the loader when either lane is behind, and what the lanes cost the loop itself
/// (the host's cores and the GPU they share with it). The first decision after [`MIN_STEPS`]
/// steps of the current split takes the split that gives each lane rows in proportion to its
/// measured rate ([`split_for_rates`]). Those rates are each lane's own (rows per second while
/// it worked), and the two lanes slow each other and the loop, so that split can be off, and
/// there can be a better one far from it: with every row on the GPU the decode threads leave
/// the lane's threads the cores. So the next decision tries every row on the GPU for a point
/// (and more, until its batches have reached the loop: decisions are made as the producer
/// starts a point, ahead of the loop by the prefetch depth, and keep the split until it is
/// measured), and the one after keeps it if its batches came faster, else goes back; later
/// decisions move by one sixteenth at most, toward the split whose batches came fastest, and
/// try all rows on the GPU again once its measure is old. Every [`QUIET_EVERY`] decisions a
/// point goes to the CPU alone (the lane quiet), kept like the probe of every row on the GPU
/// if its batches came faster: the lane's work beside the training step costs the step
/// itself (its launches come late), which the pace of the loop shows and this compares.
#[derive(Debug)]
pub struct SplitSchedule {
    /// The split every decision takes, when one is pinned ([`PIN_VARIABLE`]).
    pinned: Option<u8>,
    /// (epoch, first step of the point) -> sixteenths.
    decided: BTreeMap<(u64, u64), u8>,
    /// The counts at the last decision.
    counts_then: LaneCounts,
    /// What steps built at each split (0 to 16) took.
    measured: [Measured; 17],
    /// Decisions so far (the age of a measure).
    decisions: u64,
    /// Whether the split from the rates was taken (after it, moves are by one).
    estimated: bool,
    /// The way the last move went: +1 more rows to the GPU, -1 fewer.
    direction: i8,
    /// The split to go back to when trying all rows on the GPU, or none, showed nothing better.
    probed_from: Option<u8>,
    /// The decision count from which the next point with the lane quiet is due.
    quiet_due: u64,
    /// The split of the last step counted, and steps at it since the change.
    last_noted: (u8, u32),
    /// The last intervals per row, any split (for the mean [`OUTLIER`] compares with).
    recent: VecDeque<f64>,
}

impl Default for SplitSchedule {
    fn default() -> Self {
        SplitSchedule::new(None)
    }
}

impl SplitSchedule {
    /// A schedule whose decisions all take `pinned` when it is some, else follow the lanes.
    pub fn new(pinned: Option<u8>) -> SplitSchedule {
        SplitSchedule {
            pinned: pinned.map(|split| split.min(16)),
            decided: BTreeMap::new(),
            counts_then: LaneCounts::default(),
            measured: [Measured::default(); 17],
            decisions: 0,
            estimated: false,
            direction: 1,
            probed_from: None,
            quiet_due: QUIET_EVERY,
            last_noted: (AUTO_START, 0),
            recent: VecDeque::with_capacity(RECENT),
        }
    }

    /// The split of the point `step` of `epoch` is in: the one decided or set for it, else one
    /// decided now (see the type's docs; `counts` are the lanes' totals now) and kept. Until
    /// the current split has [`MIN_STEPS`] steps measured a decision keeps it (the starting
    /// one before any). A pinned split is every decision.
    pub fn split_at(&mut self, epoch: u64, step: u64, counts: LaneCounts) -> u8 {
        let key = (epoch, point_of(step));
        if let Some(&split) = self.decided.get(&key) {
            return split;
        }
        let split = match self.pinned {
            Some(pinned) => pinned,
            None => self.decide(counts),
        };
        self.decisions += 1;
        self.insert(key, split);
        split
    }

    /// Counts a batch of `rows` rows, step `step` of `epoch`, handed out `interval_ns` after
    /// the one before, for the split its point was decided with (none: not counted).
    pub fn note_delivered(&mut self, epoch: u64, step: u64, rows: usize, interval_ns: u64) {
        if let Some(&split) = self.decided.get(&(epoch, point_of(step))) {
            self.note_step(split, rows, interval_ns);
        }
    }

    /// Counts a step of `rows` rows built at `split` whose batch came `ns` after the one
    /// before.
    fn note_step(&mut self, split: u8, rows: usize, ns: u64) {
        let split = split.min(16);
        let since_change = if self.last_noted.0 == split {
            self.last_noted.1.saturating_add(1)
        } else {
            1
        };
        self.last_noted = (split, since_change);
        if rows == 0 {
            return;
        }
        let per_row = ns as f64 / rows as f64;
        let recent_mean = self.recent.iter().sum::<f64>() / self.recent.len().max(1) as f64;
        let paused = self.recent.len() >= 3 && per_row > OUTLIER * recent_mean;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(per_row);
        if paused || since_change <= SETTLING_STEPS {
            return;
        }
        let decisions = self.decisions;
        let measured = &mut self.measured[usize::from(split)];
        if decisions - measured.at > STALE_DECISIONS {
            *measured = Measured::default();
        }
        let keep = 0.5f64.powf(rows as f64 / HALF_LIFE_ROWS);
        measured.rows = measured.rows * keep + rows as f64;
        measured.ns = measured.ns * keep + ns as f64;
        measured.steps = measured.steps.saturating_add(1);
        measured.at = decisions;
    }

    /// Sets the split of the point `step` of `epoch` is in (a resumed run's, from its state).
    /// A resume starts the run's course again there: the points decided after it, or more
    /// than an epoch before it, are let go. Returns whether batches built ahead may carry
    /// another split than the course from here will give them (the point was decided with
    /// another split, or a later point was decided at all): they must not be handed out.
    pub fn set(&mut self, epoch: u64, step: u64, sixteenths: u8) -> bool {
        let key = (epoch, point_of(step));
        let sixteenths = sixteenths.min(16);
        let changed = self.decided.get(&key).is_some_and(|&had| had != sixteenths)
            || self
                .decided
                .range((Bound::Excluded(key), Bound::Unbounded))
                .next()
                .is_some();
        self.decided
            .retain(|&(e, point), _| (e, point) < key && e.saturating_add(EPOCHS_KEPT) > epoch);
        self.decided.insert(key, sixteenths);
        self.probed_from = None;
        changed
    }

    /// The split of the latest point decided or set, if any.
    pub fn latest(&self) -> Option<u8> {
        self.decided.last_key_value().map(|(_, split)| *split)
    }

    /// The time per row measured at `split`, when enough steps of it are and not too old.
    fn known(&self, split: u8) -> Option<f64> {
        let measured = self.measured[usize::from(split)];
        (measured.steps >= MIN_STEPS && self.decisions - measured.at <= STALE_DECISIONS)
            .then(|| measured.ns / measured.rows)
    }

    fn decide(&mut self, counts: LaneCounts) -> u8 {
        let current = self.latest().unwrap_or(AUTO_START);
        let window = counts.since(&self.counts_then);
        self.counts_then = counts;
        let Some(here) = self.known(current) else {
            return current;
        };
        if !self.estimated {
            if let Some(split) = window.split().or_else(|| counts.split()) {
                self.estimated = true;
                self.direction = if split >= current { 1 } else { -1 };
                return split;
            }
            return current;
        }
        let better = |time: f64| time < here * (1.0 - MARGIN);
        // After a point with every row on the GPU, or none: keep it if its batches came faster
        // (or the split before has no measure left to compare with), else back.
        if let Some(from) = self.probed_from.take() {
            if current == 16 || current == 0 {
                if self
                    .known(from)
                    .is_none_or(|time| here < time * (1.0 - MARGIN))
                {
                    self.direction = if current == 0 { 1 } else { -1 };
                    return current;
                }
                return from;
            }
        }
        // The lane quiet for a point, when that is due and was not measured lately.
        if current > 0 && self.decisions >= self.quiet_due {
            self.quiet_due = self.decisions + QUIET_EVERY;
            if self.known(0).is_none() {
                self.probed_from = Some(current);
                return 0;
            }
        }
        // Every row on the GPU once more, when that was not measured lately.
        if current < 16 && self.known(16).is_none() {
            self.probed_from = Some(current);
            return 16;
        }
        let next = |direction: i8| {
            let split = i16::from(current) + i16::from(direction);
            (0..=16).contains(&split).then_some(split as u8)
        };
        let (forward, back) = (next(self.direction), next(-self.direction));
        let back_time = back.and_then(|b| self.known(b));
        // Back the other way, when that was faster.
        if let (Some(back), Some(time)) = (back, back_time) {
            if better(time) {
                self.direction = -self.direction;
                return back;
            }
        }
        // On while the last move gained (or where it came from is not measured).
        let gaining = back_time.is_none_or(|time| here < time * (1.0 - MARGIN));
        if let Some(forward) = forward {
            match self.known(forward) {
                None if gaining => return forward,
                Some(time) if better(time) => return forward,
                _ => {}
            }
        }
        // Forward is slower (or the end, or no gain): the other way once, if not measured.
        if let Some(back) = back.filter(|_| back_time.is_none()) {
            self.direction = -self.direction;
            return back;
        }
        current
    }

    /// Keeps `split` for the point `key`, with the points of the newest epoch and the one
    /// before it. A point of an epoch older than those (the run went back, as `set_epoch` may)
    /// starts the course again there, as [`Self::set`] does: the later epochs' points go, and
    /// the new point is kept rather than let go as too old.
    fn insert(&mut self, key: (u64, u64), split: u8) {
        let newest = self
            .decided
            .last_key_value()
            .map_or(key.0, |(&(epoch, _), _)| epoch.max(key.0));
        let newest = if key.0.saturating_add(EPOCHS_KEPT) <= newest {
            key.0
        } else {
            newest
        };
        self.decided
            .retain(|&(epoch, _), _| epoch <= newest && epoch.saturating_add(EPOCHS_KEPT) > newest);
        self.decided.insert(key, split);
    }
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

    /// Totals after the GPU built `gpu` rows and the CPU `cpu` rows, each at a rate (rows/s).
    fn counts(gpu: u64, gpu_rate: u64, cpu: u64, cpu_rate: u64) -> LaneCounts {
        LaneCounts {
            gpu_rows: gpu,
            gpu_busy_ns: gpu * 1_000_000_000 / gpu_rate,
            cpu_rows: cpu,
            cpu_busy_ns: cpu * 1_000_000_000 / cpu_rate,
        }
    }

    fn add(a: LaneCounts, b: LaneCounts) -> LaneCounts {
        LaneCounts {
            gpu_rows: a.gpu_rows + b.gpu_rows,
            gpu_busy_ns: a.gpu_busy_ns + b.gpu_busy_ns,
            cpu_rows: a.cpu_rows + b.cpu_rows,
            cpu_busy_ns: a.cpu_busy_ns + b.cpu_busy_ns,
        }
    }

    #[test]
    fn points_start_each_epoch_and_every_point_steps() {
        assert_eq!(point_of(0), 0);
        assert_eq!(point_of(AUTO_POINT_STEPS - 1), 0);
        assert_eq!(point_of(AUTO_POINT_STEPS), AUTO_POINT_STEPS);
        assert_eq!(point_of(3 * AUTO_POINT_STEPS + 5), 3 * AUTO_POINT_STEPS);
    }

    /// `known` is `expected`, to a part in a million.
    #[track_caller]
    fn assert_close(known: Option<f64>, expected: f64) {
        let Some(known) = known else {
            panic!("nothing known, {expected} expected");
        };
        assert!(
            (known - expected).abs() < expected * 1e-6,
            "{known} against {expected}"
        );
    }

    /// Counts `steps` steps of 256 rows at `split`, each taking `ns_per_row` per row.
    fn note(schedule: &mut SplitSchedule, split: u8, steps: u32, ns_per_row: u64) {
        for _ in 0..steps {
            schedule.note_step(split, 256, 256 * ns_per_row);
        }
    }

    #[test]
    fn a_point_keeps_its_split_whatever_is_measured_after_it() {
        let mut schedule = SplitSchedule::default();
        assert_eq!(schedule.split_at(0, 0, LaneCounts::default()), AUTO_START);
        note(&mut schedule, AUTO_START, SETTLING_STEPS + MIN_STEPS, 1000);
        // Within the point, later rates change nothing.
        let fast_gpu = counts(3000, 30_000, 1000, 1000);
        for step in 1..AUTO_POINT_STEPS {
            assert_eq!(schedule.split_at(0, step, fast_gpu), AUTO_START);
        }
        // The next point follows them.
        assert_eq!(schedule.split_at(0, AUTO_POINT_STEPS, fast_gpu), 15);
        // Asked again, in any order, a decided point answers the same.
        assert_eq!(
            schedule.split_at(0, 3, counts(1, 1, 1, 1_000_000)),
            AUTO_START
        );
        assert_eq!(
            schedule.split_at(0, AUTO_POINT_STEPS + 2, LaneCounts::default()),
            15
        );
    }

    #[test]
    fn the_first_move_waits_for_steps_of_the_split_and_follows_the_rates_since_the_last_decision() {
        let mut schedule = SplitSchedule::default();
        assert_eq!(schedule.split_at(0, 0, LaneCounts::default()), AUTO_START);
        // Rates, but too few steps of the split measured yet (the producer is behind the
        // decisions): the split is kept.
        let slow_start = counts(1000, 1000, 1000, 1000);
        note(
            &mut schedule,
            AUTO_START,
            SETTLING_STEPS + MIN_STEPS - 1,
            1000,
        );
        assert_eq!(
            schedule.split_at(0, AUTO_POINT_STEPS, slow_start),
            AUTO_START
        );
        // Once they are, the rates since that decision count (the GPU at 3x the CPU), not
        // the slow start before it.
        note(&mut schedule, AUTO_START, 1, 1000);
        let later = add(slow_start, counts(3000, 3000, 1000, 1000));
        assert_eq!(schedule.split_at(0, 2 * AUTO_POINT_STEPS, later), 12);
    }

    /// Runs `points` points of a schedule against the time per row at each split
    /// (`time(split)`), every step measured before the next decision; returns the splits.
    fn climb(schedule: &mut SplitSchedule, points: u64, time: impl Fn(u8) -> u64) -> Vec<u8> {
        let mut splits = Vec::new();
        for point in 0..points {
            let counts = counts(1000 * (point + 1), 2000, 1000 * (point + 1), 1000);
            let split = schedule.split_at(0, point * AUTO_POINT_STEPS, counts);
            note(schedule, split, AUTO_POINT_STEPS as u32, time(split));
            splits.push(split);
        }
        splits
    }

    #[test]
    fn all_rows_on_the_gpu_are_tried_then_moves_go_by_one_toward_the_least_time() {
        // The rates say 11 (the GPU at twice the CPU's rate); the producer is fastest at 14.
        let mut schedule = SplitSchedule::default();
        let splits = climb(&mut schedule, 40, |split| {
            100 + 20 * u64::from(split.abs_diff(14))
        });
        // 16 took less time than 11, so it is kept, and the moves go down from there, one
        // past the best.
        assert_eq!(
            &splits[..8],
            [AUTO_START, 11, 16, 16, 15, 14, 13, 14],
            "{splits:?}"
        );
        // It stays, trying all on the GPU and the neighbours again only once their measures
        // are old.
        let later = &splits[8..];
        assert!(
            later.iter().filter(|&&s| s == 14).count() >= later.len() * 3 / 4,
            "{splits:?}"
        );
        assert!(later.iter().all(|s| (13..=16).contains(s)), "{splits:?}");
        // The best may be all rows on the GPU...
        let mut schedule = SplitSchedule::default();
        let splits = climb(&mut schedule, 12, |split| 300 - 10 * u64::from(split));
        assert_eq!(&splits[..6], [AUTO_START, 11, 16, 16, 15, 16], "{splits:?}");
        assert!(splits[6..].iter().all(|&s| s == 16), "{splits:?}");
        // ...or none: 16 took longer than 11, so back to 11, then down.
        let mut schedule = SplitSchedule::default();
        let splits = climb(&mut schedule, 20, |split| 100 + 10 * u64::from(split));
        assert_eq!(&splits[..6], [AUTO_START, 11, 16, 11, 12, 11], "{splits:?}");
        assert_eq!(splits.last(), Some(&0), "{splits:?}");
    }

    #[test]
    fn a_point_on_the_cpu_alone_is_tried_now_and_then_and_kept_when_faster() {
        // The lane slows the training loop: the CPU alone is fastest, but no climb from the
        // start reaches it (16 is tried and kept, the moves down stop at 14, within the margin
        // of their neighbours).
        let lane_beside = |split: u8| {
            if split == 0 {
                800
            } else {
                1000 - u64::from(split)
            }
        };
        let mut schedule = SplitSchedule::default();
        let splits = climb(&mut schedule, QUIET_EVERY + 20, lane_beside);
        let first_quiet = splits.iter().position(|&s| s == 0);
        // The first point on the CPU alone comes once QUIET_EVERY decisions were made...
        assert_eq!(first_quiet, Some(QUIET_EVERY as usize), "{splits:?}");
        // ...and, faster, it is kept.
        assert_eq!(splits[QUIET_EVERY as usize + 1], 0, "{splits:?}");
        // Slower, it is left for the split before it, and tried again QUIET_EVERY later.
        let mut schedule = SplitSchedule::default();
        let splits = climb(&mut schedule, 2 * QUIET_EVERY + 4, |split| {
            100 + 20 * u64::from(split.abs_diff(14))
        });
        let quiet: Vec<usize> = (0..splits.len()).filter(|&i| splits[i] == 0).collect();
        assert_eq!(
            quiet,
            [QUIET_EVERY as usize, 2 * QUIET_EVERY as usize],
            "{splits:?}"
        );
        assert_eq!(
            splits[QUIET_EVERY as usize + 1],
            splits[QUIET_EVERY as usize - 1]
        );
        // A pinned split has no quiet points.
        let mut schedule = SplitSchedule::new(Some(12));
        let splits = climb(&mut schedule, QUIET_EVERY + 4, lane_beside);
        assert!(splits.iter().all(|&s| s == 12));
    }

    #[test]
    fn all_rows_on_the_gpu_stay_when_the_split_before_has_no_measure_left() {
        let mut schedule = SplitSchedule::default();
        // Points 0 and 1 at the start and the rates' split, then the probe of 16.
        let splits = climb(&mut schedule, 3, |split| 100 + u64::from(split));
        assert_eq!(splits, [AUTO_START, 11, 16]);
        // The split before the probe grows old while the probe's batches are on their way.
        schedule.decisions += STALE_DECISIONS + 1;
        note(&mut schedule, 16, SETTLING_STEPS + MIN_STEPS, 116);
        assert_eq!(schedule.known(11), None);
        // Nothing to compare with: all on the GPU stays (slower than 11 was, unknown now).
        assert_eq!(
            schedule.split_at(0, 3 * AUTO_POINT_STEPS, LaneCounts::default()),
            16
        );
    }

    #[test]
    fn a_neighbour_within_the_margin_is_no_move() {
        let mut schedule = SplitSchedule::default();
        // Every split takes the same time (give or take 1%): all rows on the GPU gain
        // nothing, so back, then one step on gains nothing, so it stays.
        let splits = climb(&mut schedule, 12, |split| 1000 + u64::from(split % 2) * 10);
        assert_eq!(&splits[..5], [AUTO_START, 11, 16, 11, 12], "{splits:?}");
        assert!(splits[5..].iter().all(|&s| s == 12), "{splits:?}");
    }

    #[test]
    fn the_steps_right_after_a_change_are_not_counted() {
        let mut schedule = SplitSchedule::default();
        // The first steps at a new split are slower (twice: no pause), sharing the lanes with
        // the old split's batches.
        note(&mut schedule, 5, SETTLING_STEPS, 200);
        note(&mut schedule, 5, MIN_STEPS - 1, 100);
        assert_eq!(schedule.known(5), None);
        note(&mut schedule, 5, 1, 100);
        assert_close(schedule.known(5), 100.0);
        // Back and forth: each change starts the count again.
        note(&mut schedule, 6, 1, 200);
        note(&mut schedule, 5, SETTLING_STEPS, 200);
        assert_close(schedule.known(5), 100.0);
        assert_eq!(schedule.known(6), None);
    }

    #[test]
    fn batches_handed_out_in_pairs_count_at_their_pace() {
        let mut schedule = SplitSchedule::default();
        note(&mut schedule, 7, SETTLING_STEPS, 100);
        // Two batches at once, then none for two intervals' time: 190 and 10 per row.
        for _ in 0..MIN_STEPS {
            note(&mut schedule, 7, 1, 190);
            note(&mut schedule, 7, 1, 10);
        }
        // Within 2% (the last intervals weigh a little more than the first).
        let pace = schedule.known(7).unwrap_or_default();
        assert!((pace - 100.0).abs() < 2.0, "{pace}");
    }

    #[test]
    fn a_resume_starts_the_course_again_at_its_point() {
        let mut schedule = SplitSchedule::default();
        for epoch in 3..=4 {
            for point in 0..3 {
                schedule.split_at(epoch, point * AUTO_POINT_STEPS, LaneCounts::default());
            }
        }
        // Back to epoch 3, step 40 (point 32): its split holds, the points after it (of this
        // and later epochs) are let go, and so is what lies more than an epoch before. Batches
        // built ahead may carry those later points' splits: reported.
        assert!(schedule.set(3, 40, AUTO_START));
        // Again, with nothing decided after it and the same split: nothing to report.
        assert!(!schedule.set(3, 40, AUTO_START));
        // Another split for the point: reported.
        assert!(schedule.set(3, 40, 12));
        assert_eq!(schedule.latest(), Some(12));
        assert_eq!(schedule.split_at(3, 47, LaneCounts::default()), 12);
        assert_eq!(schedule.decided.len(), 3);
        assert!(schedule.decided.keys().all(|&(epoch, _)| epoch == 3));
        // Setting where nothing was decided, before or after, changes nothing built.
        assert!(!schedule.set(9, 0, 4));
        assert_eq!(schedule.decided.len(), 1);
    }

    #[test]
    fn a_batch_counts_for_the_split_its_point_was_decided_with() {
        let mut schedule = SplitSchedule::default();
        schedule.set(2, 0, 6);
        // Step 20 of epoch 2 is in a point not decided yet: not counted.
        for _ in 0..MIN_STEPS + SETTLING_STEPS {
            schedule.note_delivered(2, 20, 256, 256 * 50);
        }
        assert!((0..=16).all(|split| schedule.known(split).is_none()));
        for step in 0..u64::from(MIN_STEPS + SETTLING_STEPS) {
            schedule.note_delivered(2, step, 256, 256 * 50);
        }
        assert_close(schedule.known(6), 50.0);
    }

    #[test]
    fn a_pause_of_the_training_loop_is_not_counted() {
        let mut schedule = SplitSchedule::default();
        note(&mut schedule, 9, SETTLING_STEPS + MIN_STEPS, 100);
        // An evaluation between two batches.
        note(&mut schedule, 9, 1, 100 * 60);
        assert_close(schedule.known(9), 100.0);
        // A pause right after the settling steps is dropped too (they set the recent mean).
        let mut schedule = SplitSchedule::default();
        note(&mut schedule, 9, SETTLING_STEPS, 100);
        note(&mut schedule, 9, 1, 100 * 60);
        note(&mut schedule, 9, MIN_STEPS, 100);
        assert_close(schedule.known(9), 100.0);
    }

    #[test]
    fn without_rates_a_decision_keeps_the_latest_split() {
        let mut schedule = SplitSchedule::default();
        schedule.set(4, 40, 13);
        // The set split covers its point; the next point, with nothing measured, keeps it.
        assert_eq!(
            schedule.split_at(4, point_of(40), LaneCounts::default()),
            13
        );
        assert_eq!(schedule.split_at(4, 47, LaneCounts::default()), 13);
        assert_eq!(schedule.split_at(4, 48, LaneCounts::default()), 13);
        // A set split is capped at 16.
        schedule.set(4, 64, 99);
        assert_eq!(schedule.split_at(4, 70, LaneCounts::default()), 16);
    }

    #[test]
    fn a_pinned_split_is_every_decision() {
        assert_eq!(pinned_split(None), None);
        assert_eq!(pinned_split(Some("12")), Some(12));
        assert_eq!(pinned_split(Some(" 0 ")), Some(0));
        assert_eq!(pinned_split(Some("16")), Some(16));
        for wrong in ["17", "-1", "half", ""] {
            assert_eq!(pinned_split(Some(wrong)), None, "{wrong:?}");
        }
        let mut schedule = SplitSchedule::new(Some(14));
        let fast_cpu = counts(100, 100, 100_000, 100_000);
        assert_eq!(schedule.split_at(0, 0, LaneCounts::default()), 14);
        assert_eq!(schedule.split_at(0, AUTO_POINT_STEPS, fast_cpu), 14);
        assert_eq!(schedule.split_at(1, 0, fast_cpu), 14);
        // A resumed state's split still covers its own point.
        schedule.set(1, AUTO_POINT_STEPS, 2);
        assert_eq!(schedule.split_at(1, AUTO_POINT_STEPS + 1, fast_cpu), 2);
        assert_eq!(schedule.split_at(1, 2 * AUTO_POINT_STEPS, fast_cpu), 14);
    }

    #[test]
    fn a_point_of_an_earlier_epoch_keeps_its_split_over_its_steps() {
        let mut schedule = SplitSchedule::default();
        note(&mut schedule, AUTO_START, SETTLING_STEPS + MIN_STEPS, 1000);
        for epoch in 5..=6 {
            schedule.split_at(epoch, 0, LaneCounts::default());
        }
        // A later point of the epoch before the newest (its last steps, built late) keeps the
        // newest epoch's points.
        schedule.split_at(5, AUTO_POINT_STEPS, LaneCounts::default());
        assert_eq!(schedule.decided.len(), 3);
        // The run goes back to epoch 4: its first point is decided once, from what was
        // measured, and kept over its steps whatever comes after.
        let first = schedule.split_at(4, 0, counts(3000, 30_000, 1000, 1000));
        assert_ne!(first, AUTO_START);
        for step in 1..AUTO_POINT_STEPS {
            assert_eq!(
                schedule.split_at(4, step, counts(1, 1, 1, 1_000_000)),
                first,
                "step {step}"
            );
        }
        assert_eq!(schedule.latest(), Some(first));
        assert!(schedule.decided.keys().all(|&(epoch, _)| epoch == 4));
    }

    #[test]
    fn old_epochs_are_let_go() {
        let mut schedule = SplitSchedule::default();
        for epoch in 0..10 {
            for step in (0..4 * AUTO_POINT_STEPS).step_by(AUTO_POINT_STEPS as usize) {
                schedule.split_at(epoch, step, LaneCounts::default());
            }
        }
        // Four points of each of the last two epochs.
        assert_eq!(schedule.decided.len(), 8);
    }
}
