//! Where a channel leads: [`Network::Sockets`] (TCP, with TLS where the caller's security has a
//! CA), or a [`MemoryNetwork`] of named addresses inside one process whose connections are
//! in-memory pipes. Servers and callers run the same tonic stack, HTTP/2 settings and
//! interceptors (token checks included) over both, so a service and the code that calls it are
//! tested without ports; [`MemoryNetwork::cut`] breaks an address's live connections the way a
//! lost peer does.

use std::collections::{HashMap, HashSet};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
#[cfg(feature = "server")]
use tonic::transport::server::Connected;
use tonic::transport::{Endpoint, Uri};

use crate::security::ClientSecurity;
use crate::transport::{self, BadAddress, RpcChannel};

/// Bytes an in-memory pipe holds each way before a writer waits: a few HTTP/2 frames.
const PIPE_BYTES: usize = 256 << 10;

/// A connection a server serves: a socket's (TLS or plain) or an in-memory one.
#[cfg(feature = "server")]
pub trait Connection: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static {}

#[cfg(feature = "server")]
impl<T: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static> Connection for T {}

/// Where the channels a service makes lead.
#[derive(Debug, Clone, Default)]
pub enum Network {
    /// TCP sockets: `host:port` addresses, TLS where the caller's security has a CA.
    #[default]
    Sockets,
    /// The named addresses of an in-process network.
    Memory(MemoryNetwork),
}

impl Network {
    /// A lazily connecting channel to `address`, presenting `security`'s token on every call.
    pub fn channel(
        &self,
        address: &str,
        security: &ClientSecurity,
    ) -> Result<RpcChannel, BadAddress> {
        match self {
            Network::Sockets => transport::channel(address, security),
            Network::Memory(network) => Ok(network.channel(address, security)),
        }
    }
}

/// An in-process network: servers listen on names, channels connect to them through in-memory
/// pipes. Clones share the network.
#[derive(Clone, Default)]
pub struct MemoryNetwork {
    shared: Arc<Mutex<Addresses>>,
}

#[derive(Default)]
struct Addresses {
    /// Where each listening address takes its new connections.
    listeners: HashMap<String, mpsc::UnboundedSender<MemoryConnection>>,
    /// The connections made to each address (both ends share one cut).
    connections: HashMap<String, Vec<Weak<Cut>>>,
    /// Addresses whose connections carry no bytes for now ([`MemoryNetwork::hold`]).
    held: HashSet<String>,
}

impl std::fmt::Debug for MemoryNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut listening: Vec<String> = self.addresses().listeners.keys().cloned().collect();
        listening.sort();
        f.debug_struct("MemoryNetwork")
            .field("listening", &listening)
            .finish()
    }
}

impl MemoryNetwork {
    /// An empty network.
    pub fn new() -> MemoryNetwork {
        MemoryNetwork::default()
    }

    fn addresses(&self) -> MutexGuard<'_, Addresses> {
        self.shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Listens on `address` (any name), replacing an earlier listener there: the connections
    /// made to it, for a tonic server's `serve_with_incoming`.
    pub fn listen(&self, address: &str) -> MemoryIncoming {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.addresses()
            .listeners
            .insert(address.to_string(), sender);
        MemoryIncoming { receiver }
    }

    /// A lazily connecting channel to `address`: each connection it makes is a new pipe to the
    /// listener there, refused (`ConnectionRefused`) while nothing listens.
    pub fn channel(&self, address: &str, security: &ClientSecurity) -> RpcChannel {
        let network = self.clone();
        let address = address.to_string();
        let connector = tower::service_fn(move |_: Uri| {
            let connected = network.connect(&address);
            async move { connected.map(hyper_util::rt::TokioIo::new) }
        });
        // A fixed, valid URI: the connector decides where the bytes go.
        let channel =
            Endpoint::from_static("http://in-memory").connect_with_connector_lazy(connector);
        InterceptedService::new(channel, security.attach())
    }

