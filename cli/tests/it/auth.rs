//! The shared token and TLS with real daemons on 127.0.0.1: each refusal (no token, wrong
//! token, plaintext client on a TLS daemon, TLS client on a plaintext daemon, unknown CA) is
//! its own error on the client within seconds and its own line in the daemon's log; a job over
//! TLS with a token gives the embedded digest; the coordinator's dashboard off loopback wants a
//! credential of its own (the RPC token opens no page, the credential no RPC), over HTTPS where
//! the coordinator has a certificate. Certificates are generated per test (`bench::certificates`).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::fs::File;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use stoker_cli::bench::certificates::{write_test_certificates, TestCertificates};
use stoker_loader::{ErrorKind, Loader, LoaderOptions, RemoteOptions, COOKIE_LIFETIME};
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::worker_data_client::WorkerDataClient;
use stoker_proto::v1::{
    CloseSessionRequest, DescribeJobRequest, GetJobRequest, HeartbeatRequest, LeaseRequest,
    LeaveRequest, OpenSessionRequest, RegisterJobRequest, RegisterWorkerRequest, ReportRequest,
    SessionUpdateRequest, SubscribeRequest,
};
use stoker_rpc::security::{ClientSecurity, Token};
use stoker_rpc::transport;
use tonic::{Code, Status};

use crate::common::{self, Daemon};
use crate::dashboard::{get_over, http_get_with};

const TOKEN: &str = "0123456789abcdef-test-token";
/// The coordinator dashboard's credential in these tests.
const DASHBOARD: &str = "dashboard-credential-0123456789";

/// Longest a refusal may take to reach the client.
const PROMPT: Duration = Duration::from_secs(3);

fn write_token(dir: &Path, name: &str, token: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

fn certificates(dir: &Path) -> TestCertificates {
    std::fs::create_dir_all(dir).unwrap();
    write_test_certificates(dir, &["localhost", "127.0.0.1"]).unwrap()
}

/// The same, naming `localhost` only (no IP address).
fn localhost_certificates(dir: &Path) -> TestCertificates {
    std::fs::create_dir_all(dir).unwrap();
    write_test_certificates(dir, &["localhost"]).unwrap()
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A daemon's TLS flags: its certificate and key, and the CA its peers' certificates are
/// checked against.
fn tls_flags(pki: &TestCertificates) -> [&str; 6] {
    [
        "--tls-cert",
        path(&pki.cert),
        "--tls-key",
        path(&pki.key),
        "--tls-ca",
        path(&pki.ca),
    ]
}

/// A client's flags for the coordinator at `address` over TLS, checking `name` in its
/// certificate.
fn client_tls_flags<'a>(
    address: &'a str,
    pki: &'a TestCertificates,
    name: &'a str,
) -> [&'a str; 6] {
    [
        "--address",
        address,
        "--tls-ca",
        path(&pki.ca),
        "--tls-server-name",
        name,
    ]
}

/// A coordinator with `extra` flags, logging to `log`.
fn coordinator(dir: &Path, log: &Path, extra: &[&str]) -> Daemon {
    let state = dir.join(format!(
        "state-{}",
        log.file_stem().unwrap().to_string_lossy()
    ));
    Daemon::start_logging_to(
        env!("CARGO_BIN_EXE_stoker"),
        &coordinator_args(&state, extra),
        File::create(log).unwrap(),
    )
}

/// `stoker coordinator` on a free loopback port with its state in `state`, then `extra`.
fn coordinator_args<'a>(state: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--state",
        path(state),
    ];
    args.extend_from_slice(extra);
    args
}

