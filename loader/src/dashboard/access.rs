//! Who may read the dashboard. On a loopback address, anyone on the machine (as before the
//! token existed). Elsewhere, only a request that carries the daemon's token:
//!
//! - a browser presents it once in the URL (`/?token=TOKEN`); the answer is a redirect to the
//!   same URL without it, setting an `HttpOnly`, `SameSite=Strict` cookie that holds a digest
//!   of the token (the cookie opens the dashboard, never the gRPC services);
//! - a script or a Prometheus scraper sends `Authorization: Bearer TOKEN`;
//! - `/metrics` alone may be left open with [`DashboardAccess::metrics_without_token`].
//!
//! Everything else gets `401` with a line saying how to present the token.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use stoker_worker::security::{token_matches, Token};

/// The cookie a browser keeps after presenting the token.
const COOKIE: &str = "stoker_dashboard";

/// Who may read a dashboard bound to a non-loopback address.
#[derive(Debug, Clone, Default)]
pub struct DashboardAccess {
    /// Tokens that open it (the daemon's `--token-file` tokens).
    pub tokens: Vec<Token>,
    /// Serve `/metrics` without a token.
    pub metrics_without_token: bool,
}

/// The check every request passes, built once at start.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    open: bool,
    metrics_open: bool,
    tokens: Arc<[Token]>,
    cookies: Arc<[Token]>,
}

/// The cookie value of `token`: a digest, so a cookie that leaks opens the dashboard only.
fn cookie_value(token: &Token) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"stoker-dashboard\0");
    hasher.update(token.expose().as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

impl Gate {
    /// The gate of a dashboard bound to `address`.
    pub(crate) fn new(address: SocketAddr, access: DashboardAccess) -> Gate {
        let cookies: Vec<Token> = access
            .tokens
            .iter()
            .filter_map(|token| Token::new(&cookie_value(token)).ok())
            .collect();
        Gate {
            open: address.ip().is_loopback(),
            metrics_open: access.metrics_without_token,
            tokens: access.tokens.into(),
            cookies: cookies.into(),
        }
    }

    fn bearer_ok(&self, request: &Request) -> bool {
        request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
            .is_some_and(|token| token_matches(&self.tokens, token))
    }

    fn cookie_ok(&self, request: &Request) -> bool {
        request
            .headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|cookies| cookies.split(';'))
            .filter_map(|cookie| cookie.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .any(|value| token_matches(&self.cookies, value.as_bytes()))
    }
}

/// The middleware: passes a request the gate lets through, turns a good `?token=` into the
/// cookie and a redirect, refuses the rest.
pub(crate) async fn guard(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    if gate.open
        || (gate.metrics_open && request.uri().path() == "/metrics")
        || gate.bearer_ok(&request)
        || gate.cookie_ok(&request)
    {
        return next.run(request).await;
    }
    let query = Query::<HashMap<String, String>>::try_from_uri(request.uri())
        .map(|Query(query)| query)
        .unwrap_or_default();
    let Some(presented) = query.get("token") else {
        return refused("this dashboard needs the coordinator's token");
    };
    let Some(token) = gate
        .tokens
        .iter()
        .find(|token| token_matches(std::slice::from_ref(token), presented.as_bytes()))
    else {
        tracing::warn!(
            path = request.uri().path(),
            "dashboard refused a wrong token"
        );
        return refused("the token in the URL is not one this coordinator accepts");
    };
    let rest: Vec<String> = request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("token="))
        .map(str::to_string)
        .collect();
    let mut location = request.uri().path().to_string();
    if !rest.is_empty() {
        location = format!("{location}?{}", rest.join("&"));
    }
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
        cookie_value(token)
    );
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let (Ok(location), Ok(cookie)) = (
        HeaderValue::from_str(&location),
        HeaderValue::from_str(&cookie),
    ) {
        headers.insert(header::LOCATION, location);
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}

fn refused(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, "Bearer"),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
        ],
        format!(
            "{why}: open /?token=TOKEN once (the browser then keeps a cookie), or send \
             Authorization: Bearer TOKEN\n"
        ),
    )
        .into_response()
}
