//! Who may read the dashboard. On a loopback address given no credential, anyone on the machine,
//! through an address or `localhost` (its `Host`): a request naming another host reached it only
//! by DNS rebinding (a web page's own domain pointed at 127.0.0.1, read by a browser on this
//! machine) and gets `403`. Elsewhere, or on loopback given one (behind a proxy), only a
//! request that carries a dashboard credential: a read-only secret of its own (a daemon's
//! `--dashboard-token-file`, Python's `dashboard_token_file=`), never the RPC token, so a
//! credential seen on the dashboard's wire opens no gRPC call, and the RPC token opens no page.
//!
//! - a browser presents it once in the URL (`/?token=CREDENTIAL`); the answer is a redirect to
//!   the same URL without it, setting a session cookie named by the port
//!   (`stoker_dashboard_8321`, so that dashboards on one host keep theirs apart): `HttpOnly`,
//!   `SameSite=Strict`, expiring after [`COOKIE_LIFETIME`], `Secure` when the dashboard serves
//!   HTTPS. The cookie holds its
//!   expiry signed with a key drawn at start (HMAC-SHA256), so it holds nothing of the
//!   credential, cannot be extended, and every cookie ends with the process;
//! - a script or a Prometheus scraper sends `Authorization: Bearer CREDENTIAL`;
//! - `/metrics` alone may be left open with [`DashboardAccess::metrics_without_token`].
//!
//! Everything else gets `401` with a line saying how to present the credential.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ring::hmac;
use stoker_rpc::security::{token_matches, ServerSecurity, Token};

/// The start of the name of the cookie a browser keeps after presenting the credential; the
/// dashboard's port ends it (cookies are not kept apart by port: dashboards on one host, one
/// per rank say, would each overwrite the others' under one name).
const COOKIE: &str = "stoker_dashboard_";

/// How long a dashboard cookie opens the dashboard.
pub const COOKIE_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Who may read a dashboard bound to a non-loopback address, and how it is served.
#[derive(Debug, Clone, Default)]
pub struct DashboardAccess {
    /// Credentials that open it (read-only; keep them apart from the RPC tokens).
    pub credentials: Vec<Token>,
    /// Serve `/metrics` without a credential.
    pub metrics_without_token: bool,
    /// Serve HTTPS with this certificate (a daemon's, through [`ServerSecurity::for_http`]);
    /// `None` or a plaintext one: plain HTTP.
    pub tls: Option<ServerSecurity>,
}

impl DashboardAccess {
    /// Whether the dashboard serves HTTPS.
    pub fn serves_tls(&self) -> bool {
        self.tls.as_ref().is_some_and(ServerSecurity::serves_tls)
    }
}

/// The check every request passes, built once at start.
pub(crate) struct Gate {
    /// Bound to a loopback address: a request naming another host is refused (DNS
    /// rebinding), credential or not.
    loopback: bool,
    open: bool,
    /// The cookie's name: [`COOKIE`] and the port.
    cookie: String,
    metrics_open: bool,
    credentials: Arc<[Token]>,
    /// Signs the cookies this process hands out.
    cookie_key: hmac::Key,
    /// Cookies carry `Secure` (the dashboard serves HTTPS).
    secure: bool,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("open", &self.open)
            .field("metrics_open", &self.metrics_open)
            .field("credentials", &self.credentials.len())
            .field("secure", &self.secure)
            .finish_non_exhaustive()
    }
}

/// Seconds since the Unix epoch (0 on a clock set before it, which expires every cookie).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

impl Gate {
    /// The gate of a dashboard bound to `address`; fails only when the system has no
    /// randomness for the cookie key.
    pub(crate) fn new(address: SocketAddr, access: DashboardAccess) -> Result<Gate, String> {
        let cookie_key =
            hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
                .map_err(|_| "the system gave no randomness for the cookie key".to_string())?;
        Ok(Gate {
            // Given a credential, a loopback dashboard asks for it too: it may be reached
            // through a proxy on this machine.
            loopback: address.ip().is_loopback(),
            open: address.ip().is_loopback() && access.credentials.is_empty(),
            cookie: format!("{COOKIE}{}", address.port()),
            metrics_open: access.metrics_without_token,
            secure: access.serves_tls(),
            credentials: access.credentials.into(),
            cookie_key,
        })
    }

