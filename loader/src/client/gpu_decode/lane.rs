//! The lane itself: its device memory, the thread that decodes and crops the rows it was given,
//! and the rows it hands out with their batch.
//!
//! Two pipes, each a thread with its own nvJPEG decoder, CUDA stream, arena of decoded images
//! and kernel parameters, take batches from the lane's queue: nvJPEG's batched decode call
//! returns only once the engines are done with it, so one pipe's call overlaps the other's
//! and its kernel. A pipe reuses its arena and state only once its previous work is done (an
//! event it waits for), so each pipe has at most one sub-batch on the GPU, and nothing is
//! allocated after start.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::{result, sys, DriverError};
use stoker_worker::{AssembledBatch, DivertedImage, ImageDiverter, Job};

use super::jpeg_scan::hardware_candidate;
use super::kernel::{self, CropItem};
use super::nvjpeg::{Budget, Decoder, Image};
use super::{gpu_row, split_for_rates, DecodeMode, GpuDecodeError, GpuDecodeOptions, AUTO_START};
use crate::client::cuda::{describe, Cuda};
use crate::client::slots::Slot;
use crate::client::source::Built;
use crate::client::stats::GpuDecodeFigures;
use crate::error::{Error, Result};

/// Pipes: streams with their own decode state and arena, used in turn.
const PIPES: usize = 2;

/// Alignment of each decoded image in an arena.
const ALIGN: usize = 256;

/// Page-locked host memory per pipe for the encoded images of a sub-batch, per batch row, and
/// its bounds: nvJPEG copies each image to the device itself, and a copy from pageable memory
/// goes through the driver's staging buffer, blocking the calling thread and holding the
/// driver while it does (measured: ~30 us a call, the training loop's kernel launches slowed
/// 2.5x beside it).
const STAGING_PER_ROW: usize = 128 << 10;
/// See [`STAGING_PER_ROW`].
const STAGING_BOUNDS: (usize, usize) = (4 << 20, 32 << 20);

/// The least memory left for decoding (arenas and nvJPEG) once the rows in flight are set
/// aside.
const MIN_DECODE_MEMORY: usize = 48 << 20;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn driver(call: &'static str) -> impl Fn(DriverError) -> GpuDecodeError {
    move |error| GpuDecodeError::Call {
        call,
        error: describe(error),
    }
}

/// The lane's device memory, allocated once within the cap: the decoded-image arena and
/// kernel parameters of each pipe, and a ring of output buffers (one batch of rows each) that
/// the training loop's batches hold until they are released. Freed when the lane and every
/// batch holding its rows are gone.
#[derive(Debug)]
pub struct LaneMemory {
    cuda: Arc<Cuda>,
    arenas: Vec<u64>,
    arena_bytes: usize,
    params: Vec<u64>,
    ring: u64,
    ring_slots: usize,
    ring_slot_bytes: usize,
    params_bytes: usize,
    /// nvJPEG's own device allocations may reach this much.
    nvjpeg_limit: usize,
    cap: usize,
}

impl LaneMemory {
    /// Splits `cap` bytes: up to 8 ring buffers of `batch_rows` rows of `row_bytes` (at least
    /// 2, at most a quarter of the cap beyond those 2), then thirds of the rest for each pipe's
    /// arena and for nvJPEG. Allocates all but nvJPEG's share now.
    fn allocate(
        cuda: &Arc<Cuda>,
        cap: usize,
        batch_rows: usize,
        row_bytes: usize,
    ) -> std::result::Result<LaneMemory, GpuDecodeError> {
        let ring_slot_bytes = (batch_rows * row_bytes).div_ceil(ALIGN) * ALIGN;
        let params_bytes = (batch_rows * std::mem::size_of::<CropItem>()).max(ALIGN);
        let ring_slots = ((cap / 4) / ring_slot_bytes.max(1)).clamp(2, 8);
        let fixed = ring_slots * ring_slot_bytes + PIPES * params_bytes;
        let rest = cap.saturating_sub(fixed);
        if rest < MIN_DECODE_MEMORY {
            return Err(GpuDecodeError::Memory(format!(
                "gpu_memory={cap} bytes leaves {rest} for decoding after {ring_slots} batches of \
                 rows in flight ({ring_slot_bytes} bytes each); the lane needs at least {} \
                 more: raise gpu_memory",
                MIN_DECODE_MEMORY - rest
            )));
        }
        let arena_bytes = (rest / (PIPES + 1)) / ALIGN * ALIGN;
        let mut memory = LaneMemory {
            cuda: Arc::clone(cuda),
            arenas: Vec::new(),
            arena_bytes,
            params: Vec::new(),
            ring: 0,
            ring_slots,
            ring_slot_bytes,
            params_bytes,
            nvjpeg_limit: rest - PIPES * arena_bytes,
            cap,
        };
        // On failure `memory` drops and frees what was allocated so far.
        cuda.in_context("cuMemAlloc", || {
            for _ in 0..PIPES {
                // SAFETY: plain allocations in the device's context.
                memory
                    .arenas
                    .push(unsafe { result::malloc_sync(arena_bytes) }?);
                memory
                    .params
                    .push(unsafe { result::malloc_sync(params_bytes) }?);
            }
            // SAFETY: as above.
            memory.ring = unsafe { result::malloc_sync(ring_slots * ring_slot_bytes) }?;
            Ok(())
        })
        .map_err(|e| GpuDecodeError::Memory(format!("allocating the lane's memory: {e}")))?;
        Ok(memory)
    }

