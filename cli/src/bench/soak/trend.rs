//! Resident memory and open descriptors of the soak's processes over time, and the lines fitted
//! through them: is anything growing?
//!
//! Each process incarnation (one pid, from start to kill) is sampled from `/proc`. Its samples
//! before a warm-up point (the first epoch boundary after it started) are left out: filling
//! caches and pools once is not a leak. Three fits come out of the rest:
//! - per incarnation that lived long enough to fit alone ([`LONG_LIVED`] after it settled,
//!   [`SETTLE`] after its start, in a judged run of 10 minutes or more), its own slope: a
//!   process that leaks as it works shows here;
//! - per role (coordinator, worker, client), the *drift*: each incarnation's mean at the same
//!   age ([`DRIFT_AGES`] after it started), fitted against when it started. State carried from
//!   one incarnation to the next (a journal, files, caches on disk) that grows shows here;
//! - per role, one *within-life* slope shared by all its incarnations, each with its own
//!   intercept (least squares on the deviations from each incarnation's means). Reported, not
//!   judged: workers killed every ~20 s and a coordinator every ~60 s spend their whole life in
//!   the minute where a process still grows its thread stacks, allocator arenas and buffers,
//!   and a 20-second line stated per 10 minutes cannot tell that from a leak (a leak in a
//!   worker shows in the spared one's own slope, which lives the whole run).
//!
//! The first two are judged, each with its uncertainty ([`Slope`]): a slope is growth when it
//! is material (at least [`RSS_MATERIAL_MIB_PER_10MIN`] or [`FDS_MATERIAL_PER_10MIN`]) and
//! significant (its one-sided lower bound at [`CONFIDENCE`] above zero). A count that falls is
//! never growth. Noise is growth at most once in 10,000 judgements where it scatters a slope as
//! widely as the floor, and less often where it scatters it less.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

/// An incarnation that lived this long after it settled is also fitted alone.
pub const LONG_LIVED: Duration = Duration::from_secs(300);

/// A long-lived incarnation is fitted alone from this long after its start: measured here, a
/// coordinator's resident set rises by about 1 MiB in its first minute (connections, runtime
/// threads, code paths run the first time) and is flat from about two minutes on.
pub const SETTLE: Duration = Duration::from_secs(120);

/// The age (seconds after it started) at which the incarnations of a role are compared.
pub const DRIFT_AGES: Range<f64> = 10.0..20.0;

/// Readings an incarnation needs within [`DRIFT_AGES`] to count in the drift.
const DRIFT_READINGS: usize = 5;

/// Incarnations a drift is fitted (and reported) from: the fewest that leave a residual.
const DRIFT_FITTED: usize = 3;

/// Incarnations a drift needs to be judged. With fewer, it is all but noise: its standard
/// error comes from fewer than 8 residuals (Student's t at [`CONFIDENCE`] is 9.7 with 5 of
/// them, 22 with 3, against 6.4 with 8), and one odd incarnation at either end of a line
/// through 5 points 2 minutes apart (a client that started during a coordinator restart and
/// holds one connection more) moves it by a descriptor per 10 minutes. The run that failed on
/// a falling count had 5 client incarnations. A 10-minute run reaches this for its workers only
/// (~30, one killed every ~20 s); its coordinators (3) and clients (5-7) are judged by the one
/// of each that lives long, and by their drift too in longer runs (clients' from about 20
/// minutes, coordinators' from about 40).
///
/// A drift of one descriptor per 10 minutes, with readings that jitter by ±2 (uniform, each
/// second), is a rise of one descriptor over a 10-minute run against a standard error of 0.23
/// from 30 workers' means of 10 readings: it fails about 1 in 4 simulated 10-minute runs, 96%
/// of 15-minute ones and every 20-minute one (`report.rs`'s tests simulate them).
pub const DRIFT_INCARNATIONS: usize = 10;

