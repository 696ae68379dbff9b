//! Shared fixtures of the loader's integration tests: small generated image sets and specs,
//! and the daemons (`stoker coordinator`, `stoker-worker`) as child processes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use stoker_datasets::{generate_imagenet_like, SyntheticImageNetSpec};
use stoker_loader::{Batch, BatchDigest, Loader, LoaderOptions, Tensor};
use stoker_proto::v1::{self as proto, BadSamplePolicy, JobSpec};

/// A temporary folder holding `count` images in `data/`; returns it and that folder.
pub fn images_in_tempdir(count: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let data = dir.path().join("data");
    make_images(&data, count);
    (dir, data)
}

/// Writes a seeded ImageNet-like set of `count` images under `dir`.
pub fn make_images(dir: &Path, count: u64) {
    let spec = SyntheticImageNetSpec {
        count,
        seed: 11,
        classes: 10,
    };
    generate_imagenet_like(dir, &spec, &|_| {}).expect("sample set");
}

/// The imagenet-train spec over `dir` at a small output size (fast tests).
pub fn train_spec(dir: &Path, batch_size: u32) -> JobSpec {
    spec_over(
        &dir.to_string_lossy(),
        stoker_pipeline::presets::imagenet_train(32),
        batch_size,
    )
}

/// A shuffled single-rank spec (seed 3, skip policy) of `pipeline` over the dataset at `uri`.
pub fn spec_over(uri: &str, pipeline: Vec<proto::Op>, batch_size: u32) -> JobSpec {
    JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: uri.to_string(),
            ..Default::default()
        }),
        pipeline,
        batch_size,
        seed: 3,
        shuffle: true,
        drop_last: false,
        rank: 0,
        world_size: 1,
        uneven_tail: 0,
        on_error: BadSamplePolicy::Skip as i32,
        shuffle_window: 0,
        resized_epoch: None,
        mix: None,
    }
}

/// Runs the `stoker` binary built for these tests.
pub fn stoker(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(args)
        .output()
        .expect("stoker runs")
}

/// The `stoker-worker` binary, beside `stoker`: cargo names only a package's own binaries to
/// its tests, and the daemon is the worker-daemon crate's. `cargo test --workspace` builds it; a
/// missing one, or one older than the sources it is built from, fails the test with the
/// command that builds it.
pub fn worker_binary() -> PathBuf {
    built_binary(
        "stoker-worker",
        "stoker-worker-daemon",
        &[
            "worker-daemon/src",
            "rpc/src",
            "pipeline/src",
            "datasets/src",
            "proto/src",
            "proto/stoker",
        ],
    )
}

/// Held by the tests that size a pinned budget from what this process holds now
/// (`stoker_loader::pinned_reserved`), so that none takes a share while another measures.
pub static PINNED_BUDGET: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The `stoker-lane-helper` binary, beside `stoker` (the lane-helper crate's), checked as
/// [`worker_binary`] is.
pub fn helper_binary() -> PathBuf {
    built_binary(
        "stoker-lane-helper",
        "stoker-lane-helper",
        &["lane-helper/src", "gpu/src", "proto/stoker"],
    )
}

/// Binary `name` of package `package`, beside `stoker`, no older than any file below `sources`.
fn built_binary(name: &str, package: &str, sources: &[&str]) -> PathBuf {
    let stoker = Path::new(env!("CARGO_BIN_EXE_stoker"));
    let binary = stoker.with_file_name(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let build = format!("cargo build --release -p {package} (or cargo test --workspace)");
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{} is not usable ({e}): {build}", binary.display()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    for sources in sources {
        if let Some((path, modified)) = newest_file(&root.join(sources)) {
            assert!(
                modified <= built,
                "{} is older than {}: {build}",
                binary.display(),
                path.display()
            );
        }
    }
    binary
}

/// The most recently modified file below `dir`, and when.
fn newest_file(dir: &Path) -> Option<(PathBuf, std::time::SystemTime)> {
    let mut newest: Option<(PathBuf, std::time::SystemTime)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let candidate = if path.is_dir() {
            newest_file(&path)
        } else {
            let modified = entry.metadata().and_then(|m| m.modified());
            modified.ok().map(|modified| (path, modified))
        };
        if let Some(candidate) = candidate {
            if newest.as_ref().is_none_or(|(_, time)| candidate.1 > *time) {
                newest = Some(candidate);
            }
        }
    }
    newest
}

