//! Graceful leave with real processes: a worker stopped with SIGTERM mid-epoch turns its
//! `/readyz` to `draining`, finishes the leases it holds, leaves the coordinator and exits 0;
//! one whose client takes nothing still leaves within its drain timeout.
//! The coordinator's lease timeout is a minute and the clients reopen a session only after a
//! minute without a batch, so a drain that left a lease behind, or a stream that swallowed a
//! batch, would hold the epoch past the bound this test sets; every sample arrives once, with
//! the bytes of the embedded mode.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use stoker_proto::v1::{OpenSessionRequest, RegisterJobRequest, SessionUpdateRequest};

use crate::common::{self, Daemon};
use crate::distributed::{assert_matches_embedded, distributed_with, http_get};

/// The status code and body of `GET path`, or `None` when nothing listens.
fn probe(address: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// Waits up to 10 s for `/readyz` on `address` to answer 200.
fn wait_ready(address: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((200, body)) = probe(address, "/readyz") {
            assert_eq!(body, "ready\n");
            return;
        }
        assert!(Instant::now() < deadline, "{address} never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_worker_stopped_with_sigterm_drains_and_the_epoch_loses_and_duplicates_nothing() {
    let (dir, data) = common::images_in_tempdir(200);
    let state = dir.path().join("state");
    let coordinator = Daemon::coordinator_with(
        &state,
        "127.0.0.1:0",
        &[
            "--lease-timeout-ms",
            "60000",
            "--http",
            "127.0.0.1:0",
            "--health",
            "127.0.0.1:0",
        ],
    );
    let http = coordinator.banner_after("dashboard");
    wait_ready(&coordinator.banner_after("health"));
    assert_eq!(
        probe(&coordinator.banner_after("health"), "/livez"),
        Some((200, "live\n".to_string()))
    );
    let log = dir.path().join("leaving.log");
    let mut leaving = Daemon::worker_logging_to(
        &coordinator.address,
        dir.path(),
        &[
            "--health",
            "127.0.0.1:0",
            "--drain-timeout-ms",
            "15000",
            "-v",
        ],
        std::fs::File::create(&log).unwrap(),
    );
    let staying = Daemon::worker_with(
        &coordinator.address,
        dir.path(),
        &["--health", "127.0.0.1:0"],
    );
    let leaving_probes = leaving.banner_after("health");
    wait_ready(&leaving_probes);
    wait_ready(&staying.banner_after("health"));

    let started = Instant::now();
    let mut stopped_at = None;
    let mut watcher = None;
    // Clients that reopen a session only after a minute without a batch; a training step of
    // 15 ms lets work pile up at the workers, so the drain finds leases in flight.
    let got = distributed_with(&coordinator.address, &data, Duration::from_secs(60), || {
        // Watches the probe from before the signal until the worker is gone.
        let address = leaving_probes.clone();
        watcher = Some(std::thread::spawn(move || {
            let mut answers = Vec::new();
            while let Some(answer) = probe(&address, "/readyz") {
                if answers.last() != Some(&answer) {
                    answers.push(answer);
                }
            }
            answers
        }));
        leaving.terminate();
        stopped_at = Some(Instant::now());
    });
    // A lease left behind would wait for the minute of lease timeout, a swallowed batch for
    // the minute of stall_reopen.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(40), "the epoch took {took:?}");
    assert_matches_embedded(&data, &got);

    let waited = stopped_at.unwrap().elapsed();
    let status = leaving
        .wait_exit(Duration::from_secs(15).saturating_sub(waited))
        .expect("the drained worker exits within its drain timeout");
    assert!(status.success(), "it exits 0: {status:?}");
    // Ready (until the signal reached it), then draining until it exits.
    let mut answers = watcher.unwrap().join().unwrap();
    answers.retain(|answer| *answer != (200, "ready\n".to_string()));
    assert_eq!(answers, [(503, "draining\n".to_string())]);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("drained: left the coordinator"),
        "the worker left the coordinator: {log}"
    );
    assert!(
        !log.contains("did not finish in time"),
        "the drain finished in time: {log}"
    );
    // The dashboard's figures refresh on a timer.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !http_get(&http, "/metrics").contains("\nstoker_workers 1\n") {
        assert!(Instant::now() < deadline, "one worker left on /metrics");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sum of `stoker_job_leases_total` over the jobs on the coordinator's `/metrics`.
fn leases_so_far(http: &str) -> f64 {
    http_get(http, "/metrics")
        .lines()
        .filter(|line| line.starts_with("stoker_job_leases_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A client of the coordinator at `address` with a job over `data` registered and its
/// session open.
async fn open_session(
    address: &str,
    data: &std::path::Path,
) -> (
    stoker_proto::v1::coordinator_client::CoordinatorClient<tonic::transport::Channel>,
    Option<stoker_proto::v1::SessionToken>,
) {
    let mut client = common::coordinator_client(address).await;
    let job_id = client
        .register_job(RegisterJobRequest {
            spec: Some(common::train_spec(data, 4)),
            weight: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let session = client
        .open_session(OpenSessionRequest {
            job_id,
            ..OpenSessionRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session;
    (client, session)
}

#[test]
fn a_worker_whose_client_takes_nothing_still_leaves_within_its_drain_timeout() {
    let (dir, data) = common::images_in_tempdir(64);
    let coordinator = Daemon::coordinator_with(
        &dir.path().join("state"),
        "127.0.0.1:0",
        &["--lease-timeout-ms", "60000", "--http", "127.0.0.1:0"],
    );
    let http = coordinator.banner_after("dashboard");
    let log = dir.path().join("worker.log");
    // Each task waits up to a minute for a client stream, aside and unbuilt.
    let mut worker = Daemon::worker_logging_to(
        &coordinator.address,
        dir.path(),
        &[
            "--lease-ahead",
            "2",
            "--delivery-timeout-ms",
            "60000",
            "--drain-timeout-ms",
            "3000",
            "-v",
        ],
        std::fs::File::create(&log).unwrap(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A client that asks for eight batches and never opens its stream.
    runtime.block_on(async {
        let (mut client, session) = open_session(&coordinator.address, &data).await;
        client
            .update_session(SessionUpdateRequest {
                session,
                grant_credits: 8,
                ..SessionUpdateRequest::default()
            })
            .await
            .unwrap();
    });
    // Four leased, none holding a delivery: as many as the worker holds of one session's
    // tasks waiting for its stream (its lease calls then ask for none of that session's).
    let deadline = Instant::now() + Duration::from_secs(20);
    while leases_so_far(&http) < 4.0 {
        assert!(Instant::now() < deadline, "the worker leased four tasks");
        std::thread::sleep(Duration::from_millis(100));
    }
    // And no more than those and one call's more (before: all eight).
    std::thread::sleep(Duration::from_millis(1500));
    let leased = leases_so_far(&http);
    assert!(leased <= 6.0, "{leased} leased");
    worker.terminate();
    let status = worker
        .wait_exit(Duration::from_secs(6))
        .expect("the worker exits soon after its 3 s drain timeout");
    assert!(status.success(), "it exits 0: {status:?}");
    let log = std::fs::read_to_string(&log).unwrap();
    let left = log
        .lines()
        .find(|line| line.contains("drained: left the coordinator"))
        .unwrap_or_else(|| panic!("the worker left the coordinator: {log}"));
    // The tasks that waited on the client were handed back in the last report, before the
    // leave.
    assert!(left.contains("returned=0"), "{left}");
    for late in [
        "still waiting on their clients",
        "did not finish in time",
        "did not go through",
        "did not answer",
    ] {
        assert!(!log.contains(late), "the drain finished in time: {log}");
    }
}

/// A coordinator sent SIGTERM while a client keeps its session's update stream open (every live
/// client does, for as long as its session lasts) still exits 0 soon: it closes the connections
/// left after its 5 s grace and writes its journal. Before, it waited for them for good.
#[test]
fn a_coordinator_sent_sigterm_exits_though_a_client_keeps_its_session_stream_open() {
    let (dir, data) = common::images_in_tempdir(16);
    let mut coordinator = Daemon::coordinator(&dir.path().join("state"), "127.0.0.1:0");
    // The worker describes the job; the client's stream is what stays open.
    let _worker = Daemon::worker(&coordinator.address, dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (requests, stream) = runtime.block_on(async {
        let (mut client, session) = open_session(&coordinator.address, &data).await;
        let (requests, updates) = tokio::sync::mpsc::unbounded_channel();
        requests
            .send(SessionUpdateRequest {
                session,
                grant_credits: 1,
                ..SessionUpdateRequest::default()
            })
            .unwrap();
        let mut stream = client
            .update_session_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(
                updates,
            ))
            .await
            .unwrap()
            .into_inner();
        stream
            .message()
            .await
            .unwrap()
            .expect("the update is answered");
        (requests, stream)
    });
    coordinator.terminate();
    let status = coordinator
        .wait_exit(Duration::from_secs(15))
        .expect("the coordinator exits within its grace and its journal's write");
    assert!(status.success(), "it exits 0: {status:?}");
    drop((requests, stream));
}

/// A worker stopped while a job it was asked to open is stuck (its `s3://` store accepts the
/// connection and never answers) exits within its drain timeout: the stuck open does not hold
/// it. Before, dropping its runtime waited for that open, as long as the store's timeouts.
#[test]
fn a_worker_stopped_while_a_job_open_is_stuck_still_exits() {
    let dir = tempfile::tempdir().unwrap();
    // A "store" that takes connections and says nothing.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            held.push(stream);
        }
    });
    let coordinator = Daemon::coordinator(&dir.path().join("state"), "127.0.0.1:0");
    let args = [
        "--coordinator",
        coordinator.address.as_str(),
        "--data-root",
        dir.path().to_str().unwrap(),
        "--threads",
        "1",
        "--drain-timeout-ms",
        "1000",
    ];
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "key"),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
        ("AWS_REGION", "us-east-1"),
        ("STOKER_CACHE_DIR", dir.path().to_str().unwrap()),
    ];
    let mut worker = Daemon::start_with_env(common::worker_binary(), &args, Stdio::inherit(), &env);
    // Registering the job has the coordinator ask the worker to open it: the open waits on the
    // silent store (the registration with it; left behind).
    let address = coordinator.address.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut client = common::coordinator_client(&address).await;
            let _ = client
                .register_job(RegisterJobRequest {
                    spec: Some(common::spec_over(
                        "s3://bucket/shards",
                        stoker_pipeline::presets::imagenet_train(32),
                        4,
                    )),
                    weight: 0,
                })
                .await;
        });
    });
    std::thread::sleep(Duration::from_secs(2));
    worker.terminate();
    let status = worker
        .wait_exit(Duration::from_secs(10))
        .expect("the worker exits though an open is stuck");
    assert!(status.success(), "it exits 0: {status:?}");
}

/// SIGHUP (the terminal a daemon was started from closing) drains and stops a worker and the
/// coordinator as SIGTERM does, exit 0; it killed them, with no leave and no journal flush. A
/// daemon started under `nohup` keeps ignoring it.
#[test]
fn sighup_stops_the_daemons_as_sigterm_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut coordinator = Daemon::coordinator(&dir.path().join("state"), "127.0.0.1:0");
    let mut worker = Daemon::worker(&coordinator.address, dir.path());
    std::thread::sleep(Duration::from_millis(500));
    // Under `nohup` (SIGHUP ignored) it keeps running.
    let worker_binary = common::worker_binary();
    let root = dir.path().to_str().unwrap();
    let mut nohup = Daemon::start(
        "nohup",
        &[
            worker_binary.to_str().unwrap(),
            "--coordinator",
            coordinator.address.as_str(),
            "--data-root",
            root,
            "--threads",
            "1",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    nohup.signal(libc::SIGHUP);
    assert!(
        nohup.wait_exit(Duration::from_secs(2)).is_none(),
        "a worker under nohup ignores SIGHUP"
    );
    nohup.terminate();
    let status = nohup
        .wait_exit(Duration::from_secs(15))
        .expect("SIGTERM stops it");
    assert!(status.success(), "it exits 0: {status:?}");
    for daemon in [&mut worker, &mut coordinator] {
        daemon.signal(libc::SIGHUP);
        let status = daemon
            .wait_exit(Duration::from_secs(15))
            .expect("it stops on SIGHUP");
        assert!(status.success(), "it exits 0: {status:?}");
    }
}