/// Blocks a long life's readings are cut into before its line is fitted. Readings 1 s apart
/// are not independent (a batch's buffers, the allocator's purges and a reconnect last
/// seconds), and a standard error from 480 of them as if they were would be several times too
/// small; the means of 12 blocks (40 s each over the 8 minutes a spared process is fitted,
/// 25 s over a coordinator's 5) are independent but for the few seconds at their edges, and
/// their residuals give the standard error with 10 degrees of freedom.
pub const BLOCKS: usize = 12;

/// The level of the one-sided lower bound a growing slope must have above zero. The verdict
/// of a 10-minute run has 6 judgements of long lives and up to 6 of drifts, and an hour's 16
/// and 6; where noise scatters a slope as widely as the floor (descriptors jittering ±2 each
/// second over a coordinator's 6 minutes: a standard error of 0.2 against a floor of 0.5), the
/// level alone keeps it from failing the run. Simulated so, 4 in 1,000 10-minute runs and 7 in
/// 1,000 hours failed at 99.9%; at this level, 3 in 5,000 and 4 in 5,000.
pub const CONFIDENCE: f64 = 0.9999;

/// The standard normal quantile at [`CONFIDENCE`].
const Z_AT_CONFIDENCE: f64 = 3.719_016;

/// A resident set that grows by less than this (MiB per 10 minutes) is not judged a leak:
/// three quarters of the 1 MiB per 10 minutes the soak must catch. A leak at that rate in a
/// spared client, fitted over its 8 minutes with readings jittering by 250 KiB (standard
/// deviation; correlation 0.5 from one second to the next), has a standard error of 0.085 and
/// estimates above this in 4,992 of 5,000 simulated runs (4,949 at 300 KiB); the steepest slope
/// a clean run has shown, 0.70 (the first resting coordinator of the hour in benches/README.md),
/// stays under it.
pub const RSS_MATERIAL_MIB_PER_10MIN: f64 = 0.75;

/// Descriptors that grow by less than this per 10 minutes are not judged a leak: half the one
/// descriptor per 10 minutes the soak must catch, 0 when rounded.
pub const FDS_MATERIAL_PER_10MIN: f64 = 0.5;

/// Fitted slopes are stated per this span.
const PER: f64 = 600.0;

const MIB: f64 = 1024.0 * 1024.0;

/// One reading of one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Seconds since the soak started.
    pub at: f64,
    /// Resident set in bytes.
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub fds: u64,
}

/// Reads `pid`'s resident set (`/proc/PID/statm`) and open descriptors (`/proc/PID/fd`); `None`
/// when the process is gone.
pub fn read_process(pid: u32, at: f64) -> Option<Reading> {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let statm = std::fs::read_to_string(proc_dir.join("statm")).ok()?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let fds = std::fs::read_dir(proc_dir.join("fd")).ok()?.count() as u64;
    Some(Reading {
        at,
        rss_bytes: resident_pages * page_size(),
        fds,
    })
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

/// The readings of one incarnation.
#[derive(Debug, Clone)]
pub struct Incarnation {
    /// "coordinator", "worker" or "client".
    pub role: &'static str,
    /// Which one of its role (worker slot, client rank).
    pub slot: usize,
    /// When it started, in seconds since the soak started.
    pub started: f64,
    /// Its readings, in time order.
    pub readings: Vec<Reading>,
}

impl Incarnation {
    /// The readings at or after `warm` (seconds since the soak started).
    fn settled(&self, warm: f64) -> &[Reading] {
        let first = self.readings.partition_point(|r| r.at < warm);
        &self.readings[first..]
    }

    /// Mean resident set (MiB) and descriptors of the readings taken at `ages` (seconds after
    /// it started); `None` with fewer than [`DRIFT_READINGS`] of them.
    fn mean_at(&self, ages: Range<f64>) -> Option<(f64, f64)> {
        let window: Vec<&Reading> = self
            .readings
            .iter()
            .filter(|r| ages.contains(&(r.at - self.started)))
            .collect();
        if window.len() < DRIFT_READINGS {
            return None;
        }
        let n = window.len() as f64;
        let rss = window.iter().map(|r| r.rss_bytes as f64 / MIB).sum::<f64>() / n;
        let fds = window.iter().map(|r| r.fds as f64).sum::<f64>() / n;
        Some((rss, fds))
    }
}

/// The fits of one role.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RoleTrend {
    /// Incarnations seen.
    pub incarnations: usize,
    /// Incarnations with at least three readings after their warm-up (in the within-life fit).
    pub fitted: usize,
    /// Readings used by the within-life fit.
    pub readings: usize,
    /// Within-life slope of the resident set shared by the incarnations, MiB per 10 minutes.
    pub within_life_rss_mib_per_10min: f64,
    /// Within-life slope of the open descriptors, per 10 minutes.
    pub within_life_fds_per_10min: f64,
    /// The incarnations compared at the same age, when three or more lived to that age (judged
    /// from [`DRIFT_INCARNATIONS`]).
    pub drift: Option<Drift>,
    /// Largest resident set read, MiB.
    pub peak_rss_mib: f64,
    /// Most descriptors read.
    pub peak_fds: u64,
}

