//! The embedded loader end to end on real files: order, determinism across thread counts,
//! exact resume, bounded prefetch, deadlines, and panics that must not take the process down.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use stoker_datasets::SampleSource;
use stoker_loader::Batch;
use stoker_loader::{Error, Loader, LoaderOptions};
use stoker_pipeline::Job;
use stoker_proto::v1::JobSpec;

use crate::common::{self, digest, epoch_batches, TestSource};

#[test]
fn batches_are_bit_identical_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 90);
    let spec = common::train_spec(dir.path(), 16);
    let one = epoch_batches(&spec, 1, 0);
    assert_eq!(one.len(), 6);
    for threads in [2, 3, 5] {
        assert_eq!(
            digest(&epoch_batches(&spec, threads, 0)),
            digest(&one),
            "threads={threads}"
        );
    }
    // Another epoch or seed changes the batches.
    assert_ne!(digest(&epoch_batches(&spec, 2, 1)), digest(&one));
    let reseeded = JobSpec {
        seed: 4,
        ..spec.clone()
    };
    assert_ne!(digest(&epoch_batches(&reseeded, 2, 0)), digest(&one));
}

#[test]
fn the_trainers_step_is_measured_from_the_second_batch_of_each_epoch() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 48);
    let spec = common::train_spec(dir.path(), 8);
    let loader = common::embedded_loader(spec, 2).unwrap();
    for epoch in 0..2 {
        for batch in loader.epoch(epoch, 0).unwrap() {
            batch.unwrap();
            std::thread::sleep(Duration::from_millis(15));
        }
    }
    let seen = loader.controller_snapshot().unwrap();
    // A first call's step of 0 once seeded the estimate at 0, where the burst clip held it.
    assert!(
        seen.step_mean >= Duration::from_millis(10),
        "{:?}",
        seen.step_mean
    );
}

#[test]
fn batches_come_in_step_order_and_cover_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 50);
    let spec = common::train_spec(dir.path(), 8);
    let batches = epoch_batches(&spec, 2, 0);
    let mut seen: Vec<u64> = Vec::new();
    for (step, batch) in batches.iter().enumerate() {
        assert_eq!(batch.step, step as u64);
        let image = &batch.tensors[0];
        assert_eq!(image.name, "image");
        assert_eq!(
            image.shape,
            vec![batch.sample_indices.len() as u64, 32, 32, 3]
        );
        assert_eq!(image.data.len(), batch.sample_indices.len() * 32 * 32 * 3);
        let label = &batch.tensors[1];
        assert_eq!(label.name, "label");
        assert_eq!(label.data.len(), batch.sample_indices.len() * 8);
        seen.extend(&batch.sample_indices);
    }
    // 50 samples in batches of 8: six full batches and one of 2, like DataLoader.
    assert_eq!(batches.last().unwrap().sample_indices.len(), 2);
    seen.sort();
    assert_eq!(seen, (0..50).collect::<Vec<_>>());
}

#[test]
fn labels_follow_the_class_folders() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 40);
    let spec = JobSpec {
        shuffle: false,
        ..common::train_spec(dir.path(), 40)
    };
    let batch = epoch_batches(&spec, 2, 0).remove(0);
    let folder = stoker_datasets::ImageFolder::open(dir.path()).unwrap();
    let labels: Vec<i64> = common::elements(&batch.tensors[1]);
    for (slot, index) in batch.sample_indices.iter().enumerate() {
        assert_eq!(labels[slot], folder.label(*index));
        let path = folder.path(*index).unwrap();
        let class = path
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(folder.class_names()[labels[slot] as usize], class);
    }
}

#[test]
fn resuming_mid_epoch_gives_the_same_batches() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 70);
    let spec = common::train_spec(dir.path(), 10);
    let full = epoch_batches(&spec, 2, 3);
    let loader = common::embedded_loader(spec, 2).unwrap();
    let resumed: Vec<Batch> = loader.epoch(3, 4).unwrap().map(|b| b.unwrap()).collect();
    assert_eq!(resumed.len(), full.len() - 4);
    assert_eq!(digest(&resumed), digest(&full[4..]));
    assert!(loader.epoch(3, 99).is_err());
}

