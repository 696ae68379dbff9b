//! The prefetch controller: decides how many batches the loader (either mode) keeps requested ahead of
//! the training loop. It is pure bookkeeping (no threads, no clocks, no I/O): the loader reports
//! what it measured on every `next()` and reads back a target depth, so the same sequence of
//! observations always yields the same sequence of depths.
//!
//! "Depth" counts every batch the loader has committed memory to and the training loop has not
//! released: requested and in flight, arrived and waiting in the reorder buffer, and the one the
//! current step holds.
//!
//! # Policy
//!
//! - **Little's law.** To never wait, a batch must be requested `latency / step` steps before it
//!   is needed, so the controller aims at
//!   `ceil((mean_latency + 2 * std_latency) / max(mean_step, 1 µs)) + 1`; the `+ 1` is the batch
//!   the step holds. Means and variances are exponentially weighted with alpha 1/16: about 16
//!   samples of memory, long enough that a tail of a few percent stays in the variance between
//!   occurrences, short enough to follow a changed pipeline within a few dozen steps. `k = 2`
//!   covers uniform jitter entirely (its half-width is `sqrt(3) ≈ 1.7` standard deviations) and
//!   about 98% of a bell-shaped one; rarer, heavier tails are left to the stall rule, since
//!   covering them through the variance would hold memory for the common case. The target rises
//!   to this depth at once and falls towards it only through the idle rule.
//! - **Stall.** A `next()` that waited longer than 5% of the step (or 1 ms, whichever is less;
//!   never less than 10 µs, which is the hand-off itself) raises the target at once by
//!   `max(1, ceil(waited / step))`: the batch came that many steps late. A stall that comes once
//!   the previous raise has had time to arrive (one latency later) and within 32 calls of it
//!   doubles the target instead, like TCP slow start.
//! - **Idle.** After 32 `next()` calls without a stall, and while Little's law sits well below
//!   the target (by `max(2, target / 4)`, the hysteresis band), the target drops by one, then by
//!   one more every 8 calls. It never drops below what the worst recent stall showed was needed:
//!   each stall records how far ahead, in seconds, its batch should have been requested, and that
//!   memory halves every 4096 quiet calls. Tails too rare for the variance to cover so keep the
//!   depth they proved necessary for thousands of steps (halving faster cost stall for little
//!   memory in the simulations of the tests), and since the memory is in seconds, a consumer that
//!   slows down still lets the depth fall.
//! - **Bursts.** A step much longer than usual (an eval, a checkpoint) is clipped to
//!   `2 * mean + 3 * std` before it enters the mean, so one slow step does not make the consumer
//!   look slow and talk the controller into dropping the depth it needs right after; a lasting
//!   slowdown still moves the mean by at least 1/16 of itself per step.
//! - **Budget.** The target never leaves `[min_depth, budget_depth()]`, where the budget depth is
//!   `floor(max_bytes / batch_bytes)` capped by the slot pool; a consumer whose step is ~0 asks
//!   Little's law for an unbounded depth and gets the budget. When not even `min_depth` batches
//!   fit in the budget, `min_depth` wins and [`PrefetchController::budget_too_small`] says so.
//!
//! A producer slower than the consumer stalls at any depth; the controller then sits at the
//! budget, and the stall fraction it reports is what tells the user.

use std::time::Duration;

pub use stoker_dashboard::{ChangeReason, ControllerSnapshot};

/// Smoothing of the latency estimates, per arrived batch.
const LATENCY_ALPHA: f64 = 1.0 / 16.0;
/// Smoothing of the step-time estimates, per `next()`.
const STEP_ALPHA: f64 = 1.0 / 16.0;
/// Smoothing of the reported stall fraction: the same memory as the quiet stretch.
const STALL_FRACTION_ALPHA: f64 = 1.0 / 32.0;
/// Standard deviations of latency the Little's law depth covers.
const LATENCY_SPREAD: f64 = 2.0;
/// Floor on the step time Little's law divides by, so a consumer that does nothing yields a
/// large finite depth (clamped to the budget) instead of a division by zero.
const MIN_STEP_SECS: f64 = 1e-6;
/// A wait longer than this share of the step is a stall.
const STALL_STEP_SHARE: f64 = 0.05;
/// A wait this long is a stall whatever the step time.
const STALL_ALWAYS_SECS: f64 = 1e-3;
/// Waits this short are the channel hand-off, not a late batch.
const STALL_NOISE_SECS: f64 = 10e-6;
/// Calls without a stall before the controller may lower the target.
const QUIET_STRETCH: u64 = 32;
/// Calls between two idle drops.
const DROP_SPACING: u64 = 8;
/// Quiet calls over which the memory of a stall's lead time halves.
const STALL_MEMORY_HALF_LIFE: f64 = 4096.0;
/// Cap on the calls a raise is given to take effect, so a huge latency estimate cannot
/// postpone the slow-start doubling forever.
const MAX_REACTION_CALLS: u64 = 64;