/// The drift of one role: each incarnation's mean resident set and descriptors at the same age
/// ([`DRIFT_AGES`]), fitted against when it started. Its standard errors come from the
/// residuals of those means about the line: the means are minutes apart, each of up to ten
/// readings, so they are taken as independent.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Drift {
    /// Incarnations that lived to the age compared (judged from [`DRIFT_INCARNATIONS`]).
    pub incarnations: usize,
    /// Slope of the resident set at that age over the run, MiB per 10 minutes.
    pub rss_mib_per_10min: f64,
    /// Its standard error, MiB per 10 minutes.
    pub rss_standard_error: f64,
    /// Slope of the descriptors at that age over the run, per 10 minutes.
    pub fds_per_10min: f64,
    /// Its standard error, per 10 minutes.
    pub fds_standard_error: f64,
}

impl Drift {
    /// Whether enough incarnations lived to the age compared for the drift to be judged.
    pub fn judged(&self) -> bool {
        self.incarnations >= DRIFT_INCARNATIONS
    }

    /// The resident set's slope, MiB per 10 minutes.
    pub fn rss(&self) -> Slope {
        Slope {
            per_10min: self.rss_mib_per_10min,
            standard_error: self.rss_standard_error,
            degrees_of_freedom: self.incarnations.saturating_sub(2),
        }
    }

    /// The descriptors' slope, per 10 minutes.
    pub fn fds(&self) -> Slope {
        Slope {
            per_10min: self.fds_per_10min,
            standard_error: self.fds_standard_error,
            degrees_of_freedom: self.incarnations.saturating_sub(2),
        }
    }
}

/// The fit of one long-lived incarnation: the line through the means of [`BLOCKS`] equal spans
/// of its readings, the standard errors from their residuals (a life with readings in fewer
/// than three spans is not fitted alone).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IncarnationTrend {
    /// Its role.
    pub role: &'static str,
    /// Which one of its role.
    pub slot: usize,
    /// Minutes fitted (after its warm-up).
    pub minutes: f64,
    /// Block means fitted (spans with no reading left out).
    pub blocks: usize,
    /// Slope of the resident set, MiB per 10 minutes.
    pub rss_mib_per_10min: f64,
    /// Its standard error, MiB per 10 minutes.
    pub rss_standard_error: f64,
    /// Slope of the open descriptors, per 10 minutes.
    pub fds_per_10min: f64,
    /// Its standard error, per 10 minutes.
    pub fds_standard_error: f64,
}

impl IncarnationTrend {
    /// The resident set's slope, MiB per 10 minutes.
    pub fn rss(&self) -> Slope {
        Slope {
            per_10min: self.rss_mib_per_10min,
            standard_error: self.rss_standard_error,
            degrees_of_freedom: self.blocks.saturating_sub(2),
        }
    }

    /// The descriptors' slope, per 10 minutes.
    pub fn fds(&self) -> Slope {
        Slope {
            per_10min: self.fds_per_10min,
            standard_error: self.fds_standard_error,
            degrees_of_freedom: self.blocks.saturating_sub(2),
        }
    }
}

