//! The helper's output buffers as the loader's process sees them ([`DeviceSide`]): opened from
//! their IPC handle in the device's primary context, and a copy of them in this process's own memory, into which each batch's rows are copied (and the
//! rows the CPU replaced put over them) on a stream of this side's as the helper's answer
//! comes; and the rows of one batch there ([`HelperRows`]), handed out in the batch and given
//! back to the lane's free buffers once every holder and fence has let go. The rows handed out
//! are this process's own: a helper that dies while batches hold rows takes nothing they read
//! with it (CUDA leaves reading an exporter's freed memory undefined).

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::Inner;
use crate::cuda::Cuda;
use crate::decode::lane::{handle_chars, IPC_HANDLE_BYTES};
use crate::decode::{GpuDecodeError, RowTail};

/// The helper's buffers as mapped here, this process's copy of them, and the stream and
/// events its copies run on.
pub(super) struct DeviceSide {
    pub(super) cuda: Arc<Cuda>,
    /// Where the helper's output buffers are mapped here.
    pub(super) ring: u64,
    /// This process's copy of them, where the rows handed out are.
    own: u64,
    /// Set once the mapping is closed ([`DeviceSide::close_ring`]).
    ring_closed: std::sync::atomic::AtomicBool,
    pub(super) ring_slot_bytes: usize,
    /// Each buffer's event its copy here is done by.
    copied: Vec<sys::CUevent>,
    /// The stream the copies go on.
    stream: sys::CUstream,
}

// SAFETY: CUDA handles and device addresses may be used from any thread; the stream is used
// under the lane's lock of the batch being finished (one buffer, one batch).
unsafe impl Send for DeviceSide {}
unsafe impl Sync for DeviceSide {}

fn cuda_error(call: &'static str) -> impl Fn(crate::cuda::Unavailable) -> GpuDecodeError {
    move |error| GpuDecodeError::Call {
        call,
        error: error.to_string(),
    }
}

