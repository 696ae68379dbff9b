//! TLS on the daemons' sockets and in the clients' connector (tokio-rustls, ring provider).
//!
//! The daemon reads nothing before it knows what a connection speaks: it peeks at the first
//! byte. `0x16` opens a TLS handshake; anything else is plaintext HTTP/2. So a TLS daemon serves
//! a plaintext client only to refuse each call by name ([`super::TokenCheck`]), and a plaintext
//! daemon answers a TLS client with a line of text and closes, which the client's rustls reads
//! as "not TLS" and reports as [`Refusal::TlsToPlaintext`]. Both daemons log the mismatch.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::SecurityError;
use crate::error_kinds::{Refusal, Refused};

/// The first byte of a TLS record carrying a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;

/// How long a new connection may take to say what it speaks and finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections decided on but not yet taken by the server.
const ACCEPT_QUEUE: usize = 64;

/// Connections accepted and not yet taken by the server (in their handshake, or decided on
/// and waiting for the queue): past this many, the next is accepted once one of these goes,
/// so clients that connect and then say nothing hold a bounded number of descriptors.
const PENDING_MOST: usize = 256;

/// What a plaintext daemon writes to a TLS client before closing (not a TLS record, so the
/// client's handshake fails as "not TLS").
const PLAINTEXT_NOTICE: &[u8] = b"stoker: this daemon serves plaintext gRPC, not TLS\n";

/// What the daemon knows of a connection; each request carries it as an extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    /// The caller's address.
    pub remote: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
}

/// A TCP connection, in plaintext or wrapped in TLS.
pub enum MaybeTls<T> {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<T>),
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(stream) => stream.is_write_vectored(),
            MaybeTls::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_flush(cx),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection the daemon serves, and what it knows of it.
pub struct ServerConnection {
    io: MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>,
    peer: PeerInfo,
}

impl AsyncRead for ServerConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServerConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl ServerConnection {
    /// Who connected, and whether over TLS.
    pub fn peer(&self) -> PeerInfo {
        self.peer
    }
}

#[cfg(feature = "server")]
impl tonic::transport::server::Connected for ServerConnection {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer
    }
}

/// A connection a client opened.
pub type ClientConnection =
    hyper_util::rt::TokioIo<MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path).map_err(|source| SecurityError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let pem = read_pem(what, path)?;
    let bad = |reason: String| SecurityError::BadPem {
        what,
        path: path.to_path_buf(),
        reason,
    };
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certificates.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certificates)
}

