//! The GPU decode lane in a helper process of its own (`stoker-lane-helper`, asked for with
//! [`HELPER_VARIABLE`]): the decode threads offer the split's rows as ever, and the loader's
//! side of the lane ([`HelperLane`], the loader's `DecodeLane`) sends them to the helper, whose
//! own CUDA context decodes and crops them into output buffers the loader's process has opened
//! from their IPC handle ([`rows`]). The helper answers each batch with which rows it built
//! and which go to the CPU; the loader copies the rows into its own memory at once (a copy of
//! the buffers beside the cap) and builds the others into the slot as the lane in this process
//! does. Nothing the helper does can reach this process's CUDA context: if it dies, stops
//! answering (for [`HelperOptions::answer_timeout`]) or says something out of step, it is
//! stopped, every batch it owed and every later one is built on the CPU, and the lane's
//! figures say why ([`HelperLane::lost`]).

mod inner;
mod process;
mod rows;
pub mod wire;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prost::Message;

use stoker_dashboard::GpuDecodeFigures;
use stoker_loader::{DecodeLane, EmbeddedStep, PinnedShare};
use stoker_pipeline::Job;
use stoker_proto::v1::{helper_request, HelperRequest, HelperRows};

use super::lane::{CpuRow, LaneDiverter, LaneSplit, LaneStats};
use super::{GpuDecodeError, GpuDecodeOptions, LaneTask, RowTail};
use inner::{end, lock, Inner, Pending, NO_RING};
use process::{
    check_started, discard, end_and_close, failed, open_device, read_answers, spawn, watch_answers,
    without_sigpipe, Spawned,
};
use wire::{image_message, write_message};

/// Asks for the lane in a helper process: `1` finds `stoker-lane-helper` where the running
/// program's installation keeps its commands or on `PATH` ([`helper_asked`]); a path names the
/// binary. Unset, empty or `0`: the lane runs in this
/// process.
pub const HELPER_VARIABLE: &str = "STOKER_GPU_DECODE_HELPER";

/// The helper's file name.
pub const HELPER_BINARY: &str = "stoker-lane-helper";

/// How the helper process is run.
#[derive(Debug, Clone, PartialEq)]
pub struct HelperOptions {
    /// The `stoker-lane-helper` binary.
    pub binary: PathBuf,
    /// Variables set in the helper's environment beside this process's own.
    pub env: Vec<(String, String)>,
    /// How long a batch may wait for the helper's answer before the helper is taken as lost.
    pub answer_timeout: Duration,
    /// How long the helper may take to start (CUDA, nvJPEG and the kernel's compilation).
    pub start_timeout: Duration,
    /// How long the helper may take to end once the lane closes (told the end, its stdin
    /// closed) before it is killed.
    pub end_timeout: Duration,
}

impl HelperOptions {
    /// The defaults for `binary`: 60 s for an answer, 120 s to start, 10 s to end.
    pub fn new(binary: PathBuf) -> HelperOptions {
        HelperOptions {
            binary,
            env: Vec::new(),
            answer_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(120),
            end_timeout: Duration::from_secs(10),
        }
    }
}

/// The helper binary [`HELPER_VARIABLE`]'s `value` asks for: `None` when it asks for none,
/// else the binary, or why it cannot be found. For `1` it is looked for in `first` (the folders
/// the running program's installation puts commands in, in order), then on `path` (the `PATH`
/// variable).
pub fn helper_asked(
    value: Option<&str>,
    first: &[PathBuf],
    path: Option<&std::ffi::OsStr>,
) -> Result<Option<PathBuf>, String> {
    let value = value.map(str::trim).unwrap_or_default();
    match value {
        "" | "0" => Ok(None),
        "1" => {
            let folders = first
                .iter()
                .cloned()
                .chain(path.map(std::env::split_paths).into_iter().flatten());
            folders
                .map(|folder| folder.join(HELPER_BINARY))
                .find(|candidate| candidate.is_file())
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "{HELPER_VARIABLE}=1: no {HELPER_BINARY} where the running program's \
                         commands are installed or on PATH (`pip install stoker` installs it; \
                         `cargo build --release -p stoker-lane-helper` builds it; or set \
                         {HELPER_VARIABLE} to its path)"
                    )
                })
        }
        named => {
            let binary = PathBuf::from(named);
            if binary.is_file() {
                Ok(Some(binary))
            } else {
                Err(format!(
                    "{HELPER_VARIABLE}={named}: not a file (1 finds {HELPER_BINARY}; 0 runs the \
                     lane in this process)"
                ))
            }
        }
    }
}

