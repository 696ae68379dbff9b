//! The lane itself: its device memory ([`memory`]), the pipes that decode and crop the rows it
//! was given ([`pipe`]), the rows it hands out with their batch ([`rows`]), and what it
//! counted ([`stats`]).
//!
//! Two pipes (unless `STOKER_GPU_DECODE_PIPES` asks for another count),
//! each a thread with its own nvJPEG decoder, CUDA stream, arena of decoded images
//! and kernel parameters (in the primary context, or in a green context of its own when
//! `STOKER_GPU_DECODE_SMS` asks), take batches from the lane's queue (their kernel writing the
//! device stage's tail straight into the rows when `STOKER_GPU_DECODE_FUSED_TAIL=1` asks):
//! nvJPEG's batched decode call returns only once the engines are done with it, so one pipe's
//! call overlaps the other's and its kernel. A pipe reuses its arena and state only once its previous work is done (an
//! event it waits for), so each pipe has at most one sub-batch on the GPU, and nothing is
//! allocated after start.

mod cpu_rows;
mod memory;
mod pipe;
mod rows;
mod serve;
mod start;
mod stats;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use cudarc::driver::DriverError;
use stoker_pipeline::{AssembledBatch, DivertedImage, ImageDiverter, Job};

use super::jpeg_scan::{scan, Decline, Frame};
use super::nvjpeg::Budget;
use super::{gpu_row, DecodeMode, GpuDecodeError, LaneCounts, RowTail};
use crate::cuda::{describe, Cuda};
use stoker_dashboard::GpuDecodeFigures;
use stoker_loader::{Built, Error, Slot};

pub(crate) use cpu_rows::{as_device_row, CpuRow, CpuRows};
pub use memory::LaneMemory;
use pipe::Work;
pub use rows::DeviceRows;
pub(crate) use serve::handle_chars;
pub use serve::{served_pinned_limit, RowsBuilt, RowsTask, ServedHandles, IPC_HANDLE_BYTES};
pub(crate) use start::image_rows_of;
use stats::add_since;
pub(crate) use stats::LaneSplit;
pub use stats::LaneStats;

/// Pipes (streams with their own decode state and arena, used in turn) unless
/// `STOKER_GPU_DECODE_PIPES` names another count from 1 to [`MAX_PIPES`].
const PIPES: usize = 2;

/// The most pipes `STOKER_GPU_DECODE_PIPES` may ask for.
const MAX_PIPES: usize = 8;

/// The pipe count: `STOKER_GPU_DECODE_PIPES` when it holds a count from 1 to [`MAX_PIPES`],
/// else [`PIPES`] (with a warning when it is set to something else).
fn pipe_count(asked: Option<&str>) -> usize {
    match asked.map(|text| text.trim().parse::<usize>()) {
        None => PIPES,
        Some(Ok(count)) if (1..=MAX_PIPES).contains(&count) => count,
        Some(_) => {
            tracing::warn!(
                asked = asked.unwrap_or_default(),
                default = PIPES,
                "STOKER_GPU_DECODE_PIPES is not a count from 1 to {MAX_PIPES}; using the default"
            );
            PIPES
        }
    }
}

/// Alignment of each decoded image in an arena.
const ALIGN: usize = 256;

/// `mutex`'s guard, a poisoned lock taken as it is (what it guards stays consistent between
/// statements).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn driver(call: &'static str) -> impl Fn(DriverError) -> GpuDecodeError {
    move |error| GpuDecodeError::Call {
        call,
        error: describe(error),
    }
}

/// What the lane and its rows share.
struct Shared {
    cuda: Arc<Cuda>,
    memory: Arc<LaneMemory>,
    free: Mutex<Vec<usize>>,
    returned: Condvar,
    stats: Arc<LaneStats>,
    budgets: Vec<Arc<Budget>>,
    /// Page-locked bytes the pipes allocated as they started.
    host_bytes: usize,
    /// The share of each step offered to the lane.
    split: LaneSplit,
    hardware: bool,
    /// Whether each pipe decodes only its images' crop windows ([`crate::decode::ROI_VARIABLE`]).
    roi: bool,
    /// What the kernel makes of the rows ([`RowTail::BYTES`] unless the tail is fused).
    tail: RowTail,
    /// Set when the lane shuts down: a pipe waiting for an output buffer gives up.
    closed: std::sync::atomic::AtomicBool,
    /// Whether the lane is served to another process ([`GpuLane::start_served`]).
    served: bool,
}

