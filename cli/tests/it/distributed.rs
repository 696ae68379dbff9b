//! Distributed mode with real processes on 127.0.0.1: a coordinator daemon, `stoker-worker`
//! daemons, and the client in this process. Workers are killed with SIGKILL, the coordinator is
//! killed and restarted on the same port and state folder, a worker joins mid-epoch; every
//! sample must still arrive exactly once per rank, with the bytes of the embedded mode.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stoker_loader::{BatchDigest, ErrorKind, Loader, LoaderOptions, RemoteOptions};
use stoker_proto::v1::{JobSpec, OpenSessionRequest, RegisterJobRequest};

use crate::common::{self, Daemon};

pub(crate) fn spec(data: &Path, rank: u32) -> JobSpec {
    let mut spec = common::train_spec(data, 8);
    spec.world_size = 2;
    spec.rank = rank;
    spec
}

/// The remote loader of `spec` at the coordinator `address`.
pub(crate) fn remote(address: &str, spec: JobSpec) -> stoker_loader::Result<Loader> {
    remote_with_grace(address, spec, Duration::from_secs(60))
}

fn remote_with_grace(
    address: &str,
    spec: JobSpec,
    worker_grace: Duration,
) -> stoker_loader::Result<Loader> {
    remote_with(address, spec, worker_grace, Duration::from_secs(3))
}

/// The remote loader of `spec`, failing after `worker_grace` without a worker stream and
/// reopening its session after `stall_reopen` without a batch.
fn remote_with(
    address: &str,
    spec: JobSpec,
    worker_grace: Duration,
    stall_reopen: Duration,
) -> stoker_loader::Result<Loader> {
    let options = RemoteOptions {
        stall_reopen,
        worker_grace,
        ..RemoteOptions::default()
    };
    remote_configured(address, spec, options)
}

/// The remote loader of `spec` at `address` with `options`, a 30 s connect timeout, 4 batches
/// ahead and a 60 s deadline.
pub(crate) fn remote_configured(
    address: &str,
    spec: JobSpec,
    options: RemoteOptions,
) -> stoker_loader::Result<Loader> {
    let loader = LoaderOptions {
        prefetch: 4,
        deadline: Duration::from_secs(60),
        ..LoaderOptions::default()
    };
    let options = RemoteOptions {
        connect_timeout: Duration::from_secs(30),
        ..options
    };
    Loader::remote(address, spec, loader, options)
}

/// Every batch of the rank's epoch from the embedded loader: digest and step -> indices.
pub(crate) fn embedded(spec: JobSpec) -> (String, BTreeMap<u64, Vec<u64>>) {
    let loader = common::embedded_loader(spec, 1).unwrap();
    let mut digest = BatchDigest::new();
    let mut steps = BTreeMap::new();
    for batch in loader.epoch(0, 0).unwrap() {
        let batch = batch.unwrap();
        digest.update(&batch);
        steps.insert(batch.step, batch.sample_indices.clone());
    }
    (digest.hex(), steps)
}

/// Reads both ranks' epochs through the coordinator, one batch of each rank in turn, calling
/// `halfway` once half of rank 0's steps have been taken. Returns per rank the digest and
/// step -> indices.
fn distributed(
    address: &str,
    data: &Path,
    halfway: impl FnMut(),
) -> Vec<(String, BTreeMap<u64, Vec<u64>>)> {
    distributed_with(address, data, Duration::from_secs(3), halfway)
}

/// [`distributed`] with clients that reopen their sessions after `stall_reopen` without a
/// batch.
pub(crate) fn distributed_with(
    address: &str,
    data: &Path,
    stall_reopen: Duration,
    halfway: impl FnMut(),
) -> Vec<(String, BTreeMap<u64, Vec<u64>>)> {
    distributed_specs(address, &|rank| spec(data, rank), stall_reopen, halfway)
}

