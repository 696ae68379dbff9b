//! A pipe: one lane thread with its own nvJPEG decoder, stream, arena, kernel parameters and
//! page-locked staging for the JPEGs it decodes, in a context of its own choosing ([`place`]:
//! where its kernel is loaded and its events are made). Its sub-batch on the GPU (decode, crop,
//! retry) is [`batch`].

mod batch;
mod place;

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;
use cudarc::driver::{result, sys, DriverError};
use stoker_pipeline::{AssembledBatch, Job};

use super::cpu_rows::{as_device_row, CpuRow, CpuRows};
use super::serve::{RowsBuilt, RowsTask};
use super::{
    add_since, driver, DeviceRows, LaneItem, LaneMemory, LaneStats, LaneTask, Shared, ALIGN,
};
use crate::cuda::describe;
use crate::decode::jpeg_scan::{accept, Decline, Placement};
use crate::decode::kernel::{self, CropItem, SENTINEL};
use crate::decode::nvjpeg::{Decoder, Image};
use crate::decode::region::{region_for, RegionDecode};
use crate::decode::{GpuDecodeError, GpuDecodeOptions, RowTail};
use stoker_loader::{Built, Error, LaneRows, PinnedShare, Result, Slot};

use place::{EventPool, Kernel};
pub(super) use place::{Place, ReadyEvent};

/// Page-locked host memory per pipe for the encoded images of a sub-batch, per batch row, and
/// its bounds: nvJPEG copies each image to the device itself, and a copy from pageable memory
/// goes through the driver's staging buffer while the pipe's thread waits (measured on an
/// H200: ~30 us of the thread's time per image).
const STAGING_PER_ROW: usize = 128 << 10;
/// See [`STAGING_PER_ROW`].
const STAGING_BOUNDS: (usize, usize) = (4 << 20, 32 << 20);

/// Page-locked bytes a pipe stages encoded images in, for batches of `batch_rows` rows.
fn staging_bytes(batch_rows: usize) -> usize {
    batch_rows
        .saturating_mul(STAGING_PER_ROW)
        .clamp(STAGING_BOUNDS.0, STAGING_BOUNDS.1)
}

/// One pipe, owned by one lane thread: its own nvJPEG decoder (handle and state), stream,
/// arena of decoded images and kernel parameters. Pipes work on different batches at once,
/// so one's host-side decode call overlaps the other's.
pub(super) struct Pipe {
    pub(super) index: usize,
    pub(super) decoder: Decoder,
    memory: Arc<LaneMemory>,
    stream: sys::CUstream,
    /// Recorded after the pipe's last kernel: its state, arena and parameters are free once
    /// it has passed.
    done: sys::CUevent,
    /// The encoded images the pipe's last decode read, kept until it is done.
    held: Vec<LaneItem>,
    /// The output buffer of the batch being built, until it is handed on (to the batch's
    /// slot) or given back: a panic in between gives it back once, here.
    ring: Option<usize>,
    /// The pipe's context, and the crop kernel and events made in it.
    place: Arc<Place>,
    kernel: Kernel,
    events: Arc<EventPool>,
    out: (u32, u32),
    /// What the kernel makes of the rows' byte values ([`RowTail::BYTES`]: the bytes).
    tail: RowTail,
    /// Page-locked staging for the kernel parameters (copied on the pipe's stream).
    host_params: *mut c_void,
    /// Page-locked staging for the encoded images nvJPEG reads (an image larger than all of
    /// it is read from where it is).
    staging: *mut c_void,
    staging_bytes: usize,
    /// Page-locked room for each decoded image's last [`SENTINEL`] bytes, one per batch row,
    /// read back to tell a place the decode wrote from one it left poisoned.
    sentinels: *mut c_void,
    sentinel_rows: usize,
    stats: Arc<LaneStats>,
    /// The part of the process's pinned budget the page-locked memory above holds.
    pinned: Option<PinnedShare>,
    /// [`batch::FAULT_VARIABLE`]'s count: the test hook that poisons some places again.
    fault_every: Option<u64>,
    /// Whether images are decoded by region where nvJPEG takes it ([`Pipe::enable_roi`]).
    roi: bool,
}

// SAFETY: CUDA handles may move between threads; a pipe is used by its one thread.
unsafe impl Send for Pipe {}