/// Limits and starting point of a [`PrefetchController`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Smallest depth the controller ever asks for; raised to 1 if given as 0.
    pub min_depth: usize,
    /// Hard cap on the depth, from the slot pool.
    pub max_depth: usize,
    /// Memory budget for the batches the depth counts (`max_prefetch_bytes`).
    pub max_bytes: u64,
    /// Bytes of one batch.
    pub batch_bytes: u64,
    /// Depth to use until there is something to measure.
    pub initial_depth: usize,
}

/// An exponentially weighted mean and variance.
#[derive(Debug, Clone, Copy, Default)]
struct Ewma {
    mean: f64,
    variance: f64,
    seeded: bool,
}

impl Ewma {
    fn update(&mut self, sample: f64, alpha: f64) {
        if !self.seeded {
            // Starting from zero would bias the mean low for dozens of samples.
            self.mean = sample;
            self.variance = 0.0;
            self.seeded = true;
            return;
        }
        let deviation = sample - self.mean;
        let step = alpha * deviation;
        self.mean += step;
        self.variance = (1.0 - alpha) * (self.variance + deviation * step);
    }

    /// [`update`](Self::update) with a step time, a burst (an evaluation, a checkpoint) clipped
    /// to twice the mean plus three deviations, so one long pause does not swamp the estimate.
    fn update_clipped(&mut self, sample: f64, alpha: f64) {
        let sample = if self.seeded {
            sample.min(2.0 * self.mean + 3.0 * self.std())
        } else {
            sample
        };
        self.update(sample, alpha);
    }

    fn std(&self) -> f64 {
        self.variance.max(0.0).sqrt()
    }
}

/// Picks the prefetch depth from what the loader observes on each `next()`; see the module
/// documentation for the policy.
#[derive(Debug, Clone)]
pub struct PrefetchController {
    min_depth: usize,
    budget_depth: usize,
    budget_too_small: bool,
    target: usize,
    last_change: ChangeReason,
    latency: Ewma,
    /// The consumer's pace: the time from one `next()` returning to the next one's, its wait
    /// included (what Little's law sizes the queue by).
    step: Ewma,
    /// The training loop's own time between `next()` calls, waits left out (what the
    /// dashboard shows as the trainer's step).
    trainer: Ewma,
    stall_fraction: f64,
    /// `observe` calls so far; the first one only seeds the estimates.
    calls: u64,
    /// Calls since the last stall.
    quiet_calls: u64,
    /// Seconds ahead of need a batch had to be requested to avoid the worst recent stall;
    /// kept in time rather than batches so that it scales with the consumer's speed.
    stall_lead: f64,
    /// Call of the raise whose effect later stalls are measured against.
    reaction_anchor: Option<u64>,
    /// Target just before that raise: the depth the batches late within its reaction time were
    /// requested under.
    anchor_depth: usize,
    /// Call of the last idle drop.
    last_drop: Option<u64>,
}

impl PrefetchController {
    /// A controller within `config`'s limits: `min_depth` at least 1, `max_depth` at least
    /// `min_depth`, and the starting depth clamped to `[min_depth, budget_depth()]`.
    pub fn new(config: ControllerConfig) -> Self {
        let min_depth = config.min_depth.max(1);
        let max_depth = config.max_depth.max(min_depth);
        // A zero-sized batch costs no memory: only the slot pool limits it.
        let affordable = config
            .max_bytes
            .checked_div(config.batch_bytes)
            .map_or(max_depth, |batches| {
                usize::try_from(batches).unwrap_or(usize::MAX)
            });
        let budget_too_small = affordable < min_depth;
        let budget_depth = affordable.clamp(min_depth, max_depth);
        PrefetchController {
            min_depth,
            budget_depth,
            budget_too_small,
            target: config.initial_depth.clamp(min_depth, budget_depth),
            last_change: ChangeReason::Startup,
            latency: Ewma::default(),
            step: Ewma::default(),
            trainer: Ewma::default(),
            stall_fraction: 0.0,
            calls: 0,
            quiet_calls: 0,
            stall_lead: 0.0,
            reaction_anchor: None,
            anchor_depth: 0,
            last_drop: None,
        }
    }