/// Waits (up to [`PROMPT`]) for `log` to hold `needle`.
fn assert_logged(log: &Path, needle: &str) {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            started.elapsed() < PROMPT,
            "{} never logged {needle:?}; it logged:\n{text}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Registers a job with `options` and expects a refusal: its kind and message, fast.
fn refusal(address: &str, data: &Path, options: RemoteOptions) -> (ErrorKind, String) {
    let started = Instant::now();
    let attempt = Loader::remote(
        address,
        common::train_spec(data, 8),
        LoaderOptions::default(),
        RemoteOptions {
            connect_timeout: Duration::from_secs(30),
            ..options
        },
    );
    let error = match attempt {
        Ok(_) => panic!("the coordinator at {address} served a client it should refuse"),
        Err(error) => error,
    };
    assert!(
        started.elapsed() < PROMPT,
        "the refusal took {:?}: {error}",
        started.elapsed()
    );
    (error.kind(), error.to_string())
}

fn with_token(token: &str) -> RemoteOptions {
    RemoteOptions {
        token: Some(Token::new(token).unwrap()),
        ..RemoteOptions::default()
    }
}

#[test]
fn token_refusals_are_named_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let token_file = write_token(dir.path(), "token", TOKEN);
    let log = dir.path().join("coordinator.log");
    let coordinator = coordinator(dir.path(), &log, &["--token-file", path(&token_file)]);

    let (kind, message) = refusal(&coordinator.address, &data, RemoteOptions::default());
    assert_eq!(kind, ErrorKind::Unauthenticated, "{message}");
    assert!(message.contains("requires a token"), "{message}");
    assert_logged(&log, "the call carried none");

    let (kind, message) = refusal(&coordinator.address, &data, with_token("not-the-token"));
    assert_eq!(kind, ErrorKind::Unauthenticated, "{message}");
    assert!(message.contains("not one this daemon accepts"), "{message}");
    assert_logged(
        &log,
        "the token the call carried is not one this daemon accepts",
    );

    // A worker with the wrong token says so loudly, and never serves.
    let wrong = write_token(dir.path(), "wrong", "not-the-token");
    let worker_log = dir.path().join("worker.log");
    let _worker = Daemon::start_logging_to(
        common::worker_binary(),
        &[
            "--coordinator",
            &coordinator.address,
            "--data-root",
            path(dir.path()),
            "--token-file",
            path(&wrong),
        ],
        File::create(&worker_log).unwrap(),
    );
    assert_logged(&worker_log, "the coordinator refused this worker");
}

/// The code the coordinator at `address` answers a call for an unknown job with, when the call
/// carries `token`: `NOT_FOUND` once past the token check.
fn unknown_job_answer(address: &str, token: &str) -> tonic::Code {
    let security = ClientSecurity::new(Some(Token::new(token).unwrap()), None, None).unwrap();
    let runtime = common::runtime();
    runtime.block_on(async {
        let channel = transport::channel(address, &security).unwrap();
        let status = CoordinatorClient::new(channel)
            .open_session(OpenSessionRequest {
                job_id: 999,
                ..OpenSessionRequest::default()
            })
            .await
            .unwrap_err();
        status.code()
    })
}

#[test]
fn a_rotated_token_is_accepted_beside_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let old = write_token(dir.path(), "old", "old-token");
    let new = write_token(dir.path(), "new", "new-token");
    let log = dir.path().join("coordinator.log");
    let coordinator = coordinator(
        dir.path(),
        &log,
        &["--token-file", path(&new), "--token-file", path(&old)],
    );
    for token in ["old-token", "new-token"] {
        assert_eq!(
            unknown_job_answer(&coordinator.address, token),
            tonic::Code::NotFound
        );
    }
    assert_eq!(
        unknown_job_answer(&coordinator.address, "older-token"),
        tonic::Code::Unauthenticated
    );
}

#[test]
fn tls_refusals_are_named_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let pki = certificates(&dir.path().join("pki"));
    let stranger = certificates(&dir.path().join("stranger"));
    let token_file = write_token(dir.path(), "token", TOKEN);
    let tls_log = dir.path().join("tls.log");
    let tls = coordinator(
        dir.path(),
        &tls_log,
        &[&["--token-file", path(&token_file)][..], &tls_flags(&pki)].concat(),
    );

    // A plaintext client on the TLS coordinator.
    let tls_refusal = |ca: Option<&Path>, says: &str, logged: &str| {
        assert_tls_refusal(&tls.address, &data, ca, says, &tls_log, logged);
    };
    tls_refusal(
        None,
        "serves TLS only",
        "a plaintext client connected to this TLS daemon",
    );
    // A client that trusts another CA.
    tls_refusal(
        Some(&stranger.ca),
        "unknown CA",
        "it does not trust this daemon's certificate",
    );

    // A TLS client on a plaintext coordinator.
    let plain_log = dir.path().join("plain.log");
    let plain = coordinator(dir.path(), &plain_log, &["--token-file", path(&token_file)]);
    assert_tls_refusal(
        &plain.address,
        &data,
        Some(&pki.ca),
        "does not answer in TLS",
        &plain_log,
        "a TLS client connected to this plaintext daemon",
    );
}