    /// A cookie value that opens the dashboard until `expires` (Unix seconds).
    fn cookie_value(&self, expires: u64) -> String {
        let expires = expires.to_string();
        let tag = hmac::sign(&self.cookie_key, expires.as_bytes());
        format!("{expires}.{}", hex(tag.as_ref()))
    }

    /// Whether `value` is a cookie this process signed that has not expired at `now`.
    fn cookie_valid(&self, value: &str, now: u64) -> bool {
        let Some((expires, tag)) = value.split_once('.') else {
            return false;
        };
        let (Ok(expiry), Some(tag)) = (expires.parse::<u64>(), unhex(tag)) else {
            return false;
        };
        expiry > now && hmac::verify(&self.cookie_key, expires.as_bytes(), &tag).is_ok()
    }

    /// The `Set-Cookie` header of a fresh session starting at `now`.
    fn set_cookie(&self, now: u64) -> String {
        let lifetime = COOKIE_LIFETIME.as_secs();
        let secure = if self.secure { "; Secure" } else { "" };
        format!(
            "{}={}; Max-Age={lifetime}; Path=/; HttpOnly; SameSite=Strict{secure}",
            self.cookie,
            self.cookie_value(now + lifetime)
        )
    }

    fn bearer_ok(&self, request: &Request) -> bool {
        request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
            .is_some_and(|credential| token_matches(&self.credentials, credential))
    }

    fn cookie_ok(&self, request: &Request) -> bool {
        let now = unix_now();
        request
            .headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|cookies| cookies.split(';'))
            .filter_map(|cookie| {
                cookie
                    .trim()
                    .strip_prefix(self.cookie.as_str())?
                    .strip_prefix('=')
            })
            .any(|value| self.cookie_valid(value, now))
    }
}

/// The middleware: passes a request the gate lets through, turns a good `?token=` into the
/// cookie and a redirect, refuses the rest.
pub(crate) async fn guard(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    if gate.loopback {
        if let Some(host) = foreign_host(&request) {
            tracing::warn!(%host, "loopback dashboard refused a request for another host");
            return (
                StatusCode::FORBIDDEN,
                [
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                    (header::CONNECTION, "close"),
                ],
                format!(
                    "this dashboard answers requests for its address or localhost, not {host}\n"
                ),
            )
                .into_response();
        }
    }
    if gate.open {
        return next.run(request).await;
    }
    if (gate.metrics_open && request.uri().path() == "/metrics")
        || gate.bearer_ok(&request)
        || gate.cookie_ok(&request)
    {
        return next.run(request).await;
    }
    let query = Query::<HashMap<String, String>>::try_from_uri(request.uri())
        .map(|Query(query)| query)
        .unwrap_or_default();
    let Some(presented) = query.get("token") else {
        return refused("this dashboard needs its credential");
    };
    if !token_matches(&gate.credentials, presented.as_bytes()) {
        tracing::warn!(
            path = request.uri().path(),
            "dashboard refused a wrong credential"
        );
        return refused("the credential in the URL is not one this dashboard accepts");
    }
    // The same page without the credential (by its decoded name: `tok%65n=` too), on this
    // dashboard: a path of `//host/...` would send the browser to another site.
    let rest: Vec<(String, String)> =
        form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
            .filter(|(name, _)| name != "token")
            .map(|(name, value)| (name.into_owned(), value.into_owned()))
            .collect();
    let mut location = format!("/{}", request.uri().path().trim_start_matches('/'));
    if !rest.is_empty() {
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&rest)
            .finish();
        location = format!("{location}?{query}");
    }
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let (Ok(location), Ok(cookie)) = (
        HeaderValue::from_str(&location),
        HeaderValue::from_str(&gate.set_cookie(unix_now())),
    ) {
        headers.insert(header::LOCATION, location);
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}

/// The host a request names (`Host`, or an HTTP/2 authority) when it is neither an address
/// nor `localhost`: a loopback dashboard reached under another name was reached by DNS
/// rebinding. None without a host (no browser sends such a request).
fn foreign_host(request: &Request) -> Option<String> {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_string()))?;
    (!is_local_name(&host)).then_some(host)
}

