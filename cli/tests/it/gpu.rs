//! The GPU side of the loader that runs without a GPU: batches taken early without waiting
//! (what the device stage copies ahead), GPU idle as the consumer reports it (stats and the
//! prefetch controller), page-locked slots asked for where there is no CUDA driver (an error
//! naming what is missing) or beside other page-locked memory of the same budget, what a
//! decode lane beside the step costs it as the consumer reports it, and a decode lane in the
//! loader's hook (what it is asked, its figures, its end). The GPU itself is exercised by `python-client/tests/test_gpu.py`
//! on a GPU machine.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stoker_gpu::{DevicePinning, PinDevice};
use stoker_loader::{
    build_on_pool, DecodeLane, EmbeddedStep, Error, GpuDecodeFigures, LaneWindow, Loader,
    LoaderOptions, PageLocker, PinOptions, PinnedShare, StartDecodeLane,
};
use stoker_pipeline::Job;

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
    loader.record_gpu_idle(Duration::from_millis(4), Duration::from_millis(9), None);
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
    if stoker_gpu::cuda_driver_present() {
        // With a driver, pinning works or fails for another reason: test_gpu.py covers it.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 8);
    let spec = common::train_spec(dir.path(), 4);
    let options = LoaderOptions {
        threads: 1,
        pin: Some(PinOptions {
            locker: Arc::new(DevicePinning::new(PinDevice::Follow(0))),
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

/// A decode lane in the loader's hook that builds each step it has a share of (the even ones)
/// on the decode pool itself, and counts what the loader asks of it.
#[derive(Default)]
struct CountingLane {
    asked: AtomicU64,
    built: AtomicU64,
    delivered: AtomicU64,
    resumed: Mutex<Vec<(u64, u64, u8)>>,
    shutdowns: AtomicU64,
    /// What `busy` answers, in milliseconds.
    busy_ms: AtomicU64,
}

impl DecodeLane for CountingLane {
    fn split_at(&self, _epoch: u64, step: u64) -> u8 {
        self.asked.fetch_add(1, Ordering::Relaxed);
        if step % 2 == 0 {
            8
        } else {
            0
        }
    }

    fn build(&self, pool: &rayon::ThreadPool, step: EmbeddedStep, sixteenths: u8) {
        assert_eq!(sixteenths, 8, "only a step with a share comes to the lane");
        self.built.fetch_add(1, Ordering::Relaxed);
        build_on_pool(pool, step);
    }

    fn note_delivered(&self, _epoch: u64, _step: u64, rows: usize, _interval: Duration) {
        assert!(rows > 0);
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    fn set_split(&self, epoch: u64, step: u64, sixteenths: u8) -> bool {
        self.resumed.lock().unwrap().push((epoch, step, sixteenths));
        true
    }

    fn figures(&self) -> GpuDecodeFigures {
        GpuDecodeFigures {
            split_pct: 50.0,
            gpu_rows: self.built.load(Ordering::Relaxed),
            ..GpuDecodeFigures::default()
        }
    }

    fn busy(&self) -> Duration {
        Duration::from_millis(self.busy_ms.load(Ordering::Relaxed))
    }

    fn shutdown(&self) {
        self.shutdowns.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct StartCounting(Arc<CountingLane>);

impl std::fmt::Debug for CountingLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CountingLane")
    }
}

impl StartDecodeLane for StartCounting {
    fn start(&self, _job: &Job) -> stoker_loader::Result<Option<Arc<dyn DecodeLane>>> {
        Ok(Some(self.0.clone()))
    }
}

#[test]
fn a_decode_lane_in_the_hook_builds_its_steps_hears_their_pace_and_stops_with_the_loader() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 40);
    let spec = common::train_spec(dir.path(), 8);
    let expected = epoch_batches(&spec, 2, 0);
    let lane = Arc::new(CountingLane::default());
    let options = LoaderOptions {
        threads: 2,
        prefetch_next_epoch: false,
        decode_lane: Some(Arc::new(StartCounting(lane.clone()))),
        ..LoaderOptions::default()
    };
    let loader = Loader::new(spec.clone(), options.clone()).unwrap();
    let got: Vec<_> = loader
        .epoch(0, 0)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // The lane's steps and the pool's make the same batches.
    assert_eq!(digest(&got), digest(&expected));
    let steps = got.len() as u64;
    assert_eq!(steps, 5);
    assert!(lane.asked.load(Ordering::Relaxed) >= steps);
    assert_eq!(lane.built.load(Ordering::Relaxed), 3, "steps 0, 2 and 4");
    // Every batch after the first went out a measured interval after the one before.
    assert_eq!(lane.delivered.load(Ordering::Relaxed), steps - 1);
    let figures = loader.stats().gpu_decode.expect("the lane's figures");
    assert_eq!((figures.split_pct, figures.gpu_rows), (50.0, 3));
    let monitored = loader.monitor().snapshot().stats.gpu_decode;
    assert_eq!(monitored, Some(figures));
    loader.set_gpu_decode_split(1, 16, 4);
    assert_eq!(*lane.resumed.lock().unwrap(), vec![(1, 16, 4)]);
    assert_eq!(lane.shutdowns.load(Ordering::Relaxed), 0);
    drop(loader);
    assert_eq!(
        lane.shutdowns.load(Ordering::Relaxed),
        1,
        "closing the loader stops its lane"
    );
    // A coordinator's workers decode on their CPUs: the remote mode refuses a lane by name.
    let refused = Loader::remote("127.0.0.1:9", spec, options, Default::default())
        .err()
        .unwrap();
    assert!(matches!(refused, Error::Gpu(_)), "{refused:?}");
    assert!(refused.to_string().contains("embedded mode"), "{refused}");
}

#[test]
fn steps_the_consumer_reports_beside_the_lane_cost_what_they_take_over_quiet_ones() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 16);
    let spec = common::train_spec(dir.path(), 8);
    let lane = Arc::new(CountingLane::default());
    let options = LoaderOptions {
        threads: 1,
        decode_lane: Some(Arc::new(StartCounting(lane.clone()))),
        ..LoaderOptions::default()
    };
    let loader = Loader::new(spec.clone(), options).unwrap();
    // The consumer reads the lane's busy time through the loader.
    lane.busy_ms.store(1234, Ordering::Relaxed);
    assert_eq!(loader.lane_busy(), Some(Duration::from_millis(1234)));
    let ms = Duration::from_millis;
    let quiet = Some(LaneWindow {
        busy: Duration::ZERO,
        window: ms(10),
    });
    let beside = Some(LaneWindow {
        busy: ms(8),
        window: ms(13),
    });
    // Four quiet steps busy 10 ms of their 10.5 (the baseline), then three beside the lane
    // busy 13 ms with no wait for the batch at all: 3 ms each the lane cost.
    for _ in 0..4 {
        loader.record_gpu_idle(
            Duration::from_micros(500),
            Duration::from_micros(10_500),
            quiet,
        );
    }
    for _ in 0..3 {
        loader.record_gpu_idle(Duration::ZERO, ms(13), beside);
    }
    let stats = loader.stats();
    assert!((stats.gpu_lane_cost_s - 0.009).abs() < 1e-9, "{stats:?}");
    assert_eq!(stats.gpu_lane_quiet_steps, 4);
    assert!((stats.gpu_idle_s - 0.002).abs() < 1e-9, "{stats:?}");
    // The monitor the dashboard reads carries them.
    let monitored = loader.monitor().snapshot().stats;
    assert_eq!(monitored.gpu_lane_cost_s, stats.gpu_lane_cost_s);
    // A step without the lane's figures counts as GPU idle only.
    loader.record_gpu_idle(Duration::ZERO, ms(50), None);
    assert_eq!(loader.stats().gpu_lane_cost_s, stats.gpu_lane_cost_s);
    // Without a lane there is nothing to read.
    let plain = common::embedded_loader(spec, 1).unwrap();
    assert_eq!(plain.lane_busy(), None);
}

/// A locker that locks nothing and says it did (the pool's sizing is what is tested).
#[derive(Debug)]
struct AcceptingLocker;

impl PageLocker for AcceptingLocker {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }

    unsafe fn lock(&self, _start: *mut u8, _len: usize) -> Result<(), String> {
        Ok(())
    }

    unsafe fn unlock(&self, _start: *mut u8) {}

    fn device(&self) -> Option<usize> {
        Some(0)
    }
}