/// Connects with the token and `ca` (None: plaintext) and expects a TLS refusal whose message
/// says `says`, while the daemon's `log` says `logged`.
fn assert_tls_refusal(
    address: &str,
    data: &Path,
    ca: Option<&Path>,
    says: &str,
    log: &Path,
    logged: &str,
) {
    let options = RemoteOptions {
        tls_ca: ca.map(Path::to_path_buf),
        ..with_token(TOKEN)
    };
    let (kind, message) = refusal(address, data, options);
    assert_eq!(kind, ErrorKind::Tls, "{message}");
    assert!(message.contains(says), "{message}");
    assert_logged(log, logged);
}

/// `stoker digest` of the fixture, with `extra` flags and `token` in STOKER_TOKEN.
fn digest(data: &Path, extra: &[&str], token: Option<&str>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stoker"));
    command
        .args([
            "digest",
            "--data",
            path(data),
            "--size",
            "32",
            "--batch-size",
            "8",
        ])
        .args(["--batches", "6", "--threads", "1"])
        .args(extra)
        .env_remove("STOKER_TOKEN");
    if let Some(token) = token {
        command.env("STOKER_TOKEN", token);
    }
    command.output().unwrap()
}

fn last_line(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout.lines().last().unwrap().to_string()
}

#[test]
fn a_job_over_tls_with_a_token_gives_the_embedded_digest() {
    let (dir, data) = common::images_in_tempdir(64);
    let pki = localhost_certificates(&dir.path().join("pki"));
    let token_file = write_token(dir.path(), "token", TOKEN);
    let security = [&["--token-file", path(&token_file)][..], &tls_flags(&pki)].concat();
    let coordinator = coordinator(dir.path(), &dir.path().join("coordinator.log"), &security);
    // The worker dials the coordinator at 127.0.0.1 and checks the name its certificate has.
    let coordinator_name = ["--tls-server-name", "localhost"];
    // The worker advertises a DNS name, which its certificate carries (a free port found
    // first: the advertised address must hold the port before the worker binds it).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let advertise = format!("localhost:{port}");
    let mut worker_args = vec![
        "--coordinator",
        &coordinator.address,
        "--data-root",
        path(dir.path()),
        "--threads",
        "1",
        "--listen",
        &listen,
        "--advertise",
        &advertise,
    ];
    worker_args.extend_from_slice(&security);
    worker_args.extend_from_slice(&coordinator_name);
    let _worker = Daemon::start_logging_to(
        common::worker_binary(),
        &worker_args,
        File::create(dir.path().join("worker.log")).unwrap(),
    );

    let embedded = last_line(&digest(&data, &[], None));
    // The coordinator's certificate names localhost only: the client dials 127.0.0.1 and checks
    // that name with --tls-server-name; the worker's address is a name its certificate has.
    let remote = client_tls_flags(&coordinator.address, &pki, "localhost");
    assert_eq!(last_line(&digest(&data, &remote, Some(TOKEN))), embedded);

    let started = Instant::now();
    let refused = digest(&data, &remote, None);
    assert!(!refused.status.success());
    assert!(started.elapsed() < Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("requires a token"), "{stderr}");
    assert!(stderr.contains("STOKER_TOKEN"), "{stderr}");
}