impl DeviceSide {
    /// Opens the `ring_slots` buffers of `ring_slot_bytes` of `ring_handle` on device
    /// `ordinal`, which must be the GPU of UUID `uuid` (the helper's).
    pub(super) fn open(
        ordinal: usize,
        uuid: &[u8],
        ring_handle: &[u8; IPC_HANDLE_BYTES],
        (ring_slots, ring_slot_bytes): (usize, usize),
    ) -> Result<DeviceSide, GpuDecodeError> {
        let cuda = Cuda::open(ordinal).map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        let here = cuda
            .uuid()
            .map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        if uuid != here {
            return Err(GpuDecodeError::Unsupported(format!(
                "the helper's GPU is not this process's device {ordinal} (another UUID: were \
                 the two given different CUDA_VISIBLE_DEVICES?)"
            )));
        }
        let ring_bytes = ring_slots
            .checked_mul(ring_slot_bytes)
            .filter(|&bytes| ring_slots > 0 && bytes > 0)
            .ok_or_else(|| {
                GpuDecodeError::Unsupported(format!(
                    "{ring_slots} output buffers of {ring_slot_bytes} bytes"
                ))
            })?;
        let mut side = DeviceSide {
            cuda: Arc::clone(&cuda),
            ring: 0,
            own: 0,
            ring_closed: std::sync::atomic::AtomicBool::new(false),
            ring_slot_bytes,
            copied: Vec::new(),
            stream: std::ptr::null_mut(),
        };
        let mut mapped = 0;
        // On failure `side` drops and closes what was opened so far.
        cuda.in_context("cuIpcOpenMemHandle", || {
            let handle = sys::CUipcMemHandle {
                reserved: handle_chars(ring_handle),
            };
            // SAFETY: opening into a field, in the primary context (current here).
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut side.ring,
                    handle,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            }
            .result()?;
            // The buffers must be within what was opened: a copy past it would fault here.
            let (mut base, mut size) = (0, 0);
            // SAFETY: a query of the mapping just made.
            unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, side.ring) }.result()?;
            mapped = size;
            for _ in 0..ring_slots {
                let mut own = std::ptr::null_mut();
                // SAFETY: creation into a local, in the primary context.
                unsafe {
                    sys::cuEventCreate(&mut own, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
                }
                .result()?;
                side.copied.push(own);
            }
            side.stream = result::stream::create(result::stream::StreamKind::NonBlocking)?;
            // SAFETY: a plain allocation in the primary context.
            side.own = unsafe { result::malloc_sync(ring_bytes) }?;
            Ok(())
        })
        .map_err(cuda_error("opening the helper's buffers"))?;
        if mapped < ring_bytes {
            return Err(GpuDecodeError::Unsupported(format!(
                "the helper named {ring_bytes} bytes of output buffers in an allocation of {mapped}"
            )));
        }
        Ok(side)
    }

    /// Buffer `ring`'s rows here (this process's copy).
    pub(super) fn ring_ptr(&self, ring: usize) -> u64 {
        self.own + (ring * self.ring_slot_bytes) as u64
    }

    /// This process's device bytes (the copy of the buffers).
    pub(super) fn own_bytes(&self) -> usize {
        self.copied.len() * self.ring_slot_bytes
    }

    /// Copies `bytes` of buffer `ring` (its rows, written before the helper answered) here,
    /// and puts `replaced` (device row, bytes) over the copy's rows, on this side's stream;
    /// waits until that is done (the helper's memory is read no longer), and returns the event
    /// it was done by.
    pub(super) fn take_over(
        &self,
        ring: usize,
        bytes: usize,
        replaced: &[(usize, Vec<u8>)],
    ) -> Result<sys::CUevent, GpuDecodeError> {
        let copied = match self.copied.get(ring) {
            Some(&copied) if bytes <= self.ring_slot_bytes => copied,
            _ => {
                return Err(GpuDecodeError::Unsupported(format!(
                    "{bytes} bytes of output buffer {ring} asked for, of {} buffers of {}",
                    self.copied.len(),
                    self.ring_slot_bytes
                )))
            }
        };
        let (from, to) = (
            self.ring + (ring * self.ring_slot_bytes) as u64,
            self.ring_ptr(ring),
        );
        self.cuda
            .in_context("cuMemcpyDtoDAsync", || {
                // SAFETY: the stream is this side's, in the primary context; the buffer (within
                // the mapping, checked as it opened) and its copy hold `bytes`, and nothing
                // else uses the copy now (its last rows were let go before the buffer was
                // named again).
                unsafe { sys::cuMemcpyDtoDAsync_v2(to, from, bytes, self.stream) }.result()?;
                for (k, row) in replaced {
                    // SAFETY: row `k` of the copy holds `row.len()` bytes (the helper sized
                    // the rows by the same tail); the bytes are staged as the call returns
                    // (pageable memory).
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(
                            to + (k * row.len()) as u64,
                            row.as_ptr().cast(),
                            row.len(),
                            self.stream,
                        )
                    }
                    .result()?;
                }
                // SAFETY: as above.
                unsafe {
                    result::event::record(copied, self.stream)?;
                    result::event::synchronize(copied)?;
                }
                Ok(copied)
            })
            .map_err(cuda_error("copying the helper's rows"))
    }

    /// Buffer `ring`'s event its copy here was done by.
    fn copied(&self, ring: usize) -> Option<sys::CUevent> {
        self.copied.get(ring).copied()
    }
}

impl DeviceSide {
    /// Closes the mapping of the helper's buffers, once: before the helper may free them (it
    /// ends once its stdin closes, or is killed), as CUDA asks, and after this process's
    /// copies out of them are done (the caller holds the copy lock; this waits for the stream).
    pub(super) fn close_ring(&self) {
        if self.ring == 0
            || self
                .ring_closed
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let (ring, stream) = (self.ring, self.stream);
        let closed = self.cuda.in_context("cuIpcCloseMemHandle", || {
            // SAFETY: this side's own stream and mapping; no copy out of it is queued after.
            unsafe {
                if !stream.is_null() {
                    result::stream::synchronize(stream)?;
                }
                sys::cuIpcCloseMemHandle(ring).result()
            }
        });
        if let Err(error) = closed {
            tracing::warn!(%error, "closing the helper's output buffers");
        }
    }
}

