//! The GPU decode lane in a helper process, where no GPU is needed: the helper started for
//! real without a device (its test hook), so every row it is offered comes back to be built
//! on the CPU. What holds here holds for the process around a lane on a device: the batches
//! are the CPU's, bit for bit; a helper killed, or stopped so that it no longer answers, costs
//! the run nothing (its batches and every later one are built on the CPU, the figures say why);
//! a helper that cannot start leaves `"auto"` on the CPU and fails `"gpu"` with its reason.
//! The rows a helper builds on a device are `python-client/tests/test_gpu_decode.py`'s.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use stoker_gpu::{
    DecodeMode, GpuDecodeOptions, HelperLane, HelperOptions, RowTail, StartGpuLane,
    DEFAULT_GPU_MEMORY,
};
use stoker_lane_helper::{FAULT_VARIABLE, NO_DEVICE_VARIABLE, STAGING_VARIABLE};
use stoker_loader::{Loader, LoaderOptions, StartDecodeLane};
use stoker_proto::v1::JobSpec;

use crate::common::{self, digest, epoch_batches};

fn starter(mode: DecodeMode, env: &[(&str, &str)], answer_timeout: Duration) -> Arc<StartGpuLane> {
    let mut helper = HelperOptions::new(common::helper_binary());
    helper.env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    helper.answer_timeout = answer_timeout;
    starter_of(helper, mode)
}

/// A starter of the lane for `mode` in `helper`.
fn starter_of(helper: HelperOptions, mode: DecodeMode) -> Arc<StartGpuLane> {
    Arc::new(StartGpuLane::new(GpuDecodeOptions {
        mode,
        device: 0,
        memory_bytes: DEFAULT_GPU_MEMORY,
        library_dirs: Vec::new(),
        pinned_budget: None,
        tail: RowTail::BYTES,
        helper: Some(helper),
    }))
}

/// `count` images in a temporary folder and the training spec over them, batches of 8.
fn images(count: u64) -> (tempfile::TempDir, JobSpec) {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), count);
    let spec = common::train_spec(dir.path(), 8);
    (dir, spec)
}

/// A helper without a device for `mode`, taken as lost after `answer_timeout`.
fn deviceless(mode: DecodeMode, answer_timeout: Duration) -> Arc<StartGpuLane> {
    starter(mode, &[(NO_DEVICE_VARIABLE, "1")], answer_timeout)
}

/// Every batch of `epoch`, failing the test on an error.
fn whole_epoch(loader: &Loader, epoch: u64) -> Vec<stoker_pipeline::Batch> {
    loader
        .epoch(epoch, 0)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn loader(spec: &JobSpec, starter: &Arc<StartGpuLane>) -> stoker_loader::Result<Loader> {
    Loader::new(
        spec.clone(),
        LoaderOptions {
            threads: 2,
            prefetch_next_epoch: false,
            decode_lane: Some(Arc::clone(starter) as Arc<dyn StartDecodeLane>),
            ..LoaderOptions::default()
        },
    )
}

#[test]
fn a_helper_without_a_device_gives_the_cpus_batches_and_ends_with_the_loader() {
    let (dir, spec) = images(40);
    // A descriptor this process holds without CLOEXEC, as a library's may be.
    let marker = dir.path().join("inherited-marker");
    std::fs::write(&marker, b"").unwrap();
    let path = std::ffi::CString::new(marker.to_str().unwrap()).unwrap();
    // SAFETY: a plain open of a file the test made; closed below.
    let inheritable = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
    assert!(inheritable >= 0);
    let expected = epoch_batches(&spec, 2, 0);
    let starter = deviceless(DecodeMode::Gpu, Duration::from_secs(60));
    let loader = loader(&spec, &starter).unwrap();
    let got = whole_epoch(&loader, 0);
    assert_eq!(digest(&got), digest(&expected));
    assert!(got.iter().all(|batch| batch.device_rows.is_none()));
    let helper = starter.helper().expect("the helper lane runs");
    assert!(!helper.on_device());
    assert_eq!(helper.lost(), None);
    let stats = helper.stats();
    // Every row was offered (decode="gpu"): declined by the decode threads' marker scan, or
    // sent and come back.
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    let (sent_back, declined) = (load(&stats.fallback_rows), load(&stats.declined_rows));
    assert_eq!(sent_back + declined, 40);
    assert!(sent_back >= 30, "{sent_back} sent and come back");
    assert_eq!(load(&stats.gpu_rows), 0);
    let figures = loader.stats().gpu_decode.expect("the lane's figures");
    assert_eq!((figures.split_pct, figures.gpu_rows), (100.0, 0));
    assert_eq!(figures.lost, None);
    // The lane's busy time (what `auto`'s rates and the lane-cost figure read) ran while
    // batches waited for the helper's answers, and runs no more once all were answered.
    assert!(load(&stats.gpu_busy_ns) > 0, "no busy time counted");
    let busy = loader.lane_busy().expect("the lane's busy time");
    assert_eq!(busy, Duration::from_nanos(load(&stats.gpu_busy_ns)));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        loader.lane_busy(),
        Some(busy),
        "a batch still counted as in work"
    );
    let pid = helper.pid() as i32;
    // It did not inherit the descriptor.
    let held: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .collect();
    // SAFETY: an empty range past any descriptor: only asks whether the kernel has the call.
    let close_range = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            u32::MAX - 1,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    } == 0;
    assert!(
        !close_range || !held.contains(&marker),
        "the helper holds {held:?}"
    );
    // SAFETY: the descriptor opened above.
    unsafe { libc::close(inheritable) };
    // In a process group of its own (a Ctrl-C at the training script's terminal is not its).
    // SAFETY: a query of the test's own child process.
    assert_eq!(unsafe { libc::getpgid(pid) }, pid);
    // The loader's end closes the helper's stdin: it exits and is reaped.
    dropped_and_reaped(helper, loader, "a loader's end");
}

