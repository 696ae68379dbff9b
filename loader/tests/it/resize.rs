//! Resuming mid-epoch on another world size: the ranks of the first run stop part-way through
//! an epoch; the ranks of the second run, more or fewer, read what is left. Every sample of the
//! epoch arrives exactly once overall (checked by sample index), embedded and through real
//! coordinator and worker daemons; the next epoch is the plain one of the new world size.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use stoker_loader::{Loader, LoaderOptions, RemoteOptions};
use stoker_proto::v1::JobSpec;
use stoker_worker::resized_spec;

use crate::common::{self, Daemon};

const SAMPLES: u64 = 100;
const BATCH: u32 = 4;

fn spec(data: &Path, rank: u32, world: u32) -> JobSpec {
    let mut spec = common::train_spec(data, BATCH);
    spec.rank = rank;
    spec.world_size = world;
    spec
}

/// How a test reaches the batches: in process, or through a coordinator.
#[derive(Clone, Copy)]
enum Mode<'a> {
    Embedded,
    Remote(&'a str),
}

fn loader(mode: Mode<'_>, spec: JobSpec) -> Loader {
    match mode {
        Mode::Embedded => common::embedded_loader(spec, 1).unwrap(),
        Mode::Remote(address) => Loader::remote(
            address,
            spec,
            LoaderOptions {
                deadline: Duration::from_secs(60),
                // The runs stop mid-epoch: no session for the next epoch.
                prefetch_next_epoch: false,
                ..LoaderOptions::default()
            },
            RemoteOptions {
                connect_timeout: Duration::from_secs(30),
                stall_reopen: Duration::from_secs(3),
                worker_grace: Duration::from_secs(60),
                ..RemoteOptions::default()
            },
        )
        .unwrap(),
    }
}

/// Sample indices of `steps` batches of `epoch` (all of them with `None`).
fn read(loader: &Loader, epoch: u64, steps: Option<u64>) -> Vec<u64> {
    let mut stream = loader.epoch(epoch, 0).unwrap();
    let mut indices = Vec::new();
    let mut taken = 0;
    while steps.is_none_or(|s| taken < s) {
        let Some(batch) = stream.next_batch().unwrap() else {
            break;
        };
        indices.extend_from_slice(&batch.sample_indices);
        taken += 1;
    }
    indices
}

/// `old` ranks read `stop` steps of epoch 1, then `new` ranks read the rest of it; returns
/// every index read, old and new.
fn resize_run(mode: Mode<'_>, data: &Path, old: u32, stop: u64, new: u32) -> Vec<u64> {
    let mut all = Vec::new();
    for rank in 0..old {
        all.extend(read(&loader(mode, spec(data, rank, old)), 1, Some(stop)));
    }
    assert!(all.len() < SAMPLES as usize, "stopped mid-epoch");
    for rank in 0..new {
        let resumed = resized_spec(
            &spec(data, rank, new),
            SAMPLES,
            1,
            old,
            Vec::new(),
            &vec![stop; old as usize],
        )
        .unwrap();
        let resumed = loader(mode, resumed);
        all.extend(read(&resumed, 1, None));
        // A resumed job serves its epoch only; the next one is the plain job's.
        let error = resumed.epoch(2, 0).map(|_| ()).unwrap_err().to_string();
        assert!(error.contains("serves that epoch only"), "{error}");
    }
    all
}

fn assert_exactly_once(mut all: Vec<u64>) {
    all.sort_unstable();
    assert_eq!(all, (0..SAMPLES).collect::<Vec<u64>>());
}

/// The next epoch under the new world size is the plain one: the same as a job that never
/// resized.
fn assert_next_epoch_is_plain(mode: Mode<'_>, data: &Path, new: u32) {
    let mut all = Vec::new();
    for rank in 0..new {
        let plain = read(&loader(mode, spec(data, rank, new)), 2, None);
        let embedded = read(&loader(Mode::Embedded, spec(data, rank, new)), 2, None);
        assert_eq!(plain, embedded, "rank {rank} of {new}: the plain epoch 2");
        all.extend(plain);
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len() as u64, SAMPLES);
}

#[test]
fn embedded_four_ranks_resumed_on_two_and_two_on_three_read_each_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    common::make_images(&data, SAMPLES);
    // 4 ranks x 25 samples: 3 steps of 4 read (48), 52 left for 2 ranks.
    assert_exactly_once(resize_run(Mode::Embedded, &data, 4, 3, 2));
    // 2 ranks x 50: 5 steps read (40), 60 left, 20 for each of 3 ranks.
    assert_exactly_once(resize_run(Mode::Embedded, &data, 2, 5, 3));
    assert_next_epoch_is_plain(Mode::Embedded, &data, 3);
}

#[test]
fn distributed_four_ranks_resumed_on_two_and_two_on_three_read_each_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    common::make_images(&data, SAMPLES);
    let coordinator = Daemon::coordinator(&dir.path().join("state"), "127.0.0.1:0");
    // A run stopped mid-epoch leaves leased batches nobody will take; a short delivery timeout
    // hands the workers back to the next run sooner.
    let _workers: Vec<Daemon> = (0..2)
        .map(|_| {
            Daemon::worker_with(
                &coordinator.address,
                dir.path(),
                &["--delivery-timeout-ms", "1000"],
            )
        })
        .collect();
    let mode = Mode::Remote(&coordinator.address);
    assert_exactly_once(resize_run(mode, &data, 4, 3, 2));
    assert_exactly_once(resize_run(mode, &data, 2, 5, 3));
    assert_next_epoch_is_plain(mode, &data, 3);
}
