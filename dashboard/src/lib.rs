//! Stoker's stall dashboard, one crate for the embedded loader and the coordinator alike: an
//! HTTP page with live charts of each registered job's stall, throughput, queue depth and where
//! the time goes, the JSON API the page polls, and `/metrics` in the Prometheus text format; and
//! the figures it shows ([`LoaderStats`], [`ControllerSnapshot`], [`GpuDecodeFigures`],
//! [`MonitorSnapshot`]), read through a [`LoaderMonitor`]: the loader plugs its own in through
//! the [`MonitorSource`] hook, a coordinator shows what its clients report. It knows nothing of
//! CUDA, decoding or the loader.
//!
//! The server runs on its own thread with a single-threaded tokio runtime, so it never takes a
//! core from the decode pool for long: every request only formats figures the sampler already
//! holds. The sampler reads each job's [`LoaderMonitor`] every 500 ms and keeps the last ten
//! minutes of readings (see `series`).
//!
//! Routes: `/` (the page, compiled into the binary), `/api/jobs` (JSON, each job's newest
//! points, 120,000 at most over all jobs; `?since=<unix ms>` for only newer points,
//! `?at=<unix ms>` for the figures as they were at that reading), and `/metrics`. Who may read
//! them is the `access` module's business: anyone on a loopback address given no credential,
//! only holders of a dashboard credential elsewhere or on loopback given one
//! ([`Dashboard::start_with`]); a dashboard off loopback without one does not start. With a
//! daemon's certificate it serves HTTPS.

mod access;
mod connections;
mod figures;
mod fork;
mod metrics;
mod routes;
mod series;
mod verdict;

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;

use stoker_rpc::security::{ServerConnection, ServerSecurity};

use access::Gate;
pub use access::{DashboardAccess, COOKIE_LIFETIME};
use connections::{serve_within, ConnectionLimits};
pub use figures::{
    ChangeReason, ControllerSnapshot, GpuDecodeFigures, LoaderMonitor, LoaderStats,
    MonitorSnapshot, MonitorSource,
};

use series::{Registry, SAMPLE_INTERVAL};

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The runtime or thread that serves the page could not be created.
    #[error("cannot start the dashboard's server thread: {0}")]
    Thread(std::io::Error),
    /// A dashboard on a non-loopback address without a credential to guard it.
    #[error("the dashboard on {0} (not a loopback address) needs a dashboard credential: give --dashboard-token-file (Python: dashboard_token_file=), or serve it on 127.0.0.1")]
    NeedsCredential(SocketAddr),
    /// A dashboard credential that is also an RPC token: it would travel where the RPC token
    /// must not.
    #[error("the dashboard credential must differ from the RPC token (--token-file): the dashboard is read-only and its credential may travel where the RPC token must not")]
    CredentialIsRpcToken,
    /// The cookie key could not be drawn.
    #[error("cannot start the dashboard: {0}")]
    Randomness(String),
}

/// One worker daemon's load, as a coordinator's dashboard lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerLoad {
    /// How the worker is named on the page (id and address).
    pub name: String,
    /// Decode threads.
    pub threads: usize,
    /// Tasks (batches) completed per second over the last interval.
    pub tasks_per_s: Option<f64>,
    /// Tasks completed since it registered.
    pub tasks: u64,
    /// Tasks it reported failed.
    pub failed: u64,
    /// Samples it replaced under the skip policy.
    pub bad_samples: u64,
}

/// One job's share of the workers, as a coordinator's dashboard shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobShare {
    /// The job's name on the dashboard (the one its clients' charts carry).
    pub name: String,
    /// Its weight against other waiting jobs (capped by `--max-job-weight`).
    pub weight: u32,
    /// Tasks leased to it since the coordinator started.
    pub leases: u64,
    /// Tasks leased to it per second over the last interval.
    pub leases_per_s: Option<f64>,
    /// Its share of all tasks leased over the last interval, 0 to 1.
    pub lease_fraction: Option<f64>,
    /// Its sessions waiting for a lease now.
    pub waiting_sessions: u64,
    /// The workers that leased its tasks lately (the last 10 s), as the worker cards name them.
    pub workers: Vec<String>,
}

