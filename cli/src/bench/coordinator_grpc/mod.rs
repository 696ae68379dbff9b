//! `stoker bench coordinator-grpc`: the whole assignment path, a real coordinator process
//! driven over gRPC on loopback by simulated workers and clients in this process (`sim.rs`).
//!
//! Each simulated worker loops on `Lease` (long poll), hands each step to the simulated client
//! of its session, as the batch would reach it, and reports its tasks complete; each client
//! acknowledges what arrived, a credit back for each. So every assignment pays for its share
//! of the real service's calls: HTTP/2, protobuf, the service's lock and the core. Both ways
//! the control plane can talk ([`Control`]) run by default, each against a coordinator of its
//! own, one after the other in the same run: the way before the update stream beside the way
//! now. A data server in this process answers the coordinator's `DescribeJob` when the jobs
//! register. With `--shards N` each way runs against N coordinator processes (`--shard I/N`):
//! each job registers at the one its spec hashes to, and every simulated worker leases from
//! all of them, as a worker given the fleet's list does.
//!
//! Reported per way: assignments per second (acknowledged steps in the measured window), the
//! coordinator processes' CPU time over that window (from `/proc/PID/stat`; summed over the
//! shards, and each shard's) and assignments per second of it, the latency of the lease calls
//! that returned tasks (p50, p99) from the call and from when their work was there (the call,
//! or the grant of its earliest task's credit if later), the time from a credit's grant to its
//! step's arrival (p50, p99), and the bytes on the loopback interface per assignment (both
//! directions, TCP/IP headers included; all of the machine's loopback traffic in the window,
//! from `/proc/net/dev`). On a small machine the simulators take cores from the coordinator
//! (unless `--coordinator-cores` keeps them apart, `cores.rs`): the per-core figure is the one
//! that carries over. Many simulated ranks share a connection when `--connections` says so
//! (the harness then fits a 16,384-rank job on a small machine; the coordinator still sees a
//! session, and its updates, per rank).

mod cores;
mod figures;
mod sim;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::worker_data_server::WorkerDataServer;
use stoker_proto::v1::{
    DatasetSource, DescribeJobResponse, JobSpec, OpenSessionRequest, RegisterJobRequest,
    RegisterWorkerRequest, SessionToken, SessionUpdateRequest,
};
use stoker_rpc::describe_only::DescribeOnly;
use stoker_rpc::security::ClientSecurity;
use stoker_rpc::transport::{self, RpcChannel};
use tokio::sync::mpsc;

use super::soak::fleet::{start_daemon, Recipe};
use super::{Error, Result};
use figures::{cpu_seconds, loopback_bytes, quantile};
pub use sim::Control;
use sim::Shared;

/// Settings of `stoker bench coordinator-grpc`.
#[derive(Debug, Clone, Args)]
pub struct CoordinatorGrpcBench {
    /// Simulated workers.
    #[arg(long, default_value_t = 64)]
    pub workers: u32,
    /// Simulated ranks (one session each).
    #[arg(long, default_value_t = 512)]
    pub ranks: u32,
    /// Ranks per job: the ranks are split into jobs of this world size.
    #[arg(long, default_value_t = 8)]
    pub ranks_per_job: u32,
    /// Credits each client keeps granted.
    #[arg(long, default_value_t = 4)]
    pub credits: u64,
    /// Tasks a worker asks for per lease call.
    #[arg(long, default_value_t = 8)]
    pub lease_batch: u32,
    /// Connections the simulated ranks share, and the simulated workers share as many (0: one
    /// per rank and one per worker).
    #[arg(long, default_value_t = 0)]
    pub connections: u32,
    /// The way measured (default: both, the way before first).
    #[arg(long, value_enum)]
    pub control: Option<Control>,
    /// Longest milliseconds wanted credits are held, the way after (the loader's
    /// `ack_interval`; its default).
    #[arg(long, default_value_t = 50.0)]
    pub interval_ms: f64,
    /// Batches a second each simulated rank's training takes (0: each as it arrives, so the
    /// ranks go as fast as the coordinator lets them). A vision job's GPU takes about 40.
    #[arg(long, default_value_t = 0.0)]
    pub rank_rate: f64,
    /// Coordinator processes the jobs are sharded over (each `--shard I/N`).
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
    /// The coordinator processes on cores of their own: the first N this process may use,
    /// the simulators on the others (0: they share every core).
    #[arg(long, default_value_t = 0)]
    pub coordinator_cores: usize,
    /// Seconds measured per way, after one second of warm-up.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Print one JSON object as the last line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct GrpcReport {
    control: Control,
    workers: u32,
    ranks: u32,
    jobs: u32,
    connections: u32,
    shards: u32,
    seconds: f64,
    assignments: u64,
    assignments_per_s: f64,
    /// CPU seconds the coordinator processes used in the window, summed.
    coordinator_cpu_s: f64,
    /// Each shard's CPU seconds in the window.
    shard_cpu_s: Vec<f64>,
    /// Each shard's jobs.
    shard_jobs: Vec<u32>,
    /// Assignments per CPU-second of the coordinator process.
    assignments_per_coordinator_core_s: f64,
    /// The machine's cores, and the coordinators' and the simulators' when they are apart.
    #[serde(flatten)]
    placement: cores::Placement,
    lease_calls: u64,
    lease_p50_us: f64,
    lease_p99_us: f64,
    /// Lease calls that returned tasks, from when their work was there (the later of the call
    /// and the grant of its earliest task's credit) to the answer: p50, p99.
    ready_p50_us: f64,
    ready_p99_us: f64,
    /// From a credit's grant (the update carrying it sent) to its batch's arrival: p50, p99.
    served_p50_us: f64,
    served_p99_us: f64,
    /// Bytes on the loopback interface per assignment (both directions).
    loopback_bytes_per_assignment: f64,
}

