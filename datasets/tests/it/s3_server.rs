//! A real S3-compatible server for tests: s3s-fs over a folder (one subfolder per bucket),
//! served with hyper on 127.0.0.1 from its own thread, counting the requests it answers. It
//! can be stopped (every connection dropped at once) and restarted on the same port, by the
//! test or by itself after a given number of object GETs.
//!
//! A module of the datasets integration tests, also `#[path]`-included by the loader's.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnectionBuilder;

/// The credentials the server accepts.
pub const ACCESS_KEY: &str = "stoker-test-key";
/// The secret of [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "stoker-test-secret";

/// What the server has answered (over all its restarts).
#[derive(Debug, Default)]
pub struct RequestCounts {
    /// GETs of an object (ranged or whole).
    pub object_gets: AtomicU64,
    /// Listings (GET on a bucket).
    pub lists: AtomicU64,
    /// Each listing's query string (its prefix and delimiter), in order.
    pub list_queries: std::sync::Mutex<Vec<String>>,
    /// HEADs.
    pub heads: AtomicU64,
    /// Everything else.
    pub other: AtomicU64,
    /// Stop the server when `object_gets` reaches this (0: never).
    pub stop_at_object_get: AtomicU64,
    /// Set when the server stopped by itself.
    pub stopped_by_itself: AtomicBool,
    /// GETs of objects whose key ends with this are refused as unsigned requests are (403
    /// AccessDenied, as a store answers a token that expired); `None` (default): none.
    pub refuse_gets_ending: std::sync::Mutex<Option<String>>,
}

impl RequestCounts {
    pub fn object_gets(&self) -> u64 {
        self.object_gets.load(Ordering::SeqCst)
    }
}

struct Running {
    shutdown: Arc<tokio::sync::Notify>,
    thread: JoinHandle<()>,
}

/// The server; stops when dropped.
pub struct S3Server {
    root: PathBuf,
    port: u16,
    running: Option<Running>,
    pub counts: Arc<RequestCounts>,
}

impl S3Server {
    /// Serves `root` (created if missing) on an ephemeral port.
    pub fn start(root: &Path) -> S3Server {
        std::fs::create_dir_all(root).unwrap();
        let counts = Arc::new(RequestCounts::default());
        let (running, port) = serve(root.to_path_buf(), 0, Arc::clone(&counts));
        S3Server {
            root: root.to_path_buf(),
            port,
            running: Some(running),
            counts,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The folder of `bucket` (created): files put there are objects.
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        let dir = self.root.join(bucket);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Stops serving and drops every open connection.
    pub fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown.notify_one();
            running.thread.join().unwrap();
        }
    }

    /// Waits (up to `timeout`) for the server to stop by itself (see
    /// [`RequestCounts::stop_at_object_get`]), then joins its thread.
    pub fn wait_until_stopped_by_itself(&mut self, timeout: Duration) {
        let started = Instant::now();
        while !self.counts.stopped_by_itself.load(Ordering::SeqCst) {
            assert!(
                started.elapsed() < timeout,
                "the server did not stop by itself"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop();
    }

    /// Serves again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let (running, port) = serve(self.root.clone(), self.port, Arc::clone(&self.counts));
        assert_eq!(port, self.port);
        self.running = Some(running);
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the server thread on `port` (0: any) and returns once it listens.
fn serve(root: PathBuf, port: u16, counts: Arc<RequestCounts>) -> (Running, u16) {
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let (bound_sender, bound) = mpsc::channel();
    let stop = Arc::clone(&shutdown);
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = bind(port).await;
            bound_sender
                .send(listener.local_addr().unwrap().port())
                .unwrap();
            let service = {
                let mut builder =
                    s3s::service::S3ServiceBuilder::new(s3s_fs::FileSystem::new(&root).unwrap());
                builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
                builder.build()
            };
            loop {
                let socket = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((socket, _)) => socket,
                        Err(_) => continue,
                    },
                    () = stop.notified() => break,
                };
                let s3 = service.clone();
                let counts = Arc::clone(&counts);
                let stop = Arc::clone(&stop);
                let counted = hyper::service::service_fn(move |mut request| {
                    count(&counts, &stop, &request);
                    refuse_if_asked(&counts, &mut request);
                    let s3 = s3.clone();
                    async move { hyper::service::Service::call(&s3, request).await }
                });
                tokio::spawn(async move {
                    let _ = ConnectionBuilder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(socket), counted)
                        .await;
                });
            }
        });
        // Dropping the runtime drops every connection task, and so their sockets.
        drop(runtime);
    });
    let port = bound
        .recv_timeout(Duration::from_secs(10))
        .expect("the test server listens");
    (Running { shutdown, thread }, port)
}

/// Binds 127.0.0.1:`port` with SO_REUSEADDR (a restart reuses the port at once), retrying
/// briefly while the old socket goes away.
async fn bind(port: u16) -> tokio::net::TcpListener {
    let started = Instant::now();
    loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        let bound = socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .and_then(|()| socket.listen(128));
        match bound {
            Ok(listener) => return listener,
            Err(error) if started.elapsed() < Duration::from_secs(10) => {
                let _ = error;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("cannot bind 127.0.0.1:{port}: {error}"),
        }
    }
}

/// Takes the signature off an object GET [`RequestCounts::refuse_gets_ending`] names: the
/// server then refuses it.
fn refuse_if_asked<B>(counts: &RequestCounts, request: &mut hyper::Request<B>) {
    let refused = counts
        .refuse_gets_ending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    if let Some(ending) = refused {
        if request.method() == hyper::Method::GET && request.uri().path().ends_with(&ending) {
            request.headers_mut().remove(hyper::header::AUTHORIZATION);
        }
    }
}

fn count<B>(counts: &RequestCounts, stop: &tokio::sync::Notify, request: &hyper::Request<B>) {
    let segments = request
        .uri()
        .path()
        .split('/')
        .filter(|segment| !segment.is_empty())
        .count();
    let counter = match (request.method().as_str(), segments) {
        ("GET", 0 | 1) => &counts.lists,
        ("GET", _) => &counts.object_gets,
        ("HEAD", _) => &counts.heads,
        _ => &counts.other,
    };
    if std::ptr::eq(counter, &counts.lists) {
        let query = request.uri().query().unwrap_or_default().to_string();
        counts
            .list_queries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(query);
    }
    let now = counter.fetch_add(1, Ordering::SeqCst) + 1;
    let stop_at = counts.stop_at_object_get.load(Ordering::SeqCst);
    if std::ptr::eq(counter, &counts.object_gets) && stop_at != 0 && now == stop_at {
        counts.stopped_by_itself.store(true, Ordering::SeqCst);
        stop.notify_one();
    }
}
