//! Stoker's RPC layer: what every daemon and client on the wire shares, under the services
//! (the worker daemon, the coordinator, the remote client) and over the batch pipeline.
//!
//! - [`transport`]: message limits and HTTP/2 windows sized for multi-MB batches, endpoints,
//!   retry backoff;
//! - [`error_kinds`]: the one two-way table between [`ErrorKind`](stoker_proto::ErrorKind)
//!   and gRPC statuses, and the refusals of a token or a TLS setting;
//! - [`batch_wire`]: the batch stream's messages, sent from and read into the batches' own
//!   buffers, and the worker's data service over it;
//! - [`describe_only`]: a data server that only describes jobs (benches and tests);
//! - [`network`]: where channels lead: sockets, or an in-process network of named addresses
//!   (the services' unit tests run over it, with connections they can cut);
//! - [`security`]: the shared token and TLS; `health`: the probes;
//! - [`lease_calls`]: a worker's leases, on one stream per coordinator or a call each;
//! - [`shards`]: jobs sharded over coordinators (one address list, a job's coordinator found by
//!   a hash of its spec);
//! - the daemons' runtime, listening socket, shutdown signal and logging.
//!
//! The servers' side (tonic's server, the probes, the daemons' runtime and logging) comes with
//! the `server` feature; without it the crate is what a client needs.

/// The fuzz targets' bodies (`fuzz/`), behind the `fuzzing` feature: the fuzz crate and this
/// crate's corpus replay tests turn it on; a build for users leaves them out.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz_targets;

pub mod batch_wire;
pub mod describe_only;
pub mod error_kinds;
#[cfg(feature = "server")]
pub mod health;
pub mod lease_calls;
pub mod network;
pub mod security;
pub mod shards;
pub mod transport;

#[cfg(feature = "server")]
/// The daemons' runtime: two tokio threads for the network (decoding has its own pool).
pub fn daemon_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

#[cfg(feature = "server")]
/// Binds a daemon's listening socket; the error names the address.
pub async fn listen(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))
}

#[cfg(feature = "server")]
/// Resolves at Ctrl-C, SIGTERM or SIGHUP (a daemon started from a terminal that closes), for
/// the daemons to stop cleanly. A SIGHUP the process ignores (started under `nohup`) stays
/// ignored.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut hangup = hangup_signal();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = next_of(&mut terminate) => {}
        _ = next_of(&mut hangup) => {}
    }
}

#[cfg(feature = "server")]
/// Resolves at the second stop signal (Ctrl-C, SIGTERM or SIGHUP) received after it is first
/// polled: an operator's "stop now" while a daemon drains.
pub async fn second_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut hangup = hangup_signal();
    for _ in 0..2 {
        tokio::select! {
            _ = next_of(&mut interrupt) => {}
            _ = next_of(&mut terminate) => {}
            _ = next_of(&mut hangup) => {}
        }
    }
}

#[cfg(feature = "server")]
/// SIGHUP's deliveries, unless the process ignores it (`nohup`: the handler tokio installs
/// would replace that).
fn hangup_signal() -> Option<tokio::signal::unix::Signal> {
    // SAFETY: sigaction(2) with no new action only writes the current one into `current`, a
    // zeroed `sigaction` (a valid value of that plain C struct).
    let ignored = unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    };
    if ignored {
        return None;
    }
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
}

#[cfg(feature = "server")]
/// The next delivery of `signal`; never, without one.
async fn next_of(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(feature = "server")]
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
