//! The dashboard's connections, plain or TLS, served one task each with the bounds a process
//! that also trains needs: how many it holds at once, how many of them one address holds, how
//! long a client may take to send a request's head (idle keep-alive time included), and how
//! long an answer may wait for the client to read on. Without them a client that opens
//! connections and sends nothing, or a byte a minute, or asks and never reads the answer, holds
//! a file descriptor each for as long as it likes, until the training process runs out of
//! them; and one client holding every connection (no credential needed: a refusal closes its
//! connection, but it can open another) kept every page and scraper out.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::serve::Listener;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

/// The bounds on the connections the dashboard holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// Connections held at once; a further one is accepted once one of these ends.
    pub(crate) most: usize,
    /// Connections one client address holds at once while more than half of `most` are held;
    /// a further one from it is closed as it comes. Below that any address may take more (an
    /// ingress or a port-forward brings every user from one address).
    pub(crate) per_address: usize,
    /// How long a connection may take to send a request's head, counted from when the server
    /// starts reading it (so also the longest a kept-alive connection may sit idle).
    pub(crate) head_within: Duration,
    /// How long a write of the answer may make no progress (the client reads nothing more)
    /// before the connection is closed.
    pub(crate) write_within: Duration,
}

impl ConnectionLimits {
    /// The dashboard's: a page polls once a second on one or two connections, so 128 is room
    /// for many tabs and scrapers, 32 of them from one address; 20 s is far above the time a
    /// browser on a slow link takes to send a head or to read on.
    pub(crate) const DASHBOARD: ConnectionLimits = ConnectionLimits {
        most: 128,
        per_address: 32,
        head_within: Duration::from_secs(20),
        write_within: Duration::from_secs(20),
    };
}

/// Serves `app` on each connection `listener` accepts, within `limits`, until the future is
/// dropped (the tasks it spawned end with the runtime).
pub(crate) async fn serve_within<L>(mut listener: L, app: axum::Router, limits: ConnectionLimits)
where
    L: Listener<Addr = SocketAddr>,
{
    let held = Arc::new(Semaphore::new(limits.most));
    let by_address: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    loop {
        // Not closed while this holds it; were it, nothing more is served.
        let Ok(permit) = Arc::clone(&held).acquire_owned().await else {
            return;
        };
        let (io, peer) = listener.accept().await;
        let crowded = limits.most - held.available_permits() > limits.most / 2;
        let most_here = if crowded {
            limits.per_address
        } else {
            usize::MAX
        };
        let Some(from) = AddressHeld::take(&by_address, peer.ip(), most_here) else {
            tracing::debug!(%peer, "dashboard client holds its most connections; closed");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let mut io = tokio_io_timeout::TimeoutStream::new(io);
        io.set_write_timeout(Some(limits.write_within));
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.head_within);
            let io = TokioIo::new(Box::pin(io));
            if let Err(error) = builder.serve_connection(io, service).await {
                tracing::debug!(%error, "dashboard connection ended");
            }
            drop((from, permit));
        });
    }
}

/// One connection counted against its client's address, let go when dropped.
struct AddressHeld {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    address: IpAddr,
}

impl AddressHeld {
    /// Counts a connection from `address`, unless it holds `most` already.
    fn take(
        counts: &Arc<Mutex<HashMap<IpAddr, usize>>>,
        address: IpAddr,
        most: usize,
    ) -> Option<AddressHeld> {
        let mut held = counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.entry(address).or_insert(0);
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(AddressHeld {
            counts: Arc::clone(counts),
            address,
        })
    }
}