/// Drops `loader` and the test's hold on its `helper` lane, and checks the helper process
/// ended and was reaped by then (`what` names the case).
fn dropped_and_reaped(helper: Arc<HelperLane>, loader: Loader, what: &str) {
    let pid = helper.pid() as i32;
    drop(helper);
    drop(loader);
    assert!(
        !process_exists(pid),
        "{what}: the helper {pid} was left behind"
    );
}

/// Whether process `pid` exists (a zombie counts: it was not reaped).
fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks the process.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Reads an epoch, sending `signal` to the helper after `after` batches; the batches.
fn epoch_with_signal(
    loader: &Loader,
    starter: &StartGpuLane,
    after: usize,
    signal: i32,
) -> Vec<stoker_pipeline::Batch> {
    let mut got = Vec::new();
    for batch in loader.epoch(0, 0).unwrap() {
        got.push(batch.unwrap());
        if got.len() == after {
            let pid = starter.helper().unwrap().pid() as i32;
            // SAFETY: a signal to the test's own child process.
            assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        }
    }
    got
}

#[test]
fn a_killed_helper_costs_the_run_nothing() {
    let (_dir, spec) = images(96);
    let expected: Vec<_> = (0..2).map(|epoch| epoch_batches(&spec, 2, epoch)).collect();
    let starter = deviceless(DecodeMode::Gpu, Duration::from_secs(60));
    let loader = loader(&spec, &starter).unwrap();
    let got = epoch_with_signal(&loader, &starter, 3, libc::SIGKILL);
    assert_eq!(
        digest(&got),
        digest(&expected[0]),
        "every batch of the epoch, the CPU's"
    );
    let helper = starter.helper().unwrap();
    let lost = helper.lost().expect("the helper is known lost");
    assert!(lost.contains("signal: 9"), "{lost}");
    // The loader's figures, which its monitor and the dashboard read, say so too.
    let figures = loader.stats().gpu_decode.expect("the lane's figures");
    assert_eq!(figures.lost.as_deref(), Some(lost.as_str()));
    let monitored = loader.monitor().snapshot().stats.gpu_decode;
    assert_eq!(monitored.and_then(|f| f.lost), Some(lost.clone()));
    // The dashboard's page names it beside the lane's figures.
    let dashboard = stoker_loader::Dashboard::start("127.0.0.1:0".parse().unwrap()).unwrap();
    dashboard.register_job("lane", 0, loader.monitor());
    let address = dashboard.local_addr();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let key = loop {
        let jobs = crate::dashboard::get_json(address, "/api/jobs");
        let job = &jobs["jobs"][0];
        if job["current"]["gpu_decode"]["lost"].as_str() == Some(lost.as_str()) {
            break job["key"].as_str().unwrap().to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no lost lane in {jobs}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let profile = tempfile::tempdir().unwrap();
    let dump = crate::dashboard::run_with_limit(
        crate::dashboard::headless(profile.path())
            .arg("--dump-dom")
            .arg(format!("http://{address}/")),
        Duration::from_secs(90),
    );
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dom = String::from_utf8(dump.stdout).unwrap();
    let shown = crate::dashboard::text_of(&dom, &format!("job-{key}-decode"));
    assert!(
        shown.contains("lost (") && shown.contains("signal: 9"),
        "{shown}"
    );
    drop(dashboard);
    // Later epochs are built on the CPU from the start.
    assert_eq!(digest(&whole_epoch(&loader, 1)), digest(&expected[1]));
}

#[test]
fn a_helper_that_stops_answering_is_stopped_and_its_batches_built_on_the_cpu() {
    let (_dir, spec) = images(64);
    let expected = epoch_batches(&spec, 2, 0);
    let starter = deviceless(DecodeMode::Gpu, Duration::from_secs(2));
    let loader = loader(&spec, &starter).unwrap();
    let got = epoch_with_signal(&loader, &starter, 2, libc::SIGSTOP);
    assert_eq!(digest(&got), digest(&expected));
    let helper = starter.helper().unwrap();
    let lost = helper.lost().expect("the helper is known lost");
    assert!(lost.starts_with("no answer to a batch in"), "{lost}");
    // It was killed (a stopped process takes SIGKILL) and reaped.
    dropped_and_reaped(helper, loader, "stopped");
}

#[test]
fn a_helper_out_of_step_in_any_way_costs_the_run_nothing() {
    let (_dir, spec) = images(64);
    let expected: Vec<_> = (0..2).map(|epoch| epoch_batches(&spec, 2, epoch)).collect();
    // Each way, after three answers: how the loader names the loss.
    let faults = [
        // Its output ends, or a batch written to it meets its closed stdin first.
        ("exit:3", "(the process: exit status: 0)"),
        (
            "garbage:3",
            "reading its answers: a frame of 4294967295 bytes",
        ),
        ("unsent:3", "which was not sent"),
        ("device-row:3", "device rows where its buffer holds 0"),
        // Every batch answered as failed (a broken CUDA context): it served on, never lost,
        // its share of each batch rebuilt on one thread, nothing said above debug.
        (
            "error:3",
            "its lane failed 3 batches in a row, the last with: CUDA_ERROR",
        ),
    ];
    for (fault, named) in faults {
        let env = [(NO_DEVICE_VARIABLE, "1"), (FAULT_VARIABLE, fault)];
        let starter = starter(DecodeMode::Gpu, &env, Duration::from_secs(60));
        let loader = loader(&spec, &starter).unwrap();
        for (epoch, expected) in expected.iter().enumerate() {
            let got = whole_epoch(&loader, epoch as u64);
            assert_eq!(digest(&got), digest(expected), "{fault}: epoch {epoch}");
        }
        let helper = starter.helper().unwrap();
        let lost = helper.lost().expect("the helper is known lost");
        assert!(lost.contains(named), "{fault}: {lost}");
        // Lost, it takes no share: the figures and the split a step saves say so (they said
        // the split asked for, which a resume would have repeated).
        assert_eq!(helper.figures().split_pct, 0.0, "{fault}");
        assert_eq!(
            stoker_loader::DecodeLane::split_at(&*helper, 9, 0),
            0,
            "{fault}"
        );
        dropped_and_reaped(helper, loader, fault);
    }
}

#[test]
fn a_loader_dropped_while_its_helper_hangs_ends_the_helper() {
    let (_dir, spec) = images(64);
    let mut helper = HelperOptions::new(common::helper_binary());
    helper.env = vec![(NO_DEVICE_VARIABLE.to_string(), "1".to_string())];
    helper.end_timeout = Duration::from_secs(1);
    let starter = starter_of(helper, DecodeMode::Gpu);
    let loader = loader(&spec, &starter).unwrap();
    let mut epoch = loader.epoch(0, 0).unwrap();
    for _ in 0..2 {
        epoch.next().unwrap().unwrap();
    }
    let pid = starter.helper().unwrap().pid() as i32;
    // SAFETY: a signal to the test's own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // The batches sent to it since wait for answers that do not come (for a minute).
    std::thread::sleep(Duration::from_millis(300));
    let dropped = std::time::Instant::now();
    drop(epoch);
    drop(loader);
    assert!(
        dropped.elapsed() < Duration::from_secs(8),
        "dropping the loader took {:?}",
        dropped.elapsed()
    );
    // The producer thread, whose write the kill ended, lets go of the lane as it ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while starter.helper().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lane outlived its loader"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its stdin closed, it did not end within the second it was given: killed and reaped.
    assert!(
        !process_exists(pid),
        "the hung helper {pid} was left behind"
    );
}

#[test]
fn a_helper_that_cannot_start_leaves_auto_on_the_cpu_and_fails_gpu_with_its_reason() {
    let (dir, spec) = images(16);
    let expected = epoch_batches(&spec, 2, 0);
    // CUDA sees no device in the helper, on any machine.
    let no_device = [("CUDA_VISIBLE_DEVICES", "")];
    let auto = starter(DecodeMode::Auto, &no_device, Duration::from_secs(60));
    let loader = loader(&spec, &auto).unwrap();
    assert_eq!(digest(&whole_epoch(&loader, 0)), digest(&expected));
    assert!(auto.helper().is_none());
    assert!(loader.stats().gpu_decode.is_none(), "no lane ran");

    let gpu = starter(DecodeMode::Gpu, &no_device, Duration::from_secs(60));
    let error = loader_error(&spec, &gpu);
    assert!(
        error.contains("the lane's helper process cannot run the lane"),
        "{error}"
    );

    // A binary that is not there.
    let gone = starter_of(
        HelperOptions::new(dir.path().join("no-such-helper")),
        DecodeMode::Gpu,
    );
    let error = loader_error(&spec, &gone);
    assert!(error.contains("no-such-helper"), "{error}");
}

/// The error a `"gpu"` loader of `spec` with `starter` fails with (at its start or its first
/// epoch's).
fn loader_error(spec: &JobSpec, starter: &Arc<StartGpuLane>) -> String {
    match loader(spec, starter) {
        Err(error) => error.to_string(),
        Ok(loader) => match loader.epoch(0, 0) {
            Err(error) => error.to_string(),
            Ok(mut epoch) => epoch
                .find_map(Result::err)
                .expect("the epoch fails")
                .to_string(),
        },
    }
}

/// A copy of this process made by [`forked_waiting`]: killed and reaped when dropped.
struct Forked(i32);

impl Drop for Forked {
    fn drop(&mut self) {
        // SAFETY: the test's own child process, then its reaping.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// Forks this process; the copy runs `first` (which must take no lock: the copy has only the
/// forking thread), then waits, holding every descriptor this one has, as a training script's
/// forked worker does, until it is killed or 60 s have passed (so a failed test leaves none).
fn forked_waiting(first: impl FnOnce()) -> Forked {
    // SAFETY: the child runs `first`, then only async-signal-safe calls (`alarm`, `pause`,
    // `_exit`) before it ends.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        first();
        // SAFETY: as above.
        unsafe {
            libc::alarm(60);
            libc::pause();
            libc::_exit(0);
        }
    }
    Forked(pid)
}

#[test]
fn a_loader_dropped_while_a_forked_process_holds_the_helpers_stdin_ends_it_at_once() {
    let (_dir, spec) = images(16);
    // The default end timeout (10 s): a helper waiting for its stdin to end would be killed
    // only then.
    let starter = deviceless(DecodeMode::Gpu, Duration::from_secs(60));
    let loader = loader(&spec, &starter).unwrap();
    whole_epoch(&loader, 0);
    let helper = starter.helper().expect("the helper lane runs");
    // The forked copy drops its hold on the lane (as a copy of the training process ending
    // would): the helper is not its to end, and the loader here reads on with it.
    let forked = forked_waiting(|| helper.shutdown());
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        process_exists(helper.pid() as i32),
        "the fork ended the helper"
    );
    whole_epoch(&loader, 1);
    assert_eq!(helper.lost(), None);
    let dropped = std::time::Instant::now();
    dropped_and_reaped(helper, loader, "a loader's end beside a forked process");
    let took = dropped.elapsed();
    drop(forked);
    assert!(
        took < Duration::from_secs(5),
        "the helper ended {took:?} after the loader was dropped"
    );
}

/// Set in the copy of this test binary that plays the training process.
const TRAINING_PROCESS: &str = "STOKER_TEST_TRAINING_PROCESS";

#[test]
fn a_helper_whose_loader_process_died_beside_a_forked_one_ends() {
    if std::env::var_os(TRAINING_PROCESS).is_some() {
        // The training process: its lane's helper runs, a forked worker holds the helper's
        // stdin, and it dies without dropping anything.
        let (_dir, spec) = images(16);
        let starter = deviceless(DecodeMode::Gpu, Duration::from_secs(60));
        let loader = loader(&spec, &starter).unwrap();
        whole_epoch(&loader, 0);
        let helper = starter.helper().expect("the helper lane runs").pid();
        let forked = forked_waiting(|| {});
        println!("helper {helper} forked {}", forked.0);
        std::mem::forget(forked);
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        // SAFETY: ends this process at once, as a crash would.
        unsafe { libc::_exit(0) };
    }
    // Its output is read up to its line only: the forked process holds the pipe open. It
    // makes its images under a folder of this process's, as its own end removes nothing.
    let scratch = tempfile::tempdir().unwrap();
    let mut training = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lane_helper::a_helper_whose_loader_process_died_beside_a_forked_one_ends",
            "--nocapture",
        ])
        .env(TRAINING_PROCESS, "1")
        .env("TMPDIR", scratch.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = training.stdout.take().unwrap();
    let (line_tx, line) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let said = std::io::BufRead::lines(std::io::BufReader::new(stdout))
            .map_while(Result::ok)
            .find_map(|line| line.strip_prefix("helper ").map(str::to_string));
        let _ = line_tx.send(said);
    });
    let said = line.recv_timeout(Duration::from_secs(120));
    if said.is_err() {
        let _ = training.kill();
    }
    training.wait().unwrap();
    let pids: Vec<i32> = said
        .ok()
        .flatten()
        .expect("the training process names its helper")
        .split(" forked ")
        .map(|pid| pid.parse().unwrap())
        .collect();
    let (helper, forked) = (pids[0], pids[1]);
    // The forked process (now no one's child here) holds the helper's stdin open; the helper
    // ends anyway, within a few of its checks.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while running(helper) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = running(helper);
    // SAFETY: signals to the processes the test's copy started.
    unsafe {
        libc::kill(forked, libc::SIGKILL);
        if left {
            libc::kill(helper, libc::SIGKILL);
        }
    }
    assert!(
        !left,
        "the helper {helper} outlived its loader's process by 10 s"
    );
}

