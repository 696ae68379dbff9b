//! What a decode lane beside the training step costs the step: the consumer's GPU stream is
//! busier per step while the lane works than while it is quiet (the lane's host calls and
//! kernels delay the training loop's launches and share the GPU), a cost no wait inside
//! `next()` shows.
//!
//! Each step the consumer measured comes with the share of its host window the lane worked
//! ([`LaneWindow`]). A step with the lane working under [`QUIET`] of that window is *quiet*;
//! any other is *beside* the lane. The cost of a step beside the lane is how much longer the
//! stream was busy on the recent steps beside it than on the recent quiet ones (medians of
//! the last [`KEPT`] of each, so a paused loop or an evaluation step weighs one step, not its
//! length). Until [`MIN_QUIET`] quiet steps were measured there is no baseline and nothing is
//! counted: quiet steps come where the lane has nothing to build (an epoch's last batches, a
//! loader far enough ahead) and, under `decode="auto"`, from the points it builds with every
//! row on the CPU.

use std::collections::VecDeque;
use std::time::Duration;

/// A step counts as quiet when the lane worked under this share of its host window.
pub const QUIET: f64 = 0.05;

/// Recent steps of each kind kept for the medians.
pub const KEPT: usize = 32;

/// Quiet steps measured before a step beside the lane is given a cost.
pub const MIN_QUIET: usize = 4;

/// What the lane did in the host's window of one step: the time it worked, and the window
/// (from the consumer taking the batch before to taking this one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneWindow {
    /// The lane's busy time within the window.
    pub busy: Duration,
    /// The window.
    pub window: Duration,
}

impl LaneWindow {
    /// Whether the lane worked under [`QUIET`] of the window (a window of no length is
    /// neither: it says nothing).
    fn quiet(&self) -> Option<bool> {
        (!self.window.is_zero())
            .then_some(self.busy.as_secs_f64() < QUIET * self.window.as_secs_f64())
    }
}

/// The running cost (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct LaneCost {
    quiet: VecDeque<f64>,
    beside: VecDeque<f64>,
    /// Seconds the stream was busier on steps beside the lane than on quiet ones, so far.
    pub(crate) cost_s: f64,
    /// Quiet steps measured so far.
    pub(crate) quiet_steps: u64,
    /// Steps beside the lane measured so far.
    pub(crate) beside_steps: u64,
}

impl LaneCost {
    /// Counts one step whose stream was busy `busy` (its time less its wait for the batch)
    /// while the lane did `lane`.
    pub(crate) fn note(&mut self, busy: Duration, lane: LaneWindow) {
        let Some(quiet) = lane.quiet() else {
            return;
        };
        let (kept, count) = if quiet {
            (&mut self.quiet, &mut self.quiet_steps)
        } else {
            (&mut self.beside, &mut self.beside_steps)
        };
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(busy.as_secs_f64());
        *count += 1;
        if !quiet && self.quiet.len() >= MIN_QUIET {
            self.cost_s += (median(&self.beside) - median(&self.quiet)).max(0.0);
        }
    }
}

/// The median of `values` (not empty).
fn median(values: &VecDeque<f64>) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 0 {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    } else {
        sorted[middle]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn window(busy_ms: u64, window_ms: u64) -> LaneWindow {
        LaneWindow {
            busy: ms(busy_ms),
            window: ms(window_ms),
        }
    }

    #[test]
    fn steps_beside_the_lane_cost_what_they_take_over_the_quiet_ones() {
        let mut cost = LaneCost::default();
        // Beside the lane before any baseline: counted as steps, no cost.
        for _ in 0..3 {
            cost.note(ms(12), window(9, 12));
        }
        assert_eq!((cost.beside_steps, cost.cost_s), (3, 0.0));
        // Quiet steps (the lane under 5% of the window) take 10 ms; still under MIN_QUIET.
        for _ in 0..MIN_QUIET - 1 {
            cost.note(ms(10), window(0, 10));
        }
        cost.note(ms(12), window(9, 12));
        assert_eq!(cost.cost_s, 0.0, "three quiet steps are no baseline yet");
        cost.note(ms(10), window(0, 10));
        assert_eq!(cost.quiet_steps, MIN_QUIET as u64);
        // Now each step beside the lane costs its 2 ms over the quiet median.
        for _ in 0..10 {
            cost.note(ms(12), window(9, 12));
        }
        assert!((cost.cost_s - 0.020).abs() < 1e-9, "{}", cost.cost_s);
        assert_eq!(cost.beside_steps, 14);
    }

    #[test]
    fn a_long_step_weighs_one_step_and_a_faster_one_costs_nothing() {
        let mut cost = LaneCost::default();
        for _ in 0..8 {
            cost.note(ms(10), window(0, 10));
        }
        // An evaluation pause beside the lane: one long step moves the median by nothing.
        cost.note(ms(11), window(5, 11));
        cost.note(ms(11), window(5, 11));
        cost.note(ms(5_000), window(2_000, 5_000));
        assert!((cost.cost_s - 0.003).abs() < 1e-9, "{}", cost.cost_s);
        // Steps beside the lane that are faster than the quiet ones add nothing.
        let mut faster = LaneCost::default();
        for _ in 0..8 {
            faster.note(ms(10), window(0, 10));
        }
        faster.note(ms(9), window(5, 9));
        assert_eq!(faster.cost_s, 0.0);
    }

    #[test]
    fn quiet_is_under_a_twentieth_of_the_window_and_an_empty_window_says_nothing() {
        assert_eq!(window(0, 10).quiet(), Some(true));
        assert_eq!(
            LaneWindow {
                busy: Duration::from_micros(499),
                window: ms(10)
            }
            .quiet(),
            Some(true)
        );
        assert_eq!(window(1, 10).quiet(), Some(false));
        assert_eq!(window(0, 0).quiet(), None);
        let mut cost = LaneCost::default();
        cost.note(ms(10), window(0, 0));
        assert_eq!((cost.quiet_steps, cost.beside_steps), (0, 0));
    }

    #[test]
    fn the_medians_follow_the_last_kept_steps() {
        let mut cost = LaneCost::default();
        for _ in 0..KEPT {
            cost.note(ms(20), window(0, 20));
        }
        // The loop got faster: after KEPT new quiet steps the old ones are gone.
        for _ in 0..KEPT {
            cost.note(ms(10), window(0, 10));
        }
        cost.note(ms(11), window(5, 11));
        assert!((cost.cost_s - 0.001).abs() < 1e-9, "{}", cost.cost_s);
    }
}