    /// Device bytes allocated here (nvJPEG's own are counted apart).
    pub fn allocated(&self) -> usize {
        PIPES * (self.arena_bytes + self.params_bytes) + self.ring_slots * self.ring_slot_bytes
    }

    /// The cap the memory was planned within.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The largest decoded image (bytes of interleaved RGB) a pipe's arena holds; larger ones
    /// are decoded on the CPU.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    fn ring_ptr(&self, index: usize) -> u64 {
        self.ring + (index * self.ring_slot_bytes) as u64
    }
}

impl Drop for LaneMemory {
    fn drop(&mut self) {
        let pointers: Vec<u64> = self
            .arenas
            .iter()
            .chain(&self.params)
            .copied()
            .chain((self.ring != 0).then_some(self.ring))
            .collect();
        let freed = self.cuda.in_context("cuMemFree", || {
            for ptr in pointers {
                // SAFETY: each pointer was allocated by `allocate` and nothing uses it now:
                // the lane's thread and every batch holding rows are gone.
                unsafe { result::free_sync(ptr) }?;
            }
            Ok(())
        });
        if let Err(error) = freed {
            tracing::warn!(%error, "could not free the GPU decode lane's memory");
        }
    }
}

/// What the lane counted so far.
#[derive(Debug, Default)]
pub struct LaneStats {
    /// Rows decoded and cropped on the GPU.
    pub gpu_rows: AtomicU64,
    /// Rows offered to the lane that the decode threads kept (not taken by the engines, or
    /// too large for the lane's memory).
    pub declined_rows: AtomicU64,
    /// Rows the lane took and then built on the CPU (nvJPEG refused them).
    pub fallback_rows: AtomicU64,
    /// Time the lane's thread worked on batches (waits for the GPU included, waits for a free
    /// output buffer not), in nanoseconds.
    pub gpu_busy_ns: AtomicU64,
    /// Rows the decode threads built in batches the lane also worked on.
    pub cpu_rows: AtomicU64,
    /// Time the decode threads spent on those batches, in nanoseconds.
    pub cpu_busy_ns: AtomicU64,
    /// Where the lane's thread spent its time, in nanoseconds: asking nvJPEG whether it takes
    /// each image, in nvJPEG's decode calls, waiting for a pipe's previous work, and queueing
    /// the crop kernel.
    pub check_ns: AtomicU64,
    /// See `check_ns`.
    pub decode_call_ns: AtomicU64,
    /// See `check_ns`.
    pub pipe_wait_ns: AtomicU64,
    /// See `check_ns`.
    pub launch_ns: AtomicU64,
}

fn add_since(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

impl LaneStats {
    fn rate(rows: &AtomicU64, busy_ns: &AtomicU64) -> f64 {
        let busy = busy_ns.load(Ordering::Relaxed) as f64 / 1e9;
        if busy <= 0.0 {
            0.0
        } else {
            rows.load(Ordering::Relaxed) as f64 / busy
        }
    }

    /// Rows per second of the GPU lane while it worked.
    pub fn gpu_rate(&self) -> f64 {
        Self::rate(&self.gpu_rows, &self.gpu_busy_ns)
    }

    /// Rows per second of the decode threads in the batches the lane also worked on.
    pub fn cpu_rate(&self) -> f64 {
        Self::rate(&self.cpu_rows, &self.cpu_busy_ns)
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
    mode: DecodeMode,
    splits: Mutex<HashMap<u64, u8>>,
    hardware: bool,
    /// Set when the lane shuts down: a pipe waiting for an output buffer gives up.
    closed: std::sync::atomic::AtomicBool,
    /// Pipes working now, and when that count last changed (the lane's busy time counts
    /// while any pipe works, once).
    working: Mutex<(usize, Option<Instant>)>,
}

impl Shared {
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

    /// A pipe starts (`true`) or ends (`false`) work on a batch; the lane's busy time runs
    /// while any pipe works (counted at each change, so overlapping pipes count once).
    fn working(&self, starts: bool) {
        let mut working = lock(&self.working);
        let now = Instant::now();
        if let (true, Some(since)) = (working.0 > 0, working.1) {
            self.stats
                .gpu_busy_ns
                .fetch_add((now - since).as_nanos() as u64, Ordering::Relaxed);
        }
        working.0 = if starts {
            working.0 + 1
        } else {
            working.0.saturating_sub(1)
        };
        working.1 = Some(now);
    }

    fn put_ring(&self, index: usize) {
        lock(&self.free).push(index);
        self.returned.notify_one();
    }
}

/// The GPU rows of one batch, kept with its slot until the slot returns to its pool: `count`
/// rows of `height x width x 3` bytes from [`DeviceRows::ptr`], row `k` being the batch's row
/// `positions()[k]`. Ready once the lane's events have passed ([`DeviceRows::wait_on`]).
pub struct DeviceRows {
    shared: Arc<Shared>,
    ring_index: usize,
    ptr: u64,
    positions: Vec<u32>,
    height: u32,
    width: u32,
    events: Vec<sys::CUevent>,
}

// SAFETY: event handles and device addresses may be used from any thread.
unsafe impl Send for DeviceRows {}
unsafe impl Sync for DeviceRows {}

impl std::fmt::Debug for DeviceRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRows")
            .field("rows", &self.positions.len())
            .field("height", &self.height)
            .field("width", &self.width)
            .finish_non_exhaustive()
    }
}

