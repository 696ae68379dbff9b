//! Two jobs on one coordinator and one pool of workers (real daemons on 127.0.0.1): both read
//! their whole epoch, each sample once and with the embedded mode's bytes, however their
//! weights differ; the weights the coordinator gave (capped by `--max-job-weight`) and the
//! leases of each job show on `/metrics` and on the dashboard's job cards.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use stoker_loader::{BatchDigest, Loader, LoaderOptions, RemoteOptions};
use stoker_proto::v1::JobSpec;

use crate::common::{self, Daemon};
use crate::distributed::{embedded, http_get};

fn remote(address: &str, spec: JobSpec, job_weight: u32) -> Loader {
    Loader::remote(
        address,
        spec,
        LoaderOptions {
            prefetch: 4,
            deadline: Duration::from_secs(60),
            ..LoaderOptions::default()
        },
        RemoteOptions {
            connect_timeout: Duration::from_secs(30),
            job_weight,
            ..RemoteOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn two_jobs_share_the_workers_and_both_finish_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    common::make_images(&data, 96);
    let state = dir.path().join("state");
    let coordinator = Daemon::coordinator_with(
        &state,
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0", "--max-job-weight", "4"],
    );
    let http = coordinator
        .banner
        .split_whitespace()
        .last()
        .unwrap()
        .trim_start_matches("http://")
        .to_string();
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
        .filter(|l| l.starts_with("stoker_job_weight{job=\"job "))
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
        if weights == [1, 4] {
            break;
        }
        assert!(Instant::now() < deadline, "shares on the job cards: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