/// A running dashboard server; it stops when dropped.
///
/// ```no_run
/// # fn demo() -> Result<(), stoker_dashboard::DashboardError> {
/// use std::sync::{Arc, Mutex};
/// use stoker_dashboard::{Dashboard, LoaderMonitor, MonitorSnapshot};
///
/// let dashboard = Dashboard::start("127.0.0.1:0".parse().unwrap())?;
/// // A coordinator's view of a remote client; a loader in this process gives its own monitor
/// // (`stoker_loader::Loader::monitor`).
/// let latest = Arc::new(Mutex::new(MonitorSnapshot::default()));
/// dashboard.register_job("train", 0, LoaderMonitor::reported(latest));
/// println!("dashboard: {}", dashboard.url());
/// # Ok(()) }
/// ```
pub struct Dashboard {
    address: SocketAddr,
    /// It serves HTTPS.
    https: bool,
    registry: Arc<Mutex<Registry>>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Its listening socket, recorded to be closed in a child made by `fork()`.
    forked_close: Option<fork::Recorded>,
}

impl Dashboard {
    /// Binds a loopback `address` (port 0 picks a free port; see [`Dashboard::local_addr`])
    /// and starts serving and sampling on a thread of its own, open to anyone on the machine.
    /// A non-loopback address is refused ([`DashboardError::NeedsCredential`]): use
    /// [`Dashboard::start_with`] and a credential there.
    pub fn start(address: SocketAddr) -> Result<Self, DashboardError> {
        Self::start_with(address, DashboardAccess::default())
    }

    /// Like [`Dashboard::start`], but requests carrying one of `access.credentials` are
    /// served, and only those wherever credentials are given, loopback included (see the
    /// `access` module for how a browser presents one), over HTTPS when `access.tls` holds a
    /// certificate; a non-loopback address without credentials is refused.
    pub fn start_with(
        address: SocketAddr,
        access: DashboardAccess,
    ) -> Result<Self, DashboardError> {
        if !address.ip().is_loopback() && access.credentials.is_empty() {
            return Err(DashboardError::NeedsCredential(address));
        }
        Self::serve_on(address, access)
    }

    fn serve_on(address: SocketAddr, access: DashboardAccess) -> Result<Self, DashboardError> {
        let listener = TcpListener::bind(address).map_err(|source| DashboardError::Bind {
            addr: address,
            source,
        })?;
        let bound = listener
            .local_addr()
            .and_then(|bound| listener.set_nonblocking(true).map(|()| bound))
            .map_err(|source| DashboardError::Bind {
                addr: address,
                source,
            })?;
        let forked_close = fork::record(std::os::fd::AsRawFd::as_raw_fd(&listener));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .thread_name("stoker-dashboard")
            .build()
            .map_err(DashboardError::Thread)?;
        let registry = Arc::new(Mutex::new(Registry::default()));
        let (shutdown, stop) = oneshot::channel();
        let state = Arc::clone(&registry);
        let tls = access.tls.clone().filter(ServerSecurity::serves_tls);
        let gate = Gate::new(bound, access).map_err(DashboardError::Randomness)?;
        let https = tls.is_some();
        let thread = std::thread::Builder::new()
            .name("stoker-dashboard".into())
            .spawn(move || runtime.block_on(serve(listener, state, gate, tls, stop)))
            .map_err(DashboardError::Thread)?;
        tracing::info!(address = %bound, https, "dashboard listening");
        Ok(Self {
            address: bound,
            https,
            registry,
            shutdown: Some(shutdown),
            thread: Some(thread),
            forked_close: Some(forked_close),
        })
    }

