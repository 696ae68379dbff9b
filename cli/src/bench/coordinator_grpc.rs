//! `stoker bench coordinator-grpc`: the whole assignment path, a real coordinator process
//! driven over gRPC on loopback by simulated workers and clients in this process.
//!
//! Each simulated worker has its own connection and loops on `Lease` (long poll), then
//! `Report`s its tasks complete and hands each step to the simulated client of its session,
//! as the batch would reach it; each client has its own connection and answers what arrived
//! with one `UpdateSession` (the steps acknowledged, a credit back for each). So every
//! assignment pays for the four calls' share of the real service: HTTP/2, protobuf, the
//! service's lock and the core. A data server in this process answers the coordinator's
//! `DescribeJob` when the jobs register.
//!
//! Reported: assignments per second (acknowledged steps in the measured window), the
//! coordinator process's CPU time over that window (from `/proc/PID/stat`) and assignments
//! per second of it, and the latency of the lease calls that returned tasks (p50, p99). On a
//! small machine the simulators take cores from the coordinator: the per-core figure is the
//! one that carries over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::worker_data_server::WorkerDataServer;
use stoker_proto::v1::{
    DatasetSource, DescribeJobResponse, JobSpec, LeaseRequest, OpenSessionRequest,
    RegisterJobRequest, RegisterWorkerRequest, ReportRequest, SessionToken, SessionUpdateRequest,
};
use stoker_rpc::describe_only::DescribeOnly;
use stoker_rpc::security::ClientSecurity;
use stoker_rpc::transport::{self, RpcChannel};
use tokio::sync::mpsc;

use super::soak::fleet::{start_daemon, Recipe};
use super::{Error, Result};

/// Settings of `stoker bench coordinator-grpc`.
#[derive(Debug, Clone, Args)]
pub struct CoordinatorGrpcBench {
    /// Simulated workers, each with its own connection.
    #[arg(long, default_value_t = 64)]
    pub workers: u32,
    /// Simulated ranks (one session and one connection each).
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
    /// Seconds measured, after one second of warm-up.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Print one JSON object as the last line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct GrpcReport {
    workers: u32,
    ranks: u32,
    jobs: u32,
    seconds: f64,
    assignments: u64,
    assignments_per_s: f64,
    /// CPU seconds the coordinator process used in the window.
    coordinator_cpu_s: f64,
    /// Assignments per CPU-second of the coordinator process.
    assignments_per_coordinator_core_s: f64,
    /// Cores of this machine (the coordinator and the simulators share them).
    machine_cores: usize,
    lease_calls: u64,
    lease_p50_us: f64,
    lease_p99_us: f64,
}

/// Steps per epoch the data server describes: more than any run uses.
const STEPS: u64 = 1 << 40;

/// CPU seconds (user + system) process `pid` has used, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| Error::Failed(format!("unreadable /proc/{pid}/stat")))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
        return Err(Error::Failed(format!("unreadable /proc/{pid}/stat")));
    };
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((user + system) as f64 / per_second)
}

/// The value at fraction `q` of `sorted`.
fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[at.min(sorted.len() - 1)])
}

/// What the simulators share.
struct Shared {
    stop: AtomicBool,
    measuring: AtomicBool,
    acknowledged: AtomicU64,
    lease_calls: AtomicU64,
    latencies_us: Mutex<Vec<u32>>,
    /// Each session's client, by session id.
    clients: HashMap<u64, mpsc::UnboundedSender<u64>>,
}