/// Whether `host` (a `Host` header: a name or address, maybe with a port) is an IP address,
/// `localhost` or a name under `.localhost`.
fn is_local_name(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    let lower = name.to_ascii_lowercase();
    name.parse::<std::net::IpAddr>().is_ok()
        || lower == "localhost"
        || lower.ends_with(".localhost")
}

fn refused(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, "Bearer"),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            // A refused client keeps no connection open for its next try.
            (header::CONNECTION, "close"),
        ],
        format!(
            "{why} (not the RPC token): open /?token=CREDENTIAL once (the browser then keeps \
             a cookie), or send Authorization: Bearer CREDENTIAL\n"
        ),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(secure: bool) -> Gate {
        let mut gate = Gate::new(SocketAddr::from(([0; 4], 0)), DashboardAccess::default())
            .expect("randomness");
        gate.secure = secure;
        gate
    }

    #[test]
    fn a_loopback_dashboard_answers_for_addresses_and_localhost_only() {
        for host in [
            "127.0.0.1:8321",
            "127.0.0.1",
            "[::1]:8321",
            "localhost:8321",
            "LOCALHOST",
            "app.localhost:80",
            "10.0.0.5:8321",
        ] {
            assert!(is_local_name(host), "{host}");
        }
        for host in [
            "evil.example:8321",
            "evil.example",
            "127.0.0.1.nip.io:8321",
            "localhost.evil.example",
        ] {
            assert!(!is_local_name(host), "{host}");
        }
    }

    #[test]
    fn a_cookie_opens_until_it_expires_and_only_as_signed() {
        let gate = gate(false);
        let now = 1_000_000;
        let value = gate.cookie_value(now + 60);
        assert!(gate.cookie_valid(&value, now));
        assert!(gate.cookie_valid(&value, now + 59));
        assert!(!gate.cookie_valid(&value, now + 60), "expired");
        // A later expiry with the old tag, a flipped tag bit, junk: refused.
        let (_, tag) = value.split_once('.').expect("dot");
        assert!(!gate.cookie_valid(&format!("{}.{tag}", now + 10_000), now));
        let mut flipped = value.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert!(!gate.cookie_valid(&String::from_utf8(flipped).expect("ascii"), now));
        for junk in ["", ".", "x.y", "123", "123.zz", "123.abc"] {
            assert!(!gate.cookie_valid(junk, now), "{junk:?}");
        }
        // Another process's key (another gate) does not accept this one's cookies.
        assert!(!self::gate(false).cookie_valid(&value, now));
    }

    /// Cookies are kept by host, not by port: two dashboards on one host (a rank each) under
    /// one name overwrote each other's, each tab then signed out.
    #[test]
    fn dashboards_on_other_ports_name_their_cookies_apart() {
        let on = |port: u16| {
            Gate::new(SocketAddr::from(([0; 4], port)), DashboardAccess::default())
                .expect("randomness")
        };
        let (first, second) = (on(8321), on(8322));
        let cookie = first.set_cookie(100);
        assert!(cookie.starts_with("stoker_dashboard_8321="), "{cookie}");
        assert!(second.set_cookie(100).starts_with("stoker_dashboard_8322="));
        // One dashboard reads its own cookie only, by name: `..._832` is not `..._8321`.
        let value = first.cookie_value(unix_now() + 60);
        let request = |pair: &str| {
            Request::builder()
                .header(header::COOKIE, pair)
                .body(axum::body::Body::empty())
                .expect("request")
        };
        assert!(first.cookie_ok(&request(&format!("a=1; stoker_dashboard_8321={value}"))));
        assert!(!first.cookie_ok(&request(&format!("stoker_dashboard_832={value}"))));
        assert!(!first.cookie_ok(&request(&format!("stoker_dashboard={value}"))));
    }

    #[test]
    fn the_cookie_header_carries_its_flags() {
        let plain = gate(false).set_cookie(100);
        assert!(plain.contains("; HttpOnly") && plain.contains("; SameSite=Strict"));
        assert!(plain.contains(&format!("; Max-Age={}", COOKIE_LIFETIME.as_secs())));
        assert!(!plain.contains("Secure"), "{plain}");
        assert!(gate(true).set_cookie(100).ends_with("; Secure"));
    }
}
