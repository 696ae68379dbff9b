//! Resident memory and open descriptors of the soak's processes over time, and the line fitted
//! through them: is anything growing?
//!
//! Each process incarnation (one pid, from start to kill) is sampled from `/proc`. Its samples
//! before a warm-up point (the first epoch boundary after it started) are left out: filling
//! caches and pools once is not a leak. Two fits come out of the rest:
//! - per role (coordinator, worker, client), one slope shared by all its incarnations, each with
//!   its own intercept (least squares on the deviations from each incarnation's means). Workers
//!   are killed every ~20 s and the coordinator every ~60 s, so one incarnation is too short to
//!   fit alone; the shared slope uses all of them;
//! - per incarnation that lived long enough to fit alone ([`LONG_LIVED`]), its own slope.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

/// An incarnation that lived this long after its warm-up is also fitted alone.
pub const LONG_LIVED: Duration = Duration::from_secs(300);

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
}

/// The fit of one role.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RoleTrend {
    /// Incarnations seen.
    pub incarnations: usize,
    /// Incarnations with at least three readings after their warm-up (the ones fitted).
    pub fitted: usize,
    /// Readings used by the fit.
    pub readings: usize,
    /// Shared slope of the resident set, MiB per 10 minutes.
    pub rss_mib_per_10min: f64,
    /// Shared slope of the open descriptors, per 10 minutes.
    pub fds_per_10min: f64,
    /// Largest resident set read, MiB.
    pub peak_rss_mib: f64,
    /// Most descriptors read.
    pub peak_fds: u64,
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

/// Fits every role and every long-lived incarnation. `warm_after(started)` gives the time an
/// incarnation started at `started` is warm from (its first epoch boundary).
pub fn fit(
    incarnations: &[Incarnation],
    warm_after: impl Fn(&Incarnation) -> f64,
) -> (BTreeMap<&'static str, RoleTrend>, Vec<IncarnationTrend>) {
    let mut roles: BTreeMap<&'static str, (RoleTrend, Sums, Sums)> = BTreeMap::new();
    let mut long_lived = Vec::new();
    for incarnation in incarnations {
        let (trend, rss_sums, fd_sums) = roles.entry(incarnation.role).or_insert_with(|| {
            (
                RoleTrend {
                    incarnations: 0,
                    fitted: 0,
                    readings: 0,
                    rss_mib_per_10min: 0.0,
                    fds_per_10min: 0.0,
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
        let settled = incarnation.settled(warm_after(incarnation));
        if settled.len() < 3 {
            continue;
        }
        trend.fitted += 1;
        trend.readings += settled.len();
        let (rss, fds) = points(settled);
        rss_sums.add_group(&rss);
        fd_sums.add_group(&fds);
        let span = settled[settled.len() - 1].at - settled[0].at;
        if span >= LONG_LIVED.as_secs_f64() {
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
            trend.rss_mib_per_10min = rss.slope() * PER;
            trend.fds_per_10min = fds.slope() * PER;
            (role, trend)
        })
        .collect();
    (roles, long_lived)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (roles, long_lived) = fit(&all, |i| i.started);
        let worker = &roles["worker"];
        assert_eq!(worker.incarnations, 3);
        assert_eq!(worker.fitted, 3);
        assert!((worker.rss_mib_per_10min - 10.0).abs() < 0.05, "{worker:?}");
        assert_eq!(worker.fds_per_10min, 0.0);
        assert!(!is_flat(worker.rss_mib_per_10min, worker.fds_per_10min));
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
        let (roles, long_lived) = fit(std::slice::from_ref(&client), |_| 60.0);
        assert_eq!(roles["client"].rss_mib_per_10min, 0.0);
        assert!(is_flat(0.0, 0.0));
        assert_eq!(long_lived.len(), 1);
        assert!((long_lived[0].minutes - 839.0 / 60.0).abs() < 1e-9);
        // Fitted from 0 instead, the warm-up reads as growth.
        let (cold, _) = fit(std::slice::from_ref(&client), |_| 0.0);
        assert!(cold["client"].rss_mib_per_10min > 1.0);
    }

    #[test]
    fn incarnations_with_too_few_readings_are_counted_not_fitted() {
        let all = vec![incarnation("coordinator", 0.0, 2, |_| 50.0)];
        let (roles, _) = fit(&all, |i| i.started);
        assert_eq!(roles["coordinator"].incarnations, 1);
        assert_eq!(roles["coordinator"].fitted, 0);
        assert_eq!(roles["coordinator"].peak_rss_mib, 50.0);
    }

    #[test]
    fn this_process_can_be_read() {
        let reading = read_process(std::process::id(), 1.5).expect("our own /proc entry");
        assert!(reading.rss_bytes > 0);
        assert!(reading.fds >= 3, "stdin, stdout, stderr at least");
        assert_eq!(reading.at, 1.5);
    }
}
