//! `stoker bench soak`: the distributed mode run for a long time under faults. A coordinator,
//! three worker daemons and two client processes (two ranks of one job) run on loopback; a
//! random worker (one is spared by default, so that one lives the whole run) is SIGKILLed and
//! restarted every ~20 s, the coordinator every ~60 s (on the same port and journal; not in the
//! last 7.5 of every 10 minutes, so that one coordinator in each lives over 7), a random client
//! every ~120 s (one is spared by default; the victim is started again at the epoch and step
//! after its last checkpoint, as a training script resumes from its `state_dict`). At each checkpoint of each rank the soak
//! checks what the rank read against the embedded loader's same batches: the same digest, every
//! sample exactly once, each resumed client starting where its last checkpoint ended. It
//! samples the resident set and open descriptors of every process each second and fits lines
//! through them ([`trend`]). It prints one JSON line.

mod check;
pub mod client;
mod clients;
mod data;
pub(crate) mod fleet;
mod report;
pub mod trend;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use rand_core::{Rng, SeedableRng};
use serde::Serialize;

use super::{Error, Result};
use check::Checker;
use client::ClientLine;
use clients::{Clients, Said};
use data::make_data;
pub(crate) use data::spec;
use fleet::{Recipe, Running};
use report::{verdict, NotFlat, SoakReport};
use trend::Incarnation;

/// Settings of `stoker bench soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakBench {
    /// How long to run, in minutes (fractions allowed).
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// What the job reads: small generated images through the train preset (decode, crop,
    /// flip), or a generated token file (windows; cheap, so the daemons' own cost dominates).
    #[arg(long, value_enum, default_value_t = DataKind::Images)]
    pub kind: DataKind,
    /// Samples in the dataset.
    #[arg(long, default_value_t = 128)]
    pub samples: u64,
    /// Samples per batch.
    #[arg(long, default_value_t = 8)]
    pub batch_size: u32,
    /// Simulated training step per batch, in milliseconds.
    #[arg(long, default_value_t = 150)]
    pub step_ms: u64,
    /// Worker daemons.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Client processes (ranks of the job).
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Mean seconds between worker kills (each interval drawn from 0.5x to 1.5x); the victim is
    /// drawn from the workers not spared.
    #[arg(long, default_value_t = 20.0)]
    pub kill_every_s: f64,
    /// Workers never killed (the first ones), so that a worker lives the whole run under the
    /// faults around it and its own slope is fitted alone.
    #[arg(long, default_value_t = 1)]
    pub spared_workers: usize,
    /// Mean seconds between coordinator restarts (drawn like the kills).
    #[arg(long, default_value_t = 60.0)]
    pub restart_every_s: f64,
    /// Seconds at the end of every 10 minutes in which the coordinator is not restarted, so
    /// that one incarnation in each 10 minutes lives long enough to be fitted alone (two
    /// minutes to settle, then five; 0: no rest).
    #[arg(long, default_value_t = 450.0)]
    pub coordinator_rest_s: f64,
    /// Mean seconds between client kills (drawn like the others); the victim, a random rank
    /// not spared, is started again at the position after its last checkpoint.
    #[arg(long, default_value_t = 120.0)]
    pub client_kill_every_s: f64,
    /// Clients never killed (the first ranks), so that one lives the whole run and its own
    /// slope is fitted alone.
    #[arg(long, default_value_t = 1)]
    pub spared_clients: u32,
    /// A planted leak, to check the verdict: rank 0's client (spared by default) grows its
    /// resident set by this many MiB per 10 minutes, never freed.
    #[arg(long, default_value_t = 0.0)]
    pub plant_leak_mib_per_10min: f64,
    /// Longest the clients hold wanted credits (and the acknowledgements riding with them) while
    /// the workers hold more than half their window (the loader's `ack_interval`); a long one
    /// makes every client kill cut an interval with acknowledgements not yet sent.
    #[arg(long, default_value_t = 50)]
    pub ack_interval_ms: u64,
    /// Judge memory and descriptors in a run shorter than 10 minutes too (processes that lived
    /// half the run after its first quarter are then fitted alone).
    #[arg(long)]
    pub judge: bool,
    /// Seed of the kill schedule and of the job.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Append the daemons' and clients' logs here (default: a file removed at the end).
    #[arg(long)]
    pub log: Option<PathBuf>,
}

