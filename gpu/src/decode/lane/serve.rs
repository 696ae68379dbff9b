//! A lane served to another process (the helper process of `stoker-lane-helper`): started for
//! an output size rather than a job, its output buffers and the event each one's rows are
//! ready by exported as CUDA IPC handles, and its batches given as images and answered with
//! what became of each image (a device row, the CPU, or both when the decode left its place
//! unwritten). The process holding the handles decides which output buffer each batch goes to,
//! and names one again only once every read of its last rows has finished.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;
use cudarc::driver::sys;
use stoker_pipeline::DivertedImage;

use super::pipe::Work;
use super::{lock, offered_frame, GpuLane, LaneItem, Shared};
use crate::cuda::{describe, sms_asked, Cuda, GREEN_SMS_VARIABLE};
use crate::decode::{GpuDecodeError, GpuDecodeOptions};

/// Bytes of a CUDA IPC handle (memory or event).
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
    /// The batch row of each device row, ready once the buffer's event has passed.
    pub rows: Vec<u32>,
    /// The images to build on the CPU: batch row, sample, and the device row the CPU's row
    /// replaces (an image the decode left unwritten).
    pub cpu: Vec<(u32, u64, Option<usize>)>,
    /// Why the batch failed, every image then being in `cpu`.
    pub error: Option<String>,
    /// The lane's time on it.
    pub busy: Duration,
}

/// A served lane's output buffers and their ready events, as IPC handles another process opens.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedHandles {
    /// `cuIpcGetMemHandle` of the buffers' one allocation.
    pub ring: [u8; IPC_HANDLE_BYTES],
    /// Buffers in the allocation, one after another.
    pub ring_slots: usize,
    /// Bytes of each.
    pub ring_slot_bytes: usize,
    /// `cuIpcGetEventHandle` of each buffer's ready event.
    pub ready: Vec<[u8; IPC_HANDLE_BYTES]>,
    /// The most decoded bytes an image sent to the lane may have.
    pub max_decoded_bytes: usize,
}

/// The interprocess events of a served lane's output buffers, made in the primary context,
/// with their handles; destroyed with the lane's last holder.
pub(super) struct ReadyEvents {
    cuda: Arc<Cuda>,
    events: Vec<sys::CUevent>,
    handles: Vec<[u8; IPC_HANDLE_BYTES]>,
    /// Serialises records (two pipes never share a buffer, but a caller naming a buffer still
    /// in use must not race the driver).
    recording: Mutex<()>,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for ReadyEvents {}
unsafe impl Sync for ReadyEvents {}

impl Shared {
    /// Records output buffer `ring`'s ready event on `stream`, after the work queued there.
    pub(super) fn record_ready(
        &self,
        ring: usize,
        stream: sys::CUstream,
    ) -> Result<(), GpuDecodeError> {
        let served = self.served.as_ref();
        let Some((served, &event)) = served.and_then(|s| Some((s, s.events.get(ring)?))) else {
            return Err(GpuDecodeError::Unsupported(format!(
                "output buffer {ring} has no ready event (not a served lane, or past its buffers)"
            )));
        };
        let _one = lock(&served.recording);
        // SAFETY: the event is the lane's and lives as long as `self`; the stream is the
        // calling pipe's, in the primary context (a served lane has no green contexts).
        unsafe { sys::cuEventRecord(event, stream) }
            .result()
            .map_err(|e| GpuDecodeError::Call {
                call: "cuEventRecord",
                error: describe(e),
            })
    }
}

impl ReadyEvents {
    /// One interprocess event for each of `count` buffers, with its handle.
    pub(super) fn make(cuda: &Arc<Cuda>, count: usize) -> Result<ReadyEvents, GpuDecodeError> {
        let mut made = ReadyEvents {
            cuda: Arc::clone(cuda),
            events: Vec::with_capacity(count),
            handles: Vec::with_capacity(count),
            recording: Mutex::new(()),
        };
        // On failure `made` drops and destroys the events made so far.
        cuda.in_context("cuIpcGetEventHandle", || {
            for _ in 0..count {
                let mut event = std::ptr::null_mut();
                // SAFETY: creation into a local in the current (primary) context; an
                // interprocess event must not time.
                unsafe {
                    sys::cuEventCreate(
                        &mut event,
                        sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
                            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                    )
                    .result()?;
                }
                made.events.push(event);
                let mut handle = std::mem::MaybeUninit::<sys::CUipcEventHandle>::zeroed();
                // SAFETY: the event was made interprocess just above.
                unsafe { sys::cuIpcGetEventHandle(handle.as_mut_ptr(), event) }.result()?;
                // SAFETY: written by the call.
                made.handles
                    .push(handle_bytes(unsafe { handle.assume_init() }.reserved));
            }
            Ok(())
        })
        .map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        Ok(made)
    }
}

impl Drop for ReadyEvents {
    fn drop(&mut self) {
        let events = std::mem::take(&mut self.events);
        let _ = self.cuda.in_context("cuEventDestroy", || {
            for event in events {
                // SAFETY: the lane's own event; its pipes have ended.
                let _ = unsafe { sys::cuEventDestroy_v2(event) };
            }
            Ok(())
        });
    }
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
    /// `batch_rows`, with what `options` ask (its kernel applying `options.tail` as it is), its output buffers
    /// and their ready events exported ([`ServedHandles`]). Green contexts are not served.
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
            ready: lane
                .shared
                .served
                .as_ref()
                .map(|served| served.handles.clone())
                .unwrap_or_default(),
            max_decoded_bytes: memory.arena_bytes(),
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
        let refused = if self.shared.served.is_none() {
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
