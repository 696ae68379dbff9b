//! A lane served to another process (the helper process of `stoker-lane-helper`): started for
//! an output size rather than a job, its output buffers exported as one CUDA IPC handle, and
//! its batches given as images and answered with what became of each image (a device row, the
//! CPU, or both when the decode left its place unwritten). A batch is answered only once
//! everything queued on the device for it has finished, so the other process may read the
//! buffer as soon as it has the answer, and waits on nothing of this process's (no event
//! crosses over: waiting on one whose process died is left undefined by CUDA). The process
//! holding the handle decides which output buffer each batch goes to, and names one again
//! only once its copy of the last rows there is done.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::Sender;
use cudarc::driver::sys;
use stoker_pipeline::DivertedImage;

use super::pipe::Work;
use super::{lock, offered_frame, GpuLane, LaneItem};
use crate::cuda::{sms_asked, GREEN_SMS_VARIABLE};
use crate::decode::{GpuDecodeError, GpuDecodeOptions};

/// Bytes of a CUDA IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// One served batch: its images, and the output buffer they go to.
pub struct RowsTask {
    /// The caller's name for the batch, given back with the answer.
    pub id: u64,
    /// The output buffer, `0..ring_slots`.
    pub ring: usize,
    /// The images, as the lane takes them ([`GpuLane::served_item`]).
    pub items: Vec<LaneItem>,
    /// Where the answer goes.
    pub reply: Sender<RowsBuilt>,
}

/// What became of a served batch's images.
#[derive(Debug, Clone, PartialEq)]
pub struct RowsBuilt {
    /// The batch's id.
    pub id: u64,
    /// Its output buffer.
    pub ring: usize,
    /// The batch row of each device row (written before the answer is sent).
    pub rows: Vec<u32>,
    /// The images to build on the CPU: batch row, sample, and the device row the CPU's row
    /// replaces (an image the decode left unwritten).
    pub cpu: Vec<(u32, u64, Option<usize>)>,
    /// Why the batch failed, every image then being in `cpu`.
    pub error: Option<String>,
    /// The lane's time on it.
    pub busy: Duration,
}

/// A served lane's output buffers, as the IPC handle another process opens.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedHandles {
    /// `cuIpcGetMemHandle` of the buffers' one allocation.
    pub ring: [u8; IPC_HANDLE_BYTES],
    /// Buffers in the allocation, one after another.
    pub ring_slots: usize,
    /// Bytes of each.
    pub ring_slot_bytes: usize,
    /// The most decoded bytes an image sent to the lane may have.
    pub max_decoded_bytes: usize,
    /// The device's UUID (`cuDeviceGetUuid`), for the other process to check it opens the
    /// buffers on the same GPU.
    pub device_uuid: [u8; 16],
}

/// A handle's bytes, as they travel.
pub(crate) fn handle_bytes(
    reserved: [std::ffi::c_char; IPC_HANDLE_BYTES],
) -> [u8; IPC_HANDLE_BYTES] {
    reserved.map(|c| c as u8)
}

/// A handle made from the bytes it travelled as.
pub(crate) fn handle_chars(bytes: &[u8; IPC_HANDLE_BYTES]) -> [std::ffi::c_char; IPC_HANDLE_BYTES] {
    bytes.map(|b| b as std::ffi::c_char)
}

impl GpuLane {
    /// Starts a lane served to another process: rows of `height x width` for batches of up to
    /// `batch_rows`, with what `options` ask (its kernel applying `options.tail` as it is), its
    /// output buffers exported ([`ServedHandles`]). Green contexts are not served.
    pub fn start_served(
        options: &GpuDecodeOptions,
        height: u32,
        width: u32,
        batch_rows: usize,
    ) -> Result<(GpuLane, ServedHandles), GpuDecodeError> {
        if sms_asked(std::env::var(GREEN_SMS_VARIABLE).ok().as_deref())
            .map_err(GpuDecodeError::Unsupported)?
            .is_some()
        {
            return Err(GpuDecodeError::Unsupported(format!(
                "{GREEN_SMS_VARIABLE} does not apply to the helper process's lane"
            )));
        }
        let row_bytes = height as usize * width as usize * 3;
        let lane = GpuLane::start_sized(
            options,
            (height, width),
            row_bytes,
            batch_rows,
            options.tail,
            true,
        )?;
        let memory = &lane.shared.memory;
        let ring = memory
            .cuda
            .in_context("cuIpcGetMemHandle", || {
                let mut handle = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
                // SAFETY: the ring is one cuMemAlloc allocation of the lane's.
                unsafe { sys::cuIpcGetMemHandle(handle.as_mut_ptr(), memory.ring) }.result()?;
                // SAFETY: written by the call.
                Ok(handle_bytes(unsafe { handle.assume_init() }.reserved))
            })
            .map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        let handles = ServedHandles {
            ring,
            ring_slots: memory.ring_slots,
            ring_slot_bytes: memory.ring_slot_bytes,
            max_decoded_bytes: memory.arena_bytes(),
            device_uuid: memory
                .cuda
                .uuid()
                .map_err(|e| GpuDecodeError::Cuda(e.to_string()))?,
        };
        Ok((lane, handles))
    }

    /// An image as a served lane takes it: its frame read by the marker scan, or `None` when
    /// the lane declines it here (counted), the caller then building it on the CPU.
    pub fn served_item(&self, image: DivertedImage) -> Option<LaneItem> {
        match offered_frame(&image, self.shared.memory.arena_bytes()) {
            Ok(frame) => Some(LaneItem { image, frame }),
            Err(_) => {
                self.shared
                    .stats
                    .declined_rows
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Queues a served batch (waits while the lane already has one queued); its answer goes
    /// to the task's `reply`. A buffer past the lane's, or a lane that is not served or has
    /// shut down, answers at once with every image for the CPU.
    pub fn serve(&self, task: RowsTask) {
        let refused = if !self.shared.served {
            Some("the lane is not served".to_string())
        } else if task.ring >= self.shared.memory.ring_slots {
            Some(format!(
                "output buffer {} is not one of the lane's {}",
                task.ring, self.shared.memory.ring_slots
            ))
        } else {
            None
        };
        let task = match refused {
            Some(error) => return answer_all_cpu(task, error),
            None => task,
        };
        let tasks = lock(&self.tasks).clone();
        let sent = match tasks {
            Some(tasks) => tasks.send(Work::Rows(task)),
            None => Err(crossbeam_channel::SendError(Work::Rows(task))),
        };
        if let Err(crossbeam_channel::SendError(Work::Rows(task))) = sent {
            answer_all_cpu(task, "the GPU decode lane stopped".into());
        }
    }
}

/// Answers `task` with every image for the CPU, for `error`.
fn answer_all_cpu(task: RowsTask, error: String) {
    let built = RowsBuilt {
        id: task.id,
        ring: task.ring,
        rows: Vec::new(),
        cpu: task
            .items
            .iter()
            .map(|item| (item.image.row as u32, item.image.sample, None))
            .collect(),
        error: Some(error),
        busy: Duration::ZERO,
    };
    let _ = task.reply.send(built);
}