    fn connect(&self, address: &str) -> io::Result<MemoryConnection> {
        let mut addresses = self.addresses();
        let refused = || {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("nothing listens on {address} in this in-memory network"),
            )
        };
        let listener = addresses.listeners.get(address).ok_or_else(refused)?;
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        let cut = Arc::new(Cut::default());
        cut.held
            .store(addresses.held.contains(address), Ordering::Release);
        listener
            .send(MemoryConnection::new(theirs, Arc::clone(&cut)))
            .map_err(|_| refused())?;
        let live = addresses
            .connections
            .entry(address.to_string())
            .or_default();
        live.retain(|connection| connection.strong_count() > 0);
        live.push(Arc::downgrade(&cut));
        Ok(MemoryConnection::new(ours, cut))
    }

    /// Breaks every live connection to `address`: reads and writes on both ends fail from now
    /// on (`ConnectionReset`), as when a peer's host goes away. New connections are still made.
    /// Returns how many connections were cut.
    pub fn cut(&self, address: &str) -> usize {
        let cuts = self
            .addresses()
            .connections
            .remove(address)
            .unwrap_or_default();
        let live: Vec<Arc<Cut>> = cuts.iter().filter_map(Weak::upgrade).collect();
        for cut in &live {
            cut.cut();
        }
        live.len()
    }

    /// Stops every connection to `address`, live or made from now on, from carrying bytes
    /// until [`MemoryNetwork::release`]: reads and writes wait, nothing fails, as when a peer
    /// stops answering without closing (a stopped process, a partition). Returns how many live
    /// connections were held.
    pub fn hold(&self, address: &str) -> usize {
        self.set_held(address, true)
    }

    /// Lets the connections to `address` carry bytes again after [`MemoryNetwork::hold`].
    pub fn release(&self, address: &str) -> usize {
        self.set_held(address, false)
    }

    fn set_held(&self, address: &str, held: bool) -> usize {
        let mut addresses = self.addresses();
        if held {
            addresses.held.insert(address.to_string());
        } else {
            addresses.held.remove(address);
        }
        let live: Vec<Arc<Cut>> = addresses
            .connections
            .get(address)
            .map(|cuts| cuts.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        drop(addresses);
        for cut in &live {
            cut.hold(held);
        }
        live.len()
    }
}

/// The connections made to one listening address.
pub struct MemoryIncoming {
    receiver: mpsc::UnboundedReceiver<MemoryConnection>,
}

impl tokio_stream::Stream for MemoryIncoming {
    type Item = io::Result<MemoryConnection>;

    fn poll_next(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(context).map(|next| next.map(Ok))
    }
}

/// Whether a connection was cut or is held, and the tasks to wake when that changes.
#[derive(Default)]
struct Cut {
    done: AtomicBool,
    held: AtomicBool,
    waiting: Mutex<Vec<Waker>>,
}

impl Cut {
    fn cut(&self) {
        self.done.store(true, Ordering::Release);
        self.wake();
    }

    fn hold(&self, held: bool) {
        self.held.store(held, Ordering::Release);
        if !held {
            self.wake();
        }
    }

    fn wake(&self) {
        let waiting = std::mem::take(
            &mut *self
                .waiting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for waker in waiting {
            waker.wake();
        }
    }

    /// An error once cut; pending while held; else ready. Keeps `context`'s waker for a cut
    /// or a release.
    fn check(&self, context: &Context<'_>) -> Poll<io::Result<()>> {
        if self.done.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the in-memory connection was cut",
            )));
        }
        let mut waiting = self
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !waiting.iter().any(|w| w.will_wake(context.waker())) {
            waiting.push(context.waker().clone());
        }
        // Read under the lock `hold(false)` wakes through, so a release is never missed.
        if self.held.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

/// One end of an in-memory connection.
pub struct MemoryConnection {
    pipe: DuplexStream,
    cut: Arc<Cut>,
}

impl MemoryConnection {
    fn new(pipe: DuplexStream, cut: Arc<Cut>) -> MemoryConnection {
        MemoryConnection { pipe, cut }
    }
}

#[cfg(feature = "server")]
impl Connected for MemoryConnection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for MemoryConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        std::task::ready!(self.cut.check(context))?;
        Pin::new(&mut self.pipe).poll_read(context, buf)
    }
}

