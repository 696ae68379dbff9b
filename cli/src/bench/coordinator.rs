//! `stoker bench coordinator`: the coordinator core driven in process by many simulated workers
//! and ranks, on one thread. Workers lease batches of tasks, report them complete, and the
//! clients acknowledge each step and grant the credit back, so every assignment pays for its
//! whole life cycle (lease, completion, acknowledgement, credit, journal). Only coordinator
//! calls run in the timed loop; the clock is simulated (1 ms per round of all workers).
//!
//! Then every rank turns to the next epoch, three times (its session closed, the next epoch's
//! opened, which drops the positions of the epochs two behind): the time one turn of all ranks
//! takes, what the coordinator pays at each epoch boundary.
//!
//! Memory is given twice: the coordinator's own estimate from its data structures' capacities,
//! and the change of this process's resident set (from `/proc/self/statm`) across setup and run.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use stoker_proto::v1::JobSpec;

use super::{Error, Result};
use stoker_coordinator::{CoordinatorConfig, Durable, Lease, LeaseOutcome, Step};

/// Settings of `stoker bench coordinator`.
#[derive(Debug, Clone, Args)]
pub struct CoordinatorBench {
    /// Simulated workers.
    #[arg(long, default_value_t = 2000)]
    pub workers: u64,
    /// Simulated ranks (one session each).
    #[arg(long, default_value_t = 16_384)]
    pub ranks: u32,
    /// Ranks per job: the ranks are split into jobs of this world size.
    #[arg(long, default_value_t = 8)]
    pub ranks_per_job: u32,
    /// Task assignments to run.
    #[arg(long, default_value_t = 2_000_000)]
    pub assignments: u64,
    /// Credits each client keeps granted.
    #[arg(long, default_value_t = 4)]
    pub credits: u64,
    /// Tasks a worker asks for per lease call.
    #[arg(long, default_value_t = 8)]
    pub lease_batch: usize,
    /// Acknowledgements between two journal writes.
    #[arg(long, default_value_t = 16_384)]
    pub journal_every: u64,
    /// Keep no journal (by default it is a redb file in a temporary directory).
    #[arg(long)]
    pub no_journal: bool,
    /// Print one JSON object as the last line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct CoordinatorReport {
    workers: u64,
    ranks: u32,
    jobs: u32,
    journal: bool,
    assignments: u64,
    wall_s: f64,
    assignments_per_s: f64,
    ns_per_assignment: f64,
    lease_only_assignments_per_s: f64,
    journal_commits: u64,
    memory_bytes: u64,
    /// `memory_bytes` over the ranks (each rank is one session).
    memory_bytes_per_rank: f64,
    rss_delta_bytes: u64,
    setup_s: f64,
    /// One turn of every rank to its next epoch (close, open), averaged over the turns.
    epoch_turn_s: f64,
}

/// Epoch turns of every rank timed after the run.
const EPOCH_TURNS: u64 = 3;

/// Resident set of this process now, in bytes (0 where `/proc` is missing).
fn current_rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