/// Steps per epoch the data server describes: more than any run uses.
const STEPS: u64 = 1 << 40;

/// Runs the benchmark and prints the report.
pub fn run(args: &CoordinatorGrpcBench) -> Result<()> {
    if args.workers == 0 || args.ranks == 0 || args.credits == 0 || args.lease_batch == 0 {
        return Err(Error::InvalidArgument(
            "--workers, --ranks, --credits and --lease-batch must be at least 1".into(),
        ));
    }
    if !(1..=args.ranks).contains(&args.ranks_per_job) {
        return Err(Error::InvalidArgument(
            "--ranks-per-job must be 1..=--ranks".into(),
        ));
    }
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        return Err(Error::InvalidArgument(
            "--seconds must be in (0, 3600]".into(),
        ));
    }
    if !(args.rank_rate >= 0.0 && args.rank_rate <= 1e6) {
        return Err(Error::InvalidArgument(
            "--rank-rate must be in [0, 1000000]".into(),
        ));
    }
    if !(1..=64).contains(&args.shards) {
        return Err(Error::InvalidArgument("--shards must be 1..=64".into()));
    }
    if !(args.interval_ms >= 0.0 && args.interval_ms <= 1000.0) {
        return Err(Error::InvalidArgument(
            "--interval-ms must be in [0, 1000]".into(),
        ));
    }
    let ways = match args.control {
        Some(control) => vec![control],
        None => vec![Control::Before, Control::After],
    };
    // Before the runtime: its threads take this thread's cores.
    let placement = cores::Placement::take(args.coordinator_cores)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut reports = Vec::new();
    for control in ways {
        let report = measure(args, control, &runtime, &placement)?;
        print_report(args, &report);
        reports.push(report);
    }
    if let [before, after] = reports.as_slice() {
        println!(
            "after / before: {:.2}x assignments per coordinator core-second, {:.4}x loopback bytes per assignment",
            after.assignments_per_coordinator_core_s / before.assignments_per_coordinator_core_s.max(1e-9),
            after.loopback_bytes_per_assignment / before.loopback_bytes_per_assignment.max(1e-9)
        );
    }
    if args.json {
        println!("{}", serde_json::to_string(&reports)?);
    }
    Ok(())
}