impl Pipe {
    /// A pipe working in `place`'s context (made current on the calling thread meanwhile).
    pub(super) fn new(
        index: usize,
        place: Arc<Place>,
        memory: &Arc<LaneMemory>,
        options: &GpuDecodeOptions,
        out: (u32, u32),
        tail: RowTail,
        stats: &Arc<LaneStats>,
    ) -> std::result::Result<Pipe, GpuDecodeError> {
        let mut failure = None;
        let pipe = place.run(|| {
            let batch_hint = (memory.params_bytes / std::mem::size_of::<CropItem>()) as i32;
            let decoder = match Decoder::new(
                &options.library_dirs,
                1,
                batch_hint,
                memory.nvjpeg_limit / memory.pipes,
                options.pinned_budget,
            ) {
                Ok(decoder) => decoder,
                Err(error) => {
                    failure = Some(error);
                    return Err(DriverError(sys::cudaError_enum::CUDA_ERROR_UNKNOWN));
                }
            };
            let kernel = match Kernel::load(&place, &options.library_dirs) {
                Ok(kernel) => kernel,
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
                ring: None,
                events: EventPool::new(&place),
                place: Arc::clone(&place),
                kernel,
                out,
                tail,
                host_params: std::ptr::null_mut(),
                staging: std::ptr::null_mut(),
                staging_bytes: staging_bytes(batch_hint.max(1) as usize),
                sentinels: std::ptr::null_mut(),
                sentinel_rows: batch_hint.max(1) as usize,
                stats: Arc::clone(stats),
                pinned: None,
                fault_every: batch::fault_every(
                    std::env::var(batch::FAULT_VARIABLE).ok().as_deref(),
                ),
                roi: false,
            };
            // The page-locked memory below counts against the process's pinned budget.
            if let Some(budget) = options.pinned_budget {
                let wanted = pipe.host_bytes() as u64;
                match PinnedShare::take(wanted, budget) {
                    Ok(share) => pipe.pinned = Some(share),
                    Err(held) => {
                        failure = Some(GpuDecodeError::Memory(format!(
                            "the GPU decode lane's page-locked staging ({wanted} bytes a pipe) \
                             does not fit in the pinned memory budget of {budget} bytes for this \
                             process ({held} held by its loaders and lanes)"
                        )));
                        return Err(DriverError(sys::cudaError_enum::CUDA_ERROR_UNKNOWN));
                    }
                }
            }
            // On failure `pipe` drops and releases what was made so far. The stream has the
            // device's highest priority: the crop kernel is small and the training step waits
            // for its rows, so its blocks go ahead of a running step's queued ones.
            let (_, greatest) = result::stream::get_priority_range()?;
            pipe.stream = place.stream(greatest)?;
            // SAFETY: creations and an allocation into fields, in the pipe's context.
            unsafe {
                sys::cuEventCreate(
                    &mut pipe.done,
                    sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
                        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                )
                .result()?;
                sys::cuMemAllocHost_v2(&mut pipe.host_params, memory.params_bytes).result()?;
                sys::cuMemAllocHost_v2(&mut pipe.staging, pipe.staging_bytes).result()?;
                sys::cuMemAllocHost_v2(&mut pipe.sentinels, pipe.sentinel_rows * SENTINEL)
                    .result()?;
            }
            Ok(pipe)
        });
        match (pipe, failure) {
            (Ok(pipe), _) => Ok(pipe),
            (Err(_), Some(error)) => Err(error),
            (Err(error), None) => Err(GpuDecodeError::Cuda(describe(error))),
        }
    }

    /// Has the pipe decode only each image's crop window where nvJPEG takes it; whether its
    /// decoder can (the hardware backend, with the calls region decoding needs).
    pub(super) fn enable_roi(&mut self) -> bool {
        let (place, rows) = (Arc::clone(&self.place), self.sentinel_rows);
        let decoder = &mut self.decoder;
        self.roi = place.run(|| Ok(decoder.enable_roi(rows))).unwrap_or(false);
        self.roi
    }

    /// Has the pipe decode whole images (when not every pipe of the lane can decode regions),
    /// its decoder's region parameters destroyed in its context.
    pub(super) fn disable_roi(&mut self) {
        self.roi = false;
        let place = Arc::clone(&self.place);
        let decoder = &mut self.decoder;
        let _ = place.run(|| {
            decoder.disable_roi();
            Ok(())
        });
    }

    /// The SMs a green context keeps the pipe's kernels to, if one does.
    pub(super) fn green_sms(&self) -> Option<u32> {
        self.place.sms()
    }

    /// The page-locked bytes the pipe allocates as it starts (parameters, staging, sentinels).
    pub(super) fn host_bytes(&self) -> usize {
        self.memory.params_bytes + self.staging_bytes + self.sentinel_rows * SENTINEL
    }