#[test]
fn a_wildcard_certificate_serves_every_name_under_it() {
    // deploy/ gives every worker the name <pod>.stoker-workers.<namespace>.svc... and one
    // certificate for `*.stoker-workers.<namespace>.svc...`: the same here, every daemon and
    // client checking a name under the wildcard (127.0.0.1 cannot resolve the real ones).
    let (dir, data) = common::images_in_tempdir(64);
    let pki_dir = dir.path().join("pki");
    std::fs::create_dir_all(&pki_dir).unwrap();
    let pki =
        write_test_certificates(&pki_dir, &["*.stoker-workers.ns.svc.cluster.local"]).unwrap();
    let token_file = write_token(dir.path(), "token", TOKEN);
    let under = "pod-1.stoker-workers.ns.svc.cluster.local";
    let security = [
        &["--token-file", path(&token_file)][..],
        &tls_flags(&pki),
        &["--tls-server-name", under],
    ]
    .concat();
    // The coordinator takes --tls-server-name too (it calls the workers to describe jobs).
    let coordinator = coordinator(dir.path(), &dir.path().join("coordinator.log"), &security);
    let _worker = Daemon::worker_logging_to(
        &coordinator.address,
        dir.path(),
        &security,
        File::create(dir.path().join("worker.log")).unwrap(),
    );
    let embedded = last_line(&digest(&data, &[], None));
    let remote = client_tls_flags(&coordinator.address, &pki, under);
    assert_eq!(last_line(&digest(&data, &remote, Some(TOKEN))), embedded);
    // A name outside the wildcard (one label deeper) is refused.
    let outside = RemoteOptions {
        tls_ca: Some(pki.ca.clone()),
        tls_server_name: Some(format!("a.{under}")),
        ..with_token(TOKEN)
    };
    let (kind, message) = refusal(&coordinator.address, &data, outside);
    assert_eq!(kind, ErrorKind::Tls, "{message}");
}