fn print_report(args: &CoordinatorGrpcBench, report: &GrpcReport) {
    println!(
        "[{:?}] coordinator over gRPC: {} workers, {} ranks in {} jobs over {} connections, {} credits each, {} tasks per lease; {}",
        report.control, report.workers, report.ranks, report.jobs, report.connections, args.credits, args.lease_batch, report.placement.describe()
    );
    if report.shards > 1 {
        let cpu: Vec<String> = report
            .shard_cpu_s
            .iter()
            .zip(&report.shard_jobs)
            .map(|(cpu, jobs)| format!("{cpu:.2} CPU s for {jobs} jobs"))
            .collect();
        println!("  {} shards: {}", report.shards, cpu.join(", "));
    }
    println!(
        "  {} assignments in {:.1} s: {:.0} assignments/s (lease + report + acknowledge + credit, each over gRPC)",
        report.assignments, report.seconds, report.assignments_per_s
    );
    println!(
        "  coordinator processes: {:.2} CPU s in the window, {:.0} assignments per core-second",
        report.coordinator_cpu_s, report.assignments_per_coordinator_core_s
    );
    println!(
        "  lease calls that returned tasks: {}, latency p50 {:.0} us, p99 {:.0} us (with the long poll's wait for work); {:.0} loopback bytes per assignment",
        report.lease_calls, report.lease_p50_us, report.lease_p99_us, report.loopback_bytes_per_assignment
    );
    println!(
        "  the same lease calls from when their work was there (the call, or its earliest task's credit granted if later): p50 {:.0} us, p99 {:.0} us",
        report.ready_p50_us, report.ready_p99_us
    );
    println!(
        "  a credit granted to its batch's arrival (update, lease, hand-over): p50 {:.0} us, p99 {:.0} us",
        report.served_p50_us, report.served_p99_us
    );
}

/// One way measured, against coordinator processes of its own (one per shard).
fn measure(
    args: &CoordinatorGrpcBench,
    control: Control,
    runtime: &tokio::runtime::Runtime,
    placement: &cores::Placement,
) -> Result<GrpcReport> {
    let state = tempfile::tempdir()?;
    let mut coordinators = Vec::new();
    let mut addresses = Vec::new();
    for shard in 0..args.shards {
        let log = std::fs::File::create(state.path().join(format!("coordinator-{shard}.log")))?;
        let (child, address) = start_daemon(&coordinator_recipe(args, state.path(), shard)?, &log)?;
        coordinators.push(child);
        addresses.push(address);
    }
    let pids: Vec<u32> = coordinators.iter().map(std::process::Child::id).collect();
    let placed = pids
        .iter()
        .try_for_each(|&pid| placement.place_coordinator(pid));
    let measured =
        placed.and_then(|()| runtime.block_on(drive(args, control, &addresses, &pids, placement)));
    for mut coordinator in coordinators {
        let _ = coordinator.kill();
        let _ = coordinator.wait();
    }
    measured
}

