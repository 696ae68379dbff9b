//! `stoker coordinator`: the coordinator daemon of the distributed mode.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use stoker_coordinator::{CoordinatorService, CoordinatorServiceConfig};
use stoker_loader::{Dashboard, DashboardAccess, DashboardError};
use stoker_rpc::health::{serve_health, Health};
use stoker_rpc::listen;
use stoker_rpc::security::{token_matches, SecurityArgs, ServerSecurity, Token};

/// Arguments of `stoker coordinator`.
#[derive(Debug, Args)]
pub struct CoordinatorArgs {
    /// Address to serve gRPC on (port 0: any free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Folder of the journal (job specs and acknowledged positions); created if missing.
    #[arg(long)]
    pub state: PathBuf,
    /// Serve the stall dashboard (page, `/api/jobs`, `/metrics`) on this address: every
    /// client's stall, throughput and queue, and every worker's load. On a loopback address
    /// without --dashboard-token-file it is open; elsewhere it needs one, and given one it asks
    /// for it on loopback too (open `/?token=CREDENTIAL` once: the browser keeps a cookie for
    /// 12 hours). With --tls-cert it serves HTTPS.
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// A file holding the dashboard's read-only credential (repeatable, for rotation). It opens
    /// the dashboard only, and the RPC token (--token-file) does not open the dashboard: the
    /// two must differ.
    #[arg(long = "dashboard-token-file", value_name = "FILE")]
    pub dashboard_token_files: Vec<PathBuf>,
    /// Serve the dashboard's `/metrics` without the credential (for a Prometheus that cannot
    /// send `Authorization: Bearer`); the page and `/api/jobs` still need it.
    #[arg(long)]
    pub metrics_without_token: bool,
    /// Serve the probes on this address: plain HTTP, no token: `GET /livez` (200 while the
    /// daemon runs) and `GET /readyz` (200 while it serves, 503 `stopping` once told to stop).
    #[arg(long, value_name = "HOST:PORT")]
    pub health: Option<SocketAddr>,
    #[command(flatten)]
    pub security: SecurityArgs,
    /// A worker silent for this long loses its leases, which go back to the queue (at least
    /// 100).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(100..))]
    pub lease_timeout_ms: u64,
    /// A session whose client sent nothing (no credits, acknowledgements or stats) for this
    /// long is closed, and its credits with it (at least 100; there is no "never").
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub session_timeout_ms: u64,
    /// Most sessions open at once (one per client, rank and epoch being read); a new one past
    /// it is refused with RESOURCE_EXHAUSTED until one closes or times out (at least 1).
    #[arg(long, default_value_t = 65_536, value_parser = at_least_one)]
    pub max_sessions: usize,
    /// Largest weight a job may ask for at registration (a client's `job_weight`): jobs whose
    /// clients wait at the same time get leases in proportion to their weights, so this caps
    /// how much of the pool one job can claim against a job of weight 1 (1 to 65536).
    #[arg(long, default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(stoker_coordinator::MAX_JOB_WEIGHT)))]
    pub max_job_weight: u32,
    /// A job none of whose ranks has had a session open for this many seconds is forgotten:
    /// its spec, weight and positions leave memory, the journal and the dashboard, so a
    /// coordinator that serves jobs for months holds only recent ones. A client that comes
    /// back to it later registers it again (under a new id) and reads on from its own
    /// position, or stops with an error when the workers now describe the dataset with another
    /// step count or fingerprint. 0 keeps every job.
    #[arg(long, default_value_t = 86_400)]
    pub job_retention_secs: u64,
    /// Longest a new job's registration waits for a worker to open its datasets (a first
    /// index of many tar shards, or a listing of a large bucket, takes that long once). A
    /// worker that has not answered within an eighth of it (less with more than four workers)
    /// is joined by the next; once it has passed, the registration fails naming the workers
    /// that did not answer (or with a worker's own refusal, when one gave one).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub describe_timeout_secs: u64,
    /// This coordinator's place in a fleet, `I/N` (0-based): the Ith address of the list of N
    /// coordinators that clients (`address="a:7070,b:7070,c:7070"`) and workers
    /// (`--coordinator a:7070,b:7070,c:7070`) are given, in the same order. It registers only
    /// the jobs whose specs hash to it, with a journal of its own.
    #[arg(long, value_name = "I/N", value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
}

