//! gRPC settings shared by the daemons and the client: message limits and HTTP/2 windows sized
//! for multi-MB batches, endpoints and retry backoff (what a status means is
//! [`crate::error_kinds`]'s).
//!
//! Copies between the socket and the consumer: the kernel copies into hyper's read buffer, tonic
//! gathers a message's frames into its decode buffer (a second copy when a message spans more
//! than one read), and prost's `bytes` fields are slices of that buffer (no copy). The batch the
//! consumer gets shares tonic's buffer.

use std::time::Duration;

use stoker_proto::ErrorKind;
use tonic::service::interceptor::InterceptedService;
#[cfg(feature = "server")]
use tonic::transport::Server;
use tonic::transport::{Channel, Endpoint};

use crate::security::{AttachToken, ClientSecurity};

/// A channel to a daemon that presents the caller's token on every call.
pub type RpcChannel = InterceptedService<Channel, AttachToken>;

/// An address no channel can be made to: not `host:port` (nor a URI with both).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("address {address:?} is not host:port{why}")]
pub struct BadAddress {
    /// The address as given.
    pub address: String,
    /// What the URI parser said, in parentheses after a space; empty when it parsed.
    why: String,
}

impl BadAddress {
    /// The kind it travels as: a setting to fix.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidArgument
    }
}

/// Largest gRPC message either side accepts or sends (a 1024-image 224x224 RGB batch is
/// 154 MB).
pub const MAX_MESSAGE_BYTES: usize = 512 << 20;
/// HTTP/2 flow-control window per stream: several 8 MiB batches in flight.
const STREAM_WINDOW: u32 = 32 << 20;
/// HTTP/2 flow-control window per connection.
const CONNECTION_WINDOW: u32 = 64 << 20;
/// HTTP/2 frame size, the setting that matters most for throughput: the sender writes one frame
/// per system call, and 16 KiB frames cap a stream near 1 GB/s here. Each frame the client
/// receives is a slice of a buffer its HTTP/2 library allocates as the frames come, so the rate
/// also rests on the program's allocator keeping freed buffers: jemalloc, which Stoker's
/// binaries and Python extension allocate through (`stoker-alloc`), does; glibc gave 1 MiB
/// buffers back to the kernel and faulted them in again, or not, by its heap's state. A Rust
/// program that links this crate keeps its own allocator. `stoker bench transport`, batch_wire
/// path, 2026-11-29: 1 MiB frames with jemalloc 1.81-2.95 GB/s (43-66% of memcpy, 16 runs),
/// 64 KiB frames with glibc 1.29-2.68, 1 MiB frames with glibc 0.82-0.85 or 2.77-3.15.
const MAX_FRAME: u32 = 1 << 20;

/// A server builder with Stoker's transport settings.
#[cfg(feature = "server")]
pub fn server() -> Server {
    Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(5)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
}

/// A lazily connecting channel to `address` (`host:port` or `http://host:port`; the host may be
/// a DNS name), over TLS when `security` has a CA, presenting its token on every call. A
/// refused TLS handshake fails the call with a status that
/// [`crate::error_kinds::refusal_of`] recognises.
pub fn channel(address: &str, security: &ClientSecurity) -> Result<RpcChannel, BadAddress> {
    let uri = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|e| BadAddress {
            address: address.to_string(),
            why: format!(" ({e})"),
        })?
        .connect_timeout(Duration::from_secs(3))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let (host, port) = match (endpoint.uri().host(), endpoint.uri().port_u16()) {
        (Some(host), Some(port)) => (host.to_string(), port),
        _ => {
            return Err(BadAddress {
                address: address.to_string(),
                why: String::new(),
            })
        }
    };
    let connector = {
        let security = security.clone();
        tower::service_fn(move |_: tonic::transport::Uri| security.connect(host.clone(), port))
    };
    let channel = endpoint.connect_with_connector_lazy(connector);
    Ok(InterceptedService::new(channel, security.attach()))
}

/// Whether `address` is `ip:port` or `dns-name:port` (what a worker may advertise: a DNS name
/// is what a TLS certificate can carry where a pod's IP cannot be listed).
pub fn is_host_port(address: &str) -> bool {
    if address.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    name_ok && port.parse::<u16>().is_ok_and(|port| port != 0)
}

/// Exponential backoff with jitter, for reconnecting to a peer that went away.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
    seed: u64,
}

impl Backoff {
    /// Starts at 50 ms and doubles up to `max`.
    pub fn new(max: Duration) -> Self {
        Self {
            next: Duration::from_millis(50),
            max,
            seed: random_u64(),
        }
    }

    /// The next wait: the current step plus up to half of it again, at random.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let jitter = base.as_nanos() as u64 / 2;
        let extra = if jitter == 0 {
            0
        } else {
            (self.seed >> 33) % jitter
        };
        base + Duration::from_nanos(extra)
    }

    /// Back to the first step after a success.
    pub fn reset(&mut self) {
        self.next = Duration::from_millis(50);
    }
}

/// A random 64-bit value from the standard library's per-process hash keys and the clock.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_with_bounded_jitter() {
        let mut backoff = Backoff::new(Duration::from_millis(400));
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(50) && delays[0] < Duration::from_millis(75));
        for delay in &delays[4..] {
            assert!(*delay >= Duration::from_millis(400) && *delay < Duration::from_millis(600));
        }
        backoff.reset();
        assert!(backoff.next_delay() < Duration::from_millis(75));
    }

    #[test]
    fn worker_addresses_are_ips_or_dns_names_with_a_port() {
        for good in [
            "127.0.0.1:7171",
            "[::1]:7171",
            "worker-3.stoker.svc:7171",
            "localhost:1",
        ] {
            assert!(is_host_port(good), "{good}");
        }
        for bad in [
            "localhost",
            "localhost:0",
            ":7171",
            "a b:7171",
            "-x.svc:1",
            "x..y:1",
            "h:port",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn addresses_without_a_scheme_get_http() {
        let open = ClientSecurity::default();
        assert!(channel("127.0.0.1:1", &open).is_ok());
        assert!(channel("worker-3.stoker.svc:7071", &open).is_ok());
        assert!(channel("not an address", &open).is_err());
    }
}