impl Shared {
    /// nvJPEG's pinned allocations refused so far, over the pipes' decoders.
    fn pinned_refused(&self) -> u64 {
        self.budgets
            .iter()
            .map(|b| b.pinned_refused.load(Ordering::Relaxed))
            .sum()
    }

    /// Waits for a free output buffer; returns it and how long the wait was, or `None` once
    /// the lane shuts down.
    fn take_ring(&self) -> (Option<usize>, Duration) {
        let started = Instant::now();
        let mut free = lock(&self.free);
        loop {
            if self.closed.load(Ordering::Relaxed) {
                return (None, started.elapsed());
            }
            if let Some(index) = free.pop() {
                return (Some(index), started.elapsed());
            }
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The lane's busy time so far ([`LaneStats::busy`]).
    fn busy(&self) -> Duration {
        self.stats.busy()
    }

    /// A pipe starts (`true`) or ends (`false`) work on a batch ([`LaneStats::working`]).
    fn working(&self, starts: bool) {
        self.stats.working(starts);
    }

    fn put_ring(&self, index: usize) {
        lock(&self.free).push(index);
        self.returned.notify_one();
    }
}

/// One batch for the lane: the slot its CPU rows are in, what assembling them gave, and the
/// samples the lane took.
pub struct LaneTask {
    /// The job (for rows built on the CPU after all).
    pub job: Arc<Job>,
    /// The batch's epoch.
    pub epoch: u64,
    /// Its step.
    pub step: u64,
    /// The slot, its CPU rows written.
    pub slot: Slot,
    /// Tensors, labels, timings and bad samples of the batch.
    pub assembled: AssembledBatch,
    /// Dataset index of each sample.
    pub indices: Vec<u64>,
    /// The samples the lane took.
    pub items: Vec<LaneItem>,
    /// The output buffer the rows go to ([`GpuLane::take_ring`], taken in step order).
    pub ring: usize,
    /// Where the finished batch goes.
    pub reply: Sender<Built>,
    /// When building the batch started.
    pub started: Instant,
}

/// A sample the lane took, with the frame its marker scan read (which nvJPEG's own parse must
/// agree with before it is decoded on the GPU).
#[derive(Debug)]
pub struct LaneItem {
    /// The sample as the decode threads offered it.
    pub image: DivertedImage,
    /// What the marker scan read, the same size as the CPU path's header.
    pub frame: Frame,
}

/// Offers a batch's GPU rows to the lane: takes the JPEGs the engines decode and that fit its
/// arena, gives the rest back to the decode threads.
pub struct LaneDiverter {
    sixteenths: u8,
    max_decoded_bytes: usize,
    taken: Mutex<Vec<LaneItem>>,
    stats: Arc<LaneStats>,
}

impl LaneDiverter {
    /// Offers the rows of `sixteenths` of a batch, taking images of up to `max_decoded_bytes`
    /// decoded and counting those it declines in `stats`.
    pub(crate) fn new(sixteenths: u8, max_decoded_bytes: usize, stats: &Arc<LaneStats>) -> Self {
        LaneDiverter {
            sixteenths,
            max_decoded_bytes,
            taken: Mutex::new(Vec::new()),
            stats: Arc::clone(stats),
        }
    }

    /// The samples taken, in row order (the decode threads offer them in any order; the lane's
    /// grouping into sub-batches must not depend on it).
    pub fn into_items(self) -> Vec<LaneItem> {
        let mut items = self.taken.into_inner().unwrap_or_else(|p| p.into_inner());
        items.sort_by_key(|item| item.image.row);
        items
    }
}

/// The decode threads' half of the acceptance decision: the marker scan's frame, when the lane
/// may take the image, its size is the CPU path's header's and its decoded bytes fit
/// `max_decoded_bytes`.
fn offered_frame(image: &DivertedImage, max_decoded_bytes: usize) -> Result<Frame, Decline> {
    let frame = scan(&image.bytes)?;
    if !frame.agrees((image.header.width, image.header.height)) {
        return Err(Decline::Disagree);
    }
    if frame.width as usize * frame.height as usize * 3 > max_decoded_bytes {
        return Err(Decline::Size);
    }
    Ok(frame)
}

impl ImageDiverter for LaneDiverter {
    fn wants(&self, row: usize) -> bool {
        gpu_row(row, self.sixteenths)
    }

    fn offer(&self, image: DivertedImage) -> Option<DivertedImage> {
        match offered_frame(&image, self.max_decoded_bytes) {
            Ok(frame) => {
                lock(&self.taken).push(LaneItem { image, frame });
                None
            }
            Err(_) => {
                self.stats.declined_rows.fetch_add(1, Ordering::Relaxed);
                Some(image)
            }
        }
    }
}

/// A lane's figures from what it shares.
fn figures_of(shared: &Shared) -> GpuDecodeFigures {
    let held = shared.memory.allocated()
        + shared
            .budgets
            .iter()
            .map(|b| b.device.load(Ordering::Relaxed))
            .sum::<usize>();
    shared.split.figures(
        &shared.stats,
        (held as u64, shared.memory.cap() as u64),
        shared.hardware,
    )
}

/// The GPU decode lane of one loader (see the module docs of `decode`).
pub struct GpuLane {
    shared: Arc<Shared>,
    tasks: Mutex<Option<Sender<Work>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// A served lane's hold on the rest of its pinned budget, past its limit (`serve.rs`).
    served_ceiling: Mutex<Option<stoker_loader::PinnedShare>>,
}

impl std::fmt::Debug for GpuLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLane")
            .field("mode", &self.shared.split.mode())
            .field("hardware", &self.shared.hardware)
            .finish_non_exhaustive()
    }
}