/// `I/N` with `I < N`, as `--shard` takes it.
fn parse_shard(text: &str) -> Result<(usize, usize), String> {
    let (index, of) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not I/N"))?;
    let number = |part: &str| {
        part.trim()
            .parse::<usize>()
            .map_err(|_| format!("{text:?} is not I/N"))
    };
    let (index, of) = (number(index)?, number(of)?);
    if of == 0 || index >= of {
        return Err(format!(
            "--shard {text}: I counts from 0 and must be below N"
        ));
    }
    Ok((index, of))
}

/// The dashboard credentials of `files`, refused when one is also an RPC token of `rpc`.
fn dashboard_credentials(files: &[PathBuf], rpc: &ServerSecurity) -> anyhow::Result<Vec<Token>> {
    let credentials = files
        .iter()
        .map(|path| Token::read(path))
        .collect::<Result<Vec<_>, _>>()?;
    if credentials
        .iter()
        .any(|credential| token_matches(rpc.tokens(), credential.expose().as_bytes()))
    {
        return Err(DashboardError::CredentialIsRpcToken.into());
    }
    Ok(credentials)
}

/// A count of at least 1 (`--max-sessions`): 0 would refuse every session.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(count) => Ok(count),
        Err(error) => Err(error.to_string()),
    }
}

/// Runs the daemon until Ctrl-C or SIGTERM.
pub fn run(args: CoordinatorArgs) -> anyhow::Result<()> {
    let mut config = CoordinatorServiceConfig::default();
    config.core.lease_timeout = Duration::from_millis(args.lease_timeout_ms);
    config.session_timeout = Duration::from_millis(args.session_timeout_ms);
    config.core.max_sessions = args.max_sessions;
    config.core.max_job_weight = args.max_job_weight;
    config.core.job_retention =
        (args.job_retention_secs > 0).then(|| Duration::from_secs(args.job_retention_secs));
    config.shard = args.shard;
    config.describe_timeout = Duration::from_secs(args.describe_timeout_secs);
    let (server_security, client_security) = args.security.load()?;
    let access = DashboardAccess {
        credentials: dashboard_credentials(&args.dashboard_token_files, &server_security)?,
        metrics_without_token: args.metrics_without_token,
        tls: Some(server_security.for_http()),
    };
    config.server_security = server_security.clone();
    config.client_security = client_security;
    let mut service = CoordinatorService::open(&args.state, config)
        .with_context(|| format!("opening the coordinator state in {}", args.state.display()))?;
    let dashboard = match args.http {
        Some(address) => Some(std::sync::Arc::new(
            Dashboard::start_with(address, access).context("starting the dashboard")?,
        )),
        None => None,
    };
    if let Some(dashboard) = &dashboard {
        service = service.with_dashboard(dashboard.clone());
    }
    // The service's network work (HTTP/2, protobuf) runs on every core it is given; the core
    // itself is one lock.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = listen(args.listen).await?;
        let address = listener.local_addr()?;
        let probes = match args.health {
            Some(address) => Some(listen(address).await?),
            None => None,
        };
        server_security.warn_if_open("coordinator", address);
        // One line (scripts and tests read it): the gRPC address, then the dashboard's and the
        // probes' if any.
        let mut banner = format!("stoker coordinator listening on {address}");
        if let Some(dashboard) = &dashboard {
            banner += &format!(" dashboard {}", dashboard.url().trim_end_matches('/'));
        }
        // The journal is open and the socket bound: ready.
        let health = Health::ready();
        let probes = match probes {
            Some(listener) => {
                banner += &format!(" health http://{}", listener.local_addr()?);
                Some(tokio::spawn(serve_health(listener, health.clone())))
            }
            None => None,
        };
        println!("{banner}");
        tracing::info!(%address, state = %args.state.display(), "coordinator serving");
        let stopping = async move {
            super::shutdown_signal().await;
            health.set_not_ready("stopping");
        };
        service.serve(listener, stopping).await?;
        if let Some(probes) = probes {
            probes.abort();
        }
        tracing::info!("coordinator stopped");
        Ok::<_, anyhow::Error>(())
    })?;
    // A journal write still stuck on its disk (the service gave up on it) does not keep the
    // process from exiting.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_shard;

    #[test]
    fn a_shard_is_its_place_below_the_fleets_size() {
        assert_eq!(parse_shard("0/1"), Ok((0, 1)));
        assert_eq!(parse_shard("2/3"), Ok((2, 3)));
        for bad in ["3/3", "0/0", "1", "a/3", "1/b", "-1/3"] {
            assert!(parse_shard(bad).is_err(), "{bad} taken");
        }
    }
}