/// A fitted slope per 10 minutes with its uncertainty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slope {
    /// The least-squares slope, per 10 minutes.
    pub per_10min: f64,
    /// Its standard error, from the residuals about the line.
    pub standard_error: f64,
    /// The residuals' degrees of freedom (points fitted less two).
    pub degrees_of_freedom: usize,
}

impl Slope {
    /// The one-sided lower confidence bound at [`CONFIDENCE`]: Student's t quantile at the
    /// residuals' degrees of freedom times the standard error below the slope (minus infinity
    /// with no residual).
    pub fn lower_bound(&self) -> f64 {
        match t_quantile(self.degrees_of_freedom) {
            Some(t) => self.per_10min - t * self.standard_error,
            None => f64::NEG_INFINITY,
        }
    }

    /// Whether this is growth: at least `material` per 10 minutes, and its lower bound above
    /// zero. A slope below zero never is; a slope as large as `material` that noise could
    /// have drawn from a flat line (one time in 10,000 or more) is not either.
    pub fn grows(&self, material: f64) -> bool {
        self.per_10min >= material && self.lower_bound() > 0.0
    }
}

/// Student's t quantile at [`CONFIDENCE`] for `degrees_of_freedom` (`None` for 0): tabulated
/// up to 5, from 6 on the Cornish-Fisher expansion about the normal quantile, within 0.6% of
/// the exact value there and closer as the degrees grow.
fn t_quantile(degrees_of_freedom: usize) -> Option<f64> {
    let table = [3183.046, 70.700, 22.204, 13.034, 9.678];
    match degrees_of_freedom {
        0 => None,
        1..=5 => table.get(degrees_of_freedom - 1).copied(),
        _ => {
            let v = degrees_of_freedom as f64;
            let z = Z_AT_CONFIDENCE;
            let terms = [
                (z.powi(3) + z) / 4.0,
                (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / 96.0,
                (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / 384.0,
                (79.0 * z.powi(9) + 776.0 * z.powi(7) + 1482.0 * z.powi(5)
                    - 1920.0 * z.powi(3)
                    - 945.0 * z)
                    / 92160.0,
            ];
            Some(z + (1..=4).zip(terms).map(|(k, g)| g / v.powi(k)).sum::<f64>())
        }
    }
}

/// The least-squares line through `points` (seconds, value): its slope per 10 minutes, and the
/// slope's standard error from the residuals (none with fewer than three points).
fn least_squares(points: &[(f64, f64)]) -> Slope {
    let n = points.len() as f64;
    let mean_t = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let mut sums = Sums::default();
    sums.add_group(points);
    let slope = sums.slope();
    let degrees_of_freedom = points.len().saturating_sub(2);
    let squared_residuals: f64 = points
        .iter()
        .map(|&(t, y)| (y - mean_y - slope * (t - mean_t)).powi(2))
        .sum();
    let standard_error = if degrees_of_freedom > 0 && sums.spread > 0.0 {
        (squared_residuals / degrees_of_freedom as f64 / sums.spread).sqrt()
    } else {
        0.0
    };
    Slope {
        per_10min: slope * PER,
        standard_error: standard_error * PER,
        degrees_of_freedom,
    }
}

/// The means (time, value) of `points` in `blocks` equal spans from the first point's time to
/// the last's, spans with no point left out.
fn block_means(points: &[(f64, f64)], blocks: usize) -> Points {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Vec::new();
    };
    let span = (last.0 - first.0).max(f64::MIN_POSITIVE);
    let blocks = blocks.max(1);
    let mut sums = vec![(0.0, 0.0, 0usize); blocks];
    for &(t, y) in points {
        let block = (((t - first.0) / span * blocks as f64) as usize).min(blocks - 1);
        let sum = &mut sums[block];
        sum.0 += t;
        sum.1 += y;
        sum.2 += 1;
    }
    sums.into_iter()
        .filter(|sum| sum.2 > 0)
        .map(|(t, y, n)| (t / n as f64, y / n as f64))
        .collect()
}

/// Sums of one fit with a common slope and one intercept per group.
#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    /// Σ (t - t̄)(y - ȳ)
    cross: f64,
    /// Σ (t - t̄)²
    spread: f64,
}