/// Whether process `pid` runs: it exists and is not a zombie (a process whose parent is gone
/// may be left unreaped where the system's first process does not reap).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[test]
fn the_helpers_page_locked_memory_is_reserved_within_this_processs_pinned_budget() {
    let _measuring = common::PINNED_BUDGET.lock();
    let (_dir, spec) = images(16);
    let staging: u64 = 1 << 20;
    // A helper answering 1 MiB of staging, in a budget `room` past what this process holds.
    let starter = |room: u64| {
        let mut helper = HelperOptions::new(common::helper_binary());
        helper.env = vec![
            (NO_DEVICE_VARIABLE.to_string(), "1".to_string()),
            (STAGING_VARIABLE.to_string(), staging.to_string()),
        ];
        Arc::new(StartGpuLane::new(GpuDecodeOptions {
            mode: DecodeMode::Gpu,
            device: 0,
            memory_bytes: DEFAULT_GPU_MEMORY,
            library_dirs: Vec::new(),
            pinned_budget: Some(stoker_loader::pinned_reserved() + room),
            tail: RowTail::BYTES,
            helper: Some(helper),
        }))
    };
    // Room enough: its staging and twice that for nvJPEG's pinned buffers, reserved here
    // while it runs and given back with it.
    for (room, reserved) in [(64 << 20, 3 * staging), (2 << 20, 2 << 20)] {
        let before = stoker_loader::pinned_reserved();
        let starter = starter(room);
        let loader = loader(&spec, &starter).unwrap();
        whole_epoch(&loader, 0);
        let helper = starter.helper().expect("the helper lane runs");
        assert_eq!(helper.staging_bytes(), staging);
        assert_eq!(helper.pinned_bytes(), reserved, "room {room}");
        assert!(stoker_loader::pinned_reserved() >= before + reserved);
        dropped_and_reaped(helper, loader, "a loader's end");
    }
    // Less room than its staging: the helper does not start, and says why.
    let error = loader_error(&spec, &starter(staging / 2));
    assert!(
        error.contains("page-locked staging (1048576 bytes) does not fit"),
        "{error}"
    );
}