/// The dashboard's port, from the coordinator's banner (`... dashboard http://0.0.0.0:PORT`),
/// reached on 127.0.0.1.
fn dashboard_address(coordinator: &Daemon) -> SocketAddr {
    let url = coordinator.banner.split_whitespace().last().unwrap();
    let port = url.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Every RPC of the coordinator at `address`, and of the worker at `worker`, called with
/// `token`: each answer's code, by the RPC's name.
fn every_rpc_answers(address: &str, worker: &str, token: &str) -> Vec<(&'static str, Code)> {
    let security = ClientSecurity::new(Some(Token::new(token).unwrap()), None, None).unwrap();
    let runtime = common::runtime();
    runtime.block_on(async {
        let code = |answer: Result<(), Status>| answer.err().map_or(Code::Ok, |s| s.code());
        let mut coordinator =
            CoordinatorClient::new(transport::channel(address, &security).unwrap());
        let mut data = WorkerDataClient::new(transport::channel(worker, &security).unwrap());
        vec![
            (
                "RegisterWorker",
                code(
                    coordinator
                        .register_worker(RegisterWorkerRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "Heartbeat",
                code(
                    coordinator
                        .heartbeat(HeartbeatRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "Lease",
                code(coordinator.lease(LeaseRequest::default()).await.map(drop)),
            ),
            (
                "Report",
                code(coordinator.report(ReportRequest::default()).await.map(drop)),
            ),
            (
                "Leave",
                code(coordinator.leave(LeaveRequest::default()).await.map(drop)),
            ),
            (
                "GetJob",
                code(
                    coordinator
                        .get_job(GetJobRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "RegisterJob",
                code(
                    coordinator
                        .register_job(RegisterJobRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "OpenSession",
                code(
                    coordinator
                        .open_session(OpenSessionRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "UpdateSession",
                code(
                    coordinator
                        .update_session(SessionUpdateRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "CloseSession",
                code(
                    coordinator
                        .close_session(CloseSessionRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "DescribeJob",
                code(
                    data.describe_job(DescribeJobRequest::default())
                        .await
                        .map(drop),
                ),
            ),
            (
                "Subscribe",
                code(data.subscribe(SubscribeRequest::default()).await.map(drop)),
            ),
        ]
    })
}

/// A coordinator whose dashboard listens off loopback, guarded by `credential_file`, its RPCs
/// by `token_file`; `extra` flags after those.
/// The RPC token's file and the dashboard credential's, written in `dir`.
struct Keys {
    token: PathBuf,
    credential: PathBuf,
}

fn keys(dir: &Path) -> Keys {
    Keys {
        token: write_token(dir, "token", TOKEN),
        credential: write_token(dir, "dashboard", DASHBOARD),
    }
}

fn guarded_coordinator(dir: &Path, log: &str, keys: &Keys, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--http",
        "0.0.0.0:0",
        "--token-file",
        path(&keys.token),
        "--dashboard-token-file",
        path(&keys.credential),
    ];
    args.extend_from_slice(extra);
    coordinator(dir, &dir.join(log), &args)
}

/// The dashboard credential and the RPC token are two keys: each opens its own door only.
#[test]
fn the_dashboard_off_loopback_wants_its_own_credential_then_a_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    let guarded = guarded_coordinator(dir.path(), "guarded.log", &keys, &[]);
    assert!(
        guarded.banner.contains(" dashboard http://"),
        "{}",
        guarded.banner
    );
    let http = dashboard_address(&guarded);
    let refused = http_get_with(http, "/", &[]);
    assert_eq!(refused.status, 401);
    assert!(refused.body.contains("?token="), "{}", refused.body);
    assert_eq!(http_get_with(http, "/metrics", &[]).status, 401);
    assert_eq!(http_get_with(http, "/?token=wrong", &[]).status, 401);
    // A refusal closes its connection, though the client asked to keep it: a client without
    // the credential holds none open (it held its connections for the head timeout, 20 s).
    let mut kept = std::net::TcpStream::connect(http).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(kept, "GET /metrics HTTP/1.1\r\nHost: {http}\r\n\r\n").unwrap();
    let started = Instant::now();
    let mut answer = String::new();
    kept.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // The RPC token opens no page: not in the URL, not as a bearer.
    assert_eq!(
        http_get_with(http, &format!("/?token={TOKEN}"), &[]).status,
        401
    );
    let rpc_bearer = format!("Bearer {TOKEN}");
    for page in ["/", "/api/jobs", "/metrics"] {
        let answer = http_get_with(http, page, &[("Authorization", &rpc_bearer)]);
        assert_eq!(answer.status, 401, "{page} opened with the RPC token");
    }

    let welcomed = http_get_with(http, &format!("/?token={DASHBOARD}"), &[]);
    assert_eq!(welcomed.status, 303);
    assert_eq!(welcomed.headers["location"], "/");
    let cookie = &welcomed.headers["set-cookie"];
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(
            cookie.split("; ").any(|part| part == flag),
            "{flag}: {cookie}"
        );
    }
    let max_age = format!("Max-Age={}", COOKIE_LIFETIME.as_secs());
    assert!(cookie.split("; ").any(|part| part == max_age), "{cookie}");
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    assert!(
        !cookie.contains(DASHBOARD) && !cookie.contains(TOKEN),
        "the cookie holds neither secret: {cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    assert_eq!(http_get_with(http, "/", &[("Cookie", pair)]).status, 200);
    assert_eq!(
        http_get_with(http, "/api/jobs", &[("Cookie", pair)]).status,
        200
    );
    // A cookie whose expiry was pushed out no longer matches its signature.
    let (name, value) = pair.split_once('=').unwrap();
    assert_eq!(
        name,
        format!("stoker_dashboard_{}", http.port()),
        "named by its port"
    );
    let (expiry, tag) = value.split_once('.').unwrap();
    let later = format!("{name}={}.{tag}", expiry.parse::<u64>().unwrap() + 3600);
    assert_eq!(http_get_with(http, "/", &[("Cookie", &later)]).status, 401);
    let bearer = format!("Bearer {DASHBOARD}");
    assert_eq!(
        http_get_with(http, "/metrics", &[("Authorization", &bearer)]).status,
        200
    );

    // The dashboard credential opens no RPC, on the coordinator or on a worker.
    let worker = Daemon::worker_logging_to(
        &guarded.address,
        dir.path(),
        &["--token-file", path(&keys.token)],
        File::create(dir.path().join("worker.log")).unwrap(),
    );
    for (rpc, code) in every_rpc_answers(&guarded.address, &worker.address, DASHBOARD) {
        assert_eq!(
            code,
            Code::Unauthenticated,
            "{rpc} with the dashboard credential"
        );
    }
    // The same calls with the RPC token get past the check (to their own answers).
    for (rpc, code) in every_rpc_answers(&guarded.address, &worker.address, TOKEN) {
        assert_ne!(code, Code::Unauthenticated, "{rpc} with the RPC token");
    }

    let scraped = guarded_coordinator(
        dir.path(),
        "scraped.log",
        &keys,
        &["--metrics-without-token"],
    );
    let http = dashboard_address(&scraped);
    assert_eq!(http_get_with(http, "/metrics", &[]).status, 200);
    assert_eq!(http_get_with(http, "/", &[]).status, 401);

    // Off loopback without a dashboard credential (an RPC token is not one), or with one that
    // is also the RPC token, the coordinator does not start.
    for (name, extra) in [
        ("no-credential", vec!["--token-file", path(&keys.token)]),
        (
            "same-as-rpc",
            vec![
                "--token-file",
                path(&keys.token),
                "--dashboard-token-file",
                path(&keys.token),
            ],
        ),
    ] {
        let state = dir.path().join(format!("state-{name}"));
        let mut args = coordinator_args(&state, &["--http", "0.0.0.0:0"]);
        args.extend(extra);
        let open = common::stoker(&args);
        assert!(!open.status.success(), "{name}");
        let stderr = String::from_utf8_lossy(&open.stderr);
        let expected = match name {
            "no-credential" => "needs a dashboard credential",
            _ => "must differ from the RPC token",
        };
        assert!(stderr.contains(expected), "{name}: {stderr}");
    }
}

/// `GET path` over TLS from the dashboard at `address`, trusting `ca` for `localhost`.
fn https_get_with(
    address: SocketAddr,
    ca: &Path,
    path: &str,
    headers: &[(&str, &str)],
) -> crate::dashboard::Response {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(certificate.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connection = rustls::ClientConnection::new(
        std::sync::Arc::new(config),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let tcp = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    get_over(&mut stream, "localhost", path, headers)
}

/// A coordinator with a certificate serves its dashboard over HTTPS only, and its cookie is
/// `Secure`.
#[test]
fn the_dashboard_of_a_tls_coordinator_serves_https_with_a_secure_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certificates(&dir.path().join("pki"));
    let keys = keys(dir.path());
    let coordinator = guarded_coordinator(dir.path(), "coordinator.log", &keys, &tls_flags(&pki));
    assert!(
        coordinator.banner.contains(" dashboard https://"),
        "{}",
        coordinator.banner
    );
    let http = dashboard_address(&coordinator);
    assert_eq!(https_get_with(http, &pki.ca, "/", &[]).status, 401);
    let welcomed = https_get_with(http, &pki.ca, &format!("/?token={DASHBOARD}"), &[]);
    assert_eq!(welcomed.status, 303);
    let cookie = &welcomed.headers["set-cookie"];
    for flag in ["Secure", "HttpOnly", "SameSite=Strict"] {
        assert!(
            cookie.split("; ").any(|part| part == flag),
            "{flag}: {cookie}"
        );
    }
    let pair = cookie.split(';').next().unwrap();
    assert_eq!(
        https_get_with(http, &pki.ca, "/api/jobs", &[("Cookie", pair)]).status,
        200
    );
    // Plain HTTP to it is never answered in clear.
    let mut plain = std::net::TcpStream::connect_timeout(&http, Duration::from_secs(5)).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request =
        format!("GET /?token={DASHBOARD} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    // The dashboard drops the connection: the write may already meet a reset.
    let _ = plain.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1.1"),
        "answered plain HTTP: {}",
        String::from_utf8_lossy(&answer)
    );
}

#[test]
fn a_daemon_off_loopback_without_a_token_warns_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("coordinator.log");
    let state = dir.path().join("state");
    let _coordinator = Daemon::start_logging_to(
        env!("CARGO_BIN_EXE_stoker"),
        &[
            "coordinator",
            "--listen",
            "0.0.0.0:0",
            "--state",
            path(&state),
        ],
        File::create(&log).unwrap(),
    );
    assert_logged(&log, "WITHOUT A TOKEN");
}

#[test]
fn bench_transport_states_tls_beside_plaintext() {
    let out = common::stdout_of(&[
        "bench",
        "transport",
        "--tls",
        "--batch-mib",
        "1",
        "--total-mib",
        "32",
        "--json",
    ]);
    assert!(
        out.contains("(plaintext, into slots)") && out.contains("% of plaintext"),
        "{out}"
    );
    assert!(out.contains("baseline: tonic's codec"), "{out}");
    let report: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let plaintext = report["stream_gb_per_s"].as_f64().unwrap();
    let tls = report["tls_stream_gb_per_s"].as_f64().unwrap();
    assert!(plaintext > 0.0 && tls > 0.0, "{report}");
    let ratio = report["tls_over_plaintext"].as_f64().unwrap();
    assert!((ratio - tls / plaintext).abs() < 1e-9, "{report}");
    let socket = report["socket_gb_per_s"].as_f64().unwrap();
    assert!(
        report["socket_64k_gb_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let of_socket = report["of_socket"].as_f64().unwrap();
    assert!(
        socket > 0.0 && (of_socket - plaintext / socket).abs() < 1e-9,
        "{report}"
    );
    assert!(out.contains("plain TCP, no protocol"), "{out}");
    let tonic = report["tonic_gb_per_s"].as_f64().unwrap();
    let speedup = report["speedup_over_tonic"].as_f64().unwrap();
    assert!(
        tonic > 0.0 && (speedup - plaintext / tonic).abs() < 1e-9,
        "{report}"
    );
}

/// The coordinator command lines of the top README, joined across their `\` continuations.
fn readme_coordinator_commands() -> Vec<String> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(readme).unwrap();
    let mut commands = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with("stoker coordinator ") {
            continue;
        }
        let mut command = line.to_string();
        while command.ends_with('\\') {
            command.pop();
            command.push(' ');
            command.push_str(lines.next().unwrap_or_default().trim());
        }
        commands.push(command);
    }
    commands
}

/// The README's coordinator commands start as written, its files and ports put in place
/// (optional flags in brackets given): two of them served a dashboard off loopback without
/// its credential, which the coordinator refuses as it starts.
#[test]
fn the_readmes_coordinator_commands_start_as_written() {
    let commands = readme_coordinator_commands();
    assert!(commands.len() >= 2, "{commands:?}");
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    let pki = certificates(&dir.path().join("pki"));
    for (n, command) in commands.iter().enumerate() {
        let state = dir.path().join(format!("state-{n}"));
        let args: Vec<String> = command
            .split_whitespace()
            .skip(1)
            .map(|word| match word.trim_matches(['[', ']']) {
                "/var/lib/stoker" => path(&state).to_string(),
                "/etc/stoker/token" => path(&keys.token).to_string(),
                "/etc/stoker/dashboard-token" => path(&keys.credential).to_string(),
                "coord.pem" => path(&pki.cert).to_string(),
                "coord.key" => path(&pki.key).to_string(),
                "ca.pem" => path(&pki.ca).to_string(),
                // Its own port, on the interface the README names.
                address if address.contains(':') => {
                    format!("{}:0", address.rsplit_once(':').unwrap().0)
                }
                other => other.to_string(),
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let log = dir.path().join(format!("coordinator-{n}.log"));
        let file = File::create(&log).unwrap();
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Daemon::start_logging_to(env!("CARGO_BIN_EXE_stoker"), &args, file)
        }));
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let mut daemon =
            started.unwrap_or_else(|_| panic!("the README's `{command}` does not start: {logged}"));
        assert!(
            daemon.wait_exit(Duration::from_millis(500)).is_none(),
            "the README's `{command}` exited: {logged}"
        );
    }
}