impl DeviceRows {
    /// Device address of the first row.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The batch row of each device row.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// (rows, height, width, 3): uint8, C order.
    pub fn shape(&self) -> [usize; 4] {
        [
            self.positions.len(),
            self.height as usize,
            self.width as usize,
            3,
        ]
    }

    /// The CUDA device ordinal.
    pub fn device(&self) -> usize {
        self.shared.cuda.ordinal()
    }

    /// Makes `stream` wait (on the GPU) until the rows are written.
    ///
    /// # Safety
    /// `stream` is a live stream of the device's primary context, or 0 (the legacy default
    /// stream).
    pub unsafe fn wait_on(&self, stream: usize) -> std::result::Result<(), GpuDecodeError> {
        let events = self.events.clone();
        self.shared
            .cuda
            .in_context("cuStreamWaitEvent", || {
                for event in events {
                    // SAFETY: the event is the lane's and was recorded; the stream is as the
                    // caller promises.
                    unsafe { sys::cuStreamWaitEvent(stream as sys::CUstream, event, 0) }
                        .result()?;
                }
                Ok(())
            })
            .map_err(|e| GpuDecodeError::Cuda(e.to_string()))
    }
}

impl DeviceRows {
    /// Keeps the rows' buffer out of the lane until the work queued on `stream` so far (the
    /// copies that read the rows) is done, whoever else lets go of the rows before (a batch
    /// whose slot is not page-locked has no fence of its own).
    ///
    /// # Safety
    /// `stream` is a live stream of the device's primary context, or 0.
    pub unsafe fn keep_until(
        self: &Arc<Self>,
        stream: usize,
    ) -> std::result::Result<(), GpuDecodeError> {
        // SAFETY: as the caller promises.
        let fence = unsafe { self.shared.cuda.fence(stream) }
            .map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        self.shared
            .cuda
            .release_after(vec![fence], Box::new(Arc::clone(self)));
        Ok(())
    }
}

impl Drop for DeviceRows {
    fn drop(&mut self) {
        let events = std::mem::take(&mut self.events);
        let _ = self.shared.cuda.in_context("cuEventDestroy", || {
            for event in events {
                // SAFETY: the event is this batch's own; destroying a recorded event is
                // allowed (its resources go once it completes).
                let _ = unsafe { sys::cuEventDestroy_v2(event) };
            }
            Ok(())
        });
        self.shared.put_ring(self.ring_index);
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
    pub items: Vec<DivertedImage>,
    /// The output buffer the rows go to ([`GpuLane::take_ring`], taken in step order).
    pub ring: usize,
    /// Where the finished batch goes.
    pub reply: Sender<Built>,
    /// When building the batch started.
    pub started: Instant,
}

/// Offers a batch's GPU rows to the lane: takes the JPEGs the engines decode and that fit its
/// arena, gives the rest back to the decode threads.
pub struct LaneDiverter {
    sixteenths: u8,
    max_decoded_bytes: usize,
    taken: Mutex<Vec<DivertedImage>>,
    shared: Arc<Shared>,
}

impl LaneDiverter {
    /// The samples taken, in row order (the decode threads offer them in any order; the lane's
    /// grouping into sub-batches must not depend on it).
    pub fn into_items(self) -> Vec<DivertedImage> {
        let mut items = self.taken.into_inner().unwrap_or_else(|p| p.into_inner());
        items.sort_by_key(|item| item.row);
        items
    }
}

impl ImageDiverter for LaneDiverter {
    fn wants(&self, row: usize) -> bool {
        gpu_row(row, self.sixteenths)
    }

    fn offer(&self, image: DivertedImage) -> Option<DivertedImage> {
        let decoded = image.header.width as usize * image.header.height as usize * 3;
        if decoded > self.max_decoded_bytes || hardware_candidate(&image.bytes).is_err() {
            self.shared
                .stats
                .declined_rows
                .fetch_add(1, Ordering::Relaxed);
            return Some(image);
        }
        lock(&self.taken).push(image);
        None
    }
}

/// Reads a lane's figures from any thread ([`GpuLane::view`]); holds nothing of the lane (its
/// memory goes when the lane and its batches do, whoever still has a view).
#[derive(Clone)]
pub struct LaneView {
    shared: std::sync::Weak<Shared>,
}

impl LaneView {
    /// The lane's figures now; `None` once the lane is gone.
    pub fn figures(&self) -> Option<GpuDecodeFigures> {
        let shared = self.shared.upgrade()?;
        Some(figures_of(&shared))
    }
}

/// A lane's figures from what it shares.
fn figures_of(shared: &Shared) -> GpuDecodeFigures {
    let stats = &shared.stats;
    let sixteenths = match shared.mode {
        DecodeMode::Gpu => 16,
        _ => lock(&shared.splits)
            .iter()
            .max_by_key(|(epoch, _)| **epoch)
            .map_or(AUTO_START, |(_, split)| *split),
    };
    GpuDecodeFigures {
        split_pct: f64::from(sixteenths) * 100.0 / 16.0,
        gpu_rows_per_s: stats.gpu_rate(),
        cpu_rows_per_s: stats.cpu_rate(),
        gpu_rows: stats.gpu_rows.load(Ordering::Relaxed),
        declined_rows: stats.declined_rows.load(Ordering::Relaxed),
        memory_bytes: (shared.memory.allocated()
            + shared
                .budgets
                .iter()
                .map(|b| b.device.load(Ordering::Relaxed))
                .sum::<usize>()) as u64,
        memory_cap: shared.memory.cap() as u64,
        hardware: shared.hardware,
    }
}

/// The GPU decode lane of one loader (see the module docs of `gpu_decode`).
pub struct GpuLane {
    shared: Arc<Shared>,
    tasks: Mutex<Option<Sender<LaneTask>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    kernel: Mutex<Option<Kernel>>,
}

impl std::fmt::Debug for GpuLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLane")
            .field("mode", &self.shared.mode)
            .field("hardware", &self.shared.hardware)
            .finish_non_exhaustive()
    }
}

