//! `stoker-worker`: a decode worker daemon of the distributed mode. It registers with the
//! coordinator, pulls tasks, builds batches with the same code as the embedded loader and
//! streams them to the clients that own them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use stoker_rpc::health::{serve_health, Health};
use stoker_rpc::network::Network;
use stoker_rpc::security::SecurityArgs;
use stoker_rpc::{daemon_runtime, init_logging, listen, second_signal, shutdown_signal};
use stoker_worker_daemon::{run_worker, WorkerConfig, DELIVERY_TIMEOUT, DRAIN_TIMEOUT, JOB_IDLE};

// Rust's allocations go to jemalloc: see the `stoker-alloc` crate.
use stoker_alloc as _;

/// A Stoker decode worker.
#[derive(Debug, Parser)]
#[command(
    name = "stoker-worker",
    version,
    about = "Stoker's decode worker daemon: registers with a coordinator, builds the batches it is \
             leased and streams them to the clients that own them.",
    long_about = None
)]
struct Args {
    /// The coordinator's host:port, or a fleet's coordinators as a comma-separated list
    /// (`a:7070,b:7070,c:7070`, in the order given to the clients and to each coordinator's
    /// `--shard`): the worker registers with every one and serves them all.
    #[arg(long)]
    coordinator: String,
    /// Address of this worker's data server (port 0: any free port; the chosen address is
    /// printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address clients reach the data server at, HOST:PORT, when it differs from --listen (for
    /// example when listening on 0.0.0.0). HOST may be a DNS name: with TLS, clients check the
    /// worker's certificate against it. One worker's own: the coordinator takes a worker
    /// registering at a listed address as the one there restarted, and drops that one.
    #[arg(long)]
    advertise: Option<String>,
    /// Decode threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Folders datasets may be read from (repeatable; default: the working directory). Jobs
    /// naming anything else are refused.
    #[arg(long = "data-root")]
    data_roots: Vec<PathBuf>,
    /// Tasks leased ahead of the one being built; twice this many batches may be built at
    /// once, split between the coordinators of a fleet by the sessions waiting at each (each
    /// share rounded up, at least one). A batch is built once its client's stream has room for
    /// it: a task whose stream is full or not open yet waits for room aside, unbuilt, so a
    /// client reading slowly holds up no other job; once twice this many of one session's tasks
    /// wait so, the worker's lease calls ask for none of that session's (they go to other
    /// workers, or wait at the coordinator). Each client's stream queues up to 8 built
    /// batches, within the credits that client granted, so a worker may hold that many more
    /// batches per client.
    /// At most 4096, the most a coordinator leases in one call (it refused more, and the
    /// worker registered again and again, serving nothing).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=4096))]
    lease_ahead: u32,
    /// Least milliseconds between two reports of finished tasks to the coordinator: what
    /// finishes meanwhile goes in one report, or with the next lease call when that comes
    /// first.
    #[arg(long, default_value_t = 5)]
    report_interval_ms: u64,
    #[command(flatten)]
    security: SecurityArgs,
    /// How long a task waits for its client's stream to open, or for room in it while the
    /// stream sends nothing (its batch is built once there is room), before it goes back to the
    /// queue; a stream that holds a batch and sent nothing for that long is ended.
    #[arg(long, default_value_t = DELIVERY_TIMEOUT.as_millis() as u64)]
    delivery_timeout_ms: u64,
    /// On SIGTERM or Ctrl-C: how long the worker may take to finish and deliver the batches it
    /// leased, leave the coordinator and end its clients' streams before it exits (it stops
    /// taking leases at once). Give the process more than this to stop (Kubernetes:
    /// terminationGracePeriodSeconds).
    #[arg(long, default_value_t = DRAIN_TIMEOUT.as_millis() as u64)]
    drain_timeout_ms: u64,
    /// A job no task of this worker has used for this many seconds is let go (its datasets
    /// closed, their indexes in memory freed); a later task of it opens it again, refused if
    /// its datasets' sample counts changed meanwhile. 0: never.
    #[arg(long, default_value_t = JOB_IDLE.as_secs())]
    job_idle_s: u64,
    /// Serve the probes on this address: plain HTTP, no token: `GET /livez` (200 while the
    /// daemon runs) and `GET /readyz` (200 while registered with the coordinator and not
    /// draining, else 503 and the reason).
    #[arg(long, value_name = "HOST:PORT")]
    health: Option<SocketAddr>,
    /// Log more (-v: info, -vv: debug). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn run(args: Args) -> anyhow::Result<()> {
    let data_roots = if args.data_roots.is_empty() {
        vec![std::env::current_dir().context("no --data-root and no working directory")?]
    } else {
        args.data_roots
    };
    // Images a dataset refers to by path (not embedded) are read under the roots only.
    stoker_datasets::allow_referenced_files_under(stoker_worker_daemon::canonical_roots(
        &data_roots,
    )?);
    let (server_security, client_security) = args.security.load()?;
    let runtime = daemon_runtime()?;
    let ran = runtime.block_on(async move {
        let health = Health::starting("not registered with the coordinator");
        let probes = match args.health {
            Some(address) => Some(listen(address).await?),
            None => None,
        };
        let listener = listen(args.listen).await?;
        let local = listener.local_addr()?;
        let advertise = match args.advertise {
            Some(address) => address,
            None if local.ip().is_unspecified() => {
                anyhow::bail!("--listen {local} is a wildcard address: give --advertise HOST:PORT")
            }
            None => local.to_string(),
        };
        server_security.warn_if_open("worker", local);
        // One line (scripts and tests read it): the data address, then the probes' if any.
        let probes = match probes {
            Some(listener) => {
                let url = format!("http://{}", listener.local_addr()?);
                println!("stoker-worker listening on {advertise} health {url}");
                Some(tokio::spawn(serve_health(listener, health.clone())))
            }
            None => {
                println!("stoker-worker listening on {advertise}");
                None
            }
        };
        let config = WorkerConfig {
            coordinator: args.coordinator,
            advertise,
            threads: args.threads,
            data_roots,
            lease_ahead: args.lease_ahead,
            report_interval: Duration::from_millis(args.report_interval_ms),
            server_security,
            client_security,
            network: Network::Sockets,
            delivery_timeout: Duration::from_millis(args.delivery_timeout_ms.max(10)),
            drain_timeout: Duration::from_millis(args.drain_timeout_ms),
            health,
            job_idle: Duration::from_secs(args.job_idle_s),
        };
        // A second Ctrl-C or SIGTERM while the worker drains: it exits at once.
        tokio::spawn(async {
            second_signal().await;
            eprintln!("stoker-worker: a second stop signal; exiting without finishing the drain");
            std::process::exit(1);
        });
        run_worker(config, listener, shutdown_signal()).await?;
        if let Some(probes) = probes {
            probes.abort();
        }
        Ok(())
    });
    // Work still running off the async threads (a job being opened from a store that does not
    // answer, a batch being built) does not keep the drained worker from exiting: dropping the
    // runtime would wait for it however long it takes.
    runtime.shutdown_timeout(Duration::from_secs(1));
    ran
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.verbose);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