    /// Records one `next()`: `waited` is how long the caller waited inside it (the stall),
    /// `step_time` the caller's pace, the time since the previous `next()` returned with this
    /// wait included (the training loop's own part goes to
    /// [`observe_trainer`](Self::observe_trainer)), and
    /// `arrived_latencies` the request-to-arrival latencies of the batches that arrived since
    /// the previous call. The first call only seeds the latency estimate: its wait is the
    /// pipeline filling up, and there was no previous return to measure a step from.
    pub fn observe(
        &mut self,
        waited: Duration,
        step_time: Duration,
        arrived_latencies: &[Duration],
    ) {
        self.observe_arrivals(arrived_latencies);
        if self.calls == 1 {
            return;
        }

        let step = step_time.as_secs_f64();
        self.observe_step(step);
        let waited = waited.as_secs_f64();
        // The pace holds the wait already: its share of it, not of the two added again.
        let share = if step > 0.0 {
            (waited / step).min(1.0)
        } else {
            0.0
        };
        self.stall_fraction += STALL_FRACTION_ALPHA * (share - self.stall_fraction);

        let stalled = waited > self.stall_threshold();
        if stalled {
            self.on_stall(waited);
        } else {
            self.quiet_calls += 1;
            self.stall_lead *= 0.5_f64.powf(1.0 / STALL_MEMORY_HALF_LIFE);
        }
        if let Some(wanted) = self.littles_law_wanted() {
            if wanted > self.target as f64 {
                self.raise_to(wanted, ChangeReason::LittlesLaw);
            }
        }
        if !stalled {
            self.maybe_lower();
        }
    }

    /// Records a call with no step before it (an epoch stream's first): the latencies of the
    /// batches that arrived, no pace, no stall.
    pub fn observe_arrivals(&mut self, arrived_latencies: &[Duration]) {
        self.calls += 1;
        for latency in arrived_latencies {
            self.latency.update(latency.as_secs_f64(), LATENCY_ALPHA);
        }
    }

    /// Depth the loader should keep now, always within `[min_depth, budget_depth()]`.
    pub fn target_depth(&self) -> usize {
        self.target
    }

    /// Largest depth allowed: `floor(max_bytes / batch_bytes)` clamped to
    /// `[min_depth, max_depth]`.
    pub fn budget_depth(&self) -> usize {
        self.budget_depth
    }

    /// Whether even `min_depth` batches exceed the memory budget (the controller uses
    /// `min_depth` anyway, since less cannot make progress).
    pub fn budget_too_small(&self) -> bool {
        self.budget_too_small
    }

    /// The controller's current estimates and decision.
    pub fn snapshot(&self) -> ControllerSnapshot {
        let littles_depth = self
            .littles_law_wanted()
            .map_or(self.target, |wanted| self.clamp_depth(wanted));
        ControllerSnapshot {
            target_depth: self.target,
            budget_depth: self.budget_depth,
            latency_mean: duration_from_secs(self.latency.mean),
            latency_std: duration_from_secs(self.latency.std()),
            step_mean: duration_from_secs(self.trainer_or_pace().mean),
            step_std: duration_from_secs(self.trainer_or_pace().std()),
            littles_depth,
            stall_floor_depth: self.stall_floor(),
            stall_fraction: self.stall_fraction,
            last_change: self.last_change,
        }
    }

    /// Records the training loop's own time since the previous `next()` returned, its wait
    /// left out (bursts clipped as the pace's are).
    pub fn observe_trainer(&mut self, step_time: Duration) {
        self.trainer
            .update_clipped(step_time.as_secs_f64(), STEP_ALPHA);
    }

    /// The trainer's step estimate, or the pace while nothing fed it.
    fn trainer_or_pace(&self) -> Ewma {
        if self.trainer.seeded {
            self.trainer
        } else {
            self.step
        }
    }

    fn observe_step(&mut self, step: f64) {
        self.step.update_clipped(step, STEP_ALPHA);
    }

    fn stall_threshold(&self) -> f64 {
        (STALL_STEP_SHARE * self.step.mean).clamp(STALL_NOISE_SECS, STALL_ALWAYS_SECS)
    }

    /// Little's law depth before clamping; `None` until latency and step are both measured.
    fn littles_law_wanted(&self) -> Option<f64> {
        if !self.latency.seeded || !self.step.seeded {
            return None;
        }
        let latency = self.latency.mean + LATENCY_SPREAD * self.latency.std();
        Some((latency / self.step.mean.max(MIN_STEP_SECS)).ceil() + 1.0)
    }

    /// Calls a raise needs before its batches can arrive: one latency, in steps.
    fn reaction_calls(&self) -> u64 {
        let calls = (self.latency.mean / self.step.mean.max(MIN_STEP_SECS)).ceil();
        // Float-to-int `as` saturates, which is the clamp wanted here.
        (calls as u64).clamp(1, MAX_REACTION_CALLS)
    }

