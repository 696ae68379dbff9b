//! Distributed mode: the coordinator daemon and the worker daemon (the client that reads from
//! them is the remote batch source, `crate::client::remote`), over gRPC (`stoker.v1.Coordinator`, `stoker.v1.WorkerData`).
//!
//! Control messages go to the coordinator; batches go from a worker straight to the client, on a
//! stream the client opened, against credits the client granted. See `../shared/DESIGN.md`
//! ("Data plane and control plane") for the contract and each module for its part.

mod client_reports;
mod coordinator_service;
pub mod transport;
mod worker_daemon;

pub use coordinator_service::{
    ClientEntry, CoordinatorService, CoordinatorServiceConfig, WorkerEntry,
};
pub use worker_daemon::{canonical_roots, run_worker, WorkerConfig, SUBSCRIBE_WAIT};

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