/// The loader's side of the lane in a helper process (see the module docs).
pub struct HelperLane {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for HelperLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperLane")
            .field("pid", &self.inner.pid)
            .field("lost", &*lock(&self.inner.lost))
            .finish_non_exhaustive()
    }
}

impl HelperLane {
    /// Starts the helper for `job`'s rows (one image source, uint8 NHWC on the CPU side) in
    /// batches of up to `batch_size`, and waits for it to say it runs.
    pub fn start(
        options: &GpuDecodeOptions,
        helper: &HelperOptions,
        job: &Job,
        batch_size: usize,
    ) -> Result<HelperLane, GpuDecodeError> {
        let pipeline = super::lane::image_rows_of(job)?;
        let (height, width) = pipeline.output_size();
        let row_bytes = pipeline.bytes_per_sample();
        let fused =
            super::fused_tail_asked(std::env::var(super::FUSED_TAIL_VARIABLE).ok().as_deref())
                .map_err(GpuDecodeError::Unsupported)?;
        let tail = if fused { options.tail } else { RowTail::BYTES };
        let Spawned {
            mut child,
            requests,
            answers: stdout,
            started,
        } = spawn(options, helper, (height, width), batch_size, &tail)?;
        // The helper's page-locked memory (its staging, and nvJPEG's pinned buffers within the
        // limit it keeps to) is reserved within this process's pinned budget.
        let reserved = started.pinned_limit.max(started.staging_bytes);
        let pinned = match options.pinned_budget {
            Some(budget) if reserved > 0 => match PinnedShare::take(reserved, budget) {
                Ok(share) => Some(share),
                Err(held) => {
                    return Err(failed(
                        &mut child,
                        format!(
                            "its page-locked memory ({reserved} bytes: {} of staging, the rest \
                             for nvJPEG's pinned buffers) does not fit in the pinned memory \
                             budget of {budget} bytes for this process ({held} held by its \
                             loaders and lanes)",
                            started.staging_bytes
                        ),
                    ))
                }
            },
            _ => None,
        };
        let answer = (tail.element.name(), tail.row_bytes(height, width));
        if let Err(why) = check_started(&started, answer, batch_size) {
            return Err(failed(&mut child, format!("its start answer: {why}")));
        }
        let device = match started.device {
            false => None,
            true => match open_device(options.device, &started) {
                Ok(side) => Some(side),
                Err(error) => return Err(failed(&mut child, error.to_string())),
            },
        };
        let ring_slots = if device.is_some() {
            started.ring_slots as usize
        } else {
            // Without a device the helper builds no rows: the buffers are names only.
            2
        };
        tracing::info!(
            pid = started.pid,
            device = started.device,
            hardware = started.hardware,
            ring_slots,
            "the GPU decode lane's helper process started"
        );
        let inner = Arc::new(Inner {
            split: LaneSplit::new(options.mode),
            stats: Arc::new(LaneStats::default()),
            tail,
            out: (width, height),
            row_bytes,
            device,
            requests: Mutex::new(Some(requests)),
            pid: child.id(),
            owner: std::process::id(),
            pinned_refused: AtomicU64::new(0),
            child: Mutex::new(child),
            copying: Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
            free: Mutex::new((0..ring_slots).rev().collect()),
            returned: Condvar::new(),
            lost: Mutex::new(None),
            failed_in_a_row: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            answer_timeout: helper.answer_timeout,
            end_timeout: helper.end_timeout,
            started,
            pinned: Mutex::new(pinned),
        });
        let lane = HelperLane {
            inner: Arc::clone(&inner),
            threads: Mutex::new(Vec::new()),
        };
        let reader = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("stoker-lane-helper-answers".into())
                .spawn(move || read_answers(&inner, stdout))
        };
        let watch = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("stoker-lane-helper-watch".into())
                .spawn(move || watch_answers(&inner))
        };
        for thread in [reader, watch] {
            match thread {
                Ok(thread) => lock(&lane.threads).push(thread),
                Err(error) => {
                    lane.shutdown();
                    return Err(GpuDecodeError::Unsupported(format!(
                        "a thread for the helper: {error}"
                    )));
                }
            }
        }
        Ok(lane)
    }

    /// The helper's process id.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// Why the helper was lost, once it was.
    pub fn lost(&self) -> Option<String> {
        lock(&self.inner.lost).clone()
    }

    /// Whether the helper builds rows on a device (else the test hook that starts it without
    /// one is set, and it sends every image back).
    pub fn on_device(&self) -> bool {
        self.inner.started.device
    }

    /// Page-locked bytes the helper's lane took as it started (its staging).
    pub fn staging_bytes(&self) -> u64 {
        self.inner.started.staging_bytes
    }

    /// Page-locked bytes reserved for the helper within this process's pinned budget: its
    /// staging and the room it keeps for nvJPEG's pinned buffers (0 without a budget, and once
    /// the helper is gone).
    pub fn pinned_bytes(&self) -> u64 {
        lock(&self.inner.pinned)
            .as_ref()
            .map_or(0, PinnedShare::bytes)
    }

    /// nvJPEG's pinned allocations the helper refused past the page-locked limit it keeps to
    /// (their images built on the CPU), as its latest answer said.
    pub fn pinned_refused(&self) -> u64 {
        self.inner.pinned_refused.load(Ordering::Relaxed)
    }

    /// Whether the helper's decoders use the hardware engines.
    pub fn hardware(&self) -> bool {
        self.inner.started.hardware
    }

    /// What the rows are (the kernel applying the device stage's tail, or the bytes).
    pub fn rows_tail(&self) -> RowTail {
        self.inner.tail
    }

    /// The counts so far (this process's view: rows the helper built, rows built here).
    pub fn stats(&self) -> &LaneStats {
        &self.inner.stats
    }

    /// The lane's figures now (its memory: the helper's, and this process's copy of the
    /// helper's output buffers beside the cap; why the helper was lost, once it was).
    pub fn figures(&self) -> GpuDecodeFigures {
        let inner = &self.inner;
        let started = &inner.started;
        // The helper's memory and this process's copy of its output buffers.
        let copy = inner
            .device
            .as_ref()
            .map_or(0, |side| side.own_bytes() as u64);
        let mut figures = inner.split.figures(
            &inner.stats,
            (started.memory_bytes + copy, started.memory_cap),
            started.hardware,
        );
        figures.lost = lock(&inner.lost).clone();
        if figures.lost.is_some() {
            figures.split_pct = 0.0;
        }
        figures
    }

    /// Stops the lane: this process's mapping of the helper's buffers is closed (the rows
    /// handed out are in its own copy and stay valid as long as a batch holds them), then the
    /// helper is told the end and its stdin closed; it finishes what it was sent and exits,
    /// and is killed if it has not within [`HelperOptions::end_timeout`]. Batches still
    /// waiting fail as stopped.
    /// Idempotent. In a process forked from the one that started the helper (which has none
    /// of the lane's threads, and shares its pipes), it does nothing: that helper is not its
    /// own to end.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        if std::process::id() != inner.owner {
            return;
        }
        if inner.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        {
            let _free = lock(&inner.free);
            inner.returned.notify_all();
        }
        inner.close_mapping();
        // Its stdin closes, unless a batch is being written to a helper that stopped reading
        // (the write holds it): the kill below ends that write.
        let deadline = Instant::now() + inner.end_timeout;
        let stdin_closed = loop {
            match inner.requests.try_lock() {
                Ok(mut requests) => break Some(requests.take()),
                Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                    break Some(poisoned.into_inner().take())
                }
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() >= deadline => {
                    break None
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(5))
                }
            }
        };
        // What is left of its time to end (none when its stdin could not be closed).
        let left = match stdin_closed {
            Some(requests) => {
                if let Some(requests) = requests {
                    end_and_close(requests, deadline);
                }
                deadline.saturating_duration_since(Instant::now())
            }
            None => Duration::ZERO,
        };
        let ended = end(&mut lock(&inner.child), left);
        if ended.is_some() {
            // A write blocked on it ended with it; its page-locked pages went with it.
            if let Some(requests) = lock(&inner.requests).take() {
                discard(requests);
            }
            drop(lock(&inner.pinned).take());
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        if ended.is_some() {
            for thread in threads {
                let _ = thread.join();
            }
        } else {
            // Its output may never end: the reader is left to end with it.
            tracing::error!(
                pid = inner.pid,
                "the lane's helper did not end 5 s after it was killed"
            );
        }
        inner.drain();
    }

    /// Sends a batch's images to the helper; if it is lost (or is lost now), the batch is
    /// built on the CPU here.
    fn send(&self, task: LaneTask) {
        let inner = &self.inner;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let lost = task.ring == NO_RING || lock(&inner.lost).is_some();
        let request = HelperRequest {
            kind: Some(helper_request::Kind::Rows(HelperRows {
                id,
                ring: task.ring as u32,
                images: task
                    .items
                    .iter()
                    .map(|item| image_message(&item.image))
                    .collect(),
            })),
        };
        let pending = Pending {
            job: task.job,
            epoch: task.epoch,
            step: task.step,
            slot: task.slot,
            assembled: task.assembled,
            indices: task.indices,
            sent: task
                .items
                .iter()
                .map(|item| CpuRow {
                    row: item.image.row,
                    sample: item.image.sample,
                })
                .collect(),
            ring: task.ring,
            reply: task.reply,
            started: task.started,
            sent_at: Instant::now(),
        };
        // A batch past the largest message is built here, the helper kept.
        let too_large = request.encoded_len() > wire::MAX_MESSAGE;
        if lost || too_large {
            let reply = pending.reply.clone();
            let _ = reply.send(inner.finish(pending, None));
            return;
        }
        inner.add_pending(id, pending);
        let written = match lock(&inner.requests).as_mut() {
            // A helper that died makes the write fail, never this process end (SIGPIPE).
            Some(requests) => {
                without_sigpipe(|| write_message(requests, &request)).map_err(|e| e.to_string())
            }
            None => Err("its stdin is closed".into()),
        };
        if let Err(error) = written {
            inner.lose(format!("sending it a batch: {error}"));
            // `lose` built what the helper owed; if it was lost already (and this batch added
            // after that), the batch is built here.
            let taken = inner.take_pending(id);
            if let Some(pending) = taken {
                let reply = pending.reply.clone();
                let _ = reply.send(inner.finish(pending, None));
            }
        }
    }
}

