//! The JSON line a soak prints, and its verdict on memory and descriptors per role.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::trend::{
    self, IncarnationTrend, RoleTrend, FDS_MATERIAL_PER_10MIN, RSS_MATERIAL_MIB_PER_10MIN,
};
use super::DataKind;

/// The JSON line `stoker bench soak` prints.
#[derive(Debug, Serialize)]
pub(super) struct SoakReport {
    pub(super) minutes: f64,
    pub(super) kind: DataKind,
    /// Epochs every rank finished (each checked).
    pub(super) epochs: u64,
    /// Batches read by all ranks.
    pub(super) batches: u64,
    /// Workers SIGKILLed (each restarted).
    pub(super) kills: u64,
    /// Coordinator restarts (SIGKILL, then the same port and journal).
    pub(super) restarts: u64,
    /// Clients SIGKILLed (each started again where its last checkpoint left off).
    pub(super) client_kills: u64,
    /// Daemons that exited without being killed (restarted, and a failure).
    pub(super) crashes: u64,
    /// Samples of a checked epoch a rank never got.
    pub(super) lost: u64,
    /// Samples a rank got more often than the embedded loader gives them.
    pub(super) duplicated: u64,
    /// Checked segments whose digest differs from the embedded loader's.
    pub(super) digest_mismatches: u64,
    /// Segments that did not start where their rank's last one ended.
    pub(super) misplaced: u64,
    /// Per role: the drift at a fixed age, and the within-life slope (not judged).
    pub(super) processes: BTreeMap<&'static str, RoleTrend>,
    /// Incarnations that lived five minutes (or half the run, when shorter) or more after two
    /// minutes (or a quarter of the run) from their start, fitted alone from then.
    pub(super) long_lived: Vec<IncarnationTrend>,
    /// No judged slope grows, and every role judged: see [`Verdict`].
    pub(super) flat: bool,
    /// The same verdict for each role.
    pub(super) flat_roles: BTreeMap<&'static str, bool>,
    /// Why roles are not flat, first the one the error's last line names.
    pub(super) not_flat: Vec<NotFlat>,
    /// Whether `flat` counts towards `ok` (runs of 10 minutes or more, or `--judge`).
    pub(super) flat_judged: bool,
    /// Client failures, if any.
    pub(super) failures: Vec<String>,
    /// Nothing lost, duplicated, different or crashed (and flat, when judged).
    pub(super) ok: bool,
}

/// The verdict on memory and descriptors. A role is flat when none of its judged slopes grows
/// ([`trend::Slope::grows`]: at least [`RSS_MATERIAL_MIB_PER_10MIN`] or [`FDS_MATERIAL_PER_10MIN`],
/// and above zero at the one-sided [`trend::CONFIDENCE`] bound) and it has at least one: each
/// long-lived incarnation's own slope, and the role's drift once
/// [`trend::DRIFT_INCARNATIONS`] lived to the age compared. A role whose processes all died
/// young and none lived long is not flat: nothing shows it is.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Verdict {
    /// Per role, whether it is flat.
    pub(super) flat_roles: BTreeMap<&'static str, bool>,
    /// Why roles are not flat: by role, each role's long lives before its drift, the resident
    /// set before the descriptors.
    pub(super) not_flat: Vec<NotFlat>,
}

/// Why a role is not flat.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "why", rename_all = "snake_case")]
pub(super) enum NotFlat {
    /// A judged slope grows.
    Grows(Growth),
    /// No slope of the role was judged.
    Unjudged {
        /// The role.
        role: &'static str,
    },
}

/// A judged slope that grows.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(super) struct Growth {
    /// The role.
    pub(super) role: &'static str,
    /// Which fit.
    pub(super) fit: Fit,
    /// What grows.
    pub(super) measure: Measure,
    /// The slope, per 10 minutes.
    pub(super) per_10min: f64,
    /// Its standard error.
    pub(super) standard_error: f64,
    /// Its one-sided lower bound at [`trend::CONFIDENCE`].
    pub(super) lower_bound: f64,
    /// The least slope judged material.
    pub(super) material: f64,
}

/// What a slope measures.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum Measure {
    /// The resident set, in MiB.
    ResidentSet,
    /// Open file descriptors.
    Descriptors,
}

