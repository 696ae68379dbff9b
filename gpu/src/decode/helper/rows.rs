//! The helper's output buffers as the loader's process sees them: opened from their IPC
//! handles in the device's primary context, with each buffer's ready event, an event of the
//! loader's own for rows it puts over the helper's, and a stream those copies go on
//! ([`DeviceSide`]); and the rows of one batch ([`HelperRows`]), handed out in the batch and
//! given back to the lane's free buffers once every holder and fence has let go.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::Inner;
use crate::cuda::{describe, Cuda};
use crate::decode::lane::{handle_chars, IPC_HANDLE_BYTES};
use crate::decode::{GpuDecodeError, RowTail};

/// The helper's buffers and events, opened in this process.
pub(super) struct DeviceSide {
    pub(super) cuda: Arc<Cuda>,
    /// Where the helper's output buffers are mapped here.
    pub(super) ring: u64,
    /// Set once the mapping is closed ([`DeviceSide::close_ring`]).
    ring_closed: std::sync::atomic::AtomicBool,
    pub(super) ring_slot_bytes: usize,
    /// Each buffer's ready event (the helper's, opened here).
    ready: Vec<sys::CUevent>,
    /// Each buffer's event for rows the loader put over the helper's.
    replaced: Vec<sys::CUevent>,
    /// The stream those copies go on.
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
    /// Opens the buffers of `ring_handle` and the events of `ready` on device `ordinal`.
    pub(super) fn open(
        ordinal: usize,
        ring_handle: &[u8; IPC_HANDLE_BYTES],
        ring_slot_bytes: usize,
        ready: &[[u8; IPC_HANDLE_BYTES]],
    ) -> Result<DeviceSide, GpuDecodeError> {
        let cuda = Cuda::open(ordinal).map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        let mut side = DeviceSide {
            cuda: Arc::clone(&cuda),
            ring: 0,
            ring_closed: std::sync::atomic::AtomicBool::new(false),
            ring_slot_bytes,
            ready: Vec::new(),
            replaced: Vec::new(),
            stream: std::ptr::null_mut(),
        };
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
            for handle in ready {
                let mut event = std::ptr::null_mut();
                let handle = sys::CUipcEventHandle {
                    reserved: handle_chars(handle),
                };
                // SAFETY: as above.
                unsafe { sys::cuIpcOpenEventHandle(&mut event, handle) }.result()?;
                side.ready.push(event);
                let mut own = std::ptr::null_mut();
                // SAFETY: as above.
                unsafe {
                    sys::cuEventCreate(&mut own, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
                }
                .result()?;
                side.replaced.push(own);
            }
            side.stream = result::stream::create(result::stream::StreamKind::NonBlocking)?;
            Ok(())
        })
        .map_err(cuda_error("opening the helper's buffers"))?;
        Ok(side)
    }

    /// Buffer `ring`'s address here.
    pub(super) fn ring_ptr(&self, ring: usize) -> u64 {
        self.ring + (ring * self.ring_slot_bytes) as u64
    }

    /// Puts `rows` (device row, bytes) over buffer `ring`'s rows of `row_len` bytes, after the
    /// helper's work on it, on this side's stream; returns the event they are done by.
    pub(super) fn replace(
        &self,
        ring: usize,
        rows: &[(usize, Vec<u8>)],
    ) -> Result<sys::CUevent, GpuDecodeError> {
        let (ready, replaced) = match (self.ready.get(ring), self.replaced.get(ring)) {
            (Some(&ready), Some(&replaced)) => (ready, replaced),
            _ => {
                return Err(GpuDecodeError::Unsupported(format!(
                    "the helper named output buffer {ring}, past its {}",
                    self.ready.len()
                )))
            }
        };
        let base = self.ring_ptr(ring);
        self.cuda
            .in_context("cuMemcpyHtoDAsync", || {
                // SAFETY: the event and stream are this side's, in the primary context.
                unsafe { sys::cuStreamWaitEvent(self.stream, ready, 0) }.result()?;
                for (k, bytes) in rows {
                    // SAFETY: row `k` of the buffer holds `bytes.len()` bytes (the helper
                    // sized the rows by the same tail) and nothing else writes it now; the
                    // bytes are staged as the call returns (pageable memory).
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(
                            base + (k * bytes.len()) as u64,
                            bytes.as_ptr().cast(),
                            bytes.len(),
                            self.stream,
                        )
                    }
                    .result()?;
                }
                // SAFETY: as above.
                unsafe { result::event::record(replaced, self.stream) }?;
                Ok(replaced)
            })
            .map_err(cuda_error("replacing the helper's rows"))
    }

    /// Buffer `ring`'s ready event.
    fn ready(&self, ring: usize) -> Option<sys::CUevent> {
        self.ready.get(ring).copied()
    }
}

impl DeviceSide {
    /// Closes the mapping of the helper's buffers, once: before the helper may free them (it
    /// ends once its stdin closes), as CUDA asks, and when no rows in them are held any more
    /// (after this process's copies into them are done).
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
            // SAFETY: this side's own stream and mapping; no rows in the buffers are held.
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
        let events: Vec<sys::CUevent> = self
            .ready
            .drain(..)
            .chain(self.replaced.drain(..))
            .collect();
        let _ = self.cuda.in_context("cuEventDestroy", || {
            // SAFETY: this side's own objects, used by no one now.
            unsafe {
                if !stream.is_null() {
                    let _ = result::stream::destroy(stream);
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
    /// The loader's own copies over some rows, when there were any.
    pub(super) replaced: Option<sys::CUevent>,
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

    /// The events the rows are ready by.
    fn events(&self) -> Result<Vec<sys::CUevent>, String> {
        let side = self.side()?;
        let ready = side
            .ready(self.ring)
            .ok_or_else(|| format!("no ready event for output buffer {}", self.ring))?;
        Ok(std::iter::once(ready).chain(self.replaced).collect())
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
        // SAFETY: the events are open here and recorded before the batch was answered; the
        // stream is of the primary context, as the caller promises.
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
    /// Gives the buffer back to the lane once the work writing it is done (a batch dropped
    /// unread may go before its copies ran).
    fn drop(&mut self) {
        if let Ok(events) = self.events() {
            for event in events {
                // SAFETY: an event open here, recorded before the batch was answered.
                if let Err(error) = unsafe { result::event::synchronize(event) } {
                    tracing::warn!(error = %describe(error), "waiting for the helper's rows before reusing their buffer");
                }
            }
        }
        self.lane.put_ring(self.ring);
    }
}
