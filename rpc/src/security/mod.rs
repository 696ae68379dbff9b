//! Who may call a Stoker daemon, and how the bytes travel: the one place where the daemons and
//! every client get their shared token and their TLS.
//!
//! - **Token** (`token.rs`): a daemon started with `--token-file` (repeatable, for rotation)
//!   serves only calls that carry one of those tokens (`authorization: Bearer ...`), checked by
//!   [`TokenCheck`] before any handler runs, in constant time. Clients present theirs with
//!   [`AttachToken`] on every call; the daemons present the first of their own token files to
//!   the daemons they call.
//! - **TLS** (`tls.rs`): a daemon with `--tls-cert` and `--tls-key` terminates TLS itself on its
//!   socket (rustls, ring provider), so it can tell a plaintext client from a TLS one by the
//!   first byte and refuse it by name; clients trust the CA of `--tls-ca` and verify the name
//!   the daemon's address carries (a DNS name or an IP the certificate lists), or the one
//!   `--tls-server-name` gives. There is no client certificate (no mTLS): the token is what
//!   authenticates the caller.
//! - **Refusals** ([`Refusal`], kept with the error-kind table in [`crate::error_kinds`]): no
//!   token, a wrong token, a plaintext client on a TLS daemon, a TLS client on a plaintext
//!   daemon, a certificate from an unknown CA or for another name: each is its own message, on
//!   the client (an error of kind [`ErrorKind::Unauthenticated`] or [`ErrorKind::Tls`]) and in
//!   the daemon's log.
//!
//! [`Refusal`]: crate::error_kinds::Refusal
//! [`ErrorKind::Unauthenticated`]: stoker_proto::ErrorKind::Unauthenticated
//! [`ErrorKind::Tls`]: stoker_proto::ErrorKind::Tls

mod tls;
mod token;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use tls::{ClientConnection, PeerInfo, ServerConnection};
pub use token::{token_matches, AttachToken, Token, TokenCheck, TOKEN_ENV};

/// Why the security settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A token, certificate or key file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which setting the file is for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A token is empty or holds characters a gRPC header cannot carry.
    #[error("{0}")]
    BadToken(String),
    /// A certificate, key or CA file holds nothing usable.
    #[error("{what} {path}: {reason}")]
    BadPem {
        /// Which setting the file is for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the certificate and key, or the CA.
    #[error("TLS settings: {0}")]
    Tls(String),
    /// Settings that only make sense together were given apart.
    #[error("{0}")]
    Incomplete(String),
}