/// Runs the assignments and prints the report.
pub fn run(args: &CoordinatorBench) -> Result<()> {
    let invalid = |message: &str| Err(Error::InvalidArgument(message.into()));
    if args.workers == 0 {
        return invalid("--workers must be at least 1");
    }
    if args.ranks == 0 {
        return invalid("--ranks must be at least 1");
    }
    if !(1..=args.ranks).contains(&args.ranks_per_job) {
        return invalid("--ranks-per-job must be 1..=--ranks");
    }
    let rss_start = current_rss_bytes();
    let setup_start = Instant::now();
    let config = CoordinatorConfig {
        lease_timeout: Duration::from_secs(10),
        journal_every: args.journal_every.max(1),
        ..CoordinatorConfig::default()
    };
    let state_dir = tempfile::tempdir()
        .map_err(|e| Error::Failed(format!("creating the journal's temporary directory: {e}")))?;
    let mut coordinator = if args.no_journal {
        Durable::in_memory(config)
    } else {
        Durable::open(state_dir.path(), config)?
    };
    // Sessions must not run out of steps during the run.
    let per_rank = args.assignments / u64::from(args.ranks) + 1;
    let steps_per_epoch = per_rank * 2 + 16;
    let t0 = Instant::now();
    let jobs = args.ranks.div_ceil(args.ranks_per_job);
    let mut sessions = Vec::with_capacity(args.ranks as usize);
    let mut ranks = Vec::with_capacity(args.ranks as usize);
    for j in 0..jobs {
        let world_size = args.ranks_per_job.min(args.ranks - j * args.ranks_per_job);
        let spec = JobSpec {
            batch_size: 256,
            seed: u64::from(j),
            world_size,
            ..JobSpec::default()
        };
        let job = coordinator.register_job(spec, steps_per_epoch)?;
        for rank in 0..world_size {
            let session = coordinator.core.open_session(job, rank, 0, Step(0))?;
            coordinator.core.grant_credits(session, args.credits)?;
            sessions.push(session);
            ranks.push((job, rank));
        }
    }
    let workers: Vec<_> = (0..args.workers)
        .map(|_| coordinator.core.register_worker(t0))
        .collect();
    let setup_s = setup_start.elapsed().as_secs_f64();

    let mut leases: Vec<Lease> = Vec::with_capacity(args.lease_batch);
    let mut assigned = 0u64;
    let mut lease_time = Duration::ZERO;
    let mut round = 0u64;
    let run_start = Instant::now();
    while assigned < args.assignments {
        round += 1;
        let now = t0 + Duration::from_millis(round);
        for &worker in &workers {
            leases.clear();
            let lease_start = Instant::now();
            assigned +=
                coordinator
                    .core
                    .lease_into(worker, args.lease_batch, &[], now, &mut leases)?
                    as u64;
            lease_time += lease_start.elapsed();
            for lease in &leases {
                if coordinator.core.complete(worker, lease.lease_id)? == LeaseOutcome::Applied {
                    coordinator.acknowledge(lease.session, lease.task.step)?;
                    coordinator.core.grant_credits(lease.session, 1)?;
                }
            }
        }
        let expired = coordinator.core.expire(now);
        if !expired.workers.is_empty() {
            return Err(Error::Failed("a simulated worker expired".into()));
        }
    }
    coordinator.flush()?;
    let wall = run_start.elapsed();
    let rss_delta = current_rss_bytes().saturating_sub(rss_start);
    let stats = coordinator.core.stats();
    if stats.duplicates_dropped != 0 || stats.leased_tasks != 0 {
        return Err(Error::Failed(format!("bookkeeping is off: {stats:?}")));
    }
    let turns_start = Instant::now();
    for epoch in 1..=EPOCH_TURNS {
        for (session, &(job, rank)) in sessions.iter_mut().zip(&ranks) {
            coordinator.core.close_session(*session)?;
            *session = coordinator.core.open_session(job, rank, epoch, Step(0))?;
        }
    }
    coordinator.flush()?;
    let epoch_turn_s = turns_start.elapsed().as_secs_f64() / EPOCH_TURNS as f64;

    let wall_s = wall.as_secs_f64();
    let report = CoordinatorReport {
        workers: args.workers,
        ranks: args.ranks,
        jobs,
        journal: !args.no_journal,
        assignments: assigned,
        wall_s,
        assignments_per_s: assigned as f64 / wall_s,
        ns_per_assignment: wall_s * 1e9 / assigned as f64,
        lease_only_assignments_per_s: assigned as f64 / lease_time.as_secs_f64(),
        journal_commits: stats.journal_commits,
        memory_bytes: stats.memory_bytes,
        memory_bytes_per_rank: stats.memory_bytes as f64 / f64::from(args.ranks),
        rss_delta_bytes: rss_delta,
        setup_s,
        epoch_turn_s,
    };
    let journal = if args.no_journal {
        "none".to_string()
    } else {
        format!(
            "redb in a temporary directory, written every {} acks",
            args.journal_every
        )
    };
    println!(
        "coordinator: {} workers, {} ranks in {} jobs of {} ranks, {} credits each; journal: {journal}",
        args.workers, args.ranks, jobs, args.ranks_per_job, args.credits
    );
    println!(
        "{} assignments (lease + complete + ack + credit each) in {:.3} s on one thread: {:.0} assignments/s, {:.0} ns per assignment",
        report.assignments, wall_s, report.assignments_per_s, report.ns_per_assignment
    );
    println!(
        "lease calls alone: {:.0} assignments/s; {} journal commits; setup {:.2} s",
        report.lease_only_assignments_per_s, report.journal_commits, setup_s
    );
    println!(
        "epoch boundary: every rank's session closed and the next epoch's opened in {:.1} ms (mean of {EPOCH_TURNS} turns, journal written)",
        epoch_turn_s * 1e3
    );
    println!(
        "memory: {:.1} MiB estimated from the coordinator's data structures ({:.0} bytes per rank); {:.1} MiB process RSS growth over setup and run",
        report.memory_bytes as f64 / 1048576.0,
        report.memory_bytes_per_rank,
        report.rss_delta_bytes as f64 / 1048576.0
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}