    fn on_stall(&mut self, waited: f64) {
        let call = self.calls;
        self.quiet_calls = 0;
        let reaction = self.reaction_calls();
        // Stalls within one latency of a raise were already in the pipe when it was made and
        // say nothing about whether it was enough; the raise for them stays proportional.
        let (repeated, new_period) = match self.reaction_anchor {
            None => (false, true),
            Some(anchor) => {
                let since = call - anchor;
                (
                    since >= reaction && since < QUIET_STRETCH,
                    since >= reaction,
                )
            }
        };
        if new_period {
            self.reaction_anchor = Some(call);
            self.anchor_depth = self.target;
        }

        let step = self.step.mean.max(MIN_STEP_SECS);
        let late_by_steps = (waited / step).ceil().max(1.0);
        let needed = self.anchor_depth as f64 + late_by_steps;
        self.stall_lead = self.stall_lead.max((needed - 1.0) * step);
        let doubling = if repeated { self.target as f64 } else { 0.0 };
        let wanted = self.target as f64 + late_by_steps.max(doubling);
        self.raise_to(wanted, ChangeReason::Stall);
    }

    /// Depth that would have avoided the worst recent stall at today's step time.
    fn stall_floor(&self) -> usize {
        self.clamp_depth((self.stall_lead / self.step.mean.max(MIN_STEP_SECS)).ceil() + 1.0)
    }

    fn maybe_lower(&mut self) {
        if self.quiet_calls < QUIET_STRETCH || self.target <= self.stall_floor() {
            return;
        }
        if let Some(drop) = self.last_drop {
            if self.calls - drop < DROP_SPACING {
                return;
            }
        }
        let Some(wanted) = self.littles_law_wanted() else {
            return;
        };
        let band = (self.target / 4).max(2);
        if self.clamp_depth(wanted) + band <= self.target {
            self.target -= 1;
            self.last_change = ChangeReason::Idle;
            self.last_drop = Some(self.calls);
        }
    }

    fn raise_to(&mut self, wanted: f64, reason: ChangeReason) {
        let new_target = self.clamp_depth(wanted);
        if new_target <= self.target {
            return;
        }
        self.target = new_target;
        self.last_change = if wanted > self.budget_depth as f64 {
            ChangeReason::Budget
        } else {
            reason
        };
    }

    fn clamp_depth(&self, wanted: f64) -> usize {
        // Float-to-int `as` saturates (NaN gives 0), and the clamp then bounds it.
        (wanted as usize).clamp(self.min_depth, self.budget_depth)
    }
}

