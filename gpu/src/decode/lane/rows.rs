//! The lane's rows of one batch, handed out in the batch (`Batch::device_rows`) and given back
//! to the lane once every holder and fence has let go.

use std::sync::Arc;

use cudarc::driver::sys;

use super::pipe::ReadyEvent;
use super::Shared;
use crate::cuda::describe;
use crate::decode::{GpuDecodeError, RowTail};

/// The GPU rows of one batch, held by the batch and whoever it hands them to: `count`
/// rows of `height x width x 3` elements from [`DeviceRows::ptr`] (bytes, or what the lane's
/// [`RowTail`] made of them), row `k` being the batch's row `positions()[k]`. Ready once the
/// lane's events have passed ([`DeviceRows::wait_on`]); they come from their pipe's pool and
/// go back to it, so a batch creates none.
pub struct DeviceRows {
    pub(super) shared: Arc<Shared>,
    pub(super) ring_index: usize,
    pub(super) ptr: u64,
    pub(super) positions: Vec<u32>,
    pub(super) height: u32,
    pub(super) width: u32,
    pub(super) tail: RowTail,
    pub(super) events: Vec<ReadyEvent>,
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

    /// (rows, height, width, 3), or (rows, 3, height, width) when the lane's tail writes
    /// channel planes; C order, of [`DeviceRows::element`].
    pub fn shape(&self) -> [usize; 4] {
        self.tail
            .shape(self.positions.len(), self.height, self.width)
    }

    /// The element type, as torch names its dtype.
    pub fn element(&self) -> &'static str {
        self.tail.element.name()
    }

    /// Whether the lane's kernel applied the device stage's tail (else the rows are uint8
    /// NHWC, as the slot's).
    pub fn tail_applied(&self) -> bool {
        !self.tail.is_bytes()
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
        let events: Vec<sys::CUevent> = self.events.iter().map(ReadyEvent::handle).collect();
        // SAFETY: the events are the lane's and were recorded; the stream is as the caller
        // promises.
        unsafe { self.shared.cuda.stream_wait(stream, &events) }
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

/// The loader's view of the rows, as the batch carries them.
impl stoker_loader::LaneRows for DeviceRows {
    fn ptr(&self) -> u64 {
        DeviceRows::ptr(self)
    }

    fn positions(&self) -> &[u32] {
        DeviceRows::positions(self)
    }

    fn shape(&self) -> [usize; 4] {
        DeviceRows::shape(self)
    }

    fn element(&self) -> &'static str {
        DeviceRows::element(self)
    }

    fn tail_applied(&self) -> bool {
        DeviceRows::tail_applied(self)
    }

    fn device(&self) -> usize {
        DeviceRows::device(self)
    }

    unsafe fn wait_on(&self, stream: usize) -> std::result::Result<(), String> {
        // SAFETY: as the caller promises.
        unsafe { DeviceRows::wait_on(self, stream) }.map_err(|e| e.to_string())
    }

    unsafe fn keep_until(self: Arc<Self>, stream: usize) -> std::result::Result<(), String> {
        // SAFETY: as the caller promises.
        unsafe { DeviceRows::keep_until(&self, stream) }.map_err(|e| e.to_string())
    }
}

impl Drop for DeviceRows {
    /// Gives the rows' buffer back to the lane once the work that writes them is done: a batch
    /// dropped unread (a loop that stopped, batches built ahead and let go) may go while its
    /// kernel still runs, and the next batch given the buffer must not share it with that kernel.
    fn drop(&mut self) {
        for event in std::mem::take(&mut self.events) {
            if let Err(error) = event.synchronize() {
                tracing::warn!(error = %describe(error), "waiting for a GPU batch's rows before reusing their buffer");
            }
            // The event goes back to its pipe's pool as it drops here, passed.
        }
        self.shared.put_ring(self.ring_index);
    }
}
