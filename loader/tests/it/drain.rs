//! Graceful leave with real processes: a worker stopped with SIGTERM mid-epoch turns its
//! `/readyz` to `draining`, finishes the leases it holds, leaves the coordinator and exits 0.
//! The coordinator's lease timeout is a minute and the clients reopen a session only after a
//! minute without a batch, so a drain that left a lease behind, or a stream that swallowed a
//! batch, would hold the epoch past the bound this test sets; every sample arrives once, with
//! the bytes of the embedded mode.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use stoker_loader::{BatchDigest, Loader, LoaderOptions, RemoteOptions};

use crate::common::{self, Daemon};
use crate::distributed::{embedded, http_get, spec};

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

/// A remote loader that reopens its session only after a minute without a batch.
fn patient(address: &str, rank: u32, data: &std::path::Path) -> Loader {
    Loader::remote(
        address,
        spec(data, rank),
        LoaderOptions {
            prefetch: 4,
            deadline: Duration::from_secs(120),
            ..LoaderOptions::default()
        },
        RemoteOptions {
            connect_timeout: Duration::from_secs(30),
            stall_reopen: Duration::from_secs(60),
            worker_grace: Duration::from_secs(60),
            ..RemoteOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn a_worker_stopped_with_sigterm_drains_and_the_epoch_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    common::make_images(&data, 200);
    let state = dir.path().join("state");
    let coordinator = Daemon::start(
        env!("CARGO_BIN_EXE_stoker"),
        &[
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--state",
            state.to_str().unwrap(),
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
    let root = dir.path().to_str().unwrap();
    let mut leaving = Daemon::start_logging_to(
        common::worker_binary(),
        &[
            "--coordinator",
            &coordinator.address,
            "--data-root",
            root,
            "--threads",
            "1",
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

    let loaders: Vec<Loader> = (0..2)
        .map(|rank| patient(&coordinator.address, rank, &data))
        .collect();
    let mut streams: Vec<_> = loaders.iter().map(|l| l.epoch(0, 0).unwrap()).collect();
    let steps = loaders[0].steps_per_epoch();
    let mut digests = vec![BatchDigest::new(), BatchDigest::new()];
    let mut seen = vec![BTreeMap::new(), BTreeMap::new()];
    let started = Instant::now();
    let mut stopped_at = None;
    let mut watcher = None;
    for step in 0..steps {
        if step == steps / 2 {
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
        }
        for rank in 0..2 {
            let batch = streams[rank].next_batch().unwrap().expect("a batch");
            assert_eq!(batch.step, step, "rank {rank} yields in step order");
            digests[rank].update(&batch);
            assert!(
                seen[rank]
                    .insert(batch.step, batch.sample_indices.clone())
                    .is_none(),
                "rank {rank} step {step} delivered twice"
            );
        }
        // A training step: work piles up at the workers, so the drain finds leases in flight.
        std::thread::sleep(Duration::from_millis(15));
    }
    for stream in &mut streams {
        assert!(stream.next_batch().unwrap().is_none(), "the epoch ends");
    }
    // A lease left behind would wait for the minute of lease timeout, a swallowed batch for
    // the minute of stall_reopen.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(40), "the epoch took {took:?}");

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
    if let Some(line) = log.lines().find(|l| l.contains("drained:")) {
        eprintln!("{line}");
    }
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
    let mut all = Vec::new();
    for (rank, (digest, steps)) in digests.into_iter().zip(seen).enumerate() {
        let (want_digest, want_steps) = embedded(spec(&data, rank as u32));
        assert_eq!(steps, want_steps, "rank {rank}: the same samples per step");
        assert_eq!(digest.hex(), want_digest, "rank {rank}: the embedded bytes");
        all.extend(steps.into_values().flatten());
    }
    all.sort_unstable();
    assert_eq!(all, (0..200).collect::<Vec<u64>>(), "every sample once");
}
