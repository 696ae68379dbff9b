//! The GPU side of the loader that runs without a GPU: batches taken early without waiting
//! (what the device stage copies ahead), GPU idle as the consumer reports it (stats and the
//! prefetch controller), and page-locked slots asked for where there is no CUDA driver (an
//! error naming what is missing). The GPU itself is exercised by `python-client/tests/test_gpu.py`
//! on a GPU machine.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use stoker_loader::{Error, Loader, LoaderOptions, PinOptions};

use crate::common::{self, digest, epoch_batches};

#[test]
fn batches_taken_early_are_the_same_batches_in_the_same_order() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 60);
    let spec = common::train_spec(dir.path(), 8);
    let expected = epoch_batches(&spec, 2, 0);
    let loader = common::embedded_loader(spec, 2).unwrap();
    let mut stream = loader.epoch(0, 0).unwrap();
    let mut got = Vec::new();
    let mut early = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Alternate: a waiting next, then whatever has already arrived.
        match stream.next_batch().unwrap() {
            Some(batch) => got.push(batch),
            None => break,
        }
        while let Some(batch) = stream.try_next_batch().unwrap() {
            early += 1;
            got.push(batch);
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(Instant::now() < deadline);
    }
    assert_eq!(digest(&got), digest(&expected));
    assert!(
        early > 0,
        "the sleeps let batches arrive before they were asked for"
    );
    assert!(stream.try_next_batch().unwrap().is_none(), "past the end");
}

#[test]
fn try_next_batch_never_waits() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 40);
    let spec = common::train_spec(dir.path(), 8);
    let loader = common::embedded_loader(spec, 1).unwrap();
    let mut stream = loader.epoch(0, 0).unwrap();
    let started = Instant::now();
    let first = stream.try_next_batch().unwrap();
    assert!(started.elapsed() < Duration::from_millis(50));
    // Nothing had arrived the instant the epoch started; the waiting call then gets step 0.
    if first.is_none() {
        assert_eq!(stream.next_batch().unwrap().unwrap().step, 0);
    }
}

#[test]
fn gpu_idle_reported_by_the_consumer_shows_in_stats_and_raises_the_depth() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 96);
    let spec = common::train_spec(dir.path(), 4);
    let loader = Loader::new(
        spec,
        LoaderOptions {
            threads: 2,
            ..LoaderOptions::default()
        },
    )
    .unwrap();
    let mut stream = loader.epoch(0, 0).unwrap();
    // Let the producer fill the queue and go idle, then take batches with a steady step.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..6 {
        stream.next_batch().unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = loader.controller_snapshot().unwrap();
    assert_eq!(loader.stats().gpu_idle_s, 0.0);
    // The consumer's GPU stream sat idle 4 ms of 9 for the next batch, while the host did not
    // wait: that is stall too.
    loader.record_gpu_idle(Duration::from_millis(4), Duration::from_millis(9));
    stream.next_batch().unwrap().unwrap();
    let after = loader.controller_snapshot().unwrap();
    let stats = loader.stats();
    assert!((stats.gpu_idle_s - 0.004).abs() < 1e-9 && (stats.gpu_span_s - 0.009).abs() < 1e-9);
    assert!(
        after.target_depth > before.target_depth,
        "{before:?} -> {after:?}"
    );
    assert_eq!(after.last_change, stoker_loader::ChangeReason::Stall);
}

#[test]
fn pinned_slots_without_a_cuda_driver_are_an_error_naming_it() {
    if stoker_loader::cuda_driver_present() {
        // With a driver, pinning works or fails for another reason: test_gpu.py covers it.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 8);
    let spec = common::train_spec(dir.path(), 4);
    let options = LoaderOptions {
        threads: 1,
        pin: Some(PinOptions {
            device: 0,
            follow_thread: true,
            budget_bytes: 1 << 30,
        }),
        ..LoaderOptions::default()
    };
    let error = Loader::new(spec, options).err().unwrap();
    assert!(matches!(error, Error::Gpu(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("page-locked batch slots need the CUDA driver")
            && message.contains("libcuda.so.1"),
        "{message}"
    );
}
