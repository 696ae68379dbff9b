//! Resident memory and open descriptors of the soak's processes over time, and the line fitted
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
//!   and a 20-second line stated per 10 minutes cannot tell that from a leak.

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

/// Incarnations a drift needs to be fitted.
const DRIFT_INCARNATIONS: usize = 3;

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
    /// The incarnations compared at the same age, when enough lived to that age.
    pub drift: Option<Drift>,
    /// Largest resident set read, MiB.
    pub peak_rss_mib: f64,
    /// Most descriptors read.
    pub peak_fds: u64,
}

/// The drift of one role: each incarnation's mean resident set and descriptors at the same age
/// ([`DRIFT_AGES`]), fitted against when it started.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Drift {
    /// Incarnations that lived to the age compared.
    pub incarnations: usize,
    /// Slope of the resident set at that age over the run, MiB per 10 minutes.
    pub rss_mib_per_10min: f64,
    /// Slope of the descriptors at that age over the run, per 10 minutes.
    pub fds_per_10min: f64,
}

/// The fit of one long-lived incarnation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IncarnationTrend {
    /// Its role.
    pub role: &'static str,
    /// Which one of its role.
    pub slot: usize,
    /// Minutes fitted (after its warm-up).
    pub minutes: f64,
    /// Slope of the resident set, MiB per 10 minutes.
    pub rss_mib_per_10min: f64,
    /// Slope of the open descriptors, per 10 minutes.
    pub fds_per_10min: f64,
}

/// The bounds a flat run stays within: resident set under 1 MiB per 10 minutes, and descriptors
/// a fitted change of under half a descriptor per 10 minutes (that is, 0 when rounded).
pub fn is_flat(rss_mib_per_10min: f64, fds_per_10min: f64) -> bool {
    rss_mib_per_10min < 1.0 && fds_per_10min.abs() < 0.5
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
            let (mut alone_rss, mut alone_fds) = (Sums::default(), Sums::default());
            alone_rss.add_group(&rss);
            alone_fds.add_group(&fds);
            long_lived.push(IncarnationTrend {
                role: incarnation.role,
                slot: incarnation.slot,
                minutes: span / 60.0,
                rss_mib_per_10min: alone_rss.slope() * PER,
                fds_per_10min: alone_fds.slope() * PER,
            });
        }
    }
    let roles = roles
        .into_iter()
        .map(|(role, (mut trend, rss, fds))| {
            trend.within_life_rss_mib_per_10min = rss.slope() * PER;
            trend.within_life_fds_per_10min = fds.slope() * PER;
            trend.drift = at_age
                .get(role)
                .filter(|(rss, _)| rss.len() >= DRIFT_INCARNATIONS)
                .map(|(rss, fds)| {
                    let (mut rss_sums, mut fd_sums) = (Sums::default(), Sums::default());
                    rss_sums.add_group(rss);
                    fd_sums.add_group(fds);
                    Drift {
                        incarnations: rss.len(),
                        rss_mib_per_10min: rss_sums.slope() * PER,
                        fds_per_10min: fd_sums.slope() * PER,
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
        assert!(!is_flat(slope, worker.within_life_fds_per_10min));
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
        assert!(is_flat(0.0, 0.0));
        assert_eq!(long_lived.len(), 1);
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
        assert!(is_flat(drift.rss_mib_per_10min, drift.fds_per_10min));
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
        assert!(!is_flat(drift.rss_mib_per_10min, drift.fds_per_10min));
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
    fn this_process_can_be_read() {
        let reading = read_process(std::process::id(), 1.5).expect("our own /proc entry");
        assert!(reading.rss_bytes > 0);
        assert!(reading.fds >= 3, "stdin, stdout, stderr at least");
        assert_eq!(reading.at, 1.5);
    }
}