    /// The address the server listens on, with the real port when 0 was asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The page's URL, e.g. `http://127.0.0.1:8321/` (`https://` when it serves HTTPS).
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}/", self.address)
    }

    /// Shows `workers` as the worker table of every job (a coordinator's dashboard; replaces
    /// the previous list).
    pub fn set_workers(&self, workers: Vec<WorkerLoad>) {
        match self.registry.lock() {
            Ok(mut registry) => registry.workers = Some(workers),
            Err(_) => tracing::warn!("dashboard registry poisoned; workers not shown"),
        }
    }

    /// Shows each job's share of the workers (a coordinator's dashboard; replaces the previous
    /// list): on its charts' card, in `/api/jobs` and on `/metrics`.
    pub fn set_shares(&self, shares: Vec<JobShare>) {
        match self.registry.lock() {
            Ok(mut registry) => registry.shares = Some(shares),
            Err(_) => tracing::warn!("dashboard registry poisoned; shares not shown"),
        }
    }

    /// Shows the live workers and how many the jobs want (a coordinator's dashboard), as
    /// `stoker_workers` and `stoker_workers_wanted` on `/metrics`.
    pub fn set_fleet(&self, workers: u64, wanted: u64) {
        match self.registry.lock() {
            Ok(mut registry) => registry.fleet = Some((workers, wanted)),
            Err(_) => tracing::warn!("dashboard registry poisoned; workers wanted not shown"),
        }
    }

    /// Starts charting a loader as `name`, rank `rank`. Registering the same name and rank
    /// again replaces the earlier monitor and starts its history afresh.
    pub fn register_job(&self, name: &str, rank: u32, monitor: LoaderMonitor) {
        match self.registry.lock() {
            Ok(mut registry) => registry.register(name, rank, monitor),
            Err(_) => tracing::warn!(job = name, "dashboard registry poisoned; job not shown"),
        }
    }

    /// Stops charting every rank of the jobs named in `names`, and forgets their history.
    pub fn forget_jobs(&self, names: &std::collections::HashSet<String>) {
        match self.registry.lock() {
            Ok(mut registry) => registry.forget(names),
            Err(_) => tracing::warn!("dashboard registry poisoned; jobs not forgotten"),
        }
    }

    /// Stops charting the ranks `ranks` (job name, rank), and forgets their history.
    pub fn forget_ranks(&self, ranks: &[(String, u32)]) {
        match self.registry.lock() {
            Ok(mut registry) => registry.jobs.retain(|job| {
                !ranks
                    .iter()
                    .any(|(name, rank)| *name == job.name && *rank == job.rank)
            }),
            Err(_) => tracing::warn!("dashboard registry poisoned; ranks not forgotten"),
        }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        // Cleared before the socket closes (as the server thread ends), so its number,
        // reused by the parent, is never closed in a child.
        drop(self.forked_close.take());
        if let Some(shutdown) = self.shutdown.take() {
            // The server thread may already be gone; nothing to stop then.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("dashboard thread panicked");
            }
        }
    }
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// Serves requests (within the `connections` module's bounds) and samples the jobs until
/// `stop` fires. Open connections are dropped with the runtime rather than drained: a browser's keep-alive connection would otherwise hold the
/// shutdown for as long as the tab stays open.
async fn serve(
    listener: TcpListener,
    registry: Arc<Mutex<Registry>>,
    gate: Gate,
    tls: Option<ServerSecurity>,
    stop: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "dashboard cannot use its socket");
            return;
        }
    };
    let app = routes::router(Arc::clone(&registry)).layer(axum::middleware::from_fn_with_state(
        Arc::new(gate),
        access::guard,
    ));
    let sampler = sample_forever(registry);
    let limits = ConnectionLimits::DASHBOARD;
    let server = async move {
        match tls {
            Some(tls) => match TlsListener::new(listener, &tls) {
                Ok(listener) => serve_within(listener, app, limits).await,
                Err(error) => tracing::error!(%error, "dashboard cannot serve TLS"),
            },
            None => serve_within(listener, app, limits).await,
        }
    };
    tokio::select! {
        () = server => {}
        () = sampler => {}
        _ = stop => {}
    }
}

/// The dashboard's connections over TLS: handshakes on tasks of their own (a slow client holds
/// up no other); a client that speaks plain HTTP to it is dropped, never served in clear.
struct TlsListener {
    incoming: tokio_stream::wrappers::ReceiverStream<std::io::Result<ServerConnection>>,
    address: SocketAddr,
}

impl TlsListener {
    fn new(listener: tokio::net::TcpListener, tls: &ServerSecurity) -> std::io::Result<Self> {
        let address = listener.local_addr()?;
        Ok(TlsListener {
            incoming: tls.incoming(listener),
            address,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = ServerConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        use tokio_stream::StreamExt;
        loop {
            match self.incoming.next().await {
                Some(Ok(connection)) => {
                    let peer = connection.peer();
                    if !peer.tls {
                        tracing::warn!(peer = ?peer.remote, "plain HTTP to the HTTPS dashboard; connection dropped");
                        continue;
                    }
                    return (connection, peer.remote.unwrap_or(self.address));
                }
                Some(Err(error)) => tracing::debug!(%error, "dashboard connection failed"),
                // The acceptor is gone (its runtime is stopping): accept nothing more.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.address)
    }
}

/// Takes a reading of every job each [`SAMPLE_INTERVAL`].
async fn sample_forever(registry: Arc<Mutex<Registry>>) {
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match registry.lock() {
            Ok(mut registry) => registry.sample_all(),
            Err(_) => {
                tracing::error!("dashboard registry poisoned; sampling stops");
                // Keep the server up so the page still loads and shows what it can.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// How often the page asks for new figures (it reads this from the API).
pub(crate) const POLL_PERIOD: Duration = Duration::from_secs(1);