/// What a daemon accepts: the tokens of its token files (none: every caller) and its
/// certificate (none: plaintext).
#[derive(Clone, Default)]
pub struct ServerSecurity {
    tokens: Vec<Token>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for ServerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSecurity")
            .field("tokens", &self.tokens.len())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ServerSecurity {
    /// Accepts calls carrying one of `tokens` (none: any call), over TLS with the certificate
    /// chain and key of the PEM files `tls` names (none: plaintext).
    pub fn new(
        tokens: Vec<Token>,
        tls: Option<(&Path, &Path)>,
    ) -> Result<ServerSecurity, SecurityError> {
        let tls = match tls {
            Some((cert, key)) => Some(tls::acceptor(cert, key)?),
            None => None,
        };
        Ok(ServerSecurity { tokens, tls })
    }

    /// Whether calls need a token.
    pub fn requires_token(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Whether the daemon serves TLS.
    pub fn serves_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The tokens accepted.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// The same certificate for an HTTP/1.1 server beside the gRPC one (the coordinator's
    /// dashboard): ALPN offers `http/1.1` instead of `h2`, and no token is checked (the
    /// dashboard has credentials of its own).
    pub fn for_http(&self) -> ServerSecurity {
        let tls = self.tls.as_ref().map(|acceptor| {
            let mut config = acceptor.config().as_ref().clone();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
        });
        ServerSecurity {
            tokens: Vec::new(),
            tls,
        }
    }

    /// The interceptor every service of the daemon is wrapped in.
    pub fn check(&self) -> TokenCheck {
        TokenCheck::new(self.tokens.clone(), self.tls.is_some())
    }

    /// The connections of `listener`, TLS ones decrypted, each with its [`PeerInfo`]; ends when
    /// the server drops it.
    pub fn incoming(
        &self,
        listener: tokio::net::TcpListener,
    ) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<ServerConnection>> {
        tls::incoming(listener, self.tls.clone())
    }

    /// Logs the loud warning of a daemon that anyone who reaches `address` may use.
    pub fn warn_if_open(&self, daemon: &str, address: SocketAddr) {
        if address.ip().is_loopback() || self.requires_token() {
            return;
        }
        tracing::warn!(
            %address,
            "!!! the {daemon} listens on {address} WITHOUT A TOKEN: anyone who can reach this \
             port can open jobs and read the decoded data. Give --token-file FILE (and \
             --tls-cert/--tls-key to encrypt) !!!"
        );
    }
}

/// What a caller presents: its token (if any) on every call, and the CA it trusts (none:
/// plaintext).
#[derive(Clone, Default)]
pub struct ClientSecurity {
    token: Option<Token>,
    tls: Option<tls::ClientTls>,
}

impl std::fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("token", &self.token.is_some())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ClientSecurity {
    /// Presents `token` on every call; with `ca` (a PEM file of CA certificates) connects over
    /// TLS and verifies each daemon's certificate against it, and against `server_name` when
    /// given (else the host of the address dialled).
    pub fn new(
        token: Option<Token>,
        ca: Option<&Path>,
        server_name: Option<&str>,
    ) -> Result<ClientSecurity, SecurityError> {
        let tls = match ca {
            Some(ca) => Some(tls::ClientTls::new(ca, server_name)?),
            None if server_name.is_some() => return Err(SecurityError::Incomplete(
                "--tls-server-name needs --tls-ca (the CA that signed the daemons' certificates)"
                    .into(),
            )),
            None => None,
        };
        Ok(ClientSecurity { token, tls })
    }

    /// Whether calls carry a token.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether connections use TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The interceptor that adds the token to every call.
    pub fn attach(&self) -> AttachToken {
        AttachToken::new(self.token.clone())
    }

    /// Opens a connection to `host:port`: TCP, then TLS when a CA is set.
    pub(crate) fn connect(
        &self,
        host: String,
        port: u16,
    ) -> impl std::future::Future<
        Output = Result<ClientConnection, Box<dyn std::error::Error + Send + Sync>>,
    > + Send
           + 'static {
        tls::connect(self.tls.clone(), host, port)
    }
}

/// The security flags of both daemons (`stoker coordinator`, `stoker-worker`); clap arguments
/// with the `args` feature.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "args", derive(clap::Args))]
pub struct SecurityArgs {
    /// A file holding the shared token every call must carry (repeatable: each one's token is
    /// accepted, and the first is the one this daemon presents to the others, so a rotation
    /// adds the new file, then moves it first, then drops the old one). Without it, anyone who
    /// reaches the port is served.
    #[cfg_attr(feature = "args", arg(long = "token-file", value_name = "FILE"))]
    pub token_files: Vec<PathBuf>,
    /// PEM certificate chain to serve TLS with (with --tls-key and --tls-ca).
    #[cfg_attr(feature = "args", arg(long, value_name = "FILE", requires = "tls_key"))]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[cfg_attr(
        feature = "args",
        arg(long, value_name = "FILE", requires = "tls_cert")
    )]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) this daemon trusts when it calls the other daemons over TLS.
    #[cfg_attr(feature = "args", arg(long, value_name = "FILE"))]
    pub tls_ca: Option<PathBuf>,
    /// The name the other daemons' certificates must carry, when it is not the host of their
    /// address (for example one certificate shared by every daemon).
    #[cfg_attr(feature = "args", arg(long, value_name = "NAME", requires = "tls_ca"))]
    pub tls_server_name: Option<String>,
}

impl SecurityArgs {
    /// What the daemon accepts and what it presents to the others.
    pub fn load(&self) -> Result<(ServerSecurity, ClientSecurity), SecurityError> {
        let tokens = self
            .token_files
            .iter()
            .map(|path| Token::read(path))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                if self.tls_ca.is_none() {
                    return Err(SecurityError::Incomplete(
                        "--tls-cert needs --tls-ca too: the CA this daemon trusts when it calls \
                         the other daemons"
                            .into(),
                    ));
                }
                Some((cert.as_path(), key.as_path()))
            }
            (None, None) => None,
            _ => {
                return Err(SecurityError::Incomplete(
                    "--tls-cert and --tls-key go together".into(),
                ))
            }
        };
        let client = ClientSecurity::new(
            tokens.first().cloned(),
            self.tls_ca.as_deref(),
            self.tls_server_name.as_deref(),
        )?;
        Ok((ServerSecurity::new(tokens, tls)?, client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_name_without_a_ca_is_refused() {
        let error = ClientSecurity::new(None, None, Some("stoker.internal"));
        assert!(matches!(error, Err(SecurityError::Incomplete(_))));
    }

    #[test]
    fn a_certificate_without_a_ca_is_refused() {
        let args = SecurityArgs {
            tls_cert: Some("cert.pem".into()),
            tls_key: Some("key.pem".into()),
            ..SecurityArgs::default()
        };
        assert!(matches!(args.load(), Err(SecurityError::Incomplete(_))));
    }
}