/// How shard `shard` of `args.shards` starts, journaling under `state`.
fn coordinator_recipe(
    args: &CoordinatorGrpcBench,
    state: &std::path::Path,
    shard: u32,
) -> Result<Recipe> {
    let mut recipe = Recipe {
        program: std::env::current_exe()?,
        args: [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--state",
            &state.join(format!("journal-{shard}")).to_string_lossy(),
            // Long: the simulated workers send no heartbeats, and a 16,384-rank setup takes a
            // while.
            "--lease-timeout-ms",
            "3600000",
            "--session-timeout-ms",
            "600000",
            "--max-sessions",
            &(u64::from(args.ranks) * 2).to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    };
    if args.shards > 1 {
        recipe.args.push("--shard".into());
        recipe.args.push(format!("{shard}/{}", args.shards));
    }
    Ok(recipe)
}

/// `count` channels to `address`: one per user when `connections` is 0, else `connections`
/// (at most `count`) handed out in turn.
fn channels(
    address: &str,
    security: &ClientSecurity,
    count: u32,
    connections: u32,
) -> Result<Vec<RpcChannel>> {
    let distinct = if connections == 0 {
        count
    } else {
        connections.min(count)
    };
    let opened = (0..distinct)
        .map(|_| transport::channel(address, security))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((0..count as usize)
        .map(|i| opened[i % opened.len()].clone())
        .collect())
}

/// The spec of simulated job `job` of `world_size` ranks.
fn job_spec(job: u32, world_size: u32) -> JobSpec {
    JobSpec {
        dataset: Some(DatasetSource {
            uri: format!("/bench/job-{job}"),
            ..DatasetSource::default()
        }),
        batch_size: 256,
        seed: u64::from(job),
        world_size,
        ..JobSpec::default()
    }
}

/// Registers the job of `spec` and opens a session per rank, each on its channel.
async fn open_job(
    spec: JobSpec,
    channels: Vec<RpcChannel>,
) -> Result<Vec<(RpcChannel, SessionToken, u64)>> {
    let world_size = spec.world_size;
    let Some(first) = channels.first() else {
        return Ok(Vec::new());
    };
    let registered = CoordinatorClient::new(first.clone())
        .register_job(RegisterJobRequest {
            spec: Some(spec),
            weight: 0,
        })
        .await?
        .into_inner();
    let mut sessions = Vec::new();
    for (rank, channel) in (0..world_size).zip(channels) {
        let opened = CoordinatorClient::new(channel.clone())
            .open_session(OpenSessionRequest {
                job_id: registered.job_id,
                rank,
                epoch: 0,
                start_step: 0,
                resume_from_journal: false,
            })
            .await?
            .into_inner();
        let token = opened
            .session
            .ok_or_else(|| Error::Failed("a session opened without a token".into()))?;
        sessions.push((channel, token, opened.workers_version));
    }
    Ok(sessions)
}

/// Sets the jobs, sessions, workers and clients up against the coordinators at `addresses`
/// (one per shard, processes `pids`), and measures.
async fn drive(
    args: &CoordinatorGrpcBench,
    control: Control,
    addresses: &[String],
    pids: &[u32],
    placement: &cores::Placement,
) -> Result<GrpcReport> {
    let security = ClientSecurity::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let data_address = listener.local_addr()?.to_string();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let data_server = tokio::spawn(
        transport::server()
            .add_service(WorkerDataServer::new(DescribeOnly(DescribeJobResponse {
                num_samples: STEPS,
                steps_per_epoch: STEPS,
                batch_bytes: 1,
                class_names: Vec::new(),
                dataset_fingerprint: String::new(),
                tokenizer_digests: String::new(),
            })))
            .serve_with_incoming(incoming),
    );
    // Every simulated worker registers with every shard, as a worker given the list does.
    // Each at an address of its own (a coordinator takes a second registration at one address
    // as the process there restarted): the first at the describing server, which the
    // coordinator asks first, the others at names no one dials.
    let mut workers = Vec::new();
    for address in addresses {
        let shard_channels = channels(address, &security, args.workers, args.connections)?;
        for (index, channel) in shard_channels.into_iter().enumerate() {
            let data_address = match index {
                0 => data_address.clone(),
                _ => format!("simulated-worker-{index}.invalid:7001"),
            };
            let registered = CoordinatorClient::new(channel.clone())
                .register_worker(RegisterWorkerRequest {
                    data_address,
                    threads: 1,
                    data_roots: Vec::new(),
                    instance: 0,
                })
                .await?
                .into_inner();
            workers.push((channel, registered.worker_id));
        }
    }
    let jobs = args.ranks.div_ceil(args.ranks_per_job);
    let rank_channels = addresses
        .iter()
        .map(|address| channels(address, &security, args.ranks, args.connections))
        .collect::<Result<Vec<_>>>()?;
    // The jobs registered and their sessions opened side by side (a 16,384-rank setup one
    // call at a time takes minutes), each at the shard its spec hashes to.
    let mut shard_jobs = vec![0u32; addresses.len()];
    let mut setup = tokio::task::JoinSet::new();
    for job in 0..jobs {
        let first = job * args.ranks_per_job;
        let world_size = args.ranks_per_job.min(args.ranks - first);
        let spec = job_spec(job, world_size);
        let shard = stoker_rpc::shards::job_shard(&spec, addresses.len());
        shard_jobs[shard] += 1;
        let channels = rank_channels[shard][first as usize..(first + world_size) as usize].to_vec();
        setup.spawn(open_job(spec, channels));
    }
    let mut sessions = Vec::new();
    while let Some(opened) = setup.join_next().await {
        let opened = opened.map_err(|e| Error::Failed(format!("a job's setup: {e}")))?;
        sessions.extend(opened?);
    }
    let mut clients = HashMap::new();
    let mut arrivals = Vec::new();
    for (_, token, _) in &sessions {
        let (sender, receiver) = mpsc::unbounded_channel();
        clients.insert((token.incarnation, token.session_id), sender);
        arrivals.push(receiver);
    }
    let grants = sim::Grants::new(clients.keys().copied());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        measuring: AtomicBool::new(false),
        acknowledged: AtomicU64::new(0),
        lease_calls: AtomicU64::new(0),
        latencies_us: Mutex::new(Vec::new()),
        clients,
        control,
        interval: Duration::from_secs_f64(args.interval_ms / 1000.0),
        rank_rate: args.rank_rate,
        stopped,
        served_us: Mutex::new(Vec::new()),
        grants,
        ready_us: Mutex::new(Vec::new()),
    });
    let mut tasks = Vec::new();
    for ((channel, token, workers_version), arrivals) in sessions.into_iter().zip(arrivals) {
        CoordinatorClient::new(channel.clone())
            .update_session(SessionUpdateRequest {
                session: Some(token),
                grant_credits: args.credits,
                workers_version,
                ..SessionUpdateRequest::default()
            })
            .await?;
        let key = (token.incarnation, token.session_id);
        shared.grants.granted(key, args.credits, Instant::now());
        tasks.push(tokio::spawn(sim::client(
            channel,
            (token, workers_version),
            args.credits,
            arrivals,
            Arc::clone(&shared),
        )));
    }
    let mut worker_tasks = Vec::new();
    for (channel, id) in workers {
        worker_tasks.push(tokio::spawn(sim::worker(
            channel,
            id,
            args.lease_batch,
            Arc::clone(&shared),
        )));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu_before = pids
        .iter()
        .map(|&pid| cpu_seconds(pid))
        .collect::<Result<Vec<_>>>()?;
    let bytes_before = loopback_bytes()?;
    shared.measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    shared.measuring.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let shard_cpu_s = pids
        .iter()
        .zip(&cpu_before)
        .map(|(&pid, before)| Ok(cpu_seconds(pid)? - before))
        .collect::<Result<Vec<_>>>()?;
    let cpu: f64 = shard_cpu_s.iter().sum();
    let bytes = loopback_bytes()?.saturating_sub(bytes_before);
    shared.stop.store(true, Ordering::Relaxed);
    let _ = stop.send(true);
    for task in worker_tasks {
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Err(error))) => return Err(error),
            Ok(Err(panic)) => return Err(Error::Failed(format!("a simulated worker: {panic}"))),
            _ => {}
        }
    }
    for task in tasks {
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Err(error))) => return Err(error),
            Ok(Err(panic)) => return Err(Error::Failed(format!("a simulated client: {panic}"))),
            _ => {}
        }
    }
    data_server.abort();
    // What the simulators gathered, sorted for the quantiles.
    let sorted = |gathered: &Mutex<Vec<u32>>| {
        let mut all = gathered
            .lock()
            .map(|mut all| std::mem::take(&mut *all))
            .unwrap_or_default();
        all.sort_unstable();
        all
    };
    let (served, latencies) = (sorted(&shared.served_us), sorted(&shared.latencies_us));
    let ready = sorted(&shared.ready_us);
    let assignments = shared.acknowledged.load(Ordering::Relaxed);
    let per_assignment = |total: f64| {
        if assignments > 0 {
            total / assignments as f64
        } else {
            0.0
        }
    };
    Ok(GrpcReport {
        control,
        workers: args.workers,
        ranks: args.ranks,
        jobs,
        // Workers connect to every shard; with shared connections, so do the ranks' (a
        // shard's channels are spread over the ranks of its jobs).
        connections: if args.connections == 0 {
            args.ranks + args.workers * args.shards
        } else {
            (args.connections.min(args.ranks) + args.connections.min(args.workers)) * args.shards
        },
        shards: args.shards,
        seconds,
        assignments,
        assignments_per_s: assignments as f64 / seconds,
        coordinator_cpu_s: cpu,
        shard_cpu_s,
        shard_jobs,
        assignments_per_coordinator_core_s: if cpu > 0.0 {
            assignments as f64 / cpu
        } else {
            0.0
        },
        placement: placement.clone(),
        lease_calls: shared.lease_calls.load(Ordering::Relaxed),
        lease_p50_us: quantile(&latencies, 0.50),
        lease_p99_us: quantile(&latencies, 0.99),
        ready_p50_us: quantile(&ready, 0.50),
        ready_p99_us: quantile(&ready, 0.99),
        served_p50_us: quantile(&served, 0.50),
        served_p99_us: quantile(&served, 0.99),
        loopback_bytes_per_assignment: per_assignment(bytes as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_connections_are_handed_out_in_turn() {
        // A channel connects lazily, on the runtime it is made in.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _entered = runtime.enter();
        let security = ClientSecurity::default();
        assert_eq!(
            channels("127.0.0.1:9", &security, 5, 2)
                .expect("lazy")
                .len(),
            5
        );
        assert_eq!(
            channels("127.0.0.1:9", &security, 3, 0)
                .expect("lazy")
                .len(),
            3
        );
    }

    #[test]
    fn this_process_has_cpu_time() {
        let spent = cpu_seconds(std::process::id()).expect("readable");
        assert!(spent >= 0.0);
    }
}
