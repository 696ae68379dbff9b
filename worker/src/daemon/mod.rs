//! The worker daemon of the distributed mode (`stoker-worker`) and the gRPC plumbing every
//! Stoker daemon and client shares: [`transport`] (message limits, HTTP/2 windows, backoff, the
//! two-way table between errors and statuses), [`batch_wire`] (the batch stream's messages,
//! sent from and read into the batches' own buffers), [`security`] (the shared token and TLS),
//! [`health`] (the probes), the daemons' runtime, listening socket, shutdown signal and logging.
//!
//! The daemon registers with the coordinator, leases tasks (one task is one batch), builds them
//! with the same [`Job`](crate::Job) as the embedded loader and streams them to the client that
//! owns the session, against the credits that client granted. See the repository's
//! `ARCHITECTURE.md` ("Data plane and control plane") for the contract.

pub mod batch_wire;
mod client_stream;
pub mod health;
pub mod security;
pub mod transport;
mod worker_daemon;

pub use worker_daemon::{
    canonical_roots, run_worker, WorkerConfig, DELIVERY_TIMEOUT, DRAIN_TIMEOUT,
};

/// The daemons' runtime: two tokio threads for the network (decoding has its own pool).
pub fn daemon_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Binds a daemon's listening socket; the error names the address.
pub async fn listen(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))
}

/// Resolves at Ctrl-C or SIGTERM, for the daemons to stop cleanly.
pub async fn shutdown_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match terminate.as_mut() {
                Some(signal) => { signal.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}

/// Sets up `tracing` on stderr for the command-line tools: warnings by default, `-v` info,
/// `-vv` debug; `RUST_LOG` overrides. Colours only when stderr is a terminal (a log file or a
/// pipe gets plain text).
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