/// A helper whose loader ended before the helper first read its parent (the parent it then
/// read, here this test, lives on, and a forked process holds its stdin) ends within a few of
/// its checks: it watched that parent for good, with its share of the GPU's memory. A helper
/// whose loader runs stays.
#[test]
fn a_helper_whose_loader_ended_as_it_started_ends() {
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let gone = ended.id().to_string();
    ended.wait().unwrap();
    let ours = std::process::id().to_string();
    let start = |loader: &str| {
        std::process::Command::new(common::helper_binary())
            .env(NO_DEVICE_VARIABLE, "1")
            .env(stoker_gpu::helper_wire::LOADER_PID_VARIABLE, loader)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut orphaned = start(&gone);
    let mut served = start(&ours);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut status = None;
    while status.is_none() && std::time::Instant::now() < deadline {
        status = orphaned.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let alive = served.try_wait().unwrap().is_none();
    let _ = orphaned.kill();
    let _ = served.kill();
    let _ = (orphaned.wait(), served.wait());
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{status:?}");
    assert!(alive, "the helper of a running loader stays");
}

/// A panic as a batch the helper gave back is built on the CPU (on the thread that reads the
/// helper's answers) fails that step with the panic named, as in the lane without a helper:
/// the step never came, and the loader waited out its timeout.
#[test]
fn a_panic_building_a_batch_the_helper_gave_back_fails_its_step() {
    let (_dir, spec) = images(16);
    // The decode threads read each sample once; a batch the helper gives back is built on
    // the CPU from a second read, which panics on sample 3.
    let source = stoker_pipeline::open_sources(&spec).unwrap().remove(0);
    let source = Arc::new(common::TestSource::new(source, Duration::ZERO, Some(3), 1));
    let job = stoker_pipeline::Job::with_source(spec, source).unwrap();
    let starter = deviceless(DecodeMode::Gpu, Duration::from_secs(60));
    let loader = Loader::from_job(
        job,
        LoaderOptions {
            threads: 2,
            prefetch_next_epoch: false,
            decode_lane: Some(Arc::clone(&starter) as Arc<dyn StartDecodeLane>),
            deadline: Duration::from_secs(20),
            ..LoaderOptions::default()
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    let results: Vec<_> = loader.epoch(0, 0).unwrap().collect();
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("panicked") && e.contains("told to panic on sample 3")),
        "{errors:?} after {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// Set in the child of the test below: it is the loader's process, paused by its parent.
const PAUSED_PROCESS: &str = "STOKER_TEST_PAUSED_LOADER";

/// A job suspended past the helper's answer timeout (its processes stopped, then resumed, the
/// helper a moment after the loader) keeps its helper: the watch, waking after the pause,
/// counted the pause as the helper's and killed it.
#[test]
fn a_loader_paused_past_the_answer_timeout_keeps_its_helper() {
    if std::env::var_os(PAUSED_PROCESS).is_some() {
        let (_dir, spec) = images(64);
        let starter = deviceless(DecodeMode::Gpu, Duration::from_secs(2));
        let loader = loader(&spec, &starter).unwrap();
        let mut batches = loader.epoch(0, 0).unwrap();
        batches.next().unwrap().unwrap();
        let helper = starter.helper().expect("the helper lane runs").pid();
        println!("reading {helper}");
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        for batch in batches {
            batch.unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
        let lost = starter.helper().expect("the helper lane runs").lost();
        println!("lost {lost:?}");
        return;
    }
    let mut paused = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lane_helper::a_loader_paused_past_the_answer_timeout_keeps_its_helper",
            "--nocapture",
        ])
        .env(PAUSED_PROCESS, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = paused.id() as i32;
    let stdout = paused.stdout.take().unwrap();
    let (said, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = said.send(line);
        }
    });
    let wait_for = |prefix: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while let Ok(line) = lines.recv_timeout(deadline - std::time::Instant::now()) {
            if line.starts_with(prefix) {
                return Some(line);
            }
        }
        None
    };
    let reading = wait_for("reading ");
    if let Some(helper) = reading
        .as_deref()
        .and_then(|line| line.strip_prefix("reading ")?.parse::<i32>().ok())
    {
        // SAFETY: signals the child this test started and the helper it started.
        unsafe {
            libc::kill(helper, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(150));
            libc::kill(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_secs(3));
            libc::kill(pid, libc::SIGCONT);
            std::thread::sleep(Duration::from_millis(300));
            libc::kill(helper, libc::SIGCONT);
        }
    }
    let lost = wait_for("lost ");
    let _ = paused.kill();
    let _ = paused.wait();
    assert!(reading.is_some(), "the child never read");
    assert_eq!(lost.as_deref(), Some("lost None"));
}