impl Drop for HelperLane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl super::backend::StepLane for HelperLane {
    fn diverter(&self, sixteenths: u8) -> LaneDiverter {
        let max = if self.inner.device.is_some() {
            self.inner.started.max_decoded_bytes as usize
        } else {
            usize::MAX
        };
        LaneDiverter::new(sixteenths, max, &self.inner.stats)
    }

    fn note_cpu(&self, rows: usize, busy: Duration) {
        self.inner.stats.note_cpu(rows, busy);
    }

    fn take_ring(&self) -> Option<usize> {
        self.inner.take_ring()
    }

    fn submit(&self, task: LaneTask) {
        self.send(task);
    }
}

impl DecodeLane for HelperLane {
    fn split_at(&self, epoch: u64, step: u64) -> u8 {
        // A lost helper takes no share: the split a step saves (and a resume repeats) is the
        // one it was built with.
        if lock(&self.inner.lost).is_some() {
            return 0;
        }
        self.inner.split.split_at(epoch, step, &self.inner.stats)
    }

    fn build(&self, pool: &rayon::ThreadPool, step: EmbeddedStep, sixteenths: u8) {
        // A lost helper takes nothing: every row is built on the decode threads.
        let lost = lock(&self.inner.lost).is_some();
        super::backend::build_with_lane(pool, self, step, if lost { 0 } else { sixteenths });
    }