/// [`distributed_with`] for the ranks' specs `make` gives.
pub(crate) fn distributed_specs(
    address: &str,
    make: &dyn Fn(u32) -> JobSpec,
    stall_reopen: Duration,
    mut halfway: impl FnMut(),
) -> Vec<(String, BTreeMap<u64, Vec<u64>>)> {
    let grace = Duration::from_secs(60);
    let loaders: Vec<Loader> = (0..2)
        .map(|rank| remote_with(address, make(rank), grace, stall_reopen).unwrap())
        .collect();
    let mut streams: Vec<_> = loaders.iter().map(|l| l.epoch(0, 0).unwrap()).collect();
    let steps = loaders[0].steps_per_epoch();
    let mut digests = vec![BatchDigest::new(), BatchDigest::new()];
    let mut seen = vec![BTreeMap::new(), BTreeMap::new()];
    let started = Instant::now();
    for step in 0..steps {
        if step == steps / 2 {
            halfway();
        }
        for rank in 0..2 {
            let batch = streams[rank]
                .next_batch()
                .unwrap()
                .expect("a batch per step");
            assert_eq!(batch.step, step, "rank {rank} yields in step order");
            assert_eq!(batch.rank, rank as u32);
            digests[rank].update(&batch);
            assert!(
                seen[rank]
                    .insert(batch.step, batch.sample_indices.clone())
                    .is_none(),
                "rank {rank} step {step} delivered twice"
            );
        }
        // A training step: lets work pile up at the workers so a kill hits tasks in flight.
        std::thread::sleep(Duration::from_millis(15));
    }
    for stream in &mut streams {
        assert!(stream.next_batch().unwrap().is_none(), "the epoch ends");
    }
    assert!(started.elapsed() < Duration::from_secs(120));
    digests
        .into_iter()
        .zip(seen)
        .map(|(d, s)| (d.hex(), s))
        .collect()
}

pub(crate) fn assert_matches_embedded(data: &Path, got: &[(String, BTreeMap<u64, Vec<u64>>)]) {
    assert_specs_match_embedded(&|rank| spec(data, rank), got);
}

/// [`assert_matches_embedded`] for the ranks' specs `make` gives.
pub(crate) fn assert_specs_match_embedded(
    make: &dyn Fn(u32) -> JobSpec,
    got: &[(String, BTreeMap<u64, Vec<u64>>)],
) {
    let mut all = Vec::new();
    for (rank, (digest, steps)) in got.iter().enumerate() {
        let (want_digest, want_steps) = embedded(make(rank as u32));
        assert_eq!(
            steps, &want_steps,
            "rank {rank}: the same samples at the same steps"
        );
        assert_eq!(
            digest, &want_digest,
            "rank {rank}: bit-identical to the embedded mode"
        );
        all.extend(steps.values().flatten().copied());
    }
    // 200 samples, 2 ranks: each sample exactly once over the ranks (the split is even).
    all.sort_unstable();
    assert_eq!(all, (0..200).collect::<Vec<u64>>());
}

pub(crate) fn fixture() -> tempfile::TempDir {
    common::images_in_tempdir(200).0
}

/// The fixture, its images' folder, and a coordinator journaling beside them (no worker yet).
fn cluster() -> (tempfile::TempDir, PathBuf, Daemon) {
    let dir = fixture();
    let data = dir.path().join("data");
    let coordinator = Daemon::coordinator(&dir.path().join("state"), "127.0.0.1:0");
    (dir, data, coordinator)
}

#[test]
fn a_worker_killed_mid_epoch_costs_no_sample_and_duplicates_none() {
    let (dir, data, coordinator) = cluster();
    let mut first = Daemon::worker(&coordinator.address, dir.path());
    let _second = Daemon::worker(&coordinator.address, dir.path());
    let got = distributed(&coordinator.address, &data, || first.kill());
    assert_matches_embedded(&data, &got);
}

#[test]
fn a_coordinator_restarted_mid_epoch_resumes_from_its_journal() {
    let dir = fixture();
    let data = dir.path().join("data");
    let state = dir.path().join("state");
    let mut coordinator = Daemon::coordinator(&state, "127.0.0.1:0");
    let address = coordinator.address.clone();
    let _first = Daemon::worker(&address, dir.path());
    let _second = Daemon::worker(&address, dir.path());
    let mut restarted = None;
    let got = distributed(&address, &data, || {
        coordinator.kill();
        restarted = Some(Daemon::coordinator(&state, &address));
    });
    assert_matches_embedded(&data, &got);
    assert_eq!(restarted.map(|d| d.address.clone()), Some(address));
}

#[test]
fn a_coordinator_restarted_between_a_lease_batch_and_its_report_costs_nothing() {
    // Workers that report only with their next lease call (the reporter's interval is a
    // minute) and lease one task at a time: the task delivered last is unreported whenever
    // the coordinator dies, and its restart voids that lease.
    let dir = fixture();
    let data = dir.path().join("data");
    let state = dir.path().join("state");
    let mut coordinator = Daemon::coordinator(&state, "127.0.0.1:0");
    let address = coordinator.address.clone();
    let held = ["--report-interval-ms", "60000", "--lease-ahead", "1"];
    let log = dir.path().join("workers.log");
    let workers: Vec<Daemon> = (0..2)
        .map(|_| {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap();
            Daemon::worker_logging_to(&address, dir.path(), &held, file)
        })
        .collect();
    let mut restarted = None;
    let got = distributed(&address, &data, || {
        coordinator.kill();
        restarted = Some(Daemon::coordinator(&state, &address));
    });
    assert_matches_embedded(&data, &got);
    drop(workers);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("a report did not reach the coordinator"),
        "no worker had an unreported task when the coordinator died:\n{log}"
    );
}