fn test_loader(
    dir: &std::path::Path,
    delay: Duration,
    panic_on: Option<u64>,
    options: LoaderOptions,
) -> (Loader, Arc<TestSource>) {
    let folder = stoker_datasets::ImageFolder::open(dir).unwrap();
    let source = Arc::new(TestSource::new(Arc::new(folder), delay, panic_on, 0));
    let spec = JobSpec {
        shuffle: false,
        ..common::train_spec(dir, 4)
    };
    let job = Job::with_source(spec, source.clone()).unwrap();
    (Loader::from_job(job, options).unwrap(), source)
}

#[test]
fn prefetch_stays_bounded_when_the_consumer_is_slow() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 80);
    let (loader, source) = test_loader(
        dir.path(),
        Duration::ZERO,
        None,
        LoaderOptions {
            threads: 2,
            prefetch: 3,
            ..LoaderOptions::default()
        },
    );
    let mut stream = loader.epoch(0, 0).unwrap();
    stream.next_batch().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // One batch taken, three more at most in flight or waiting: 4 batches of 4 samples read.
    assert!(stream.in_flight() <= 3);
    assert!(
        source.reads.load(Ordering::SeqCst) <= 16,
        "read {} samples",
        source.reads.load(Ordering::SeqCst)
    );
}

#[test]
fn a_wait_past_the_deadline_names_the_step() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 12);
    let (loader, _) = test_loader(
        dir.path(),
        Duration::from_millis(200),
        None,
        LoaderOptions {
            threads: 1,
            prefetch: 1,
            deadline: Duration::from_millis(50),
            ..LoaderOptions::default()
        },
    );
    let mut stream = loader.epoch(0, 0).unwrap();
    let first = match stream.next_batch() {
        Err(
            error @ Error::Timeout {
                step: 0, epoch: 0, ..
            },
        ) => error.to_string(),
        other => panic!("expected a timeout at step 0, got {other:?}"),
    };
    // The read the batch waits for is named: one thread, each read 200 ms, the deadline at 50.
    let named = first
        .split("; the decode threads are reading ")
        .nth(1)
        .unwrap_or_else(|| panic!("no read named in {first:?}"));
    assert!(
        named.starts_with(&dir.path().display().to_string()) && named.contains(" (sample "),
        "{first}"
    );
    let message = stream.next_batch().map(|_| ()).unwrap_err().to_string();
    assert!(message.contains("step 0"), "{message}");
}

#[test]
fn a_panic_in_a_decode_thread_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 12);
    let (loader, _) = test_loader(
        dir.path(),
        Duration::ZERO,
        Some(5),
        LoaderOptions {
            threads: 2,
            ..LoaderOptions::default()
        },
    );
    let results: Vec<_> = loader.epoch(0, 0).unwrap().collect();
    assert!(results[0].is_ok());
    let message = results[1].as_ref().unwrap_err().to_string();
    assert!(message.contains("panicked building step 1"), "{message}");
    assert!(results[2].is_ok());
}

#[test]
fn stats_count_samples_and_waits() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 30);
    let loader = common::embedded_loader(common::train_spec(dir.path(), 10), 2).unwrap();
    let batches: Vec<_> = loader.epoch(0, 0).unwrap().collect();
    assert_eq!(batches.len(), 3);
    let stats = loader.stats();
    assert_eq!((stats.batches, stats.samples), (3, 30));
    assert!(stats.samples_per_s > 0.0 && stats.first_batch_s.is_some());
    assert!(stats.decode_s > 0.0);
}