    /// Builds the lane's rows of `task` and finishes the batch.
    fn build(
        &mut self,
        shared: &Arc<Shared>,
        task: LaneTask,
        row_bytes: usize,
    ) -> Result<stoker_loader::Batch> {
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
        /// Counts the lane busy until dropped, a panic's unwinding included.
        struct Working<'a>(&'a Shared);
        impl Drop for Working<'_> {
            fn drop(&mut self) {
                self.0.working(false);
            }
        }
        shared.working(true);
        let _working = Working(shared);
        self.ring = Some(ring);
        self.build_rows(
            shared, ring, job, epoch, slot, assembled, indices, items, row_bytes,
        )
    }

    /// Gives the batch's output buffer back, if it was not handed on yet, after this pipe's
    /// queued work is done (its kernels may write there).
    fn release_ring(&mut self, shared: &Shared) {
        let Some(ring) = self.ring.take() else {
            return;
        };
        // The whole stream, not the decode's event alone: a failed batch may have queued the
        // copies of CPU rows into the buffer after that event, which the next batch given
        // this buffer would otherwise race.
        // SAFETY: the pipe's own stream.
        if let Err(error) = unsafe { result::stream::synchronize(self.stream) } {
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
        items: Vec<LaneItem>,
        row_bytes: usize,
    ) -> Result<stoker_loader::Batch> {
        let set = match self.decode_set(ring, items) {
            Ok(set) => set,
            Err(error) => {
                self.release_ring(shared);
                return Err(Error::Gpu(error.to_string()));
            }
        };
        let (width, height) = self.out;
        let (tail, stream) = (self.tail, self.stream);
        let built = CpuRows {
            job: &job,
            epoch,
            slot: &mut slot,
            assembled: &mut assembled,
            row_bytes,
        }
        .build(set.cpu.iter().copied(), |k, row| {
            // The device stage copies device rows over the slot's: this one must be the CPU's
            // row too, made what the kernel would have made of it. The pipe's work is done
            // (`unwritten` waited for it).
            let row = as_device_row(tail, row, height, width)?;
            // On the pipe's stream, so the rows' ready event below follows it (pageable bytes
            // are staged as the call returns; a page-locked slot is untouched until its batch
            // is released, after the stage waited for that event).
            // SAFETY: row `k` of the batch's ring buffer holds `row.len()` bytes and nothing
            // on the GPU uses it now.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    set.out + (k * row.len()) as u64,
                    row.as_ptr().cast::<c_void>(),
                    row.len(),
                    stream,
                )
            }
            .result()
            .map_err(describe)
        });
        if let Err(error) = built {
            self.release_ring(shared);
            return Err(error);
        }

        let device_rows: Option<Arc<dyn LaneRows>> = if set.rows.is_empty() {
            self.ring = None;
            shared.put_ring(ring);
            None
        } else {
            match self.events.record(self.stream) {
                Ok(ready) => {
                    self.ring = None;
                    Some(Arc::new(DeviceRows {
                        shared: Arc::clone(shared),
                        ring_index: ring,
                        ptr: set.out,
                        positions: set.rows,
                        height,
                        width,
                        tail: self.tail,
                        events: vec![ready],
                    }))
                }
                Err(error) => {
                    self.release_ring(shared);
                    return Err(Error::Gpu(describe(error)));
                }
            }
        };
        let mut batch = assembled.into_batch(&indices, slot.into_bytes());
        batch.device_rows = device_rows;
        Ok(batch)
    }

    /// The staging bytes an image takes: its length, or none when it is larger than the whole
    /// buffer (nvJPEG then reads it where it is).
    fn staged_len(&self, item: &LaneItem) -> usize {
        let len = item.image.bytes.len();
        if len <= self.staging_bytes {
            len
        } else {
            0
        }
    }
}

/// What decoding a batch's images gave ([`Pipe::decode_set`]).
pub(super) struct DecodedSet {
    /// The output buffer's address.
    pub(super) out: u64,
    /// The batch row of each device row.
    pub(super) rows: Vec<u32>,
    /// The rows to build on the CPU, with the device row each replaces, if any.
    pub(super) cpu: Vec<(CpuRow, Option<usize>)>,
}

impl CpuRow {
    fn of(item: &LaneItem) -> CpuRow {
        CpuRow {
            row: item.image.row,
            sample: item.image.sample,
        }
    }
}

impl Drop for Pipe {
    /// Waits for the pipe's work, then releases its CUDA objects (the memory goes with the
    /// last holder of it). Runs on the pipe's thread, whose context is current, or within
    /// [`Pipe::release`].
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
            if !self.sentinels.is_null() {
                let _ = sys::cuMemFreeHost(self.sentinels);
            }
            if !self.host_params.is_null() {
                let _ = sys::cuMemFreeHost(self.host_params);
            }
        }
        self.kernel.unload();
    }
}