#[test]
fn a_worker_that_joins_mid_epoch_takes_tasks() {
    let (dir, data, coordinator) = cluster();
    let mut first = Daemon::worker(&coordinator.address, dir.path());
    let mut second = Daemon::worker(&coordinator.address, dir.path());
    let mut third = None;
    let got = distributed(&coordinator.address, &data, || {
        third = Some(Daemon::worker(&coordinator.address, dir.path()));
        // Only the newcomer is left: the rest of the epoch is its work.
        std::thread::sleep(Duration::from_millis(300));
        first.kill();
        second.kill();
    });
    assert_matches_embedded(&data, &got);
    assert!(third.is_some());
}

/// A free port on 127.0.0.1 (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Relays every connection to `from` to `to`, byte for byte, until the returned flag is set
/// (and one more connection wakes the accept loop).
fn relay(from: u16, to: u16) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let listener = std::net::TcpListener::bind(("127.0.0.1", from)).unwrap();
    let stopped = stop.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            if stopped.load(Ordering::SeqCst) {
                return;
            }
            let Ok(client) = client else { continue };
            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            for (mut a, mut b) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut a, &mut b);
                    let _ = b.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    stop
}

#[test]
fn a_worker_whose_address_answers_late_gets_its_stream() {
    // One of two workers advertises a port where nothing listens yet, as a new pod whose DNS
    // name does not resolve for its first seconds: the clients' streams to it fail to open
    // and the batches it builds wait for them; once the address answers, the clients open
    // their streams to it and the epoch completes, each sample once. (The other worker lets
    // the job register: the coordinator has a worker open it first.)
    late_worker_epoch(Duration::from_millis(1500));
}

#[test]
fn a_worker_the_clients_cannot_reach_past_its_delivery_timeout_costs_the_epoch_nothing() {
    // The same, the address answering only after the worker's delivery timeout (10 s): the
    // clients tell the coordinator they cannot reach it, so it is leased none of their steps
    // and what it held comes back with its credits; the other worker serves the epoch. Before,
    // its batches came back unclaimed after 10 s with their credits spent, and the epoch
    // waited for the clients' stall watch (a minute here).
    late_worker_epoch(Duration::from_secs(12));
}

/// An epoch of two clients beside a reachable worker and one whose advertised address opens
/// only after `opens_after`, checked against the embedded loader's and done within 30 s.
fn late_worker_epoch(opens_after: Duration) {
    let (dir, data, coordinator) = cluster();
    let (advertised, listening) = (free_port(), free_port());
    let _reachable = Daemon::worker(&coordinator.address, dir.path());
    let _late = Daemon::worker_with(
        &coordinator.address,
        dir.path(),
        &[
            "--listen",
            &format!("127.0.0.1:{listening}"),
            "--advertise",
            &format!("127.0.0.1:{advertised}"),
        ],
    );
    // `distributed` blocks on the first batch: the address opens from another thread.
    let opener = std::thread::spawn(move || {
        std::thread::sleep(opens_after);
        relay(advertised, listening)
    });
    // The clients reopen a session only after a minute without a batch (which would open
    // every stream afresh): only retrying the failed stream gets the epoch done in time.
    let started = Instant::now();
    let got = distributed_with(&coordinator.address, &data, Duration::from_secs(60), || {});
    assert_matches_embedded(&data, &got);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the epoch took {took:?}, the address opening after {opens_after:?}"
    );
    let stop = opener.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = std::net::TcpStream::connect(("127.0.0.1", advertised));
}

/// Relays every connection to `from` to `to`, the bytes from `to` back at about
/// `bytes_per_s` (a slow link between a worker and its client).
fn slow_relay(from: u16, to: u16, bytes_per_s: usize) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(("127.0.0.1", from)).unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let (mut up_from, mut up_to) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut up_from, &mut up_to);
                let _ = up_to.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let mut piece = vec![0u8; 64 << 10];
                while let Ok(read) = server.read(&mut piece) {
                    if read == 0 || client.write_all(&piece[..read]).is_err() {
                        break;
                    }
                    let pause = read as f64 / bytes_per_s as f64;
                    std::thread::sleep(Duration::from_secs_f64(pause));
                }
                let _ = client.shutdown(std::net::Shutdown::Write);
            });
        }
    });
}

