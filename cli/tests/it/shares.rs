//! Two jobs on one coordinator and one pool of workers (real daemons on 127.0.0.1): both read
//! their whole epoch, each sample once and with the embedded mode's bytes, however their
//! weights differ; the weights the coordinator gave (capped by `--max-job-weight`) and the
//! leases of each job, and the workers serving it, show on `/metrics` and on the dashboard's
//! job cards.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use stoker_loader::{BatchDigest, Loader, RemoteOptions};
use stoker_proto::v1::JobSpec;

use crate::common::{self, Daemon};
use crate::distributed::{embedded, http_get, remote_configured};

fn remote(address: &str, spec: JobSpec, job_weight: u32) -> Loader {
    let options = RemoteOptions {
        job_weight,
        ..RemoteOptions::default()
    };
    remote_configured(address, spec, options).unwrap()
}

#[test]
fn two_jobs_share_the_workers_and_both_finish_exactly_once() {
    let (dir, data) = common::images_in_tempdir(96);
    let state = dir.path().join("state");
    let coordinator = Daemon::coordinator_with(
        &state,
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0", "--max-job-weight", "4"],
    );
    let http = coordinator.banner_after("dashboard");
    let _workers = [
        Daemon::worker(&coordinator.address, dir.path()),
        Daemon::worker(&coordinator.address, dir.path()),
    ];
    // Two jobs: the same files, another seed. The second asks for 100 and gets the cap, 4.
    let specs: Vec<JobSpec> = [1, 2]
        .into_iter()
        .map(|seed| {
            let mut spec = common::train_spec(&data, 4);
            spec.seed = seed;
            spec
        })
        .collect();
    let runs: Vec<_> = specs
        .iter()
        .zip([1, 100])
        .map(|(spec, weight)| {
            let (address, spec) = (coordinator.address.clone(), spec.clone());
            std::thread::spawn(move || {
                let loader = remote(&address, spec, weight);
                let mut digest = BatchDigest::new();
                let mut indices = Vec::new();
                for batch in loader.epoch(0, 0).unwrap() {
                    let batch = batch.unwrap();
                    digest.update(&batch);
                    indices.extend_from_slice(&batch.sample_indices);
                    // A trainer step: both jobs' clients wait side by side, and report.
                    std::thread::sleep(Duration::from_millis(60));
                }
                (digest.hex(), indices)
            })
        })
        .collect();
    for (run, spec) in runs.into_iter().zip(&specs) {
        let (digest, mut indices) = run.join().unwrap();
        assert_eq!(digest, embedded(spec.clone()).0);
        indices.sort_unstable();
        assert_eq!(indices, (0..96).collect::<Vec<u64>>());
    }

    // The dashboard refreshes every 500 ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = http_get(&http, "/metrics");
        let leases: Vec<f64> = metrics
            .lines()
            .filter(|l| l.starts_with("stoker_job_leases_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        // 24 batches a job; a batch leased twice (a stream reopened) counts twice.
        if leases.len() == 2 && leases.iter().all(|&n| n >= 24.0) {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "no shares on /metrics: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // The jobs registered in either order: which id got which weight varies.
    let mut weights: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("stoker_job_weight{stoker_job=\"job "))
        .filter_map(|l| l.rsplit(' ').next())
        .collect();
    weights.sort_unstable();
    assert_eq!(weights, ["1", "4"], "{metrics}");
    assert!(metrics.contains("# TYPE stoker_job_lease_fraction gauge"));
    // Each job's card on the dashboard carries its share (a card appears with its client's
    // first report).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let body: serde_json::Value = serde_json::from_str(&http_get(&http, "/api/jobs")).unwrap();
        let mut weights: Vec<u64> = body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|job| job["share"]["weight"].as_u64())
            .collect();
        weights.sort_unstable();
        // Each card also names the workers that leased its job's tasks in the last 10 s.
        let served = body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|job| job["share"]["workers"].as_array())
            .filter(|workers| {
                !workers.is_empty()
                    && workers
                        .iter()
                        .all(|w| w.as_str().is_some_and(|w| w.starts_with("worker ")))
            })
            .count();
        if weights == [1, 4] && served == 2 {
            let metrics = http_get(&http, "/metrics");
            let serving = metrics
                .lines()
                .filter(|l| l.starts_with("stoker_job_workers{stoker_job=\"job "))
                .filter(|l| l.rsplit(' ').next() != Some("0"))
                .count();
            assert_eq!(serving, 2, "{metrics}");
            break;
        }
        assert!(Instant::now() < deadline, "shares on the job cards: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `stoker_workers_wanted` on `/metrics`, once it is there.
fn workers_wanted(http: &str) -> Option<u64> {
    http_get(http, "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix("stoker_workers_wanted ")?.parse().ok())
}

/// Reads batches for `seconds`, sleeping `step` after each (a trainer's step), epoch after
/// epoch; returns the most workers `/metrics` wanted while it read, after its first second
/// (the coordinator's figures lag a report or two).
fn train(loader: &Loader, http: &str, epoch: &mut u64, seconds: f64, step: Duration) -> u64 {
    let start = Instant::now();
    let mut polled = Instant::now();
    let mut most = 0;
    while start.elapsed().as_secs_f64() < seconds {
        for batch in loader.epoch(*epoch, 0).unwrap() {
            batch.unwrap();
            std::thread::sleep(step);
            if start.elapsed() > Duration::from_secs(1) && polled.elapsed().as_millis() >= 250 {
                polled = Instant::now();
                most = most.max(workers_wanted(http).unwrap_or(0));
            }
            if start.elapsed().as_secs_f64() >= seconds {
                break;
            }
        }
        *epoch += 1;
    }
    most
}

#[test]
fn workers_wanted_rises_with_a_clients_demand() {
    let (dir, data) = common::images_in_tempdir(64);
    let coordinator = Daemon::coordinator_with(
        &dir.path().join("state"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0"],
    );
    let http = coordinator.banner_after("dashboard");
    let _worker = Daemon::worker(&coordinator.address, dir.path());
    // Full-size crops (224 px from small files): one one-thread worker builds a few batches a
    // second, far fewer than a trainer with no step of its own takes.
    let spec = common::spec_over(
        &data.to_string_lossy(),
        stoker_pipeline::presets::imagenet_train(224),
        16,
    );
    let loader = remote(&coordinator.address, spec, 0);
    let mut epoch = 0;
    // A slow trainer (a step of 300 ms): one worker is plenty.
    let calm = train(&loader, &http, &mut epoch, 4.0, Duration::from_millis(300));
    assert!(
        http_get(&http, "/metrics").contains("\nstoker_workers 1\n"),
        "one live worker"
    );
    assert!(calm >= 1, "a client reading wants a worker: {calm}");
    // The same client with no step at all: it waits on the one worker, so it wants more.
    let hungry = train(&loader, &http, &mut epoch, 5.0, Duration::ZERO);
    assert!(
        hungry > calm,
        "wanted went from {calm} to {hungry} as the demand rose"
    );
}