/// The dataset a soak reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// Generated ImageNet-like JPEG/PNG class folders, train preset at 32 px.
    Images,
    /// A generated uint16 token file, windows of 128 + 1 tokens.
    Tokens,
}

/// Runs shorter than this report slopes but are not judged on them: too short to fit.
const JUDGED_FROM_MINUTES: f64 = 10.0;

/// A process slot: what starts it, and its running incarnation.
struct Slot {
    role: &'static str,
    index: usize,
    recipe: Recipe,
    running: Option<Running>,
}

/// Everything the run keeps while it goes.
pub(crate) struct Soak {
    t0: Instant,
    log: std::fs::File,
    incarnations: Vec<Incarnation>,
    /// Per rank, when each of its epochs was reported (seconds since the start).
    epoch_times: Vec<Vec<f64>>,
}

impl Soak {
    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Starts `slot`'s daemon (again) and records a new incarnation.
    fn start_daemon(&mut self, slot: &mut Slot) -> Result<String> {
        let mut last = None;
        // A restart on the same port may race the kernel releasing it: retry briefly.
        for _ in 0..5 {
            match fleet::start_daemon(&slot.recipe, &self.log) {
                Ok((child, address)) => {
                    let started = self.now();
                    let incarnation = self.new_incarnation(slot.role, slot.index, started);
                    slot.running = Some(fleet::running(child, incarnation));
                    return Ok(address);
                }
                Err(error) => {
                    last = Some(error);
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Failed("daemon did not start".into())))
    }

    fn new_incarnation(&mut self, role: &'static str, slot: usize, started: f64) -> usize {
        self.incarnations.push(Incarnation {
            role,
            slot,
            started,
            readings: Vec::new(),
        });
        self.incarnations.len() - 1
    }

    fn sample(&mut self, running: &Running) {
        let at = self.now();
        if let Some(reading) = trend::read_process(running.pid, at) {
            self.incarnations[running.incarnation]
                .readings
                .push(reading);
        }
    }

    /// When the incarnation is warm: its first epoch boundary (its own rank's for a client,
    /// any rank's for a daemon) after it started.
    fn warm_after(&self, incarnation: &Incarnation) -> f64 {
        let boundaries: Vec<f64> = if incarnation.role == "client" {
            self.epoch_times
                .get(incarnation.slot)
                .cloned()
                .unwrap_or_default()
        } else {
            self.epoch_times.iter().flatten().copied().collect()
        };
        boundaries
            .into_iter()
            .filter(|t| *t > incarnation.started)
            .fold(f64::INFINITY, f64::min)
    }
}

/// Whether `now` (seconds since the start) falls in the last `rest` seconds of a 10-minute
/// block, when the coordinator is not restarted.
fn resting(now: f64, rest: f64) -> bool {
    now % 600.0 >= 600.0 - rest
}

/// A jittered interval around `mean` seconds.
fn jitter(rng: &mut rand_pcg::Pcg64, mean: f64) -> f64 {
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    mean * (0.5 + unit)
}

fn validate(args: &SoakBench) -> Result<()> {
    let bad = |what: &str| Err(Error::InvalidArgument(what.to_string()));
    if args.minutes.is_nan() || args.minutes <= 0.0 {
        return bad("--minutes must be above 0");
    }
    if args.workers == 0 || args.clients == 0 || args.batch_size == 0 {
        return bad("--workers, --clients and --batch-size must be at least 1");
    }
    if args.spared_workers > args.workers {
        return bad("--spared-workers must be at most --workers");
    }
    if args.spared_clients > args.clients {
        return bad("--spared-clients must be at most --clients");
    }
    if !(0.0..600.0).contains(&args.coordinator_rest_s) {
        return bad("--coordinator-rest-s must be in 0..600");
    }
    if args.samples < u64::from(args.clients) {
        return bad("--samples must be at least --clients");
    }
    let at_least_one = |s: f64| s >= 1.0;
    if !at_least_one(args.kill_every_s)
        || !at_least_one(args.restart_every_s)
        || !at_least_one(args.client_kill_every_s)
    {
        return bad(
            "--kill-every-s, --restart-every-s and --client-kill-every-s must be at least 1",
        );
    }
    if !(args.plant_leak_mib_per_10min >= 0.0 && args.plant_leak_mib_per_10min.is_finite()) {
        return bad("--plant-leak-mib-per-10min must be 0 or more");
    }
    Ok(())
}

/// Runs the soak and prints its JSON line; fails when anything was lost, duplicated, different
/// or crashed, or (for runs of 10 minutes or more) a slope is out of bounds.
pub fn run(args: &SoakBench) -> Result<()> {
    validate(args)?;
    let dir = tempfile::tempdir()?;
    let data = make_data(dir.path(), args)?;
    let log_path = args
        .log
        .clone()
        .unwrap_or_else(|| dir.path().join("soak.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let exe = std::env::current_exe()?;
    let mut soak = Soak {
        t0: Instant::now(),
        log,
        incarnations: Vec::new(),
        epoch_times: vec![Vec::new(); args.clients as usize],
    };
    let mut coordinator = Slot {
        role: "coordinator",
        index: 0,
        recipe: Recipe {
            program: exe.clone(),
            args: vec![
                "coordinator".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--state".into(),
                dir.path().join("state").to_string_lossy().into_owned(),
                "--lease-timeout-ms".into(),
                "1000".into(),
            ],
        },
        running: None,
    };
    let address = soak.start_daemon(&mut coordinator)?;
    // Restarts come back on the same port.
    coordinator.recipe.args[2] = address.clone();
    let worker_program = fleet::worker_binary()?;
    let mut workers = Vec::new();
    for index in 0..args.workers {
        let mut slot = Slot {
            role: "worker",
            index,
            recipe: Recipe {
                program: worker_program.clone(),
                args: vec![
                    "--coordinator".into(),
                    address.clone(),
                    "--data-root".into(),
                    dir.path().to_string_lossy().into_owned(),
                    "--threads".into(),
                    "1".into(),
                ],
            },
            running: None,
        };
        soak.start_daemon(&mut slot)?;
        workers.push(slot);
    }
    let client_args = (0..args.clients)
        .map(|rank| client_args(args, &address, &data, rank))
        .collect();
    let mut clients = Clients::launch(exe, client_args, &mut soak)?;
    let mut client_rng = rand_pcg::Pcg64::seed_from_u64(args.seed ^ 0xc11e);

    let checker = Checker::start(&data, args)?;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(args.seed);
    let end = args.minutes * 60.0;
    let mut next_kill = jitter(&mut rng, args.kill_every_s);
    let mut next_restart = jitter(&mut rng, args.restart_every_s);
    let mut next_client_kill = jitter(&mut client_rng, args.client_kill_every_s);
    let mut next_progress = 60.0;
    let (mut kills, mut restarts, mut crashes, mut client_kills) = (0u64, 0u64, 0u64, 0u64);
    let mut failures = Vec::new();
    let mut stopping: Option<f64> = None;
    // The main loop: one pass a second. After `end`, clients are told to stop after their
    // current epoch; the faults stop too, and the loop waits for the clients to finish.
    loop {
        let tick = Instant::now();
        for slot in std::iter::once(&coordinator).chain(&workers) {
            if let Some(running) = &slot.running {
                soak.sample(running);
            }
        }
        for running in clients.running() {
            soak.sample(running);
        }
        take_lines(&mut clients, &mut soak, &checker, &mut failures);
        for slot in std::iter::once(&mut coordinator).chain(workers.iter_mut()) {
            let died = slot.running.as_mut().and_then(Running::exited);
            if let Some(status) = died {
                crashes += 1;
                tracing::error!(role = slot.role, index = slot.index, %status, "daemon exited unasked; restarting it");
                soak.start_daemon(slot)?;
            }
        }
        if clients.all_exited() {
            break;
        }
        let now = soak.now();
        if stopping.is_none() && clients.any_exited() {
            failures.push("a client exited before the end".into());
            stopping = Some(now);
        }
        if stopping.is_none() && now >= end {
            stopping = Some(now);
        }
        match stopping {
            Some(since) => {
                clients.ask_to_stop();
                if now - since > 300.0 {
                    failures
                        .push("clients did not finish their last epoch within 5 minutes".into());
                    break;
                }
            }
            None => {
                let killable = (workers.len() - args.spared_workers) as u64;
                if now >= next_kill && killable > 0 {
                    let victim = args.spared_workers + (rng.next_u64() % killable) as usize;
                    if let Some(mut running) = workers[victim].running.take() {
                        running.kill();
                    }
                    soak.start_daemon(&mut workers[victim])?;
                    kills += 1;
                    next_kill = now + jitter(&mut rng, args.kill_every_s);
                }
                let killable = u64::from(args.clients - args.spared_clients);
                if now >= next_client_kill && killable > 0 {
                    let victim = (u64::from(args.spared_clients) + client_rng.next_u64() % killable)
                        as usize;
                    clients.kill(victim);
                    // Its last lines first: it resumes after them.
                    take_lines(&mut clients, &mut soak, &checker, &mut failures);
                    clients.start(victim, &mut soak)?;
                    client_kills += 1;
                    next_client_kill = now + jitter(&mut client_rng, args.client_kill_every_s);
                }
                if now >= next_restart && !resting(now, args.coordinator_rest_s) {
                    if let Some(mut running) = coordinator.running.take() {
                        running.kill();
                    }
                    soak.start_daemon(&mut coordinator)?;
                    restarts += 1;
                    next_restart = now + jitter(&mut rng, args.restart_every_s);
                }
                if now >= next_progress {
                    let tally = checker.tally();
                    eprintln!(
                        "soak: {:.0} min, epochs checked {}, kills {kills}, restarts {restarts}, lost {}, duplicated {}",
                        now / 60.0,
                        tally.epochs(),
                        tally.lost,
                        tally.duplicated
                    );
                    next_progress += 60.0;
                }
            }
        }
        if let Some(rest) = Duration::from_secs(1).checked_sub(tick.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    if stopping.is_none() {
        failures.push("every client exited before the end".into());
    }
    clients.join_readers();
    take_lines(&mut clients, &mut soak, &checker, &mut failures);
    let checked = checker.finish()?;
    let minutes = soak.now() / 60.0;
    // A run shorter than 10 minutes (judged only with --judge) scales both down.
    let life = trend::LongLife {
        settle: trend::SETTLE.as_secs_f64().min(args.minutes * 60.0 / 4.0),
        long_lived: trend::LONG_LIVED
            .as_secs_f64()
            .min(args.minutes * 60.0 / 2.0),
    };
    let (processes, long_lived) = trend::fit(&soak.incarnations, life, |i| soak.warm_after(i));
    let verdict = verdict(&processes, &long_lived);
    let flat = verdict.not_flat.is_empty();
    let flat_judged = args.minutes >= JUDGED_FROM_MINUTES || args.judge;
    let ok = checked.lost == 0
        && checked.duplicated == 0
        && checked.mismatches == 0
        && checked.misplaced == 0
        && crashes == 0
        && failures.is_empty()
        && checked.epochs() > 0
        && (flat || !flat_judged);
    let report = SoakReport {
        minutes,
        kind: args.kind,
        epochs: checked.epochs(),
        batches: checked.batches,
        kills,
        restarts,
        client_kills,
        crashes,
        lost: checked.lost,
        duplicated: checked.duplicated,
        digest_mismatches: checked.mismatches,
        misplaced: checked.misplaced,
        processes,
        long_lived,
        flat,
        flat_roles: verdict.flat_roles,
        not_flat: verdict.not_flat,
        flat_judged,
        failures,
        ok,
    };
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &report)?;
    writeln!(stdout)?;
    drop(stdout);
    if ok {
        return Ok(());
    }
    let logs = if args.log.is_some() {
        log_path.display().to_string()
    } else {
        "--log PATH when rerun".to_string()
    };
    let growth = report.not_flat.first().filter(|_| flat_judged);
    Err(Error::Failed(failure_message(&logs, growth)))
}

/// The failed run's error, the last line it prints: where to look, then the first judgement
/// that is not flat when that counts.
fn failure_message(logs: &str, not_flat: Option<&NotFlat>) -> String {
    let message = format!("the soak failed (see the JSON line; logs in {logs})");
    match not_flat {
        Some(first) => format!("{message}; not flat: {first}"),
        None => message,
    }
}

/// Hands the clients' new lines on: checkpoints to the checker (and each epoch's end to the
/// warm-up clock), failures and garbled lines to `failures`.
fn take_lines(
    clients: &mut Clients,
    soak: &mut Soak,
    checker: &Checker,
    failures: &mut Vec<String>,
) {
    for (rank, said) in clients.take_lines() {
        match said {
            Said::Line(ClientLine::Segment(read)) => {
                if read.ends_epoch {
                    let at = soak.now();
                    soak.epoch_times[rank as usize].push(at);
                }
                checker.submit(read);
            }
            Said::Line(ClientLine::Failed(error)) => failures.push(format!("rank {rank}: {error}")),
            Said::Garbled(line) => failures.push(format!("rank {rank} printed {line:?}")),
        }
    }
}

fn client_args(args: &SoakBench, address: &str, data: &Path, rank: u32) -> Vec<String> {
    // The name clap parses back in the client.
    let kind = args
        .kind
        .to_possible_value()
        .map(|value| value.get_name().to_string())
        .unwrap_or_default();
    [
        "bench",
        "soak-client",
        "--address",
        address,
        "--data",
        &data.to_string_lossy(),
        "--kind",
        &kind,
        "--rank",
        &rank.to_string(),
        "--world",
        &args.clients.to_string(),
        "--batch-size",
        &args.batch_size.to_string(),
        "--step-ms",
        &args.step_ms.to_string(),
        "--ack-interval-ms",
        &args.ack_interval_ms.to_string(),
        "--leak-kib-per-s",
        &if rank == 0 {
            (args.plant_leak_mib_per_10min * 1024.0 / 600.0).round() as u64
        } else {
            0
        }
        .to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use trend::{Drift, IncarnationTrend, RoleTrend};

    fn is_flat(
        processes: &BTreeMap<&'static str, RoleTrend>,
        long_lived: &[IncarnationTrend],
    ) -> bool {
        verdict(processes, long_lived)
            .flat_roles
            .values()
            .all(|flat| *flat)
    }

    /// A role with a drift of (MiB, descriptors) per 10 minutes over `incarnations`, each
    /// with a standard error of 0.1.
    fn role(drift: Option<(f64, f64)>, incarnations: usize) -> RoleTrend {
        RoleTrend {
            incarnations,
            fitted: incarnations,
            readings: 300,
            // Never judged, however steep.
            within_life_rss_mib_per_10min: 25.0,
            within_life_fds_per_10min: 3.0,
            drift: drift.map(|(rss, fds)| Drift {
                incarnations,
                rss_mib_per_10min: rss,
                rss_standard_error: 0.1,
                fds_per_10min: fds,
                fds_standard_error: 0.1,
            }),
            peak_rss_mib: 16.0,
            peak_fds: 16,
        }
    }

    /// A long life whose resident set grows `rss` MiB per 10 minutes, with a standard error
    /// of `error`.
    fn long(role: &'static str, rss: f64, error: f64) -> IncarnationTrend {
        IncarnationTrend {
            role,
            slot: 0,
            minutes: 60.0,
            blocks: 12,
            rss_mib_per_10min: rss,
            rss_standard_error: error,
            fds_per_10min: 0.0,
            fds_standard_error: 0.1,
        }
    }

    #[test]
    fn the_coordinator_rests_in_the_last_part_of_every_ten_minutes() {
        assert!(!resting(0.0, 300.0));
        assert!(!resting(299.9, 300.0));
        assert!(resting(300.0, 300.0));
        assert!(resting(599.9, 300.0));
        assert!(!resting(600.0, 300.0));
        assert!(resting(1_150.0, 300.0));
        assert!(resting(150.0, 450.0) && !resting(149.9, 450.0));
        // No rest: restarts all the time; a two-minute run never rests.
        assert!(!resting(599.9, 0.0));
        assert!((0..120).all(|s| !resting(f64::from(s), 300.0)));
    }

    #[test]
    fn flat_judges_long_lives_and_drifts_and_every_role() {
        let roles = |worker: Option<(f64, f64)>, incarnations| {
            BTreeMap::from([
                ("client", role(None, 5)),
                ("coordinator", role(Some((0.2, 0.0)), 17)),
                ("worker", role(worker, incarnations)),
            ])
        };
        let clients = [long("client", 0.1, 0.1), long("client", 0.05, 0.1)];
        let with_spared = |rss, error| [&clients[..], &[long("worker", rss, error)]].concat();
        assert!(is_flat(
            &roles(Some((0.3, 0.1)), 30),
            &with_spared(0.2, 0.1)
        ));
        // A spared worker that grows, a drift that grows, descriptors that drift.
        assert!(!is_flat(
            &roles(Some((0.3, 0.1)), 30),
            &with_spared(1.5, 0.1)
        ));
        assert!(!is_flat(
            &roles(Some((1.2, 0.0)), 30),
            &with_spared(0.2, 0.1)
        ));
        assert!(!is_flat(
            &roles(Some((0.3, 0.8)), 30),
            &with_spared(0.2, 0.1)
        ));
        // Counts that fall, however steeply, do not grow.
        assert!(is_flat(
            &roles(Some((-3.0, -2.0)), 30),
            &with_spared(-2.0, 0.1)
        ));
        // Growth below the floor, however certain, and above it within the noise (1.5 MiB
        // with a standard error of 0.5: 99.99% lower bound -1.35) are not leaks.
        assert!(is_flat(
            &roles(Some((0.7, 0.4)), 30),
            &with_spared(0.7, 0.01)
        ));
        assert!(is_flat(
            &roles(Some((0.3, 0.1)), 30),
            &with_spared(1.5, 0.5)
        ));
        // A drift over too few incarnations is not judged.
        assert!(is_flat(&roles(Some((3.0, 2.0)), 9), &with_spared(0.2, 0.1)));
        // Workers judged by the drift alone, or by the spared one alone: enough.
        assert!(is_flat(&roles(Some((0.3, 0.1)), 30), &clients));
        assert!(is_flat(&roles(None, 30), &with_spared(0.2, 0.1)));
        // Workers judged by nothing at all, or by a drift over too few: not flat.
        assert!(!is_flat(&roles(None, 30), &clients));
        let unjudged = verdict(&roles(Some((0.3, 0.1)), 9), &clients);
        assert!(!unjudged.flat_roles["worker"]);
        assert_eq!(
            unjudged.not_flat,
            [NotFlat::Unjudged { role: "worker" }],
            "{unjudged:?}"
        );
    }

    #[test]
    fn the_last_line_names_the_first_judgement_that_fails() {
        let processes = BTreeMap::from([
            ("client", role(Some((0.1, 1.3)), 12)),
            ("worker", role(Some((1.2, 0.0)), 30)),
        ]);
        let judged = verdict(&processes, &[long("client", 1.03, 0.06)]);
        let first = judged.not_flat.first();
        assert_eq!(
            failure_message("--log PATH when rerun", first),
            "the soak failed (see the JSON line; logs in --log PATH when rerun); not flat: \
             client 0's own life (60.0 min): resident set +1.03 ± 0.06 MiB per 10 min, 99.99% \
             lower bound +0.69 (growth from 0.75)"
        );
        // Then the client's drift, then the worker's.
        let rest: Vec<String> = judged.not_flat[1..].iter().map(|n| n.to_string()).collect();
        assert_eq!(
            rest,
            [
                "client drift (12 incarnations): descriptors +1.30 ± 0.10 per 10 min, 99.99% \
                 lower bound +0.73 (growth from 0.50)",
                "worker drift (30 incarnations): resident set +1.20 ± 0.10 MiB per 10 min, \
                 99.99% lower bound +0.77 (growth from 0.75)",
            ]
        );
        // A run that failed on anything else says so without naming a slope.
        assert_eq!(
            failure_message("soak.log", None),
            "the soak failed (see the JSON line; logs in soak.log)"
        );
        let json = serde_json::to_value(&judged.not_flat[0]).unwrap();
        assert_eq!(json["why"], "grows");
        assert_eq!(json["fit"]["long_life"]["slot"], 0);
        assert_eq!(json["measure"], "resident_set");
    }
}