impl Pipe {
    /// Drops a pipe that never ran on its thread, with its context current meanwhile (nvJPEG's
    /// objects and the module belong to it).
    pub(super) fn release(self) {
        let place = Arc::clone(&self.place);
        let _ = place.run(|| {
            drop(self);
            Ok(())
        });
    }
}

/// What a pipe's thread is given: a batch of the lane beside the decode threads, or the
/// images of one batch of a served lane (the helper process's).
pub(super) enum Work {
    /// Build the batch's GPU rows and finish it.
    Batch(Box<LaneTask>),
    /// Build the images into their output buffer and say what became of each.
    Rows(RowsTask),
}

/// A pipe's thread: builds the GPU rows of the work it takes from the lane's queue, then
/// sends each batch on (out of order between pipes: the stream above reorders).
pub(super) fn run(shared: Arc<Shared>, mut pipe: Pipe, queue: Receiver<Work>, row_bytes: usize) {
    // SAFETY: the primary context is retained for the process's life (a green context for as
    // long as the pipe holds it); this thread is ours, and the only one it is current on.
    if let Err(error) = unsafe { result::ctx::set_current(pipe.place.context()) } {
        tracing::error!(error = %describe(error), "the GPU decode lane cannot use the device");
    }
    while let Ok(work) = queue.recv() {
        let task = match work {
            Work::Batch(task) => *task,
            Work::Rows(task) => {
                let reply = task.reply.clone();
                let _ = reply.send(pipe.serve(&shared, task));
                continue;
            }
        };
        let (reply, step, task_started) = (task.reply.clone(), task.step, task.started);
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pipe.build(&shared, task, row_bytes)
        }));
        let result = built.unwrap_or_else(|panic| {
            pipe.release_ring(&shared);
            Err(Error::Stopped(format!(
                "the GPU decode lane panicked building step {step}: {}",
                stoker_pipeline::panic_text(&*panic)
            )))
        });
        let _ = reply.send(Built {
            step,
            service: task_started.elapsed(),
            result,
        });
    }
    // The pipe's objects go with its context current; the context is then left current here
    // no longer, so a green one is destroyed (with its last holder) current nowhere.
    let place = Arc::clone(&pipe.place);
    drop(pipe);
    // SAFETY: clears this thread's current context.
    let _ = unsafe { result::ctx::set_current(std::ptr::null_mut()) };
    drop(place);
}

impl Pipe {
    /// Builds a served batch's images into its output buffer; a failure (or a panic) sends
    /// every image back to the CPU. It returns only once nothing queued on the pipe's stream
    /// still runs (on the failures too, where a kernel may have been launched): the other
    /// process reads the buffer as soon as it has the answer, and the buffer may be written
    /// next by another pipe.
    fn serve(&mut self, shared: &Arc<Shared>, task: RowsTask) -> RowsBuilt {
        let RowsTask {
            id, ring, items, ..
        } = task;
        let all: Vec<(CpuRow, Option<usize>)> =
            items.iter().map(|item| (CpuRow::of(item), None)).collect();
        let started = Instant::now();
        shared.working(true);
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.decode_set(ring, items)
        }));
        // SAFETY: the pipe's own stream, in the context current on this thread.
        let finished = unsafe { result::stream::synchronize(self.stream) };
        shared.working(false);
        let built = match (built, finished) {
            (Ok(Ok(_)), Err(error)) => Ok(Err(GpuDecodeError::Call {
                call: "cuStreamSynchronize",
                error: describe(error),
            })),
            (built, _) => built,
        };
        let (rows, cpu, error) = match built {
            Ok(Ok(set)) => (set.rows, set.cpu, None),
            Ok(Err(error)) => (Vec::new(), all, Some(error.to_string())),
            Err(panic) => (
                Vec::new(),
                all,
                Some(format!(
                    "the lane panicked: {}",
                    stoker_pipeline::panic_text(&*panic)
                )),
            ),
        };
        RowsBuilt {
            id,
            ring,
            rows,
            cpu: cpu
                .into_iter()
                .map(|(row, device_row)| (row.row as u32, row.sample, device_row))
                .collect(),
            error,
            busy: started.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_grows_with_the_batch_within_its_bounds() {
        assert_eq!(staging_bytes(1), 4 << 20);
        assert_eq!(staging_bytes(64), 8 << 20);
        assert_eq!(staging_bytes(256), 32 << 20);
        assert_eq!(staging_bytes(4096), 32 << 20);
        assert_eq!(staging_bytes(usize::MAX), 32 << 20);
    }
}