/// One simulated worker: lease, report, hand the steps to their clients.
async fn worker(
    channel: RpcChannel,
    worker_id: u64,
    batch: u32,
    shared: Arc<Shared>,
) -> Result<()> {
    let mut client = CoordinatorClient::new(channel);
    let mut latencies = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let tasks = client
            .lease(LeaseRequest {
                worker_id,
                max_tasks: batch,
                wait_ms: 100,
            })
            .await?
            .into_inner()
            .tasks;
        if tasks.is_empty() {
            continue;
        }
        if shared.measuring.load(Ordering::Relaxed) {
            latencies.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
            shared.lease_calls.fetch_add(1, Ordering::Relaxed);
        }
        client
            .report(ReportRequest {
                worker_id,
                completed: tasks.iter().map(|t| t.lease_id).collect(),
                ..ReportRequest::default()
            })
            .await?;
        for task in tasks {
            let session = task.session.map_or(u64::MAX, |s| s.session_id);
            if let Some(client) = shared.clients.get(&session) {
                let _ = client.send(task.step);
            }
        }
    }
    if let Ok(mut all) = shared.latencies_us.lock() {
        all.extend(latencies);
    }
    Ok(())
}

/// One simulated client: acknowledge what arrived, a credit back for each step.
async fn client(
    channel: RpcChannel,
    session: SessionToken,
    mut arrivals: mpsc::UnboundedReceiver<u64>,
    shared: Arc<Shared>,
) -> Result<()> {
    let mut client = CoordinatorClient::new(channel);
    while let Some(step) = arrivals.recv().await {
        let mut acknowledged = vec![step];
        while let Ok(step) = arrivals.try_recv() {
            acknowledged.push(step);
        }
        let count = acknowledged.len() as u64;
        client
            .update_session(SessionUpdateRequest {
                session: Some(session),
                grant_credits: count,
                acknowledged,
                stats: None,
            })
            .await?;
        if shared.measuring.load(Ordering::Relaxed) {
            shared.acknowledged.fetch_add(count, Ordering::Relaxed);
        }
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
    }
    Ok(())
}

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
    let state = tempfile::tempdir()?;
    let log = std::fs::File::create(state.path().join("coordinator.log"))?;
    let recipe = Recipe {
        program: std::env::current_exe()?,
        args: [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--state",
            &state.path().join("journal").to_string_lossy(),
            "--lease-timeout-ms",
            "30000",
            "--session-timeout-ms",
            "600000",
            "--max-sessions",
            &(u64::from(args.ranks) * 2).to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    };
    let (mut coordinator, address) = start_daemon(&recipe, &log)?;
    let pid = coordinator.id();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let measured = runtime.block_on(drive(args, &address, pid));
    let _ = coordinator.kill();
    let _ = coordinator.wait();
    let report = measured?;
    println!(
        "coordinator over gRPC: {} workers, {} ranks in {} jobs, {} credits each, {} tasks per lease; {} cores on this machine, shared with the simulators",
        report.workers, report.ranks, report.jobs, args.credits, args.lease_batch, report.machine_cores
    );
    println!(
        "{} assignments in {:.1} s: {:.0} assignments/s (lease + report + acknowledge + credit, each over gRPC)",
        report.assignments, report.seconds, report.assignments_per_s
    );
    println!(
        "coordinator process: {:.2} CPU s in the window, {:.0} assignments per core-second",
        report.coordinator_cpu_s, report.assignments_per_coordinator_core_s
    );
    println!(
        "lease calls that returned tasks: {}, latency p50 {:.0} us, p99 {:.0} us",
        report.lease_calls, report.lease_p50_us, report.lease_p99_us
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// Sets the jobs, sessions, workers and clients up, and measures.
async fn drive(args: &CoordinatorGrpcBench, address: &str, pid: u32) -> Result<GrpcReport> {
    let security = ClientSecurity::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let data_address = listener.local_addr()?.to_string();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        transport::server()
            .add_service(WorkerDataServer::new(DescribeOnly(DescribeJobResponse {
                num_samples: STEPS,
                steps_per_epoch: STEPS,
                batch_bytes: 1,
                class_names: Vec::new(),
                dataset_fingerprint: String::new(),
            })))
            .serve_with_incoming(incoming),
    );
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let channel = transport::channel(address, &security)?;
        let registered = CoordinatorClient::new(channel.clone())
            .register_worker(RegisterWorkerRequest {
                data_address: data_address.clone(),
                threads: 1,
                data_roots: Vec::new(),
            })
            .await?
            .into_inner();
        workers.push((channel, registered.worker_id));
    }
    let jobs = args.ranks.div_ceil(args.ranks_per_job);
    let mut sessions = Vec::new();
    for job in 0..jobs {
        let world_size = args
            .ranks_per_job
            .min(args.ranks - job * args.ranks_per_job);
        let spec = JobSpec {
            dataset: Some(DatasetSource {
                uri: format!("/bench/job-{job}"),
                ..DatasetSource::default()
            }),
            batch_size: 256,
            seed: u64::from(job),
            world_size,
            ..JobSpec::default()
        };
        let channel = transport::channel(address, &security)?;
        let registered = CoordinatorClient::new(channel)
            .register_job(RegisterJobRequest {
                spec: Some(spec),
                weight: 0,
            })
            .await?
            .into_inner();
        for rank in 0..world_size {
            let channel = transport::channel(address, &security)?;
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
            sessions.push((channel, token));
        }
    }
    let mut clients = HashMap::new();
    let mut arrivals = Vec::new();
    for (_, token) in &sessions {
        let (sender, receiver) = mpsc::unbounded_channel();
        clients.insert(token.session_id, sender);
        arrivals.push(receiver);
    }
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        measuring: AtomicBool::new(false),
        acknowledged: AtomicU64::new(0),
        lease_calls: AtomicU64::new(0),
        latencies_us: Mutex::new(Vec::new()),
        clients,
    });
    let mut tasks = Vec::new();
    for ((channel, token), arrivals) in sessions.into_iter().zip(arrivals) {
        CoordinatorClient::new(channel.clone())
            .update_session(SessionUpdateRequest {
                session: Some(token),
                grant_credits: args.credits,
                acknowledged: Vec::new(),
                stats: None,
            })
            .await?;
        tasks.push(tokio::spawn(client(
            channel,
            token,
            arrivals,
            Arc::clone(&shared),
        )));
    }
    let mut worker_tasks = Vec::new();
    for (channel, id) in workers {
        worker_tasks.push(tokio::spawn(worker(
            channel,
            id,
            args.lease_batch,
            Arc::clone(&shared),
        )));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu_before = cpu_seconds(pid)?;
    shared.measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    shared.measuring.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)? - cpu_before;
    shared.stop.store(true, Ordering::Relaxed);
    for task in worker_tasks {
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Err(error))) => return Err(error),
            Ok(Err(panic)) => return Err(Error::Failed(format!("a simulated worker: {panic}"))),
            _ => {}
        }
    }
    for task in tasks {
        task.abort();
    }
    let assignments = shared.acknowledged.load(Ordering::Relaxed);
    let mut latencies = shared
        .latencies_us
        .lock()
        .map(|mut all| std::mem::take(&mut *all))
        .unwrap_or_default();
    latencies.sort_unstable();
    Ok(GrpcReport {
        workers: args.workers,
        ranks: args.ranks,
        jobs,
        seconds,
        assignments,
        assignments_per_s: assignments as f64 / seconds,
        coordinator_cpu_s: cpu,
        assignments_per_coordinator_core_s: if cpu > 0.0 {
            assignments as f64 / cpu
        } else {
            0.0
        },
        machine_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        lease_calls: shared.lease_calls.load(Ordering::Relaxed),
        lease_p50_us: quantile(&latencies, 0.50),
        lease_p99_us: quantile(&latencies, 0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_sorted_latencies() {
        let sorted: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&sorted, 0.5), 51.0);
        assert_eq!(quantile(&sorted, 0.99), 99.0);
        assert_eq!(quantile(&[], 0.99), 0.0);
    }

    #[test]
    fn this_process_has_cpu_time() {
        let spent = cpu_seconds(std::process::id()).expect("readable");
        assert!(spent >= 0.0);
    }
}