fn duration_from_secs(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::ops::Range;

    use super::*;

    const MS: f64 = 1e-3;
    /// The consumer's usual step.
    const BASE_STEP: f64 = MS;
    /// Producer lanes (decode threads).
    const LANES: usize = 4;
    const CALLS: u64 = 4000;
    const WARMUP: u64 = 500;
    const BATCH_BYTES: u64 = 1 << 20;
    const BUDGET_BATCHES: u64 = 64;
    const TAIL_PROBABILITY: f64 = 0.05;
    const TAIL_FACTOR: f64 = 5.0;
    const BURST_EVERY: u64 = 50;
    const BURST_FACTOR: f64 = 20.0;

    fn config(budget_batches: u64) -> ControllerConfig {
        ControllerConfig {
            min_depth: 1,
            max_depth: 128,
            max_bytes: budget_batches * BATCH_BYTES,
            batch_bytes: BATCH_BYTES,
            initial_depth: 2,
        }
    }

    fn ms(millis: f64) -> Duration {
        Duration::from_secs_f64(millis * MS)
    }

    /// Uniform in [0, 1) from a SplitMix64 hash of (stream, index): every policy in a comparison
    /// sees the very same latencies and step times, whatever order it asks for them in.
    fn unit(stream: u64, index: u64) -> f64 {
        let mut z = stream
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(index)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    #[derive(Debug, Clone, Copy)]
    enum LatencyPattern {
        Constant,
        /// Uniform within ±50% of the mean.
        Jittered,
        /// One batch in 20 takes 5 times as long as the others.
        HeavyTailed,
    }

    #[derive(Debug, Clone, Copy)]
    enum StepPattern {
        Constant,
        /// Uniform within ±50% of the base step.
        Jittered,
        /// Every 50th step is 20 times longer, like an eval or a checkpoint.
        Bursty,
    }

    const LATENCY_PATTERNS: [LatencyPattern; 3] = [
        LatencyPattern::Constant,
        LatencyPattern::Jittered,
        LatencyPattern::HeavyTailed,
    ];
    const STEP_PATTERNS: [StepPattern; 3] = [
        StepPattern::Constant,
        StepPattern::Jittered,
        StepPattern::Bursty,
    ];

    impl StepPattern {
        fn mean(self) -> f64 {
            match self {
                StepPattern::Bursty => {
                    BASE_STEP * ((BURST_EVERY - 1) as f64 + BURST_FACTOR) / BURST_EVERY as f64
                }
                StepPattern::Constant | StepPattern::Jittered => BASE_STEP,
            }
        }

        fn sample(self, call: u64) -> f64 {
            match self {
                StepPattern::Constant => BASE_STEP,
                StepPattern::Jittered => BASE_STEP * (0.5 + unit(1, call)),
                StepPattern::Bursty if call % BURST_EVERY == BURST_EVERY - 1 => {
                    BASE_STEP * BURST_FACTOR
                }
                StepPattern::Bursty => BASE_STEP,
            }
        }
    }

    impl LatencyPattern {
        fn sample(self, mean: f64, batch: u64) -> f64 {
            match self {
                LatencyPattern::Constant => mean,
                LatencyPattern::Jittered => mean * (0.5 + unit(2, batch)),
                LatencyPattern::HeavyTailed => {
                    let usual = mean / (1.0 + (TAIL_FACTOR - 1.0) * TAIL_PROBABILITY);
                    if unit(3, batch) < TAIL_PROBABILITY {
                        usual * TAIL_FACTOR
                    } else {
                        usual
                    }
                }
            }
        }
    }

    /// Mean service time per batch that makes `LANES` lanes produce `capacity` times what a
    /// consumer with mean step `mean_step` takes.
    fn service_mean(mean_step: f64, capacity: f64) -> f64 {
        LANES as f64 * mean_step / capacity
    }

    enum Depth {
        Adaptive(Box<PrefetchController>),
        Fixed(usize),
    }

    impl Depth {
        fn controller(budget_batches: u64) -> Self {
            Depth::Adaptive(Box::new(PrefetchController::new(config(budget_batches))))
        }

        fn target(&self) -> usize {
            match self {
                Depth::Adaptive(controller) => controller.target_depth(),
                Depth::Fixed(depth) => *depth,
            }
        }
    }

    #[derive(Debug, PartialEq)]
    struct Outcome {
        /// Share of the consumer's time after warm-up spent waiting inside `next()`.
        stall_fraction: f64,
        /// Share of `next()` calls after warm-up that waited at all.
        stalled_calls: f64,
        /// Depth range after warm-up.
        min_depth: usize,
        max_depth: usize,
        final_depth: usize,
        final_snapshot: Option<ControllerSnapshot>,
    }

    /// A discrete-event loader: `LANES` lanes serve requests first come first served, the loader
    /// keeps `depth` batches requested and not released (the one the step holds included), and
    /// the consumer takes them in request order, as the reorder buffer hands them out.
    struct Simulator {
        lane_free_at: [f64; LANES],
        now: f64,
        requested: u64,
        /// Arrival times of requested batches not yet taken, in request order.
        pending: VecDeque<f64>,
        /// (arrival, latency) of batches whose arrival has not been reported yet.
        unreported: Vec<(f64, f64)>,
        holding: bool,
        last_step: f64,
    }

    impl Simulator {
        fn new() -> Self {
            Simulator {
                lane_free_at: [0.0; LANES],
                now: 0.0,
                requested: 0,
                pending: VecDeque::new(),
                unreported: Vec::new(),
                holding: false,
                last_step: 0.0,
            }
        }

        fn issue(&mut self, depth: usize, service: &dyn Fn(u64) -> f64) {
            while self.pending.len() + usize::from(self.holding) < depth {
                let lane = (0..LANES)
                    .min_by(|&a, &b| self.lane_free_at[a].total_cmp(&self.lane_free_at[b]))
                    .unwrap_or(0);
                let arrival = self.now.max(self.lane_free_at[lane]) + service(self.requested);
                self.lane_free_at[lane] = arrival;
                self.pending.push_back(arrival);
                self.unreported.push((arrival, arrival - self.now));
                self.requested += 1;
            }
        }

        /// Runs the calls in `calls`, measuring those from `measure_from` on.
        fn run(
            &mut self,
            depth: &mut Depth,
            calls: Range<u64>,
            measure_from: u64,
            service: &dyn Fn(u64) -> f64,
            step: &dyn Fn(u64) -> f64,
        ) -> Outcome {
            let (mut waited_total, mut stalled, mut measured) = (0.0, 0u64, 0u64);
            let (mut min_depth, mut max_depth) = (usize::MAX, 0);
            let mut measure_start = None;
            for call in calls {
                // The previous batch's slot comes back when the loop asks for the next one.
                self.holding = false;
                self.issue(depth.target(), service);
                let arrival = self.pending.pop_front().expect("depth is at least 1");
                let called_at = self.now;
                let waited = (arrival - called_at).max(0.0);
                self.now += waited;
                self.holding = true;
                let now = self.now;
                let arrived: Vec<Duration> = self
                    .unreported
                    .iter()
                    .filter(|(at, _)| *at <= now)
                    .map(|(_, latency)| Duration::from_secs_f64(*latency))
                    .collect();
                self.unreported.retain(|(at, _)| *at > now);
                if let Depth::Adaptive(controller) = depth {
                    controller.observe(
                        Duration::from_secs_f64(waited),
                        Duration::from_secs_f64(self.last_step),
                        &arrived,
                    );
                    assert!(controller.target_depth() <= controller.budget_depth());
                    assert!(controller.target_depth() >= 1);
                }
                self.issue(depth.target(), service);
                if call >= measure_from {
                    measure_start.get_or_insert(called_at);
                    waited_total += waited;
                    measured += 1;
                    stalled += u64::from(waited > 0.0);
                    min_depth = min_depth.min(depth.target());
                    max_depth = max_depth.max(depth.target());
                }
                self.last_step = step(call);
                self.now += self.last_step;
            }
            let elapsed = measure_start.map_or(0.0, |start| self.now - start);
            Outcome {
                stall_fraction: if elapsed > 0.0 {
                    waited_total / elapsed
                } else {
                    0.0
                },
                stalled_calls: stalled as f64 / measured.max(1) as f64,
                min_depth,
                max_depth,
                final_depth: depth.target(),
                final_snapshot: match depth {
                    Depth::Adaptive(controller) => Some(controller.snapshot()),
                    Depth::Fixed(_) => None,
                },
            }
        }
    }

    fn simulate(
        depth: &mut Depth,
        latency: LatencyPattern,
        step: StepPattern,
        capacity: f64,
    ) -> Outcome {
        let mean = service_mean(step.mean(), capacity);
        Simulator::new().run(
            depth,
            0..CALLS,
            WARMUP,
            &|batch| latency.sample(mean, batch),
            &|call| step.sample(call),
        )
    }

    #[test]
    fn stall_stays_under_one_percent_with_little_spare_capacity() {
        for capacity in [1.1, 1.5] {
            for latency in LATENCY_PATTERNS {
                for step in STEP_PATTERNS {
                    let adaptive = simulate(
                        &mut Depth::controller(BUDGET_BATCHES),
                        latency,
                        step,
                        capacity,
                    );
                    let two = simulate(&mut Depth::Fixed(2), latency, step, capacity);
                    let eight = simulate(&mut Depth::Fixed(8), latency, step, capacity);
                    // Printed for the record; `cargo test -- --nocapture` shows the table.
                    println!(
                        "{capacity}x {latency:?}/{step:?}: controller {:.2}% ({:.1}% of calls, \
                         depth {}..={}, final {}), fixed 2 {:.2}%, fixed 8 {:.2}%",
                        100.0 * adaptive.stall_fraction,
                        100.0 * adaptive.stalled_calls,
                        adaptive.min_depth,
                        adaptive.max_depth,
                        adaptive.final_depth,
                        100.0 * two.stall_fraction,
                        100.0 * eight.stall_fraction,
                    );
                    assert!(
                        adaptive.stall_fraction < 0.01,
                        "{capacity}x {latency:?}/{step:?}: stalled {:.2}%",
                        100.0 * adaptive.stall_fraction
                    );
                    assert!(adaptive.max_depth <= BUDGET_BATCHES as usize);
                }
            }
        }
    }

    #[test]
    fn fixed_depth_two_stalls_more_than_the_controller() {
        // Two batches cannot even cover one latency (about 3.6 steps here), so a fixed depth of
        // 2 caps throughput well below demand; the controller should do at least ten times
        // better wherever the patterns jitter or burst.
        for (latency, step) in [
            (LatencyPattern::Jittered, StepPattern::Constant),
            (LatencyPattern::Constant, StepPattern::Jittered),
            (LatencyPattern::Jittered, StepPattern::Jittered),
            (LatencyPattern::Constant, StepPattern::Bursty),
            (LatencyPattern::Jittered, StepPattern::Bursty),
            (LatencyPattern::HeavyTailed, StepPattern::Bursty),
        ] {
            let adaptive = simulate(&mut Depth::controller(BUDGET_BATCHES), latency, step, 1.1);
            let fixed = simulate(&mut Depth::Fixed(2), latency, step, 1.1);
            assert!(
                adaptive.stall_fraction * 10.0 < fixed.stall_fraction,
                "{latency:?}/{step:?}: controller {:.3}, fixed 2 {:.3}",
                adaptive.stall_fraction,
                fixed.stall_fraction
            );
        }
    }

    #[test]
    fn depth_never_exceeds_a_tight_budget() {
        // Heavy tails and bursts at 1.1x want about 30 batches; the budget allows 8.
        let mut depth = Depth::controller(8);
        let outcome = simulate(
            &mut depth,
            LatencyPattern::HeavyTailed,
            StepPattern::Bursty,
            1.1,
        );
        assert_eq!(outcome.max_depth, 8);
        let snapshot = outcome.final_snapshot.expect("adaptive run");
        assert_eq!(snapshot.budget_depth, 8);
        assert!(snapshot.littles_depth <= 8);
        assert!(snapshot.stall_floor_depth <= 8);
    }

    #[test]
    fn a_consumer_that_does_nothing_gets_the_budget_not_infinity() {
        let mut controller = PrefetchController::new(config(BUDGET_BATCHES));
        for _ in 0..10 {
            controller.observe(Duration::ZERO, Duration::ZERO, &[ms(4.0)]);
        }
        assert_eq!(controller.target_depth(), controller.budget_depth());
        assert_eq!(controller.snapshot().last_change, ChangeReason::Budget);
        assert_eq!(
            controller.snapshot().littles_depth,
            controller.budget_depth()
        );

        // Absurd inputs saturate rather than overflow or panic.
        controller.observe(
            Duration::MAX,
            Duration::MAX,
            &[Duration::MAX, Duration::ZERO],
        );
        controller.observe(Duration::MAX, Duration::ZERO, &[Duration::MAX]);
        let snapshot = controller.snapshot();
        assert!(snapshot.target_depth <= snapshot.budget_depth);
        assert!(snapshot.littles_depth <= snapshot.budget_depth);
    }

    #[test]
    fn depth_shrinks_back_when_the_consumer_slows_down() {
        let service_mean = service_mean(BASE_STEP, 1.1);
        let service = |batch| LatencyPattern::HeavyTailed.sample(service_mean, batch);
        let mut simulator = Simulator::new();
        let mut depth = Depth::controller(BUDGET_BATCHES);
        let fast = simulator.run(&mut depth, 0..3000, WARMUP, &service, &|_| BASE_STEP);
        // The same producer now feeds a consumer ten times slower: the queue sits idle.
        let slow_step = |call| 10.0 * StepPattern::Jittered.sample(call);
        let slowing = simulator.run(&mut depth, 3000..4000, 3000, &service, &slow_step);
        let settled = simulator.run(&mut depth, 4000..5000, 4000, &service, &slow_step);

        assert!(
            fast.final_depth >= 12,
            "fast consumer got depth {}",
            fast.final_depth
        );
        assert!(
            settled.max_depth * 3 <= fast.final_depth,
            "depth {} -> {}",
            fast.final_depth,
            settled.max_depth
        );
        // Probing lower meets the odd 5x batch now and then, and a stall puts one step back;
        // the depth then holds within one step instead of oscillating.
        assert!(slowing.stall_fraction < 0.001, "{slowing:?}");
        assert!(settled.stall_fraction < 0.001, "{settled:?}");
        assert!(settled.max_depth - settled.min_depth <= 1, "{settled:?}");
        let snapshot = settled.final_snapshot.expect("adaptive run");
        assert!(settled.min_depth >= snapshot.littles_depth);
    }

    /// A controller that has watched `calls` quiet steps of 1 ms with batches taking 4 ms.
    fn steady(calls: usize) -> PrefetchController {
        let mut controller = PrefetchController::new(config(BUDGET_BATCHES));
        for _ in 0..calls {
            controller.observe(Duration::ZERO, ms(1.0), &[ms(4.0)]);
        }
        controller
    }

    /// An input-bound loop (10 ms of its own, 20 ms waiting a step): the trainer's step reads
    /// 10 ms, not its 30 ms pace, and the stall share two thirds, not a third (the wait was
    /// counted twice).
    #[test]
    fn the_trainers_step_leaves_out_its_wait_and_the_stall_share_counts_it_once() {
        let mut controller = PrefetchController::new(config(BUDGET_BATCHES));
        for _ in 0..400 {
            controller.observe_trainer(ms(10.0));
            controller.observe(ms(20.0), ms(30.0), &[ms(4.0)]);
        }
        let snapshot = controller.snapshot();
        assert!(
            (snapshot.step_mean.as_secs_f64() - 0.010).abs() < 1e-6,
            "{:?}",
            snapshot.step_mean
        );
        assert!(
            (snapshot.stall_fraction - 2.0 / 3.0).abs() < 0.01,
            "{}",
            snapshot.stall_fraction
        );
        // Fed no trainer time (a caller that measures none), the pace stands in.
        let steady = steady(100).snapshot();
        assert!((steady.step_mean.as_secs_f64() - 0.001).abs() < 1e-6);
    }

    #[test]
    fn a_sudden_stall_raises_the_depth_at_once_and_monotonically() {
        let before = steady(100).target_depth();
        assert_eq!(before, 5, "Little's law: ceil(4 ms / 1 ms) + 1");

        // Larger stalls never earn smaller raises; a wait under the threshold (5% of the step)
        // earns none.
        let mut previous = before;
        for waited in [0.02, 0.06, 0.5, 1.0, 2.0, 3.5, 10.0, 40.0, 1000.0] {
            let mut controller = steady(100);
            controller.observe(ms(waited), ms(1.0), &[ms(4.0)]);
            let after = controller.target_depth();
            if waited < 0.05 {
                assert_eq!(after, before, "a {waited} ms wait is not a stall");
                continue;
            }
            assert!(after > before, "a {waited} ms wait raised nothing");
            assert!(
                after >= previous,
                "a {waited} ms wait raised less than a shorter one"
            );
            assert!(
                after >= before + (waited.ceil() as usize).min(BUDGET_BATCHES as usize - before)
            );
            previous = after;
        }

        // Stalls that persist never lower the target, and once a raise had time to arrive
        // they double it.
        let mut controller = steady(100);
        let mut targets = vec![controller.target_depth()];
        for _ in 0..12 {
            controller.observe(ms(0.5), ms(1.0), &[ms(4.0)]);
            targets.push(controller.target_depth());
        }
        assert!(
            targets.windows(2).all(|pair| pair[0] <= pair[1]),
            "{targets:?}"
        );
        assert!(
            targets[targets.len() - 1] >= 2 * (before + 4),
            "{targets:?}"
        );
        assert_eq!(controller.snapshot().last_change, ChangeReason::Stall);
    }

    #[test]
    fn a_burst_does_not_collapse_the_depth() {
        let mut controller = steady(100);
        let before = controller.snapshot();
        controller.observe(Duration::ZERO, ms(BURST_FACTOR), &[ms(4.0)]);
        let after_burst = controller.snapshot();
        assert_eq!(after_burst.littles_depth, before.littles_depth);
        assert!(
            after_burst.step_mean < ms(1.1),
            "{:?}",
            after_burst.step_mean
        );
        for _ in 0..2 * QUIET_STRETCH {
            controller.observe(Duration::ZERO, ms(1.0), &[ms(4.0)]);
            assert_eq!(controller.target_depth(), before.target_depth);
        }
    }

    #[test]
    fn budget_too_small_when_a_batch_exceeds_it() {
        let controller = PrefetchController::new(ControllerConfig {
            min_depth: 1,
            max_depth: 16,
            max_bytes: 1000,
            batch_bytes: 1001,
            initial_depth: 4,
        });
        assert!(controller.budget_too_small());
        assert_eq!(controller.budget_depth(), 1);
        assert_eq!(controller.target_depth(), 1);

        let controller = PrefetchController::new(ControllerConfig {
            min_depth: 3,
            max_depth: 16,
            max_bytes: 2000,
            batch_bytes: 1000,
            initial_depth: 1,
        });
        assert!(controller.budget_too_small());
        assert_eq!(controller.budget_depth(), 3);
        assert_eq!(controller.target_depth(), 3);

        let controller = PrefetchController::new(ControllerConfig {
            min_depth: 3,
            max_depth: 16,
            max_bytes: 3000,
            batch_bytes: 1000,
            initial_depth: 1,
        });
        assert!(!controller.budget_too_small());
        assert_eq!(controller.budget_depth(), 3);
    }

    #[test]
    fn new_clamps_the_config() {
        let controller = PrefetchController::new(ControllerConfig {
            min_depth: 0,
            max_depth: 0,
            max_bytes: 0,
            batch_bytes: 0,
            initial_depth: 0,
        });
        assert_eq!(controller.target_depth(), 1);
        assert_eq!(controller.budget_depth(), 1);
        assert!(!controller.budget_too_small());

        // Zero-sized batches leave only the slot pool as a limit.
        let controller = PrefetchController::new(ControllerConfig {
            min_depth: 2,
            max_depth: 32,
            max_bytes: 0,
            batch_bytes: 0,
            initial_depth: 1000,
        });
        assert_eq!(controller.budget_depth(), 32);
        assert_eq!(controller.target_depth(), 32);
        assert_eq!(controller.snapshot().last_change, ChangeReason::Startup);

        let controller = PrefetchController::new(ControllerConfig {
            initial_depth: 20,
            ..config(10)
        });
        assert_eq!(controller.budget_depth(), 10);
        assert_eq!(controller.target_depth(), 10);
    }

    #[test]
    fn the_first_call_only_seeds_the_estimates() {
        // Its wait is the pipeline filling up, not a shortfall of depth.
        let mut controller = PrefetchController::new(config(BUDGET_BATCHES));
        controller.observe(ms(500.0), Duration::ZERO, &[ms(4.0)]);
        assert_eq!(controller.target_depth(), 2);
        assert_eq!(controller.snapshot().last_change, ChangeReason::Startup);
        assert_eq!(controller.snapshot().stall_fraction, 0.0);
    }

    #[test]
    fn the_same_observations_give_the_same_depths() {
        let run = || {
            simulate(
                &mut Depth::controller(BUDGET_BATCHES),
                LatencyPattern::HeavyTailed,
                StepPattern::Jittered,
                1.1,
            )
        };
        assert_eq!(run(), run());
    }
}