impl GpuLane {
    /// The GPU's share of step `step` of `epoch`, in sixteenths: `gpu` mode always 16; `auto`
    /// the share of the point the step is in (`decode::split`): set from a resumed state,
    /// else decided when a step of the point is first asked for (the producer, as it starts
    /// the step, or the loader's state), from what the lanes did before, and then kept.
    pub fn split_at(&self, epoch: u64, step: u64) -> u8 {
        self.shared.split.split_at(epoch, step, &self.shared.stats)
    }

    /// Counts a batch of `rows` rows, step `step` of `epoch`, handed to the training loop
    /// `interval` after the one before: what `auto`'s later decisions compare, for the split
    /// the step was built with.
    pub fn note_delivered(&self, epoch: u64, step: u64, rows: usize, interval: Duration) {
        self.shared
            .split
            .note_delivered(epoch, step, rows, interval);
    }

    /// Sets the GPU's share of the point step `step` of `epoch` is in (a resumed run's, saved
    /// with its state); returns whether batches built ahead may carry another share (see
    /// `SplitSchedule::set`).
    pub fn set_split(&self, epoch: u64, step: u64, sixteenths: u8) -> bool {
        self.shared.split.set(epoch, step, sixteenths)
    }

    /// The mode asked for.
    pub fn mode(&self) -> DecodeMode {
        self.shared.split.mode()
    }

    /// Whether the hardware engines decode (else nvJPEG's default backend).
    pub fn hardware(&self) -> bool {
        self.shared.hardware
    }

    /// Whether the pipes decode only each image's crop window where nvJPEG takes it
    /// ([`crate::decode::ROI_VARIABLE`] asked, and every pipe's decoder is on the hardware
    /// backend with the calls region decoding needs).
    pub fn roi(&self) -> bool {
        self.shared.roi
    }

    /// What the kernel makes of the rows: [`RowTail::BYTES`], or the device stage's tail when
    /// the kernel applies it.
    pub fn rows_tail(&self) -> RowTail {
        self.shared.tail
    }

    /// The counts so far.
    pub fn stats(&self) -> &LaneStats {
        &self.shared.stats
    }

    /// nvJPEG's allocations through the lane's allocators so far (device and pinned).
    pub fn nvjpeg_allocations(&self) -> u64 {
        self.shared
            .budgets
            .iter()
            .map(|b| b.allocations.load(Ordering::Relaxed))
            .sum()
    }

    /// Page-locked bytes the lane's pipes took as it started (staging, parameters, sentinels).
    pub fn staging_bytes(&self) -> usize {
        self.shared.host_bytes
    }