impl GpuLane {
    /// Starts the lane for `job` (one image source whose CPU output is uint8 NHWC) with batches
    /// of up to `batch_size` rows: loads nvJPEG, compiles the kernel, allocates the memory.
    pub fn start(
        options: &GpuDecodeOptions,
        job: &Job,
        batch_size: usize,
    ) -> std::result::Result<GpuLane, GpuDecodeError> {
        let pipeline = job.image_pipeline().ok_or_else(|| {
            GpuDecodeError::Unsupported(
                "the GPU decode lane builds image batches of one dataset (not a mix, not text \
                 or columns)"
                    .into(),
            )
        })?;
        if !pipeline.output.is_packed_rgb8() {
            return Err(GpuDecodeError::Unsupported(
                "the GPU decode lane needs uint8 NHWC rows from the CPU side (with \
                 device='cuda', Normalize and ToTensor run on the GPU after it)"
                    .into(),
            ));
        }
        let cuda = Cuda::open(options.device).map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        let (height, width) = pipeline.output_size();
        let row_bytes = pipeline.bytes_per_sample();
        let memory = Arc::new(LaneMemory::allocate(
            &cuda,
            options.memory_bytes,
            batch_size.max(1),
            row_bytes,
        )?);
        let stats = Arc::new(LaneStats::default());
        let kernel = Kernel::load(&cuda, &options.library_dirs)?;
        let mut pipes = Vec::with_capacity(PIPES);
        for index in 0..PIPES {
            match Pipe::new(
                index,
                &cuda,
                &memory,
                &options.library_dirs,
                &kernel,
                (width, height),
                &stats,
            ) {
                Ok(pipe) => pipes.push(pipe),
                Err(error) => {
                    // Pipes release CUDA objects (and nvJPEG's memory) with the context current.
                    let _ = cuda.in_context("releasing the GPU decode lane", || {
                        drop(pipes);
                        Ok(())
                    });
                    kernel.unload(&cuda);
                    return Err(error);
                }
            }
        }
        let shared = Arc::new(Shared {
            cuda: Arc::clone(&cuda),
            free: Mutex::new((0..memory.ring_slots).rev().collect()),
            memory,
            returned: Condvar::new(),
            stats,
            budgets: pipes.iter().map(|pipe| pipe.decoder.budget()).collect(),
            mode: options.mode,
            splits: Mutex::new(HashMap::new()),
            hardware: pipes[0].decoder.hardware(),
            closed: std::sync::atomic::AtomicBool::new(false),
            working: Mutex::new((0, None)),
        });
        let (tasks, queue) = crossbeam_channel::bounded(1);
        let mut threads = Vec::with_capacity(PIPES);
        for pipe in pipes {
            let (thread_shared, queue) = (Arc::clone(&shared), queue.clone());
            let name = format!("stoker-gpu{}-decode{}", options.device, pipe.index);
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || run(thread_shared, pipe, queue, row_bytes))
            {
                Ok(thread) => threads.push(thread),
                Err(error) => {
                    // The pipes not started are dropped here; the lane is dropped below with
                    // the threads that did start.
                    tracing::error!(%error, "spawning a GPU decode lane thread");
                }
            }
        }
        tracing::info!(
            device = options.device,
            hardware = shared.hardware,
            cap = options.memory_bytes,
            "GPU decode lane started"
        );
        let started = !threads.is_empty();
        let lane = GpuLane {
            shared,
            tasks: Mutex::new(Some(tasks)),
            threads: Mutex::new(threads),
            kernel: Mutex::new(Some(kernel)),
        };
        if !started {
            return Err(GpuDecodeError::Cuda(
                "no GPU decode lane thread could be started".into(),
            ));
        }
        Ok(lane)
    }

    /// The GPU's share of each batch of `epoch`, in sixteenths: `gpu` mode always 16; `auto`
    /// the share set for that epoch ([`GpuLane::set_split`], from a resumed state), else one
    /// decided now from the rates measured so far (the starting share before any), and then
    /// kept for the epoch.
    pub fn split_for_epoch(&self, epoch: u64) -> u8 {
        if self.shared.mode == DecodeMode::Gpu {
            return 16;
        }
        let mut splits = lock(&self.shared.splits);
        *splits.entry(epoch).or_insert_with(|| {
            let stats = &self.shared.stats;
            let measured = stats.gpu_rows.load(Ordering::Relaxed) > 0
                && stats.cpu_rows.load(Ordering::Relaxed) > 0;
            if measured {
                split_for_rates(stats.cpu_rate(), stats.gpu_rate())
            } else {
                AUTO_START
            }
        })
    }

    /// Sets the GPU's share of `epoch`'s batches (a resumed run's, saved with its state).
    pub fn set_split(&self, epoch: u64, sixteenths: u8) {
        lock(&self.shared.splits).insert(epoch, sixteenths.min(16));
    }

    /// The mode asked for.
    pub fn mode(&self) -> DecodeMode {
        self.shared.mode
    }

    /// Whether the hardware engines decode (else nvJPEG's default backend).
    pub fn hardware(&self) -> bool {
        self.shared.hardware
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

    /// Device bytes the lane holds now: its memory and nvJPEG's allocations through the
    /// lane's allocators.
    pub fn memory_bytes(&self) -> usize {
        self.figures().memory_bytes as usize
    }

    /// The cap the lane keeps within.
    pub fn memory_cap(&self) -> usize {
        self.shared.memory.cap()
    }

    /// A handle that reads the lane's figures from any thread (the loader's monitor), without
    /// keeping anything of the lane alive.
    pub fn view(&self) -> LaneView {
        LaneView {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// The lane's figures now.
    pub fn figures(&self) -> GpuDecodeFigures {
        figures_of(&self.shared)
    }

    /// A diverter offering the rows of `sixteenths` of a batch to the lane.
    pub fn diverter(&self, sixteenths: u8) -> LaneDiverter {
        LaneDiverter {
            sixteenths,
            max_decoded_bytes: self.shared.memory.arena_bytes(),
            taken: Mutex::new(Vec::new()),
            shared: Arc::clone(&self.shared),
        }
    }

    /// Waits for a free output buffer for the next batch, or `None` once the lane shuts down.
    /// Called in step order (the producer's), so a later batch never holds the buffer an
    /// earlier one waits for (batches are handed out in step order and release theirs then).
    pub fn take_ring(&self) -> Option<usize> {
        self.shared.take_ring().0
    }

    /// Counts `rows` built by the decode threads in `busy` for a batch the lane also worked on.
    pub fn note_cpu(&self, rows: usize, busy: Duration) {
        let stats = &self.shared.stats;
        stats.cpu_rows.fetch_add(rows as u64, Ordering::Relaxed);
        stats
            .cpu_busy_ns
            .fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Queues a batch for the lane; waits while the lane already has one queued. After
    /// [`GpuLane::shutdown`] the batch fails as stopped.
    pub fn submit(&self, task: LaneTask) {
        let tasks = lock(&self.tasks).clone();
        let sent = match tasks {
            Some(tasks) => tasks.send(task),
            None => Err(crossbeam_channel::SendError(task)),
        };
        if let Err(crossbeam_channel::SendError(task)) = sent {
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
    /// CUDA objects, and the kernel is unloaded. The lane's memory goes once the last batch
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
        if let Some(kernel) = lock(&self.kernel).take() {
            kernel.unload(&self.shared.cuda);
        }
    }
}

impl Drop for GpuLane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The kernel, loaded once per lane into the device's context; every pipe launches its function.
struct Kernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
}

// SAFETY: module and function handles of a context may be used from any thread.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

impl Kernel {
    fn load(cuda: &Arc<Cuda>, dirs: &[PathBuf]) -> std::result::Result<Kernel, GpuDecodeError> {
        let sm = cuda
            .compute_capability()
            .map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        let image = kernel::compile(dirs, Some(sm))?.image();
        let name =
            CString::new(kernel::KERNEL).map_err(|e| GpuDecodeError::Kernel(e.to_string()))?;
        cuda.in_context("loading the crop kernel", || {
            // SAFETY: `image` is a CUBIN (or NUL-terminated PTX) for this device.
            let module = unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) }?;
            // SAFETY: the module is loaded; the name is NUL-terminated.
            match unsafe { result::module::get_function(module, name) } {
                Ok(function) => Ok(Kernel { module, function }),
                Err(error) => {
                    // SAFETY: the module was loaded above and nothing uses it.
                    let _ = unsafe { result::module::unload(module) };
                    Err(error)
                }
            }
        })
        .map_err(|e| GpuDecodeError::Kernel(e.to_string()))
    }

    /// Unloads the module once no pipe launches from it any more.
    fn unload(self, cuda: &Cuda) {
        let _ = cuda.in_context("cuModuleUnload", || {
            // SAFETY: every pipe's thread has ended and synchronised its stream.
            unsafe { result::module::unload(self.module) }
        });
    }
}

/// One pipe, owned by one lane thread: its own nvJPEG decoder (handle and state), stream,
/// arena of decoded images and kernel parameters. Pipes work on different batches at once,
/// so one's host-side decode call overlaps the other's.
struct Pipe {
    index: usize,
    decoder: Decoder,
    memory: Arc<LaneMemory>,
    stream: sys::CUstream,
    /// Recorded after the pipe's last kernel: its state, arena and parameters are free once
    /// it has passed.
    done: sys::CUevent,
    /// The encoded images the pipe's last decode read, kept until it is done.
    held: Vec<DivertedImage>,
    function: sys::CUfunction,
    out: (u32, u32),
    /// Page-locked staging for the kernel parameters (copied on the pipe's stream).
    host_params: *mut c_void,
    /// Page-locked staging for the encoded images nvJPEG reads (an image larger than all of
    /// it is read from where it is).
    staging: *mut c_void,
    staging_bytes: usize,
    stats: Arc<LaneStats>,
}

// SAFETY: CUDA handles may move between threads; a pipe is used by its one thread.
unsafe impl Send for Pipe {}

impl Pipe {
    fn new(
        index: usize,
        cuda: &Arc<Cuda>,
        memory: &Arc<LaneMemory>,
        dirs: &[PathBuf],
        kernel: &Kernel,
        out: (u32, u32),
        stats: &Arc<LaneStats>,
    ) -> std::result::Result<Pipe, GpuDecodeError> {
        let mut failure = None;
        let pipe = cuda.in_context("starting the GPU decode lane", || {
            let batch_hint = (memory.params_bytes / std::mem::size_of::<CropItem>()) as i32;
            let decoder = match Decoder::new(dirs, 1, batch_hint, memory.nvjpeg_limit / PIPES) {
                Ok(decoder) => decoder,
                Err(error) => {
                    failure = Some(error);
                    return Err(DriverError(sys::cudaError_enum::CUDA_ERROR_UNKNOWN));
                }
            };
            let mut pipe = Pipe {
                index,
                decoder,
                memory: Arc::clone(memory),
                stream: std::ptr::null_mut(),
                done: std::ptr::null_mut(),
                held: Vec::new(),
                function: kernel.function,
                out,
                host_params: std::ptr::null_mut(),
                staging: std::ptr::null_mut(),
                staging_bytes: (batch_hint.max(1) as usize * STAGING_PER_ROW)
                    .clamp(STAGING_BOUNDS.0, STAGING_BOUNDS.1),
                stats: Arc::clone(stats),
            };
            // On failure `pipe` drops and releases what was made so far. The stream has the
            // device's highest priority: the crop kernel is small and the training step waits
            // for its rows, so its blocks go ahead of a running step's queued ones.
            let (_, greatest) = result::stream::get_priority_range()?;
            pipe.stream = result::stream::create_with_priority(
                result::stream::StreamKind::NonBlocking,
                greatest,
            )?;
            // SAFETY: creations and an allocation into fields, in the device's context.
            unsafe {
                sys::cuEventCreate(
                    &mut pipe.done,
                    sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
                        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                )
                .result()?;
                sys::cuMemAllocHost_v2(&mut pipe.host_params, memory.params_bytes).result()?;
                sys::cuMemAllocHost_v2(&mut pipe.staging, pipe.staging_bytes).result()?;
            }
            Ok(pipe)
        });
        match (pipe, failure) {
            (Ok(pipe), _) => Ok(pipe),
            (Err(_), Some(error)) => Err(error),
            (Err(error), None) => Err(GpuDecodeError::Cuda(error.to_string())),
        }
    }

    /// Builds the lane's rows of `task` and finishes the batch.
    fn build(
        &mut self,
        shared: &Arc<Shared>,
        task: LaneTask,
        row_bytes: usize,
    ) -> Result<stoker_proto::v1::Batch> {
        let LaneTask {
            job,
            epoch,
            slot,
            assembled,
            indices,
            items,
            ring,
            ..
        } = task;
        shared.working(true);
        let built = self.build_rows(
            shared, ring, job, epoch, slot, assembled, indices, items, row_bytes,
        );
        shared.working(false);
        built
    }

    /// Gives `ring` back after this pipe's queued work is done (its kernels may write there).
    fn release_ring(&self, shared: &Shared, ring: usize) {
        // SAFETY: the event is the pipe's own.
        if let Err(error) = unsafe { result::event::synchronize(self.done) } {
            tracing::warn!(error = %describe(error), "waiting for a GPU lane pipe before reusing its buffer");
        }
        shared.put_ring(ring);
    }

    /// The body of [`Pipe::build`].
    #[allow(clippy::too_many_arguments)]
    fn build_rows(
        &mut self,
        shared: &Arc<Shared>,
        ring: usize,
        job: Arc<Job>,
        epoch: u64,
        mut slot: Slot,
        mut assembled: AssembledBatch,
        indices: Vec<u64>,
        items: Vec<DivertedImage>,
        row_bytes: usize,
    ) -> Result<stoker_proto::v1::Batch> {
        let out = self.memory.ring_ptr(ring);
        let mut positions = Vec::with_capacity(items.len());
        let mut fallback = Vec::new();
        let mut pending: Vec<(DivertedImage, usize)> = Vec::new();
        // Bytes of the arena and of the staging buffer the pending images take.
        let (mut used, mut staged) = (0usize, 0usize);
        for item in items {
            let need = (item.header.width as usize * item.header.height as usize * 3)
                .div_ceil(ALIGN)
                * ALIGN;
            let checked = Instant::now();
            let supported = self.decoder.supports(&item.bytes);
            add_since(&self.stats.check_ns, checked);
            if need > self.memory.arena_bytes || !supported {
                fallback.push(item);
                continue;
            }
            let encoded = self.staged_len(&item);
            if used + need > self.memory.arena_bytes || staged + encoded > self.staging_bytes {
                self.flush(&mut pending, out, &mut positions, &mut fallback);
                (used, staged) = (0, 0);
            }
            pending.push((item, used));
            used += need;
            staged += encoded;
        }
        self.flush(&mut pending, out, &mut positions, &mut fallback);

        let image_start = assembled.tensors.first().map_or(0, |t| t.bytes.start);
        shared
            .stats
            .fallback_rows
            .fetch_add(fallback.len() as u64, Ordering::Relaxed);
        for item in fallback {
            let start = image_start + item.row * row_bytes;
            let Some(dest) = slot.as_mut_slice().get_mut(start..start + row_bytes) else {
                self.release_ring(shared, ring);
                return Err(Error::Stopped(format!(
                    "row {} lies outside its batch's slot",
                    item.row
                )));
            };
            match job.image_row(epoch, item.sample, dest) {
                Ok((label, bad)) => {
                    if let Some(slot_label) = assembled.labels.get_mut(item.row) {
                        *slot_label = label;
                    }
                    // The row's chain of reads ran again from its sample: its bad sample, if
                    // any, replaces the one the decode threads recorded for that sample.
                    if let Some(bad) = bad {
                        assembled
                            .bad_samples
                            .retain(|known| known.sample_index != bad.sample_index);
                        assembled.bad_samples.push(bad);
                    }
                }
                Err(error) => {
                    self.release_ring(shared, ring);
                    return Err(error.into());
                }
            }
        }

        if positions.is_empty() {
            shared.put_ring(ring);
        } else {
            match self.ready_event() {
                Ok(event) => {
                    shared
                        .stats
                        .gpu_rows
                        .fetch_add(positions.len() as u64, Ordering::Relaxed);
                    slot.attach(Arc::new(DeviceRows {
                        shared: Arc::clone(shared),
                        ring_index: ring,
                        ptr: out,
                        positions,
                        height: self.out.1,
                        width: self.out.0,
                        events: vec![event],
                    }));
                }
                Err(error) => {
                    self.release_ring(shared, ring);
                    return Err(Error::Gpu(error.to_string()));
                }
            }
        }
        Ok(assembled.into_proto(&indices, slot.into_bytes()))
    }

    /// The staging bytes an image takes: its length, or none when it is larger than the whole
    /// buffer (nvJPEG then reads it where it is).
    fn staged_len(&self, item: &DivertedImage) -> usize {
        let len = item.bytes.len();
        if len <= self.staging_bytes {
            len
        } else {
            0
        }
    }

    /// A new event recorded after the work queued so far on the pipe's stream.
    fn ready_event(&self) -> std::result::Result<sys::CUevent, GpuDecodeError> {
        let mut event = std::ptr::null_mut();
        // SAFETY: creation into a local and a record on the pipe's own stream, with the
        // device's context current on this thread.
        unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
            .result()
            .map_err(driver("cuEventCreate"))?;
            if let Err(error) = result::event::record(event, self.stream) {
                let _ = sys::cuEventDestroy_v2(event);
                return Err(driver("cuEventRecord")(error));
            }
        }
        Ok(event)
    }

    /// Decodes the pending images and crops them into the output rows from
    /// `positions.len()` on; images nvJPEG refuses go to `fallback`.
    fn flush(
        &mut self,
        pending: &mut Vec<(DivertedImage, usize)>,
        out: u64,
        positions: &mut Vec<u32>,
        fallback: &mut Vec<DivertedImage>,
    ) {
        if pending.is_empty() {
            return;
        }
        if let Err(error) = self.run_batch(pending, out, positions) {
            if pending.len() == 1 {
                tracing::debug!(%error, pipe = self.index, "the GPU lane could not decode an image; building it on the CPU");
                fallback.extend(pending.drain(..).map(|(item, _)| item));
                return;
            }
            // One image spoils its whole sub-batch: each is tried alone, so which rows go to
            // the CPU depends on the images only, not on how they were grouped.
            tracing::debug!(%error, images = pending.len(), pipe = self.index, "the GPU lane retries a sub-batch image by image");
            let mut held = Vec::new();
            for (item, offset) in pending.drain(..) {
                let mut one = vec![(item, offset)];
                match self.run_batch(&one, out, positions) {
                    Ok(()) => {
                        // The arena is reused by the next image: wait for this one's kernel.
                        // SAFETY: the event is the pipe's own.
                        let _ = unsafe { result::event::synchronize(self.done) };
                        held.extend(one.drain(..).map(|(item, _)| item));
                    }
                    Err(_) => fallback.extend(one.drain(..).map(|(item, _)| item)),
                }
            }
            self.held = held;
            return;
        }
        self.held = pending.drain(..).map(|(item, _)| item).collect();
    }

    fn run_batch(
        &mut self,
        pending: &[(DivertedImage, usize)],
        out: u64,
        positions: &mut Vec<u32>,
    ) -> std::result::Result<(), GpuDecodeError> {
        let arena = self.memory.arenas[self.index];
        // The state, arena and parameters are free once the pipe's last work is done.
        let waited = Instant::now();
        // SAFETY: the event is the pipe's own.
        unsafe { result::event::synchronize(self.done) }.map_err(driver("cuEventSynchronize"))?;
        add_since(&self.stats.pipe_wait_ns, waited);
        self.held.clear();
        // SAFETY: the staging buffer is the pipe's own page-locked allocation of
        // `staging_bytes`, and nvJPEG's reads of it from the last decode are done (the copies
        // come before the decode the event above follows).
        let staging = unsafe {
            std::slice::from_raw_parts_mut(self.staging.cast::<u8>(), self.staging_bytes)
        };
        let mut bytes: Vec<&[u8]> = Vec::with_capacity(pending.len());
        let mut rest = staging;
        for (item, _) in pending {
            let len = self.staged_len(item);
            if len == 0 || len > rest.len() {
                bytes.push(&item.bytes[..]);
                continue;
            }
            let (place, after) = rest.split_at_mut(len);
            place.copy_from_slice(&item.bytes);
            bytes.push(place);
            rest = after;
        }
        let mut outputs: Vec<Image> = pending
            .iter()
            .map(|(item, offset)| Image::rgb(arena + *offset as u64, item.header.width))
            .collect();
        let decoding = Instant::now();
        // SAFETY: each output lies in the pipe's arena, sized by the caller to fit its image;
        // the stream is the pipe's.
        let decoded = unsafe { self.decoder.decode(0, &bytes, &mut outputs, self.stream) };
        add_since(&self.stats.decode_call_ns, decoding);
        decoded?;
        let launching = Instant::now();
        let first = positions.len() as u32;
        let items: Vec<CropItem> = pending
            .iter()
            .enumerate()
            .map(|(k, (item, offset))| {
                let mut crop = CropItem::new(
                    &item.window,
                    (item.header.width, item.header.height),
                    self.out,
                    item.flip,
                    first + k as u32,
                );
                crop.src = arena + *offset as u64;
                crop
            })
            .collect();
        let params = self.memory.params[self.index];
        let (out_w, out_h) = (self.out.0 as i32, self.out.1 as i32);
        let blocks = (self.out.0 * self.out.1).div_ceil(kernel::BLOCK);
        let size = std::mem::size_of_val(items.as_slice());
        // SAFETY: both parameter buffers hold a batch's items (`items.len()` <= batch rows)
        // and the pipe's previous kernel is done (waited for above), so neither is read now;
        // the output rows lie in this batch's ring buffer; the arguments match the kernel's
        // signature.
        unsafe {
            std::ptr::copy_nonoverlapping(
                items.as_ptr().cast::<u8>(),
                self.host_params.cast::<u8>(),
                size,
            );
            sys::cuMemcpyHtoDAsync_v2(params, self.host_params, size, self.stream)
                .result()
                .map_err(driver("cuMemcpyHtoDAsync"))?;
            let (mut params_arg, mut out_arg, mut w_arg, mut h_arg) = (params, out, out_w, out_h);
            let mut args: [*mut c_void; 4] = [
                (&mut params_arg as *mut u64).cast(),
                (&mut out_arg as *mut u64).cast(),
                (&mut w_arg as *mut i32).cast(),
                (&mut h_arg as *mut i32).cast(),
            ];
            result::launch_kernel(
                self.function,
                (blocks, items.len() as u32, 1),
                (kernel::BLOCK, 1, 1),
                0,
                self.stream,
                &mut args,
            )
            .map_err(driver("cuLaunchKernel"))?;
            result::event::record(self.done, self.stream).map_err(driver("cuEventRecord"))?;
        }
        add_since(&self.stats.launch_ns, launching);
        positions.extend(pending.iter().map(|(item, _)| item.row as u32));
        Ok(())
    }
}