#[test]
fn bad_specs_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 10);
    let good = common::train_spec(dir.path(), 4);
    for (spec, needle) in [
        (
            JobSpec {
                batch_size: 0,
                ..good.clone()
            },
            "batch_size",
        ),
        (
            JobSpec {
                batch_size: 10_000_000,
                ..good.clone()
            },
            "batch_size",
        ),
        (
            JobSpec {
                rank: 3,
                world_size: 2,
                ..good.clone()
            },
            "rank 3",
        ),
        (
            JobSpec {
                pipeline: vec![],
                ..good.clone()
            },
            "DecodeImage",
        ),
        (
            JobSpec {
                dataset: None,
                ..good.clone()
            },
            "dataset",
        ),
        (
            JobSpec {
                on_error: 9,
                ..good.clone()
            },
            "on_error",
        ),
    ] {
        let message = Loader::new(spec, LoaderOptions::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }
    let mut missing = good.clone();
    missing.dataset.as_mut().unwrap().uri = dir.path().join("nope").to_string_lossy().into_owned();
    let message = Loader::new(missing, LoaderOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(message.contains("nope"), "{message}");
}

#[test]
fn kept_batches_bound_memory_and_released_ones_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 40);
    let options = LoaderOptions {
        threads: 2,
        prefetch: 2,
        max_held_batches: 1,
        deadline: Duration::from_millis(300),
        ..LoaderOptions::default()
    };
    let loader = Loader::new(common::train_spec(dir.path(), 4), options).unwrap();
    assert_eq!(loader.slots().capacity(), 3);
    let mut stream = loader.epoch(0, 0).unwrap();
    let mut kept = Vec::new();
    for _ in 0..3 {
        kept.push(stream.next_batch().unwrap().unwrap());
    }
    // All three buffers are referenced by kept batches: the loader waits, then says why.
    let message = stream.next_batch().unwrap_err().to_string();
    assert!(message.contains("all 3 are held"), "{message}");
    assert_eq!(loader.slots().in_use(), 3);
    // Dropping batches frees their buffers and the epoch goes on from the same step.
    kept.clear();
    let next = stream.next_batch().unwrap().unwrap();
    assert_eq!(next.step, 3);
    let rest: Vec<_> = stream.map(|b| b.unwrap().step).collect();
    assert_eq!(rest, (4..10).collect::<Vec<_>>());
}

/// `dir/folder` with `count` images, and the same set written as Parquet to `dir/parquet`
/// in row groups of `rows_per_group`.
fn folder_and_parquet(dir: &std::path::Path, count: u64, rows_per_group: usize) {
    let folder = dir.join("folder");
    common::make_images(&folder, count);
    let source = stoker_datasets::ImageFolder::open(&folder).unwrap();
    stoker_datasets::write_parquet(
        &source,
        &dir.join("parquet"),
        &stoker_datasets::ParquetWriterOptions {
            file_bytes: 150_000,
            rows_per_group,
        },
        &|_| {},
    )
    .unwrap();
}

#[test]
fn parquet_epochs_cover_every_sample_once_whatever_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    folder_and_parquet(dir.path(), 70, 6);
    let parquet = dir.path().join("parquet");
    let folder_spec = common::train_spec(&dir.path().join("folder"), 8);
    for shuffle_window in [0, 3] {
        let spec = JobSpec {
            shuffle_window,
            ..common::train_spec(&parquet, 8)
        };
        let one = epoch_batches(&spec, 1, 0);
        for threads in [2, 3] {
            assert_eq!(
                digest(&epoch_batches(&spec, threads, 0)),
                digest(&one),
                "threads={threads} shuffle_window={shuffle_window}"
            );
        }
        for epoch in [0, 1] {
            let batches = if epoch == 0 {
                one.clone()
            } else {
                epoch_batches(&spec, 2, epoch)
            };
            let mut seen: Vec<u64> = batches
                .iter()
                .flat_map(|batch| batch.sample_indices.iter().copied())
                .collect();
            seen.sort();
            assert_eq!(seen, (0..70).collect::<Vec<_>>(), "epoch {epoch}");
        }
        // The same samples as the folder in the same order: the same batches when the plan is
        // the same (the global shuffle; a shuffle window needs shards, which a folder lacks).
        if shuffle_window == 0 {
            assert_eq!(digest(&one), digest(&epoch_batches(&folder_spec, 2, 0)));
        } else {
            assert_ne!(digest(&one), digest(&epoch_batches(&folder_spec, 2, 0)));
        }
    }
}
