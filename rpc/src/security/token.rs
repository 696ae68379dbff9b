//! The shared token: reading it from a file or `STOKER_TOKEN`, presenting it on every call
//! ([`AttachToken`]) and checking it before any handler runs ([`TokenCheck`]).
//!
//! The check compares SHA-256 digests of the presented and the accepted tokens with `subtle`'s
//! constant-time equality, against every accepted token without stopping early: neither the
//! time nor the token's length tells a caller how close it came.

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::{PeerInfo, SecurityError};
use crate::error_kinds::{self, Refusal};

/// The environment variable a client reads its token from when none is given.
pub const TOKEN_ENV: &str = "STOKER_TOKEN";

/// The header a token travels in.
const AUTHORIZATION: &str = "authorization";
const BEARER: &str = "Bearer ";

/// A shared secret. Its `Debug` form never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from its text, surrounding whitespace trimmed; it must be non-empty visible
    /// ASCII (it travels in a header).
    pub fn new(text: &str) -> Result<Token, SecurityError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(SecurityError::BadToken("the token is empty".into()));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SecurityError::BadToken(
                "the token holds characters other than visible ASCII (spaces, control \
                 characters or non-ASCII): use for example `openssl rand -hex 32`"
                    .into(),
            ));
        }
        Ok(Token(text.into()))
    }

    /// The token held in `path` (its whole content, trimmed).
    pub fn read(path: &Path) -> Result<Token, SecurityError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecurityError::Read {
            what: "token file",
            path: path.to_path_buf(),
            source,
        })?;
        warn_if_readable_by_others(path);
        Token::new(&text).map_err(|error| match error {
            SecurityError::BadToken(reason) => {
                SecurityError::BadToken(format!("token file {}: {reason}", path.display()))
            }
            other => other,
        })
    }

    /// `given`, or else the token in [`TOKEN_ENV`] when that is set and not empty.
    pub fn or_from_env(given: Option<Token>) -> Result<Option<Token>, SecurityError> {
        if given.is_some() {
            return Ok(given);
        }
        match std::env::var(TOKEN_ENV) {
            Ok(text) if !text.trim().is_empty() => Token::new(&text)
                .map(Some)
                .map_err(|e| SecurityError::BadToken(format!("{TOKEN_ENV}: {e}"))),
            _ => Ok(None),
        }
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn digest(bytes: &[u8]) -> [u8; 32] {
        Sha256::digest(bytes).into()
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(metadata) = std::fs::metadata(path) {
        if open_to_others(metadata.permissions().mode()) {
            tracing::warn!(path = %path.display(), "the token file is open to other users (chmod o-rwx it, or 600)");
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

/// Whether a file `mode` lets other users (not the owner, not the group) at it. Group bits are
/// left alone: a Kubernetes Secret mounted with an `fsGroup` is group-readable by design.
#[cfg(unix)]
fn open_to_others(mode: u32) -> bool {
    mode & 0o007 != 0
}

/// Whether `presented` is one of `accepted`, in time that depends on neither.
pub fn token_matches(accepted: &[Token], presented: &[u8]) -> bool {
    let presented = Token::digest(presented);
    let mut found = subtle::Choice::from(0);
    for token in accepted {
        found |= Token::digest(token.0.as_bytes()).ct_eq(&presented);
    }
    found.into()
}

/// The client's interceptor: adds `authorization: Bearer <token>` to every call.
#[derive(Clone, Default)]
pub struct AttachToken {
    header: Option<MetadataValue<Ascii>>,
}

impl AttachToken {
    pub(super) fn new(token: Option<Token>) -> AttachToken {
        // `Token::new` admits visible ASCII only, which a header value always takes.
        let header = token.and_then(|t| format!("{BEARER}{}", t.expose()).parse().ok());
        AttachToken { header }
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request.metadata_mut().insert(AUTHORIZATION, header.clone());
        }
        Ok(request)
    }
}

/// The daemon's interceptor: refuses plaintext calls on a TLS daemon, and calls without an
/// accepted token on a daemon that has tokens, before any handler runs.
#[derive(Clone)]
pub struct TokenCheck {
    tokens: Arc<[Token]>,
    tls_only: bool,
}

impl TokenCheck {
    pub(super) fn new(tokens: Vec<Token>, tls_only: bool) -> TokenCheck {
        TokenCheck {
            tokens: tokens.into(),
            tls_only,
        }
    }

    fn refuse(refusal: Refusal, peer: Option<&PeerInfo>, message: &str) -> Status {
        let peer = peer.and_then(|p| p.remote);
        match peer {
            Some(peer) => tracing::warn!(%peer, cause = ?refusal, "refused a call: {message}"),
            None => tracing::warn!(cause = ?refusal, "refused a call: {message}"),
        }
        error_kinds::status(refusal.kind(), message)
    }
}

impl Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let peer = request.extensions().get::<PeerInfo>();
        if self.tls_only && !peer.is_some_and(|p| p.tls) {
            return Err(Self::refuse(
                Refusal::PlaintextToTls,
                peer,
                "this daemon serves TLS only and the call came in plaintext: connect with \
                 --tls-ca (tls_ca=) naming the CA of its certificate",
            ));
        }
        if self.tokens.is_empty() {
            return Ok(request);
        }
        let Some(value) = request.metadata().get(AUTHORIZATION) else {
            return Err(Self::refuse(
                Refusal::MissingToken,
                peer,
                "this daemon requires a token and the call carried none: set STOKER_TOKEN \
                 (token= in Python, --token-file for daemons)",
            ));
        };
        let presented = value.as_bytes();
        let presented = presented
            .strip_prefix(BEARER.as_bytes())
            .unwrap_or(presented);
        if token_matches(&self.tokens, presented) {
            Ok(request)
        } else {
            Err(Self::refuse(
                Refusal::WrongToken,
                peer,
                "the token the call carried is not one this daemon accepts (check STOKER_TOKEN, \
                 token= or --token-file against the daemon's --token-file)",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_proto::ErrorKind;

    #[cfg(unix)]
    #[test]
    fn only_bits_for_other_users_count_as_open() {
        assert!(!open_to_others(0o600));
        assert!(!open_to_others(0o640), "an fsGroup Secret");
        assert!(!open_to_others(0o440));
        assert!(open_to_others(0o644));
        assert!(open_to_others(0o604));
        assert!(open_to_others(0o602));
    }

    fn token(text: &str) -> Token {
        Token::new(text).expect("a valid token")
    }

    #[test]
    fn tokens_are_trimmed_and_must_be_visible_ascii() {
        assert_eq!(token(" abc\n").expose(), "abc");
        assert!(Token::new("  \n").is_err());
        assert!(Token::new("two words").is_err());
        assert!(Token::new("caf\u{e9}").is_err());
        assert_eq!(format!("{:?}", token("secret")), "Token(<redacted>)");
    }

    #[test]
    fn any_accepted_token_matches_and_nothing_else() {
        let accepted = [token("old-token"), token("new-token")];
        assert!(token_matches(&accepted, b"old-token"));
        assert!(token_matches(&accepted, b"new-token"));
        assert!(!token_matches(&accepted, b"new-toke"));
        assert!(!token_matches(&accepted, b""));
        assert!(!token_matches(&[], b"new-token"));
    }

    fn checked(check: &mut TokenCheck, header: Option<&str>, tls: bool) -> Result<(), Status> {
        let mut request = Request::new(());
        request
            .extensions_mut()
            .insert(PeerInfo { remote: None, tls });
        if let Some(header) = header {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, header.parse().expect("ascii"));
        }
        check.call(request).map(|_| ())
    }

    #[test]
    fn the_check_names_each_refusal() {
        let mut check = TokenCheck::new(vec![token("s3cret")], true);
        assert!(checked(&mut check, Some("Bearer s3cret"), true).is_ok());
        let kind_and_message = |result: Result<(), Status>| {
            let status = result.expect_err("refused");
            (
                error_kinds::kind_of_status(&status),
                status.message().to_string(),
            )
        };
        let (kind, message) = kind_and_message(checked(&mut check, None, true));
        assert_eq!(kind, ErrorKind::Unauthenticated);
        assert!(message.contains("carried none"), "{message}");
        let (kind, message) = kind_and_message(checked(&mut check, Some("Bearer nope"), true));
        assert_eq!(kind, ErrorKind::Unauthenticated);
        assert!(message.contains("not one this daemon accepts"), "{message}");
        let (kind, message) = kind_and_message(checked(&mut check, Some("Bearer s3cret"), false));
        assert_eq!(kind, ErrorKind::Tls);
        assert!(message.contains("TLS only"), "{message}");
    }

    #[test]
    fn a_daemon_without_tokens_serves_every_call_and_the_client_attaches_its_own() {
        let mut open = TokenCheck::new(Vec::new(), false);
        assert!(checked(&mut open, None, false).is_ok());
        let mut attach = AttachToken::new(Some(token("s3cret")));
        let request = attach.call(Request::new(())).expect("attached");
        let header = request.metadata().get(AUTHORIZATION).expect("a header");
        assert_eq!(header.to_str().ok(), Some("Bearer s3cret"));
        let mut none = AttachToken::new(None);
        let request = none.call(Request::new(())).expect("passed");
        assert!(request.metadata().get(AUTHORIZATION).is_none());
    }
}