impl Drop for AddressHeld {
    fn drop(&mut self) {
        let mut held = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Instant;

    use super::*;

    /// Serves a one-route app within `limits` on a thread of its own; the address it listens on.
    fn start(limits: ConnectionLimits) -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                // An answer larger than the sockets' buffers hold between them.
                let big = || async { vec![b'x'; 32 << 20] };
                let app = axum::Router::new()
                    .route("/", axum::routing::get(|| async { "up" }))
                    .route("/big", axum::routing::get(big));
                serve_within(listener, app, limits).await;
            });
        });
        address
    }

    fn get(address: SocketAddr) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Reads until the server closes `stream`; how long that took.
    fn closed_after(mut stream: TcpStream) -> Duration {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = Instant::now();
        let mut rest = Vec::new();
        // A timeout here is an error, which the caller's bound on the duration catches.
        let _ = stream.read_to_end(&mut rest);
        started.elapsed()
    }

    #[test]
    fn a_client_that_never_finishes_its_head_is_cut_off() {
        let address = start(ConnectionLimits {
            most: 8,
            per_address: 8,
            head_within: Duration::from_millis(300),
            write_within: Duration::from_secs(10),
        });
        assert!(get(address).ends_with("up"));
        let mut slow = TcpStream::connect(address).unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: 127").unwrap();
        let waited = closed_after(slow);
        assert!(
            waited < Duration::from_secs(5),
            "a half-sent head was held {waited:?}"
        );
        // A connection that never asks is cut the same way.
        let idle = TcpStream::connect(address).unwrap();
        let waited = closed_after(idle);
        assert!(
            waited < Duration::from_secs(5),
            "an idle connection was held {waited:?}"
        );
        // So is a kept-alive one that asked once and never again.
        let mut kept = TcpStream::connect(address).unwrap();
        kept.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        let mut answer = [0u8; 512];
        let read = kept.read(&mut answer).unwrap();
        assert!(String::from_utf8_lossy(&answer[..read]).ends_with("up"));
        let waited = closed_after(kept);
        assert!(
            waited < Duration::from_secs(5),
            "a kept-alive connection was held {waited:?}"
        );
    }

    /// A client that asks and never reads the answer held its connection for good (the
    /// answer's write pending): now closed once the write makes no progress for a while.
    #[test]
    fn a_client_that_never_reads_its_answer_is_cut_off() {
        let address = start(ConnectionLimits {
            most: 1,
            per_address: 1,
            head_within: Duration::from_secs(10),
            write_within: Duration::from_millis(300),
        });
        let mut stalled = TcpStream::connect(address).unwrap();
        stalled
            .write_all(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        // The room's one connection is the stalled one's until its write is given up on; then
        // the next is served (before, never: `get` failed on its 10 s read timeout).
        let started = Instant::now();
        assert!(get(address).ends_with("up"));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a client that does not read held its connection {:?}",
            started.elapsed()
        );
        drop(stalled);
    }

    #[test]
    fn connections_past_the_most_wait_for_one_to_end() {
        let address = start(ConnectionLimits {
            most: 2,
            per_address: 2,
            head_within: Duration::from_millis(500),
            write_within: Duration::from_secs(10),
        });
        let held: Vec<TcpStream> = (0..2)
            .map(|_| TcpStream::connect(address).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        // The third is queued by the kernel, not served, until a held one is cut off: its answer
        // comes only after the head timeout has ended one of the two.
        let started = Instant::now();
        assert!(get(address).ends_with("up"));
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "served at once past the limit: {:?}",
            started.elapsed()
        );
        drop(held);
    }

    /// A connection from 127.0.0.2 (another address of the loopback).
    fn connect_from_another_address(address: SocketAddr) -> TcpStream {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let stream = socket.connect(address).await.unwrap().into_std().unwrap();
            stream.set_nonblocking(false).unwrap();
            stream
        })
    }

    /// Once over half the room is held, one client holding its most connections (idle, or
    /// re-asking within the head timeout) is closed on a further one at once, and the rest of
    /// the room serves other clients: one client held every connection, and no page or scraper
    /// was answered.
    #[test]
    fn one_address_holds_its_most_connections_and_no_more() {
        let address = start(ConnectionLimits {
            most: 8,
            per_address: 2,
            head_within: Duration::from_secs(10),
            write_within: Duration::from_secs(10),
        });
        // Within half the room a client takes more than its share (four here, all held).
        let mut held: Vec<TcpStream> = (0..4)
            .map(|_| TcpStream::connect(address).unwrap())
            .collect();
        held.push(connect_from_another_address(address));
        std::thread::sleep(Duration::from_millis(200));
        for stream in &held[..4] {
            stream.set_nonblocking(true).unwrap();
            let mut byte = [0u8; 1];
            let open = matches!(
                (&*stream).read(&mut byte),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock
            );
            assert!(open, "a connection within half the room was closed");
        }
        let waited = closed_after(TcpStream::connect(address).unwrap());
        assert!(
            waited < Duration::from_secs(2),
            "a fifth connection of one address, the room crowded, was held {waited:?}"
        );
        let mut other = connect_from_another_address(address);
        other
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        other
            .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        other.read_to_string(&mut answer).unwrap();
        assert!(answer.ends_with("up"), "{answer}");
        drop(held);
        // Let go: the address is served again, once the server has seen them close.
        let deadline = Instant::now() + Duration::from_secs(10);
        let served = loop {
            let mut stream = TcpStream::connect(address).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let asked =
                stream.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            if (asked.is_ok() && answer.ends_with("up")) || Instant::now() > deadline {
                break answer;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(served.ends_with("up"), "{served}");
    }
}