    /// Page-locked bytes the lane holds now: its pipes' staging and nvJPEG's pinned buffers
    /// (all within the process's pinned budget when it was given one).
    pub fn pinned_bytes(&self) -> usize {
        self.staging_bytes()
            + self
                .shared
                .budgets
                .iter()
                .map(|b| b.pinned.load(Ordering::Relaxed))
                .sum::<usize>()
    }

    /// nvJPEG's pinned allocations refused because the process's pinned budget was full (the
    /// images they were for are built on the CPU).
    pub fn pinned_refused(&self) -> u64 {
        self.shared.pinned_refused()
    }

    /// [`GpuLane::pinned_refused`] as a function that needs no hold on the lane (a served
    /// lane's answer writer reads it on a thread of its own).
    pub fn pinned_refused_reader(&self) -> impl Fn() -> u64 + Send + 'static {
        let shared = Arc::clone(&self.shared);
        move || shared.pinned_refused()
    }

    /// Device bytes the lane holds now: its memory and nvJPEG's allocations through the
    /// lane's allocators.
    pub fn memory_bytes(&self) -> usize {
        self.figures().memory_bytes as usize
    }

    /// The cap the lane keeps within.
    pub fn memory_cap(&self) -> usize {
        self.shared.memory.cap()
    }

    /// The time the lane has worked so far: while any pipe works, counted once, the work in
    /// progress included.
    pub fn busy(&self) -> Duration {
        self.shared.busy()
    }

    /// The lane's figures now.
    pub fn figures(&self) -> GpuDecodeFigures {
        figures_of(&self.shared)
    }

    /// A diverter offering the rows of `sixteenths` of a batch to the lane.
    pub fn diverter(&self, sixteenths: u8) -> LaneDiverter {
        LaneDiverter::new(
            sixteenths,
            self.shared.memory.arena_bytes(),
            &self.shared.stats,
        )
    }

    /// Waits for a free output buffer for the next batch, or `None` once the lane shuts down.
    /// Called in step order (the producer's), so a later batch never holds the buffer an
    /// earlier one waits for (batches are handed out in step order and release theirs then).
    pub fn take_ring(&self) -> Option<usize> {
        self.shared.take_ring().0
    }

    /// Counts `rows` built by the decode threads in `busy` for a batch the lane also worked on.
    pub fn note_cpu(&self, rows: usize, busy: Duration) {
        self.shared.stats.note_cpu(rows, busy);
    }

    /// Queues a batch for the lane; waits while the lane already has one queued. After
    /// [`GpuLane::shutdown`] the batch fails as stopped.
    pub fn submit(&self, task: LaneTask) {
        let tasks = lock(&self.tasks).clone();
        let sent = match tasks {
            Some(tasks) => tasks.send(Work::Batch(Box::new(task))),
            None => Err(crossbeam_channel::SendError(Work::Batch(Box::new(task)))),
        };
        if let Err(crossbeam_channel::SendError(Work::Batch(task))) = sent {
            let task = *task;
            self.shared.put_ring(task.ring);
            let _ = task.reply.send(Built {
                step: task.step,
                service: task.started.elapsed(),
                result: Err(Error::Stopped("the GPU decode lane stopped".into())),
            });
        }
    }
}

impl GpuLane {
    /// Stops the lane: no more batches are taken, a pipe waiting for an output buffer gives up
    /// (its batch fails as stopped), the pipes' threads finish their work and release their
    /// CUDA objects (their kernel modules too). The lane's memory goes once the last batch
    /// holding its rows is released. Idempotent; dropping the lane does it too.
    pub fn shutdown(&self) {
        drop(lock(&self.tasks).take());
        self.shared.closed.store(true, Ordering::Relaxed);
        {
            let _free = lock(&self.shared.free);
            self.shared.returned.notify_all();
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Drop for GpuLane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipe_count_is_the_default_unless_a_count_in_range_is_asked_for() {
        assert_eq!(pipe_count(None), PIPES);
        assert_eq!(pipe_count(Some("4")), 4);
        assert_eq!(pipe_count(Some(" 1 ")), 1);
        assert_eq!(pipe_count(Some("8")), MAX_PIPES);
        for wrong in ["0", "9", "two", "", "-1"] {
            assert_eq!(pipe_count(Some(wrong)), PIPES, "{wrong:?}");
        }
    }
}