/// `stoker convert` of `folder` to `to` at `out`, with `extra` flags.
pub fn convert_args<'a>(
    folder: &'a Path,
    to: &'a str,
    out: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "convert",
        "--from",
        folder.to_str().expect("a UTF-8 path"),
        "--to",
        to,
        "--out",
        out.to_str().expect("a UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    args
}

/// Runs `stoker` and returns its stdout, failing the test (with its stderr) if it fails.
pub fn stdout_of(args: &[&str]) -> String {
    let output = stoker(args);
    assert!(
        output.status.success(),
        "stoker {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An embedded loader of `spec` with `threads` decode threads and default options otherwise.
pub fn embedded_loader(spec: JobSpec, threads: usize) -> stoker_loader::Result<Loader> {
    Loader::new(
        spec,
        LoaderOptions {
            threads,
            ..LoaderOptions::default()
        },
    )
}

/// Every batch of `epoch` of `spec`, from an embedded loader with `threads` decode threads.
pub fn try_epoch(spec: &JobSpec, threads: usize, epoch: u64) -> stoker_loader::Result<Vec<Batch>> {
    embedded_loader(spec.clone(), threads)?
        .epoch(epoch, 0)?
        .collect()
}

/// Like [`try_epoch`], failing the test on any error.
pub fn epoch_batches(spec: &JobSpec, threads: usize, epoch: u64) -> Vec<Batch> {
    try_epoch(spec, threads, epoch).expect("an epoch of batches")
}

/// The SHA-256 of `batches`, as `stoker digest` prints it.
pub fn digest(batches: &[Batch]) -> String {
    let mut digest = BatchDigest::new();
    batches.iter().for_each(|b| digest.update(b));
    digest.hex()
}

/// The tensor `name` of `batch`.
pub fn tensor<'a>(batch: &'a Batch, name: &str) -> &'a Tensor {
    batch.tensor(name).expect("the tensor is in the batch")
}

/// The elements of `tensor` as `T`, which must be its dtype.
pub fn elements<T: stoker_proto::Element>(tensor: &Tensor) -> Vec<T> {
    tensor.elements().unwrap_or_else(|| {
        panic!(
            "tensor {} has dtype {:?} and {} bytes, not {:?} elements",
            tensor.name,
            tensor.dtype,
            tensor.data.len(),
            T::DTYPE
        )
    })
}

/// A child daemon, SIGKILLed and reaped when dropped.
pub struct Daemon {
    child: Child,
    /// The gRPC address it printed.
    pub address: String,
    /// The first line it printed.
    pub banner: String,
}