/// A client reading batches larger than its link carries within the worker's delivery timeout
/// (40 images of 224x224x3 bytes, 6 MB, at 4 MiB/s: 1.4 s each; the timeout 0.8 s) is reading,
/// not stalled: the worker sees each MiB of a batch go, ends none of its streams, and the
/// epoch comes whole. Before, the worker counted whole batches only: a stream sending one
/// batch for longer than the timeout with the next queued was ended as stalled, again and
/// again.
#[test]
fn a_client_reading_large_batches_over_a_slow_link_is_not_taken_for_stalled() {
    let (dir, data, coordinator) = cluster();
    let (advertised, listening) = (free_port(), free_port());
    let log = dir.path().join("worker.log");
    let _worker = Daemon::worker_logging_to(
        &coordinator.address,
        dir.path(),
        &[
            "--listen",
            &format!("127.0.0.1:{listening}"),
            "--advertise",
            &format!("127.0.0.1:{advertised}"),
            "--delivery-timeout-ms",
            "800",
        ],
        std::fs::File::create(&log).unwrap(),
    );
    slow_relay(advertised, listening, 4 << 20);
    let large = common::spec_over(
        &data.to_string_lossy(),
        stoker_pipeline::presets::imagenet_train(224),
        40,
    );
    let (want, steps) = embedded(large.clone());
    let loader = remote_with(
        &coordinator.address,
        large,
        Duration::from_secs(60),
        Duration::from_secs(60),
    )
    .unwrap();
    let mut digest = BatchDigest::new();
    let mut seen = Vec::new();
    for batch in loader.epoch(0, 0).unwrap() {
        let batch = batch.unwrap();
        assert!(batch.tensors[0].data.len() > 6_000_000 || batch.step + 1 == steps.len() as u64);
        digest.update(&batch);
        seen.push(batch.step);
    }
    assert_eq!(seen, steps.keys().copied().collect::<Vec<_>>());
    assert_eq!(digest.hex(), want);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("ending it"), "a stream was ended:\n{log}");
}

