//! Starting the lane: for a job beside its decode threads, or for an output size when the lane
//! is served to another process ([`super::serve`]).

use std::sync::{Arc, Condvar, Mutex};

use stoker_pipeline::{Job, Pipeline};

use super::pipe::{run, Pipe, Place};
use super::{pipe_count, GpuLane, LaneMemory, LaneSplit, LaneStats, Shared};
use crate::cuda::{sms_asked, Cuda, GREEN_SMS_VARIABLE};
use crate::decode::{
    fused_tail_asked, roi_asked, GpuDecodeError, GpuDecodeOptions, RowTail, FUSED_TAIL_VARIABLE,
    ROI_VARIABLE,
};

/// The image pipeline of a job the lane can build rows of: one image source whose CPU output is
/// uint8 NHWC.
pub(crate) fn image_rows_of(job: &Job) -> Result<&Pipeline, GpuDecodeError> {
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
    Ok(pipeline)
}

impl GpuLane {
    /// Starts the lane for `job` (one image source whose CPU output is uint8 NHWC) with batches
    /// of up to `batch_size` rows: loads nvJPEG, compiles the kernel, allocates the memory.
    pub fn start(
        options: &GpuDecodeOptions,
        job: &Job,
        batch_size: usize,
    ) -> std::result::Result<GpuLane, GpuDecodeError> {
        let pipeline = image_rows_of(job)?;
        // The rows as the kernel writes them: the stage's tail, or the slot's uint8 NHWC.
        let fused = fused_tail_asked(std::env::var(FUSED_TAIL_VARIABLE).ok().as_deref())
            .map_err(GpuDecodeError::Unsupported)?;
        let tail = if fused { options.tail } else { RowTail::BYTES };
        let (height, width) = pipeline.output_size();
        GpuLane::start_sized(
            options,
            (height, width),
            pipeline.bytes_per_sample(),
            batch_size,
            tail,
            false,
        )
    }

    /// Starts a lane for rows of `height x width` (`row_bytes` in the slot) that its kernel
    /// makes `tail`, batches of up to `batch_size` rows; `served` for a lane served to another
    /// process ([`GpuLane::start_served`]).
    pub(super) fn start_sized(
        options: &GpuDecodeOptions,
        (height, width): (u32, u32),
        row_bytes: usize,
        batch_size: usize,
        tail: RowTail,
        served: bool,
    ) -> std::result::Result<GpuLane, GpuDecodeError> {
        let cuda = Cuda::open(options.device).map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        let pipe_count = pipe_count(std::env::var("STOKER_GPU_DECODE_PIPES").ok().as_deref());
        // The memory is planned for the backend the decoders will use (tried the same way).
        let hardware = cuda
            .in_context("nvjpegCreateExV2", || {
                Ok(crate::decode::nvjpeg::hardware_backend(
                    &options.library_dirs,
                ))
            })
            .map_err(|e| GpuDecodeError::Cuda(e.to_string()))??;
        let memory = Arc::new(LaneMemory::allocate(
            &cuda,
            options.memory_bytes,
            batch_size.max(1),
            tail.row_bytes(height, width),
            pipe_count,
            hardware,
        )?);
        let stats = Arc::new(LaneStats::default());
        // Each pipe in the primary context, or in a green context of its own.
        let sms = sms_asked(std::env::var(GREEN_SMS_VARIABLE).ok().as_deref())
            .map_err(GpuDecodeError::Unsupported)?;
        let roi_wanted = roi_asked(std::env::var(ROI_VARIABLE).ok().as_deref())
            .map_err(GpuDecodeError::Unsupported)?;
        let mut pipes: Vec<Pipe> = Vec::with_capacity(pipe_count);
        for index in 0..pipe_count {
            let made = Place::new(&cuda, sms).and_then(|place| {
                Pipe::new(
                    index,
                    place,
                    &memory,
                    options,
                    (width, height),
                    tail,
                    &stats,
                )
            });
            match made {
                Ok(pipe) => pipes.push(pipe),
                Err(error) => {
                    // Pipes release CUDA objects (and nvJPEG's memory) with their context current.
                    pipes.into_iter().for_each(Pipe::release);
                    return Err(error);
                }
            }
        }
        if hardware && pipes.iter().any(|pipe| !pipe.decoder.hardware()) {
            tracing::warn!(
                "the lane's memory was planned for nvJPEG's hardware backend, but a decoder \
                 started on the default one: its allocations past the margin are refused and \
                 those images built on the CPU"
            );
        }
        if !hardware && pipes.iter().any(|pipe| pipe.decoder.hardware()) {
            tracing::warn!(
                "the lane's memory was planned for nvJPEG's default backend, but a decoder \
                 started on the hardware one: nvJPEG's share of the cap goes unused and the \
                 arenas are smaller than they could be"
            );
        }
        // Region decoding where every pipe's decoder takes it (else none decodes by region,
        // so the rows do not depend on which pipe built them).
        let roi = roi_wanted && pipes.iter_mut().all(Pipe::enable_roi);
        if roi_wanted && !roi {
            pipes.iter_mut().for_each(Pipe::disable_roi);
            tracing::warn!(
                "{ROI_VARIABLE}=1, but nvJPEG here decodes no regions (it needs the hardware \
                 backend and nvjpegDecodeBatchedEx): the lane decodes whole images"
            );
        }
        let granted_sms = pipes[0].green_sms();
        let shared = Arc::new(Shared {
            cuda: Arc::clone(&cuda),
            free: Mutex::new((0..memory.ring_slots).rev().collect()),
            memory,
            returned: Condvar::new(),
            stats,
            budgets: pipes.iter().map(|pipe| pipe.decoder.budget()).collect(),
            host_bytes: pipes.iter().map(|pipe| pipe.host_bytes()).sum(),
            split: LaneSplit::new(options.mode),
            hardware: pipes[0].decoder.hardware(),
            roi,
            tail,
            closed: std::sync::atomic::AtomicBool::new(false),
            served,
        });
        let (tasks, queue) = crossbeam_channel::bounded(1);
        let mut threads = Vec::with_capacity(pipe_count);
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
            pipes = pipe_count,
            green_context_sms = ?sms,
            rows = tail.element.name(),
            tail_fused = !tail.is_bytes(),
            roi,
            granted_sms = ?granted_sms,
            "GPU decode lane started"
        );
        let started = !threads.is_empty();
        let lane = GpuLane {
            shared,
            tasks: Mutex::new(Some(tasks)),
            threads: Mutex::new(threads),
            served_ceiling: Mutex::new(None),
        };
        if !started {
            return Err(GpuDecodeError::Cuda(
                "no GPU decode lane thread could be started".into(),
            ));
        }
        Ok(lane)
    }
}
