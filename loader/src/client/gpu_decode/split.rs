//! Which rows of a batch the GPU lane gets: a share in sixteenths, spread evenly over the rows
//! ([`gpu_row`]), and, for `decode="auto"`, the points where that share may change and how it
//! is chosen there ([`SplitSchedule`]).
//!
//! `auto` may change its share only at fixed points: the first step of each epoch and every
//! [`AUTO_POINT_STEPS`] steps after it. The share of a point is decided once, when a step of it
//! is first built, from the rates the two lanes showed since the previous decision, and then
//! kept; so which decoder a sample gets never depends on timing within a point, and a resumed
//! run that is given the saved share of its point builds the same rows on the same lanes.

use std::collections::BTreeMap;

/// The split `auto` starts from, in sixteenths of a batch for the GPU.
pub const AUTO_START: u8 = 8;

/// Steps between the points where `auto` may change its split (each epoch starts a point).
pub const AUTO_POINT_STEPS: u64 = 16;

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
    /// The split these counts call for, when both lanes built rows in them.
    fn split(&self) -> Option<u8> {
        if self.gpu_rows == 0
            || self.cpu_rows == 0
            || self.gpu_busy_ns == 0
            || self.cpu_busy_ns == 0
        {
            return None;
        }
        let rate = |rows: u64, ns: u64| rows as f64 * 1e9 / ns as f64;
        Some(split_for_rates(
            rate(self.cpu_rows, self.cpu_busy_ns),
            rate(self.gpu_rows, self.gpu_busy_ns),
        ))
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

/// `auto`'s split at each point (see the module docs): decided once per point, or set from a
/// saved state.
#[derive(Debug, Default)]
pub struct SplitSchedule {
    /// (epoch, first step of the point) -> sixteenths.
    decided: BTreeMap<(u64, u64), u8>,
    /// The counts at the last decision.
    counts_then: LaneCounts,
}

impl SplitSchedule {
    /// The split of the point `step` of `epoch` is in: the one decided or set for it, else one
    /// decided now from `counts` (the lanes' totals now) and kept. A decision follows the rates
    /// since the previous decision when both lanes built rows since; else those of every row
    /// so far; else it keeps the latest split (the starting one before any).
    pub fn split_at(&mut self, epoch: u64, step: u64, counts: LaneCounts) -> u8 {
        let key = (epoch, point_of(step));
        if let Some(&split) = self.decided.get(&key) {
            return split;
        }
        let split = counts
            .since(&self.counts_then)
            .split()
            .or_else(|| counts.split())
            .or_else(|| self.latest())
            .unwrap_or(AUTO_START);
        self.counts_then = counts;
        self.insert(key, split);
        split
    }

    /// Sets the split of the point `step` of `epoch` is in (a resumed run's, from its state).
    pub fn set(&mut self, epoch: u64, step: u64, sixteenths: u8) {
        self.insert((epoch, point_of(step)), sixteenths.min(16));
    }

    /// The split of the latest point decided or set, if any.
    pub fn latest(&self) -> Option<u8> {
        self.decided.last_key_value().map(|(_, split)| *split)
    }

    fn insert(&mut self, key: (u64, u64), split: u8) {
        self.decided.insert(key, split);
        let newest = self.decided.last_key_value().map_or(key.0, |(k, _)| k.0);
        let oldest_kept = newest.saturating_sub(EPOCHS_KEPT - 1);
        self.decided.retain(|(epoch, _), _| *epoch >= oldest_kept);
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

    #[test]
    fn a_point_keeps_its_split_whatever_is_measured_after_it() {
        let mut schedule = SplitSchedule::default();
        assert_eq!(schedule.split_at(0, 0, LaneCounts::default()), AUTO_START);
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
    fn a_decision_follows_the_rates_since_the_one_before() {
        let mut schedule = SplitSchedule::default();
        // Point 0: nothing measured yet.
        assert_eq!(schedule.split_at(0, 0, LaneCounts::default()), AUTO_START);
        // Point 1: the GPU ran at 3x the CPU's rate (a slow start would weigh on the totals).
        let first = counts(1000, 3000, 1000, 1000);
        assert_eq!(schedule.split_at(0, AUTO_POINT_STEPS, first), 12);
        // Point 2: since then the two ran alike; only that window counts (the totals would
        // still favour the GPU).
        let second = add(first, counts(1000, 1000, 1000, 1000));
        assert_eq!(schedule.split_at(0, 2 * AUTO_POINT_STEPS, second), 8);
        // Point 3: nothing new on the CPU side since: the totals decide.
        let third = add(second, counts(500, 1000, 0, 1));
        let totals = split_for_rates(
            2000.0 / (2000.0 / 1000.0),
            2500.0 / (1000.0 / 3000.0 + 1500.0 / 1000.0),
        );
        assert_eq!(schedule.split_at(0, 3 * AUTO_POINT_STEPS, third), totals);
        // A new epoch starts a point of its own.
        let fourth = add(third, counts(1000, 1000, 1000, 3000));
        assert_eq!(schedule.split_at(1, 5, fourth), 4);
        assert_eq!(schedule.latest(), Some(4));
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