/// Which fit a judgement is of.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub(super) enum Fit {
    /// One incarnation's own life.
    LongLife {
        /// Which one of its role.
        slot: usize,
        /// Minutes fitted.
        minutes: f64,
    },
    /// The role's incarnations compared at the same age.
    Drift {
        /// Incarnations compared.
        incarnations: usize,
    },
}

impl fmt::Display for NotFlat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotFlat::Grows(growth) => growth.fmt(f),
            NotFlat::Unjudged { role } => write!(
                f,
                "{role}: nothing judged (none lived long enough to be fitted alone, fewer than {} to the drift age)",
                trend::DRIFT_INCARNATIONS
            ),
        }
    }
}

impl fmt::Display for Growth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = self.role;
        match self.fit {
            Fit::LongLife { slot, minutes } => {
                write!(f, "{role} {slot}'s own life ({minutes:.1} min)")?
            }
            Fit::Drift { incarnations } => write!(f, "{role} drift ({incarnations} incarnations)")?,
        }
        let (measure, unit) = match self.measure {
            Measure::ResidentSet => ("resident set", " MiB"),
            Measure::Descriptors => ("descriptors", ""),
        };
        write!(
            f,
            ": {measure} {:+.2} ± {:.2}{unit} per 10 min, {}% lower bound {:+.2} (growth from {:.2})",
            self.per_10min,
            self.standard_error,
            (trend::CONFIDENCE * 10_000.0).round() / 100.0,
            self.lower_bound,
            self.material
        )
    }
}

/// Judges every role: see [`Verdict`].
pub(super) fn verdict(
    processes: &BTreeMap<&'static str, RoleTrend>,
    long_lived: &[IncarnationTrend],
) -> Verdict {
    let mut flat_roles = BTreeMap::new();
    let mut not_flat = Vec::new();
    for (&role, trend) in processes {
        let own = long_lived.iter().filter(|l| l.role == role).map(|l| {
            let fit = Fit::LongLife {
                slot: l.slot,
                minutes: l.minutes,
            };
            (fit, l.rss(), l.fds())
        });
        let drift = trend.drift.iter().filter(|d| d.judged()).map(|d| {
            let fit = Fit::Drift {
                incarnations: d.incarnations,
            };
            (fit, d.rss(), d.fds())
        });
        let mut judged = 0;
        let mut grows = Vec::new();
        for (fit, rss, fds) in own.chain(drift) {
            judged += 1;
            for (measure, slope, material) in [
                (Measure::ResidentSet, rss, RSS_MATERIAL_MIB_PER_10MIN),
                (Measure::Descriptors, fds, FDS_MATERIAL_PER_10MIN),
            ] {
                if slope.grows(material) {
                    grows.push(NotFlat::Grows(Growth {
                        role,
                        fit,
                        measure,
                        per_10min: slope.per_10min,
                        standard_error: slope.standard_error,
                        lower_bound: slope.lower_bound(),
                        material,
                    }));
                }
            }
        }
        if judged == 0 {
            grows.push(NotFlat::Unjudged { role });
        }
        flat_roles.insert(role, grows.is_empty());
        not_flat.extend(grows);
    }
    Verdict {
        flat_roles,
        not_flat,
    }
}

#[cfg(test)]
mod tests {
    use rand_core::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    use super::*;
    use crate::bench::soak::trend::{fit, Incarnation, LongLife, Reading};

    const MIB: f64 = 1024.0 * 1024.0;

    /// Leaks planted in a simulated run.
    #[derive(Debug, Clone, Copy, Default)]
    struct Planted {
        /// MiB per 10 minutes that the spared client (rank 0) grows by as it lives.
        client_rss_mib_per_10min: f64,
        /// Descriptors per 10 minutes of the run before it started that each worker
        /// incarnation holds more of.
        worker_fds_drift_per_10min: f64,
    }

    /// A seeded source of noise.
    struct Noise(Pcg64);

    impl Noise {
        fn new(seed: u64) -> Noise {
            Noise(Pcg64::seed_from_u64(seed))
        }