impl Drop for DeviceSide {
    /// Closes what was opened (every batch holding rows is gone: they hold the lane).
    fn drop(&mut self) {
        self.close_ring();
        let stream = self.stream;
        let events: Vec<sys::CUevent> = self.copied.drain(..).collect();
        let own = self.own;
        let _ = self.cuda.in_context("cuEventDestroy", || {
            // SAFETY: this side's own objects, used by no one now.
            unsafe {
                if !stream.is_null() {
                    let _ = result::stream::destroy(stream);
                }
                if own != 0 {
                    let _ = result::free_sync(own);
                }
                for event in events {
                    let _ = sys::cuEventDestroy_v2(event);
                }
            }
            Ok(())
        });
    }
}

/// The helper's rows of one batch: `positions().len()` rows of `height x width x 3` elements of
/// the lane's tail from [`HelperRows::ptr`], row `k` being the batch's row `positions()[k]`.
pub(super) struct HelperRows {
    pub(super) lane: Arc<Inner>,
    pub(super) ring: usize,
    pub(super) positions: Vec<u32>,
    pub(super) height: u32,
    pub(super) width: u32,
    pub(super) tail: RowTail,
}

// SAFETY: event handles and device addresses may be used from any thread.
unsafe impl Send for HelperRows {}
unsafe impl Sync for HelperRows {}

impl std::fmt::Debug for HelperRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperRows")
            .field("rows", &self.positions.len())
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl HelperRows {
    fn side(&self) -> Result<&DeviceSide, String> {
        self.lane
            .device
            .as_ref()
            .ok_or_else(|| "the helper's rows have no device side".to_string())
    }

    /// The event the rows' copy here was done by (passed before they were handed out).
    fn events(&self) -> Result<Vec<sys::CUevent>, String> {
        let side = self.side()?;
        let copied = side
            .copied(self.ring)
            .ok_or_else(|| format!("no event for output buffer {}", self.ring))?;
        Ok(vec![copied])
    }
}

impl stoker_loader::LaneRows for HelperRows {
    fn ptr(&self) -> u64 {
        self.lane
            .device
            .as_ref()
            .map_or(0, |side| side.ring_ptr(self.ring))
    }

    fn positions(&self) -> &[u32] {
        &self.positions
    }

    fn shape(&self) -> [usize; 4] {
        self.tail
            .shape(self.positions.len(), self.height, self.width)
    }

    fn element(&self) -> &'static str {
        self.tail.element.name()
    }

    fn tail_applied(&self) -> bool {
        !self.tail.is_bytes()
    }

    fn device(&self) -> usize {
        self.lane
            .device
            .as_ref()
            .map_or(0, |side| side.cuda.ordinal())
    }

    unsafe fn wait_on(&self, stream: usize) -> Result<(), String> {
        let events = self.events()?;
        // SAFETY: the event is this side's and was recorded (and passed) before the batch was
        // handed out; the stream is of the primary context, as the caller promises.
        unsafe { self.side()?.cuda.stream_wait(stream, &events) }.map_err(|e| e.to_string())
    }

    unsafe fn keep_until(self: Arc<Self>, stream: usize) -> Result<(), String> {
        let cuda = Arc::clone(&self.side()?.cuda);
        // SAFETY: as the caller promises.
        let fence = unsafe { cuda.fence(stream) }.map_err(|e| e.to_string())?;
        cuda.release_after(vec![fence], Box::new(self));
        Ok(())
    }
}

impl Drop for HelperRows {
    /// Gives the buffer back to the lane: its copy here was done before the rows were handed
    /// out, and their readers are fenced (`keep_until`) or gone.
    fn drop(&mut self) {
        self.lane.put_ring(self.ring);
    }
}