impl Sums {
    fn add_group(&mut self, points: &[(f64, f64)]) {
        let n = points.len() as f64;
        let mean_t = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
        for &(t, y) in points {
            self.cross += (t - mean_t) * (y - mean_y);
            self.spread += (t - mean_t) * (t - mean_t);
        }
    }

    /// The slope per second (0 with no spread in time).
    fn slope(&self) -> f64 {
        if self.spread > 0.0 {
            self.cross / self.spread
        } else {
            0.0
        }
    }
}

/// (seconds, value) pairs.
type Points = Vec<(f64, f64)>;

/// The (rss MiB, fds) points of `readings`.
fn points(readings: &[Reading]) -> (Points, Points) {
    readings
        .iter()
        .map(|r| ((r.at, r.rss_bytes as f64 / MIB), (r.at, r.fds as f64)))
        .unzip()
}

/// When a long-lived incarnation is fitted alone: from `settle` seconds after its start (and
/// after its warm-up), when it lived `long_lived` seconds more ([`SETTLE`] and [`LONG_LIVED`]
/// in a judged run).
#[derive(Debug, Clone, Copy)]
pub struct LongLife {
    /// Seconds after its start before which an incarnation's own fit leaves its readings out.
    pub settle: f64,
    /// Seconds of readings after that an incarnation needs to be fitted alone.
    pub long_lived: f64,
}

