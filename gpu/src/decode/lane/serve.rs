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

use stoker_loader::{pinned_reserved, PinnedShare};

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
    /// Page-locked bytes the lane keeps to within its pinned budget ([`served_pinned_limit`];
    /// 0 without a budget): the other process reserves them in its own.
    pub pinned_limit: u64,
}

/// Page-locked bytes a served lane keeps to within `room` (its pinned budget, what its loader
/// had left) with `staging` bytes of staging: the staging and twice as much again for nvJPEG's
/// pinned buffers, at most the room. The allowance is a choice, not a measure: nvJPEG sizes its
/// pinned buffers by the JPEGs it decodes, which the staging holds too; an allocation past it is
/// refused, and its images are built on the CPU.
pub fn served_pinned_limit(room: u64, staging: u64) -> u64 {
    staging.saturating_mul(3).min(room)
}

/// A share of what is left of `budget` past `spare` bytes, which locks nothing: the process's
/// later pinned allocations (nvJPEG's) then fit within `spare`. `None` when it cannot be taken
/// (another holder took some of the budget meanwhile).
fn pinned_ceiling(budget: u64, spare: u64) -> Option<PinnedShare> {
    let left = budget.saturating_sub(pinned_reserved());
    PinnedShare::take(left.saturating_sub(spare), budget).ok()
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
        // Within its budget the lane keeps to its limit: what nvJPEG's pinned buffers may take
        // past the staging is all that is left of it.
        let staging = lane.staging_bytes() as u64;
        let pinned_limit = match options.pinned_budget {
            Some(room) => {
                let limit = served_pinned_limit(room, staging);
                let ceiling = pinned_ceiling(room, limit.saturating_sub(staging));
                if ceiling.is_none() {
                    return Err(GpuDecodeError::Memory(format!(
                        "the served lane's pinned limit ({limit} bytes) could not be set in its \
                         budget of {room} bytes"
                    )));
                }
                *lock(&lane.served_ceiling) = ceiling;
                limit
            }
            None => 0,
        };
        let handles = ServedHandles {
            pinned_limit,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_lane_keeps_its_page_locked_memory_to_its_limit() {
        assert_eq!(served_pinned_limit(1000, 100), 300);
        assert_eq!(served_pinned_limit(250, 100), 250);
        assert_eq!(served_pinned_limit(1000, 0), 0);
        // A budget 64 MiB past what the process holds, 1 MiB of staging taken in it, and the
        // ceiling set for 2 MiB more: a pinned allocation fits within those 2 MiB, not past.
        let budget = pinned_reserved() + (64 << 20);
        let _staging = PinnedShare::take(1 << 20, budget).unwrap();
        let ceiling = pinned_ceiling(budget, 2 << 20).expect("the ceiling is taken");
        assert_eq!(ceiling.bytes(), 61 << 20);
        assert!(PinnedShare::take((2 << 20) + 4096, budget).is_err());
        let nvjpeg = PinnedShare::take(2 << 20, budget).expect("the spare room fits");
        drop((nvjpeg, ceiling));
        // Given back with the lane: the budget's room is whole again.
        assert!(PinnedShare::take(63 << 20, budget).is_ok());
    }
}