        /// Uniform in [0, 1).
        fn unit(&mut self) -> f64 {
            (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Standard normal (Box-Muller).
        fn normal(&mut self) -> f64 {
            let u = 1.0 - self.unit();
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
        }

        /// A jittered interval around `mean` seconds, as the soak draws them.
        fn interval(&mut self, mean: f64) -> f64 {
            mean * (0.5 + self.unit())
        }
    }

    /// The lives, in seconds, of one slot's incarnations: (started, ended).
    fn lives(starts: &[f64], end: f64) -> Vec<(f64, f64)> {
        let ends = starts.iter().skip(1).copied().chain([end]);
        starts.iter().copied().zip(ends).collect()
    }

    /// A soak of `minutes` as `run` schedules it by default (a worker of the two not spared
    /// killed every ~20 s, the coordinator every ~60 s outside the last 7.5 of every 10
    /// minutes, client rank 1 every ~120 s), each process read each second: resident set at a
    /// level of its own with 250 KiB of jitter (correlated from one second to the next, 0.5),
    /// descriptors at 14 with jitter of ±2 (uniform), and what `planted` adds.
    fn simulated_run(seed: u64, minutes: f64, planted: Planted) -> Vec<Incarnation> {
        let mut noise = Noise::new(seed);
        let end = minutes * 60.0;
        let mut workers = vec![vec![0.0]; 3];
        let mut t = noise.interval(20.0);
        while t < end {
            let victim = 1 + (noise.0.next_u64() % 2) as usize;
            workers[victim].push(t);
            t += noise.interval(20.0);
        }
        let mut coordinator = vec![0.0];
        let mut t = noise.interval(60.0);
        while t < end {
            if t % 600.0 < 150.0 {
                coordinator.push(t);
                t += noise.interval(60.0);
            } else {
                t += 1.0;
            }
        }
        let mut client = vec![0.0];
        let mut t = noise.interval(120.0);
        while t < end {
            client.push(t);
            t += noise.interval(120.0);
        }
        let slots = [
            ("worker", 0, lives(&workers[0], end), 18.0),
            ("worker", 1, lives(&workers[1], end), 18.0),
            ("worker", 2, lives(&workers[2], end), 18.0),
            ("coordinator", 0, lives(&coordinator, end), 18.0),
            ("client", 0, lives(&[0.0], end), 16.0),
            ("client", 1, lives(&client, end), 16.0),
        ];
        let mut incarnations = Vec::new();
        for (role, slot, lives, level) in slots {
            for (started, ended) in lives {
                let leak = match (role, slot) {
                    ("client", 0) => planted.client_rss_mib_per_10min / 600.0,
                    _ => 0.0,
                };
                let fds = match role {
                    "worker" => 14.0 + planted.worker_fds_drift_per_10min * started / 600.0,
                    _ => 14.0,
                };
                let mut jitter = 0.25 * noise.normal();
                let readings = (1..)
                    .map(|s| started + f64::from(s))
                    .take_while(|at| *at < ended)
                    .map(|at| {
                        jitter = 0.5 * jitter + 0.75f64.sqrt() * 0.25 * noise.normal();
                        let rss = level + leak * (at - started) + jitter;
                        Reading {
                            at,
                            rss_bytes: (rss * MIB) as u64,
                            fds: (fds + 5.0 * noise.unit() - 2.5).round() as u64,
                        }
                    })
                    .collect();
                incarnations.push(Incarnation {
                    role,
                    slot,
                    started,
                    readings,
                });
            }
        }
        incarnations
    }

    /// The verdict on a simulated run of 10 minutes or more, judged as `run` judges it.
    fn judged(incarnations: &[Incarnation]) -> Verdict {
        let life = LongLife {
            settle: trend::SETTLE.as_secs_f64(),
            long_lived: trend::LONG_LIVED.as_secs_f64(),
        };
        let (processes, long_lived) = fit(incarnations, life, |i| i.started + 5.0);
        verdict(&processes, &long_lived)
    }

    /// One client incarnation of `seconds` readings from `started`, its descriptors at `fds`
    /// with jitter of ±2.
    fn client(noise: &mut Noise, slot: usize, started: f64, seconds: u32, fds: f64) -> Incarnation {
        let readings = (1..=seconds)
            .map(|s| Reading {
                at: started + f64::from(s),
                rss_bytes: (16.0 * MIB) as u64,
                fds: (fds + 5.0 * noise.unit() - 2.5).round() as u64,
            })
            .collect();
        Incarnation {
            role: "client",
            slot,
            started,
            readings,
        }
    }

    #[test]
    fn a_count_that_falls_never_fails() {
        // The run that failed: over 5 client incarnations (rank 1 killed 3 times, each
        // started again), the descriptors at 10-20 s of age fell by about half a descriptor
        // per 10 minutes, and the absolute value read that as growth.
        let mut noise = Noise::new(7);
        let mut run = vec![client(&mut noise, 0, 0.0, 600, 14.5)];
        for (started, fds) in [(0.0, 14.5), (160.0, 14.3), (330.0, 14.2), (490.0, 14.1)] {
            run.push(client(&mut noise, 1, started, 100, fds));
        }
        let life = LongLife {
            settle: trend::SETTLE.as_secs_f64(),
            long_lived: trend::LONG_LIVED.as_secs_f64(),
        };
        let (processes, long_lived) = fit(&run, life, |i| i.started + 5.0);
        let drift = processes["client"].drift.clone().expect("5 lived to 20 s");
        assert_eq!(drift.incarnations, 5);
        assert!(drift.fds_per_10min < 0.0, "{drift:?}");
        assert!(!drift.judged(), "too few to judge");
        let verdict = verdict(&processes, &long_lived);
        assert!(verdict.flat_roles["client"], "{verdict:?}");
        // Judged, a fall is never growth however steep and however certain.
        assert!(!drift.fds().grows(FDS_MATERIAL_PER_10MIN));
        let falling: Vec<Incarnation> = (0..30)
            .map(|i| {
                let started = f64::from(i) * 20.0;
                client(&mut noise, 1, started, 30, 20.0 - started / 100.0)
            })
            .collect();
        let (processes, _) = fit(&falling, life, |i| i.started);
        let drift = processes["client"].drift.clone().expect("all lived 20 s");
        assert!(drift.judged());
        assert!(drift.fds_per_10min < -5.0, "{drift:?}");
        assert!(drift.fds().lower_bound() < -5.0, "{drift:?}");
        assert!(!drift.fds().grows(FDS_MATERIAL_PER_10MIN));
    }

    #[test]
    fn a_leak_of_one_mib_per_10_minutes_in_a_long_life_fails() {
        let leak = Planted {
            client_rss_mib_per_10min: 1.0,
            ..Planted::default()
        };
        for seed in 0..200 {
            let verdict = judged(&simulated_run(seed, 10.0, leak));
            assert!(!verdict.flat_roles["client"], "seed {seed}: {verdict:?}");
            match verdict.not_flat.first() {
                Some(NotFlat::Grows(growth)) => {
                    assert!(
                        matches!(growth.fit, Fit::LongLife { slot: 0, .. }),
                        "seed {seed}: {growth:?}"
                    );
                    assert_eq!(growth.measure, Measure::ResidentSet, "seed {seed}");
                    assert!(growth.lower_bound > 0.0, "seed {seed}: {growth:?}");
                }
                other => panic!("seed {seed}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_drift_of_one_descriptor_per_10_minutes_fails() {
        // Twenty minutes: in ten, the drift's whole rise is one descriptor, within the noise of
        // the workers' means (see `trend::DRIFT_INCARNATIONS`).
        let drift = Planted {
            worker_fds_drift_per_10min: 1.0,
            ..Planted::default()
        };
        for seed in 0..200 {
            let verdict = judged(&simulated_run(seed, 20.0, drift));
            assert!(!verdict.flat_roles["worker"], "seed {seed}: {verdict:?}");
            let on_the_drift = verdict.not_flat.iter().any(|not_flat| {
                matches!(not_flat, NotFlat::Grows(g) if g.role == "worker"
                    && matches!(g.fit, Fit::Drift { .. })
                    && g.measure == Measure::Descriptors)
            });
            assert!(on_the_drift, "seed {seed}: {verdict:?}");
        }
    }

    #[test]
    fn noise_alone_never_fails() {
        for seed in 0..200 {
            let verdict = judged(&simulated_run(seed, 10.0, Planted::default()));
            assert!(verdict.not_flat.is_empty(), "seed {seed}: {verdict:?}");
            assert_eq!(verdict.flat_roles.len(), 3);
        }
        for seed in 0..20 {
            let verdict = judged(&simulated_run(1_000 + seed, 60.0, Planted::default()));
            assert!(verdict.not_flat.is_empty(), "seed {seed}: {verdict:?}");
        }
    }
}