/// Fits every role and every long-lived incarnation (see [`LongLife`]). `warm_after(started)`
/// gives the time an incarnation started at `started` is warm from (its first epoch boundary).
pub fn fit(
    incarnations: &[Incarnation],
    life: LongLife,
    warm_after: impl Fn(&Incarnation) -> f64,
) -> (BTreeMap<&'static str, RoleTrend>, Vec<IncarnationTrend>) {
    let mut roles: BTreeMap<&'static str, (RoleTrend, Sums, Sums)> = BTreeMap::new();
    // Per role: (started, mean MiB, mean descriptors) of each incarnation at the drift age.
    let mut at_age: BTreeMap<&'static str, (Points, Points)> = BTreeMap::new();
    let mut long_lived = Vec::new();
    for incarnation in incarnations {
        let (trend, rss_sums, fd_sums) = roles.entry(incarnation.role).or_insert_with(|| {
            (
                RoleTrend {
                    incarnations: 0,
                    fitted: 0,
                    readings: 0,
                    within_life_rss_mib_per_10min: 0.0,
                    within_life_fds_per_10min: 0.0,
                    drift: None,
                    peak_rss_mib: 0.0,
                    peak_fds: 0,
                },
                Sums::default(),
                Sums::default(),
            )
        });
        trend.incarnations += 1;
        for reading in &incarnation.readings {
            trend.peak_rss_mib = trend.peak_rss_mib.max(reading.rss_bytes as f64 / MIB);
            trend.peak_fds = trend.peak_fds.max(reading.fds);
        }
        if let Some((rss, fds)) = incarnation.mean_at(DRIFT_AGES) {
            let (rss_points, fd_points) = at_age.entry(incarnation.role).or_default();
            rss_points.push((incarnation.started, rss));
            fd_points.push((incarnation.started, fds));
        }
        let settled = incarnation.settled(warm_after(incarnation));
        if settled.len() < 3 {
            continue;
        }
        trend.fitted += 1;
        trend.readings += settled.len();
        let (rss, fds) = points(settled);
        rss_sums.add_group(&rss);
        fd_sums.add_group(&fds);
        let alone =
            incarnation.settled(warm_after(incarnation).max(incarnation.started + life.settle));
        let span = match alone {
            [first, .., last] => last.at - first.at,
            _ => 0.0,
        };
        if span >= life.long_lived {
            let (rss, fds) = points(alone);
            let (rss, fds) = (block_means(&rss, BLOCKS), block_means(&fds, BLOCKS));
            let (rss_slope, fds_slope) = (least_squares(&rss), least_squares(&fds));
            if rss_slope.degrees_of_freedom > 0 {
                long_lived.push(IncarnationTrend {
                    role: incarnation.role,
                    slot: incarnation.slot,
                    minutes: span / 60.0,
                    blocks: rss.len(),
                    rss_mib_per_10min: rss_slope.per_10min,
                    rss_standard_error: rss_slope.standard_error,
                    fds_per_10min: fds_slope.per_10min,
                    fds_standard_error: fds_slope.standard_error,
                });
            }
        }
    }
    let roles = roles
        .into_iter()
        .map(|(role, (mut trend, rss, fds))| {
            trend.within_life_rss_mib_per_10min = rss.slope() * PER;
            trend.within_life_fds_per_10min = fds.slope() * PER;
            trend.drift = at_age
                .get(role)
                .filter(|(rss, _)| rss.len() >= DRIFT_FITTED)
                .map(|(rss, fds)| {
                    let (rss_slope, fds_slope) = (least_squares(rss), least_squares(fds));
                    Drift {
                        incarnations: rss.len(),
                        rss_mib_per_10min: rss_slope.per_10min,
                        rss_standard_error: rss_slope.standard_error,
                        fds_per_10min: fds_slope.per_10min,
                        fds_standard_error: fds_slope.standard_error,
                    }
                });
            (role, trend)
        })
        .collect();
    (roles, long_lived)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A judged run's rule without the settling time, so that fits start at the warm-up.
    const LIFE: LongLife = LongLife {
        settle: 0.0,
        long_lived: 300.0,
    };

    fn incarnation(
        role: &'static str,
        started: f64,
        seconds: usize,
        rss: impl Fn(f64) -> f64,
    ) -> Incarnation {
        Incarnation {
            role,
            slot: 0,
            started,
            readings: (0..seconds)
                .map(|s| {
                    let at = started + s as f64;
                    Reading {
                        at,
                        rss_bytes: (rss(at) * MIB) as u64,
                        fds: 12,
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn a_shared_slope_ignores_the_level_each_incarnation_starts_at() {
        // Three short incarnations at very different levels, each growing 1 MiB per minute:
        // one line through all points would be wrong; the shared slope is 10 MiB / 10 min.
        let all = vec![
            incarnation("worker", 0.0, 60, |t| 100.0 + t / 60.0),
            incarnation("worker", 60.0, 60, |t| 20.0 + (t - 60.0) / 60.0),
            incarnation("worker", 120.0, 60, |t| 300.0 + (t - 120.0) / 60.0),
        ];
        let (roles, long_lived) = fit(&all, LIFE, |i| i.started);
        let worker = &roles["worker"];
        assert_eq!(worker.incarnations, 3);
        assert_eq!(worker.fitted, 3);
        let slope = worker.within_life_rss_mib_per_10min;
        assert!((slope - 10.0).abs() < 0.05, "{worker:?}");
        assert_eq!(worker.within_life_fds_per_10min, 0.0);
        assert!(long_lived.is_empty(), "none lived five minutes");
    }

    #[test]
    fn warm_up_readings_are_left_out_and_long_lives_fitted_alone() {
        // A client that fills 200 MiB of caches in its first minute, then stays flat.
        let client = incarnation(
            "client",
            0.0,
            900,
            |t| if t < 60.0 { t * 3.3 } else { 200.0 },
        );
        let (roles, long_lived) = fit(std::slice::from_ref(&client), LIFE, |_| 60.0);
        assert_eq!(roles["client"].within_life_rss_mib_per_10min, 0.0);
        assert_eq!(long_lived.len(), 1);
        assert_eq!(long_lived[0].rss_mib_per_10min, 0.0);
        assert!(!long_lived[0].rss().grows(RSS_MATERIAL_MIB_PER_10MIN));
        assert!((long_lived[0].minutes - 839.0 / 60.0).abs() < 1e-9);
        // Fitted from 0 instead, the warm-up reads as growth.
        let (cold, _) = fit(std::slice::from_ref(&client), LIFE, |_| 0.0);
        assert!(cold["client"].within_life_rss_mib_per_10min > 1.0);
    }

    #[test]
    fn a_long_life_is_fitted_alone_from_its_settling_time() {
        // A coordinator that rises 2 MiB in its first minute, then stays flat for six.
        let coordinator = incarnation("coordinator", 0.0, 430, |t| 20.0 + t.min(60.0) / 30.0);
        let settled = LongLife {
            settle: 120.0,
            long_lived: 300.0,
        };
        let (_, alone) = fit(std::slice::from_ref(&coordinator), settled, |_| 2.0);
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].rss_mib_per_10min, 0.0);
        // From its warm-up instead, the first minute's rise reads as growth.
        let (_, early) = fit(std::slice::from_ref(&coordinator), LIFE, |_| 2.0);
        assert!(early[0].rss_mib_per_10min > 1.0, "{early:?}");
        // A leak after the settling time still shows; a life too short after it is not fitted.
        let leaking = incarnation("coordinator", 0.0, 430, |t| 20.0 + t / 300.0);
        let (_, alone) = fit(std::slice::from_ref(&leaking), settled, |_| 2.0);
        assert!((alone[0].rss_mib_per_10min - 2.0).abs() < 0.01, "{alone:?}");
        let short = incarnation("coordinator", 0.0, 400, |_| 20.0);
        let (_, alone) = fit(std::slice::from_ref(&short), settled, |_| 2.0);
        assert!(alone.is_empty());
    }

    #[test]
    fn incarnations_with_too_few_readings_are_counted_not_fitted() {
        let all = vec![incarnation("coordinator", 0.0, 2, |_| 50.0)];
        let (roles, _) = fit(&all, LIFE, |i| i.started);
        assert_eq!(roles["coordinator"].incarnations, 1);
        assert_eq!(roles["coordinator"].fitted, 0);
        assert_eq!(roles["coordinator"].peak_rss_mib, 50.0);
    }

    #[test]
    fn the_drift_compares_incarnations_at_the_same_age() {
        // Workers that each grow 2 MiB in the 30 s they live, from the same level: the
        // within-life slope is 40 MiB / 10 min, yet nothing carries over, and the drift is 0.
        let fresh: Vec<Incarnation> = (0..20)
            .map(|i| {
                let started = i as f64 * 30.0;
                incarnation("worker", started, 30, move |t| 12.0 + (t - started) / 15.0)
            })
            .collect();
        let (roles, _) = fit(&fresh, LIFE, |i| i.started);
        let worker = &roles["worker"];
        assert!(worker.within_life_rss_mib_per_10min > 30.0, "{worker:?}");
        let drift = worker.drift.as_ref().expect("all lived 20 s");
        assert_eq!(drift.incarnations, 20);
        assert!(drift.rss_mib_per_10min.abs() < 1e-9, "{drift:?}");
        assert!(drift.judged());
        assert!(!drift.rss().grows(RSS_MATERIAL_MIB_PER_10MIN), "{drift:?}");
        assert!(!drift.fds().grows(FDS_MATERIAL_PER_10MIN), "{drift:?}");
        // Coordinators that replay a journal growing 3 MiB per 10 minutes of the run start
        // higher each time: flat within each life, the drift shows the growth.
        let growing: Vec<Incarnation> = (0..10)
            .map(|i| {
                let started = i as f64 * 60.0;
                incarnation("coordinator", started, 60, move |_| {
                    20.0 + started * 3.0 / 600.0
                })
            })
            .collect();
        let (roles, _) = fit(&growing, LIFE, |i| i.started);
        let coordinator = &roles["coordinator"];
        assert_eq!(coordinator.within_life_rss_mib_per_10min, 0.0);
        let drift = coordinator.drift.as_ref().expect("all lived 20 s");
        assert!((drift.rss_mib_per_10min - 3.0).abs() < 0.05, "{drift:?}");
        assert!(drift.judged());
        assert!(drift.rss().grows(RSS_MATERIAL_MIB_PER_10MIN), "{drift:?}");
    }

    #[test]
    fn no_drift_from_incarnations_that_died_young() {
        // Killed at 12 s: two readings at the compared age, fewer than a mean needs.
        let young: Vec<Incarnation> = (0..10)
            .map(|i| incarnation("worker", i as f64 * 12.0, 12, |_| 12.0))
            .collect();
        let (roles, _) = fit(&young, LIFE, |i| i.started);
        assert_eq!(roles["worker"].drift, None);
    }

    #[test]
    fn the_t_quantile_is_within_0_6_percent_of_the_exact_one() {
        // Student's t at 99.99%, one-sided, by numerical integration of its density.
        for (degrees, exact) in [
            (1, 3183.046),
            (5, 9.678),
            (6, 8.025),
            (8, 6.442),
            (10, 5.694),
            (20, 4.539),
            (60, 3.962),
        ] {
            let t = t_quantile(degrees).expect("a residual");
            assert!(
                (t / exact - 1.0).abs() < 0.006,
                "{degrees}: {t} against {exact}"
            );
        }
        assert_eq!(t_quantile(0), None);
        let unknown = Slope {
            per_10min: 5.0,
            standard_error: 0.0,
            degrees_of_freedom: 0,
        };
        assert!(!unknown.grows(0.5), "no residual, no verdict of growth");
    }

    #[test]
    fn the_standard_error_comes_from_the_residuals() {
        // Four points 5 minutes apart, off a line of 1 per 10 minutes by +0.1, -0.1, -0.1,
        // +0.1: slope 1 per 10 minutes, residual variance 0.04 / 2, spread 450,000 s², so a
        // standard error of sqrt(0.02 / 450,000) per second.
        let points = [(0.0, 0.1), (300.0, 0.4), (600.0, 0.9), (900.0, 1.6)];
        let slope = least_squares(&points);
        assert!((slope.per_10min - 1.0).abs() < 1e-9, "{slope:?}");
        let expected = (0.02f64 / 450_000.0).sqrt() * 600.0;
        assert!((slope.standard_error - expected).abs() < 1e-9, "{slope:?}");
        assert_eq!(slope.degrees_of_freedom, 2);
        // Blocks of equal time, empty ones left out, each at its points' mean.
        let points: Vec<(f64, f64)> = [0.0, 1.0, 2.0, 7.0, 8.0, 12.0]
            .iter()
            .map(|&t| (t, t * 2.0))
            .collect();
        assert_eq!(
            block_means(&points, 4),
            [(1.0, 2.0), (7.5, 15.0), (12.0, 24.0)]
        );
    }

    #[test]
    fn a_long_life_is_judged_on_block_means_not_on_correlated_readings() {
        // A flat client whose resident set wanders by 1 MiB for a minute at a time: 480
        // readings taken as independent would make its chance slope certain.
        let wandering = incarnation("client", 0.0, 600, |t| {
            16.0 + if (t / 60.0) as u64 % 3 == 1 { 1.0 } else { 0.0 }
        });
        let settled = LongLife {
            settle: 120.0,
            long_lived: 300.0,
        };
        let (_, alone) = fit(std::slice::from_ref(&wandering), settled, |_| 0.0);
        let rss = alone[0].rss();
        assert_eq!(alone[0].blocks, BLOCKS);
        let (readings, _) = points(wandering.settled(120.0));
        let naive = least_squares(&readings);
        assert!(
            (naive.per_10min - rss.per_10min).abs() < 0.1,
            "{naive:?} {rss:?}"
        );
        assert!(
            rss.standard_error > 3.0 * naive.standard_error,
            "{naive:?} {rss:?}"
        );
        assert!(!rss.grows(RSS_MATERIAL_MIB_PER_10MIN), "{rss:?}");
    }

    #[test]
    fn this_process_can_be_read() {
        let reading = read_process(std::process::id(), 1.5).expect("our own /proc entry");
        assert!(reading.rss_bytes > 0);
        assert!(reading.fds >= 3, "stdin, stdout, stderr at least");
        assert_eq!(reading.at, 1.5);
    }
}