#[test]
fn a_pinned_loaders_labels_fit_the_page_locked_room_beside_its_slots() {
    let _measuring = common::PINNED_BUDGET.lock();
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 16);
    let spec = common::train_spec(dir.path(), 4);
    let budget = stoker_loader::pinned_reserved() + (256 << 20);
    let options = LoaderOptions {
        threads: 1,
        pin: Some(PinOptions {
            locker: Arc::new(AcceptingLocker),
            budget_bytes: budget,
        }),
        ..LoaderOptions::default()
    };
    let loader = Loader::new(spec, options).unwrap();
    let slots = Arc::clone(loader.slots());
    let mut held = Vec::new();
    for batch in loader.epoch(0, 0).unwrap() {
        let batch = batch.unwrap();
        let image = batch.tensor("image").unwrap();
        assert!(slots.holds_pinned(image.data.as_ptr()));
        let label = batch.tensor("label").unwrap();
        assert!(
            !slots.holds_pinned(label.data.as_ptr()),
            "labels are built apart"
        );
        let beside = slots
            .pin_beside(&[&label.data])
            .expect("room beside the slots");
        assert_eq!(beside[0], label.data);
        assert!(slots.holds_pinned(beside[0].as_ptr()));
        held.push(beside);
    }
    assert_eq!(held.len(), 4);
    // The room holds what the slots' pages do not, within the same budget.
    assert!(slots.pinned_bytes() > 0);
    assert!(stoker_loader::pinned_reserved() <= budget);
}

#[test]
fn page_locked_memory_beside_the_slots_counts_against_the_same_budget() {
    let _measuring = common::PINNED_BUDGET.lock();
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 16);
    let spec = common::train_spec(dir.path(), 4);
    let options = |budget_bytes| LoaderOptions {
        threads: 1,
        pin: Some(PinOptions {
            locker: Arc::new(AcceptingLocker),
            budget_bytes,
        }),
        ..LoaderOptions::default()
    };
    // The budget of a loader alone (this test binary's other tests may hold some: measured
    // from what is held now, with room to spare for the slots).
    let budget = stoker_loader::pinned_reserved() + (256 << 20);
    let loader = Loader::new(spec.clone(), options(budget)).unwrap();
    assert!(loader.slots().is_pinned());
    drop(loader);
    // A GPU decode lane's staging (a share of the same budget) leaves too little for the
    // slots: the loader says so, naming what holds the rest.
    let lane_staging = PinnedShare::take(budget - stoker_loader::pinned_reserved() - 4096, budget)
        .expect("the lane's staging fits first");
    let error = Loader::new(spec.clone(), options(budget)).err().unwrap();
    let message = error.to_string();
    assert!(
        message.contains("pinned memory budget")
            && message.contains("held by its other loaders and GPU decode lanes"),
        "{message}"
    );
    // Given back, the slots fit again.
    drop(lane_staging);
    assert!(Loader::new(spec, options(budget)).is_ok());
}