#[test]
fn malformed_and_unauthorised_requests_get_errors_that_name_the_problem() {
    let dir = fixture();
    let data = dir.path().join("data");
    let outside = tempfile::tempdir().unwrap();
    common::make_images(outside.path(), 4);
    let coordinator = Daemon::coordinator(&dir.path().join("state"), "127.0.0.1:0");
    let _worker = Daemon::worker(&coordinator.address, &data);

    let runtime = common::runtime();
    runtime.block_on(async {
        let mut client = common::coordinator_client(&coordinator.address).await;
        let register = |spec: JobSpec| RegisterJobRequest {
            spec: Some(spec),
            ..Default::default()
        };

        let status = client
            .register_job(register(spec(outside.path(), 0)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        assert!(
            status
                .message()
                .contains("outside this worker's --data-root"),
            "{status:?}"
        );

        let mut absurd = spec(&data, 0);
        absurd.batch_size = 1 << 30;
        let status = client.register_job(register(absurd)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("batch_size"), "{status:?}");

        let status = client
            .open_session(OpenSessionRequest {
                job_id: 999,
                rank: 0,
                epoch: 0,
                start_step: 0,
                resume_from_journal: false,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert!(status.message().contains("unknown job 999"), "{status:?}");

        let job = client
            .register_job(register(spec(&data, 0)))
            .await
            .unwrap()
            .into_inner();
        let status = client
            .open_session(OpenSessionRequest {
                job_id: job.job_id,
                rank: 7,
                epoch: 0,
                start_step: 0,
                resume_from_journal: false,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("rank 7"), "{status:?}");
    });

    // The daemons kept serving: a whole epoch still comes through, identical to the embedded one.
    let loader = remote(&coordinator.address, spec(&data, 1)).unwrap();
    let mut digest = BatchDigest::new();
    for batch in loader.epoch(0, 0).unwrap() {
        digest.update(&batch.unwrap());
    }
    assert_eq!(digest.hex(), embedded(spec(&data, 1)).0);
}

/// GET over HTTP/1.0; the body.
pub(crate) fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    body.to_string()
}

#[test]
fn clients_report_to_the_coordinator_dashboard() {
    let dir = fixture();
    let data = dir.path().join("data");
    // The daemon's own lease timeout (3 s), not the tests' 800 ms.
    let coordinator = Daemon::coordinator_with(
        &dir.path().join("state"),
        "127.0.0.1:0",
        &["--lease-timeout-ms", "3000", "--http", "127.0.0.1:0"],
    );
    let http = coordinator.banner_after("dashboard");
    let _workers = [
        Daemon::worker(&coordinator.address, dir.path()),
        Daemon::worker(&coordinator.address, dir.path()),
    ];
    // Automatic prefetch: the client's controller measures the trainer's step, and its
    // reports carry what it measured (before, the page read "fixed prefetch" for every
    // remote client and showed no step or batch latency).
    let automatic = LoaderOptions {
        prefetch: 0,
        deadline: Duration::from_secs(60),
        ..LoaderOptions::default()
    };
    let options = RemoteOptions {
        connect_timeout: Duration::from_secs(30),
        ..RemoteOptions::default()
    };
    let loader = Loader::remote(&coordinator.address, spec(&data, 0), automatic, options).unwrap();
    let mut samples = 0;
    for batch in loader.epoch(0, 0).unwrap() {
        samples += batch.unwrap().sample_indices.len() as u64;
        // A slow trainer: the client reports twice a second.
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(samples, 100, "rank 0's half of 200 samples");

    // The dashboard samples reports every 500 ms: wait for the figures to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    let job = loop {
        let body: serde_json::Value = serde_json::from_str(&http_get(&http, "/api/jobs")).unwrap();
        let job = body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|job| job["rank"] == 0)
            .cloned();
        if let Some(job) = job {
            if job["current"]["samples_total"].as_u64().unwrap_or(0) > 0
                && job["workers"].as_array().is_some_and(|w| w.len() == 2)
                && job["current"]["trainer_ms"].is_number()
            {
                break job;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no report reached the dashboard: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(job["name"].as_str().unwrap().contains("data"), "{job}");
    let workers = job["workers"].as_array().unwrap();
    assert!(workers.iter().all(|w| w["kind"] == "daemon"), "{job}");
    assert_eq!(job["automatic_prefetch"], true, "{job}");
    // 100 ms between next() calls over 8 samples: about 12.5 ms a sample.
    let trainer_ms = job["current"]["trainer_ms"].as_f64().unwrap_or(0.0);
    assert!((8.0..40.0).contains(&trainer_ms), "{job}");
    let metrics = http_get(&http, "/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("stoker_samples_total{") && l.contains("rank=\"0\"")),
        "{metrics}"
    );
    let step = metrics
        .lines()
        .find(|l| l.starts_with("stoker_trainer_step_seconds{") && l.contains("rank=\"0\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok());
    assert!(step.is_some_and(|s| (0.06..0.3).contains(&s)), "{metrics}");
    assert!(metrics.contains("stoker_stall_ratio"), "{metrics}");
}

#[test]
fn digest_with_an_address_prints_the_embedded_hash() {
    let (dir, data, coordinator) = cluster();
    let _workers = [
        Daemon::worker(&coordinator.address, dir.path()),
        Daemon::worker(&coordinator.address, dir.path()),
    ];
    let data = data.to_str().unwrap();
    let job = [
        "--data",
        data,
        "--size",
        "32",
        "--batch-size",
        "8",
        "--seed",
        "9",
        "--rank",
        "1",
        "--world",
        "2",
        "--batches",
        "100",
    ];
    let last_line = |out: String| out.lines().last().unwrap().to_string();
    let embedded = last_line(common::stdout_of(&[&["digest"][..], &job[..]].concat()));
    let remote = last_line(common::stdout_of(
        &[
            &["digest"][..],
            &job[..],
            &["--address", &coordinator.address][..],
        ]
        .concat(),
    ));
    assert_eq!(embedded.len(), 64, "{embedded}");
    assert_eq!(remote, embedded);
}

#[test]
fn a_loader_dropped_mid_epoch_closes_its_session_at_once() {
    let dir = fixture();
    let data = dir.path().join("data");
    // One session at most, and the default session timeout (60 s): the next session opens
    // only if the dropped loader closed its own.
    let coordinator = Daemon::coordinator_with(
        &dir.path().join("state"),
        "127.0.0.1:0",
        &["--max-sessions", "1"],
    );
    let _worker = Daemon::worker(&coordinator.address, dir.path());
    let loader = remote(&coordinator.address, spec(&data, 0)).unwrap();
    let mut stream = loader.epoch(0, 0).unwrap();
    assert_eq!(stream.next_batch().unwrap().unwrap().step, 0);
    drop(stream);
    drop(loader);

    let runtime = common::runtime();
    runtime.block_on(async {
        let mut client = common::coordinator_client(&coordinator.address).await;
        let job = client
            .register_job(RegisterJobRequest {
                spec: Some(spec(&data, 1)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let opened = client
            .open_session(OpenSessionRequest {
                job_id: job.job_id,
                rank: 1,
                epoch: 0,
                start_step: 0,
                resume_from_journal: false,
            })
            .await;
        assert!(
            opened.is_ok(),
            "the dropped loader's session is still open: {opened:?}"
        );
    });
}

#[test]
fn a_job_whose_workers_all_died_fails_with_worker_unavailable() {
    let (dir, data, coordinator) = cluster();
    let mut workers = [
        Daemon::worker(&coordinator.address, dir.path()),
        Daemon::worker(&coordinator.address, dir.path()),
    ];
    let grace = Duration::from_secs(2);
    let loader = remote_with_grace(&coordinator.address, spec(&data, 0), grace).unwrap();
    assert_eq!(
        loader.info().class_names.len(),
        10,
        "class names come from the workers"
    );
    assert!(loader.info().num_samples > 0);
    let mut stream = loader.epoch(0, 0).unwrap();
    assert!(stream.next_batch().unwrap().is_some());
    for worker in &mut workers {
        worker.kill();
    }
    let started = Instant::now();
    let error = loop {
        match stream.next_batch() {
            // Batches already delivered before the kill may still come.
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the epoch cannot end without workers"),
            Err(error) => break error,
        }
    };
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "well before the 60 s deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(error.kind(), ErrorKind::WorkerUnavailable, "{error}");
    let message = error.to_string();
    assert!(message.contains("no worker has served job"), "{message}");
    assert!(
        message.contains("data"),
        "names the job's dataset: {message}"
    );
}

#[test]
fn errors_keep_their_kind_across_the_wire() {
    let (dir, data, coordinator) = cluster();
    let _worker = Daemon::worker(&coordinator.address, dir.path());
    let kind_of = |spec: JobSpec| match remote(&coordinator.address, spec) {
        Ok(_) => panic!("the job should be refused"),
        Err(error) => (error.kind(), error.to_string()),
    };

    let mut missing = spec(&data, 0);
    missing.dataset.as_mut().unwrap().uri = dir.path().join("nope").display().to_string();
    let (kind, message) = kind_of(missing);
    assert_eq!(kind, ErrorKind::NotFound, "{message}");

    let mut outside = spec(&data, 0);
    outside.dataset.as_mut().unwrap().uri = "/".into();
    let (kind, message) = kind_of(outside);
    assert_eq!(kind, ErrorKind::PermissionDenied, "{message}");

    let not_images = dir.path().join("not_images");
    std::fs::create_dir_all(&not_images).unwrap();
    let mut empty = spec(&data, 0);
    empty.dataset.as_mut().unwrap().uri = not_images.display().to_string();
    let (kind, message) = kind_of(empty);
    assert_eq!(kind, ErrorKind::Dataset, "{message}");

    let mut flips = spec(&data, 0);
    let flip = flips
        .pipeline
        .iter()
        .find(|op| {
            matches!(
                op.op,
                Some(stoker_proto::v1::op::Op::RandomHorizontalFlip(_))
            )
        })
        .cloned()
        .expect("the train spec flips");
    flips.pipeline.push(flip);
    let (kind, message) = kind_of(flips);
    assert_eq!(kind, ErrorKind::Pipeline, "{message}");

    // A corrupt sample under the fail policy: a decode error from the worker's stream.
    let class = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .find(|e| e.path().is_dir())
        .unwrap()
        .path();
    std::fs::write(
        class.join("zz_corrupt.jpg"),
        b"\xff\xd8\xff\xe0 not really a jpeg",
    )
    .unwrap();
    let mut strict = spec(&data, 0);
    strict.on_error = stoker_proto::v1::BadSamplePolicy::Fail as i32;
    strict.shuffle = false;
    strict.world_size = 1;
    let loader = remote(&coordinator.address, strict).unwrap();
    let error = loader
        .epoch(0, 0)
        .unwrap()
        .find_map(|batch| batch.err())
        .expect("the corrupt sample fails its batch");
    assert_eq!(error.kind(), ErrorKind::Decode, "{error}");
    assert!(error.to_string().contains("zz_corrupt.jpg"), "{error}");
}

/// A relay on 127.0.0.1 to `to`: every connection made to the returned port is carried on
/// while the flag is set; clearing it cuts every connection it carries and drops new ones until
/// it is set again (a network partition between one side and `to`).
fn cuttable_relay(to: u16) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let open = Arc::new(AtomicBool::new(true));
    let carried: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepting, held) = (Arc::clone(&open), Arc::clone(&carried));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            if !accepting.load(Ordering::SeqCst) {
                continue;
            }
            let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let mut streams = held.lock().unwrap();
            streams.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
            for (mut a, mut b) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut a, &mut b);
                    let _ = b.shutdown(Shutdown::Write);
                });
            }
        }
    });
    let watched = Arc::clone(&open);
    std::thread::spawn(move || loop {
        if !watched.load(Ordering::SeqCst) {
            for stream in carried.lock().unwrap().drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    (port, open)
}

/// What [`read_cut_off_until_retired`] saw.
struct CutOff {
    /// The loader's job before the cut.
    first: u64,
    /// The digest of the epoch read, or the first error.
    read: stoker_loader::Result<String>,
    /// The embedded loader's digest of the epoch (over the dataset as it was).
    embedded: String,
    /// The spec's job when the loader is done (or why none), and whether each is known then.
    again: Result<u64, tonic::Status>,
    known: (bool, bool),
    /// Whether the dashboard charts the loader under `again` then.
    again_charted: bool,
    /// The job the loader says it reads under, before the cut and when done.
    loader_job: (Option<u64>, Option<u64>),
}

/// Reads rank 0's epoch 0 through a relay to the coordinator (retention 1 s, sessions closed
/// after 1.5 s of silence, a dashboard) that is cut at half the epoch until the loader's job
/// is retired and gone from the dashboard; `while_cut` runs then, with the dataset's folder,
/// before the relay carries again, and with `fresh_worker` the one worker is then replaced by
/// a new process (one that never saw the dataset before).
fn read_cut_off_until_retired(fresh_worker: bool, while_cut: impl FnOnce(&Path)) -> CutOff {
    use std::sync::atomic::Ordering;
    let dir = fixture();
    let data = dir.path().join("data");
    let embedded = embedded(spec(&data, 0)).0;
    let in_process = common::embedded_loader(spec(&data, 0), 1).unwrap();
    assert_eq!(
        in_process.coordinator_job(),
        None,
        "no coordinator in process"
    );
    let flags = [
        "--job-retention-secs",
        "1",
        "--session-timeout-ms",
        "1500",
        "--http",
        "127.0.0.1:0",
    ];
    let coordinator = Daemon::coordinator_with(&dir.path().join("state"), "127.0.0.1:0", &flags);
    let http = coordinator.banner_after("dashboard");
    // Whether the dashboard charts a rank of job `job`.
    let charted = |job: u64| {
        let body: serde_json::Value = serde_json::from_str(&http_get(&http, "/api/jobs")).unwrap();
        let prefix = format!("job {job} ");
        body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|entry| entry["name"].as_str().unwrap().starts_with(&prefix))
    };
    let mut worker = Daemon::worker(&coordinator.address, dir.path());
    let port: u16 = coordinator
        .address
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (relayed, open) = cuttable_relay(port);
    let runtime = common::runtime();
    let known = |job: u64| {
        runtime.block_on(async {
            let mut client = common::coordinator_client(&coordinator.address).await;
            let request = stoker_proto::v1::GetJobRequest { job_id: job };
            match client.get_job(request).await {
                Ok(_) => true,
                Err(status) if status.code() == tonic::Code::NotFound => false,
                Err(status) => panic!("{status:?}"),
            }
        })
    };
    let register = || {
        runtime.block_on(async {
            let mut client = common::coordinator_client(&coordinator.address).await;
            let request = RegisterJobRequest {
                spec: Some(spec(&data, 0)),
                weight: 0,
            };
            client
                .register_job(request)
                .await
                .map(|r| r.into_inner().job_id)
        })
    };
    // The client reaches the coordinator through the relay, its workers directly.
    let loader = remote(&format!("127.0.0.1:{relayed}"), spec(&data, 0)).unwrap();
    let mut stream = loader.epoch(0, 0).unwrap();
    let steps = loader.steps_per_epoch();
    let loader_job_before = loader.coordinator_job();
    let mut first = 0;
    let mut while_cut = Some(while_cut);
    let mut read = || -> stoker_loader::Result<String> {
        let mut digest = BatchDigest::new();
        for step in 0..steps {
            if step == steps / 2 {
                // The loader's job: the spec registered again while its session is open.
                first = register().unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                while !charted(first) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                assert!(charted(first), "the client's reports reach the dashboard");
                // Cut off: its session times out, and with no session open the job is retired.
                open.store(false, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(30);
                while known(first) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                assert!(!known(first), "job {first} retired");
                assert!(!charted(first), "and gone from the dashboard");
                if let Some(while_cut) = while_cut.take() {
                    while_cut(&data);
                }
                if fresh_worker {
                    worker.kill();
                    worker = Daemon::worker(&coordinator.address, dir.path());
                }
                open.store(true, Ordering::SeqCst);
            }
            let batch = stream.next_batch()?.expect("a batch per step");
            assert_eq!(batch.step, step, "in step order, each step once");
            digest.update(&batch);
        }
        assert!(stream.next_batch()?.is_none(), "the epoch ends");
        Ok(digest.hex())
    };
    let read = read();
    let again = register();
    // A loader that read on reports under the job it reads now.
    let deadline = Instant::now() + Duration::from_secs(10);
    while read.is_ok()
        && again.as_ref().is_ok_and(|job| !charted(*job))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let known = (known(first), again.as_ref().is_ok_and(|job| known(*job)));
    CutOff {
        first,
        read,
        embedded,
        again_charted: again.as_ref().is_ok_and(|job| charted(*job)),
        loader_job: (loader_job_before, loader.coordinator_job()),
        again,
        known,
    }
}

#[test]
fn a_job_retired_while_its_client_was_cut_off_is_registered_again_and_read_on() {
    let seen = read_cut_off_until_retired(false, |_| {});
    // Back, the client registered the job again under a new id and read on from its position:
    // the epoch is the embedded one, bit for bit.
    assert_eq!(seen.read.unwrap(), seen.embedded);
    let again = seen.again.unwrap();
    assert_ne!(again, seen.first, "registered again under a new id");
    assert_eq!(seen.known, (false, true));
    assert!(seen.again_charted, "the loader reads under the new id");
    // And says so: its later epochs open under it.
    assert_eq!(seen.loader_job, (Some(seen.first), Some(again)));
}

#[test]
fn a_client_whose_job_was_retired_and_its_dataset_changed_meanwhile_stops_with_an_error() {
    // Forty more images while the client is cut off: registered again, the job has more steps,
    // and the client, which reads the old epoch, stops with an error naming both counts.
    let seen = read_cut_off_until_retired(true, |data| {
        let class = std::fs::read_dir(data)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|path| path.is_dir())
            .unwrap();
        let image = std::fs::read_dir(&class)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|path| path.is_file())
            .unwrap();
        let extension = image.extension().unwrap().to_str().unwrap().to_string();
        for n in 0..40 {
            std::fs::copy(&image, class.join(format!("added-{n}.{extension}"))).unwrap();
        }
    });
    let error = seen
        .read
        .expect_err("no epoch read on over another dataset");
    assert_eq!(error.kind(), ErrorKind::Dataset, "{error}");
    let said = "now describe the dataset with 15 steps per epoch where this loader reads 13";
    assert!(error.to_string().contains(said), "{error}");
    // The changed dataset is a job of its own at the coordinator, as any new client sees it.
    assert!(seen.known.1, "{:?}", seen.again);
}

/// A dataset changed between two runs of a coordinator (its state wiped) is read as a job of
/// its own by a worker that served the old one: the worker refused it for good ("the dataset
/// changed since this worker first opened the job"), and the registration failed at once.
#[test]
fn a_dataset_changed_between_coordinator_runs_is_read_by_a_worker_that_served_it_before() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    common::make_images(&data, 64);
    let address = format!("127.0.0.1:{}", free_port());
    let mut coordinator = Daemon::coordinator(&dir.path().join("state-1"), &address);
    let _worker = Daemon::worker(&address, dir.path());
    let epoch_of = |address: &str| -> Vec<u64> {
        let loader = stoker_loader::Loader::remote(
            address,
            common::train_spec(&data, 8),
            stoker_loader::LoaderOptions::default(),
            stoker_loader::RemoteOptions {
                connect_timeout: Duration::from_secs(30),
                ..stoker_loader::RemoteOptions::default()
            },
        )
        .unwrap();
        let mut indices: Vec<u64> = loader
            .epoch(0, 0)
            .unwrap()
            .flat_map(|batch| batch.unwrap().sample_indices)
            .collect();
        indices.sort_unstable();
        indices
    };
    assert_eq!(epoch_of(&address), (0..64).collect::<Vec<u64>>());
    coordinator.kill();
    common::make_images(&dir.path().join("more"), 40);
    let class = std::fs::read_dir(&data)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.is_dir())
        .unwrap();
    for (n, image) in std::fs::read_dir(dir.path().join("more"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .flat_map(|folder| std::fs::read_dir(folder).unwrap())
        .enumerate()
    {
        let image = image.unwrap().path();
        let extension = image.extension().unwrap().to_string_lossy().into_owned();
        std::fs::copy(&image, class.join(format!("added-{n}.{extension}"))).unwrap();
    }
    let _again = Daemon::coordinator(&dir.path().join("state-2"), &address);
    assert_eq!(epoch_of(&address), (0..104).collect::<Vec<u64>>());
}