    fn note_delivered(&self, epoch: u64, step: u64, rows: usize, interval: Duration) {
        self.inner.split.note_delivered(epoch, step, rows, interval);
    }

    fn set_split(&self, epoch: u64, step: u64, sixteenths: u8) -> bool {
        self.inner.split.set(epoch, step, sixteenths)
    }

    fn figures(&self) -> GpuDecodeFigures {
        HelperLane::figures(self)
    }

    fn busy(&self) -> Duration {
        self.inner.stats.busy()
    }

    fn shutdown(&self) {
        HelperLane::shutdown(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helper_asked_for_is_found_where_commands_are_installed_then_on_path_or_named() {
        let beside = tempfile_dir("beside");
        let scripts = tempfile_dir("scripts");
        let first = [scripts.clone(), beside.clone()];
        let on_path = tempfile_dir("on-path");
        let path = std::env::join_paths([on_path.as_path()]).unwrap();
        for off in [None, Some(""), Some("0"), Some(" 0 ")] {
            assert_eq!(helper_asked(off, &first, Some(&path)), Ok(None), "{off:?}");
        }
        let missing = helper_asked(Some("1"), &first, Some(&path)).unwrap_err();
        assert!(missing.contains("no stoker-lane-helper"), "{missing}");
        std::fs::write(on_path.join(HELPER_BINARY), b"").unwrap();
        assert_eq!(
            helper_asked(Some("1"), &first, Some(&path)),
            Ok(Some(on_path.join(HELPER_BINARY)))
        );
        std::fs::write(beside.join(HELPER_BINARY), b"").unwrap();
        assert_eq!(
            helper_asked(Some("1"), &first, Some(&path)),
            Ok(Some(beside.join(HELPER_BINARY))),
            "the installation's folders first"
        );
        std::fs::write(scripts.join(HELPER_BINARY), b"").unwrap();
        assert_eq!(
            helper_asked(Some("1"), &first, Some(&path)),
            Ok(Some(scripts.join(HELPER_BINARY))),
            "in their order"
        );
        let named = on_path.join(HELPER_BINARY);
        let text = named.to_string_lossy().into_owned();
        assert_eq!(helper_asked(Some(&text), &[], None), Ok(Some(named)));
        let wrong = helper_asked(Some("/no/such/helper"), &[], None).unwrap_err();
        assert!(wrong.contains("not a file"), "{wrong}");
        std::fs::remove_dir_all(beside).unwrap();
        std::fs::remove_dir_all(scripts).unwrap();
        std::fs::remove_dir_all(on_path).unwrap();
    }

    #[test]
    fn a_helper_is_given_a_minute_to_answer_two_to_start_and_ten_seconds_to_end() {
        let options = HelperOptions::new(PathBuf::from("helper"));
        assert_eq!(options.answer_timeout, Duration::from_secs(60));
        assert_eq!(options.start_timeout, Duration::from_secs(120));
        assert_eq!(options.end_timeout, Duration::from_secs(10));
        assert!(options.env.is_empty());
    }

    /// A fresh folder of this test's under the temporary folder.
    fn tempfile_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("stoker-helper-asked-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