impl Drop for Pipe {
    /// Waits for the pipe's work, then releases its CUDA objects (the memory goes with the
    /// last holder of it). Runs on the pipe's thread, whose context is current.
    fn drop(&mut self) {
        // SAFETY: the pipe's own objects, destroyed once, after their work.
        unsafe {
            if !self.stream.is_null() {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::stream::destroy(self.stream);
            }
            if !self.done.is_null() {
                let _ = sys::cuEventDestroy_v2(self.done);
            }
            if !self.staging.is_null() {
                let _ = sys::cuMemFreeHost(self.staging);
            }
            if !self.host_params.is_null() {
                let _ = sys::cuMemFreeHost(self.host_params);
            }
        }
    }
}

/// A pipe's thread: builds the GPU rows of the batches it takes from the lane's queue, then
/// sends each batch on (out of order between pipes: the stream above reorders).
fn run(shared: Arc<Shared>, mut pipe: Pipe, queue: Receiver<LaneTask>, row_bytes: usize) {
    // SAFETY: the primary context is retained for the process's life; this thread is ours.
    if let Err(error) = unsafe { result::ctx::set_current(shared.cuda.context()) } {
        tracing::error!(error = %describe(error), "the GPU decode lane cannot use the device");
    }
    while let Ok(task) = queue.recv() {
        let (reply, step, task_started, ring) =
            (task.reply.clone(), task.step, task.started, task.ring);
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pipe.build(&shared, task, row_bytes)
        }));
        let result = built.unwrap_or_else(|panic| {
            pipe.release_ring(&shared, ring);
            Err(Error::Stopped(format!(
                "the GPU decode lane panicked building step {step}: {}",
                stoker_worker::panic_text(&*panic)
            )))
        });
        let _ = reply.send(Built {
            step,
            service: task_started.elapsed(),
            result,
        });
    }
    drop(pipe);
}
