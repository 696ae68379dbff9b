//! Graceful leave with real processes: a worker stopped with SIGTERM mid-epoch turns its
//! `/readyz` to `draining`, finishes the leases it holds, leaves the coordinator and exits 0.
//! The coordinator's lease timeout is a minute and the clients reopen a session only after a
//! minute without a batch, so a drain that left a lease behind, or a stream that swallowed a
//! batch, would hold the epoch past the bound this test sets; every sample arrives once, with
//! the bytes of the embedded mode.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

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
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    common::make_images(&data, 200);
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