impl Daemon {
    /// Starts `program` and waits (30 s at most) for its "... listening on ADDR" line.
    pub fn start(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Daemon {
        Daemon::start_logging_to(program, args, Stdio::inherit())
    }

    /// [`Daemon::start`], its log (stderr) going to `log`.
    pub fn start_logging_to(
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
        log: impl Into<Stdio>,
    ) -> Daemon {
        Daemon::start_with_env(program, args, log, &[])
    }

    /// [`Daemon::start_logging_to`] with `env` set in its environment.
    pub fn start_with_env(
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
        log: impl Into<Stdio>,
        env: &[(&str, &str)],
    ) -> Daemon {
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("daemon starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("daemon prints its address");
        let words: Vec<&str> = line.split_whitespace().collect();
        let on = words
            .iter()
            .position(|w| *w == "on")
            .expect("'listening on ADDR' on the first line");
        let address = words[on + 1].to_string();
        Daemon {
            child,
            address,
            banner: line.trim().to_string(),
        }
    }

    /// A coordinator on `listen` journaling in `state`, with an 800 ms lease timeout.
    pub fn coordinator(state: &Path, listen: &str) -> Daemon {
        Daemon::coordinator_with(state, listen, &[])
    }

    /// [`Daemon::coordinator`] with more flags (the lease timeout among them, if they name
    /// one).
    pub fn coordinator_with(state: &Path, listen: &str, extra: &[&str]) -> Daemon {
        let state = state.to_str().expect("a UTF-8 path");
        let args = ["coordinator", "--listen", listen, "--state", state];
        let lease: &[&str] = if extra.contains(&"--lease-timeout-ms") {
            &[]
        } else {
            &["--lease-timeout-ms", "800"]
        };
        let args = [&args[..], lease, extra].concat();
        Daemon::start(env!("CARGO_BIN_EXE_stoker"), &args)
    }

    /// A one-thread worker of `coordinator` reading under `root`.
    pub fn worker(coordinator: &str, root: &Path) -> Daemon {
        Daemon::worker_with(coordinator, root, &[])
    }

    /// [`Daemon::worker`] with more flags.
    pub fn worker_with(coordinator: &str, root: &Path, extra: &[&str]) -> Daemon {
        Daemon::worker_logging_to(coordinator, root, extra, Stdio::inherit())
    }

    /// [`Daemon::worker_with`], its log (stderr) going to `log`.
    pub fn worker_logging_to(
        coordinator: &str,
        root: &Path,
        extra: &[&str],
        log: impl Into<Stdio>,
    ) -> Daemon {
        let root = root.to_str().expect("a UTF-8 path");
        let args = ["--coordinator", coordinator, "--data-root", root];
        let args = [&args[..], &["--threads", "1"], extra].concat();
        Daemon::start_logging_to(worker_binary(), &args, log)
    }

    /// Its resident memory in KiB (`VmRSS` of `/proc/PID/status`; Linux only).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the daemon's /proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
            .expect("a VmRSS line")
    }

    /// Sends it SIGTERM (the way Kubernetes stops a pod), without waiting.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends it `signal`, without waiting.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "signal {signal} sent"
        );
    }

    /// Waits up to `within` for it to exit; its status, if it did.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The word after `key` on its first line (`dashboard`, `health`: their URLs), without
    /// `http://` or `https://`.
    pub fn banner_after(&self, key: &str) -> String {
        let words: Vec<&str> = self.banner.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| *w == key)
            .unwrap_or_else(|| panic!("{key} on the banner {:?}", self.banner));
        words[at + 1]
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .to_string()
    }

    /// SIGKILLs and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A one-thread tokio runtime for a test's own RPCs.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A plaintext client, with no token, of the coordinator at `address`.
pub async fn coordinator_client(
    address: &str,
) -> stoker_proto::v1::coordinator_client::CoordinatorClient<tonic::transport::Channel> {
    stoker_proto::v1::coordinator_client::CoordinatorClient::connect(format!("http://{address}"))
        .await
        .expect("a connection to the coordinator")
}

/// A source over another that counts its reads, and can be slowed down or made to panic on
/// one sample (once `panic_after` reads of it have passed: 0 panics on the first).
pub struct TestSource {
    inner: std::sync::Arc<dyn stoker_datasets::SampleSource>,
    /// Reads of every sample so far.
    pub reads: std::sync::atomic::AtomicU64,
    delay: Duration,
    panic_on: Option<u64>,
    panic_after: u64,
    reads_of_panic_on: std::sync::atomic::AtomicU64,
}

impl TestSource {
    pub fn new(
        inner: std::sync::Arc<dyn stoker_datasets::SampleSource>,
        delay: Duration,
        panic_on: Option<u64>,
        panic_after: u64,
    ) -> TestSource {
        TestSource {
            inner,
            reads: 0.into(),
            delay,
            panic_on,
            panic_after,
            reads_of_panic_on: 0.into(),
        }
    }
}

impl stoker_datasets::SampleSource for TestSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn label(&self, index: u64) -> i64 {
        self.inner.label(index)
    }
    fn describe(&self, index: u64) -> String {
        self.inner.describe(index)
    }
    fn read(&self, index: u64) -> stoker_datasets::Result<Vec<u8>> {
        use std::sync::atomic::Ordering;
        self.reads.fetch_add(1, Ordering::SeqCst);
        if Some(index) == self.panic_on
            && self.reads_of_panic_on.fetch_add(1, Ordering::SeqCst) >= self.panic_after
        {
            panic!("test source told to panic on sample {index}");
        }
        std::thread::sleep(self.delay);
        self.inner.read(index)
    }
    fn class_names(&self) -> &[String] {
        self.inner.class_names()
    }
}