impl AsyncWrite for MemoryConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.cut.check(context))?;
        Pin::new(&mut self.pipe).poll_write(context, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.cut.check(context))?;
        Pin::new(&mut self.pipe).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.pipe).poll_shutdown(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe_only::DescribeOnly;
    use crate::error_kinds::kind_of_status;
    use crate::security::{ServerSecurity, Token};
    use stoker_proto::v1::worker_data_client::WorkerDataClient;
    use stoker_proto::v1::worker_data_server::WorkerDataServer;
    use stoker_proto::v1::{DescribeJobRequest, DescribeJobResponse, SubscribeRequest};
    use stoker_proto::ErrorKind;

    fn serve(network: &MemoryNetwork, address: &str, security: &ServerSecurity) {
        let describer = DescribeOnly(DescribeJobResponse {
            num_samples: 7,
            ..DescribeJobResponse::default()
        });
        let service = InterceptedService::new(WorkerDataServer::new(describer), security.check());
        tokio::spawn(
            transport::server()
                .add_service(service)
                .serve_with_incoming(network.listen(address)),
        );
    }

    fn token(text: &str) -> Token {
        Token::new(text).expect("a token")
    }

    #[tokio::test]
    async fn calls_reach_the_named_server_through_its_interceptors() {
        let network = MemoryNetwork::new();
        let accepted = ServerSecurity::new(vec![token("right")], None).expect("security");
        serve(&network, "worker-1:7001", &accepted);
        let call = |security: ClientSecurity| {
            let channel = network.channel("worker-1:7001", &security);
            async move {
                WorkerDataClient::new(channel)
                    .describe_job(DescribeJobRequest::default())
                    .await
            }
        };
        let described = call(ClientSecurity::new(Some(token("right")), None, None).expect("ok"))
            .await
            .expect("a described job");
        assert_eq!(described.into_inner().num_samples, 7);
        for security in [
            ClientSecurity::default(),
            ClientSecurity::new(Some(token("wrong")), None, None).expect("ok"),
        ] {
            let refused = call(security).await.expect_err("a refusal");
            assert_eq!(
                kind_of_status(&refused),
                ErrorKind::Unauthenticated,
                "{refused}"
            );
        }
    }

    #[tokio::test]
    async fn a_held_address_answers_nothing_until_released_and_fails_nothing() {
        let network = MemoryNetwork::new();
        let open = ServerSecurity::new(Vec::new(), None).expect("security");
        serve(&network, "coordinator:1", &open);
        let mut client =
            WorkerDataClient::new(network.channel("coordinator:1", &ClientSecurity::default()));
        client
            .describe_job(DescribeJobRequest::default())
            .await
            .expect("a first call");
        assert_eq!(network.hold("coordinator:1"), 1);
        let mut held = client.clone();
        let call = tokio::spawn(async move {
            held.describe_job(DescribeJobRequest::default())
                .await
                .map(|r| r.into_inner().num_samples)
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!call.is_finished(), "a held connection answered");
        network.release("coordinator:1");
        let answered = tokio::time::timeout(std::time::Duration::from_secs(10), call)
            .await
            .expect("answered once released")
            .expect("the call's task");
        assert_eq!(answered.expect("not failed"), 7);
    }

    #[tokio::test]
    async fn an_address_nobody_listens_on_is_unavailable() {
        let network = MemoryNetwork::new();
        let refused =
            WorkerDataClient::new(network.channel("nowhere:1", &ClientSecurity::default()))
                .describe_job(DescribeJobRequest::default())
                .await
                .expect_err("nothing listens");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
    }

    #[tokio::test]
    async fn a_cut_ends_an_open_stream_with_an_error_and_new_calls_still_connect() {
        let network = MemoryNetwork::new();
        serve(&network, "worker-2:7001", &ServerSecurity::default());
        let mut client =
            WorkerDataClient::new(network.channel("worker-2:7001", &ClientSecurity::default()));
        let mut stream = client
            .subscribe(SubscribeRequest::default())
            .await
            .expect("a stream")
            .into_inner();
        assert_eq!(network.cut("worker-2:7001"), 1);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), stream.message())
            .await
            .expect("the cut ends the stream at once");
        assert!(ended.is_err(), "a cut stream ends in an error: {ended:?}");
        let mut again =
            WorkerDataClient::new(network.channel("worker-2:7001", &ClientSecurity::default()));
        again
            .describe_job(DescribeJobRequest::default())
            .await
            .expect("a new connection after the cut");
    }
}