/// The acceptor of a daemon serving the certificate chain in `cert` with the key in `key`.
pub(super) fn acceptor(
    cert: &Path,
    key: &Path,
) -> Result<tokio_rustls::TlsAcceptor, SecurityError> {
    let chain = certificates("--tls-cert", cert)?;
    let key_pem = read_pem("--tls-key", key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| SecurityError::BadPem {
        what: "--tls-key",
        path: key.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| SecurityError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| SecurityError::Tls(format!("--tls-cert and --tls-key: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// A client's TLS settings: the CA it trusts and the name it checks, if not the host's.
#[derive(Clone)]
pub(super) struct ClientTls {
    connector: tokio_rustls::TlsConnector,
    server_name: Option<ServerName<'static>>,
}

impl ClientTls {
    pub(super) fn new(ca: &Path, server_name: Option<&str>) -> Result<ClientTls, SecurityError> {
        let mut roots = rustls::RootCertStore::empty();
        for certificate in certificates("--tls-ca", ca)? {
            roots.add(certificate).map_err(|e| SecurityError::BadPem {
                what: "--tls-ca",
                path: ca.to_path_buf(),
                reason: e.to_string(),
            })?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecurityError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let server_name = server_name
            .map(|name| {
                ServerName::try_from(name.to_string()).map_err(|e| {
                    SecurityError::Incomplete(format!("--tls-server-name {name:?}: {e}"))
                })
            })
            .transpose()?;
        Ok(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }
}

/// Connects to `host:port`, then does the TLS handshake when `tls` is set; a failed handshake
/// is a [`Refused`] naming its cause.
pub(super) async fn connect(
    tls: Option<ClientTls>,
    host: String,
    port: u16,
) -> Result<ClientConnection, Box<dyn std::error::Error + Send + Sync>> {
    let tcp =
        TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
    tcp.set_nodelay(true)?;
    let Some(tls) = tls else {
        return Ok(hyper_util::rt::TokioIo::new(MaybeTls::Plain(tcp)));
    };
    let address = format!("{host}:{port}");
    let name = match &tls.server_name {
        Some(name) => name.clone(),
        None => ServerName::try_from(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        )
        .map_err(|e| Refused {
            refusal: Refusal::WrongName,
            message: format!(
                "{address}: {host:?} is not a name a certificate can carry ({e}); give \
                 --tls-server-name"
            ),
        })?,
    };
    let checked_name = name.to_str().into_owned();
    match tls.connector.connect(name, tcp).await {
        Ok(stream) => Ok(hyper_util::rt::TokioIo::new(MaybeTls::Tls(Box::new(
            stream,
        )))),
        Err(error) => Err(Box::new(client_refusal(&address, &checked_name, &error))),
    }
}

/// The refusal a client's failed handshake stands for.
fn client_refusal(address: &str, name: &str, error: &io::Error) -> Refused {
    use rustls::{CertificateError, Error as TlsError};
    let tls = error.get_ref().and_then(|e| e.downcast_ref::<TlsError>());
    let (refusal, message) = match tls {
        // A bad signature under a trusted name: signed by another key than the trusted CA's.
        Some(TlsError::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        )) => (
            Refusal::UnknownCa,
            format!(
                "TLS to {address}: its certificate is not signed by a CA in --tls-ca (tls_ca=): \
                 unknown CA"
            ),
        ),
        Some(TlsError::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => (
            Refusal::WrongName,
            format!(
                "TLS to {address}: its certificate does not name {name:?}; advertise a name it \
                 lists, or give the one it carries with --tls-server-name"
            ),
        ),
        Some(TlsError::InvalidMessage(_)) => (Refusal::TlsToPlaintext, not_tls(address)),
        None if matches!(
            error.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ) =>
        {
            (Refusal::TlsToPlaintext, not_tls(address))
        }
        _ => (
            Refusal::Handshake,
            format!("TLS handshake with {address} failed: {error}"),
        ),
    };
    Refused { refusal, message }
}

fn not_tls(address: &str) -> String {
    format!(
        "TLS to {address}: the daemon does not answer in TLS, it serves plaintext (start it \
         with --tls-cert and --tls-key, or connect without --tls-ca)"
    )
}

/// The connections of `listener`, sorted into TLS and plaintext (see the module doc), each
/// handshake on a task of its own so a slow client holds up no other.
pub(super) fn incoming(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<ServerConnection>> {
    let (sender, receiver) = mpsc::channel(ACCEPT_QUEUE);
    let pending = Arc::new(tokio::sync::Semaphore::new(PENDING_MOST));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = Arc::clone(&pending).acquire_owned().await else {
                return;
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = sender.closed() => return,
            };
            let (tcp, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, most likely: wait rather than spin.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let sender = sender.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, classify(tcp, remote, tls)).await {
                    // Not taken within the same time (the server holds all it may): dropped.
                    Ok(Some(connection)) => {
                        let queued = sender.send(Ok(connection));
                        if tokio::time::timeout(HANDSHAKE_TIMEOUT, queued)
                            .await
                            .is_err()
                        {
                            tracing::debug!(peer = %remote, "connection dropped: the server took none within {HANDSHAKE_TIMEOUT:?}");
                        }
                    }
                    Ok(None) => {}
                    Err(_) => {
                        tracing::debug!(peer = %remote, "connection dropped: no handshake within {HANDSHAKE_TIMEOUT:?}")
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// Peeks at the first byte and sets the connection up accordingly; `None` when it is closed.
async fn classify(
    tcp: TcpStream,
    remote: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Option<ServerConnection> {
    let _ = tcp.set_nodelay(true);
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(1) => {}
        _ => return None,
    }
    let speaks_tls = first[0] == TLS_HANDSHAKE;
    match (tls, speaks_tls) {
        (Some(acceptor), true) => match acceptor.accept(tcp).await {
            Ok(stream) => Some(ServerConnection {
                io: MaybeTls::Tls(Box::new(stream)),
                peer: PeerInfo {
                    remote: Some(remote),
                    tls: true,
                },
            }),
            Err(error) => {
                log_server_handshake_failure(remote, &error);
                None
            }
        },
        (Some(_), false) => {
            tracing::warn!(peer = %remote, cause = ?Refusal::PlaintextToTls, "a plaintext client connected to this TLS daemon; its calls are refused");
            Some(plain(tcp, remote))
        }
        (None, true) => {
            tracing::warn!(peer = %remote, cause = ?Refusal::TlsToPlaintext, "a TLS client connected to this plaintext daemon (it has no --tls-cert); connection closed");
            refuse_tls_client(tcp).await;
            None
        }
        (None, false) => Some(plain(tcp, remote)),
    }
}

fn plain(tcp: TcpStream, remote: SocketAddr) -> ServerConnection {
    ServerConnection {
        io: MaybeTls::Plain(tcp),
        peer: PeerInfo {
            remote: Some(remote),
            tls: false,
        },
    }
}

/// Reads the client's hello (so closing sends a FIN, not a reset that could overtake the
/// notice), writes the notice and closes.
async fn refuse_tls_client(mut tcp: TcpStream) {
    let mut hello = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut hello)).await;
    let _ = tcp.write_all(PLAINTEXT_NOTICE).await;
    let _ = tcp.shutdown().await;
}

fn log_server_handshake_failure(remote: SocketAddr, error: &io::Error) {
    use rustls::{AlertDescription, Error as TlsError};
    let tls = error.get_ref().and_then(|e| e.downcast_ref::<TlsError>());
    match tls {
        Some(TlsError::AlertReceived(
            alert @ (AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown),
        )) => tracing::warn!(
            peer = %remote,
            cause = ?Refusal::UnknownCa,
            "TLS handshake refused by the client: it does not trust this daemon's certificate \
             ({alert:?}); give it the CA that signed --tls-cert"
        ),
        _ => tracing::warn!(peer = %remote, %error, "TLS handshake failed"),
    }
}
