//! Resuming mid-epoch on another world size: the ranks of the first run stop part-way through
//! an epoch; the ranks of the second run, more or fewer, read what is left. Every sample of the
//! epoch arrives exactly once overall (checked by sample index), embedded and through real
//! coordinator and worker daemons, also when the coordinator is SIGKILLed and restarted in the
//! middle of the resized epoch; the next epoch is the plain one of the new world size.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use stoker_loader::{Loader, LoaderOptions, RemoteOptions};
use stoker_pipeline::resized_spec;
use stoker_proto::v1::{JobSpec, OpenSessionRequest, RegisterJobRequest};

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
    loader_with_prefetch(mode, spec, 0)
}

/// [`loader`] with a fixed prefetch depth (0: the controller's).
fn loader_with_prefetch(mode: Mode<'_>, spec: JobSpec, prefetch: usize) -> Loader {
    match mode {
        Mode::Embedded => common::embedded_loader(spec, 1).unwrap(),
        Mode::Remote(address) => Loader::remote(
            address,
            spec,
            LoaderOptions {
                prefetch,
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
    let (_dir, data) = common::images_in_tempdir(SAMPLES);
    // 4 ranks x 25 samples: 3 steps of 4 read (48), 52 left for 2 ranks.
    assert_exactly_once(resize_run(Mode::Embedded, &data, 4, 3, 2));
    // 2 ranks x 50: 5 steps read (40), 60 left, 20 for each of 3 ranks.
    assert_exactly_once(resize_run(Mode::Embedded, &data, 2, 5, 3));
    assert_next_epoch_is_plain(Mode::Embedded, &data, 3);
}

#[test]
fn a_loader_beside_the_plain_one_reads_the_resized_epoch_over_its_slots_and_threads() {
    let (_dir, data) = common::images_in_tempdir(SAMPLES);
    let resumed_spec =
        |rank| resized_spec(&spec(&data, rank, 3), SAMPLES, 1, 2, Vec::new(), &[5, 5]).unwrap();
    let plain = common::embedded_loader(spec(&data, 0, 3), 1).unwrap();
    // More threads asked for than the plain loader has: sharing its threads gives its count.
    let options = LoaderOptions {
        threads: 3,
        ..LoaderOptions::default()
    };
    let beside = plain
        .beside(resumed_spec(0), options, |_| {
            panic!("an embedded loader builds the resized epoch on its own decode threads")
        })
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(plain.slots(), beside.slots()));
    assert_eq!(beside.threads(), 1);
    // The same batches as a loader of the resized epoch alone.
    let alone = loader(Mode::Embedded, resumed_spec(0));
    assert_eq!(read(&beside, 1, None), read(&alone, 1, None));
    // Another job (a larger batch) is not built on the plain loader's threads or slots.
    let mut larger = resumed_spec(0);
    larger.batch_size = BATCH * 2;
    let mut started = false;
    let other = plain
        .beside(larger, LoaderOptions::default(), |spec| {
            started = true;
            let job = stoker_pipeline::Job::open(spec)?;
            Ok(Box::new(stoker_loader::EmbeddedSource::start(job, 1)?))
        })
        .unwrap();
    assert!(started);
    assert!(!std::sync::Arc::ptr_eq(plain.slots(), other.slots()));
    drop(other);
    // Dropping it leaves the shared decode threads to the plain loader.
    drop(beside);
    let fresh = loader(Mode::Embedded, spec(&data, 0, 3));
    assert_eq!(read(&plain, 2, None), read(&fresh, 2, None));
}

#[test]
fn distributed_four_ranks_resumed_on_two_and_two_on_three_read_each_sample_once() {
    let (dir, data) = common::images_in_tempdir(SAMPLES);
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

/// Step -> sample indices of every batch of `epoch` from an embedded loader of `spec`.
fn embedded_steps(spec: &JobSpec, epoch: u64) -> BTreeMap<u64, Vec<u64>> {
    loader(Mode::Embedded, spec.clone())
        .epoch(epoch, 0)
        .unwrap()
        .map(|batch| {
            let batch = batch.unwrap();
            (batch.step, batch.sample_indices)
        })
        .collect()
}

/// What the coordinator at `address` journaled: the id it registers `spec` under (an existing
/// job when it knows the spec), and the acknowledged position of each (rank, epoch) asked.
fn journaled(address: &str, spec: &JobSpec, positions: &[(u32, u64)]) -> (u64, Vec<u64>) {
    let runtime = common::runtime();
    runtime.block_on(async {
        let mut client = common::coordinator_client(address).await;
        let job = client
            .register_job(RegisterJobRequest {
                spec: Some(spec.clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .job_id;
        let mut acknowledged = Vec::new();
        for &(rank, epoch) in positions {
            let opened = client
                .open_session(OpenSessionRequest {
                    job_id: job,
                    rank,
                    epoch,
                    start_step: 0,
                    resume_from_journal: true,
                })
                .await
                .unwrap()
                .into_inner();
            acknowledged.push(opened.acknowledged_position);
        }
        (job, acknowledged)
    })
}

#[test]
fn a_resized_epoch_survives_a_coordinator_restarted_mid_epoch() {
    let (dir, data) = common::images_in_tempdir(SAMPLES);
    let state = dir.path().join("state");
    let mut coordinator = Daemon::coordinator(&state, "127.0.0.1:0");
    let address = coordinator.address.clone();
    let _workers: Vec<Daemon> = (0..2)
        .map(|_| Daemon::worker_with(&address, dir.path(), &["--delivery-timeout-ms", "1000"]))
        .collect();
    let mode = Mode::Remote(&address);

    // 4 ranks x 25 samples stop after 3 steps of 4 (48 read); 2 ranks resume the 52 left.
    let mut all = Vec::new();
    for rank in 0..4 {
        all.extend(read(&loader(mode, spec(&data, rank, 4)), 1, Some(3)));
    }
    let resized: Vec<JobSpec> = (0..2)
        .map(|rank| {
            resized_spec(&spec(&data, rank, 2), SAMPLES, 1, 4, Vec::new(), &[3; 4]).unwrap()
        })
        .collect();
    // A shallow prefetch: the steps past the restart are asked of the restarted coordinator.
    let loaders: Vec<Loader> = resized
        .iter()
        .map(|spec| loader_with_prefetch(mode, spec.clone(), 2))
        .collect();
    let steps = loaders[0].steps_per_epoch();
    assert_eq!(steps, 7, "26 samples per new rank");
    let mut streams: Vec<_> = loaders.iter().map(|l| l.epoch(1, 0).unwrap()).collect();
    let mut seen = vec![BTreeMap::new(); 2];
    let mut restarted = None;
    for step in 0..steps {
        if step == 2 {
            coordinator.kill();
            restarted = Some(Daemon::coordinator(&state, &address));
        }
        for (rank, stream) in streams.iter_mut().enumerate() {
            let batch = stream.next_batch().unwrap().expect("a batch per step");
            assert_eq!(batch.step, step, "rank {rank} yields in step order");
            assert!(
                seen[rank]
                    .insert(step, batch.sample_indices.clone())
                    .is_none(),
                "rank {rank} step {step} delivered twice"
            );
        }
    }
    for stream in &mut streams {
        assert!(stream.next_batch().unwrap().is_none(), "the epoch ends");
    }
    assert_eq!(
        restarted.as_ref().map(|d| d.address.as_str()),
        Some(address.as_str())
    );
    for (rank, spec) in resized.iter().enumerate() {
        assert_eq!(
            seen[rank],
            embedded_steps(spec, 1),
            "rank {rank}: the resized job's samples at the same steps as in process"
        );
        all.extend(seen[rank].values().flatten().copied());
    }
    assert_exactly_once(all);
    drop(streams);
    drop(loaders);
    assert_next_epoch_is_plain(mode, &data, 2);

    // The journal itself: after one more restart with no client left, the coordinator still
    // knows the resized job by its spec (cursor included), apart from the plain job of world
    // size 2, with the new ranks' positions in the resized epoch; the plain job has none there.
    let plain = spec(&data, 0, 2);
    let (resized_job, _) = journaled(&address, &resized[0], &[]);
    let (plain_job, _) = journaled(&address, &plain, &[]);
    assert_ne!(resized_job, plain_job, "a resized job is a job of its own");
    // Positions are flushed every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    drop(restarted.take());
    let _again = Daemon::coordinator(&state, &address);
    let (job, positions) = journaled(&address, &resized[1], &[(0, 1), (1, 1)]);
    assert_eq!(job, resized_job);
    assert_eq!(positions, [steps, steps], "the new ranks' positions");
    let plain_steps = SAMPLES.div_ceil(2 * u64::from(BATCH));
    let (job, positions) = journaled(&address, &plain, &[(0, 1), (1, 1), (0, 2), (1, 2)]);
    assert_eq!(job, plain_job);
    assert_eq!(
        positions,
        [0, 0, plain_steps, plain_steps],
        "the plain job: its own epoch 2, nothing of the resized epoch"
    );
}
