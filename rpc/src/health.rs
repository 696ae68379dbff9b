//! The probes of both daemons (`--health HOST:PORT`): plain HTTP on a port of its own, for a
//! kubelet or a load balancer, never behind the token or TLS (a probe carries neither), and
//! answering nothing but the daemon's state.
//!
//! - `GET /livez`: `200 live` while the daemon's runtime answers at all.
//! - `GET /readyz`: `200 ready`, or `503` with the reason on one line (`draining`, `not
//!   registered with the coordinator`, `stopping`).

use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

/// Whether a daemon should be sent work, and if not why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Serving.
    Ready,
    /// Not serving new work, for the reason given.
    NotReady(String),
}

/// The state the probes report, shared between the daemon and its health server.
#[derive(Debug)]
pub struct Health {
    readiness: Mutex<Readiness>,
}

impl Health {
    /// A daemon not ready yet, for `reason`.
    pub fn starting(reason: &str) -> Arc<Health> {
        Arc::new(Health {
            readiness: Mutex::new(Readiness::NotReady(reason.to_string())),
        })
    }

    /// A daemon ready from the start.
    pub fn ready() -> Arc<Health> {
        Arc::new(Health {
            readiness: Mutex::new(Readiness::Ready),
        })
    }

    /// The daemon serves.
    pub fn set_ready(&self) {
        self.set(Readiness::Ready);
    }

    /// The daemon takes no new work, for `reason`.
    pub fn set_not_ready(&self, reason: &str) {
        self.set(Readiness::NotReady(reason.to_string()));
    }

    fn set(&self, readiness: Readiness) {
        let mut current = self.readiness.lock().unwrap_or_else(|p| p.into_inner());
        if *current != readiness {
            tracing::debug!(?readiness, "readiness changed");
            *current = readiness;
        }
    }

    /// What `/readyz` answers now.
    pub fn readiness(&self) -> Readiness {
        self.readiness
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Serves `/livez` and `/readyz` on `listener` until the task is dropped.
pub async fn serve_health(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { (StatusCode::OK, "live\n") }))
        .route(
            "/readyz",
            get(move || {
                let health = health.clone();
                async move {
                    match health.readiness() {
                        Readiness::Ready => (StatusCode::OK, "ready\n".to_string()),
                        Readiness::NotReady(reason) => {
                            (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n"))
                        }
                    }
                }
            }),
        );
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(address: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn probes_answer_the_state_the_daemon_sets() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let health = Health::starting("not registered with the coordinator");
        let server = tokio::spawn(serve_health(listener, health.clone()));
        let live = get(address, "/livez").await;
        assert!(
            live.starts_with("HTTP/1.1 200") && live.ends_with("live\n"),
            "{live}"
        );
        let ready = get(address, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(
            ready.ends_with("not registered with the coordinator\n"),
            "{ready}"
        );
        health.set_ready();
        let ready = get(address, "/readyz").await;
        assert!(
            ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready\n"),
            "{ready}"
        );
        health.set_not_ready("draining");
        let ready = get(address, "/readyz").await;
        assert!(
            ready.starts_with("HTTP/1.1 503") && ready.ends_with("draining\n"),
            "{ready}"
        );
        assert!(get(address, "/").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
